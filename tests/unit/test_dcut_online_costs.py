"""Online correction of the D-Cut cost table (``sglang_ext.dcut.online_costs``): the update rule by
hand, clipping, warm-up, row attribution, and the planner loop that motivated it (a flat profiled
row at bs 32 that keeps full verification while the measured steps make tier 0.5 best).

Expected choices are computed here independently of the planner: with every request's survival
row equal, ``S_q`` is the sum of the ``ceil(bs * N * rho_q) - bs`` largest scores of the batch and
auto picks ``argmax_q (bs + S_q) / C_q``.

Budget: < 5 s. No SGLang.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ext.dcut.cost_table import CostTable, CostTableKey
from sglang_ext.dcut.online_costs import (
    OFF_COLUMN,
    OnlineCostParams,
    OnlineCosts,
    apply_factors,
    unit_factors,
)
from sglang_ext.dcut.draft_off import DraftOffParams, DraftOffState, draft_off_decision
from sglang_ext.dcut.planner import choose

TIERS = (0.25, 0.5, 0.75, 1.0)
N = 16  # the 15-step chain: 15 drafts + the bonus/root slot
BS = 32
PROFILED_32 = (197.0, 216.0, 216.0, 209.0)  # the flat launch-time row of the bench run
MEASURED_32 = (185.0, 212.0, 232.0, 263.0)  # the steps measured in the workload
KEY = CostTableKey("m", "d", "cpu", 1, "float32", N, 1, N - 1, "torch_sdpa", 64, "0.5.23", "test")
NO_WARMUP = OnlineCostParams(warmup=0)


def _table(off_ms=None, row32=PROFILED_32):
    return CostTable.build(KEY, [16, 32, 64], [[100.0, 110.0, 120.0, 130.0], list(row32),
                                               [300.0, 330.0, 360.0, 390.0]], tiers=TIERS, off_ms=off_ms)


def _scores(bs=BS, decay=0.7):  # [bs, N - 1] survival of the drafts: decay ** depth, every request alike
    row = torch.tensor([decay ** (j + 1) for j in range(N - 1)], dtype=torch.float64)
    return row.expand(bs, N - 1).clone()


def _expected_tier(scores, costs):
    """argmax_q (bs + S_q) / C_q, computed without the planner."""
    bs = scores.shape[0]
    flat = sorted(scores.flatten().tolist(), reverse=True)
    utils = []
    for rho, c in zip(TIERS, costs):
        keep = min(max(math.ceil(bs * N * rho) - bs, 0), bs * (N - 1))
        utils.append((bs + sum(flat[:keep])) / c)
    return max(range(len(TIERS)), key=lambda q: (utils[q], -costs[q], -q))


# ----------------------------------------------------------------------------- the update rule
def test_first_and_later_observations_by_hand():
    oc = OnlineCosts(_table(), NO_WARMUP)
    assert oc.observe(32, 3, 2 * 209.0)  # ratio 2, first step weight 0.5: 2 ** 0.5
    assert oc.factor(32, 3) == pytest.approx(1.4142136, rel=1e-6)
    assert oc.observe(32, 3, 2 * 209.0)  # then weight 0.2: exp(0.8 * 0.5 ln 2 + 0.2 ln 2) = 2 ** 0.6
    assert oc.factor(32, 3) == pytest.approx(1.5157166, rel=1e-6)
    assert oc.observe(32, 3, 209.0 / 2)  # ratio 1/2, but the median of (2, 2, 1/2) is 2: 2 ** 0.68
    assert oc.factor(32, 3) == pytest.approx(1.6021398, rel=1e-6)
    assert oc.observe(32, 3, 209.0 / 2)  # median of (2, 1/2, 1/2) is 1/2: 2 ** (0.8 * 0.68 - 0.2) = 2 ** 0.344
    assert oc.factor(32, 3) == pytest.approx(1.2692709, rel=1e-6)
    assert oc.counted == 4 and oc.version == 4
    row = oc.corrected(32)
    assert row.profiled_batch_size == 32 and row.off_ms is None
    assert row.step_ms == pytest.approx((197.0, 216.0, 216.0, 209.0 * 2 ** 0.344))
    two = OnlineCosts(_table(), NO_WARMUP)  # two ratios: their geometric mean feeds the EMA
    two.observe(32, 0, 197.0)
    two.observe(32, 0, 4 * 197.0)
    assert two.factor(32, 0) == pytest.approx(2 ** 0.2, rel=1e-9)  # 0.8 * 0 + 0.2 * ln 2


def test_prediction_is_the_uncorrected_table():
    """The ratio uses the launch-time cost, so repeated steps at the true cost converge to it."""
    oc = OnlineCosts(_table(), NO_WARMUP)
    for _ in range(60):
        oc.observe(32, 3, 263.0)
    assert oc.predicted_ms(32, 3) == 209.0
    assert oc.corrected(32).step_ms[3] == pytest.approx(263.0, rel=1e-4)


def test_untouched_cells_keep_factor_one_and_nothing_is_extrapolated():
    oc = OnlineCosts(_table(off_ms=[50.0, 60.0, 70.0]), NO_WARMUP)
    for _ in range(20):
        oc.observe(32, 3, 4 * 209.0)
    f = oc.factors()
    assert f[1][3] > 3.0
    assert [f[1][q] for q in (0, 1, 2, 4)] == [1.0, 1.0, 1.0, 1.0]  # same row, other tiers, draft-off
    assert f[0] == (1.0,) * 5 and f[2] == (1.0,) * 5  # other rows
    corrected = oc.corrected_table()
    assert corrected.step_ms[0] == _table().step_ms[0] and corrected.step_ms[1][:3] == PROFILED_32[:3]
    assert corrected.off_ms == (50.0, 60.0, 70.0)


def test_rows_follow_the_planner_lookup():
    """bs 17..32 use the bs-32 row (smallest profiled >= bs), beyond the table the largest row."""
    oc = OnlineCosts(_table(), NO_WARMUP)
    oc.observe(20, 1, 2 * 216.0)
    oc.observe(100, 0, 2 * 300.0)
    f = oc.factors()
    assert f[1][1] > 1.0 and f[2][0] > 1.0
    assert f[0] == (1.0,) * 5 and f[1][0] == 1.0
    assert oc.factor(32, 1) == oc.factor(17, 1) == f[1][1]
    assert oc.factor(16, 1) == 1.0


def test_outliers_are_clipped():
    oc = OnlineCosts(_table(), NO_WARMUP)
    oc.observe(32, 2, 1e9)  # a stalled first step: ratio clipped to 10
    assert oc.clipped == 1
    assert oc.factor(32, 2) == pytest.approx(10 ** 0.5)
    oc.observe(32, 2, 1e-9)  # and the other way: clipped to 0.1; the median of (10, 0.1) is 1
    assert oc.clipped == 2
    assert oc.factor(32, 2) == pytest.approx(10 ** 0.4)
    run = OnlineCosts(_table(), NO_WARMUP)  # a run of stalled steps: at most 10 ** alpha per step
    for _ in range(3):
        run.observe(32, 2, 216.0)
    run.observe(32, 2, 1e9)
    assert run.factor(32, 2) == 1.0  # one among ordinary steps: the median ignores it
    run.observe(32, 2, 1e9)
    assert run.factor(32, 2) == pytest.approx(10 ** 0.2)
    for _ in range(40):  # ordinary steps bring it back
        oc.observe(32, 2, 216.0)
    assert oc.factor(32, 2) == pytest.approx(1.0, abs=0.01)


def test_warmup_skips_the_first_steps_at_a_batch_size_new_to_the_cell():
    oc = OnlineCosts(_table())  # warmup 2
    assert not oc.observe(32, 3, 400.0) and not oc.observe(32, 3, 400.0)
    assert oc.factor(32, 3) == 1.0 and oc.warmup_skipped == 2
    assert oc.observe(32, 3, 418.0)
    assert oc.factor(32, 3) == pytest.approx(2 ** 0.5)
    # another batch size of the same row: its first two steps are skipped too, then counted
    assert not oc.observe(30, 3, 1000.0) and not oc.observe(30, 3, 1000.0)
    assert oc.observe(30, 3, 418.0) and oc.observe(32, 3, 418.0)  # bs 32 needs no new warm-up
    # another column of the row has its own warm-up
    assert not oc.observe(32, 0, 394.0)
    assert oc.counted == 3 and oc.warmup_skipped == 5


def test_invalid_observations_are_ignored():
    oc = OnlineCosts(_table(), NO_WARMUP)  # no draft-off costs in this table
    for bs, col, ms in ((32, OFF_COLUMN, 10.0), (32, 4, 10.0), (32, -2, 10.0), (32, 0, float("nan")),
                        (32, 0, 0.0), (32, 0, -1.0), (0, 0, 10.0), (32, True, 10.0)):
        assert not oc.observe(bs, col, ms)
    assert oc.ignored == 8 and oc.counted == 0 and oc.corrected_table() is oc.table


def test_draft_off_column():
    oc = OnlineCosts(_table(off_ms=[50.0, 60.0, 70.0]), NO_WARMUP)
    assert oc.predicted_ms(32, OFF_COLUMN) == 60.0
    oc.observe(32, OFF_COLUMN, 240.0)
    assert oc.corrected(32).off_ms == pytest.approx(120.0)  # 60 * 4 ** 0.5
    assert oc.factors()[1][4] == pytest.approx(2.0)


def test_params_are_checked():
    for kw in ({"alpha": 0.0}, {"first_alpha": 1.5}, {"min_ratio": 1.5}, {"max_ratio": 0.5},
               {"max_ratio": float("inf")}, {"warmup": -1}, {"warmup": 1.5}, {"window": 0}):
        with pytest.raises(ValueError, match="online costs"):
            OnlineCostParams(**kw)


def test_apply_factors_checks_the_shape():
    t = _table(off_ms=[1.0, 2.0, 3.0])
    assert apply_factors(t, unit_factors(t)) == t
    with pytest.raises(ValueError, match="factors must be"):
        apply_factors(t, [[1.0] * 4] * 3)
    with pytest.raises(ValueError, match="finite"):
        apply_factors(t, [[1.0] * 5, [1.0] * 5, [1.0, 1.0, 0.0, 1.0, 1.0]])


# ----------------------------------------------------------------------------- with the planner
def _run(oc, true_costs, steps, scores=None, noise=None):
    """The planner loop: plan with the corrected table, observe the chosen tier's true cost."""
    scores = _scores() if scores is None else scores
    chosen = []
    for i in range(steps):
        plan = choose(scores, oc.corrected_table(), mode="auto")
        q = plan.tier_index
        chosen.append(q)
        ms = true_costs[q] * (1.0 if noise is None else noise[i % len(noise)])
        oc.observe(BS, q, ms)
    return chosen


def test_flat_profiled_row_converges_to_the_tier_best_at_the_measured_costs():
    scores = _scores()
    profiled, best = _expected_tier(scores, PROFILED_32), _expected_tier(scores, MEASURED_32)
    assert (profiled, best) == (3, 1)  # the flat row keeps full verification; the true costs favour 0.5
    oc = OnlineCosts(_table())  # default parameters, warm-up included
    chosen = _run(oc, MEASURED_32, 80, scores)
    assert chosen[0] == 3
    assert chosen[-20:] == [best] * 20, chosen
    f = oc.factors()[1]
    assert 1.0 < f[3] <= 263.0 / 209.0  # full, measured first, then left
    assert f[1] == pytest.approx(212.0 / 216.0, rel=0.01)  # the tier it settled on


def test_convergence_survives_host_noise():
    scores = _scores()
    noise = [1.0, 1.04, 0.97, 1.02, 0.96, 1.03, 0.99, 1.01]  # +-4 %, a repeating pattern
    oc = OnlineCosts(_table())
    chosen = _run(oc, MEASURED_32, 120, scores, noise)
    tail = chosen[-40:]
    assert tail.count(_expected_tier(scores, MEASURED_32)) >= 36, chosen


def test_one_stalled_step_does_not_flip_a_stable_choice_for_long():
    scores = _scores()
    oc = OnlineCosts(_table(row32=MEASURED_32))
    _run(oc, MEASURED_32, 20, scores)
    oc.observe(BS, 1, 100 * MEASURED_32[1])  # one step 100x slower (clipped to 10x)
    chosen = _run(oc, MEASURED_32, 30, scores)
    assert chosen == [1] * 30, chosen


def test_stable_host_leaves_the_choice_unchanged():
    for decay in (0.5, 0.7, 0.9):
        scores = _scores(decay=decay)
        oc = OnlineCosts(_table(row32=MEASURED_32))
        ref = choose(scores, oc.table, mode="auto").tier_index
        assert ref == _expected_tier(scores, MEASURED_32)
        chosen = _run(oc, MEASURED_32, 30, scores)
        assert chosen == [ref] * 30
        assert oc.factors()[1][ref] == pytest.approx(1.0, abs=1e-12) and oc.counted > 0


def test_draft_off_decision_uses_the_corrected_costs():
    """A draft-off step profiled cheap but measured dear: the corrected table keeps drafting."""
    table = _table(off_ms=[20.0, 40.0, 80.0])
    state = DraftOffState(gains=(0.5, 0.6, 0.6, 0.6), dwell=8)  # drafted steps commit 1.5-1.6 tokens/request
    params = DraftOffParams(min_dwell=8)
    # table: off 32 / 40 = 0.8 tokens/ms against at most 32 * 1.6 / 209 = 0.245: switch off
    assert draft_off_decision(state, BS, table, params).off
    oc = OnlineCosts(table, NO_WARMUP)
    for _ in range(30):
        oc.observe(BS, OFF_COLUMN, 400.0)  # 10x the profile: corrected towards 400 ms
    corrected = oc.corrected_table()
    assert corrected.lookup_off(BS)[1] > 300.0
    assert not draft_off_decision(state, BS, corrected, params).off


# ----------------------------------------------------------------------------- the row prior
def test_a_new_cell_starts_from_its_rows_counted_cells_by_hand():
    """First counted observation of a cell: ``log f = (1 - a1) * mean(log f of the row's counted
    cells) + a1 * log ratio``; cells of other rows and cells not counted yet (warm-up) are not in
    the mean; ``row_prior=False`` starts from 0 (the profile)."""
    table = _table(off_ms=[50.0, 60.0, 70.0])
    oc = OnlineCosts(table, OnlineCostParams(warmup=1))
    for _ in range(4):
        oc.observe(64, 2, 3 * 360.0)  # another row: never part of the bs-32 prior
    oc.observe(32, 0, 0.5 * 197.0)  # warm-up of tier 0: not counted, not in the prior
    oc.observe(32, 1, 0.25 * 216.0)  # warm-up of tier 1
    oc.observe(32, 1, 0.25 * 216.0)  # counted: the row had no counted cell -> from 0
    f1 = math.exp(0.5 * math.log(0.25))
    assert oc.factor(32, 1) == pytest.approx(f1, rel=1e-12)
    oc.observe(32, OFF_COLUMN, 0.1 * 60.0)  # warm-up of the draft-off cell
    oc.observe(32, OFF_COLUMN, 0.2 * 60.0)  # counted: starts from log f1 (the only counted cell of the row)
    f_off = math.exp(0.5 * math.log(f1) + 0.5 * math.log(0.2))
    assert oc.factor(32, OFF_COLUMN) == pytest.approx(f_off, rel=1e-12)
    oc.observe(32, 0, 0.5 * 197.0)  # tier 0 counted now: the prior is the mean of tier 1 and draft-off
    prior = 0.5 * (math.log(f1) + math.log(f_off))
    assert oc.factor(32, 0) == pytest.approx(math.exp(0.5 * prior + 0.5 * math.log(0.5)), rel=1e-12)
    plain = OnlineCosts(table, OnlineCostParams(warmup=0, row_prior=False))
    plain.observe(32, 1, 0.25 * 216.0)
    plain.observe(32, OFF_COLUMN, 0.2 * 60.0)
    assert plain.factor(32, OFF_COLUMN) == pytest.approx(math.sqrt(0.2), rel=1e-12)


def test_a_rarely_run_draft_off_cell_of_a_slow_profile_is_corrected_within_a_burst():
    """The real-pair case: the profile ran on a loaded host (every cell ~3x too slow); the tier the
    server runs is timed every step, the draft-off step only in one exploration burst of 6 counted
    steps. Without the row prior the draft-off cost is still >= 1.15x its true value, which keeps
    drafting; with it the cell is within 5 % and draft-off wins."""
    profiled_tier, profiled_off = 692.0, 448.0
    true_tier, true_off = 266.0, 137.0
    table = CostTable.build(KEY, [4], [[profiled_tier, 874.0, 858.0, 949.0]], tiers=TIERS, off_ms=[profiled_off])
    gains = (0.68, 0.9, 1.0, 1.05)  # accepted drafts per request: only tier 0.25 is near a tie
    state = DraftOffState(gains=gains, dwell=8)
    params = DraftOffParams(min_dwell=8)
    # exact costs: off 4 / 137 = 0.0292 tokens/ms, drafting 4 * 1.68 / 266 = 0.0253: off wins by 15 %
    exact = CostTable.build(KEY, [4], [[true_tier, 874.0, 858.0, 949.0]], tiers=TIERS, off_ms=[true_off])
    assert draft_off_decision(state, 4, exact, params).off
    got = {}
    for prior in (True, False):
        oc = OnlineCosts(table, OnlineCostParams(row_prior=prior))
        for _ in range(200):
            oc.observe(4, 0, true_tier)
        for _ in range(8):  # a burst: 2 warm-up steps, 6 counted
            oc.observe(4, OFF_COLUMN, true_off)
        got[prior] = (oc.corrected(4).off_ms, draft_off_decision(state, 4, oc.corrected_table(), params).off)
    assert got[True][0] == pytest.approx(true_off, rel=0.05) and got[True][1]
    assert got[False][0] > 1.15 * true_off and not got[False][1]


# ----------------------------------------------------------------------------- a thinning batch
def test_a_step_is_compared_with_the_table_at_its_own_batch_size():
    """A step at bs 20 (row 32) that costs what the table says between the bs-16 and bs-32 rows
    leaves the factor at 1; compared with the row's cost (216 ms) it would have looked 37 % cheap."""
    oc = OnlineCosts(_table(), NO_WARMUP)
    expected = 110.0 + (20 - 16) / (32 - 16) * (216.0 - 110.0)  # tier 0.5: rows 16 -> 110, 32 -> 216
    assert oc.expected_ms(20, 1) == pytest.approx(expected)
    assert oc.observe(20, 1, expected)
    assert oc.factor(32, 1) == pytest.approx(1.0, abs=1e-12)
    assert oc.observe(20, 1, 2 * expected)  # twice the table at bs 20: ratio 2, whatever the row's cost
    assert oc.factor(32, 1) == pytest.approx(2 ** 0.1, rel=1e-12)  # median of log 1, log 2 = log sqrt 2; weight 0.2
    assert oc.expected_ms(16, 1) == 110.0 and oc.expected_ms(100, 1) == 330.0 and oc.expected_ms(1, 1) == 110.0


def test_the_tail_of_a_closed_batch_does_not_make_its_row_look_cheap():
    """bs 4 runs the steps of a burst of requests that finish at different steps: 60 steps at bs 4,
    then 4 at bs 3, 2 and 1 each. The table is exact (costs linear in the batch size between its
    rows), so every factor stays 1 and the decision at bs 4 sees the true cost; compared with the
    row's cost the 12 tail steps would have left the bs-4 factor at ~0.72 (drafting looked cheaper)."""
    key = CostTableKey("m", "d", "cpu", 1, "float32", N, 1, N - 1, "torch_sdpa", 64, "0.5.23", "test")
    table = CostTable.build(key, [1, 4, 8], [[200.0, 220.0, 240.0, 260.0], [440.0, 560.0, 590.0, 640.0],
                                             [620.0, 660.0, 780.0, 830.0]], tiers=TIERS, off_ms=[180.0, 330.0, 390.0])

    def true_ms(bs):  # the table's own line through (1, 200) and (4, 440) for tier 0.25
        return 200.0 + (bs - 1) * (440.0 - 200.0) / 3

    oc = OnlineCosts(table, OnlineCostParams(warmup=0))
    row_cost_ratio = []
    for bs in [4] * 60 + [3] * 4 + [2] * 4 + [1] * 4:
        assert oc.observe(bs, 0, true_ms(bs))
        row_cost_ratio.append(true_ms(bs) / table.lookup(bs)[1][0])
    assert oc.factor(4, 0) == pytest.approx(1.0, abs=1e-9)
    assert oc.factor(1, 0) == pytest.approx(1.0, abs=1e-9)
    # what the row's cost would have said at the end of the burst: the last bs-2 and bs-3 steps
    # (the bs-1 steps belong to the bs-1 row) at 0.64x-0.82x of 440 ms
    assert min(row_cost_ratio[60:68]) < 0.7

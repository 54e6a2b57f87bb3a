"""D-Cut draft-off choice (pure): the objective, the dwell / hysteresis rules, the probe steps, the
exploration bursts, and the per-request gains the planner leaves, checked against an independent
step-by-step reference.

Budget: < 3 s.
"""

import random

import pytest
import torch

from sglang_ext.dcut import (
    CostTable,
    CostTableKey,
    DraftOffParams,
    DraftOffState,
    choose,
    draft_off_decision,
    observe_draft_gains,
    probe_wait,
)

KEY = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
TIERS = (0.25, 0.5, 0.75, 1.0)
NO_BUDGET = float("inf")  # probe_budget off: the probe timing of the back-off alone


def _table(off=True):
    rows = [[2.0, 2.5, 3.0, 3.5], [3.0, 4.0, 5.0, 6.0], [6.0, 9.0, 12.0, 15.0]]
    return CostTable.build(KEY, [1, 8, 64], rows, tiers=TIERS, off_ms=[1.0, 1.5, 3.0] if off else None,
                           created="2026-01-01T00:00:00+00:00")


# ----------------------------------------------------------------------------- independent reference
class Reference:
    """The rules of the docstring, written as an explicit three-phase machine over plain lists."""

    def __init__(self, table_rows, table_bs, off_ms, margin, dwell, alpha, max_interval, decisive, budget, max_wait,
                 burst, gap):
        self.rows, self.bss, self.off = table_rows, table_bs, off_ms
        self.margin, self.dwell, self.alpha, self.max_interval = margin, dwell, alpha, max_interval
        self.decisive, self.budget, self.max_wait = decisive, budget, max_wait
        self.burst, self.gap = burst, gap
        self.phase = "draft"  # "draft", "off", "after_probe", "explore"
        self.count = 0  # steps in the current phase
        self.gain = None  # per tier
        self.interval = dwell  # off steps before the next probe
        self.explore_every = dwell  # drafted steps before the next exploration burst
        self.burst_left = 0  # off steps of the current burst after this one
        self.just_explored = False  # a burst ended with the previous step

    def _row(self, bs):
        i = next((i for i, b in enumerate(self.bss) if b >= bs), len(self.bss) - 1)
        return self.rows[i], (None if self.off is None else self.off[i])

    def decide(self, bs, observed=None):
        """True = this step runs with drafting off; ``observed``: the online costs measured this
        row's draft-off cost (None: no online costs)."""
        costs, off_cost = self._row(bs)
        if off_cost is None or self.gain is None:
            if self.phase != "draft":
                self.phase, self.count = "draft", 0
            self.count += 1
            return False
        u_off = bs / off_cost
        u_on = max(bs * (1 + self.gain[q]) / costs[q] for q in range(len(costs)))
        if self.phase == "explore":  # the burst runs to its end whatever the utilities say
            self.burst_left -= 1
            if self.burst_left == 0:
                self.phase, self.just_explored = "draft", True
            return True
        if self.phase == "draft":
            clear_loss = u_off > u_on * (1 + self.decisive)  # no dwell needed
            may_switch = self.count >= self.dwell or self.just_explored
            if (may_switch and u_off > u_on * (1 + self.margin)) or clear_loss:
                self.phase, self.count, self.interval = "off", 1, self.dwell
                return True
            self.just_explored = False
            worth_it = self.gap * u_off > u_on * (1 + self.margin)  # off would win at 1/gap of its cost
            if observed is False and self.burst > 0 and self.count >= self.explore_every and worth_it:
                self.count, self.burst_left = 0, self.burst - 1
                self.explore_every = min(self.explore_every * 2, self.max_wait)
                if self.burst_left > 0:
                    self.phase = "explore"
                else:
                    self.just_explored = True
                return True
            self.count += 1
            return False
        if u_on > u_off * (1 + self.margin):  # after a probe, or drafting pays at this bs
            self.phase, self.count = "draft", 1
            return False
        if self.phase == "after_probe":
            self.interval = min(self.interval * 2, self.max_interval)
            self.phase, self.count = "off", 1
            return True
        # probe budget: waste (cheapest tier - off) per probe <= budget * off * steps between probes
        floor = 0
        waste = min(costs) - off_cost
        if waste > 0 and self.budget != float("inf"):
            while waste > self.budget * off_cost * floor * (1 + 1e-12) and floor < self.max_wait:
                floor += 1
        if self.count >= max(self.interval, floor):  # probe
            self.phase, self.count = "after_probe", 0
            return False
        self.count += 1
        return True

    def observe(self, bs, expected):
        new = [max(0.0, (e - bs) / bs) for e in expected]
        if self.gain is None:
            self.gain = new
        else:
            self.gain = [g + self.alpha * (x - g) for g, x in zip(self.gain, new)]


class Observer:
    """Stands in for the online costs: a row's draft-off cost counts as measured after
    ``needed`` draft-off steps at a batch size of that row (``needed`` None: no online costs)."""

    def __init__(self, table, needed):
        self.bss, self.needed, self.offs = list(table.batch_sizes), needed, {}

    def _row(self, bs):
        return next((i for i, b in enumerate(self.bss) if b >= bs), len(self.bss) - 1)

    def observed(self, bs):
        return None if self.needed is None else self.offs.get(self._row(bs), 0) >= self.needed

    def step(self, bs, off):
        if off:
            self.offs[self._row(bs)] = self.offs.get(self._row(bs), 0) + 1


def _run_policy(events, table, params, needed=None, explores=None):
    """The policy's off / drafted sequence; ``explores`` (a list) collects each step's ``explore``."""
    state, offs, obs = DraftOffState(), [], Observer(table, needed)
    for bs, expected in events:
        d = draft_off_decision(state, bs, table, params, obs.observed(bs))
        state = d.state
        offs.append(d.off)
        if explores is not None:
            explores.append(d.explore)
        obs.step(bs, d.off)
        if not d.off and expected is not None:
            state = observe_draft_gains(state, bs, expected, params)
    return offs


def _run_reference(events, table, params, needed=None):
    ref = Reference([list(r) for r in table.step_ms], list(table.batch_sizes),
                    None if table.off_ms is None else list(table.off_ms), params.margin, params.min_dwell,
                    params.alpha, params.max_probe_interval, params.decisive_margin, params.probe_budget,
                    params.max_probe_wait, params.explore_steps, params.explore_gap)
    offs, obs = [], Observer(table, needed)
    for bs, expected in events:
        off = ref.decide(bs, obs.observed(bs))
        offs.append(off)
        obs.step(bs, off)
        if not off and expected is not None:
            ref.observe(bs, expected)
    return offs


def _random_events(rng, n, keep_bs=0.0, top=3.0):
    """``keep_bs``: chance that a step keeps the previous step's batch size; accepted drafts per
    request at full verification in [0, ``top``]."""
    events = []
    level = rng.uniform(0.0, top)
    bs = rng.choice([1, 3, 8, 20, 64, 100])
    for _ in range(n):
        if rng.random() < 0.05:
            level = rng.uniform(0.0, top)  # the workload changes
        if rng.random() >= keep_bs:
            bs = rng.choice([1, 3, 8, 20, 64, 100])
        per_req = [level * f for f in (0.3, 0.6, 0.85, 1.0)]
        expected = [bs * (1 + g + rng.uniform(-0.1, 0.1)) for g in per_req]
        events.append((bs, None if rng.random() < 0.05 else expected))  # some steps not captured
    return events


@pytest.mark.parametrize("seed", range(12))
def test_policy_matches_the_reference(seed):
    rng = random.Random(seed)
    dwell = rng.choice([1, 3, 8])
    margin = rng.choice([0.0, 0.05, 0.2])
    params = DraftOffParams(margin=margin, min_dwell=dwell,
                            alpha=rng.choice([0.25, 0.5, 1.0]), max_probe_interval=dwell * rng.choice([1, 4, 16]),
                            decisive_margin=margin + rng.choice([0.0, 0.25, 1.0, float("inf")]),
                            probe_budget=rng.choice([float("inf"), 0.05, 0.5, 2.0]), max_probe_wait=dwell * 16,
                            explore_steps=rng.choice([0, 1, 3, 8]), explore_gap=rng.choice([1.0, 2.0, 5.0]))
    events = _random_events(rng, 300)
    table = _table()
    needed = rng.choice([None, 1, 3, 1000])  # 1000: a row never counts as measured (bursts back off)
    got = _run_policy(events, table, params, needed)
    assert got == _run_reference(events, table, params, needed)
    assert any(got) and not all(got)  # the case exercises both choices


@pytest.mark.parametrize("seed", range(12))
def test_policy_matches_the_reference_while_exploring(seed):
    """Batch sizes that stay a while and rows whose draft-off cost is not yet measured: bursts run."""
    rng = random.Random(100 + seed)
    dwell = rng.choice([1, 3, 8])
    params = DraftOffParams(margin=rng.choice([0.0, 0.05]), min_dwell=dwell, alpha=rng.choice([0.25, 1.0]),
                            max_probe_interval=dwell * 4, probe_budget=rng.choice([float("inf"), 0.5]),
                            max_probe_wait=dwell * 16, explore_steps=rng.choice([1, 3, 8]),
                            explore_gap=rng.choice([2.0, 5.0]))
    events = _random_events(rng, 400, keep_bs=0.95, top=8.0)  # drafting often wins by less than 2x
    table, needed, explores = _table(), rng.choice([1, 3, 1000]), []
    got = _run_policy(events, table, params, needed, explores)
    assert got == _run_reference(events, table, params, needed)
    assert any(explores)


# ----------------------------------------------------------------------------- rules, hand-computed
def test_objective_compares_committed_tokens_per_ms():
    # bs 8: tier costs 3, 4, 5, 6 ms, draft-off 1.5 ms -> U_off = 8 / 1.5 = 5.33.
    # gains (0.5, 1, 1.5, 2): U_q = 8 * 1.5 / 3 = 4, 8 * 2 / 4 = 4, 8 * 2.5 / 5 = 4, 8 * 3 / 6 = 4.
    s = DraftOffState(gains=(0.5, 1.0, 1.5, 2.0), dwell=10)
    d = draft_off_decision(s, 8, _table(), DraftOffParams(margin=0.05))
    assert d.off and d.off_utility == pytest.approx(8 / 1.5) and d.draft_utility == pytest.approx(4.0)
    # gains (0, 0, 0, 2.2): U_1.0 = 8 * 3.2 / 6 = 4.27 ... still below 5.33 / 1.05? 5.33 > 4.27 * 1.05 = 4.48
    assert draft_off_decision(dataclasses_replace(s, gains=(0.0, 0.0, 0.0, 2.2)), 8, _table()).off
    # gains (0, 0, 0, 3.0): U_1.0 = 8 * 4 / 6 = 5.33 -> equal: not better by the margin, keep drafting
    d = draft_off_decision(dataclasses_replace(s, gains=(0.0, 0.0, 0.0, 3.0)), 8, _table())
    assert not d.off and d.state.drafting


def dataclasses_replace(state, **kw):
    import dataclasses

    return dataclasses.replace(state, **kw)


def test_never_off_without_draft_off_costs_or_estimate():
    params = DraftOffParams(min_dwell=1)
    s = DraftOffState(gains=(0.0, 0.0, 0.0, 0.0), dwell=5)
    assert not draft_off_decision(s, 8, _table(off=False), params).off  # version-1 table
    assert not draft_off_decision(s, 8, None, params).off
    assert not draft_off_decision(DraftOffState(dwell=5), 8, _table(), params).off  # no gains yet
    assert draft_off_decision(s, 8, _table(), params).off


def test_minimum_dwell_probe_and_hysteresis_sequence():
    """Off clearly better: D drafted steps, then runs of D off steps separated by one probe."""
    params = DraftOffParams(margin=0.05, min_dwell=3, max_probe_interval=3, decisive_margin=float("inf"),
                            probe_budget=NO_BUDGET)
    poor = [8 * 1.0] * 4  # no accepted drafts: U_draft = 8 / 3 < U_off = 5.33
    seq = _run_policy([(8, poor)] * 15, _table(), params)
    # step 1 drafts and observes; steps 2-3 draft (dwell 3 not reached before step 4)
    assert seq == [False, False, False, True, True, True, False, True, True, True, False, True, True, True, False]


def test_clear_losses_switch_off_without_the_dwell():
    """Drafting that clearly loses (U_off > 1.25 U_draft) stops after the one step that measured
    it; a loss within (margin, decisive_margin] waits for the dwell, as before."""
    params = DraftOffParams(margin=0.05, min_dwell=3, max_probe_interval=3, probe_budget=NO_BUDGET)
    poor = [8 * 1.0] * 4  # U_draft = 8 / 3 = 2.67, U_off = 5.33: 2x
    assert _run_policy([(8, poor)] * 6, _table(), params) == [False, True, True, True, False, True]
    # U_1.0 = 8 * (1 + 2.3) / 6 = 4.4: U_off / U_draft = 1.21, within 1.25 -> 3 drafted steps first
    near = [8.0, 8.0, 8.0, 8 * 3.3]
    assert _run_policy([(8, near)] * 5, _table(), params) == [False, False, False, True, True]
    # decisive_margin = margin: every loss beyond the margin is decisive
    sharp = DraftOffParams(margin=0.05, min_dwell=3, decisive_margin=0.05)
    assert _run_policy([(8, near)] * 3, _table(), sharp) == [False, True, True]


def test_probe_interval_backs_off_to_its_cap():
    """Each probe that keeps drafting off doubles the next run of off steps: 3, 6, 12, then 12."""
    params = DraftOffParams(margin=0.05, min_dwell=3, max_probe_interval=12, decisive_margin=float("inf"),
                            probe_budget=NO_BUDGET)
    poor = [8.0] * 4
    seq = _run_policy([(8, poor)] * 60, _table(), params)
    runs, cur, probes = [], 0, 0
    for o in seq[3:]:
        if o:
            cur += 1
        else:
            runs.append(cur)
            cur = 0
            probes += 1
    assert seq[:3] == [False] * 3
    assert runs[:4] == [3, 6, 12, 12], runs
    assert probes == 5  # a fixed interval of 3 would have probed 14 times in these 57 steps


def test_probe_budget_spaces_probes_by_the_cost_table():
    """At bs 8 a drafted step costs at least 3 ms (tier 0.25), a draft-off step 1.5 ms: each probe
    wastes 1.5 ms, so a 10 % budget allows one probe per 1.5 / (0.1 * 1.5) = 10 off steps, although
    the back-off alone (min_dwell 3, cap 3) would probe after every 3."""
    params = DraftOffParams(margin=0.05, min_dwell=3, max_probe_interval=3, probe_budget=0.1)
    poor = [8.0] * 4
    seq = _run_policy([(8, poor)] * 34, _table(), params)
    off_run = [True] * 10
    assert seq == [False] + off_run + [False] + off_run + [False] + off_run + [False]
    # the probes' extra cost stays within the budget of the off time
    probes, offs = seq[1:].count(False), seq.count(True)
    assert probes * (3.0 - 1.5) <= 0.1 * offs * 1.5 + 1e-9
    # the cap: a 0.1 % budget would wait 1000 steps; max_probe_wait 12 bounds it
    capped = DraftOffParams(margin=0.05, min_dwell=3, max_probe_interval=3, probe_budget=0.001, max_probe_wait=12)
    seq = _run_policy([(8, poor)] * 15, _table(), capped)
    assert seq == [False] + [True] * 12 + [False, True]
    # at bs 64 (tier 0.25 6 ms, off 3 ms) the same 10 % budget waits 3 / 0.3 = 10 steps too, and
    # a tier no dearer than draft-off leaves the back-off alone
    assert probe_wait([6.0, 9.0], 3.0, params) == 10
    assert probe_wait([3.0, 9.0], 3.0, params) == 0


def test_exploration_bursts_back_off_until_the_row_is_measured():
    """bs 8: gains 4 at full verification make drafting worth 8 * 5 / 6 = 6.67 tokens/ms against
    draft-off's 5.33 at its table cost, but draft-off would win at half that cost (10.7 > 7.0):
    while the row's draft-off cost is unmeasured, bursts of 4 off steps run after 3, 6, 12 drafted
    steps; once measured, none; without online costs (None) or with exploring off, none."""
    params = DraftOffParams(margin=0.05, min_dwell=3, max_probe_wait=64, explore_steps=4, explore_gap=2.0)
    good = [8.0, 8.0, 8.0, 8 * 5.0]
    burst = [True] * 4
    seq = _run_policy([(8, good)] * 40, _table(), params, needed=1000)
    assert seq == [False] * 3 + burst + [False] * 6 + burst + [False] * 12 + burst + [False] * 7
    assert _run_policy([(8, good)] * 20, _table(), params, needed=1) == [False] * 3 + burst + [False] * 13
    assert not any(_run_policy([(8, good)] * 40, _table(), params, needed=None))
    off = DraftOffParams(margin=0.05, min_dwell=3, explore_steps=0)
    assert not any(_run_policy([(8, good)] * 40, _table(), off, needed=1000))
    # drafting worth more than gap x draft-off (gains 9: 13.3 > 10.7 / 1.05): not worth a burst
    assert not any(_run_policy([(8, [8.0, 8.0, 8.0, 80.0])] * 40, _table(), params, needed=1000))


def test_after_a_burst_the_corrected_table_switches_off_at_once():
    """The burst measured draft-off at a third of its table cost (0.5 ms: U_off 16 > 1.05 * 6.67):
    the step after the burst switches drafting off without a new dwell; a burst that confirms the
    table keeps drafting."""
    params = DraftOffParams(margin=0.05, min_dwell=3, explore_steps=4, probe_budget=NO_BUDGET)
    good = [8.0, 8.0, 8.0, 8 * 5.0]
    cheap = CostTable.build(KEY, [1, 8, 64], [list(r) for r in _table().step_ms], tiers=TIERS,
                            off_ms=[1.0, 0.5, 3.0], created="2026-01-01T00:00:00+00:00")
    for corrected, want_off in ((cheap, True), (_table(), False)):
        state, offs, table = DraftOffState(), [], _table()
        for _ in range(9):
            d = draft_off_decision(state, 8, table, params, off_observed=table is corrected)
            state = d.state
            offs.append(d.off)
            if not d.off:
                state = observe_draft_gains(state, 8, good, params)
            if d.explore and state.explored:  # the burst's last step: the online costs now hold it
                table = corrected
        assert offs[:7] == [False] * 3 + [True] * 4
        assert offs[7] is want_off and state.drafting is not want_off, offs


def test_off_switches_on_without_a_probe_when_drafting_pays_at_this_batch_size():
    """Off at bs 64; at the next step the batch is at bs 1, where the gains at hand make drafting
    pay: that step drafts (no waiting for the next probe); gains that do not pay keep it off."""
    params = DraftOffParams(margin=0.05, min_dwell=2, max_probe_interval=64, alpha=1.0, probe_budget=NO_BUDGET)
    # bs 64: U_off = 64 / 3 = 21.3 > 1.05 * U_draft = 1.05 * 64 * 1.6 / 6 = 17.9 -> off
    s, offs = DraftOffState(), []
    for _ in range(6):
        d = draft_off_decision(s, 64, _table(), params)
        s = d.state
        offs.append(d.off)
        if not d.off:
            s = observe_draft_gains(s, 64, [64 * 1.6] * 4, params)
    assert offs[-1] and not s.drafting and s.dwell < s.probe_interval  # mid-run, no probe due
    # bs 1 with gains 1.5: U_0.25 = 2.5 / 2 = 1.25 > 1.05 * U_off = 1.05 -> drafts now
    d = draft_off_decision(dataclasses_replace(s, gains=(1.5,) * 4), 1, _table(), params)
    assert not d.off and d.state.drafting and not d.probe and d.state.probe_interval == 0
    # bs 1 with gains 0.6: U_0.25 = 1.6 / 2 = 0.8 < 1.0 -> stays off
    assert draft_off_decision(s, 1, _table(), params).off


def test_probe_switches_back_on_when_drafting_wins_again():
    params = DraftOffParams(margin=0.05, min_dwell=2, alpha=1.0, decisive_margin=float("inf"), probe_budget=NO_BUDGET)
    poor, rich = [8.0] * 4, [8 * 4.0] * 4  # rich: U_0.25 = 32 / 3 = 10.7 > 5.33
    events = [(8, poor)] * 3 + [(8, rich)] * 6
    seq = _run_policy(events, _table(), params)
    # drafts 1-2 (dwell), off 3-4, probe 5 (observes rich), then drafting again from step 6 on
    assert seq == [False, False, True, True, False, False, False, False, False]


def test_no_flapping_near_the_boundary():
    """Utilities within the margin of each other never switch, whatever their order."""
    rng = random.Random(7)
    params = DraftOffParams(margin=0.1, min_dwell=1, alpha=1.0)
    # U_off = 5.33 at bs 8; U_1.0 = 8 * (1 + g) / 6 in [5.33 / 1.1, 5.33 * 1.1] for g in [2.64, 3.4]
    events = [(8, [8.0, 8.0, 8.0, 8 * (1 + rng.uniform(2.65, 3.39))]) for _ in range(200)]
    assert not any(_run_policy(events, _table(), params))


def test_off_runs_last_at_least_min_dwell_steps():
    rng = random.Random(3)
    params = DraftOffParams(margin=0.05, min_dwell=4)
    offs = _run_policy(_random_events(rng, 400), _table(), params)
    runs, cur = [], 0
    for o in offs + [False]:
        if o:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    assert runs and all(r >= 4 for r in runs[:-1])


def test_gains_come_from_the_auto_planner():
    """The planner's tier_expected is bs + the sum of the best keep_q scores at each tier."""
    scores = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])  # 2 chains, N = 4
    t = CostTable.build(KEY, [2], [[1.0, 2.0, 3.0, 4.0]], tiers=TIERS, off_ms=[0.5],
                        created="2026-01-01T00:00:00+00:00")
    plan = choose(scores, t, TIERS, "auto")
    # keep counts at bs 2, N 4: ceil(8 * rho) - 2 = 0, 2, 4, 6 -> best sums 0, 1.7, 2.6, 2.8
    assert plan.tier_expected == pytest.approx((2.0, 3.7, 4.6, 4.8))
    s = observe_draft_gains(DraftOffState(), 2, plan.tier_expected)
    assert s.gains == pytest.approx((0.0, 0.85, 1.3, 1.4))
    assert choose(scores, None, TIERS, 0.5).tier_expected is None  # fixed ratios carry none


def test_params_are_checked():
    with pytest.raises(ValueError, match="min_dwell"):
        DraftOffParams(min_dwell=0)
    with pytest.raises(ValueError, match="max_probe_interval"):
        DraftOffParams(min_dwell=8, max_probe_interval=4)
    with pytest.raises(ValueError, match="alpha"):
        DraftOffParams(alpha=0.0)
    with pytest.raises(ValueError, match="margin"):
        DraftOffParams(margin=-0.1)
    with pytest.raises(ValueError, match="decisive_margin"):
        DraftOffParams(margin=0.3, decisive_margin=0.25)
    with pytest.raises(ValueError, match="decisive_margin"):
        DraftOffParams(decisive_margin=float("nan"))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="probe_budget"):
            DraftOffParams(probe_budget=bad)
    with pytest.raises(ValueError, match="max_probe_wait"):
        DraftOffParams(max_probe_interval=64, max_probe_wait=32)

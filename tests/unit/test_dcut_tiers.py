"""Tier keep counts, auto tier choice, fixed ratio, fallback warning, exempt requests and modes.

Keep counts are checked against ``fractions``-based arithmetic and the table of
docs/algorithms.md#d-cut-keep-count; the auto choice against an independent argmax written with sorted Python
lists and ``math.fsum``.

Budget: < 5 s.
"""

import logging
import math
import random
from fractions import Fraction

import pytest
import torch

from sglang_ext.dcut import (
    NO_TIER,
    CostTable,
    CostTableKey,
    TreeTopology,
    choose,
    keep_count,
    page_keep_count,
    reset_fallback_warning,
    smallest_fitting_tier,
    tier_keep_counts,
)
from test_dcut_reference import exact_keep_count, random_parents

TIERS = (0.25, 0.5, 0.75, 1.0)
KEY = CostTableKey(
    model="tgt", draft="drf", device="cpu", tp=1, dtype="float32", draft_tokens=4, topk=1,
    num_steps=3, attention_backend="torch_sdpa", context_len=2048, sglang_version="0.5.23",
    sglang_ext_version="0.1.0",
)


def _table(batch_sizes, step_ms, tiers=TIERS):
    return CostTable.build(KEY, batch_sizes, step_ms, tiers=tiers, created="2026-01-01T00:00:00+00:00")


# --- keep counts ------------------------------------------------------------------------------

def test_keep_count_table_of_algorithms_b4():
    assert [keep_count(64, 16, r) for r in TIERS] == [192, 448, 704, 960]
    assert [page_keep_count(64, 16, r) for r in TIERS] == [240, 480, 720, 960]
    for bs in (1, 2, 7, 64):
        assert [keep_count(bs, 4, r) for r in TIERS] == [0, bs, 2 * bs, 3 * bs]


def test_keep_count_is_exact_where_float_ceil_is_wrong():
    # bs * N * rho lands just above an integer in floating point: a float ceil adds one.
    assert math.ceil(100 * 0.07) == 8 and math.ceil(25 * 0.28) == 8 and math.ceil(75 * 0.68) == 52
    assert keep_count(1, 100, 0.07) == 7 - 1          # width 7, not 8
    assert keep_count(5, 5, 0.28) == 7 - 5            # bs * N = 25: width 7
    assert keep_count(3, 25, 0.68) == 51 - 3          # bs * N = 75: width 51
    assert keep_count(10, 5, 0.56) == 28 - 10         # bs * N = 50: width 28


def test_keep_count_random_against_fractions():
    rng = random.Random(20)
    for _ in range(500):
        bs, n = rng.randint(1, 128), rng.randint(2, 17)
        ratio = rng.choice([rng.randint(1, 100) / 100, rng.randint(1, 1000) / 1000, 1.0])
        assert keep_count(bs, n, ratio) == exact_keep_count(bs, n, ratio)
        width = math.ceil(Fraction(bs * n) * Fraction(str(ratio)))
        if bs <= width:
            assert keep_count(bs, n, ratio) + bs == width  # bonus-inclusive width


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, "abc", float("nan"), True])
def test_keep_count_rejects_bad_ratio(bad):
    with pytest.raises(ValueError):
        keep_count(4, 4, bad)


def test_smallest_fitting_tier():
    keeps = tier_keep_counts(8, 16)  # [24, 56, 88, 120]
    assert keeps == [24, 56, 88, 120]
    assert [smallest_fitting_tier(k, keeps) for k in (0, 24, 25, 88, 120, 121)] == [0, 0, 1, 2, 3, NO_TIER]


# --- auto choice -------------------------------------------------------------------------------

def _independent_auto(flat_scores, bs, n, tiers, batch_sizes, step_ms):
    """argmax_q (bs + S_q) / C_q over the row of the smallest profiled bs >= bs."""
    row = next(r for b, r in zip(batch_sizes, step_ms) if b >= bs)
    ranked = sorted(flat_scores, reverse=True)
    best, best_u, best_c = None, None, None
    for q, rho in enumerate(tiers):
        k = exact_keep_count(bs, n, rho)
        u = (bs + math.fsum(ranked[:k])) / row[q]
        if best is None or u > best_u or (u == best_u and row[q] < best_c):
            best, best_u, best_c = q, u, row[q]
    return best, exact_keep_count(bs, n, tiers[best])


def test_auto_tier_matches_independent_argmax_chains_and_trees():
    rng = random.Random(21)
    g = torch.Generator().manual_seed(21)
    n_tree = 0
    for case in range(300):
        bs = rng.randint(1, 16)
        batch_sizes = sorted(rng.sample(range(1, 40), rng.randint(1, 5)))
        if batch_sizes[-1] < bs:
            batch_sizes.append(bs + rng.randint(0, 3))
        step_ms = []
        for _ in batch_sizes:
            base = rng.uniform(1.0, 20.0)
            step_ms.append([base * (1 + rng.uniform(0.0, 1.5) * r) for r in TIERS]
                           if rng.random() < 0.7 else [rng.uniform(1.0, 30.0) for _ in TIERS])
        table = _table(batch_sizes, step_ms)
        if case % 2:
            n = rng.randint(2, 9)
            conf = torch.rand(bs, n - 1, generator=g) ** rng.choice([0.3, 1.0, 3.0])
            scores = conf.cumprod(dim=1)
            plan = choose(scores, table)
            flat = scores.reshape(-1).tolist()
            assert plan.keep_lens.sum().item() == plan.budget
        else:
            n = rng.randint(2, 10)
            parents = [random_parents(rng, n, 3) for _ in range(bs)]
            rows = []
            for p in parents:
                r = [1.0]
                for v in range(1, n):
                    r.append(r[p[v]] * rng.random())
                rows.append(r)
            scores = torch.tensor(rows, dtype=torch.float32)
            plan = choose(scores, table, topology=TreeTopology.from_parents(torch.tensor(parents)))
            flat = [x for r in scores.tolist() for x in r[1:]]
            assert plan.keep_mask[:, 1:].sum().item() == plan.budget
            n_tree += 1
        want_q, want_keep = _independent_auto(flat, bs, n, TIERS, batch_sizes, step_ms)
        assert plan.mode == "auto"
        assert plan.tier_index == want_q and plan.budget == want_keep
        assert plan.ratio == TIERS[want_q] and plan.verify_width == bs + want_keep
        assert plan.profiled_batch_size == min(b for b in batch_sizes if b >= bs)
    assert n_tree == 150


def test_auto_exact_ties_go_to_the_cheaper_then_lower_tier():
    # bs = 1, N = 4: keeps [0, 1, 2, 3]; scores [1, 0, 0] give S = [0, 1, 1, 1].
    s = torch.tensor([[1.0, 0.0, 0.0]])
    # U = [1/1, 2/2, 2/3, 2/4]: tiers 0 and 1 tie, tier 0 is cheaper.
    assert choose(s, _table([1], [[1.0, 2.0, 3.0, 4.0]])).tier_index == 0
    # U = [1/2, 2/2, 2/2, 2/4] with equal costs for tiers 1 and 2: the lower tier.
    assert choose(s, _table([1], [[2.0, 2.0, 2.0, 4.0]])).tier_index == 1
    # A tie where the higher tier is cheaper (non-monotone table): the cheaper one wins.
    t = _table([1], [[2.0, 4.0, 2.0, 9.0]])  # U = [0.5, 0.5, 1.0, 0.22]
    assert choose(s, t).tier_index == 2
    t = _table([1], [[4.0, 8.0, 8.0, 4.0]])  # U = [0.25, 0.25, 0.25, 0.5]
    assert choose(s, t).tier_index == 3


def test_auto_uses_smallest_profiled_batch_size_at_least_bs():
    s = torch.full((5, 3), 0.9)
    # bs = 5 -> row of bs 8 (cheap tier 3); the row of bs 4 (favours tier 0) must be ignored.
    t = _table([4, 8, 16], [[1, 10, 10, 10], [10, 10, 10, 1], [1, 10, 10, 10]])
    plan = choose(s, t)
    assert plan.profiled_batch_size == 8 and plan.tier_index == 3


def test_tiers_must_match_the_table():
    with pytest.raises(ValueError, match="tiers"):
        choose(torch.ones(1, 3), _table([1], [[1, 2, 3, 4]]), tiers=(0.5, 1.0))


# --- fixed ratio, off, fallback --------------------------------------------------------------

def test_fixed_ratio_mode():
    rng = random.Random(22)
    g = torch.Generator().manual_seed(22)
    for _ in range(100):
        bs, n = rng.randint(1, 20), rng.randint(2, 9)
        ratio = rng.randint(1, 100) / 100
        s = torch.rand(bs, n - 1, generator=g).cumprod(dim=1)
        plan = choose(s, None, mode=ratio)
        want = exact_keep_count(bs, n, ratio)
        keeps = [exact_keep_count(bs, n, r) for r in TIERS]
        assert plan.mode == "ratio" and plan.budget == want and plan.ratio == ratio
        assert plan.tier_index == min(q for q in range(4) if keeps[q] >= want)
        assert plan.keep_lens.sum().item() == want
        assert plan.utilities is None
    # A ratio string and a Fraction work the same; the table is not needed nor consulted.
    s = torch.ones(4, 3)
    assert choose(s, None, mode="0.5").budget == choose(s, None, mode=Fraction(1, 2)).budget == 4


def test_off_mode_verifies_everything():
    plan = choose(torch.full((3, 5), 0.5), _table([1], [[1, 2, 3, 4]]), mode="off")
    assert plan.mode == "off" and plan.budget == 15 and plan.tier_index == 3
    assert plan.keep_lens.tolist() == [5, 5, 5]


def test_unknown_mode_raises():
    with pytest.raises(ValueError):
        choose(torch.full((2, 3), 0.5), None, mode="fastest")


def test_fallback_without_a_table_warns_once(caplog):
    reset_fallback_warning()
    s = torch.full((4, 3), 0.5)
    with caplog.at_level(logging.WARNING, logger="sglang_ext.dcut"):
        p1 = choose(s, None)
        p2 = choose(s, None)
    records = [r for r in caplog.records if r.name == "sglang_ext.dcut"]
    assert len(records) == 1
    assert "no cost table" in records[0].getMessage() and "fallback ratio 0.75" in records[0].getMessage()
    for p in (p1, p2):
        assert p.mode == "fallback" and p.ratio == 0.75 and p.tier_label == "fallback:0.75"
        assert p.budget == exact_keep_count(4, 4, Fraction(3, 4)) == 8
        assert p.tier_index == 2 and p.predicted_ms is None
    # a batch beyond the table is costed with its largest row (the cost table's contract), not the fallback
    p = choose(s, _table([1, 2], [[1, 2, 3, 4], [1, 2, 3, 4]]))
    assert p.mode == "auto" and p.profiled_batch_size == 2
    reset_fallback_warning()
    with caplog.at_level(logging.WARNING, logger="sglang_ext.dcut"):
        choose(s, None)
    records = [r for r in caplog.records if r.name == "sglang_ext.dcut"]
    assert len(records) == 2 and "no cost table" in records[1].getMessage()


# --- exempt requests: the real forward width (issue: planner width) ----------------------------

def _independent_exempt_auto(scores, exempt, n, tiers, batch_sizes, step_ms):
    """Auto choice over the real step: the exempt requests keep all N rows and count in the batch
    size, the forward width, the cost (the smallest full-batch tier holding the width) and the
    expected tokens. Returns (tier, kept drafts of the scored requests, forward rows, cost)."""
    bs = len(scores)
    scored = [s for s, e in zip(scores, exempt) if not e]
    nb, ne = len(scored), bs - len(scored)
    row = next(r for b, r in zip(batch_sizes, step_ms) if b >= bs)
    full_widths = [bs + exact_keep_count(bs, n, t) for t in tiers]  # never below the bs roots
    ranked = sorted((x for s in scored for x in s), reverse=True)
    exempt_sum = math.fsum(x for s, e in zip(scores, exempt) if e for x in s)
    best = None
    for q, rho in enumerate(tiers):
        k = exact_keep_count(nb, n, rho)
        width = nb + k + ne * n
        cost = row[min(j for j in range(q, len(tiers)) if full_widths[j] >= width)]
        u = (bs + math.fsum(ranked[:k]) + exempt_sum) / cost
        if best is None or u > best[0] or (u == best[0] and cost < best[4]):
            best = (u, q, k, width, cost)
    return best[1:]


def test_auto_with_exempt_requests_costs_the_real_forward():
    rng = random.Random(31)
    g = torch.Generator().manual_seed(31)
    for _ in range(300):
        bs, n = rng.randint(2, 12), rng.randint(2, 9)
        exempt = [rng.random() < 0.3 for _ in range(bs)]
        if all(exempt):
            exempt[0] = False
        batch_sizes = sorted(set(rng.sample(range(1, 16), rng.randint(1, 4)) + [bs + rng.randint(0, 2)]))
        step_ms = [sorted(rng.uniform(1.0, 10.0) for _ in TIERS) for _ in batch_sizes]
        scores = (torch.rand(bs, n - 1, generator=g) ** rng.choice([0.3, 1.0, 3.0])).cumprod(dim=1)
        plan = choose(scores, _table(batch_sizes, step_ms), exempt=exempt)
        q, k, width, cost = _independent_exempt_auto(scores.tolist(), exempt, n, TIERS, batch_sizes, step_ms)
        assert (plan.tier_index, plan.budget, plan.forward_width) == (q, k, width)
        assert plan.predicted_ms == cost and plan.num_exempt == sum(exempt)
        assert plan.profiled_batch_size == min(b for b in batch_sizes if b >= bs)
        lens = plan.keep_lens.tolist()
        assert all(lens[b] == n - 1 for b in range(bs) if exempt[b])
        assert sum(lens[b] for b in range(bs) if not exempt[b]) == k


def test_exempt_requests_widen_the_forward_of_every_tier():
    # 4 chains of N = 8, request 1 exempt: the 3 others keep ceil(24 * rho) - 3 drafts per tier
    # and the forward carries request 1's 8 rows on top.
    s = torch.full((4, 7), 0.5).cumprod(dim=1)
    plan = choose(s, None, mode=0.5, exempt=[False, True, False, False])
    assert plan.tier_widths == (14, 20, 26, 32) and plan.forward_width == 20
    assert plan.budget == 9 and plan.keep_lens.tolist()[1] == 7 and plan.prunes
    assert int(plan.num_ineligible) == 0 and plan.verify_width == 4 + 9 + 7
    # auto: the 0.5 tier's 20 rows need the batch's 0.75 graph (24 rows) -> its cost, 3.0; the
    # scored-only view costed it 2.0 with the row of bs 3
    table = _table([3, 4], [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    plan = choose(s, table, exempt=[False, True, False, False])
    assert plan.profiled_batch_size == 4 and plan.tier_costs_ms == (2.0, 3.0, 4.0, 4.0)
    # trees: an exempt request keeps every node
    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1]]))
    t = torch.tensor([[1.0, 0.9, 0.2, 0.8], [1.0, 0.5, 0.4, 0.3]])
    plan = choose(t, None, mode=0.5, topology=topo, exempt=[True, False])
    assert plan.keep_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert plan.forward_width == 4 + 2


def test_without_exemptions_the_plan_is_unchanged():
    g = torch.Generator().manual_seed(32)
    s = torch.rand(5, 6, generator=g).cumprod(dim=1)
    table = _table([8], [[1.0, 1.5, 2.5, 3.0]])
    for mode in ("auto", 0.3, "off"):
        a, b = choose(s, table, mode=mode), choose(s, table, mode=mode, exempt=[False] * 5)
        assert (a.tier_index, a.budget, a.utilities) == (b.tier_index, b.budget, b.utilities)
        assert torch.equal(a.keep_lens, b.keep_lens)
    with pytest.raises(ValueError, match="exemption flags"):
        choose(s, table, exempt=[False] * 4)


# --- modes ---------------------------------------------------------------------------------------

def test_mode_table_and_parse_mode():
    from sglang_ext.dcut import TIER_POLICIES, parse_mode

    assert list(TIER_POLICIES) == ["off", "auto"]
    assert [parse_mode(x) for x in (" AUTO", "off", "0.25", 1, Fraction(1, 2))] == ["auto", "off", 0.25, 1.0, 0.5]
    for bad in ("scan", "nan", "0", 1.5, True, "inf"):
        with pytest.raises(ValueError, match="expected off, auto or a ratio"):
            parse_mode(bad)


def test_a_new_tier_policy_is_one_table_entry(monkeypatch):
    """A policy registered in the mode table is accepted by the planner and the config."""
    from sglang_ext.config import ConfigError, DCutConfig
    from sglang_ext.dcut import TIER_POLICIES, TierChoice

    with pytest.raises(ConfigError, match="^--dcut: expected off, auto or a ratio"):
        DCutConfig(mode="smallest")
    monkeypatch.setitem(TIER_POLICIES, "smallest", lambda inp: TierChoice(inp.tier_keeps[0], 0, inp.tiers[0],
                                                                          "smallest"))
    assert DCutConfig(mode="Smallest").mode == "smallest"
    plan = choose(torch.full((2, 3), 0.5), None, mode="smallest")
    assert (plan.tier_index, plan.budget, plan.mode, plan.tier_label) == (0, 0, "smallest", "0.25")

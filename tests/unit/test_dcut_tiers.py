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


def test_fallback_without_row_warns_once(caplog):
    reset_fallback_warning()
    table = _table([1, 2], [[1, 2, 3, 4], [1, 2, 3, 4]])
    s = torch.full((4, 3), 0.5)
    with caplog.at_level(logging.WARNING, logger="sglang_ext.dcut"):
        p1 = choose(s, table)
        p2 = choose(s, table)
        p3 = choose(s, None)
    records = [r for r in caplog.records if r.name == "sglang_ext.dcut"]
    assert len(records) == 1
    assert "bs=4" in records[0].getMessage() and "fallback ratio 0.75" in records[0].getMessage()
    for p in (p1, p2, p3):
        assert p.mode == "fallback" and p.ratio == 0.75
        assert p.budget == exact_keep_count(4, 4, Fraction(3, 4)) == 8
        assert p.tier_index == 2
    reset_fallback_warning()
    with caplog.at_level(logging.WARNING, logger="sglang_ext.dcut"):
        choose(s, None)
    records = [r for r in caplog.records if r.name == "sglang_ext.dcut"]
    assert len(records) == 2 and "no cost table" in records[1].getMessage()

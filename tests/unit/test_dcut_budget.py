"""Global top-K selection: brute-force optimality, ancestor closure, ties, ineligible nodes.

The optimum is found by exhaustive enumeration: every prefix-length vector for chains, every
ancestor-closed subset per request (combined across requests by an exact max-plus knapsack)
for trees, all in plain Python.

Budget: < 8 s.
"""

import itertools
import math
import random

import torch

from sglang_ext.dcut import (
    TreeTopology,
    choose,
    rank_chain,
    rank_tree,
    select,
    top_sums,
)
from sglang_ext.dcut.budget import keep_lens_from_selection, keep_mask_from_selection
from test_dcut_reference import random_parents

NEG = float("-inf")
TIE_VALUES = [1.0, 0.75, 0.5, 0.5, 0.25, 0.0]


def _scores_chain(rng, bs, k):
    """Non-increasing rows of float32-exact values, with many ties."""
    rows = []
    for _ in range(bs):
        c = [rng.choice(TIE_VALUES + [rng.random()]) for _ in range(k)]
        s, acc = [], 1.0
        for x in c:
            acc *= x
            s.append(acc)
        rows.append(s)
    return torch.tensor(rows, dtype=torch.float32)


def _best_chain_sum(scores, budget):
    bs, k = len(scores), len(scores[0])
    best = None
    for lens in itertools.product(range(k + 1), repeat=bs):
        if sum(lens) != budget:
            continue
        total = sum(sum(scores[b][: lens[b]]) for b in range(bs))
        best = total if best is None else max(best, total)
    return best


def test_chain_selection_is_optimal_brute_force():
    rng = random.Random(10)
    for case in range(300):
        bs, k = rng.randint(1, 4), rng.randint(1, 5)
        t = _scores_chain(rng, bs, k)
        s = t.tolist()
        budget = rng.randint(0, bs * k)
        if case % 3 == 0:
            plan = choose(t, None, mode=rng.choice([0.25, 0.4, 0.5, 0.75, 0.9, 1.0]))
            budget, keep_lens = plan.budget, plan.keep_lens.tolist()
            assert abs(float(plan.expected_accepted) - (bs + sum(
                sum(s[b][: keep_lens[b]]) for b in range(bs)))) < 1e-5
        else:
            sel = select(rank_chain(t), budget)
            keep_lens = keep_lens_from_selection(sel, bs).tolist()
            # The flat selection itself is a prefix per request (closure).
            flat = sel.view(bs, k).tolist()
            assert flat == [[j < keep_lens[b] for j in range(k)] for b in range(bs)]
        assert sum(keep_lens) == budget
        got = sum(sum(s[b][: keep_lens[b]]) for b in range(bs))
        assert abs(got - _best_chain_sum(s, budget)) < 1e-6


def _tree_case(rng, bs, n):
    parents = [random_parents(rng, n, rng.choice([None, 2, 3])) for _ in range(bs)]
    scores = []
    for p in parents:
        row = [1.0]
        for v in range(1, n):
            row.append(row[p[v]] * rng.choice(TIE_VALUES + [rng.random()]))
        scores.append(row)
    return parents, torch.tensor(scores, dtype=torch.float32)


def _closed_subsets(parents):
    """best[k] = max score sum over ancestor-closed subsets of k non-root nodes (exhaustive)."""
    n = len(parents)
    return [
        frozenset(v for v in range(1, n) if mask >> (v - 1) & 1)
        for mask in range(1 << (n - 1))
        if all(parents[v] == 0 or (mask >> (parents[v] - 1) & 1)
               for v in range(1, n) if mask >> (v - 1) & 1)
    ]


def _best_tree_sum(parents_list, scores, budget):
    table = [0.0] + [NEG] * budget  # max-plus knapsack over requests
    for b, parents in enumerate(parents_list):
        per_size = {}
        for sub in _closed_subsets(parents):
            val = sum(scores[b][v] for v in sub)
            per_size[len(sub)] = max(per_size.get(len(sub), NEG), val)
        new = [NEG] * (budget + 1)
        for used, acc in enumerate(table):
            if acc == NEG:
                continue
            for size, val in per_size.items():
                if used + size <= budget:
                    new[used + size] = max(new[used + size], acc + val)
        table = new
    return table[budget]


def test_tree_selection_is_optimal_and_closed_brute_force():
    rng = random.Random(11)
    for case in range(250):
        bs, n = rng.randint(1, 3), rng.randint(2, 7)
        parents, t = _tree_case(rng, bs, n)
        topo = TreeTopology.from_parents(torch.tensor(parents))
        s = t.tolist()
        if case % 3 == 0:
            plan = choose(t, None, mode=rng.choice([0.25, 0.5, 0.6, 0.75, 1.0]), topology=topo)
            budget, keep = plan.budget, plan.keep_mask.tolist()
        else:
            budget = rng.randint(0, bs * (n - 1))
            keep = keep_mask_from_selection(select(rank_tree(t, topo), budget), bs).tolist()
        for b in range(bs):
            assert keep[b][0]
            for v in range(1, n):
                if keep[b][v]:
                    assert keep[b][parents[b][v]], "kept set must be ancestor-closed"
        assert sum(sum(row[1:]) for row in keep) == budget
        got = sum(s[b][v] for b in range(bs) for v in range(1, n) if keep[b][v])
        assert abs(got - _best_tree_sum(parents, s, budget)) < 1e-6


def test_ties_break_by_depth_then_request_then_node():
    # All confidences 1: every score ties. Budget 5 over 3 chains of 4 slots: depth 1 of every
    # request first, then depth 2 of requests 0 and 1.
    plan_lens = keep_lens_from_selection(select(rank_chain(torch.ones(3, 4)), 5), 3)
    assert plan_lens.tolist() == [2, 2, 1]
    # Trees: 0 -> {1, 2}, 1 -> {3}; all scores equal; budget 2 takes depth-1 nodes 1 and 2.
    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]))
    r = rank_tree(torch.ones(2, 4), topo)
    assert r.order.tolist() == [1, 2, 5, 3, 6, 7]  # (depth, request, node) order
    keep = keep_mask_from_selection(select(r, 3), 2).tolist()
    assert keep == [[True, True, True, False], [True, True, False, False]]


def test_selection_is_deterministic_under_repeats():
    g = torch.Generator().manual_seed(3)
    t = torch.rand(8, 6, generator=g).round(decimals=1).cummin(dim=1).values
    first = select(rank_chain(t), 20)
    for _ in range(5):
        assert torch.equal(select(rank_chain(t.clone()), 20), first)


def test_ineligible_slots_are_never_kept_chain():
    nan = float("nan")
    t = torch.tensor([[0.9, nan, 0.8], [0.7, 0.6, 0.5]])  # NaN at slot 1 of request 0
    plan = choose(t, None, mode="off")
    assert plan.budget == 6
    assert plan.keep_lens.tolist() == [1, 3]         # slot 2 of request 0 goes with slot 1
    assert int(plan.num_kept) == 4 and int(plan.num_ineligible) == 2
    assert abs(float(plan.expected_accepted) - (2 + 0.9 + 0.7 + 0.6 + 0.5)) < 1e-6


def test_ineligible_nodes_are_never_kept_tree():
    # 0 -> {1, 2}; 1 -> {3}. Node 1 is +inf (ineligible) so node 3 goes too.
    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1]]))
    t = torch.tensor([[1.0, float("inf"), 0.3, 0.9]])
    plan = choose(t, None, mode="off", topology=topo)
    assert plan.keep_mask.tolist() == [[True, False, True, False]]
    assert int(plan.num_kept) == 1 and int(plan.num_ineligible) == 2


def test_non_monotone_input_is_made_closed():
    # A child scored above its parent (invalid input) must not be kept without the parent.
    t = torch.tensor([[0.2, 0.9, 0.8], [0.5, 0.4, 0.3]])
    lens = keep_lens_from_selection(select(rank_chain(t), 2), 2).tolist()
    assert lens == [0, 2]
    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 1]]))
    keep = keep_mask_from_selection(select(rank_tree(torch.tensor([[1.0, 0.1, 0.9]]), topo), 1), 1)
    assert keep.tolist() == [[True, True, False]]


def test_candidate_mask_excludes_padding():
    t = torch.tensor([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]])
    cand = torch.tensor([[True, False, True], [True, True, True]])
    plan = choose(t, None, mode="off", candidate_mask=cand)
    assert plan.keep_lens.tolist() == [1, 3]


def test_top_sums_are_prefix_sums_of_sorted_scores():
    rng = random.Random(12)
    for _ in range(50):
        bs, k = rng.randint(1, 5), rng.randint(1, 6)
        t = _scores_chain(rng, bs, k)
        flat = sorted(t.reshape(-1).tolist(), reverse=True)
        ks = [rng.randint(0, bs * k) for _ in range(4)]
        got = top_sums(rank_chain(t), torch.tensor(ks)).tolist()
        assert all(abs(g - sum(flat[:q])) < 1e-6 for g, q in zip(got, ks))


def test_empty_batch_and_rootless_candidates():
    plan = choose(torch.zeros(0, 3), None, mode=0.5)
    assert plan.budget == 0 and plan.keep_lens.shape == (0,)
    assert float(plan.expected_accepted) == 0.0
    topo = TreeTopology.from_parents(torch.full((0, 4), -1))
    assert choose(torch.ones(0, 4), None, mode="off", topology=topo).keep_mask.shape == (0, 4)
    # Trees that are only a root: nothing to keep, the root stays.
    topo = TreeTopology.from_parents(torch.full((2, 1), -1))
    plan = choose(torch.ones(2, 1), None, mode="off", topology=topo)
    assert plan.budget == 0 and plan.keep_mask.tolist() == [[True], [True]]


def _reference_tree_ranking(parents, scores):
    """(order, num_eligible, prefix sums, scores) by the documented rule, in plain Python.

    Effective score: the minimum over the root path (root excluded) with non-finite scores as
    -inf; rank by (score desc, depth asc, request asc, node asc); prefix sums accumulate the
    eligible scores in float64 in that order (ineligible ones count as 0).
    """
    bs, n = len(parents), len(parents[0])
    rows = []
    for b in range(bs):
        for v in range(1, n):
            path, u = [], v
            while u != 0:
                path.append(u)
                u = parents[b][u]
            rows.append((min(scores[b][u] if math.isfinite(scores[b][u]) else NEG for u in path),
                          len(path), b, v))
    rows.sort(key=lambda r: (-r[0], r[1], r[2], r[3]))
    order = [b * n + v for _, _, b, v in rows]
    prefix, acc = [0.0], 0.0
    for s, _, _, _ in rows:
        acc += s if s != NEG else 0.0
        prefix.append(acc)
    return order, sum(1 for r in rows if r[0] != NEG), prefix, [r[0] for r in rows]


def test_score_key_matches_reference_for_nonnegative_and_negative_scores(monkeypatch):
    # Scores in [+0.0, 1] (plus -inf / NaN) and negative scores or -0.0 both go through the
    # monotone map (no host read-back to pick a path: overlap scheduling); both must rank exactly
    # like the plain-Python reference, and every ranking must use the map.
    import sglang_ext.dcut.budget as budget_mod

    general_calls = []
    real = budget_mod._monotone_float_bits
    monkeypatch.setattr(budget_mod, "_monotone_float_bits", lambda x: general_calls.append(1) or real(x))
    rng = random.Random(5)
    seen_general = [0, 0]
    for case in range(120):
        bs, n = rng.randint(1, 4), rng.randint(2, 9)
        parents = [random_parents(rng, n) for _ in range(bs)]
        general = case % 2 == 1
        scores = []
        for b in range(bs):
            row = [1.0] + [0.0] * (n - 1)
            for v in range(1, n):
                step = rng.choice([0.0, 0.0, 0.25, 0.5, rng.random()])
                if general:  # non-increasing path sums that go negative, some -0.0
                    row[v] = row[parents[b][v]] - 2 * step
                    if row[v] == 0.0 and rng.random() < 0.5:
                        row[v] = -0.0
                else:  # path products in [0, 1]
                    row[v] = row[parents[b][v]] * (1 - step)
                if rng.random() < 0.08:
                    row[v] = rng.choice([NEG, float("nan"), float("inf")])
            scores.append(row)
        t = torch.tensor(scores, dtype=torch.float32)
        want_order, want_eligible, want_prefix, eff = _reference_tree_ranking(parents, t.tolist())
        calls_before = len(general_calls)
        r = rank_tree(t, TreeTopology.from_parents(torch.tensor(parents)))
        needs_general = any(math.copysign(1.0, x) < 0 and x != NEG for x in eff)
        assert len(general_calls) > calls_before, case  # one sync-free path for every score set
        seen_general[general] += needs_general
        assert r.order.tolist() == want_order, case
        assert int(r.num_eligible) == want_eligible, case
        assert r.prefix_sums.tolist() == want_prefix, case
    assert seen_general[0] == 0 and seen_general[1] > 30  # both kinds of score sets were exercised

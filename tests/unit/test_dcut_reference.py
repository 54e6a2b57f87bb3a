"""Independent plain-Python references for the D-Cut unit tests (no torch math, no sglang).

These re-implement, from the written semantics only, what the code under test must agree with:
SGLang's tree-link convention (``build_tree_kernel_efficient``), SGLang's greedy tree
verification (``verify_tree_greedy``), ancestor sets and the exact keep count. The other
``test_dcut_*.py`` files import them; the tests at the bottom pin the references themselves to
the worked examples of docs/sglang_internals.md#verify-outputs and
docs/sglang_internals.md#pruned-verification, which were run against SGLang.

Budget: < 1 s.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Optional, Sequence

NO_LINK = -1


def random_parents(rng: random.Random, num_nodes: int, max_children: Optional[int] = None) -> list[int]:
    """Random topological parent array (parent index < child index), node 0 = root."""
    parents = [NO_LINK]
    children = [0] * num_nodes
    for v in range(1, num_nodes):
        choices = [u for u in range(v) if max_children is None or children[u] < max_children]
        u = rng.choice(choices)
        children[u] += 1
        parents.append(u)
    return parents


def sglang_links(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """Links as SGLang's tree builder writes them: loop i = N-1 .. 1, push i in front of its
    parent's child list (so the first child is the smallest index, siblings ascending)."""
    n = len(parents)
    next_token = [NO_LINK] * n
    next_sibling = [NO_LINK] * n
    for i in range(n - 1, 0, -1):
        p = parents[i]
        if next_token[p] != NO_LINK:
            next_sibling[i] = next_token[p]
        next_token[p] = i
    return next_token, next_sibling


def children_lists(next_token: Sequence[int], next_sibling: Sequence[int]) -> list[list[int]]:
    """Ordered child lists read from first-child / next-sibling links."""
    out = []
    for u in range(len(next_token)):
        kids, c = [], next_token[u]
        while c != NO_LINK:
            kids.append(c)
            c = next_sibling[c]
        out.append(kids)
    return out


def cut_links_reference(parents: Sequence[int], keep: Sequence[bool]) -> tuple[list[int], list[int]]:
    """Links of the kept subtree only (kept children in original order), in the full layout."""
    nt, ns = sglang_links(parents)
    kids = children_lists(nt, ns)
    n = len(parents)
    new_nt, new_ns = [NO_LINK] * n, [NO_LINK] * n
    for u in range(n):
        if not keep[u]:
            continue
        kept = [c for c in kids[u] if keep[c]]
        if kept:
            new_nt[u] = kept[0]
            for a, b in zip(kept, kept[1:]):
                new_ns[a] = b
    return new_nt, new_ns


def ancestors_or_self(parents: Sequence[int], v: int) -> set[int]:
    out = {v}
    while parents[v] != NO_LINK:
        v = parents[v]
        out.add(v)
    return out


def depth_of(parents: Sequence[int], v: int) -> int:
    return len(ancestors_or_self(parents, v)) - 1


def verify_tree_greedy_reference(
    candidates: Sequence[int],  # draft token per node of one request (padded layout)
    retrive_index: Sequence[int],  # global id per node
    next_token: Sequence[int],
    next_sibling: Sequence[int],
    target_predict_flat: Sequence[int],  # target argmax per global id
    max_steps: int,
) -> tuple[list[int], list[int], int]:
    """SGLang greedy tree verification for one request.

    Start at the root; at each level read the target's argmax at the last accepted node and
    walk the current node's child list (first child, then siblings) accepting the first child
    whose draft token equals it; stop when no child matches. Returns the accepted global ids
    (root first), the accepted draft tokens, and the bonus token (the target's argmax at the
    last accepted node).
    """
    last = retrive_index[0]
    accepted_ids = [last]
    accepted_tokens: list[int] = []
    cur = 0
    for _ in range(max_steps):
        cur = next_token[cur]
        target = target_predict_flat[last]
        matched = False
        while cur != NO_LINK:
            if candidates[cur] == target:
                last = retrive_index[cur]
                accepted_ids.append(last)
                accepted_tokens.append(candidates[cur])
                matched = True
                break
            cur = next_sibling[cur]
        if not matched:
            break
    return accepted_ids, accepted_tokens, target_predict_flat[last]


def exact_keep_count(batch_size: int, num_draft_tokens: int, ratio) -> int:
    """``min(bs (N-1), max(0, ceil(bs N rho) - bs))`` with rho taken exactly as written."""
    rho = Fraction(str(ratio)) if not isinstance(ratio, Fraction) else ratio
    width = math.ceil(Fraction(batch_size * num_draft_tokens) * rho)
    return min(batch_size * (num_draft_tokens - 1), max(0, width - batch_size))


def random_closed_keep(rng: random.Random, parents: Sequence[int], p_keep: float) -> list[bool]:
    """Random ancestor-closed kept set with the root kept (parents precede children)."""
    keep = [True]
    for v in range(1, len(parents)):
        keep.append(keep[parents[v]] and rng.random() < p_keep)
    return keep


# ---------------------------------------------------------------------------------------------
# Tests of the references against documented SGLang behaviour.


def _run_batch(draft, targets, parents_list, keeps=None):
    """accept_lens (accepted drafts + 1) of a batch, links from the SGLang builder convention."""
    n = len(parents_list[0])
    lens = []
    for b, parents in enumerate(parents_list):
        if keeps is None:
            nt, ns = sglang_links(parents)
        else:
            nt, ns = cut_links_reference(parents, keeps[b])
        ids, _, _ = verify_tree_greedy_reference(
            draft[b * n:(b + 1) * n], [b * n + i for i in range(n)], nt, ns, targets, n)
        lens.append(len(ids))
    return lens


def test_reference_chain_example_of_verify_edit_map():
    # bs = 2, N = 4 chains: drafts [100, 11, 12, 13 | 200, 21, 22, 23],
    # target argmax [11, 12, 13, 99 | 21, 22, 77, 0]  ->  accept_lens [4, 3].
    draft = [100, 11, 12, 13, 200, 21, 22, 23]
    target = [11, 12, 13, 99, 21, 22, 77, 0]
    chain = [NO_LINK, 0, 1, 2]
    assert _run_batch(draft, target, [chain, chain]) == [4, 3]
    # Route C with K = [2, 4] kept nodes (root included): accept_lens [2, 3].
    keeps = [[True, True, False, False], [True, True, True, True]]
    assert _run_batch(draft, target, [chain, chain], keeps) == [2, 3]


def test_reference_tree_example_of_verify_edit_map():
    # Root children are nodes 1 and 2; node 3 is a child of node 1. The target's argmax at the
    # root is node 2's token (12), so request 0 accepts node 2: accept_index [0, 2], and
    # predict row 0 = [12, 0, 55, 0] (12 emitted at the root, bonus 55 at node 2).
    parents = [NO_LINK, 0, 0, 1]
    nt, ns = sglang_links(parents)
    assert (nt, ns) == ([1, 3, NO_LINK, NO_LINK], [NO_LINK, 2, NO_LINK, NO_LINK])
    ids, toks, bonus = verify_tree_greedy_reference(
        [7, 54, 12, 56], [0, 1, 2, 3], nt, ns, [12, 0, 55, 0], 4)
    assert ids == [0, 2] and toks == [12] and bonus == 55


def test_reference_keep_count_table_of_algorithms_b4():
    assert [exact_keep_count(64, 16, r) for r in (0.25, 0.5, 0.75, 1.0)] == [192, 448, 704, 960]

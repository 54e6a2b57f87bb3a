"""Tree encodings, link cutting, compaction and FULL_MASK layout of ``sglang_ext.dcut.tree``.

Expected values come from the plain-Python references in ``test_dcut_reference.py`` (SGLang's
link convention and greedy tree verification re-implemented from their semantics) or are
written out by hand.

Budget: < 8 s.
"""

import random

import pytest
import torch

from sglang_ext.dcut import (
    NO_LINK,
    NOT_KEPT,
    PAD_INDEX,
    TreeTopology,
    ancestor_mask,
    build_full_mask,
    chain_keep_mask,
    chain_retrive,
    compact_tree,
    cut_links,
    parents_from_retrive,
    retrive_from_parents,
    scatter_to_full,
    tree_block_from_full_mask,
)
from test_dcut_reference import (
    ancestors_or_self,
    cut_links_reference,
    depth_of,
    random_closed_keep,
    random_parents,
    sglang_links,
    verify_tree_greedy_reference,
)


def _batch(rng, bs, n, max_children=None):
    parents = [random_parents(rng, n, max_children) for _ in range(bs)]
    links = [sglang_links(p) for p in parents]
    nt = torch.tensor([l[0] for l in links])
    ns = torch.tensor([l[1] for l in links])
    return parents, nt, ns


def test_worked_example_by_hand():
    # bs = 2, N = 4. Request 0: 0 -> {1, 2}, 1 -> {3}; keep {0, 2}.
    # Request 1: chain 0 -> 1 -> 2 -> 3; keep {0, 1, 2}.
    #
    #   full ids     [ 0  1  2  3 |  4  5  6  7 ]
    #   keep         [ 1  0  1  0 |  1  1  1  0 ]
    #   ragged rows  [ 0  2 |  4  5  6 ]  (+ 1 padding row when num_tokens = 6)
    nt = torch.tensor([[1, 3, -1, -1], [1, 2, 3, -1]])
    ns = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1]])
    keep = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    tokens = torch.tensor([100, 11, 12, 13, 200, 21, 22, 23])
    positions = torch.tensor([10, 11, 11, 12, 20, 21, 22, 23])
    c = compact_tree(keep, tokens, positions, nt, ns, num_tokens=6)
    assert c.counts.tolist() == [2, 3]
    assert c.qo_indptr.tolist() == [0, 2, 5]
    assert c.kept_index.tolist() == [0, 2, 4, 5, 6, PAD_INDEX]
    assert c.draft_token.tolist() == [100, 12, 200, 21, 22, 0]
    assert c.positions.tolist() == [10, 11, 20, 21, 22, 0]
    assert c.partition.tolist() == [[0, 2, 1, 3], [0, 1, 2, 3]]
    assert c.local_index.tolist() == [[0, NOT_KEPT, 1, NOT_KEPT], [0, 1, 2, NOT_KEPT]]
    assert c.retrive_index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert c.retrive_next_token.tolist() == [[1, -1, -1, -1], [1, 2, -1, -1]]
    assert c.retrive_next_sibling.tolist() == [[-1, -1, -1, -1], [-1, -1, -1, -1]]
    assert c.cut_next_token.tolist() == [[2, -1, -1, -1], [1, 2, -1, -1]]
    assert c.cut_next_sibling.tolist() == [[-1, -1, -1, -1], [-1, -1, -1, -1]]
    assert c.tree_block.int().tolist() == [
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]],
    ]
    # FULL_MASK for seq_lens [1, 2]: request 0 is 2 rows x (1 + 2), request 1 is 3 x (2 + 3).
    mask, indptr = build_full_mask(c.tree_block, c.counts, torch.tensor([1, 2]))
    assert indptr.tolist() == [0, 6, 21]
    assert mask.int().tolist() == [
        1, 1, 0,
        1, 1, 1,
        1, 1, 1, 0, 0,
        1, 1, 1, 1, 0,
        1, 1, 1, 1, 1,
    ]


def test_parents_depth_and_links_round_trip_random():
    rng = random.Random(1)
    for _ in range(200):
        bs, n = rng.randint(1, 4), rng.randint(1, 14)
        parents, nt, ns = _batch(rng, bs, n, max_children=rng.choice([None, 2, 3]))
        got = parents_from_retrive(nt, ns)
        assert got.tolist() == parents
        topo = TreeTopology.from_retrive(nt, ns)
        assert topo.parent.tolist() == parents
        assert topo.depth.tolist() == [[depth_of(p, v) for v in range(n)] for p in parents]
        nt2, ns2 = retrive_from_parents(torch.tensor(parents))
        assert nt2.tolist() == nt.tolist() and ns2.tolist() == ns.tolist()


def test_unreachable_nodes_are_marked():
    # Node 2 is linked from nobody; node 3 is the child of node 2.
    nt = torch.tensor([[1, -1, 3, -1]])
    ns = torch.tensor([[-1, -1, -1, -1]])
    topo = TreeTopology.from_retrive(nt, ns)
    assert topo.parent.tolist() == [[-1, 0, -1, -1]]
    assert topo.depth.tolist() == [[0, 1, -1, -1]]
    assert topo.reachable.tolist() == [[True, True, False, False]]


def test_chain_helpers():
    nt, ns = chain_retrive(2, 4)
    assert nt.tolist() == [[1, 2, 3, -1]] * 2 and ns.tolist() == [[-1] * 4] * 2
    topo = TreeTopology.chain(2, 4)
    assert topo.parent.tolist() == [[-1, 0, 1, 2]] * 2
    assert TreeTopology.from_retrive(nt, ns).depth.tolist() == topo.depth.tolist()
    assert chain_keep_mask(torch.tensor([0, 3]), 4).tolist() == [
        [True, False, False, False],
        [True, True, True, True],
    ]


def test_ancestor_mask_random():
    rng = random.Random(2)
    for _ in range(100):
        bs, n = rng.randint(1, 3), rng.randint(1, 16)
        parents, _, _ = _batch(rng, bs, n)
        m = ancestor_mask(torch.tensor(parents))
        expected = [
            [[u in ancestors_or_self(p, v) for u in range(n)] for v in range(n)] for p in parents
        ]
        assert m.tolist() == expected


def test_ancestor_mask_deep_and_wide_trees():
    # The pointer jumping stops early once every pointer reached the sink; deep chains (up to
    # 70 nodes) and stars must still get every ancestor.
    rng = random.Random(12)
    for n in (1, 2, 5, 33, 64, 70):
        chain = [-1] + list(range(n - 1))
        star = [-1] + [0] * (n - 1)
        rand = random_parents(rng, n)
        m = ancestor_mask(torch.tensor([chain, star, rand]))
        for row, p in zip(m.tolist(), (chain, star, rand)):
            assert row == [[u in ancestors_or_self(p, v) for u in range(n)] for v in range(n)]


def test_cut_links_random():
    rng = random.Random(3)
    for _ in range(200):
        bs, n = rng.randint(1, 4), rng.randint(2, 14)
        parents, nt, ns = _batch(rng, bs, n, max_children=rng.choice([None, 3]))
        keeps = [random_closed_keep(rng, p, rng.random()) for p in parents]
        got_nt, got_ns = cut_links(nt, ns, torch.tensor(keeps))
        ref = [cut_links_reference(p, k) for p, k in zip(parents, keeps)]
        assert got_nt.tolist() == [r[0] for r in ref]
        assert got_ns.tolist() == [r[1] for r in ref]


def _greedy_batch(tokens, targets, nt, ns, retrive_index, n):
    out = []
    for b in range(len(nt)):
        out.append(
            verify_tree_greedy_reference(
                tokens[b], retrive_index[b], nt[b], ns[b], targets, n
            )
        )
    return out


def test_compaction_round_trip_greedy_random():
    """Greedy verification on the compacted tree == on the full tree with pruned links cut."""
    rng = random.Random(4)
    g = torch.Generator().manual_seed(4)
    total_accepted = 0
    for case in range(250):
        bs, n = rng.randint(1, 4), rng.randint(2, 12)
        vocab = rng.choice([2, 3, 5])  # small: sibling tokens collide, first match must win
        parents, nt, ns = _batch(rng, bs, n, max_children=rng.choice([None, 2, 4]))
        keeps = [random_closed_keep(rng, p, rng.uniform(0.3, 1.0)) for p in parents]
        tokens = torch.randint(0, vocab, (bs, n), generator=g)
        # Target argmax: mostly the token of some child (kept or pruned) of the node.
        kids = [[[c for c in range(n) if p[c] == u] for u in range(n)] for p in parents]
        targets = []
        for b in range(bs):
            for u in range(n):
                if kids[b][u] and rng.random() < 0.8:
                    targets.append(int(tokens[b, rng.choice(kids[b][u])]))
                else:
                    targets.append(rng.randrange(vocab))
        seq_lens = torch.randint(0, 6, (bs,), generator=g)
        depth = torch.tensor([[depth_of(p, v) for v in range(n)] for p in parents])
        positions = (seq_lens.unsqueeze(1) + depth).reshape(-1)
        total_kept = sum(sum(k) for k in keeps)
        pad = rng.choice([0, 0, 3])
        c = compact_tree(
            torch.tensor(keeps), tokens.reshape(-1), positions, nt, ns,
            num_tokens=total_kept + pad if (pad or case % 2) else None,
        )

        # Reference: full layout, links cut by the independent reference.
        ref_links = [cut_links_reference(p, k) for p, k in zip(parents, keeps)]
        full_ri = [[b * n + i for i in range(n)] for b in range(bs)]
        ref = _greedy_batch(
            tokens.tolist(), targets,
            [r[0] for r in ref_links], [r[1] for r in ref_links], full_ri, n,
        )

        # Compacted: ragged rows -> padded layout; the target forward sees kept rows only.
        assert c.num_tokens == total_kept + pad
        kept_index = c.kept_index.tolist()
        assert kept_index[total_kept:] == [PAD_INDEX] * pad
        indptr = c.qo_indptr.tolist()
        assert indptr == [0] + list(torch.cumsum(torch.tensor([sum(k) for k in keeps]), 0).tolist())
        target_rows = [targets[i] for i in kept_index[:total_kept]]  # forward on kept rows
        cand_c, targ_c = [], []
        for b in range(bs):
            cnt = indptr[b + 1] - indptr[b]
            cand_c.append(c.draft_token[indptr[b]:indptr[b + 1]].tolist() + [-7] * (n - cnt))
            targ_c += target_rows[indptr[b]:indptr[b + 1]] + [-9] * (n - cnt)
        got = _greedy_batch(
            cand_c, targ_c, c.retrive_next_token.tolist(), c.retrive_next_sibling.tolist(),
            c.retrive_index.tolist(), n,
        )
        for b in range(bs):
            ref_ids, ref_toks, ref_bonus = ref[b]
            got_ids, got_toks, got_bonus = got[b]
            assert got_toks == ref_toks and got_bonus == ref_bonus
            # Map padded-compact ids back to full ids through the ragged index map.
            mapped = [kept_index[indptr[b] + (i - b * n)] for i in got_ids]
            assert mapped == ref_ids
            total_accepted += len(ref_toks)

        # Route B tail: scatter ragged outputs back, sample on the strided cut links.
        rows = torch.tensor(target_rows + [-5] * pad, dtype=torch.float32)
        full = scatter_to_full(rows, c.kept_index, bs * n, fill_value=-1.0)
        flat_keep = [k for ks in keeps for k in ks]
        assert full.tolist() == [float(t) if k else -1.0 for t, k in zip(targets, flat_keep)]
        strided = _greedy_batch(
            tokens.tolist(), [int(x) for x in full.tolist()],
            c.cut_next_token.tolist(), c.cut_next_sibling.tolist(), full_ri, n,
        )
        assert strided == ref

        # Positions and mask block of the compacted rows.
        assert c.positions[:total_kept].tolist() == [positions[i].item() for i in kept_index[:total_kept]]
        for b in range(bs):
            nodes = [i - b * n for i in kept_index[indptr[b]:indptr[b + 1]]]
            assert nodes == sorted(nodes) and nodes[0] == 0
            block = c.tree_block[b].tolist()
            for r in range(n):
                for col in range(n):
                    want = (
                        r < len(nodes) and col < len(nodes)
                        and nodes[col] in ancestors_or_self(parents[b], nodes[r])
                    )
                    assert block[r][col] == want
    assert total_accepted > 200  # the walks are not trivially empty


def test_full_mask_layout_random():
    rng = random.Random(5)
    g = torch.Generator().manual_seed(5)
    for _ in range(100):
        bs, w = rng.randint(1, 4), rng.randint(1, 6)
        counts = [rng.randint(1, w) for _ in range(bs)]
        seq = [rng.randint(0, 5) for _ in range(bs)]
        block = torch.rand(bs, w, w, generator=g) < 0.5
        mask, indptr = build_full_mask(block, torch.tensor(counts), torch.tensor(seq))
        expected = []
        for b in range(bs):
            for r in range(counts[b]):
                expected += [True] * seq[b]
                expected += [bool(block[b, r, j]) for j in range(counts[b])]
        assert mask.tolist() == expected
        offs = [0]
        for q, p in zip(counts, seq):
            offs.append(offs[-1] + q * (p + q))
        assert indptr.tolist() == offs
        # Uniform case: the block extractor inverts the builder.
        full_counts = torch.full((bs,), w)
        m2, _ = build_full_mask(block, full_counts, torch.tensor(seq))
        assert torch.equal(tree_block_from_full_mask(m2, torch.tensor(seq), w), block)


def test_compact_with_given_tree_block_matches_derived():
    rng = random.Random(6)
    parents, nt, ns = _batch(rng, 3, 9)
    keeps = torch.tensor([random_closed_keep(rng, p, 0.7) for p in parents])
    tok = torch.arange(27)
    pos = torch.zeros(27, dtype=torch.int64)
    seq = torch.tensor([3, 0, 5])
    full_block = torch.tensor(
        [[[u in ancestors_or_self(p, v) for u in range(9)] for v in range(9)] for p in parents]
    )
    sglang_mask, _ = build_full_mask(full_block, torch.full((3,), 9), seq)
    given = compact_tree(keeps, tok, pos, nt, ns,
                         tree_block=tree_block_from_full_mask(sglang_mask, seq, 9))
    derived = compact_tree(keeps, tok, pos, nt, ns)
    assert torch.equal(given.tree_block, derived.tree_block)


def test_scatter_to_full_multi_dim():
    compact = torch.tensor([[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]])
    out = scatter_to_full(compact, torch.tensor([3, 0, PAD_INDEX]), 4)
    assert out.tolist() == [[3.0, 4.0], [0.0, 0.0], [0.0, 0.0], [1.0, 2.0]]


@pytest.mark.parametrize("n", [2, 3, 16, 60])
def test_deep_chain_topology(n):
    # The longest path (a chain) exercises the number of pointer-jumping rounds.
    nt, ns = chain_retrive(1, n)
    topo = TreeTopology.from_retrive(nt, ns)
    assert topo.depth.tolist() == [list(range(n))]
    assert ancestor_mask(topo.parent)[0].tolist() == [[u <= v for u in range(n)] for v in range(n)]
    keep = torch.zeros(1, n, dtype=torch.bool)
    keep[0, 0] = True
    cnt, cns = cut_links(nt, ns, keep)
    assert cnt.tolist() == [[NO_LINK] * n] and cns.tolist() == [[NO_LINK] * n]


def test_pointer_jumping_stops_early_and_path_sums_stay_exact():
    # Shallow trees need fewer jumping rounds than num_jump_rounds(n); the path sums must still
    # cover the whole root path (checked against a per-node walk), for shallow, deep and mixed
    # batches, and for a topology built by hand (no jump table).
    from sglang_ext.dcut import path_reduce
    from sglang_ext.dcut.tree import num_jump_rounds

    rng = random.Random(11)
    star = [-1] + [0] * 59
    chain = [-1] + list(range(59))
    for parents in ([star, star], [chain, star], [random_parents(rng, 60, 3) for _ in range(8)]):
        topo = TreeTopology.from_parents(torch.tensor(parents))
        max_depth = max(depth_of(p, v) for p in parents for v in range(60))
        assert len(topo.jumps) <= num_jump_rounds(60)
        assert 2 ** len(topo.jumps) >= max_depth
        values = torch.tensor([[float(rng.randint(1, 9)) if v else 0.0 for v in range(60)] for _ in parents])
        want = [[sum(values[b, u].item() for u in ancestors_or_self(p, v)) for v in range(60)]
                for b, p in enumerate(parents)]
        assert path_reduce(values, topo, "sum").tolist() == want
        by_hand = TreeTopology(parent=topo.parent, depth=topo.depth)
        assert path_reduce(values, by_hand, "sum").tolist() == want
    assert len(TreeTopology.from_parents(torch.tensor([star])).jumps) == 0


def test_reachable_mask_is_not_reused_for_a_replaced_depth():
    import dataclasses

    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 1, -1]]))
    assert topo.reachable_shared() is topo.reachable_mask  # shared, no copy
    assert topo.reachable_shared().tolist() == [[True, True, True, False]]
    # a copy with another depth must not answer with the stored mask of the old depth
    cut = dataclasses.replace(topo, depth=torch.tensor([[0, 1, -1, -1]]))
    assert cut.reachable_shared().tolist() == [[True, True, False, False]]
    # a copy that keeps the depth keeps sharing the mask
    same = dataclasses.replace(topo, jumps=None)
    assert same.reachable_shared() is topo.reachable_mask

"""Query-length buckets of the torch backend (``split_by_query_length``, ``bucket_plan``; no SGLang).

A ragged verify (D-Cut keeps a different number of drafts per request) or a prefill batch of
unequal prompts is run as several padded SDPA calls over groups of similar query length, each
within a key-row budget. These tests check the partition itself and that every group's
attention output is the one an independent float64 reference computes from the group's own
rows, keys and mask -- the same answer as the single padded call, whatever the bucketing.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ext.dcut.tree import NO_PARENT, ancestor_mask
from sglang_ext.engine.attention.torch_sdpa_plan import (
    AttentionPlan,
    BucketedPlan,
    MaskKind,
    bucket_plan,
    exclusive_indptr,
    gather_row_slots,
    make_plan,
    run_plan,
    split_by_query_length,
)

HQ, HKV, D = 4, 2, 8
SLOTS, MAX_REQS, CTX = 4096, 16, 200


@pytest.mark.parametrize("seed", range(60))
def test_split_is_a_sorted_partition_within_budget(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=gen))
    q = torch.randint(1, 17, (n,), generator=gen).tolist()
    kv = [qi + int(torch.randint(0, 300, (1,), generator=gen)) for qi in q]
    budget = int(torch.randint(16, 5000, (1,), generator=gen))
    buckets = split_by_query_length(q, kv, budget)
    assert sorted(g for b in buckets for g in b) == list(range(n))  # every group exactly once
    for b in buckets:
        assert b, "empty bucket"
        assert [q[g] for g in b] == sorted(q[g] for g in b)
        if len(b) > 1:
            assert len(b) * max(kv[g] for g in b) <= budget
    for left, right in zip(buckets, buckets[1:]):
        assert max(q[g] for g in left) <= min(q[g] for g in right)
        # greedy: the next group would not have fitted into the previous bucket
        assert (len(left) + 1) * max(max(kv[g] for g in left), kv[right[0]]) > budget


def test_split_keeps_one_call_when_everything_fits():
    assert split_by_query_length([4, 4, 4], [100, 90, 80], 4096) == [[0, 1, 2]]
    assert split_by_query_length([], [], 4096) == []
    # a single group over budget is its own bucket, never dropped
    assert split_by_query_length([16, 1], [5000, 10], 4096) == [[1], [0]]


def _reference(q, k, v, k_cache, v_cache, q_lens, prefix_lens, slots, kind, include_current, blocks, scaling):
    """Per-group float64 softmax attention over the group's own keys (no padding anywhere)."""
    out = torch.zeros(q.shape[0], HQ, D, dtype=torch.float64)
    qo = exclusive_indptr(q_lens)
    po = exclusive_indptr(prefix_lens)
    for i, (ql, p) in enumerate(zip(q_lens, prefix_lens)):
        rows = slice(qo[i], qo[i] + ql)
        keys = k_cache[slots[po[i]:po[i] + p]].double()
        vals = v_cache[slots[po[i]:po[i] + p]].double()
        if include_current:
            keys = torch.cat([keys, k[rows].double()])
            vals = torch.cat([vals, v[rows].double()])
        cols = keys.shape[0]
        allow = torch.ones(ql, cols, dtype=torch.bool)
        if kind is MaskKind.CAUSAL:
            allow = torch.arange(cols).view(1, -1) <= p + torch.arange(ql).view(-1, 1)
        elif kind is MaskKind.TREE:
            allow[:, p:] = blocks[i]
        rep = HQ // HKV
        kk = keys.repeat_interleave(rep, dim=1).transpose(0, 1)  # [HQ, cols, D]
        vv = vals.repeat_interleave(rep, dim=1).transpose(0, 1)
        qq = q[rows].double().transpose(0, 1)  # [HQ, ql, D]
        s = (qq @ kk.transpose(1, 2)) * scaling
        s = s.masked_fill(~allow.view(1, ql, cols), -math.inf)
        out[rows] = (torch.softmax(s, -1) @ vv).transpose(0, 1)
    return out


def _tree_block(gen, q):
    """A random draft tree over q nodes in topological order: ancestors-or-self mask."""
    parent = [NO_PARENT] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, q)]
    return ancestor_mask(torch.tensor([parent]))[0]


@pytest.mark.parametrize("kind", [MaskKind.CAUSAL, MaskKind.TREE, MaskKind.VISIBLE])
@pytest.mark.parametrize("seed", range(12))
def test_bucketed_plan_matches_the_per_group_reference(kind, seed):
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(SLOTS, HKV, D, generator=gen)
    v_cache = torch.randn(SLOTS, HKV, D, generator=gen)
    r2t = (torch.randperm(SLOTS - 1, generator=gen)[: MAX_REQS * CTX] + 1).view(MAX_REQS, CTX).to(torch.int32)
    bs = int(torch.randint(2, MAX_REQS + 1, (1,), generator=gen))
    rows = torch.randperm(MAX_REQS, generator=gen)[:bs]
    prefix = torch.randint(1, 150, (bs,), generator=gen).tolist()
    q_lens = torch.randint(1, 17, (bs,), generator=gen).tolist()
    include_current = kind is not MaskKind.VISIBLE
    slots = gather_row_slots(r2t, rows, [0] * bs, prefix)
    blocks = [_tree_block(gen, ql) for ql in q_lens] if kind is MaskKind.TREE else None
    kv_max = max(p + (ql if include_current else 0) for p, ql in zip(prefix, q_lens))
    # under 2x the longest group: that group runs alone, so there are always several buckets
    budget = kv_max + int(torch.randint(0, kv_max // 2 + 1, (1,), generator=gen))
    plan = bucket_plan(q_lens, prefix, slots, kind, include_current=include_current, tree_blocks=blocks,
                       kv_rows_per_call=budget)
    assert isinstance(plan, BucketedPlan) and len(plan.buckets) > 1
    num_rows = sum(q_lens)
    assert sorted(torch.cat([b.rows for b in plan.buckets]).tolist()) == list(range(num_rows))
    pad = 3  # rows past the plan (pad lanes of a verify bucket) must come back zero
    q = torch.randn(num_rows + pad, HQ, D, generator=gen)
    k = torch.randn(num_rows + pad, HKV, D, generator=gen)
    v = torch.randn(num_rows + pad, HKV, D, generator=gen)
    out = run_plan(plan, q, k, v, k_cache, v_cache, scaling=0.35)
    ref = _reference(q, k, v, k_cache, v_cache, q_lens, prefix, slots, kind, include_current, blocks, 0.35)
    assert torch.allclose(out[:num_rows].double(), ref[:num_rows], atol=1e-5), (out[:num_rows] - ref[:num_rows]).abs().max()
    assert torch.all(out[num_rows:] == 0)
    single = make_plan(q_lens, prefix, slots, kind, include_current=include_current, tree_blocks=blocks)
    assert isinstance(single, AttentionPlan)
    same = run_plan(single, q, k, v, k_cache, v_cache, scaling=0.35)
    assert torch.allclose(out, same, atol=1e-5)


def test_uniform_batch_within_budget_is_a_plain_plan():
    slots = torch.arange(40)
    plan = bucket_plan([4] * 4, [10] * 4, slots, MaskKind.CAUSAL)
    assert isinstance(plan, AttentionPlan)


def test_non_finite_cache_stays_in_its_bucket_group():
    gen = torch.Generator().manual_seed(7)
    k_cache = torch.randn(SLOTS, HKV, D, generator=gen)
    v_cache = torch.randn(SLOTS, HKV, D, generator=gen)
    q_lens, prefix = [1, 5, 2, 5], [30, 20, 40, 25]
    slots = torch.arange(sum(prefix)) + 1
    k_cache[slots[0]] = float("nan")  # request 0's first cached key
    plan = bucket_plan(q_lens, prefix, slots, MaskKind.CAUSAL, kv_rows_per_call=64)
    assert isinstance(plan, BucketedPlan)
    n = sum(q_lens)
    out = run_plan(plan, torch.randn(n, HQ, D, generator=gen), torch.randn(n, HKV, D, generator=gen),
                   torch.randn(n, HKV, D, generator=gen), k_cache, v_cache, scaling=0.3)
    assert torch.isnan(out[0]).all()  # the request that owns the NaN key
    assert torch.isfinite(out[1:]).all()  # nobody else, whichever bucket they share with it

"""Planning of the FlashInfer pruned-verify path (``sglang_ext.engine.attention.flashinfer_dcut``), on CPU.

The plan FlashInfer would receive (ragged ``qo_indptr``, kept keys, packed mask) is checked
against independent references: per-request Python loops, ``numpy.packbits``, and the project's
torch attention backend (``torch_backend_plan``) run on random pruned trees and chains. No SGLang,
no FlashInfer import. The GPU check script (``tests/gpu/run_gpu_checks.py``) runs here as a CPU
dry run (every part, tiny shapes, reference attention in place of FlashInfer, graph path eager on
padded inputs), and must fail when the mask packing is corrupted.

Budget: < 30 s.
"""

from __future__ import annotations

import doctest
import json
import math
import os
import struct
import zlib

import numpy as np
import pytest
import torch

import sglang_ext.engine.attention.flashinfer_dcut as fv
import sglang_ext.engine.attention.flashinfer_verify_plan as fvp
from sglang_ext.dcut import (
    TreeTopology,
    build_full_mask,
    chain_keep_mask,
    chain_retrive,
    choose,
    compact_tree,
    keep_count,
    retrive_from_parents,
    tree_survival,
)
from sglang_ext.engine.attention.torch_sdpa_modes import plan_target_verify
from sglang_ext.engine.attention.torch_sdpa_plan import run_plan


def test_doctests_pass():
    plan, backend = doctest.testmod(fvp), doctest.testmod(fv)
    assert plan.attempted + backend.attempted >= 15 and plan.failed == backend.failed == 0


@pytest.mark.parametrize("module", [fv, fvp], ids=["flashinfer_dcut", "flashinfer_verify_plan"])
def test_module_is_pure(module):
    # no SGLang or FlashInfer import at module level (the backend imports them lazily, on CUDA)
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not any(x.startswith(("sglang.", "flashinfer")) or x in ("sglang", "flashinfer") for x in names)


# ----------------------------------------------------------------------------- packing
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pack_mask_matches_numpy_packbits_per_segment(seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 40, (7,), generator=gen)
    lens[2] = 0
    ip = torch.zeros(8, dtype=torch.int64)
    ip[1:] = torch.cumsum(lens, 0)
    mask = torch.rand(int(ip[-1]), generator=gen) > 0.5
    packed, pip = fv.pack_mask_segments(mask, ip)
    expect, eip = [], [0]
    for b in range(7):
        seg = mask[ip[b]: ip[b + 1]].numpy().astype(np.uint8)
        by = np.packbits(seg, bitorder="little").tolist() if seg.size else []
        expect += by
        eip.append(eip[-1] + len(by))
    assert packed.dtype == torch.uint8 and packed.tolist() == expect and pip.tolist() == eip
    assert torch.equal(fv.unpack_mask_segments(packed, ip), mask)


# ----------------------------------------------------------------------------- keys
def test_window_and_kept_keys_match_loops():
    gen = torch.Generator().manual_seed(3)
    bs, n, ctx = 3, 5, 30
    r2t = torch.randperm(4 * ctx, generator=gen).view(4, ctx)
    rp = torch.tensor([3, 0, 2])
    p = torch.tensor([4, 0, 7])
    wip, wkv = fv.window_kv(r2t, rp, p, n)
    for b in range(bs):
        assert wkv[wip[b]: wip[b + 1]].tolist() == r2t[rp[b], : p[b] + n].tolist()
    cols = [[0, 2, 3], [0], [0, 1, 4]]
    counts = torch.tensor([len(c) for c in cols])
    qo = fv.ragged_qo_indptr(counts)
    kept = torch.tensor(sum(cols, []) + [fv.NO_COL, fv.NO_COL])  # two padding rows
    kip, kkv = fv.select_kept_kv(wip, wkv, p, qo, kept)
    for b in range(bs):
        want = r2t[rp[b], : p[b]].tolist() + [int(r2t[rp[b], p[b] + c]) for c in cols[b]]
        assert kkv[kip[b]: kip[b + 1]].tolist() == want
    assert kip.dtype == torch.int32 and kkv.dtype == torch.int32


def test_kept_cols_helpers():
    ki = torch.tensor([0, 3, 5, 6, 7, -1, -1])
    assert fv.kept_cols_from_index(ki, 4).tolist() == [0, 3, 1, 2, 3, -1, -1]
    assert fv.chain_kept_cols(torch.tensor([0, 1, 4]), 6).tolist() == [0, 0, 1, 2, -1, -1]


def test_verify_kept_cols_uses_the_tree_ids_without_a_kv_loc_plan():
    # Trees (topk > 1) have no kv_loc_plan: the kept ids D-Cut puts on the spec info must pick the
    # window columns. Request 0 keeps nodes 0, 1, 3 (node 2 pruned, node 3 its later sibling),
    # request 1 keeps 0 and 2; one padding row. Hand-written expected columns.
    qo = torch.tensor([0, 3, 5])
    kept = torch.tensor([0, 1, 3, 4, 6, -1])
    assert fv.verify_kept_cols(None, kept, qo, 6, 4).tolist() == [0, 1, 3, 0, 2, -1]
    # chain columns would read the pruned nodes' slots (column 2 instead of 3, 1 instead of 2)
    assert fv.verify_kept_cols(None, None, qo, 6, 4).tolist() == [0, 1, 2, 0, 1, -1]
    # ids bound on a kv_loc_plan take precedence
    bound = torch.tensor([0, 1, 2, 4, 5, -1])
    assert fv.verify_kept_cols(bound, kept, qo, 6, 4).tolist() == [0, 1, 2, 0, 1, -1]


# ----------------------------------------------------------------------------- against the torch backend
def _random_trees(bs, n, gen):
    parent = torch.full((bs, n), -1, dtype=torch.int64)
    for b in range(bs):
        for v in range(1, n):
            parent[b, v] = int(torch.randint(0, v, (1,), generator=gen))
    return parent


def _case(gen, bs, n, ratio, tree, hq=4, hkv=2, d=8):
    ctx = 40
    r2t = (torch.randperm(bs * ctx, generator=gen) + 1).view(bs, ctx)  # slot 0 = sink
    rp = torch.randperm(bs, generator=gen)
    p = torch.randint(1, 12, (bs,), generator=gen)
    if tree:
        parent = _random_trees(bs, n, gen)
        topo = TreeTopology.from_parents(parent)
        nt, ns = retrive_from_parents(parent)
        scores = tree_survival(torch.rand(bs, n, generator=gen), topo).scores
        keep = choose(scores, None, mode=ratio, topology=topo).keep_mask
    else:
        nt, ns = chain_retrive(bs, n)
        scores = torch.cumprod(torch.rand(bs, n - 1, generator=gen), 1)
        keep = chain_keep_mask(choose(scores, None, mode=ratio).keep_lens, n)
    width = bs + keep_count(bs, n, ratio)
    tokens = torch.arange(bs * n)
    pos = (p.unsqueeze(1) + torch.arange(n)).reshape(-1)
    ct = compact_tree(keep, tokens, pos, nt, ns, num_tokens=width)
    mask, _ = build_full_mask(ct.tree_block, ct.counts, p)
    slots = bs * ctx + 1
    k_cache = torch.randn(slots, hkv, d, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(slots, hkv, d, generator=gen, dtype=torch.float64)
    q = torch.randn(width, hq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(width, hkv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(width, hkv, d, generator=gen, dtype=torch.float64)
    total = int(ct.counts.sum())
    # kept rows write their own window slots (pad rows write the sink)
    cols = fv.kept_cols_from_index(ct.kept_index, n)
    row_req = torch.where(ct.kept_index >= 0, torch.div(ct.kept_index, n, rounding_mode="floor"), 0)
    write = torch.where(cols >= 0, r2t[rp[row_req], p[row_req] + cols.clamp(min=0)], fv.SINK_SLOT)
    k_cache[write], v_cache[write] = k, v
    return SimpleCase(r2t, rp, p, n, ct, mask, q, k, v, k_cache, v_cache, width, total)


class SimpleCase:
    def __init__(self, *a):
        (self.r2t, self.rp, self.p, self.n, self.ct, self.mask, self.q, self.k, self.v, self.k_cache,
         self.v_cache, self.width, self.total) = a


def _torch_backend(c):
    plan = plan_target_verify(c.r2t, c.rp, c.p.tolist(), c.ct.counts.tolist(), c.mask)
    return run_plan(plan, c.q, c.k, c.v, c.k_cache, c.v_cache, scaling=0.35)


@pytest.mark.parametrize("tree", [True, False])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 1.0])
def test_plan_matches_torch_backend_on_pruned_batches(tree, ratio):
    gen = torch.Generator().manual_seed(int(ratio * 100) + tree)
    c = _case(gen, bs=5, n=8, ratio=ratio, tree=tree)
    wip, wkv = fv.window_kv(c.r2t, c.rp, c.p, c.n)
    qo = fv.ragged_qo_indptr(c.ct.counts)
    assert torch.equal(qo, c.ct.qo_indptr)
    vp = fv.plan_verify(wip, wkv, c.p, qo, fv.kept_cols_from_index(c.ct.kept_index, c.n), c.mask,
                        num_tokens=c.width)
    assert vp.num_tokens == c.width and vp.batch_size == 5 and vp.num_requests == 5 + fv.PAD_REQUESTS
    pad_rows = c.width - c.total  # the padding request: the rows past the kept ones, pad_rows + 1 sink keys
    assert vp.qo_indptr.tolist() == qo.tolist() + [c.width]  # q.shape[0] == qo_indptr[-1] (FlashInfer's check)
    assert vp.kv_indptr.tolist() == fvp._exclusive(torch.cat([c.p + c.ct.counts, torch.tensor([pad_rows + 1])])).tolist()
    assert vp.kv_indices[int(vp.kv_indptr[-2]):].tolist() == [fv.SINK_SLOT] * (pad_rows + 1)
    if tree:
        assert torch.equal(vp.mask_indptr[:-1], build_full_mask(c.ct.tree_block, c.ct.counts, c.p)[1])
        assert int(vp.mask_indptr[-1] - vp.mask_indptr[-2]) == pad_rows * (pad_rows + 1)
    ref = _torch_backend(c)
    got = fv.paged_attention_reference(c.q, c.k_cache, c.v_cache, vp, sm_scale=0.35)
    assert torch.allclose(got[: c.total], ref[: c.total], atol=1e-10)
    sink_v = c.v_cache[fv.SINK_SLOT].repeat_interleave(c.q.shape[1] // c.k_cache.shape[1], dim=0)
    assert torch.allclose(got[c.total:], sink_v.expand_as(got[c.total:]), atol=1e-10)  # padding rows: sink only
    if not tree:  # chains: the causal (maskless) plan is the same attention
        vc = fv.plan_verify(wip, wkv, c.p, qo, fv.chain_kept_cols(qo, c.width), None, num_tokens=c.width)
        assert vc.causal and vc.packed_mask is None and torch.equal(vc.kv_indices, vp.kv_indices)
        got_c = fv.paged_attention_reference(c.q, c.k_cache, c.v_cache, vc, sm_scale=0.35)
        assert torch.allclose(got_c[: c.total], ref[: c.total], atol=1e-10)


def test_corrupt_mask_bit_is_caught_by_the_reference():
    gen = torch.Generator().manual_seed(9)
    c = _case(gen, bs=3, n=6, ratio=0.5, tree=True)
    wip, wkv = fv.window_kv(c.r2t, c.rp, c.p, c.n)
    qo = fv.ragged_qo_indptr(c.ct.counts)
    bad = c.mask.clone()
    # flip a tree cell of the last row of request 0 (its own diagonal: always True)
    q0, p0 = int(c.ct.counts[0]), int(c.p[0])
    bad[(q0 - 1) * (p0 + q0) + p0 + q0 - 1] = False
    vp = fv.plan_verify(wip, wkv, c.p, qo, fv.kept_cols_from_index(c.ct.kept_index, c.n), bad, num_tokens=c.width)
    got = fv.paged_attention_reference(c.q, c.k_cache, c.v_cache, vp, sm_scale=0.35)
    ref = _torch_backend(c)
    assert not torch.allclose(got[q0 - 1], ref[q0 - 1])


# ----------------------------------------------------------------------------- graphs per tier
@pytest.mark.parametrize("n", [4, 8, 16])
def test_tier_shapes_and_capture_counts(n):
    tiers = (0.25, 0.5, 0.75, 1.0)
    for bs in (1, 2, 3, 4, 7, 16, 33, 64):
        counts = fv.tier_token_counts(bs, n, tiers)
        assert counts == [math.ceil(bs * n * r - 1e-12) for r in tiers]
        assert counts[-1] == bs * n and all(bs <= t <= bs * n for t in counts)
        for t in set(counts):
            cc = fv.capture_counts(bs, n, t)
            assert sum(cc) == t and min(cc) >= 1 and max(cc) <= n and max(cc) - min(cc) <= 1
    shapes = fv.verify_graph_shapes([4, 64], n, tiers)
    keys = [(s.batch_size, s.num_tokens) for s in shapes]
    assert len(keys) == len(set(keys)) and keys == sorted(keys)
    assert {s.num_tokens for s in shapes if s.batch_size == 64} == set(fv.tier_token_counts(64, n, tiers))
    with pytest.raises(ValueError):
        fv.capture_counts(4, n, 3)


def test_padded_num_tokens_picks_smallest_fitting_graph():
    caps = fv.tier_token_counts(8, 16)
    assert fv.padded_num_tokens(caps[0], caps) == caps[0]
    assert fv.padded_num_tokens(caps[0] + 1, caps) == caps[1]
    assert fv.padded_num_tokens(caps[-1] + 1, caps) is None


def test_graph_buffer_sizes_bound_every_plan_of_the_graph():
    gen = torch.Generator().manual_seed(11)
    bs, n, max_ctx = 4, 8, 30
    for t in fv.tier_token_counts(bs, n):
        sizes = fv.graph_buffer_sizes(bs, t, max_ctx)
        for _ in range(20):
            counts = torch.tensor(fv.capture_counts(bs, n, t))
            counts = torch.clamp(counts - torch.randint(0, 2, (bs,), generator=gen), min=1)
            p = torch.randint(0, max_ctx - n + 1, (bs,), generator=gen)
            p[0] = max_ctx - int(counts[0])  # one request at the context limit
            qo = fv.ragged_qo_indptr(counts)
            wip, wkv = fv.window_kv(torch.arange(1, bs * (max_ctx + n) + 1).view(bs, -1), torch.arange(bs), p, n)
            mask = torch.ones(int((counts * (p + counts)).sum()), dtype=torch.bool)
            vp = fv.plan_verify(wip, wkv, p, qo, fv.chain_kept_cols(qo, t), mask, num_tokens=t)  # + padding request
            assert vp.kv_indices.numel() <= sizes.kv_indices and vp.packed_mask.numel() <= sizes.packed_mask


# ----------------------------------------------------------------------------- the GPU script, dry run
from gpu_script import load as _script  # noqa: E402


def _summary(out):
    with open(os.path.join(out, "gpu_checks_summary.json")) as f:
        return json.load(f)


def test_dry_run_on_cpu_runs_every_part(tmp_path):
    from sglang_ext.dcut import CostTable

    rgc = _script()
    out = str(tmp_path)
    assert rgc.main(["--dry-run", "--out", out]) == 0
    s = _summary(out)
    a = s["a_correctness"]
    assert a["passed"] and a["cases"] == 32 and a["graph_replays"] == 32 and not a["failures"]
    assert a["accept_compared"] > a["near_tie_requests"] and a["accept_mismatch"] == 0
    assert 0 < a["eager_max_err"] < rgc.BF16_ATOL
    for part, fname in (("b_cost_curves_dense", "cost_table_qwen3_8b_dense.json"),
                        ("b_cost_curves_moe", "cost_table_qwen3_30b_a3b_moe.json")):
        assert s[part]["passed"]
        t = CostTable.load(os.path.join(out, fname))
        assert t.batch_sizes == (2, 4) and t.tiers == (0.25, 0.5, 0.75, 1.0)
        assert t.key.draft_tokens == 8 and t.key.draft == "none (verify only)"
        assert len(s[part]["detail"]) == 8
    for kind in ("chain", "tree"):
        c = s["c_planner"][kind]
        assert c["total"] > 0 and {"scores", "choose", "compact", "verify_plan"} <= set(c)
    with open(s["png"]["path"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert s["exit_status"] == 0


def test_dry_run_fails_on_a_corrupted_mask(tmp_path, monkeypatch):
    rgc = _script()
    real = rgc.fvp.pack_mask_segments  # plan_verify's own (flashinfer_dcut re-exports it)

    def broken(mask, indptr):
        packed, ip = real(mask, indptr)
        return torch.zeros_like(packed), ip  # every tree cell masked out

    monkeypatch.setattr(rgc.fvp, "pack_mask_segments", broken)
    out = str(tmp_path)
    assert rgc.main(["--dry-run", "--out", out, "--skip-moe"]) == 1
    a = _summary(out)["a_correctness"]
    assert not a["passed"] and a["failures"] and all(f["tree"] for f in a["failures"])


def test_raster_png_fallback(tmp_path):
    from sglang_ext.dcut import CostTable, CostTableKey

    rgc = _script()
    key = CostTableKey("m", "none", "cpu", 1, "bfloat16", 16, 1, 1, "x", 32, "0.5.23", "0.1.0")
    t = CostTable.build(key, [4, 8, 16], [[1, 2, 3, 4], [2, 3, 4, 5], [2, 4, 6, 8]])
    path = str(tmp_path / "p.png")
    rgc._raster_png(path, {"a": t, "b": t})
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (960, 320)
    idat_len = struct.unpack(">I", data[33:37])[0]
    raw = zlib.decompress(data[41:41 + idat_len])
    assert len(raw) == h * (1 + 3 * w)
    assert raw.count(bytes([31, 119, 180])) > 10  # the tier-0.25 curve is drawn


def test_dry_run_torch_fallback_for_cost_curves(tmp_path):
    from sglang_ext.dcut import CostTable

    rgc = _script()
    out = str(tmp_path)
    assert rgc.main(["--dry-run", "--attention", "torch", "--skip-moe", "--out", out]) == 2  # (a) skipped
    s = _summary(out)
    assert s["attention"] == "torch" and "skipped" in s["a_correctness"]
    t = CostTable.load(os.path.join(out, "cost_table_qwen3_8b_dense.json"))
    assert t.key.attention_backend.startswith("torch_sdpa") and all(c > 0 for row in t.step_ms for c in row)

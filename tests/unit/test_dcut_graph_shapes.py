"""Pure shape / padding logic of the D-Cut tier verify graphs (``sglang_ext.engine.dcut.graphs``), on CPU.

Which ``(bs, T)`` graphs are captured, which one a compacted step replays (or none: eager), how a
ragged step of ``W`` rows is padded to a graph (zero-row padding requests, rows past the last
request), and the capture layout / mask. Expected values come from exact rational arithmetic,
brute-force searches and the reference attention of ``flashinfer_verify`` on independently built
key lists, never from the functions under test. No SGLang import (checked in a subprocess).

Budget: < 15 s.
"""

from __future__ import annotations

import doctest
import itertools
import math
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from sglang_ext.engine.dcut import graphs as dg
from sglang_ext.engine.attention import flashinfer_dcut as fv


def _ceil_width(bs: int, n: int, ratio: float) -> int:
    """Tier width ``ceil(bs * N * rho)`` (at least one row per request), exact."""
    return max(bs, math.ceil(Fraction(bs * n) * Fraction(str(ratio))))


def test_doctests_pass():
    res = doctest.testmod(dg)
    assert res.attempted >= 8 and res.failed == 0


def test_import_does_not_load_sglang():
    code = ("import sys; import sglang_ext.engine.dcut.graphs as m; "
            "m.tier_graph_keys([1, 2], 4); m.TierGraphTable(()).lookup(1, 1, True); "
            "print(any(k == 'sglang' or k.startswith('sglang.') for k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- which graphs
@pytest.mark.parametrize("tiers", [(0.25, 0.5, 0.75, 1.0), (0.3, 1.0), (0.1, 0.2, 0.9, 1.0), (1.0,)])
def test_tier_graph_keys_exhaustive(tiers):
    for n in range(1, 7):
        batch_sizes = [1, 2, 3, 5, 8]
        for masked in (True, False):
            keys = dg.tier_graph_keys(batch_sizes, n, tiers, masked)
            want = sorted({(_ceil_width(bs, n, r), bs) for bs in batch_sizes for r in tiers
                           if _ceil_width(bs, n, r) < bs * n})
            assert [(k.num_tokens, k.batch_size) for k in keys] == want
            assert all(k.masked is masked for k in keys)
            assert len(set(keys)) == len(keys)


def test_tier_graph_keys_hand_example():
    # N = 16 at bs 64 (DFlash block 16): widths 256 / 512 / 768, the full 1024 is not a tier graph
    keys = dg.tier_graph_keys([64], 16)
    assert [(k.batch_size, k.num_tokens) for k in keys] == [(64, 256), (64, 512), (64, 768)]
    # duplicate batch sizes and unsorted input
    assert dg.tier_graph_keys([2, 1, 2], 4) == dg.tier_graph_keys([1, 2], 4)
    assert dg.TierGraphKey(12, 4, False).variant == "dcut_tier:4x12:causal"


# ----------------------------------------------------------------------------- which graph a step replays
def _brute_lookup(keys, raw_bs, width, masked):
    fit = [k for k in keys if k.num_tokens >= width and k.batch_size >= raw_bs and k.masked == masked]
    return min(fit, key=lambda k: (k.num_tokens, k.batch_size)) if fit else None


def test_lookup_matches_brute_force():
    for n, batch_sizes in ((4, [1, 2, 4, 8]), (8, [1, 3, 6, 16]), (16, [2, 4, 10])):
        keys = dg.tier_graph_keys(batch_sizes, n, masked=True) + dg.tier_graph_keys(batch_sizes[:2], n, masked=False)
        table = dg.TierGraphTable(keys)
        assert len(table) == len(set(keys))
        for raw_bs in range(1, max(batch_sizes) + 2):
            for width in range(1, max(batch_sizes) * n + 2):
                for masked in (True, False):
                    assert table.lookup(raw_bs, width, masked) == _brute_lookup(keys, raw_bs, width, masked), \
                        (n, raw_bs, width, masked)


def test_lookup_hand_cases_and_eager_fallback():
    table = dg.TierGraphTable(dg.tier_graph_keys([1, 2, 4], 4))
    k = table.lookup(3, 5, True)
    assert (k.batch_size, k.num_tokens) == (4, 8)  # bs 2 has no T >= 5 below its full width 8
    assert table.lookup(2, 3, True) == dg.TierGraphKey(4, 2, True)
    assert table.lookup(1, 4, True) == dg.TierGraphKey(4, 2, True)  # smaller T on a larger bs beats bs 1's full
    assert table.lookup(5, 1, True) is None  # more requests than any graph: eager
    assert table.lookup(4, 13, True) is None  # wider than every tier graph: eager
    assert table.lookup(1, 1, False) is None  # causal step, only tree-mask graphs: eager
    assert dg.TierGraphTable().lookup(1, 1, True) is None
    assert dg.TierGraphKey(8, 4, True) in table and dg.TierGraphKey(16, 4, True) not in table


# ----------------------------------------------------------------------------- padding a step to a graph
def test_pad_ragged_layout_exhaustive():
    for raw_bs in range(1, 4):
        for counts in itertools.product(range(0, 4), repeat=raw_bs):
            qo = [0]
            for c in counts:
                qo.append(qo[-1] + c)
            for bs in range(raw_bs, raw_bs + 3):
                lay = dg.pad_ragged_layout(torch.tensor(qo), bs, qo[-1] + 2)
                assert lay.verify_lens.tolist() == list(counts) + [0] * (bs - raw_bs)
                assert lay.qo_indptr.tolist() == qo + [qo[-1]] * (bs - raw_bs)
                assert lay.verify_lens.dtype == lay.qo_indptr.dtype == torch.int32
                assert lay.batch_size == bs and lay.num_tokens == qo[-1] + 2
            with pytest.raises(ValueError):
                dg.pad_ragged_layout(torch.tensor(qo), raw_bs - 1, 8)


def _keys_of(r2t, rp, prefix, kept_cols_per_req):
    """Key slots of each request, built by hand: its prefix, then its kept window columns."""
    ip, idx = [0], []
    for b, cols in enumerate(kept_cols_per_req):
        row = r2t[int(rp[b])]
        keys = [int(row[j]) for j in range(int(prefix[b]))] + [int(row[int(prefix[b]) + c]) for c in cols]
        idx += keys
        ip.append(len(idx))
    return ip, idx


@pytest.mark.parametrize("tree", [True, False])
def test_padded_plan_keeps_real_rows_and_drops_padding(tree):
    """A live compacted step (3 requests, W rows incl. one D-Cut pad row) planned into a (5, T) graph:
    the real rows' outputs equal the unpadded plan's, zero-row padding requests own no rows and no
    mask cells, and the rows past the last live request form the plan's padding request (sink keys
    only)."""
    from sglang_ext.dcut import build_full_mask, compact_tree, retrive_from_parents

    gen = torch.Generator().manual_seed(5)
    n, raw_bs, fill = 4, 3, 1
    parent = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 2]])
    keep = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    if not tree:  # chains: kept prefixes
        parent = torch.tensor([[-1, 0, 1, 2]] * 3)
        keep = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    nt, ns = retrive_from_parents(parent)
    prefix = torch.tensor([3, 5, 2])
    rp = torch.tensor([2, 0, 1])
    r2t = (torch.randperm(4 * 12, generator=gen) + 1).view(4, 12).to(torch.int32)  # slot 0 = sink
    kept_total = int(keep.sum())
    width = kept_total + 1  # one D-Cut pad row
    ct = compact_tree(keep, torch.arange(raw_bs * n), torch.arange(raw_bs * n), nt, ns, num_tokens=width)
    mask = build_full_mask(ct.tree_block, ct.counts, prefix)[0] if tree else None
    cols = fv.kept_cols_from_index(ct.kept_index, n)

    key = dg.TierGraphTable(dg.tier_graph_keys([5], n, masked=tree)).lookup(raw_bs, width, tree)
    assert key is not None and key.batch_size == 5 and key.num_tokens >= width
    bs, t = key.batch_size, key.num_tokens
    lay = dg.pad_ragged_layout(ct.qo_indptr, bs, t)
    # what SGLang's registry puts in the padded request slots: seq_len fill value, request row 0
    rp_pad = torch.cat([rp, torch.zeros(bs - raw_bs, dtype=rp.dtype)])
    p_pad = torch.cat([prefix, torch.full((bs - raw_bs,), fill, dtype=prefix.dtype)])
    wip, wkv = fv.window_kv(r2t, rp_pad, p_pad, n)
    padded = fv.plan_verify(wip, wkv, p_pad, lay.qo_indptr, cols, mask, num_tokens=t)
    wip0, wkv0 = fv.window_kv(r2t, rp, prefix, n)
    live = fv.plan_verify(wip0, wkv0, prefix, ct.qo_indptr.to(torch.int32), cols, mask, num_tokens=width)

    kept_cols = [[u for u in range(n) if keep[b, u]] for b in range(raw_bs)]
    ip, idx = _keys_of(r2t, rp_pad, p_pad, kept_cols + [[]] * (bs - raw_bs))
    pad_rows = t - kept_total  # the plan's padding request: these rows over pad_rows + 1 sink keys
    ip.append(ip[-1] + pad_rows + 1)
    idx += [fv.SINK_SLOT] * (pad_rows + 1)
    assert padded.kv_indptr.tolist() == ip and padded.kv_indices.tolist() == idx
    assert padded.qo_indptr.tolist()[raw_bs:] == [kept_total] * (bs - raw_bs + 1) + [t]
    assert padded.batch_size == bs and padded.num_requests == bs + fv.PAD_REQUESTS
    if tree:
        # zero-row requests add no cells; the padding request's cells follow the live ones
        assert int(padded.mask_indptr[bs]) == int(live.mask_indptr[raw_bs]) == mask.numel()
        assert int(padded.mask_indptr[-1]) - mask.numel() == pad_rows * (pad_rows + 1)
        live_cells = fv.unpack_mask_segments(live.packed_mask, live.mask_indptr)[: mask.numel()]
        assert torch.equal(fv.unpack_mask_segments(padded.packed_mask, padded.mask_indptr)[: mask.numel()], live_cells)
        assert torch.equal(live_cells, mask)

    slots = int(r2t.max()) + 1
    hq, hkv, d = 4, 2, 8
    k_cache = torch.randn(slots, hkv, d, generator=gen)
    v_cache = torch.randn(slots, hkv, d, generator=gen)
    q = torch.randn(t, hq, d, generator=gen)  # rows past W: garbage lanes of the graph
    out_pad = fv.paged_attention_reference(q, k_cache, v_cache, padded, d ** -0.5)
    out_live = fv.paged_attention_reference(q[:width], k_cache, v_cache, live, d ** -0.5)
    assert torch.allclose(out_pad[:kept_total], out_live[:kept_total], atol=1e-6)
    # padding rows attend only to sink copies: their output is the sink's value (dropped later)
    sink_v = v_cache[fv.SINK_SLOT].repeat_interleave(hq // hkv, dim=0)
    assert torch.allclose(out_pad[kept_total:], sink_v.expand(t - kept_total, hq, d), atol=1e-6)


def test_capture_layout_and_mask():
    for n in range(1, 6):
        for bs in range(1, 6):
            for t in range(bs, bs * n + 1):
                lay = dg.capture_layout(bs, n, t)
                c = lay.verify_lens.tolist()
                assert len(c) == bs and sum(c) == t and min(c) >= 1 and max(c) <= n and max(c) - min(c) <= 1
                assert lay.qo_indptr.tolist() == [sum(c[:i]) for i in range(bs + 1)]
                for fill in (1, 3):
                    m = dg.capture_mask(c, fill)
                    assert m.dtype == torch.bool and bool(m.all())
                    assert m.numel() == sum(q * (fill + q) for q in c)
                per_req = list(range(1, bs + 1))
                assert dg.capture_mask(c, per_req).numel() == sum(q * (p + q) for q, p in zip(c, per_req))
                with pytest.raises(ValueError):
                    dg.capture_mask(c, per_req + [1])
            with pytest.raises(ValueError):
                dg.capture_layout(bs, n, bs * n + 1)
            with pytest.raises(ValueError):
                dg.capture_layout(bs, n, bs - 1)


def test_capture_plan_is_valid_for_the_backend_planning():
    """The capture batch (prefix = fill value, chain columns) plans into exactly T rows with a mask
    whose length matches the plan's cells (what FlashInfer sizes the graph wrapper from)."""
    bs, n, fill = 3, 4, 1
    for key in dg.tier_graph_keys([bs], n):
        t = key.num_tokens
        lay = dg.capture_layout(bs, n, t)
        r2t = torch.arange(1, bs * 10 + 1, dtype=torch.int32).view(bs, 10)
        p = torch.full((bs,), fill)
        wip, wkv = fv.window_kv(r2t, torch.arange(bs), p, n)
        c = lay.verify_lens.tolist()
        vp = fv.plan_verify(wip, wkv, p, lay.qo_indptr, fv.chain_kept_cols(lay.qo_indptr, t),
                            dg.capture_mask(c, fill), num_tokens=t)
        assert int(vp.qo_indptr[-1]) == t == vp.num_tokens and int(vp.qo_indptr[-2]) == t  # no padding rows
        assert int(vp.mask_indptr[-1]) == dg.capture_mask(c, fill).numel()
        assert vp.kv_indptr.tolist() == [sum(fill + q for q in c[:i]) for i in range(bs + 1)] + [
            sum(fill + q for q in c) + 1]  # the padding request: one sink key


# ----------------------------------------------------------------------------- eligibility and switches
def test_unsupported_reasons():
    keys = ["not_target_verify", "draft_worker", "sglang_ragged_mode", "graph_backend_not_full",
            "attention_backend_not_dcut", "pdmux", "two_batch_overlap", "lora", "mlp_sync", "attention_variants",
            "pipeline", "encoder_decoder", "hisparse", "multiple_attention_wrappers", "no_prunable_width"]
    assert dg.tier_graph_unsupported_reason() is None
    assert dg.tier_graph_unsupported_reason(**{k: False for k in keys}) is None
    reasons = [dg.tier_graph_unsupported_reason(**{k: True}) for k in keys]
    assert all(isinstance(r, str) and r for r in reasons) and len(set(reasons)) == len(keys)
    assert dg.tier_graph_unsupported_reason(lora=True, draft_worker=True) == reasons[keys.index("draft_worker")]
    with pytest.raises(KeyError):
        dg.tier_graph_unsupported_reason(lora=False, typo=True)


def test_env_switch():
    assert dg.tier_graphs_enabled({}) and dg.tier_graphs_enabled({dg.TIER_GRAPHS_ENV: "1"})
    for off in ("0", "false", "OFF", " no "):
        assert not dg.tier_graphs_enabled({dg.TIER_GRAPHS_ENV: off})


# ----------------------------------------------------------------------------- GPU script part (a2), CPU dry run
from gpu_script import load as _gpu_script  # noqa: E402


def test_gpu_script_padded_replay_dry_run(monkeypatch):
    """Part (a2) of ``tests/gpu/run_gpu_checks.py`` on CPU (reference attention in place of FlashInfer):
    steps of fewer requests replayed from the bs-4 tier graphs match the torch backend; a padding that
    shifts the real requests (padding requests first) is caught."""
    rgc = _gpu_script()
    cfg = rgc.make_config(dry_run=True, quick=False)
    attn = rgc.VerifyAttention(cfg, "reference")
    res = rgc.check_padded_replay(cfg, attn, float("inf"), lambda msg: None)
    assert res["passed"] and res["cases"] == 24 and res["no_graph"] == 0 and not res["failures"]
    assert res["padded_requests"] > 0 and res["padded_rows"] > 0 and res["max_err"] < rgc.BF16_ATOL

    real = dg.pad_ragged_layout

    def padding_first(qo_indptr, batch_size, num_tokens):
        lay = real(qo_indptr, batch_size, num_tokens)
        pad = batch_size - (qo_indptr.shape[0] - 1)
        qo = torch.cat([torch.zeros(pad, dtype=torch.int32), lay.qo_indptr[: batch_size + 1 - pad]])
        return dg.PaddedLayout(verify_lens=qo[1:] - qo[:-1], qo_indptr=qo, num_tokens=num_tokens)

    monkeypatch.setattr(dg, "pad_ragged_layout", padding_first)
    try:  # wrong rows, or a plan that cannot be built (the script records either as a failed part)
        bad = rgc.check_padded_replay(cfg, attn, float("inf"), lambda msg: None)
        caught = not bad["passed"] and bool(bad["failures"])
    except RuntimeError:
        caught = True
    assert caught

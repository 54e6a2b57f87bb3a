"""No unused host syncs on D-Cut's compacted-step path (overlap scheduling keeps its overlap).

Each function runs under a patched ``torch.Tensor`` whose read-back methods (``item``, ``tolist``,
``__int__``, ``__float__``, ``__bool__``, ``__index__``) count their calls: on a GPU each one
blocks the host until the device catches up. Checked: the FlashInfer verify plan
(``flashinfer_dcut.plan_verify`` / ``select_kept_kv`` with the host-known prefix total; the mask
is no longer packed on the serving path: FlashInfer packs it), the planner's score image
(``dcut.budget._score_image``) and the FULL mask with a host-known length
(``dcut.compaction.build_full_mask(..., mask_len=...)``). Pure torch, no SGLang.

Budget: < 5 s.
"""

from __future__ import annotations

import contextlib

import torch

import sglang_ext.engine.attention.flashinfer_dcut as fv
from sglang_ext.dcut import build_full_mask, chain_keep_mask, chain_retrive, compact_tree
from sglang_ext.dcut.budget import _score_image

_READBACKS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def count_readbacks():
    """Counts calls of ``torch.Tensor``'s read-back methods inside the block (``calls[name]``)."""
    calls = {name: 0 for name in _READBACKS}
    saved = {name: getattr(torch.Tensor, name) for name in _READBACKS}

    def wrap(name):
        orig = saved[name]

        def counted(self, *a, **kw):
            calls[name] += 1
            return orig(self, *a, **kw)

        return counted

    try:
        for name in _READBACKS:
            setattr(torch.Tensor, name, wrap(name))
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def test_counter_sees_readbacks():  # the instrument itself can fail
    with count_readbacks() as calls:
        x = torch.tensor([3, 4])
        int(x[0]), x.sum().item(), x.tolist()
    assert calls["__int__"] == 1 and calls["item"] == 1 and calls["tolist"] == 1


def _batch(tree: bool):
    bs, n = 4, 8
    gen = torch.Generator().manual_seed(7)
    keep_lens = torch.randint(0, n, (bs,), generator=gen)
    keep = chain_keep_mask(keep_lens, n)
    nt, ns = chain_retrive(bs, n)
    width = int(keep.sum()) + 3  # tier rounding: 3 rows past the kept ones
    ct = compact_tree(keep, torch.arange(bs * n), torch.arange(bs * n), nt, ns, num_tokens=width)
    prefix = torch.randint(1, 20, (bs,), generator=gen)
    r2t = torch.arange(1, bs * 40 + 1, dtype=torch.int32).view(bs, 40)
    wip, wkv = fv.window_kv(r2t, torch.arange(bs), prefix, n, prefix_total=int(prefix.sum()))
    cols = fv.kept_cols_from_index(ct.kept_index, n)
    mask = build_full_mask(ct.tree_block, ct.counts, prefix)[0] if tree else None
    return wip, wkv, prefix, ct, cols, mask, width


def test_verify_plan_reads_nothing_back_with_a_host_prefix_total():
    for tree in (True, False):
        wip, wkv, prefix, ct, cols, mask, width = _batch(tree)
        total = int(prefix.sum())
        with count_readbacks() as calls:
            vp = fv.plan_verify(wip, wkv, prefix, ct.qo_indptr, cols, mask, num_tokens=width, prefix_total=total)
        assert sum(calls.values()) == 0, calls
        # the same plan as with the total read back from the device
        ref = fv.plan_verify(wip, wkv, prefix, ct.qo_indptr, cols, mask, num_tokens=width)
        assert torch.equal(vp.kv_indices, ref.kv_indices) and torch.equal(vp.kv_indptr, ref.kv_indptr)
        assert int(vp.kv_indptr[-1]) == total + width + 1 == vp.kv_indices.numel()
    with count_readbacks() as calls:
        fv.plan_verify(wip, wkv, prefix, ct.qo_indptr, cols, mask, num_tokens=width)
    assert sum(calls.values()) == 1, calls  # without the host total: exactly one read-back


def test_window_kv_with_a_host_prefix_total_reads_nothing_back():
    r2t = torch.arange(1, 41, dtype=torch.int32).view(2, 20)
    p = torch.tensor([3, 5])
    with count_readbacks() as calls:
        ip, kv = fv.window_kv(r2t, torch.tensor([1, 0]), p, 4, prefix_total=8)
    assert sum(calls.values()) == 0, calls
    ip0, kv0 = fv.window_kv(r2t, torch.tensor([1, 0]), p, 4)
    assert torch.equal(ip, ip0) and torch.equal(kv, kv0)


def test_score_image_reads_nothing_back():
    s = torch.tensor([0.5, 0.25, float("-inf"), 0.0, -0.0, 0.75])
    with count_readbacks() as calls:
        mono, bound = _score_image(s)
    assert sum(calls.values()) == 0, calls
    key_order = torch.argsort(-mono.to(torch.int64), stable=True).tolist()
    assert key_order[:2] == [5, 0] and key_order[-1] == 2  # descending scores, -inf last
    assert isinstance(bound, int)


def test_full_mask_with_a_host_length_reads_nothing_back():
    gen = torch.Generator().manual_seed(1)
    bs, w = 3, 5
    blk = torch.rand(bs, w, w, generator=gen) > 0.4
    q, p = torch.tensor([2, 0, 5]), torch.tensor([3, 1, 2])
    ref, ref_ip = build_full_mask(blk, q, p)
    with count_readbacks() as calls:
        m, ip = build_full_mask(blk, q, p, mask_len=ref.numel() + 4)
    assert sum(calls.values()) == 0, calls
    assert torch.equal(m[: ref.numel()], ref) and torch.equal(ip, ref_ip) and bool(m[ref.numel():].all())

"""Planning math of the FlashInfer verify path of D-Cut (pure torch: no SGLang, no FlashInfer import).

What ``flashinfer_dcut`` hands to ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` for a ragged
(pruned) TARGET_VERIFY, and the shapes of its per-tier CUDA graphs; the layout, the mask and a
worked example are in :mod:`sglang_ext.engine.attention.flashinfer_dcut`'s docstring.

* layout: :func:`ragged_qo_indptr`, :func:`window_kv`, :func:`verify_kept_cols`,
  :func:`chain_kept_cols`, :func:`select_kept_kv`;
* mask: :func:`mask_indptr_from`, :func:`pack_mask_segments`, :func:`unpack_mask_segments`;
* the plan of one step: :class:`VerifyPlan`, :func:`plan_verify`;
* graphs per tier: :func:`verify_graph_shapes`, :func:`padded_num_tokens`, :func:`capture_counts`,
  :func:`graph_buffer_sizes`;
* :func:`paged_attention_reference`: what FlashInfer computes from a plan, on CPU (the reference of
  ``tests/unit/test_flashinfer_plan.py`` and of the GPU script).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from sglang_ext.dcut.tiers import DEFAULT_TIERS, tier_keep_counts

__all__ = ["PAGE_SIZE", "SINK_SLOT", "NO_COL", "PAD_REQUESTS", "VerifyGraphShape", "VerifyPlan", "GraphBufferSizes", "ragged_qo_indptr", "window_kv", "kept_cols_from_index", "chain_kept_cols", "select_kept_kv", "mask_indptr_from", "pack_mask_segments", "unpack_mask_segments", "plan_verify", "tier_token_counts", "verify_graph_shapes", "verify_kept_cols", "padded_num_tokens", "capture_counts", "graph_buffer_sizes", "shared_graph_buffer_sizes", "paged_attention_reference"]

PAGE_SIZE = 1
"""KV page size the plans assume (SGLang's FlashInfer backend plans with page size 1)."""
SINK_SLOT = 0
"""KV slot that padding rows write to (SGLang's sink; never part of a request's keys)."""
NO_COL = -1
"""Local window column of a padding row in ``kept_cols`` (same value as ``PAD_INDEX``)."""


# ----------------------------------------------------------------------------- helpers
def _exclusive(lens: torch.Tensor) -> torch.Tensor:  # [n] -> [n + 1] int64
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int64, device=lens.device)
    out[1:] = torch.cumsum(lens.to(torch.int64), dim=0)
    return out


def _segments(lens: torch.Tensor, total: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(segment id, offset within segment) of every element of ``total = sum(lens)``."""
    lens = lens.to(torch.int64)
    seg = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens, output_size=total)
    start = _exclusive(lens)[:-1]
    within = torch.arange(total, device=lens.device, dtype=torch.int64) - start.index_select(0, seg)
    return seg, within


# ----------------------------------------------------------------------------- query/key layout
def ragged_qo_indptr(
    counts: torch.Tensor,  # [batch_size] kept rows per request (root included)
) -> torch.Tensor:  # [batch_size + 1] int32
    """Exclusive offsets of each request's query rows (leading 0), as FlashInfer takes them.

    Examples
    --------
    >>> ragged_qo_indptr(torch.tensor([2, 3, 1])).tolist()
    [0, 2, 5, 6]
    """
    return _exclusive(counts).to(torch.int32)


def window_kv(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    prefix_lens: torch.Tensor,  # [batch_size] committed lengths (drafts excluded)
    window: int,
    prefix_total: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:  # [batch_size + 1] int32, [sum(prefix_lens + window)] int32
    """KV slots of every request's prefix and full verify window (the uniform SGLang layout).

    Request ``b`` gets ``req_to_token[req_pool_indices[b], 0 : prefix_lens[b] + window]``; this is
    what SGLang's ``generate_attn_arg_prefill`` packs for a uniform verify of ``window`` rows.
    One host sync (the total length) unless ``prefix_total`` (host-known ``sum(prefix_lens)``)
    is given.

    Returns
    -------
    (kv_indptr, kv_indices)

    Examples
    --------
    >>> r2t = torch.arange(20).view(2, 10)
    >>> ip, idx = window_kv(r2t, torch.tensor([1, 0]), torch.tensor([1, 2]), 2)
    >>> ip.tolist(), idx.tolist()
    ([0, 3, 7], [10, 11, 12, 0, 1, 2, 3])
    """
    lens = prefix_lens.to(torch.int64) + int(window)
    indptr = _exclusive(lens)
    if prefix_total is not None:
        total = int(prefix_total) + int(window) * int(lens.shape[0])
    else:
        total = int(indptr[-1].item())
    seg, within = _segments(lens, total)
    rows = req_pool_indices.to(device=req_to_token.device, dtype=torch.int64).index_select(0, seg)
    kv = req_to_token[rows, within]
    return indptr.to(torch.int32), kv.to(torch.int32)


def kept_cols_from_index(
    kept_index: torch.Tensor,  # [num_tokens] strided global id b * N + u, PAD_INDEX on padding
    num_draft_tokens: int,
) -> torch.Tensor:  # [num_tokens] int64 local node id u, NO_COL on padding
    """Local window column of each ragged row from :attr:`CompactTree.kept_index`.

    Examples
    --------
    >>> kept_cols_from_index(torch.tensor([0, 2, 4, 5, 6, -1]), 4).tolist()
    [0, 2, 0, 1, 2, -1]
    """
    ki = kept_index.to(torch.int64)
    return torch.where(ki >= 0, torch.remainder(ki, int(num_draft_tokens)), torch.full_like(ki, NO_COL))


def verify_kept_cols(
    kv_loc_cols: Optional[torch.Tensor],  # [num_tokens] strided ids bound on the batch's kv_loc_plan, or None
    kept_index: Optional[torch.Tensor],  # [num_tokens] strided ids D-Cut put on the spec info, or None
    qo_indptr: torch.Tensor,  # [batch_size + 1] exclusive offsets of the ragged rows
    num_tokens: int,
    num_draft_tokens: int,
) -> torch.Tensor:  # [num_tokens] int64 local window column, NO_COL on padding
    """Window column of every ragged verify row.

    The kept node ids come from the batch's ``kv_loc_cols`` (bound with SGLang's
    ``kv_loc_plan``), else from the ``dcut_kept_index`` D-Cut sets on the spec info (SGLang
    builds no ``kv_loc_plan`` for trees, topk > 1); only without either are the rows taken as
    prefix-truncated chains. Taking chain columns for a pruned tree would make a node kept after
    a pruned sibling read the sibling's KV slot.

    Examples
    --------
    Tree rows of two requests (N = 4): request 0 keeps nodes 0, 2; request 1 keeps 0, 1, 3::

        >>> ip = torch.tensor([0, 2, 5])
        >>> verify_kept_cols(None, torch.tensor([0, 2, 4, 5, 7, -1]), ip, 6, 4).tolist()
        [0, 2, 0, 1, 3, -1]
        >>> verify_kept_cols(None, None, ip, 6, 4).tolist()  # chains
        [0, 1, 0, 1, 2, -1]
    """
    for ids in (kv_loc_cols, kept_index):
        if isinstance(ids, torch.Tensor):
            return kept_cols_from_index(ids, num_draft_tokens)
    return chain_kept_cols(qo_indptr, num_tokens)


def chain_kept_cols(
    qo_indptr: torch.Tensor,  # [batch_size + 1] exclusive offsets of the ragged rows
    num_tokens: int,
) -> torch.Tensor:  # [num_tokens] int64
    """Kept columns of prefix-truncated chains: row ``j`` of a request is node ``j``.

    Rows past ``qo_indptr[-1]`` (padding) get ``NO_COL``.

    Examples
    --------
    >>> chain_kept_cols(torch.tensor([0, 2, 5]), 6).tolist()
    [0, 1, 0, 1, 2, -1]
    """
    ip = qo_indptr.to(torch.int64)
    row = torch.arange(int(num_tokens), device=ip.device, dtype=torch.int64)
    req = torch.searchsorted(ip[1:], row, right=True).clamp(max=ip.shape[0] - 2)
    cols = row - ip.index_select(0, req)
    return torch.where(row < ip[-1], cols, torch.full_like(cols, NO_COL))


def select_kept_kv(
    window_kv_indptr: torch.Tensor,  # [batch_size + 1] from window_kv
    window_kv_indices: torch.Tensor,  # [sum(prefix_lens + N)]
    prefix_lens: torch.Tensor,  # [batch_size]
    qo_indptr: torch.Tensor,  # [batch_size + 1] ragged query offsets
    kept_cols: torch.Tensor,  # [num_tokens] local window column per ragged row (NO_COL on padding)
    num_tokens: Optional[int] = None,
    prefix_total: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:  # [num_requests + 1] int32, [kv_total] int32
    """Keys of a pruned verify: each request's prefix, then its kept window slots in row order.

    Kept nodes write their KV into their own window slots (D-Cut never moves them), so request
    ``b``'s key list is ``prefix`` followed by ``window[p_b + kept_cols[r]]`` for its rows ``r``.

    With ``num_tokens`` (the forward's row count) a **padding request** is appended
    (``num_requests = batch_size + 1``): it owns the rows ``qo_indptr[-1] .. num_tokens`` and
    ``num_tokens - qo_indptr[-1] + 1`` keys, all :data:`SINK_SLOT` (at least one key, so a
    causal or masked row always sees one), and the key total is ``sum(prefix_lens) +
    num_tokens + 1`` whatever was kept. Host syncs: none when ``num_tokens`` and
    ``prefix_total`` (the host-known ``sum(prefix_lens)``, SGLang's ``seq_lens_sum``) are given,
    else one (the total length).

    Examples
    --------
    Request 0 keeps nodes {0, 2} of a 4-node window after 2 prefix tokens:

    >>> ip, idx = select_kept_kv(torch.tensor([0, 6]), torch.tensor([10, 11, 12, 13, 14, 15]),
    ...                          torch.tensor([2]), torch.tensor([0, 2]), torch.tensor([0, 2]))
    >>> ip.tolist(), idx.tolist()
    ([0, 4], [10, 11, 12, 14])

    The same in a forward of 3 rows: the padding request has 1 row and 2 sink keys.

    >>> ip, idx = select_kept_kv(torch.tensor([0, 6]), torch.tensor([10, 11, 12, 13, 14, 15]),
    ...                          torch.tensor([2]), torch.tensor([0, 2]), torch.tensor([0, 2, -1]), 3, 2)
    >>> ip.tolist(), idx.tolist()
    ([0, 4, 6], [10, 11, 12, 14, 0, 0])
    """
    p = prefix_lens.to(torch.int64)
    bs = p.shape[0]
    qo = qo_indptr.to(device=p.device, dtype=torch.int64)
    counts = qo[1:] - qo[:-1]
    lens = p + counts  # [batch_size]
    total: Optional[int] = None
    if num_tokens is not None:
        pad_keys = (int(num_tokens) + 1) - qo[-1:]  # [1] padding rows + 1
        lens = torch.cat([lens, pad_keys])  # [batch_size + 1]
        if prefix_total is not None:
            total = int(prefix_total) + int(num_tokens) + 1
    indptr = _exclusive(lens)
    if total is None:
        total = int(indptr[-1].item())
    seg, within = _segments(lens, total)
    is_pad = seg >= bs  # the padding request's keys
    seg_c = seg.clamp(max=bs - 1)
    p_e = p.index_select(0, seg_c)
    is_prefix = within < p_e
    row = qo.index_select(0, seg_c) + (within - p_e).clamp(min=0)
    row = torch.where(is_prefix | is_pad, torch.zeros_like(row), row)
    col = kept_cols.to(device=p.device, dtype=torch.int64)
    col = col.index_select(0, row.clamp(max=max(col.shape[0] - 1, 0))) if col.numel() else row
    offset = torch.where(is_prefix, within, p_e + col)
    src = window_kv_indptr.to(device=p.device, dtype=torch.int64).index_select(0, seg_c) + offset
    src = torch.where(is_pad, torch.zeros_like(src), src)
    kv = window_kv_indices.index_select(0, src)
    kv = torch.where(is_pad, torch.full_like(kv, SINK_SLOT), kv)
    return indptr.to(torch.int32), kv.to(torch.int32)


# ----------------------------------------------------------------------------- mask
def mask_indptr_from(
    qo_indptr: torch.Tensor,  # [batch_size + 1]
    kv_indptr: torch.Tensor,  # [batch_size + 1]
) -> torch.Tensor:  # [batch_size + 1] int64
    """Exclusive offsets of each request's ``q_b * kv_b`` mask cells (page size 1).

    Equals FlashInfer's own mask offsets for ``kv_last_page_len = 1``.

    Examples
    --------
    >>> mask_indptr_from(torch.tensor([0, 2, 5]), torch.tensor([0, 4, 8])).tolist()
    [0, 8, 20]
    """
    q = qo_indptr[1:].to(torch.int64) - qo_indptr[:-1].to(torch.int64)
    kv = kv_indptr[1:].to(torch.int64) - kv_indptr[:-1].to(torch.int64)
    return _exclusive(q * kv.to(q.device))


def pack_mask_segments(
    mask: torch.Tensor,  # [mask_len] bool, FULL layout
    mask_indptr: torch.Tensor,  # [batch_size + 1] exclusive offsets of each request's cells
) -> Tuple[torch.Tensor, torch.Tensor]:  # [packed_len] uint8, [batch_size + 1] int32
    """Pack each request's mask cells into bytes, little bit order (FlashInfer's layout).

    Same result as ``flashinfer.segment_packbits(mask, mask_indptr, bitorder="little")``: byte
    ``k`` of segment ``b`` holds cells ``8k .. 8k + 7`` of that segment, cell ``8k + i`` in bit
    ``i``; each segment is padded to whole bytes. One host sync (the packed length).

    Examples
    --------
    >>> m = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    >>> packed, ip = pack_mask_segments(m, torch.tensor([0, 4, 7, 11]))
    >>> packed.tolist(), ip.tolist()
    ([13, 4, 11], [0, 1, 2, 3])
    """
    ip = mask_indptr.to(device=mask.device, dtype=torch.int64)
    seglen = ip[1:] - ip[:-1]
    packed_ip = _exclusive((seglen + 7) // 8)
    nbytes = int(packed_ip[-1].item())
    total = int(ip[-1].item())
    seg, within = _segments(seglen, total)
    byte = packed_ip.index_select(0, seg) + torch.div(within, 8, rounding_mode="floor")
    bit = torch.remainder(within, 8)
    vals = mask.reshape(-1)[:total].to(torch.int64) << bit
    out = torch.zeros(nbytes, dtype=torch.int64, device=mask.device).index_add_(0, byte, vals)
    return out.to(torch.uint8), packed_ip.to(torch.int32)


def unpack_mask_segments(
    packed: torch.Tensor,  # [packed_len] uint8
    mask_indptr: torch.Tensor,  # [batch_size + 1] offsets of the unpacked cells
) -> torch.Tensor:  # [mask_len] bool
    """Inverse of :func:`pack_mask_segments` (what FlashInfer reads back from the packed mask).

    Examples
    --------
    >>> unpack_mask_segments(torch.tensor([13, 4, 11], dtype=torch.uint8),
    ...                      torch.tensor([0, 4, 7, 11])).int().tolist()
    [1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1]
    """
    ip = mask_indptr.to(device=packed.device, dtype=torch.int64)
    seglen = ip[1:] - ip[:-1]
    packed_ip = _exclusive((seglen + 7) // 8)
    total = int(ip[-1].item())
    seg, within = _segments(seglen, total)
    byte = packed_ip.index_select(0, seg) + torch.div(within, 8, rounding_mode="floor")
    bit = torch.remainder(within, 8)
    return ((packed.to(torch.int64).index_select(0, byte) >> bit) & 1).to(torch.bool)


# ----------------------------------------------------------------------------- the plan
PAD_REQUESTS = 1
"""Requests a :class:`VerifyPlan` has beyond the batch: the padding request that owns the rows
between the kept total ``qo_indptr[-1]`` of the live requests and the forward's ``num_tokens``."""


@dataclass(frozen=True)
class VerifyPlan:
    """Everything ``BatchPrefillWithPagedKVCacheWrapper.plan`` needs for one pruned verify.

    The plan has ``num_requests = batch_size + PAD_REQUESTS`` requests: the live ones, then the
    padding request, whose rows (the forward's rows past the kept ones: the tier rounding, the
    rows of ineligible candidates, a graph's spare rows) attend only to copies of
    :data:`SINK_SLOT`. So ``qo_indptr[-1] == num_tokens`` always, which FlashInfer's ``run()``
    checks (``q.shape[0] == qo_indptr[-1]``), and a CUDA-graph wrapper always sees the same
    request count. The padding rows' outputs are dropped by D-Cut's scatter-back.

    Attributes
    ----------
    qo_indptr : torch.Tensor
        ``[num_requests + 1]`` int32 ragged query offsets (leading 0, last ``num_tokens``).
    kv_indptr : torch.Tensor
        ``[num_requests + 1]`` int32 key offsets (page size 1: one page per token).
    kv_indices : torch.Tensor
        ``[kv_indptr[-1]]`` int32 KV slots (prefix, then kept window slots; the padding
        request's sink copies last).
    kv_last_page_len : torch.Tensor
        ``[num_requests]`` int32, all 1 (page size 1).
    custom_mask : torch.Tensor or None
        ``[>= mask_indptr[-1]]`` bool FULL-layout mask (the padding request's cells all True;
        cells past ``mask_indptr[-1]`` are never read); ``None``: causal (chains).
    mask_indptr : torch.Tensor or None
        ``[num_requests + 1]`` int64 offsets of ``custom_mask``.
    num_tokens : int
        Query rows of the forward (``== qo_indptr[-1]``).
    """

    qo_indptr: torch.Tensor  # [num_requests + 1]
    kv_indptr: torch.Tensor  # [num_requests + 1]
    kv_indices: torch.Tensor  # [nnz]
    kv_last_page_len: torch.Tensor  # [num_requests]
    custom_mask: Optional[torch.Tensor]  # [>= mask_indptr[-1]]
    mask_indptr: Optional[torch.Tensor]  # [num_requests + 1]
    num_tokens: int

    @property
    def num_requests(self) -> int:
        """Requests of the plan, the padding request included."""
        return self.qo_indptr.shape[0] - 1

    @property
    def batch_size(self) -> int:
        """Live requests (the padding request excluded)."""
        return self.num_requests - PAD_REQUESTS

    @property
    def causal(self) -> bool:
        """True when the plan has no custom mask (chains: bottom-right causal)."""
        return self.custom_mask is None

    def packed(self) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(packed mask [packed_len] uint8, packed offsets [num_requests + 1] int32)`` or ``(None, None)``.

        What FlashInfer's ``plan`` packs from :attr:`custom_mask` (:func:`pack_mask_segments`);
        computed on demand for the reference and tests (two host syncs), never on the serving path.
        """
        if self.custom_mask is None:
            return None, None
        return pack_mask_segments(self.custom_mask, self.mask_indptr)

    @property
    def packed_mask(self) -> Optional[torch.Tensor]:  # [packed_len] uint8
        return self.packed()[0]

    @property
    def packed_mask_indptr(self) -> Optional[torch.Tensor]:  # [num_requests + 1] int32
        return self.packed()[1]


_TRUE = torch.ones(1, dtype=torch.bool)
"""One True cell; expanded (no allocation) into the padding request's mask cells."""


def plan_verify(
    window_kv_indptr: torch.Tensor,  # [batch_size + 1]
    window_kv_indices: torch.Tensor,  # [sum(prefix_lens + N)]
    prefix_lens: torch.Tensor,  # [batch_size]
    qo_indptr: torch.Tensor,  # [batch_size + 1] ragged query offsets
    kept_cols: torch.Tensor,  # [num_tokens] local window column per row, NO_COL on padding
    custom_mask: Optional[torch.Tensor] = None,  # [mask_len] bool compact FULL layout, None = causal
    num_tokens: Optional[int] = None,
    prefix_total: Optional[int] = None,
) -> VerifyPlan:
    """Plan one pruned verify for FlashInfer (ragged queries, kept keys, mask, padding request).

    Parameters
    ----------
    window_kv_indptr, window_kv_indices : torch.Tensor
        Keys of the full windows (:func:`window_kv`, or SGLang's uniform
        ``generate_attn_arg_prefill`` output).
    prefix_lens : torch.Tensor
        ``[batch_size]`` committed lengths.
    qo_indptr : torch.Tensor
        ``[batch_size + 1]`` ragged query offsets of the kept rows (:func:`ragged_qo_indptr`).
    kept_cols : torch.Tensor
        ``[num_tokens]`` local window column of each ragged row (:func:`kept_cols_from_index` or
        :func:`chain_kept_cols`).
    custom_mask : torch.Tensor, optional
        Compact FULL-layout tree mask (:func:`sglang_ext.dcut.build_full_mask` over the
        compacted tree block); ``None`` plans a causal verify (chains only).
    num_tokens : int, optional
        Query rows of the forward (a tier's width, or a graph's padded size); defaults to
        ``len(kept_cols)``. The rows past ``qo_indptr[-1]`` form the padding request.
    prefix_total : int, optional
        Host-known ``sum(prefix_lens)`` (SGLang's ``seq_lens_sum``): planning then reads nothing
        back from the device; without it, one host sync.

    Returns
    -------
    VerifyPlan

    Examples
    --------
    One request, prefix 2, window of 4, nodes {0, 2} kept (causal would be wrong here, so a
    mask is given: node 2 sees the root and itself), in a forward of 3 rows::

    >>> wip, wkv = torch.tensor([0, 6]), torch.arange(10, 16)
    >>> m = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    >>> vp = plan_verify(wip, wkv, torch.tensor([2]), torch.tensor([0, 2]), torch.tensor([0, 2, -1]), m)
    >>> vp.qo_indptr.tolist(), vp.kv_indices.tolist(), vp.mask_indptr.tolist(), vp.packed_mask.tolist()
    ([0, 2, 3], [10, 11, 12, 14, 0, 0], [0, 8, 10], [247, 3])
    """
    bs = qo_indptr.shape[0] - 1
    rows = int(kept_cols.shape[0] if num_tokens is None else num_tokens)
    qo = qo_indptr.to(torch.int32)
    qo = torch.cat([qo, torch.full((PAD_REQUESTS,), rows, dtype=torch.int32, device=qo.device)])
    kv_indptr, kv_indices = select_kept_kv(window_kv_indptr, window_kv_indices, prefix_lens, qo_indptr, kept_cols,
                                           num_tokens=rows, prefix_total=prefix_total)
    last = torch.ones(bs + PAD_REQUESTS, dtype=torch.int32, device=kv_indices.device)
    mask = mask_ip = None
    if custom_mask is not None:
        mask_ip = mask_indptr_from(qo, kv_indptr)
        # the padding request has at most `rows` rows over `rows + 1` keys: append that many True cells
        tail = _TRUE.to(custom_mask.device).expand(rows * (rows + 1))
        mask = torch.cat([custom_mask.to(torch.bool).reshape(-1), tail])
    return VerifyPlan(
        qo_indptr=qo,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_last_page_len=last,
        custom_mask=mask,
        mask_indptr=mask_ip,
        num_tokens=rows,
    )


# ----------------------------------------------------------------------------- graphs per tier
@dataclass(frozen=True)
class VerifyGraphShape:
    """One captured verify graph: ``batch_size`` requests, ``num_tokens`` query rows.

    ``tier_index`` is the first tier with this width (small batches can map two tiers to one
    width); ``ratio`` is its tier ratio.
    """

    batch_size: int
    num_tokens: int
    tier_index: int
    ratio: float


def tier_token_counts(
    batch_size: int, num_draft_tokens: int, tiers: Sequence[float] = DEFAULT_TIERS
) -> List[int]:
    """Verify rows of each tier: ``bs + keep_count(bs, N, rho) = ceil(bs * N * rho)``.

    Examples
    --------
    >>> tier_token_counts(64, 16)
    [256, 512, 768, 1024]
    >>> tier_token_counts(1, 4)
    [1, 2, 3, 4]
    """
    return [batch_size + k for k in tier_keep_counts(batch_size, num_draft_tokens, tiers)]


def verify_graph_shapes(
    batch_sizes: Sequence[int], num_draft_tokens: int, tiers: Sequence[float] = DEFAULT_TIERS
) -> List[VerifyGraphShape]:
    """Distinct ``(bs, T)`` graphs to capture, batch-size major, tiers ascending.

    Examples
    --------
    >>> [(s.batch_size, s.num_tokens, s.tier_index) for s in verify_graph_shapes([1, 2], 2)]
    [(1, 1, 0), (1, 2, 2), (2, 2, 0), (2, 3, 2), (2, 4, 3)]
    """
    shapes: List[VerifyGraphShape] = []
    for bs in batch_sizes:
        seen = set()
        for q, (t, r) in enumerate(zip(tier_token_counts(int(bs), num_draft_tokens, tiers), tiers)):
            if t in seen:
                continue
            seen.add(t)
            shapes.append(VerifyGraphShape(int(bs), int(t), q, float(r)))
    return shapes


def padded_num_tokens(width: int, captured: Sequence[int]) -> Optional[int]:
    """Smallest captured row count ``>= width`` (``None`` when none fits: run eager).

    Examples
    --------
    >>> padded_num_tokens(300, [256, 512, 768, 1024]), padded_num_tokens(2000, [256, 1024])
    (512, None)
    """
    fit = [t for t in captured if t >= width]
    return min(fit) if fit else None


def capture_counts(batch_size: int, num_draft_tokens: int, num_tokens: int) -> List[int]:
    """Per-request rows of a capture batch with exactly ``num_tokens`` rows (each in ``[1, N]``).

    The wrapper of a ``(bs, T)`` graph must first be planned with ``T`` rows: FlashInfer sizes
    its CUDA-graph schedule from that first plan and rejects larger totals later.

    Examples
    --------
    >>> capture_counts(4, 16, 10)
    [3, 3, 2, 2]
    """
    if not (batch_size <= num_tokens <= batch_size * num_draft_tokens):
        raise ValueError(f"{num_tokens} rows cannot be split over {batch_size} requests of 1..{num_draft_tokens}")
    base, rem = divmod(num_tokens, batch_size)
    return [base + (1 if i < rem else 0) for i in range(batch_size)]


@dataclass(frozen=True)
class GraphBufferSizes:
    """Capacities of the fixed buffers a ``(bs, T)`` graph wrapper plans into.

    ``kv_indices`` (int32 entries) and ``packed_mask`` (bytes) are upper bounds for any plan with
    at most ``T`` rows whose requests have at most ``max_context_len`` keys each, the padding
    request included; ``max_batch_size`` is the largest live batch of the graphs sharing them.
    """

    kv_indices: int
    packed_mask: int
    max_batch_size: int = 0


def graph_buffer_sizes(batch_size: int, num_tokens: int, max_context_len: int) -> GraphBufferSizes:
    """Buffer capacities for a ``(bs, T)`` verify graph (see :class:`GraphBufferSizes`).

    Every live request reads at most ``max_context_len`` keys, the padding request at most
    ``T + 1``; the mask has ``sum_b q_b * kv_b <= T * max(max_context_len, T + 1)`` cells, packed
    per request (one partial byte each, ``bs + 1`` requests).

    Examples
    --------
    >>> graph_buffer_sizes(4, 16, 100)
    GraphBufferSizes(kv_indices=417, packed_mask=205, max_batch_size=4)
    """
    cells = int(num_tokens) * max(int(max_context_len), int(num_tokens) + 1)
    return GraphBufferSizes(
        kv_indices=int(batch_size * max_context_len + num_tokens + 1),
        packed_mask=int(math.ceil(cells / 8) + batch_size + PAD_REQUESTS),
        max_batch_size=int(batch_size),
    )


def shared_graph_buffer_sizes(shapes: Sequence[Tuple[int, int]], max_context_len: int) -> GraphBufferSizes:
    """One set of capacities that fits every ``(bs, T)`` graph of ``shapes`` (the elementwise max).

    Graphs replay one at a time and each replay is planned right before it, so all tier graphs of
    a backend can plan into the same fixed buffers (as SGLang's per-batch-size wrappers share
    ``cuda_graph_kv_indices`` / ``cuda_graph_custom_mask``); only the buffers' sizes must fit the
    largest graph.

    Examples
    --------
    >>> shared_graph_buffer_sizes([(4, 16), (8, 8), (2, 32)], 100)
    GraphBufferSizes(kv_indices=809, packed_mask=403, max_batch_size=8)
    """
    if not shapes:
        raise ValueError("shared_graph_buffer_sizes: no graph shapes")
    each = [graph_buffer_sizes(bs, t, max_context_len) for bs, t in shapes]
    return GraphBufferSizes(
        kv_indices=max(s.kv_indices for s in each),
        packed_mask=max(s.packed_mask for s in each),
        max_batch_size=max(s.max_batch_size for s in each),
    )


# ----------------------------------------------------------------------------- reference math
def paged_attention_reference(
    q: torch.Tensor,  # [num_tokens, num_qo_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim_vo]
    plan: VerifyPlan,
    sm_scale: float,
) -> torch.Tensor:  # [num_tokens, num_qo_heads, head_dim_vo]
    """What FlashInfer's paged prefill computes from ``plan``, in plain torch (float32 or wider math).

    Reads keys through ``kv_indices``, the mask through the *packed* mask (so a packing error
    shows), causal bottom-right when there is no mask. The padding request's rows attend to its
    sink keys like every other request's rows (rows past ``qo_indptr[-1]``, if any, stay zero).
    Used on CPU in place of FlashInfer (tests, the GPU script's dry run).

    Examples
    --------
    One request, one query row over two equal keys: the mean of the values.

    >>> vp = plan_verify(torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([1]),
    ...                  torch.tensor([0, 1]), torch.tensor([0]))
    >>> out = paged_attention_reference(torch.ones(1, 1, 2), torch.ones(2, 1, 2),
    ...                                 torch.tensor([[[0.0, 0.0]], [[2.0, 2.0]]]), vp, 1.0)
    >>> out[0, 0].tolist()
    [1.0, 1.0]
    """
    t, hq, _ = q.shape
    hkv = k_cache.shape[1]
    out = torch.zeros(t, hq, v_cache.shape[2], dtype=q.dtype, device=q.device)
    qo = plan.qo_indptr.tolist()
    kv = plan.kv_indptr.tolist()
    mask = None
    packed, _ = plan.packed()
    if packed is not None:
        mask = unpack_mask_segments(packed, plan.mask_indptr)
        mask_ip = plan.mask_indptr.tolist()
    group = hq // hkv
    acc = torch.promote_types(q.dtype, torch.float32)
    for b in range(plan.num_requests):
        q0, q1, k0, k1 = qo[b], qo[b + 1], kv[b], kv[b + 1]
        nq, nk = q1 - q0, k1 - k0
        if nq == 0:
            continue
        slots = plan.kv_indices[k0:k1].to(torch.int64)
        kb = k_cache.index_select(0, slots).to(acc).repeat_interleave(group, dim=1)  # [nk, hq, d]
        vb = v_cache.index_select(0, slots).to(acc).repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].to(acc), kb) * sm_scale
        if mask is not None:
            allow = mask[mask_ip[b]: mask_ip[b] + nq * nk].view(nq, nk)
        else:
            r = torch.arange(nq, device=q.device).view(-1, 1)
            c = torch.arange(nk, device=q.device).view(1, -1)
            allow = c <= (nk - nq) + r
        s = s.masked_fill(~allow.unsqueeze(0), float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vb).to(out.dtype)
    return out

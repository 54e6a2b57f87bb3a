"""FlashInfer verify path for D-Cut: ragged (pruned) target verification, one CUDA graph per tier.

SGLang's FlashInfer backend plans TARGET_VERIFY with a uniform ``qo_indptr`` (every request
verifies ``N`` rows), keys its graph wrappers by batch size only and refuses a ragged layout
inside a CUDA graph (``docs/sglang_internals.md#verify-graphs-and-attention-backends``). D-Cut verifies a different number of rows per
request, so this module plans ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` itself:

* **ragged queries**: ``qo_indptr`` from the kept-row counts (exclusive, leading 0);
* **paged keys**: request ``b`` reads its committed prefix, then the window slots of its *kept*
  nodes in compact order (``kv_indptr``/``kv_indices``, page size 1, ``kv_last_page_len = 1``);
* **mask**: the compacted tree mask in FlashInfer's layout (request ``b`` owns
  ``q_b * (p_b + q_b)`` cells, row-major, key columns = prefix then kept nodes), which is exactly
  :func:`sglang_ext.dcut.build_full_mask`; packed little-endian per request
  (:func:`pack_mask_segments`, FlashInfer's ``segment_packbits(..., bitorder="little")``). Chains
  (DFlash blocks, EAGLE topk=1) may use ``causal=True`` with no mask: FlashInfer's causal mask is
  bottom-right aligned, which is the chain mask;
* **graphs per tier**: for batch size ``bs`` and tier ratio ``rho`` the verify forward has
  ``T = ceil(bs * N * rho) = bs + keep_count(bs, N, rho)`` rows (:func:`verify_graph_shapes`).
  One graph is captured per ``(bs, T)``: its wrapper is planned at capture with ``T`` rows
  (FlashInfer then accepts any later plan with ``qo_indptr[-1] <= T`` at replay) and a step whose
  kept rows total ``<= T`` replays it with the rows past ``qo_indptr[-1]`` as padding lanes
  (their outputs are dropped by the scatter-back, ``PAD_INDEX``).

Everything above is pure torch (no SGLang, no FlashInfer import) and runs on CPU;
:func:`paged_attention_reference` computes what FlashInfer computes from the same plan, so the
plan is tested on CPU against the project's torch backend (``tests/unit/test_flashinfer_plan.py``)
and the GPU script (``tests/gpu/run_gpu_checks.py``) compares FlashInfer against the same
reference. :func:`register` adds the SGLang backend subclass ``flashinfer_dcut`` (built lazily by
:func:`flashinfer_dcut_backend_class`); the plugin calls it only when CUDA is available.

Worked example (bs = 2, N = 4, prefixes ``p = [2, 1]``; request 0 keeps nodes {0, 2} of the tree
0 -> {1, 2}, request 1 keeps its chain prefix {0, 1, 2})::

    window slots   req 0: R0[0:2] | R0[2:6]        req 1: R1[0:1] | R1[1:5]
    kept cols      [0, 2 | 0, 1, 2]                (local node ids of the ragged rows)
    qo_indptr      [0, 2, 5]
    kv per req     [R0[0], R0[1], R0[2], R0[4]]    [R1[0], R1[1], R1[2], R1[3]]
    kv_indptr      [0, 4, 8]
    mask cells     2 * 4 + 3 * 4 = 20              mask_indptr [0, 8, 20]

The graphs themselves are captured and replayed by ``dcut_graphs.DCutVerifyGraphRunner`` (one
TARGET_VERIFY graph per ``(bs, T)``, compacted steps padded to the smallest fitting one with
zero-row padding requests), which plans through this backend.

GPU status: the planning math is tested on CPU; the FlashInfer calls, the backend subclass and the
tier-graph runner are written for SGLang 0.5.23 / flashinfer-python 0.7.2 and have **not been run**
on a GPU yet.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

from sglang_ext.dcut.tiers import DEFAULT_TIERS, tier_keep_counts

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND_NAME",
    "PAGE_SIZE",
    "SINK_SLOT",
    "NO_COL",
    "VerifyGraphShape",
    "VerifyPlan",
    "GraphBufferSizes",
    "SharedGraphBuffers",
    "PAD_REQUESTS",
    "ragged_qo_indptr",
    "window_kv",
    "kept_cols_from_index",
    "chain_kept_cols",
    "select_kept_kv",
    "mask_indptr_from",
    "pack_mask_segments",
    "unpack_mask_segments",
    "plan_verify",
    "tier_token_counts",
    "verify_graph_shapes",
    "verify_kept_cols",
    "padded_num_tokens",
    "capture_counts",
    "graph_buffer_sizes",
    "shared_graph_buffer_sizes",
    "ragged_verify_unsupported_reason",
    "paged_attention_reference",
    "flashinfer_available",
    "make_prefill_wrapper",
    "plan_prefill_wrapper",
    "flashinfer_dcut_backend_class",
    "add_draft_backend_alias",
    "around_dflash_verify_mask_policy",
    "register",
]

BACKEND_NAME = "flashinfer_dcut"
"""Name of the backend subclass in SGLang's attention registry (``--attention-backend``)."""
PAGE_SIZE = 1
"""KV page size the plans assume (SGLang's FlashInfer backend plans with page size 1)."""
SINK_SLOT = 0
"""KV slot that padding rows write to (SGLang's sink; never part of a request's keys)."""
NO_COL = -1
"""Local window column of a padding row in ``kept_cols`` (same value as ``PAD_INDEX``)."""
DRAFT_BACKEND_BASE = "flashinfer"
"""Name under which SGLang's ``DraftBackendFactory`` builds the draft backends ``flashinfer_dcut`` uses."""
HOOK_DFLASH_MASK_POLICY = "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy"
BACKEND_CLASS_NAME = "FlashInferDCutBackend"
"""Class name of the backend subclass (what SGLang's DFlash mask policy reads)."""
BASE_CLASS_NAME = "FlashInferAttnBackend"


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


# ----------------------------------------------------------------------------- FlashInfer calls
def flashinfer_available() -> Tuple[bool, str]:
    """Whether ``flashinfer`` imports and a CUDA device is present, with the reason if not.

    Examples
    --------
    >>> ok, why = flashinfer_available(); isinstance(why, str)
    True
    """
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # ImportError, or a missing runtime dependency of flashinfer
        return False, f"flashinfer does not import: {type(e).__name__}: {e}"
    return True, "ok"


@dataclass
class WrapperBuffers:
    """Fixed buffers of one CUDA-graph wrapper (addresses captured into the graph).

    Sized for ``batch_size`` live requests plus the padding request (:data:`PAD_REQUESTS`).
    """

    qo_indptr: torch.Tensor  # [batch_size + PAD_REQUESTS + 1] int32
    kv_indptr: torch.Tensor  # [batch_size + PAD_REQUESTS + 1] int32
    kv_indices: torch.Tensor  # [capacity] int32
    kv_last_page_len: torch.Tensor  # [batch_size + PAD_REQUESTS] int32
    custom_mask: Optional[torch.Tensor]  # [capacity] uint8
    mask_indptr: Optional[torch.Tensor]  # [batch_size + PAD_REQUESTS + 1] int32

    @classmethod
    def allocate(cls, batch_size: int, sizes: GraphBufferSizes, use_custom_mask: bool, device) -> "WrapperBuffers":
        """Own buffers for one graph (the GPU script's single graphs); backends use :class:`SharedGraphBuffers`."""
        return SharedGraphBuffers.allocate(
            GraphBufferSizes(sizes.kv_indices, sizes.packed_mask, max(batch_size, sizes.max_batch_size)), device
        ).view(batch_size, use_custom_mask)


class SharedGraphBuffers:
    """The fixed buffers every tier-graph wrapper of one backend plans into (one allocation each).

    ``kv_indices`` ``[capacity]`` int32 and ``custom_mask`` ``[capacity]`` uint8 are shared whole;
    the indptr buffers have ``max_batch_size + PAD_REQUESTS + 1`` entries and each wrapper gets
    the leading ``bs + PAD_REQUESTS + 1`` (FlashInfer fixes a graph wrapper's batch size from its
    buffers' lengths). Sharing is safe because each replay is re-planned right before it.
    ``kv_indices`` / ``custom_mask`` may be SGLang's own ``cuda_graph_kv_indices[0]`` /
    ``cuda_graph_custom_mask`` (:meth:`from_tensors`).

    Examples
    --------
    >>> pool = SharedGraphBuffers.allocate(GraphBufferSizes(100, 50, 8), "cpu")
    >>> a, b = pool.view(2, True), pool.view(8, False)
    >>> a.qo_indptr.shape[0], b.qo_indptr.shape[0], a.kv_indices.data_ptr() == b.kv_indices.data_ptr()
    (4, 10, True)
    """

    def __init__(self, kv_indices: torch.Tensor, custom_mask: torch.Tensor, max_batch_size: int):
        n = int(max_batch_size) + PAD_REQUESTS
        z = dict(dtype=torch.int32, device=kv_indices.device)
        self.max_batch_size = int(max_batch_size)
        self.kv_indices = kv_indices  # [kv capacity] int32
        self.custom_mask = custom_mask  # [mask capacity] uint8
        self.qo_indptr = torch.zeros(n + 1, **z)
        self.kv_indptr = torch.zeros(n + 1, **z)
        self.kv_last_page_len = torch.ones(n, **z)
        self.mask_indptr = torch.zeros(n + 1, **z)

    @classmethod
    def allocate(cls, sizes: GraphBufferSizes, device) -> "SharedGraphBuffers":
        return cls(torch.zeros(sizes.kv_indices, dtype=torch.int32, device=device),
                   torch.zeros(sizes.packed_mask, dtype=torch.uint8, device=device), sizes.max_batch_size)

    @classmethod
    def from_tensors(cls, kv_indices: torch.Tensor, custom_mask: torch.Tensor, max_batch_size: int):
        """Share existing key-index / mask buffers (e.g. SGLang's graph buffers); only the small
        indptr buffers are allocated."""
        return cls(kv_indices, custom_mask, max_batch_size)

    def fits(self, sizes: GraphBufferSizes) -> bool:
        """Whether a graph needing ``sizes`` fits these buffers."""
        return (sizes.kv_indices <= self.kv_indices.numel() and sizes.packed_mask <= self.custom_mask.numel()
                and sizes.max_batch_size <= self.max_batch_size)

    def nbytes(self) -> int:
        """Bytes of device memory these buffers hold (shared ones counted once)."""
        ts = (self.kv_indices, self.custom_mask, self.qo_indptr, self.kv_indptr, self.kv_last_page_len,
              self.mask_indptr)
        return sum(t.numel() * t.element_size() for t in ts)

    def view(self, batch_size: int, use_custom_mask: bool) -> WrapperBuffers:
        """Buffers for a graph wrapper of ``batch_size`` live requests (views, no allocation)."""
        if batch_size > self.max_batch_size:
            raise ValueError(f"{BACKEND_NAME}: tier graph of batch size {batch_size} exceeds the shared buffers' "
                             f"{self.max_batch_size}")
        n = int(batch_size) + PAD_REQUESTS
        return WrapperBuffers(
            qo_indptr=self.qo_indptr[: n + 1],
            kv_indptr=self.kv_indptr[: n + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:n],
            custom_mask=self.custom_mask if use_custom_mask else None,
            mask_indptr=self.mask_indptr[: n + 1] if use_custom_mask else None,
        )


def make_prefill_wrapper(
    workspace: torch.Tensor,  # [workspace_bytes] uint8
    buffers: Optional[WrapperBuffers] = None,
    backend: str = "fa2",
) -> Any:
    """A ``BatchPrefillWithPagedKVCacheWrapper`` (NHD); CUDA-graph mode when ``buffers`` is given.

    ``fa2`` is SGLang's prefill backend and the one whose kernels take a custom mask on SM90.
    A graph wrapper built with a mask buffer always runs the custom-mask kernel, so tree tiers
    and chain (causal) tiers need separate wrappers.
    """
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper

    if buffers is None:
        return BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    extra = {}
    if buffers.custom_mask is not None:
        extra = {"custom_mask_buf": buffers.custom_mask, "mask_indptr_buf": buffers.mask_indptr}
    return BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, backend=backend,
        qo_indptr_buf=buffers.qo_indptr, paged_kv_indptr_buf=buffers.kv_indptr,
        paged_kv_indices_buf=buffers.kv_indices, paged_kv_last_page_len_buf=buffers.kv_last_page_len, **extra,
    )


def plan_prefill_wrapper(
    wrapper: Any,
    plan: VerifyPlan,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    kv_dtype: Optional[torch.dtype] = None,
    sm_scale: Optional[float] = None,
) -> None:
    """``wrapper.plan(...)`` from a :class:`VerifyPlan` (custom mask, or causal for chains).

    The *unpacked* mask is passed: FlashInfer packs it itself with ``segment_packbits(...,
    bitorder="little")`` and hands the kernel the packed **byte** offsets, which its mask lookup
    (``custom_mask + mask_indptr[b]``, bit ``q * kv_len + kv``) needs. A caller-packed mask would be
    paired with cell offsets by ``plan`` (0.7.2), so it is not used. The result equals
    :attr:`VerifyPlan.packed_mask` / :attr:`VerifyPlan.packed_mask_indptr`.

    Plans outside any graph capture (it copies indptrs to the host). Under CUDA-graph mode it
    refreshes the wrapper's fixed buffers, so a later replay runs the new layout.
    """
    wrapper.plan(
        plan.qo_indptr,
        plan.kv_indptr,
        plan.kv_indices,
        plan.kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        PAGE_SIZE,
        custom_mask=plan.custom_mask,
        causal=plan.causal,
        sm_scale=sm_scale,
        q_data_type=q_dtype,
        kv_data_type=kv_dtype or q_dtype,
    )


# ----------------------------------------------------------------------------- SGLang backend
def ragged_verify_unsupported_reason(num_wrappers: int) -> Optional[str]:
    """Why a FlashInfer backend with ``num_wrappers`` wrappers cannot run a ragged verify, or None.

    Sliding-window models (2 wrappers: window and full layers) and cross-attention models plan
    each wrapper over a different key range; the ragged plan covers one (full-attention) range.

    Examples
    --------
    >>> ragged_verify_unsupported_reason(1) is None, ragged_verify_unsupported_reason(2)
    (True, 'sliding-window or cross-attention model (2 attention wrappers)')
    """
    if int(num_wrappers) == 1:
        return None
    return f"sliding-window or cross-attention model ({int(num_wrappers)} attention wrappers)"


_backend_cls: Optional[type] = None


def flashinfer_dcut_backend_class() -> type:
    """Build (once) the SGLang backend subclass ``FlashInferDCutBackend`` (imports SGLang).

    It keeps SGLang's FlashInfer backend for every forward except a TARGET_VERIFY carrying a
    ``ragged_verify_layout`` (a D-Cut step), which it plans itself with :func:`plan_verify`:

    * eager: the verify wrapper is planned from the live batch;
    * CUDA graphs: wrappers and fixed buffers are keyed by ``(bs, num_tokens)`` instead of
      ``bs``, created at capture of a ragged verify batch (:func:`verify_graph_shapes`) and
      re-planned before each replay.

    Key columns: the full windows are packed by SGLang's own ``generate_attn_arg_prefill``
    (uniform, through the KV-index translator), then the kept columns are selected; the kept
    columns are the batch's ``kv_loc_cols`` (D-Cut binds the kept window ids there), or the chain
    prefix when none are bound. The mask is the compacted ``spec_info.custom_mask`` (None: causal).
    """
    global _backend_cls
    if _backend_cls is not None:
        return _backend_cls

    import copy

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

    class FlashInferDCutBackend(FlashInferAttnBackend):
        """SGLang's FlashInfer backend plus ragged (pruned) verify, eager and per-tier graphs."""

        #: read by the D-Cut glue (``dcut_glue.RAGGED_VERIFY_FLAG``): compact the verify forward
        supports_ragged_target_verify = True

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self._dcut_graph_wrappers = {}  # (bs, num_tokens, masked) -> [wrapper]
            self._dcut_graph_buffers: Optional[SharedGraphBuffers] = None  # shared by every tier wrapper
            self._dcut_graph_max_bs = 0
            self._dcut_max_context_len = int(model_runner.model_config.context_len)
            reason = ragged_verify_unsupported_reason(self.num_wrappers)
            if reason is not None:
                # read by the D-Cut glue: it keeps full-width verify (links cut only) for this backend
                self.supports_ragged_target_verify = False
                logger.warning("%s: %s; D-Cut verifies at full width (pruned links only, no FLOPs saved)",
                               BACKEND_NAME, reason)

        # ---------------------------------------------------------------- planning
        @staticmethod
        def _ragged(forward_batch) -> bool:
            spec = forward_batch.spec_info
            return (
                forward_batch.forward_mode.is_target_verify()
                and spec is not None
                and getattr(spec, "ragged_verify_layout", None) is not None
            )

        def _verify_plan(self, forward_batch) -> VerifyPlan:
            spec = forward_batch.spec_info
            layout = spec.ragged_verify_layout
            bs = forward_batch.batch_size
            n = int(spec.draft_token_num)
            uniform = copy.copy(spec)
            uniform.ragged_verify_layout = None
            uniform.custom_mask = _uniform_mask_placeholder(spec, forward_batch.req_pool_indices.device)
            upd = self.indices_updater_prefill
            prefix_total = int(forward_batch.seq_lens_sum)  # host-known: planning reads nothing back
            window_kv_indices, window_kv_indptr, _, _ = uniform.generate_attn_arg_prefill(
                req_pool_indices=forward_batch.req_pool_indices,
                paged_kernel_lens=forward_batch.seq_lens,
                paged_kernel_lens_sum=prefix_total,
                translator=upd.attn_backend.kv_index_translator,
                plan=forward_batch.kv_loc_plan,
            )
            qo_indptr = layout.qo_indptr_device.to(torch.int32)
            num_tokens = int(forward_batch.input_ids.shape[0])
            kept_cols = verify_kept_cols(
                getattr(forward_batch, "kv_loc_cols", None), getattr(spec, "dcut_kept_index", None),
                qo_indptr, num_tokens, n,
            )
            return plan_verify(
                window_kv_indptr, window_kv_indices, forward_batch.seq_lens[:bs], qo_indptr, kept_cols,
                custom_mask=spec.custom_mask, num_tokens=num_tokens, prefix_total=prefix_total,
            )

        def _plan_wrappers(self, wrappers, vp: VerifyPlan) -> None:
            upd = self.indices_updater_prefill
            for w in wrappers:
                plan_prefill_wrapper(
                    w, vp, upd.num_qo_heads, upd.num_kv_heads, upd.head_dim, upd.q_data_type, upd.data_type,
                )

        def _check_ragged_supported(self) -> None:
            reason = ragged_verify_unsupported_reason(self.num_wrappers)
            if reason is not None:  # the D-Cut glue never compacts for this backend (flag set in __init__)
                raise RuntimeError(f"{BACKEND_NAME}: a compacted verify reached a backend that cannot run it "
                                   f"({reason})")

        # ---------------------------------------------------------------- eager
        def init_forward_metadata(self, forward_batch):
            if not self._ragged(forward_batch):
                return super().init_forward_metadata(forward_batch)
            self._check_ragged_supported()
            self._plan_wrappers(self.prefill_wrappers_verify, self._verify_plan(forward_batch))
            self.forward_metadata = PrefillMetadata(self.prefill_wrappers_verify, False, False)

        # ---------------------------------------------------------------- graphs
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            self._dcut_graph_max_bs = int(max_bs)

        def dcut_reserve_graph_buffers(self, shapes: Sequence[Tuple[int, int]]) -> SharedGraphBuffers:
            """Fixed buffers for the tier graphs ``shapes`` = ``[(bs, T), ...]``, shared by all of them.

            SGLang's own ``cuda_graph_kv_indices[0]`` / ``cuda_graph_custom_mask`` (allocated by
            ``init_cuda_graph_state`` for the uniform graphs) are reused when large enough; else
            one max-size set is allocated. Call before the first tier capture (buffers never move
            once a graph holds their addresses).
            """
            if self._dcut_graph_buffers is not None:
                return self._dcut_graph_buffers
            sizes = shared_graph_buffer_sizes(shapes, self._dcut_max_context_len)
            max_bs = max(sizes.max_batch_size, self._dcut_graph_max_bs)
            sizes = GraphBufferSizes(sizes.kv_indices, sizes.packed_mask, max_bs)
            kv = getattr(self, "cuda_graph_kv_indices", None)  # SGLang's: one per wrapper
            kv = kv[0] if isinstance(kv, (list, tuple)) and kv else kv
            mask = getattr(self, "cuda_graph_custom_mask", None)
            pool = None
            if isinstance(kv, torch.Tensor) and isinstance(mask, torch.Tensor):
                pool = SharedGraphBuffers.from_tensors(kv, mask, max_bs)
                if not pool.fits(sizes):
                    pool = None
            self._dcut_graph_buffers = pool or SharedGraphBuffers.allocate(sizes, self.workspace_buffer.device)
            return self._dcut_graph_buffers

        def _dcut_wrappers(self, bs: int, num_tokens: int, use_custom_mask: bool):
            key = (bs, num_tokens, use_custom_mask)
            if key not in self._dcut_graph_wrappers:
                pool = self.dcut_reserve_graph_buffers([(bs, num_tokens)])
                need = graph_buffer_sizes(bs, num_tokens, self._dcut_max_context_len)
                if not pool.fits(need):
                    raise RuntimeError(f"{BACKEND_NAME}: tier graph (bs {bs}, {num_tokens} rows) does not fit the "
                                       "shared graph buffers reserved before capture")
                self._dcut_graph_wrappers[key] = [
                    make_prefill_wrapper(self.workspace_buffer, pool.view(bs, use_custom_mask),
                                         backend=self.prefill_backend)
                ]
            return self._dcut_graph_wrappers[key]

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
            if not self._ragged(forward_batch):
                return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
            self._check_ragged_supported()
            vp = self._verify_plan(forward_batch)
            wrappers = self._dcut_wrappers(vp.batch_size, vp.num_tokens, not vp.causal)
            self._plan_wrappers(wrappers, vp)
            self.forward_metadata = PrefillMetadata(wrappers, False, False)

    FlashInferDCutBackend.__name__ = BACKEND_CLASS_NAME
    FlashInferDCutBackend.__qualname__ = BACKEND_CLASS_NAME
    _backend_cls = FlashInferDCutBackend
    return _backend_cls


_NEVER_SHORT_MASK_NUMEL = 1 << 62
"""``numel()`` of the placeholder mask of the uniform window packing (see :func:`_uniform_mask_placeholder`)."""


def _uniform_mask_placeholder(spec: Any, device: Any) -> Optional[torch.Tensor]:
    """``custom_mask`` of the uniform copy whose ``generate_attn_arg_prefill`` packs the full windows.

    ``EagleVerifyInput.generate_attn_arg_prefill`` reads ``self.custom_mask.numel()`` and pads a
    short mask with a fresh all-true tensor (it fails on ``None``); only its window keys are used
    here, so an EAGLE input gets a zero-stride view that is never short (no allocation, never read).
    Other inputs (DFlash) accept ``None``.
    """
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    if not isinstance(spec, EagleVerifyInput):
        return None
    return torch.ones(1, dtype=torch.bool, device=device).expand(_NEVER_SHORT_MASK_NUMEL)


def _create_backend(model_runner):
    ok, why = flashinfer_available()
    if not ok:
        raise RuntimeError(f"--attention-backend {BACKEND_NAME}: needs a CUDA device and flashinfer ({why}); "
                           "use torch_sdpa on the CPU testbed")
    return flashinfer_dcut_backend_class()(model_runner)


def add_draft_backend_alias(backend_map: dict) -> bool:
    """Offer ``flashinfer_dcut`` in a ``DraftBackendFactory`` backend map as FlashInfer's entry.

    EAGLE's draft model runs plain decode / extend forwards: SGLang's FlashInfer draft backends
    (multi-step decode, draft extend) serve them; only the target's TARGET_VERIFY needs the
    subclass. Returns whether the alias was added (the map has a ``flashinfer`` entry and no
    ``flashinfer_dcut`` one). Called by the project's AROUND hook on ``_create_backend``
    (``patches/draft_backend_factory.md``).

    Examples
    --------
    >>> m = {"flashinfer": "fi-factory"}; add_draft_backend_alias(m), m[BACKEND_NAME]
    (True, 'fi-factory')
    >>> add_draft_backend_alias({"triton": "t"})
    False
    """
    if DRAFT_BACKEND_BASE not in backend_map or BACKEND_NAME in backend_map:
        return False
    backend_map[BACKEND_NAME] = backend_map[DRAFT_BACKEND_BASE]
    return True


def around_dflash_verify_mask_policy(original_fn, attn_backend, *args, **kwargs):
    """AROUND hook on SGLang's ``resolve_dflash_verify_mask_policy``: ``FlashInferDCutBackend``
    gets FlashInfer's policy (``patches/dflash_mask_policy.md``).

    SGLang decides by the resolved backend's class *name* whether DFlash verify graphs are
    captured with a custom mask; the subclass's name is not in its set, so its graphs would be
    captured with a mask that the live DFlash verify (``custom_mask=None``) never plans.
    """
    name, build_custom_mask = original_fn(attn_backend, *args, **kwargs)
    if name != BACKEND_CLASS_NAME:
        return name, build_custom_mask
    from sglang.srt.speculative import dflash_utils

    return name, BASE_CLASS_NAME not in dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS


def register(*, apply_hooks: bool = False) -> bool:
    """Register ``flashinfer_dcut`` in SGLang's attention registry and its DFlash hook (idempotent).

    The name is always registered, so that ``--attention-backend flashinfer_dcut`` (e.g. in a GPU
    preset) parses and validates everywhere; building the backend without a CUDA device or
    without ``flashinfer`` raises an error naming the flag. The AROUND hook on
    ``resolve_dflash_verify_mask_policy`` is registered through ``HookRegistry`` (applied by
    SGLang's ``load_plugins()``; ``apply_hooks=True`` applies pending hooks now, for tests and
    scripts). Returns whether the backend can be built here. The plugin calls this in every
    process (see ``patches/flashinfer_dcut_backend.md``).
    """
    ok, why = flashinfer_available()
    if not ok:
        logger.debug("%s registered but not buildable here: %s", BACKEND_NAME, why)
    from sglang_ext.engine.attention.registry import register_backend

    register_backend(BACKEND_NAME, _create_backend, [(HOOK_DFLASH_MASK_POLICY, around_dflash_verify_mask_policy)],
                     apply_hooks=apply_hooks)
    return ok

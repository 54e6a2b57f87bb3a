"""Attention plans of the torch SDPA backend (pure torch: no SGLang import).

The plan builders of each forward mode and the multi-step draft round are in
:mod:`sglang_ext.engine.attention.torch_sdpa_modes`.

A *plan* is everything one forward of one attention backend needs besides the per-layer
tensors: which query rows form which group, which KV-cache slots each group reads, and which
key columns each query row may attend to. The SGLang glue in
:mod:`sglang_ext.engine.attention.torch_sdpa` builds one plan per forward (in
``init_forward_metadata``) and runs it once per layer with :func:`run_plan`.

Glossary
--------
num_groups
    Attention groups: one per request (EXTEND, TARGET_VERIFY, DECODE) or one per draft row
    ``(request, branch)`` (multi-step draft decode).
q_lens, prefix_lens
    Host lists, one entry per group: query rows of the group, and cached tokens it reads from
    the KV pool before its own rows.
qo_indptr
    Exclusive offsets of the groups' query rows in ``q``: ``[0, q_0, q_0 + q_1, ...]``.
prefix_indptr
    Exclusive offsets of the groups' slots in ``prefix_slots``.
include_current
    When True, the group's own rows ``k[qo_indptr[i]:qo_indptr[i + 1]]`` are keys too, placed
    after its prefix (key column ``prefix_lens[i] + j`` is current row ``j``). Current rows are
    read from the ``k``/``v`` tensors of the forward, never from the cache, so the write slots
    of the current rows do not matter.

Key columns of group ``i``: ``c < p_i`` is the cached token ``prefix_slots[prefix_indptr[i] + c]``,
``p_i <= c < p_i + q_i`` is current row ``c - p_i``. Masks are boolean, True means attend.

Padding: ``run_plan`` packs the groups into one padded batch ``[num_groups, max_q, max_kv]`` for
a single SDPA call. Padded key columns are never attended; padded query rows attend key column 0
only (so no row is empty; their outputs are discarded). Query rows of ``q`` at or past
``qo_indptr[-1]`` (pad lanes of a ragged verify bucket) get zero output.

Buckets: the EXTEND / TARGET_VERIFY builders return a :class:`BucketedPlan` when the groups are
better run as several padded calls (:func:`bucket_plan`): groups sorted by query length and cut
into runs within a key-row budget (:data:`KV_ROWS_PER_CALL`), so a ragged D-Cut verify does not
pad every request to the longest kept chain and each call's padded keys stay cache-resident.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

NO_MASK = None  # sentinel: every valid key column is visible to every valid row of the plan
NO_PADDED_SOURCE = None  # sentinel: a plan whose padded keys cannot be gathered in one pass


class MaskKind(enum.Enum):
    """How the rows of a group see its key columns.

    CAUSAL: row ``r`` sees columns ``c <= p + r`` (bottom-right aligned causal; extend).
    VISIBLE: every column (decode rows; a single query row sees its whole kv list).
    TREE: every prefix column, and in the current block the cells given by a per-group
    ``[q, q]`` tree block (True where draft ``c`` is row ``r`` or one of its ancestors).
    """

    CAUSAL = "causal"
    VISIBLE = "visible"
    TREE = "tree"


class TreeMaskLayout(enum.Enum):
    """Flat layouts of a verify ``custom_mask`` that :func:`split_tree_mask` accepts.

    FULL: group ``i`` owns ``q_i * (p_i + q_i)`` cells at
    ``mask_indptr[i] = sum_{j<i} q_j * (p_j + q_j)``, row-major ``[q_i, p_i + q_i]``.
    QLEN_ONLY: group ``i`` owns ``q_i * q_i`` cells at ``sum_{j<i} q_j * q_j``, row-major ``[q_i, q_i]``.
    """

    FULL = "full"
    QLEN_ONLY = "qlen_only"


def exclusive_indptr(lens: Sequence[int]) -> list[int]:
    """Exclusive prefix sums with a leading 0.

    Examples
    --------
    >>> exclusive_indptr([3, 4])
    [0, 3, 7]
    """
    out = [0]
    for x in lens:
        out.append(out[-1] + int(x))
    return out


def segment_rows(
    starts: torch.Tensor,  # [num_segments] int64 first index of each segment
    lens: torch.Tensor,  # [num_segments] int64 length of each segment
) -> torch.Tensor:  # [sum(lens)] int64: starts[i], starts[i] + 1, ..., starts[i] + lens[i] - 1, segment-major
    """Concatenated index ranges ``starts[i] .. starts[i] + lens[i] - 1``.

    Examples
    --------
    >>> segment_rows(torch.tensor([10, 0, 5]), torch.tensor([2, 0, 3])).tolist()
    [10, 11, 5, 6, 7]
    """
    shift = starts - (torch.cumsum(lens, 0) - lens)  # [num_segments]
    return torch.arange(int(lens.sum()), device=lens.device) + torch.repeat_interleave(shift, lens)


def gather_row_slots(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    rows: torch.Tensor,  # [num_groups] int64 request-pool row of each group
    starts: Sequence[int],  # host, first column of each group's range
    lens: Sequence[int],  # host, length of each group's range
) -> torch.Tensor:  # [sum(lens)] int64 slot ids, group-major
    """Concatenate ``req_to_token[rows[i], starts[i]:starts[i] + lens[i]]`` over groups.

    Examples
    --------
    >>> r2t = torch.arange(20, dtype=torch.int32).view(2, 10)
    >>> gather_row_slots(r2t, torch.tensor([1, 0]), [0, 5], [2, 3]).tolist()
    [10, 11, 5, 6, 7]
    """
    total = int(sum(int(x) for x in lens))
    device = req_to_token.device
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    lens_t = torch.tensor([int(x) for x in lens], dtype=torch.int64, device=device)
    starts_t = torch.tensor([int(x) for x in starts], dtype=torch.int64, device=device)
    group = torch.repeat_interleave(torch.arange(len(lens), device=device), lens_t)
    cols = segment_rows(starts_t, lens_t)
    return req_to_token[rows.to(device=device, dtype=torch.int64)[group], cols].to(torch.int64)


@dataclass(frozen=True)
class AttentionPlan:
    """Geometry of one attention forward; built once, run once per layer.

    Construct with :func:`make_plan`; all index tensors are derived there.

    Attributes
    ----------
    q_lens, prefix_lens : tuple[int, ...]
        Per group (host).
    qo_indptr : tuple[int, ...]
        Exclusive offsets of the groups' query rows, length ``num_groups + 1``.
    include_current : bool
        The groups' own rows are keys after their prefix.
    prefix_slots : torch.Tensor
        ``[sum(prefix_lens)]`` int64 KV-pool slots, group-major.
    max_q, max_kv : int
        Padded query rows and key columns per group.
    q_dst : torch.Tensor
        ``[num_rows]`` int64: flat row of each query row in the padded ``[num_groups * max_q]``.
    prefix_dst : torch.Tensor
        ``[sum(prefix_lens)]`` int64: flat key row in the padded ``[num_groups * max_kv]``.
    cur_dst : torch.Tensor
        ``[num_rows]`` int64: flat key row of each current row (unused without include_current).
    attend : torch.Tensor or None
        ``[num_groups, max_q, max_kv]`` bool, True = attend; ``NO_MASK`` (None) when every cell
        is visible (no padding, VISIBLE kind).
    kv_src : torch.Tensor or None
        ``[num_groups * max_kv]`` int64: the KV-pool slot every padded key row is gathered from
        in one pass (see :func:`padded_kv_source`); ``NO_PADDED_SOURCE`` (None) when some group
        has no cached prefix to fill its pad columns from (then the padded keys are zero-filled).
    """

    q_lens: tuple
    prefix_lens: tuple
    qo_indptr: tuple
    include_current: bool
    prefix_slots: torch.Tensor
    max_q: int
    max_kv: int
    q_dst: torch.Tensor
    prefix_dst: torch.Tensor
    cur_dst: torch.Tensor
    attend: Optional[torch.Tensor]
    kv_src: Optional[torch.Tensor] = None

    @property
    def num_groups(self) -> int:
        return len(self.q_lens)

    @property
    def num_rows(self) -> int:
        return self.qo_indptr[-1]

    @property
    def kv_lens(self) -> tuple:
        extra = self.q_lens if self.include_current else (0,) * self.num_groups
        return tuple(p + q for p, q in zip(self.prefix_lens, extra))


def empty_plan(device: torch.device | str = "cpu") -> AttentionPlan:
    """A plan with no groups (IDLE or empty batches): :func:`run_plan` returns zeros."""
    return make_plan([], [], torch.empty(0, dtype=torch.int64, device=device), MaskKind.VISIBLE)


def make_plan(
    q_lens: Sequence[int],
    prefix_lens: Sequence[int],
    prefix_slots: torch.Tensor,  # [sum(prefix_lens)] int64 KV-pool slots, group-major
    kind: MaskKind,
    *,
    include_current: bool = True,
    tree_blocks: Optional[Sequence[torch.Tensor]] = None,  # per group [q_i, q_i] bool
) -> AttentionPlan:
    """Build an :class:`AttentionPlan` (padded index maps and the boolean attend mask).

    Examples
    --------
    Two requests extending 2 and 1 tokens after cached prefixes of 1 and 2 tokens:

    >>> plan = make_plan([2, 1], [1, 2], torch.tensor([7, 3, 4]), MaskKind.CAUSAL)
    >>> plan.qo_indptr, plan.kv_lens, (plan.max_q, plan.max_kv)
    ((0, 2, 3), (3, 3), (2, 3))
    >>> plan.attend[0].int().tolist()  # rows see prefix + themselves and earlier rows
    [[1, 1, 0], [1, 1, 1]]
    >>> plan.attend[1].int().tolist()  # second row is padding: column 0 only
    [[1, 1, 1], [1, 0, 0]]
    """
    q_lens = tuple(int(x) for x in q_lens)
    prefix_lens = tuple(int(x) for x in prefix_lens)
    if len(q_lens) != len(prefix_lens):
        raise ValueError(f"q_lens ({len(q_lens)}) and prefix_lens ({len(prefix_lens)}) differ in length")
    if any(q < 0 for q in q_lens) or any(p < 0 for p in prefix_lens):
        raise ValueError(f"negative lengths: q_lens={q_lens}, prefix_lens={prefix_lens}")
    device = prefix_slots.device
    prefix_slots = prefix_slots.to(torch.int64)
    if prefix_slots.numel() != sum(prefix_lens):
        raise ValueError(f"prefix_slots has {prefix_slots.numel()} slots, prefix_lens sum to {sum(prefix_lens)}")
    n = len(q_lens)
    qo_indptr = tuple(exclusive_indptr(q_lens))
    cur = q_lens if include_current else (0,) * n
    kv_lens = [p + c for p, c in zip(prefix_lens, cur)]
    max_q = max(q_lens, default=0)
    max_kv = max(kv_lens, default=0)
    if n and min(kv_lens) == 0 and max_q > 0:
        raise ValueError("a group with query rows has no key columns")

    def flat_rows(lens: Sequence[int], base: Sequence[int], stride: int) -> torch.Tensor:
        # row j of group i -> i * stride + base[i] + j
        if sum(lens) == 0:
            return torch.empty(0, dtype=torch.int64, device=device)
        starts = torch.arange(n, device=device) * stride + torch.tensor(base, dtype=torch.int64, device=device)
        return segment_rows(starts, torch.tensor(lens, dtype=torch.int64, device=device))

    q_dst = flat_rows(q_lens, [0] * n, max_q)
    prefix_dst = flat_rows(prefix_lens, [0] * n, max_kv)
    cur_dst = flat_rows(q_lens, prefix_lens, max_kv) if include_current else q_dst.new_empty(0)

    attend = None
    if n and max_q:
        r = torch.arange(max_q, device=device).view(1, max_q, 1)
        c = torch.arange(max_kv, device=device).view(1, 1, max_kv)
        p_t = torch.tensor(prefix_lens, dtype=torch.int64, device=device).view(n, 1, 1)
        q_t = torch.tensor(q_lens, dtype=torch.int64, device=device).view(n, 1, 1)
        kv_t = torch.tensor(kv_lens, dtype=torch.int64, device=device).view(n, 1, 1)
        attend = c < kv_t
        if kind is MaskKind.CAUSAL:
            if not include_current:
                raise ValueError("CAUSAL plans need include_current=True")
            attend = attend & (c <= p_t + r)
        elif kind is MaskKind.TREE:
            if not include_current:
                raise ValueError("TREE plans need include_current=True")
            if tree_blocks is None or len(tree_blocks) != n:
                raise ValueError("TREE plans need one [q_i, q_i] tree block per group")
            attend = attend & (c < p_t)
            attend = attend.expand(n, max_q, max_kv).clone()
            for i, (block, q, p) in enumerate(zip(tree_blocks, q_lens, prefix_lens)):
                if tuple(block.shape) != (q, q):
                    raise ValueError(f"tree block {i} has shape {tuple(block.shape)}, expected {(q, q)}")
                attend[i, :q, p : p + q] = block.to(device=device) != 0
        elif kind is not MaskKind.VISIBLE:
            raise ValueError(f"unknown mask kind {kind}")
        pad_row = r >= q_t  # [n, max_q, 1]
        attend = torch.where(pad_row, c == 0, attend.expand(n, max_q, max_kv))
        if bool(attend.all()):
            attend = NO_MASK
    kv_src = padded_kv_source(prefix_lens, prefix_slots, max_kv)
    return AttentionPlan(
        q_lens=q_lens,
        prefix_lens=prefix_lens,
        qo_indptr=qo_indptr,
        include_current=include_current,
        prefix_slots=prefix_slots,
        max_q=max_q,
        max_kv=max_kv,
        q_dst=q_dst,
        prefix_dst=prefix_dst,
        cur_dst=cur_dst,
        attend=attend,
        kv_src=kv_src,
    )


#: Key rows (``groups x padded key columns``) one padded SDPA call may cover. A call's padded keys
#: and values, ``rows x num_kv_heads x (qk_head_dim + v_head_dim)`` floats, should stay in the
#: CPU's caches: on the testbed (3 heads of 64, fp32: 1.5 KiB per row) 4096 rows are 6 MiB. Chosen
#: from an ad-hoc micro-benchmark of bs-64 verify shapes (2048 / 4096 / 8192 rows; not a bench/
#: script), where larger calls ran slower per row.
KV_ROWS_PER_CALL = 4096


def split_by_query_length(
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    kv_rows_per_call: int = KV_ROWS_PER_CALL,
) -> list[list[int]]:
    """Partition groups into buckets of similar query length that fit one call's key budget.

    Groups are sorted by query length (stable) and cut into consecutive runs while
    ``len(run) * max(kv_lens in run)`` stays within ``kv_rows_per_call`` (a group larger than the
    budget gets a bucket of its own). Sorting first means a ragged verify where most requests keep
    few drafts and some keep all of them no longer pads every request to the longest one; the
    budget keeps each call's padded keys cache-resident. Groups keep their sorted order inside a
    bucket (the caller maps rows back); buckets are ordered by query length.

    Examples
    --------
    Four requests keeping 16, 2, 16 and 1 draft rows after a 200-token prefix, two per call:

    >>> split_by_query_length([16, 2, 16, 1], [216, 202, 216, 201], kv_rows_per_call=440)
    [[3, 1], [0, 2]]
    >>> split_by_query_length([16, 16, 15], [216, 216, 215], kv_rows_per_call=4096)  # one call
    [[2, 0, 1]]
    """
    n = len(q_lens)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda g: int(q_lens[g]))
    buckets: list[list[int]] = []
    run: list[int] = []
    run_kv = 0
    for g in order:
        kv = int(kv_lens[g])
        if run and (len(run) + 1) * max(run_kv, kv) > kv_rows_per_call:
            buckets.append(run)
            run, run_kv = [], 0
        run.append(g)
        run_kv = max(run_kv, kv)
    buckets.append(run)
    return buckets


@dataclass(frozen=True)
class PlanBucket:
    """One query-length bucket of a :class:`BucketedPlan`: a plan over some groups and where
    their query rows sit in the forward's ``q``."""

    rows: torch.Tensor  # [plan.num_rows] int64 rows of the forward's q, in the bucket's group order
    plan: AttentionPlan


@dataclass(frozen=True)
class BucketedPlan:
    """A plan run as one padded SDPA call per query-length bucket (see :func:`bucket_plan`)."""

    q_lens: tuple
    qo_indptr: tuple
    buckets: tuple  # of PlanBucket

    @property
    def num_groups(self) -> int:
        return len(self.q_lens)

    @property
    def num_rows(self) -> int:
        return self.qo_indptr[-1]


def bucket_plan(
    q_lens: Sequence[int],
    prefix_lens: Sequence[int],
    prefix_slots: torch.Tensor,  # [sum(prefix_lens)] int64 KV-pool slots, group-major
    kind: MaskKind,
    *,
    include_current: bool = True,
    tree_blocks: Optional[Sequence[torch.Tensor]] = None,  # per group [q_i, q_i] bool
    kv_rows_per_call: int = KV_ROWS_PER_CALL,
) -> "AttentionPlan | BucketedPlan":
    """:func:`make_plan`, split into query-length buckets (see :func:`split_by_query_length`).

    Returns a plain :class:`AttentionPlan` when everything fits one call, else a
    :class:`BucketedPlan` whose buckets :func:`run_plan` runs one after the other. Each group's
    attention is the same computation either way (its own rows, keys and mask); only the padding
    around it changes.

    Examples
    --------
    >>> slots = torch.arange(8)
    >>> plan = bucket_plan([6, 1, 6, 1], [2, 2, 2, 2], slots, MaskKind.CAUSAL, kv_rows_per_call=16)
    >>> [b.rows.tolist() for b in plan.buckets]
    [[6, 13], [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]]
    >>> [b.plan.max_q for b in plan.buckets]
    [1, 6]
    """
    q_lens = tuple(int(x) for x in q_lens)
    prefix_lens = tuple(int(x) for x in prefix_lens)
    cur = q_lens if include_current else (0,) * len(q_lens)
    kv_lens = [p + c for p, c in zip(prefix_lens, cur)]
    parts = split_by_query_length(q_lens, kv_lens, kv_rows_per_call)
    if len(parts) <= 1:
        return make_plan(q_lens, prefix_lens, prefix_slots, kind, include_current=include_current,
                         tree_blocks=tree_blocks)
    device = prefix_slots.device
    prefix_slots = prefix_slots.to(torch.int64)
    qo_indptr = exclusive_indptr(q_lens)
    prefix_indptr = exclusive_indptr(prefix_lens)

    q_start = torch.tensor(qo_indptr[:-1], dtype=torch.int64, device=device)  # [n]
    q_len = torch.tensor(q_lens, dtype=torch.int64, device=device)  # [n]
    p_start = torch.tensor(prefix_indptr[:-1], dtype=torch.int64, device=device)  # [n]
    p_len = torch.tensor(prefix_lens, dtype=torch.int64, device=device)  # [n]

    buckets = []
    for groups in parts:
        g_t = torch.tensor(groups, dtype=torch.int64, device=device)
        sub = make_plan(
            [q_lens[g] for g in groups],
            [prefix_lens[g] for g in groups],
            prefix_slots[segment_rows(p_start[g_t], p_len[g_t])],
            kind,
            include_current=include_current,
            tree_blocks=None if tree_blocks is None else [tree_blocks[g] for g in groups],
        )
        buckets.append(PlanBucket(rows=segment_rows(q_start[g_t], q_len[g_t]), plan=sub))
    return BucketedPlan(q_lens=q_lens, qo_indptr=tuple(qo_indptr), buckets=tuple(buckets))


def padded_kv_source(
    prefix_lens: Sequence[int],  # host, cached tokens per group
    prefix_slots: torch.Tensor,  # [sum(prefix_lens)] int64 KV-pool slots, group-major
    max_kv: int,
) -> Optional[torch.Tensor]:  # [num_groups * max_kv] int64, or NO_PADDED_SOURCE
    """Slot to gather for every padded key row of a plan, so one ``index_select`` fills them all.

    Key column ``c < p_i`` of group ``i`` reads its cached slot; every other column (the group's
    current rows, overwritten right after the gather, and the pad columns, never attended) reads
    the group's own first cached slot. Pad columns thus hold finite keys of the same request
    instead of zeros: a masked column gets weight exactly 0 either way, and a request whose cache
    holds non-finite values cannot reach other requests' rows through the padding. Returns
    ``NO_PADDED_SOURCE`` when a group has no cached prefix (``p_i = 0``, e.g. a fresh prefill):
    such plans zero-fill the padded keys instead.

    Examples
    --------
    Two groups with 2 and 1 cached tokens, padded to 3 key columns:

    >>> padded_kv_source([2, 1], torch.tensor([7, 3, 4]), 3).tolist()
    [7, 3, 7, 4, 4, 4]
    >>> padded_kv_source([2, 0], torch.tensor([7, 3]), 3) is NO_PADDED_SOURCE
    True
    """
    n = len(prefix_lens)
    if n == 0 or max_kv == 0 or min(prefix_lens) == 0:
        return NO_PADDED_SOURCE
    device = prefix_slots.device
    lens = torch.tensor(prefix_lens, dtype=torch.int64, device=device)  # [n]
    start = torch.cumsum(lens, 0) - lens  # [n] exclusive offsets into prefix_slots
    col = torch.arange(max_kv, device=device).view(1, max_kv)  # [1, max_kv]
    within = torch.where(col < lens.view(n, 1), col, torch.zeros_like(col))  # [n, max_kv]
    return prefix_slots[(start.view(n, 1) + within).reshape(-1)]


class KVWorkspace:
    """Reusable padded K/V buffers of one attention backend (no zero-fill, no reallocation).

    The padded ``[num_groups * max_kv]`` key and value tensors of a plan have the same shape in
    every layer of a forward (and often across forwards); :func:`run_plan` gathers into these
    buffers instead of allocating fresh ones per layer. A buffer grows when a larger plan needs
    it; buffers are never shared between concurrent forwards (one workspace per backend).

    Examples
    --------
    >>> ws = KVWorkspace()
    >>> a = ws.take("k", (4, 2, 8), torch.float32, "cpu")
    >>> b = ws.take("k", (3, 2, 8), torch.float32, "cpu")
    >>> a.data_ptr() == b.data_ptr(), tuple(b.shape)
    (True, (3, 2, 8))
    """

    def __init__(self) -> None:
        self._buffers: dict = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
        """A tensor of ``shape`` backed by buffer ``name`` (contents unspecified)."""
        numel = math.prod(shape)
        key = (name, dtype, str(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)


def detect_tree_mask_layout(
    mask_numel: int, prefix_lens: Sequence[int], q_lens: Sequence[int]
) -> TreeMaskLayout:
    """Tell the FULL and QLEN_ONLY verify-mask layouts apart by size.

    FULL needs ``sum q(p + q)`` cells (a longer, preallocated buffer is accepted; its tail is
    ignored); QLEN_ONLY is exactly ``sum q^2`` cells. With every ``p = 0`` both layouts coincide.

    Examples
    --------
    >>> detect_tree_mask_layout(3 * 6 + 4 * 6, [3, 2], [3, 4]).value
    'full'
    >>> detect_tree_mask_layout(9 + 16, [3, 2], [3, 4]).value
    'qlen_only'
    """
    full = sum(q * (p + q) for p, q in zip(prefix_lens, q_lens))
    qlen = sum(q * q for q in q_lens)
    if mask_numel == qlen and qlen != full:
        return TreeMaskLayout.QLEN_ONLY
    if mask_numel >= full:
        return TreeMaskLayout.FULL
    raise ValueError(
        f"custom_mask has {mask_numel} cells; FULL layout needs {full} "
        f"(sum q*(p+q)) and QLEN_ONLY exactly {qlen} (sum q*q) for q_lens={list(q_lens)}, "
        f"prefix_lens={list(prefix_lens)}"
    )


def split_tree_mask(
    custom_mask: torch.Tensor,  # [num_cells] bool or uint8, FULL or QLEN_ONLY layout
    prefix_lens: Sequence[int],
    q_lens: Sequence[int],
) -> list[torch.Tensor]:  # per group [q_i, q_i] bool
    """Cut a flat verify mask into per-request ``[q_i, q_i]`` tree blocks.

    In the FULL layout the prefix columns of each row are not returned (the backend treats
    them as visible, as SGLang's Triton kernel does with ``skip_prefix_custom_mask``).

    Examples
    --------
    One request with 1 cached token and a 2-node chain, FULL layout (rows of ``p + q = 3``):

    >>> m = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    >>> split_tree_mask(m, [1], [2])[0].int().tolist()
    [[1, 0], [1, 1]]
    """
    flat = custom_mask.reshape(-1)
    layout = detect_tree_mask_layout(flat.numel(), prefix_lens, q_lens)
    blocks = []
    off = 0
    for p, q in zip(prefix_lens, q_lens):
        p, q = int(p), int(q)
        if layout is TreeMaskLayout.FULL:
            block = flat[off : off + q * (p + q)].view(q, p + q)[:, p:]
            off += q * (p + q)
        else:
            block = flat[off : off + q * q].view(q, q)
            off += q * q
        blocks.append(block != 0)
    return blocks


def run_plan(
    plan: "AttentionPlan | BucketedPlan",
    q: torch.Tensor,  # [num_tokens, num_q_heads, qk_head_dim]
    k: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, qk_head_dim] (None if not include_current)
    v: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, v_head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, qk_head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, v_head_dim]
    *,
    scaling: float,
    logit_cap: float = 0.0,
    workspace: Optional[KVWorkspace] = None,
) -> torch.Tensor:  # [num_tokens, num_q_heads, v_head_dim]
    """Run one layer's attention for a plan with one padded SDPA call.

    Rows ``>= plan.num_rows`` of ``q`` get zeros. GQA is handled by SDPA (``enable_gqa``).
    A positive ``logit_cap`` applies ``cap * tanh(score / cap)`` before the softmax (manual path).
    The padded keys and values are gathered from the pool in one pass when the plan has a
    ``kv_src`` and the pool's dtype is ``q``'s (else zero-filled and copied); with a
    ``workspace`` they go into its reused buffers. The output does not depend on either choice
    (masked columns get weight exactly 0).

    Examples
    --------
    One group, one query row, two cached keys; equal keys give the mean of the values:

    >>> plan = make_plan([1], [2], torch.tensor([0, 1]), MaskKind.VISIBLE, include_current=False)
    >>> kc = torch.ones(2, 1, 4); vc = torch.tensor([[[0.0] * 4], [[2.0] * 4]])
    >>> run_plan(plan, torch.ones(1, 1, 4), None, None, kc, vc, scaling=0.5)[0, 0].tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    if isinstance(plan, BucketedPlan):
        return _run_buckets(plan, q, k, v, k_cache, v_cache, scaling=scaling, logit_cap=logit_cap,
                            workspace=workspace)
    num_tokens, hq, d = q.shape
    hkv = k_cache.shape[1]
    dv = v_cache.shape[2]
    out = q.new_zeros(num_tokens, hq, dv)
    n, rows = plan.num_groups, plan.num_rows
    if n == 0 or rows == 0:
        return out
    if rows > num_tokens:
        raise ValueError(f"plan has {rows} query rows, q has {num_tokens}")
    dtype = q.dtype
    dense_q = n * plan.max_q == rows  # every group has max_q rows: the padded layout is q itself
    if dense_q:
        qp = q[:rows]
    else:
        qp = q.new_zeros(n * plan.max_q, hq, d)
        qp.index_copy_(0, plan.q_dst, q[:rows])
    kp, vp = _padded_kv(plan, k_cache, v_cache, dtype, hkv, d, dv, workspace)
    if plan.include_current:
        kp.index_copy_(0, plan.cur_dst, k[:rows].to(dtype))
        vp.index_copy_(0, plan.cur_dst, v[:rows].to(dtype))
    qb = qp.view(n, plan.max_q, hq, d).transpose(1, 2)  # [n, hq, max_q, d]
    kb = kp.view(n, plan.max_kv, hkv, d).transpose(1, 2)  # [n, hkv, max_kv, d]
    vb = vp.view(n, plan.max_kv, hkv, dv).transpose(1, 2)  # [n, hkv, max_kv, dv]
    mask = None if plan.attend is None else plan.attend.unsqueeze(1)  # [n, 1, max_q, max_kv]
    ob = _attend(qb, kb, vb, mask, scaling, logit_cap, hq, hkv)  # [n, hq, max_q, dv]
    flat = ob.transpose(1, 2).reshape(n * plan.max_q, hq, dv)
    if dense_q:
        out[:rows] = flat
    else:
        out[:rows] = flat.index_select(0, plan.q_dst)
    return out


def _run_buckets(
    plan: BucketedPlan,
    q: torch.Tensor,  # [num_tokens, num_q_heads, qk_head_dim]
    k: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, qk_head_dim] (None if not include_current)
    v: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, v_head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, qk_head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, v_head_dim]
    *,
    scaling: float,
    logit_cap: float,
    workspace: Optional[KVWorkspace],
) -> torch.Tensor:  # [num_tokens, num_q_heads, v_head_dim]
    """:func:`run_plan` of a :class:`BucketedPlan`: one padded call per bucket."""
    num_tokens, hq, _ = q.shape
    if plan.num_rows > num_tokens:
        raise ValueError(f"plan has {plan.num_rows} query rows, q has {num_tokens}")
    out = q.new_zeros(num_tokens, hq, v_cache.shape[2])
    for bucket in plan.buckets:
        rows = bucket.rows
        part = run_plan(
            bucket.plan,
            q.index_select(0, rows),
            None if k is None else k.index_select(0, rows),
            None if v is None else v.index_select(0, rows),
            k_cache,
            v_cache,
            scaling=scaling,
            logit_cap=logit_cap,
            workspace=workspace,
        )
        out.index_copy_(0, rows, part)
    return out


def _padded_kv(
    plan: AttentionPlan,
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, qk_head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, v_head_dim]
    dtype: torch.dtype,
    hkv: int,
    d: int,
    dv: int,
    workspace: Optional[KVWorkspace],
) -> tuple:  # ([num_groups * max_kv, hkv, d], [num_groups * max_kv, hkv, dv])
    """The padded cached keys and values of a plan (current rows not yet written)."""
    rows_kv = plan.num_groups * plan.max_kv
    one_pass = plan.kv_src is not None and k_cache.dtype == dtype and v_cache.dtype == dtype
    if one_pass:
        if workspace is None:
            return k_cache.index_select(0, plan.kv_src), v_cache.index_select(0, plan.kv_src)
        kp = workspace.take("k", (rows_kv, hkv, d), dtype, k_cache.device)
        vp = workspace.take("v", (rows_kv, hkv, dv), dtype, v_cache.device)
        torch.index_select(k_cache, 0, plan.kv_src, out=kp)
        torch.index_select(v_cache, 0, plan.kv_src, out=vp)
        return kp, vp
    kp = k_cache.new_zeros(rows_kv, hkv, d, dtype=dtype)
    vp = v_cache.new_zeros(rows_kv, hkv, dv, dtype=dtype)
    if plan.prefix_slots.numel():
        kp.index_copy_(0, plan.prefix_dst, k_cache.index_select(0, plan.prefix_slots).to(dtype))
        vp.index_copy_(0, plan.prefix_dst, v_cache.index_select(0, plan.prefix_slots).to(dtype))
    return kp, vp


def _attend(
    qb: torch.Tensor,  # [groups, hq, rows, d]
    kb: torch.Tensor,  # [groups, hkv, cols, d]
    vb: torch.Tensor,  # [groups, hkv, cols, dv]
    mask: Optional[torch.Tensor],  # [groups, 1, rows, cols] bool, or NO_MASK
    scaling: float,
    logit_cap: float,
    hq: int,
    hkv: int,
) -> torch.Tensor:  # [groups, hq, rows, dv]
    """Masked attention of padded groups: SDPA, or the manual path with tanh logit capping."""
    dtype = qb.dtype
    if logit_cap and logit_cap > 0:
        group = hq // hkv
        kb = kb.repeat_interleave(group, dim=1)
        vb = vb.repeat_interleave(group, dim=1)
        scores = torch.matmul(qb, kb.transpose(-1, -2)).float() * scaling
        scores = logit_cap * torch.tanh(scores / logit_cap)
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
        return torch.matmul(torch.softmax(scores, dim=-1).to(dtype), vb)
    return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scaling, enable_gqa=hq != hkv)

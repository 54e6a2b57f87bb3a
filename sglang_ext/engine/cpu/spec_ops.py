"""Plain-torch versions of the ``sgl_kernel.*_cpu`` ops that SGLang 0.5.23 calls on the
speculative (EAGLE / EAGLE3 / NGRAM) decode path when ``SGLANG_USE_CPU_ENGINE=1``.

No CPU wheel of ``sgl_kernel`` exists on PyPI, so the project's ``sgl_kernel`` stand-in
(:mod:`sglang_ext.engine.cpu.standins`) serves these functions under the names SGLang imports.
Each function has the name of the ``sgl_kernel`` op it replaces and takes its arguments in the
order (and, where SGLang passes keywords, with the keyword names) used at SGLang's CPU call
sites. The contract of every op is the semantics of its Triton sibling in
``sglang/kernels/ops/speculative/`` (``spec_tree.py``, ``eagle.py``, ``cache_locs.py``,
``reconstruct_tree.py``, ``multi_layer_eagle.py``), ``sglang/kernels/ops/kvcache/cache_move.py``
and ``sglang/srt/mem_cache/allocation.py``: outputs are written **in place**, cells the sibling
does not write are left untouched, and values are cast to the dtype of the output tensor.
``tests/kernels/test_spec_ops.py`` checks each op against its sibling run by the Triton
interpreter.

This module imports only torch and the standard library: the stand-in imports it while (or
before) SGLang itself is being imported. Everything is vectorised over the batch; the only
Python loops are over tree depth / sibling-list length (verify, tree build) and over KV buffers
(layer copy), all of which are small.

Sentinels
---------
``NO_NODE`` (-1)
    "no such node" in ``retrive_next_token`` / ``retrive_next_sibling``.
``REJECTED_SLOT`` (-1)
    an unused slot of ``accept_index`` (the caller pre-fills it).
``ROOT_NODE`` (0)
    local index of the tree root (the bonus token of the previous step).
``PARENT_NOT_FOUND`` (-1)
    internal: a draft node whose parent is missing from ``selected_index`` (malformed tree).
"""

from __future__ import annotations

import ctypes
from typing import Callable, Dict, Optional

import torch

NO_NODE = -1
REJECTED_SLOT = -1
ROOT_NODE = 0
PARENT_NOT_FOUND = -1

# TreeMaskMode values of sglang.kernels.ops.speculative.spec_tree (an IntEnum there).
TREE_MASK_FULL = 0
TREE_MASK_QLEN_ONLY = 1
TREE_MASK_QLEN_ONLY_BITPACKING = 2

__all__ = [
    "NO_NODE",
    "REJECTED_SLOT",
    "ROOT_NODE",
    "PARENT_NOT_FOUND",
    "TREE_MASK_FULL",
    "TREE_MASK_QLEN_ONLY",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "copy_all_layer_kv_cache_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "rotate_input_ids_cpu",
    "reconstruct_indices_from_tree_mask",
    "CPU_OPS",
    "SPECULATIVE_OPS",
]


# ----------------------------------------------------------------------------- helpers
def _exclusive_indptr(lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive offsets with a leading 0: ``[0, l0, l0+l1, ...]`` (int64, ``len + 1`` entries).

    ``lengths``: ``# [n]``.
    """
    indptr = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.reshape(-1).to(torch.int64), dim=0, out=indptr[1:])
    return indptr


def _flat_view(t: torch.Tensor, name: str) -> torch.Tensor:
    """A 1-D view sharing memory with ``t`` (the ops write through it, so never a copy)."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (the op writes into it in place)")
    return t.view(-1)


def _ragged_rows(
    start_offset: torch.Tensor,  # [batch_size]
    end_offset: torch.Tensor,  # [batch_size]
):
    """Flatten the per-request ranges ``[start, end)`` into one index list.

    Returns ``(row, col, out_pos)``, each ``# [num_tokens]``: the request of each token, its
    column in that request's ``req_to_token`` row, and its position in the packed
    ``out_cache_loc``. Like the Triton siblings, a request's packed block begins at the
    (unclamped) sum of ``end - start`` of the requests before it, and an empty or negative
    range contributes no tokens.
    """
    start = start_offset.reshape(-1).to(torch.int64)
    lengths = end_offset.reshape(-1).to(torch.int64) - start  # [batch_size]
    out_indptr = _exclusive_indptr(lengths)  # [batch_size + 1]
    counts = lengths.clamp(min=0)
    row = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=start.device), counts
    )  # [num_tokens]
    count_indptr = _exclusive_indptr(counts)  # [batch_size + 1]
    offset_in_row = torch.arange(row.numel(), device=start.device) - count_indptr[row]
    col = start[row] + offset_in_row
    out_pos = out_indptr[row] + offset_in_row
    return row, col, out_pos


# ----------------------------------------------------------------------------- KV slot tables
def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,  # [batch_size]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len] int32, written in place
    start_offset: torch.Tensor,  # [batch_size]
    end_offset: torch.Tensor,  # [batch_size]
    out_cache_loc: torch.Tensor,  # [sum(end_offset - start_offset)]
    pool_len: int,
) -> None:
    """Write newly allocated KV slots into each request's row of the req->token table.

    ``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]]`` receives the next
    ``end_offset[b] - start_offset[b]`` entries of ``out_cache_loc`` (requests packed back to
    back in batch order). Serves ``assign_req_to_token_pool_func``
    (``srt/mem_cache/allocation.py``).

    Parameters
    ----------
    req_pool_indices, start_offset, end_offset : torch.Tensor
        Row of each request and its column range ``[start, end)``.
    req_to_token : torch.Tensor
        Contiguous table, row stride ``pool_len``; modified in place.
    out_cache_loc : torch.Tensor
        Packed slot ids to store.
    pool_len : int
        Row stride of ``req_to_token`` (``req_to_token.shape[1]``).

    Examples
    --------
    >>> table = torch.zeros(2, 4, dtype=torch.int32)
    >>> assign_req_to_token_pool_cpu(torch.tensor([1, 0]), table, torch.tensor([1, 0]),
    ...     torch.tensor([3, 1]), torch.tensor([7, 8, 9]), 4)
    >>> table.tolist()
    [[9, 0, 0, 0], [0, 7, 8, 0]]
    """
    row, col, out_pos = _ragged_rows(start_offset, end_offset)
    if row.numel() == 0:
        return
    flat = req_pool_indices.reshape(-1).to(torch.int64)[row] * pool_len + col
    values = out_cache_loc.reshape(-1)[out_pos]
    _flat_view(req_to_token, "req_to_token")[flat] = values.to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,  # [batch_size]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    start_offset: torch.Tensor,  # [batch_size]
    end_offset: torch.Tensor,  # [batch_size]
    out_cache_loc: torch.Tensor,  # [>= sum(end_offset - start_offset)], written in place
    pool_len: int,
) -> None:
    """Gather each request's KV slots ``[start, end)`` from the req->token table, packed.

    The inverse of :func:`assign_req_to_token_pool_cpu`. Serves
    ``assign_extend_cache_locs_func`` (verify window of EAGLE and NGRAM, through
    ``assign_extend_cache_locs_uniform_func`` on CPU) and ``fill_front_out_cache_loc_func``
    (``kernels/ops/speculative/cache_locs.py``; KV compaction after a tree verify).

    Parameters
    ----------
    req_pool_indices, start_offset, end_offset : torch.Tensor
        Row of each request and the column range ``[start, end)`` to read.
    req_to_token : torch.Tensor
        Contiguous table with row stride ``pool_len``.
    out_cache_loc : torch.Tensor
        Output, modified in place; entries past the packed total are left untouched.
    pool_len : int
        Row stride of ``req_to_token``.

    Examples
    --------
    >>> table = torch.arange(8, dtype=torch.int32).view(2, 4)
    >>> out = torch.full((3,), -1)
    >>> assign_extend_cache_locs_cpu(torch.tensor([1, 0]), table, torch.tensor([1, 0]),
    ...     torch.tensor([3, 1]), out, 4)
    >>> out.tolist()
    [5, 6, 0]
    """
    row, col, out_pos = _ragged_rows(start_offset, end_offset)
    if row.numel() == 0:
        return
    flat = req_pool_indices.reshape(-1).to(torch.int64)[row] * pool_len + col
    values = req_to_token.reshape(-1)[flat]
    _flat_view(out_cache_loc, "out_cache_loc")[out_pos] = values.to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,  # [batch_size]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    seq_lens: torch.Tensor,  # [batch_size]
    out_cache_loc: torch.Tensor,  # [>= batch_size * topk * num_steps], written in place
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Copy the ``topk * num_steps`` draft slots after each committed prefix.

    ``out_cache_loc[b * W + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]`` for
    ``k < W = topk * num_steps``. Serves ``assign_draft_cache_locs_contiguous_func``
    (``kernels/ops/speculative/cache_locs.py``, called by ``prepare_for_draft`` in
    ``srt/speculative/eagle_worker_common.py`` for page_size 1 or topk 1).

    Parameters
    ----------
    req_pool_indices, seq_lens : torch.Tensor
        Row of each request and its committed length.
    req_to_token : torch.Tensor
        Contiguous table with row stride ``pool_len``.
    out_cache_loc : torch.Tensor
        Output, modified in place.
    pool_len, topk, num_steps : int
        Row stride; draft branching factor; draft steps.

    Examples
    --------
    >>> table = torch.arange(12, dtype=torch.int32).view(2, 6)
    >>> out = torch.empty(4, dtype=torch.int64)
    >>> assign_draft_cache_locs_contiguous_cpu(torch.tensor([1, 0]), table,
    ...     torch.tensor([2, 4]), out, 6, 1, 2)
    >>> out.tolist()
    [8, 9, 4, 5]
    """
    width = topk * num_steps
    bs = seq_lens.numel()
    if bs == 0 or width == 0:
        return
    cols = seq_lens.reshape(-1, 1).to(torch.int64) + torch.arange(
        width, device=seq_lens.device
    )  # [batch_size, width]
    flat = req_pool_indices.reshape(-1, 1).to(torch.int64) * pool_len + cols
    values = req_to_token.reshape(-1)[flat.reshape(-1)]
    _flat_view(out_cache_loc, "out_cache_loc")[: bs * width] = values.to(out_cache_loc.dtype)


# ----------------------------------------------------------------------------- accept bookkeeping
def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,  # [batch_size, accept_stride]
    accept_lens: torch.Tensor,  # [batch_size]
    bonus_tokens: torch.Tensor,  # [batch_size], written in place
    accept_stride: int,
) -> None:
    """Pick each request's last accepted token (the bonus token of the next draft step).

    ``bonus_tokens[b] = accept_tokens.flatten()[accept_stride * b + accept_lens[b] - 1]``.
    Serves ``fill_bonus_tokens_func`` (``kernels/ops/speculative/eagle.py``, called by
    ``run_eagle_verify``).

    Parameters
    ----------
    accept_tokens : torch.Tensor
        ``predict[accept_index]``; row width ``accept_stride``.
    accept_lens : torch.Tensor
        Accepted tokens per request, bonus included (>= 1).
    bonus_tokens : torch.Tensor
        Output, modified in place.
    accept_stride : int
        Row width of ``accept_tokens`` (``accept_index.shape[1]``).

    Examples
    --------
    >>> out = torch.empty(2, dtype=torch.int32)
    >>> fill_bonus_tokens_cpu(torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([3, 1]),
    ...     out, 3)
    >>> out.tolist()
    [7, 8]
    """
    bs = accept_lens.numel()
    if bs == 0:
        return
    idx = (
        torch.arange(bs, device=accept_lens.device) * accept_stride
        + accept_lens.reshape(-1).to(torch.int64)
        - 1
    )
    values = accept_tokens.reshape(-1)[idx]
    _flat_view(bonus_tokens, "bonus_tokens")[:bs] = values.to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,  # [batch_size, spec_steps + 1], REJECTED_SLOT padded
    out_cache_loc: torch.Tensor,  # [batch_size * num_draft_tokens]
    accept_out_cache_loc: torch.Tensor,  # [>= number of accepted slots], written in place
    size: Optional[int] = None,
) -> None:
    """Pack the KV slots of the accepted tokens, in accept order, skipping rejected slots.

    For each flat position ``i < size`` of ``accept_index`` holding ``src >= 0``:
    ``accept_out_cache_loc[#{j < i : accept_index[j] != REJECTED_SLOT}] = out_cache_loc[src]``.
    Serves ``fill_accept_out_cache_loc_func`` (``kernels/ops/speculative/eagle.py``, called by
    ``move_accept_tokens_to_target_kvcache`` after a tree verify). SGLang 0.5.23 passes three
    arguments; ``size`` (default: ``accept_index.numel()``) is accepted for other sgl_kernel
    versions.

    Examples
    --------
    >>> out = torch.zeros(4, dtype=torch.int64)
    >>> fill_accept_out_cache_loc_cpu(torch.tensor([[0, 2], [4, -1]], dtype=torch.int32),
    ...     torch.tensor([10, 11, 12, 13, 14, 15]), out)
    >>> out.tolist()
    [10, 12, 14, 0]
    """
    flat_index = accept_index.reshape(-1)
    if size is not None:
        flat_index = flat_index[:size]
    if flat_index.numel() == 0:
        return
    flat_index = flat_index.to(torch.int64)
    kept = (flat_index != REJECTED_SLOT).to(torch.int64)  # [size]
    dst = torch.cumsum(kept, dim=0) - kept  # exclusive count of earlier kept slots
    write = flat_index > REJECTED_SLOT
    values = out_cache_loc.reshape(-1)[flat_index[write]]
    _flat_view(accept_out_cache_loc, "accept_out_cache_loc")[dst[write]] = values.to(
        accept_out_cache_loc.dtype
    )


def _byte_rows(address: int, num_rows: int, row_bytes: int) -> torch.Tensor:
    """A ``[num_rows, row_bytes / w]`` tensor aliasing memory at ``address`` (no copy), with the
    widest integer word ``w`` in {8, 4, 2, 1} bytes that divides both ``row_bytes`` and
    ``address`` (wide words make the row copy several times faster than bytes)."""
    buffer = (ctypes.c_uint8 * (num_rows * row_bytes)).from_address(address)
    rows = torch.frombuffer(buffer, dtype=torch.uint8).view(num_rows, row_bytes)
    for word, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if row_bytes % word == 0 and address % word == 0:
            return rows.view(dtype)
    return rows


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,  # [num_buffers] uint64 addresses of the KV buffers
    strides: torch.Tensor,  # [num_buffers] bytes per slot row of each buffer
    tgt_loc: torch.Tensor,  # [num_locs]
    src_loc: torch.Tensor,  # [num_locs]
) -> None:
    """Copy KV rows ``src_loc -> tgt_loc`` in every layer's K and V buffer.

    SGLang hands the buffers over as raw CPU addresses (``MHATokenToKVPool.data_ptrs``) and row
    sizes in bytes (``data_strides``). All source rows are read before any target row is
    written, so overlapping ``src``/``tgt`` sets behave like the Triton sibling
    (``copy_all_layer_kv_cache_tiled``). Serves ``copy_all_layer_kv_cache_func``
    (``kernels/ops/kvcache/cache_move.py``; ``move_kv_cache`` after a tree verify, and a dummy
    self-copy at KV-pool init).

    Examples
    --------
    >>> k = torch.arange(6.0).view(3, 2)
    >>> copy_all_layer_kv_cache_cpu(torch.tensor([k.data_ptr()], dtype=torch.uint64),
    ...     torch.tensor([8]), torch.tensor([0]), torch.tensor([2]))
    >>> k.tolist()
    [[4.0, 5.0], [2.0, 3.0], [4.0, 5.0]]
    """
    if data_ptrs.device.type != "cpu":
        raise ValueError("copy_all_layer_kv_cache_cpu needs CPU buffers")
    num_locs = min(tgt_loc.numel(), src_loc.numel())
    if num_locs == 0:
        return
    tgt = tgt_loc.reshape(-1)[:num_locs].to(torch.int64)
    src = src_loc.reshape(-1)[:num_locs].to(torch.int64)
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _byte_rows(int(address), num_rows, int(row_bytes))
        rows.index_copy_(0, tgt, rows.index_select(0, src))  # gather all before scatter


# ----------------------------------------------------------------------------- draft tree
def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,  # [batch_size, topk * (depth - 1) + 1] (or [batch_size, 0])
    selected_index: torch.Tensor,  # [batch_size, draft_token_num - 1]
    verified_seq_len: torch.Tensor,  # [batch_size]
    tree_mask: torch.Tensor,  # flat bool, layout per tree_mask_mode, written in place
    positions: torch.Tensor,  # [batch_size * draft_token_num], written in place
    retrive_index: torch.Tensor,  # [batch_size, draft_token_num], written in place
    retrive_next_token: torch.Tensor,  # [batch_size, draft_token_num], pre-filled NO_NODE
    retrive_next_sibling: torch.Tensor,  # [batch_size, draft_token_num], pre-filled NO_NODE
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the verify tree of each request from the draft's top-k selections.

    Node 0 of request ``b`` is the root (the bonus token); node ``i >= 1`` is draft candidate
    ``selected_index[b, i - 1]``. Its parent is the root when ``selected_index[b, i-1] // topk
    == 0``, else the first node ``j`` with ``selected_index[b, j-1] == parent_list[b,
    selected_index[b, i-1] // topk]``. Outputs, as the Triton sibling
    ``sgl_build_tree_kernel_efficient_triton`` (``kernels/ops/speculative/spec_tree.py``):

    * ``retrive_index[b, i] = b * draft_token_num + i``;
    * ``retrive_next_token[b, p]`` = smallest child of ``p`` (untouched when ``p`` is a leaf);
      ``retrive_next_sibling[b, i]`` = next larger child of ``i``'s parent (untouched for the
      largest child unless the caller's pre-fill of ``retrive_next_token[b, p]`` was not
      ``NO_NODE``, in which case that value is chained, as the sibling does);
    * ``positions[b * N + i] = verified_seq_len[b] + depth of i`` (root depth 0; the
      root-ward walk is capped at ``depth`` steps and stops at a missing parent);
    * the ``N x N`` tree block of the attention mask: row ``i`` attends to the root and to
      ``i`` and its walked ancestors. FULL_MASK (0) places it at columns ``[seq_len,
      seq_len + N)`` of rows of width ``seq_len + N`` after ``sum(seq_len[:b]) * N + b * N * N``
      entries (the caller pre-fills the prefix columns); QLEN_ONLY (1) packs ``N x N`` blocks.

    Serves ``build_tree_kernel_efficient_func`` (``kernels/ops/speculative/spec_tree.py``,
    called by ``build_tree_kernel_efficient`` in ``srt/speculative/eagle_utils.py``).

    Parameters
    ----------
    parent_list, selected_index, verified_seq_len : torch.Tensor
        Draft tree description and committed lengths.
    tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling : torch.Tensor
        Outputs, modified in place (contiguous).
    topk, depth, draft_token_num : int
        Branching factor, draft steps, verify tree size ``N``.
    tree_mask_mode : int
        0 (FULL_MASK) or 1 (QLEN_ONLY); 2 (bit-packed) is not supported, as in the sibling.

    Examples
    --------
    A chain of two drafts after a 5-token prefix (topk 1, depth 2, N 3):

    >>> mask = torch.ones(1 * 5 * 3 + 3 * 3, dtype=torch.bool)
    >>> pos = torch.empty(3, dtype=torch.int64)
    >>> ri, nt, ns = torch.full((3, 1, 3), -1, dtype=torch.int64)
    >>> build_tree_kernel_efficient_cpu(torch.tensor([[-1, 0]]), torch.tensor([[0, 1]]),
    ...     torch.tensor([5]), mask, pos, ri, nt, ns, 1, 2, 3, 0)
    >>> pos.tolist(), nt.tolist(), ns.tolist()
    ([5, 6, 7], [[1, 2, -1]], [[-1, -1, -1]])
    >>> mask.view(3, 8)[:, 5:].int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    mode = int(tree_mask_mode)
    if mode not in (TREE_MASK_FULL, TREE_MASK_QLEN_ONLY):
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu supports FULL_MASK (0) and QLEN_ONLY (1), got {mode}"
        )
    n = int(draft_token_num)
    bs = verified_seq_len.numel()
    if bs == 0 or n == 0:
        return
    device = verified_seq_len.device
    seq_len = verified_seq_len.reshape(-1).to(torch.int64)  # [bs]
    node_ids = torch.arange(n, device=device)  # [n]

    # Parent (local node index) of nodes 1..n-1.
    sel = selected_index[:, : n - 1].to(torch.int64)  # [bs, n-1]
    parent_slot = torch.div(sel, topk, rounding_mode="floor")  # [bs, n-1]
    if parent_list.numel() > 0:
        width = parent_list.shape[-1]
        parent_token = torch.gather(
            parent_list.reshape(bs, width).to(torch.int64),
            1,
            parent_slot.clamp(0, width - 1),
        )  # [bs, n-1]
    else:
        parent_token = torch.full_like(sel, PARENT_NOT_FOUND)
    hits = sel.unsqueeze(1) == parent_token.unsqueeze(2)  # [bs, n-1 (child), n-1 (candidate)]
    found = hits.any(dim=2)
    first_hit = hits.to(torch.int8).argmax(dim=2)  # first matching candidate
    parent = torch.where(
        parent_slot == 0,
        torch.full_like(sel, ROOT_NODE),
        torch.where(found, first_hit + 1, torch.full_like(sel, PARENT_NOT_FOUND)),
    )  # [bs, n-1], node i's parent at column i-1

    # retrive_index: global node ids.
    retrive_index.view(bs, n).copy_(
        (torch.arange(bs, device=device).unsqueeze(1) * n + node_ids).to(retrive_index.dtype)
    )

    # Child / sibling links. Children of p in ascending node order form p's sibling list.
    next_token = retrive_next_token.view(bs, n)
    next_sibling = retrive_next_sibling.view(bs, n)
    prefill_next = next_token.to(torch.int64)  # read before writing (a copy)
    child_nodes = node_ids[1:]  # [n-1]
    is_child = parent.unsqueeze(1) == node_ids.view(1, n, 1)  # [bs, n (parent), n-1 (child)]
    has_child = is_child.any(dim=2)  # [bs, n]
    first_child = is_child.to(torch.int8).argmax(dim=2) + 1  # [bs, n]
    later = child_nodes.view(1, n - 1) > child_nodes.view(n - 1, 1)  # [n-1 (i), n-1 (j)]
    same_parent = (parent.unsqueeze(2) == parent.unsqueeze(1)) & later  # [bs, n-1, n-1]
    same_parent &= (parent >= 0).unsqueeze(2)
    has_next = same_parent.any(dim=2)  # [bs, n-1]
    next_child = same_parent.to(torch.int8).argmax(dim=2) + 1  # [bs, n-1]
    # The largest child chains whatever the caller left in next_token[parent] (NO_NODE normally).
    chained = torch.gather(prefill_next, 1, parent.clamp(min=0))  # [bs, n-1]
    is_last = (parent >= 0) & ~has_next & (chained != NO_NODE)
    sibling_cols = next_sibling[:, 1:]
    sibling_cols.copy_(
        torch.where(
            has_next,
            next_child.to(next_sibling.dtype),
            torch.where(is_last, chained.to(next_sibling.dtype), sibling_cols),
        )
    )
    next_token.copy_(torch.where(has_child, first_child.to(next_token.dtype), next_token))

    # Root-ward walk (at most `depth` steps): mask row of each node and its depth.
    parent_of_node = torch.cat(
        [torch.full((bs, 1), ROOT_NODE, dtype=torch.int64, device=device), parent], dim=1
    )  # [bs, n]
    block = torch.zeros(bs, n, n, dtype=torch.bool, device=device)  # [bs, row, col]
    block[:, :, ROOT_NODE] = True
    node = child_nodes.view(1, n - 1).expand(bs, n - 1).clone()  # [bs, n-1]
    walking = torch.ones(bs, n - 1, dtype=torch.bool, device=device)
    node_depth = torch.zeros(bs, n - 1, dtype=torch.int64, device=device)
    rows = block[:, 1:, :]  # [bs, n-1, n]
    for _ in range(int(depth)):
        if not bool(walking.any()):
            break
        node_depth += walking
        # A stopped walk keeps `node` on its last marked node, so re-marking it is harmless.
        rows.scatter_(2, node.unsqueeze(2), True)
        up = torch.gather(parent_of_node, 1, node)
        walking &= up > ROOT_NODE
        node = torch.where(walking, up, node)
    depth_all = torch.cat(
        [torch.zeros(bs, 1, dtype=torch.int64, device=device), node_depth], dim=1
    )  # [bs, n]
    positions.view(-1)[: bs * n].copy_((depth_all + seq_len.unsqueeze(1)).reshape(-1))

    # Copy each request's n x n block into the flat mask (a strided window of it).
    flat_mask = _flat_view(tree_mask, "tree_mask")
    block = block.to(tree_mask.dtype)
    if mode == TREE_MASK_FULL:
        seq_len_indptr = _exclusive_indptr(seq_len)  # [bs + 1]
        seq_lens = seq_len.tolist()
        block_starts = (
            torch.arange(bs, device=device) * n * n + seq_len_indptr[:-1] * n + seq_len
        ).tolist()
        for b in range(bs):
            row_stride = seq_lens[b] + n
            window = flat_mask[block_starts[b] : block_starts[b] + (n - 1) * row_stride + n]
            window.as_strided((n, n), (row_stride, 1)).copy_(block[b])
    else:
        flat_mask[: bs * n * n].view(bs, n, n).copy_(block)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # [batch_size * num_draft_tokens] int32, written in place
    accept_index: torch.Tensor,  # [batch_size, num_spec_step] int32, pre-filled REJECTED_SLOT
    accept_token_num: torch.Tensor,  # [batch_size] int32, written in place
    candidates: torch.Tensor,  # [batch_size, num_draft_tokens]
    retrive_index: torch.Tensor,  # [batch_size, num_draft_tokens]
    retrive_next_token: torch.Tensor,  # [batch_size, num_draft_tokens]
    retrive_next_sibling: torch.Tensor,  # [batch_size, num_draft_tokens]
    target_predict: torch.Tensor,  # [batch_size, num_draft_tokens]
) -> None:
    """Greedy tree verification: accept the longest root path matching the target argmax.

    Per request, starting at the root: descend to the first child (then its siblings, in list
    order) whose draft token equals the target's prediction at the last accepted node, for
    up to ``num_spec_step - 1`` levels. Writes, as ``verify_tree_greedy_kernel_triton``
    (``kernels/ops/speculative/spec_tree.py``):

    * ``accept_index[b, 0]`` = global id of the root, ``accept_index[b, k]`` = global id of
      the k-th accepted draft (other slots untouched);
    * ``accept_token_num[b]`` = number of accepted drafts (bonus excluded);
    * ``predicts[g] = target_predict.flatten()[g]`` at every accepted node ``g`` (global id),
      including the last one, whose prediction is the bonus token.

    Serves ``verify_tree_greedy_func`` (called by ``eagle_sample`` in
    ``srt/speculative/eagle_utils.py`` and by the NGRAM worker), which passes keywords
    (``retrive_*`` spelling kept from the sgl_kernel schema).

    Examples
    --------
    Chain root->1->2 with drafts [_, 7, 8]; the target predicts 7 after the root, 9 after 1:

    >>> pred = torch.zeros(3, dtype=torch.int32)
    >>> acc = torch.full((1, 3), -1, dtype=torch.int32)
    >>> num = torch.empty(1, dtype=torch.int32)
    >>> verify_tree_greedy_cpu(predicts=pred, accept_index=acc, accept_token_num=num,
    ...     candidates=torch.tensor([[0, 7, 8]]), retrive_index=torch.tensor([[0, 1, 2]]),
    ...     retrive_next_token=torch.tensor([[1, 2, -1]]),
    ...     retrive_next_sibling=torch.tensor([[-1, -1, -1]]),
    ...     target_predict=torch.tensor([[7, 9, 4]]))
    >>> acc.tolist(), num.tolist(), pred.tolist()
    ([[0, 1, -1]], [1], [7, 9, 0])
    """
    bs, n = candidates.shape[0], candidates.shape[1]
    num_spec_step = accept_index.shape[1]
    if bs == 0:
        return
    device = candidates.device
    node_global = retrive_index.reshape(bs, n).to(torch.int64)
    first_child = retrive_next_token.reshape(bs, n).to(torch.int64)
    next_sibling = retrive_next_sibling.reshape(bs, n).to(torch.int64)
    draft = candidates.reshape(bs, n).to(torch.int64)
    target = target_predict.reshape(-1).to(torch.int64)  # indexed by global node id
    predicts_flat = _flat_view(predicts, "predicts")
    rows = torch.arange(bs, device=device)

    last_accepted = node_global[:, ROOT_NODE].clone()  # [bs] global id
    accept_index[:, 0] = last_accepted.to(accept_index.dtype)
    num_accepted = torch.zeros(bs, dtype=torch.int64, device=device)
    cur = torch.full((bs,), ROOT_NODE, dtype=torch.int64, device=device)  # local node
    alive = torch.ones(bs, dtype=torch.bool, device=device)

    for _ in range(1, num_spec_step):
        if not bool(alive.any()):
            break
        cur = torch.where(alive, first_child[rows, cur.clamp(min=0)], cur)
        want = target[last_accepted]  # [bs]
        searching = alive.clone()
        matched = torch.zeros(bs, dtype=torch.bool, device=device)
        for _ in range(n):  # walk the sibling list, as the sibling kernel bounds it
            searching &= cur != NO_NODE
            if not bool(searching.any()):
                break
            safe = cur.clamp(min=0)
            hit = searching & (draft[rows, safe] == want)
            matched |= hit
            searching &= ~hit
            cur = torch.where(searching, next_sibling[rows, safe], cur)
        if bool(matched.any()):
            hit_rows = rows[matched]
            accepted_global = node_global[hit_rows, cur[matched]]
            predicts_flat[last_accepted[matched]] = want[matched].to(predicts.dtype)
            num_accepted += matched
            accept_index[hit_rows, num_accepted[matched]] = accepted_global.to(
                accept_index.dtype
            )
            last_accepted[matched] = accepted_global
        alive = matched

    accept_token_num.reshape(-1)[:bs] = num_accepted.to(accept_token_num.dtype)
    predicts_flat[last_accepted] = target[last_accepted].to(predicts.dtype)


# ----------------------------------------------------------------------------- other spec ops
def rotate_input_ids_cpu(
    input_ids: torch.Tensor,  # [num_tokens], written in place
    extend_start_loc: torch.Tensor,  # [batch_size]
    extend_seq_lens: torch.Tensor,  # [batch_size]
    topk_index: torch.Tensor,  # [batch_size] (or [batch_size, 1])
    select_index: Optional[torch.Tensor] = None,  # [batch_size] absolute positions
) -> None:
    """Shift each request's segment left by one and append its new token.

    For a segment ``[start, start + len)`` with ``len > 0``: ``ids[start + k] = ids[start + k
    + 1]`` for ``k < len - 1``, then ``ids[select_index[b]]`` (default ``start + len - 1``)
    ``= topk_index[b]``. Serves ``rotate_input_ids`` (``kernels/ops/speculative/
    multi_layer_eagle.py``; multi-layer EAGLE / MTP only, not EAGLE3). Segments must not
    overlap (they never do in SGLang).

    Examples
    --------
    >>> ids = torch.tensor([1, 2, 3, 4, 5])
    >>> rotate_input_ids_cpu(ids, torch.tensor([0, 3]), torch.tensor([3, 2]),
    ...     torch.tensor([9, 8]))
    >>> ids.tolist()
    [2, 3, 9, 5, 8]
    """
    bs = extend_seq_lens.numel()
    if bs == 0:
        return
    ids = _flat_view(input_ids, "input_ids")
    start = extend_start_loc.reshape(-1).to(torch.int64)[:bs]
    lengths = extend_seq_lens.reshape(-1).to(torch.int64)
    shift_counts = (lengths - 1).clamp(min=0)
    row, col, _ = _ragged_rows(start, start + shift_counts)
    if row.numel() > 0:
        ids[col] = ids[col + 1].clone()
    nonempty = lengths > 0
    if select_index is not None:
        last = select_index.reshape(-1).to(torch.int64)[:bs]
    else:
        last = start + lengths - 1
    new_tokens = topk_index.reshape(-1)[:bs]
    ids[last[nonempty]] = new_tokens[nonempty].to(ids.dtype)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # [batch_size * n * n] bool (row i: ancestors of node i)
    verified_seq_len: torch.Tensor,  # [batch_size]
    positions: torch.Tensor,  # [batch_size * n], written in place
    retrive_index: torch.Tensor,  # [batch_size, n], written in place
    retrive_next_token: torch.Tensor,  # [batch_size, n], written in place
    retrive_next_sibling: torch.Tensor,  # [batch_size, n], written in place
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Derive NGRAM verify metadata (positions, tree links) from a per-request tree mask.

    With ``anc[i, j] = mask[b, i, j] and j < i``: ``positions = verified_seq_len[b] +
    #anc[i]``; ``retrive_index = b * n + i``; ``parent[i] = max{j : anc[i, j]}`` (else -1);
    ``retrive_next_token[i] = min{k : anc[k, i]}`` (else ``NO_NODE``);
    ``retrive_next_sibling[i] = min{k > i : parent[k] == parent[i]}`` when ``parent[i] >= 0``
    (else ``NO_NODE``). This is ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask``
    and the contract of ``_reconstruct_tree_mask_kernel``
    (``kernels/ops/speculative/reconstruct_tree.py``); it serves
    ``reconstruct_indices_from_tree_mask_func`` (``srt/speculative/ngram_worker.py``).

    Examples
    --------
    Root 0 with children 1 and 2; node 3 under 1:

    >>> m = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    >>> pos = torch.empty(4, dtype=torch.int64)
    >>> ri, nt, ns = torch.empty(3, 1, 4, dtype=torch.int64)
    >>> reconstruct_indices_from_tree_mask(m.flatten(), torch.tensor([10]), pos, ri, nt, ns, 1, 4)
    >>> pos.tolist(), nt.tolist(), ns.tolist()
    ([10, 11, 11, 12], [[1, 3, -1, -1]], [[-1, 2, -1, -1]])
    """
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0 or n == 0:
        return
    device = verified_seq_len.device
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n) != 0  # [bs, i, j]
    node_ids = torch.arange(n, device=device)
    strictly_before = node_ids.view(1, n) < node_ids.view(n, 1)  # [i, j]: j < i
    ancestors = mask & strictly_before  # [bs, i, j]

    depth = ancestors.sum(dim=2)  # [bs, n]
    seq_len = verified_seq_len.reshape(-1)[:bs].to(torch.int64)
    positions.reshape(-1)[: bs * n].copy_((depth + seq_len.view(bs, 1)).reshape(-1))
    _flat_view(retrive_index, "retrive_index")[: bs * n].copy_(
        torch.arange(bs * n, device=device)
    )

    # parent[i] = largest ancestor index, or NO_NODE.
    parent = torch.where(ancestors, node_ids.view(1, 1, n), NO_NODE).amax(dim=2)  # [bs, n]
    # first child of j = smallest i with ancestors[i, j].
    big = n
    first_child = torch.where(ancestors, node_ids.view(1, n, 1), big).amin(dim=1)  # [bs, n]
    next_token = torch.where(first_child < big, first_child, NO_NODE)
    # next sibling of i = smallest k > i with parent[k] == parent[i], when i has a parent.
    same_parent = (parent.unsqueeze(1) == parent.unsqueeze(2)) & strictly_before.T  # [bs, i, k]
    first_sibling = torch.where(same_parent, node_ids.view(1, 1, n), big).amin(dim=2)
    next_sibling = torch.where((parent >= 0) & (first_sibling < big), first_sibling, NO_NODE)
    _flat_view(retrive_next_token, "retrive_next_token")[: bs * n].copy_(next_token.reshape(-1))
    _flat_view(retrive_next_sibling, "retrive_next_sibling")[: bs * n].copy_(
        next_sibling.reshape(-1)
    )


# ----------------------------------------------------------------------------- registries
CPU_OPS: Dict[str, Callable] = {
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    "build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
    "rotate_input_ids_cpu": rotate_input_ids_cpu,
}
"""Top-level ``sgl_kernel`` names (all end in ``_cpu``) -> implementation."""

SPECULATIVE_OPS: Dict[str, Callable] = {
    "reconstruct_indices_from_tree_mask": reconstruct_indices_from_tree_mask,
    # sgl_kernel.speculative also re-exports the speculative *_cpu ops.
    **{name: fn for name, fn in CPU_OPS.items() if name != "copy_all_layer_kv_cache_cpu"},
}
"""Names under ``sgl_kernel.speculative`` -> implementation."""

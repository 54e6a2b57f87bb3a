"""Compaction of a pruned draft tree into the ragged verify inputs ("Route B"; pure torch).

:func:`compact_tree` turns the kept nodes of every request into one ragged batch (kept rows in
node order, padded to a host-known width) with its positions and exclusive ``qo_indptr``;
:func:`build_full_mask` writes the FULL_MASK of that batch (each kept node sees its request's
prefix and its kept ancestors); :func:`tree_block_from_full_mask` reads one request's block back;
:func:`scatter_to_full` puts the verify outputs back in the strided ``[bs * N]`` layout.
Encodings, sentinels and the glossary of shape names: :mod:`sglang_ext.dcut.tree`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_ext.dcut.tree import (
    NO_LINK,
    NO_PARENT,
    NOT_KEPT,
    PAD_INDEX,
    TreeTopology,
    _links_to_sentinel,
    _with_sentinel,
    ancestor_mask,
    cut_links,
)

__all__ = ["CompactTree", "compact_tree", "build_full_mask", "tree_block_from_full_mask", "scatter_to_full"]


@dataclass(frozen=True)
class CompactTree:
    """A pruned batch of trees in compacted (ragged) verify form.

    Two compact layouts are described:

    * the **ragged** layout, ``num_tokens`` rows request-major (what the target forward runs);
    * the **padded** layout ``[batch_size, num_nodes]`` in which each request's kept nodes come
      first (local index ``j < counts[b]``) followed by its pruned nodes. SGLang-style greedy
      verification runs on it unchanged (``retrive_index = b * num_nodes + j``).

    Attributes
    ----------
    counts : torch.Tensor
        ``[batch_size]`` int32, kept nodes per request, root included (the verify lengths).
    qo_indptr : torch.Tensor
        ``[batch_size + 1]`` int32 exclusive offsets of the ragged rows, leading 0.
    kept_index : torch.Tensor
        ``[num_tokens]`` int64, full-layout global id ``b * num_nodes + u`` of each ragged row,
        ``PAD_INDEX`` on padding rows. Scatter verify outputs back with :func:`scatter_to_full`.
    partition : torch.Tensor
        ``[batch_size, num_nodes]`` int64, padded layout -> node: kept nodes ascending, then
        pruned nodes ascending (a permutation of each row).
    local_index : torch.Tensor
        ``[batch_size, num_nodes]`` int64, node -> padded/ragged local index, ``NOT_KEPT`` if pruned.
    draft_token : torch.Tensor
        ``[num_tokens]`` draft tokens of the ragged rows (0 on padding rows).
    positions : torch.Tensor
        ``[num_tokens]`` positions of the ragged rows (0 on padding rows); unchanged by
        compaction because the kept set is ancestor-closed.
    retrive_index, retrive_next_token, retrive_next_sibling : torch.Tensor
        ``[batch_size, num_nodes]`` int64 SGLang tree tensors of the padded layout (local
        indices, ``NO_LINK`` where absent; rows ``j >= counts[b]`` have no links).
    tree_block : torch.Tensor
        ``[batch_size, num_nodes, num_nodes]`` bool ancestor block of the padded layout
        (False outside ``[counts[b], counts[b]]``). Feed it to :func:`build_full_mask`.
    cut_next_token, cut_next_sibling : torch.Tensor
        ``[batch_size, num_nodes]`` int64 links of the full layout with pruned nodes cut out
        (:func:`cut_links`), for sampling on the strided layout after scatter-back.
    """

    counts: torch.Tensor  # [batch_size]
    qo_indptr: torch.Tensor  # [batch_size + 1]
    kept_index: torch.Tensor  # [num_tokens]
    partition: torch.Tensor  # [batch_size, num_nodes]
    local_index: torch.Tensor  # [batch_size, num_nodes]
    draft_token: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    retrive_index: torch.Tensor  # [batch_size, num_nodes]
    retrive_next_token: torch.Tensor  # [batch_size, num_nodes]
    retrive_next_sibling: torch.Tensor  # [batch_size, num_nodes]
    tree_block: torch.Tensor  # [batch_size, num_nodes, num_nodes]
    cut_next_token: torch.Tensor  # [batch_size, num_nodes]
    cut_next_sibling: torch.Tensor  # [batch_size, num_nodes]

    @property
    def num_tokens(self) -> int:
        return self.kept_index.shape[0]


def compact_tree(
    keep_mask: torch.Tensor,  # [batch_size, num_nodes] bool, ancestor-closed, root kept
    draft_token: torch.Tensor,  # [total_nodes] or [batch_size, num_nodes]
    positions: torch.Tensor,  # [total_nodes] or [batch_size, num_nodes]
    retrive_next_token: torch.Tensor,  # [batch_size, num_nodes]
    retrive_next_sibling: torch.Tensor,  # [batch_size, num_nodes]
    tree_block: Optional[torch.Tensor] = None,  # [batch_size, num_nodes, num_nodes] bool
    num_tokens: Optional[int] = None,
) -> CompactTree:
    """Compact a pruned batch of draft trees into ragged verify inputs.

    Kept nodes keep their relative order (node order is topological, so the compacted block
    stays lower-triangular), links are re-pointed to the next kept child/sibling, and every
    index map needed to scatter verify outputs back to the full ``b * num_nodes + u`` layout
    is returned. Chains are the special case of prefix truncation (use
    :func:`chain_keep_mask`).

    Parameters
    ----------
    keep_mask : torch.Tensor
        ``[batch_size, num_nodes]`` bool, ancestor-closed with every root kept.
    draft_token : torch.Tensor
        ``[total_nodes]`` (SGLang's flat ``draft_token``) or ``[batch_size, num_nodes]``.
    positions : torch.Tensor
        ``[total_nodes]`` or ``[batch_size, num_nodes]`` verify positions (seq_len + depth).
    retrive_next_token, retrive_next_sibling : torch.Tensor
        ``[batch_size, num_nodes]`` SGLang links of the full trees.
    tree_block : torch.Tensor, optional
        ``[batch_size, num_nodes, num_nodes]`` bool draft block of the full tree mask
        (e.g. from :func:`tree_block_from_full_mask`); derived from the links when omitted.
    num_tokens : int, optional
        Host-known row count of the ragged layout (``>= keep_mask.sum()``, e.g.
        ``bs + budget``); extra rows are padding. When omitted the exact count is read back
        from the device (one host sync).

    Returns
    -------
    CompactTree

    Examples
    --------
    bs = 2, N = 4. Request 0: root 0 -> {1, 2}, 1 -> {3}; node 1 pruned (with 3).
    Request 1: chain 0 -> 1 -> 2 -> 3, truncated after node 2::

        full ids        [ 0  1  2  3 |  4  5  6  7 ]
        keep            [ 1  0  1  0 |  1  1  1  0 ]
        ragged rows     [ 0  2 | 4  5  6 ]            (kept_index)
        counts [2, 3]   qo_indptr [0, 2, 5]
        padded req 0    local 0 = node 0, local 1 = node 2; next_token[0] = 1 (node 2)

    >>> nt = torch.tensor([[1, 3, -1, -1], [1, 2, 3, -1]])
    >>> ns = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1]])
    >>> keep = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    >>> c = compact_tree(keep, torch.arange(8), torch.arange(8), nt, ns)
    >>> c.kept_index.tolist(), c.qo_indptr.tolist(), c.retrive_next_token.tolist()
    ([0, 2, 4, 5, 6], [0, 2, 5], [[1, -1, -1, -1], [1, 2, -1, -1]])
    """
    keep = keep_mask.to(torch.bool)
    bs, n = keep.shape
    device = keep.device
    draft_token = draft_token.reshape(bs * n)
    positions = positions.reshape(bs * n)

    keep64 = keep.to(torch.int64)
    counts64 = keep64.sum(dim=1)
    total = counts64.sum()
    qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    qo_indptr[1:] = torch.cumsum(counts64, dim=0)
    node = torch.arange(n, device=device, dtype=torch.int64)

    # Padded layout: stable partition (kept first, then pruned; ascending inside each group),
    # built by scattering each node to its slot (no sort).
    local = torch.cumsum(keep64, dim=1) - 1
    pruned_slot = counts64.unsqueeze(1) + torch.cumsum(1 - keep64, dim=1) - 1
    slot = torch.where(keep, local, pruned_slot)
    partition = torch.empty_like(slot).scatter_(1, slot, node.expand(bs, n))
    local_index = torch.where(keep, local, torch.full_like(local, NOT_KEPT))
    slot_kept = node.unsqueeze(0) < counts64.unsqueeze(1)

    # Ragged rows: kept nodes request-major (qo_indptr[b] + local), then the pruned ones.
    flat_keep = keep.reshape(-1)
    kept_pos = (qo_indptr[:-1].to(torch.int64).unsqueeze(1) + local).reshape(-1)
    pruned_pos = total + torch.cumsum(1 - keep64.reshape(-1), dim=0) - 1
    flat_pos = torch.where(flat_keep, kept_pos, pruned_pos)
    flat_ids = torch.arange(bs * n, device=device, dtype=torch.int64)
    flat_order = torch.empty_like(flat_ids).scatter_(0, flat_pos, flat_ids)
    if num_tokens is None:
        num_tokens = int(total.item())
    if num_tokens > bs * n:
        extra = torch.zeros(num_tokens - bs * n, dtype=flat_order.dtype, device=device)
        flat_order = torch.cat([flat_order, extra])
    flat_order = flat_order[:num_tokens]
    is_row = torch.arange(num_tokens, device=device) < total
    kept_index = torch.where(is_row, flat_order, torch.full_like(flat_order, PAD_INDEX))
    safe = torch.where(is_row, flat_order, torch.zeros_like(flat_order))
    g_tokens = draft_token.index_select(0, safe)
    g_positions = positions.index_select(0, safe)
    c_tokens = torch.where(is_row, g_tokens, torch.zeros_like(g_tokens))
    c_positions = torch.where(is_row, g_positions, torch.zeros_like(g_positions))

    # Links: cut in the full layout, then renumber to local indices.
    cut_nt, cut_ns = cut_links(retrive_next_token, retrive_next_sibling, keep)
    local_s = _with_sentinel(local_index, NO_LINK)
    nt_local = local_s.gather(1, _links_to_sentinel(cut_nt, n))
    ns_local = local_s.gather(1, _links_to_sentinel(cut_ns, n))
    padded_nt = nt_local.gather(1, partition)
    padded_ns = ns_local.gather(1, partition)
    padded_nt = torch.where(slot_kept, padded_nt, torch.full_like(padded_nt, NO_LINK))
    padded_ns = torch.where(slot_kept, padded_ns, torch.full_like(padded_ns, NO_LINK))
    retrive_index = torch.arange(bs, device=device, dtype=torch.int64).unsqueeze(1) * n + node

    if tree_block is None:
        # Ancestor block of the compacted trees straight from their re-indexed parents.
        parent = TreeTopology.from_retrive(retrive_next_token, retrive_next_sibling).parent
        parent_local = _with_sentinel(local_index, NO_PARENT).gather(1, _links_to_sentinel(parent, n))
        padded_parent = parent_local.gather(1, partition)
        padded_parent = torch.where(slot_kept, padded_parent, torch.full_like(padded_parent, NO_PARENT))
        block = ancestor_mask(padded_parent) & slot_kept.unsqueeze(1)
    else:
        # block[b, i, j] = tree_block[b, partition[b, i], partition[b, j]] for kept slots,
        # False elsewhere: pad slots point at an all-False sentinel row/column (index n);
        # rows, then columns, are each one index_select over flattened rows.
        tb = torch.zeros((bs, n + 1, n + 1), dtype=torch.bool, device=device)
        tb[:, :n, :n] = tree_block
        part_s = torch.where(slot_kept, partition, torch.full_like(partition, n))
        flat_rows = (part_s + torch.arange(bs, device=device).unsqueeze(1) * (n + 1)).view(-1)
        rows = tb.view(bs * (n + 1), n + 1).index_select(0, flat_rows).view(bs, n, n + 1)
        cols = rows.transpose(1, 2).reshape(bs * (n + 1), n).index_select(0, flat_rows)
        block = cols.view(bs, n, n).transpose(1, 2).contiguous()

    return CompactTree(
        counts=counts64.to(torch.int32),
        qo_indptr=qo_indptr,
        kept_index=kept_index,
        partition=partition,
        local_index=local_index,
        draft_token=c_tokens,
        positions=c_positions,
        retrive_index=retrive_index,
        retrive_next_token=padded_nt,
        retrive_next_sibling=padded_ns,
        tree_block=block,
        cut_next_token=cut_nt,
        cut_next_sibling=cut_ns,
    )


def build_full_mask(
    tree_block: torch.Tensor,  # [batch_size, width, width] bool
    counts: torch.Tensor,  # [batch_size] rows per request (q_b)
    seq_lens: torch.Tensor,  # [batch_size] prefix length before this step (p_b)
    mask_len: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened SGLang FULL_MASK for ragged (possibly pruned) verify trees.

    Per request b, a ``[q_b, p_b + q_b]`` bool block, row-major, prefix columns all True and
    the last ``q_b`` columns equal to ``tree_block[b, :q_b, :q_b]``; blocks are concatenated in
    request order (``mask_indptr[b] = sum_{j<b} q_j (p_j + q_j)``). This is the layout the
    Triton / torch-SDPA / FlashInfer TARGET_VERIFY paths read.

    Parameters
    ----------
    tree_block : torch.Tensor
        ``[batch_size, width, width]`` bool, e.g. :attr:`CompactTree.tree_block`.
    counts : torch.Tensor
        ``[batch_size]`` query rows per request (``q_b <= width``).
    seq_lens : torch.Tensor
        ``[batch_size]`` committed KV length before the step (drafts excluded).
    mask_len : int, optional
        Host-known length of the returned mask, at least ``mask_indptr[-1]`` (cells past it are
        True and belong to no request). With it nothing is read back from the device (the
        ``bs * width * width`` block cells are scattered, no ragged enumeration); without it the
        exact length and the tree-cell count are read back in one host sync.

    Returns
    -------
    (custom_mask, mask_indptr) : tuple of torch.Tensor
        ``[mask_len]`` bool and ``[batch_size + 1]`` int64 exclusive offsets.

    Examples
    --------
    One request, prefix 2, a root with one child::

        row 0:  P P | 1 0
        row 1:  P P | 1 1

    >>> m, ip = build_full_mask(torch.tensor([[[1, 0], [1, 1]]], dtype=torch.bool),
    ...                         torch.tensor([2]), torch.tensor([2]))
    >>> m.int().tolist(), ip.tolist()
    ([1, 1, 1, 0, 1, 1, 1, 1], [0, 8])
    """
    bs, width, _ = tree_block.shape
    device = tree_block.device
    q = counts.to(device=device, dtype=torch.int64)
    p = seq_lens.to(device=device, dtype=torch.int64)
    row_len = p + q
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    mask_indptr[1:] = torch.cumsum(q * row_len, dim=0)
    # Only the sum_b q_b^2 tree cells are written (prefix columns stay True); they are
    # enumerated as a ragged range, so the work is O(sum q_b^2), not O(bs * width^2).
    qq = q * q
    if mask_len is not None:  # no host sync: every block cell, the ones outside q_b x q_b sent to a spare cell
        r = torch.arange(width, device=device, dtype=torch.int64)
        inside = (r.view(1, -1, 1) < q.view(-1, 1, 1)) & (r.view(1, 1, -1) < q.view(-1, 1, 1))  # [bs, w, w]
        start = (mask_indptr[:-1] + p).view(-1, 1, 1)
        cell = start + r.view(1, -1, 1) * row_len.view(-1, 1, 1) + r.view(1, 1, -1)
        spare = int(mask_len)  # one past the end, dropped below
        cell = torch.where(inside, cell, torch.full_like(cell, spare))
        out = torch.ones(spare + 1, dtype=torch.bool, device=device)
        out.scatter_(0, cell.reshape(-1), tree_block.to(torch.bool).reshape(-1) | ~inside.reshape(-1))
        return out[:spare], mask_indptr
    mask_len, num_cells = (int(x) for x in torch.stack([mask_indptr[-1], qq.sum()]).tolist())
    mask = torch.ones(mask_len, dtype=torch.bool, device=device)
    b_i = torch.repeat_interleave(torch.arange(bs, device=device), qq, output_size=num_cells)
    cell_start = torch.cumsum(qq, dim=0) - qq
    local = torch.arange(num_cells, device=device, dtype=torch.int64) - cell_start.index_select(0, b_i)
    q_i = q.index_select(0, b_i)
    r_i = torch.div(local, q_i, rounding_mode="floor")
    c_i = local - r_i * q_i
    base = (mask_indptr[:-1] + p).index_select(0, b_i)
    cell = base + r_i * row_len.index_select(0, b_i) + c_i
    flat_block = tree_block.to(torch.bool).reshape(-1)
    mask.scatter_(0, cell, flat_block.index_select(0, (b_i * width + r_i) * width + c_i))
    return mask, mask_indptr


def tree_block_from_full_mask(
    custom_mask: torch.Tensor,  # [mask_len] bool or uint8
    seq_lens: torch.Tensor,  # [batch_size]
    num_nodes: int,
) -> torch.Tensor:  # [batch_size, num_nodes, num_nodes] bool
    """Extract the ``[N, N]`` draft blocks of a uniform SGLang FULL_MASK.

    Inverse of :func:`build_full_mask` for uniform ``q_b = num_nodes``.

    Parameters
    ----------
    custom_mask : torch.Tensor
        ``[mask_len]`` flattened FULL_MASK (``mask_len = sum_b N * (seq_lens_b + N)``).
    seq_lens : torch.Tensor
        ``[batch_size]`` committed KV lengths.
    num_nodes : int
        ``N``.

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_nodes, num_nodes]`` bool.

    Examples
    --------
    >>> m = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    >>> tree_block_from_full_mask(m, torch.tensor([2]), 2)[0].int().tolist()
    [[1, 0], [1, 1]]
    """
    n = num_nodes
    p = seq_lens.to(torch.int64)
    row_len = p + n
    start = torch.cumsum(n * row_len, dim=0) - n * row_len  # exclusive offsets
    r = torch.arange(n, device=p.device, dtype=torch.int64)
    cell = (
        (start + p).view(-1, 1, 1)
        + r.view(1, -1, 1) * row_len.view(-1, 1, 1)
        + r.view(1, 1, -1)
    )
    return custom_mask.reshape(-1)[cell].to(torch.bool)


def scatter_to_full(
    compact: torch.Tensor,  # [num_tokens, ...]
    kept_index: torch.Tensor,  # [num_tokens] int64, PAD_INDEX on padding rows
    total_nodes: int,
    fill_value: float = 0.0,
) -> torch.Tensor:  # [total_nodes, ...]
    """Scatter ragged verify outputs (logits, hidden states) back to the full layout.

    Rows of pruned nodes get ``fill_value``; padding rows are dropped (sent to a sink row).

    Parameters
    ----------
    compact : torch.Tensor
        ``[num_tokens, ...]`` per-row outputs of the compacted forward.
    kept_index : torch.Tensor
        ``[num_tokens]`` from :attr:`CompactTree.kept_index`.
    total_nodes : int
        ``batch_size * num_nodes``.
    fill_value : float
        Value of pruned rows (finite, so NaN probes stay quiet).

    Returns
    -------
    torch.Tensor
        ``[total_nodes, ...]``.

    Examples
    --------
    >>> scatter_to_full(torch.tensor([5., 6., 7.]), torch.tensor([0, 2, -1]), 4).tolist()
    [5.0, 0.0, 6.0, 0.0]
    """
    out = torch.full(
        (total_nodes + 1,) + tuple(compact.shape[1:]),
        fill_value,
        dtype=compact.dtype,
        device=compact.device,
    )
    idx = torch.where(kept_index < 0, torch.full_like(kept_index, total_nodes), kept_index)
    out.index_copy_(0, idx, compact)
    return out[:total_nodes]

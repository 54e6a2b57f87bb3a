"""Draft-tree encodings and the compaction of a pruned tree (pure torch).

SGLang encodes each request's draft tree (EAGLE topk > 1; a chain is the topk = 1 case) as
``num_nodes`` nodes with node 0 the root (the previous bonus token) and two link tensors:

* ``retrive_next_token[b, u]``: the first child of node ``u`` (``NO_LINK`` if none);
* ``retrive_next_sibling[b, v]``: the next sibling of ``v`` in its parent's child list.

SGLang's tree builder (``build_tree_kernel_efficient``) makes the first child the child with the
smallest node index and chains siblings in ascending node order; node order is topological
(a parent's index is smaller than its children's). This module converts between that encoding
and parent arrays, computes depths and ancestor masks, cuts pruned nodes out of the links
("Route C") and compacts a pruned tree into the ragged verify inputs ("Route B").

Glossary of shape names (used in every ``# [...]`` shape comment of ``sglang_ext.dcut``)
------------------------------------------------------------------------------------------
batch_size
    Requests in the decode batch (``bs``).
num_nodes
    Nodes per request of a tree, root included: SGLang's ``--speculative-num-draft-tokens``
    (``N``). Node 0 is the root.
num_draft_slots
    Draft slots per request of a chain, bonus/root excluded: ``K = N - 1``.
total_nodes
    ``batch_size * num_nodes``: the flat, request-major "full layout" (global node id
    ``b * num_nodes + u``).
num_tokens
    Rows of a compacted (ragged) verify batch: the sum of the kept node counts, optionally
    padded to a host-known size.
depth
    Distance of a node from its root (root 0); equals ``positions - seq_lens``.
vocab_size
    Draft vocabulary size (EAGLE3: the draft's own, possibly reduced, vocabulary).
mask_len
    Length of a flattened FULL_MASK: ``sum_b q_b * (seq_lens_b + q_b)``.

Sentinels: ``NO_PARENT`` (root or unreachable node), ``NO_LINK`` (end of a child/sibling
list, SGLang's -1), ``NOT_KEPT`` (pruned node in an index map), ``PAD_INDEX`` (padding row of a
compacted batch), ``UNREACHABLE_DEPTH`` (depth of a node not linked to the root).
All ``*_indptr`` tensors are exclusive offsets with a leading 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

NO_PARENT = -1
NO_LINK = -1
NOT_KEPT = -1
PAD_INDEX = -1
UNREACHABLE_DEPTH = -1

__all__ = [
    "NO_PARENT",
    "NO_LINK",
    "NOT_KEPT",
    "PAD_INDEX",
    "UNREACHABLE_DEPTH",
    "TreeTopology",
    "CompactTree",
    "num_jump_rounds",
    "path_reduce",
    "parents_from_retrive",
    "retrive_from_parents",
    "chain_retrive",
    "chain_keep_mask",
    "ancestor_mask",
    "cut_links",
    "compact_tree",
    "build_full_mask",
    "tree_block_from_full_mask",
    "scatter_to_full",
]


def num_jump_rounds(num_nodes: int) -> int:
    """Pointer-jumping rounds that cover any path in a tree of ``num_nodes`` nodes.

    After ``r`` rounds a jump pointer spans ``2**r`` links; the longest root path has
    ``num_nodes - 1`` links.

    Parameters
    ----------
    num_nodes : int
        Nodes per request, root included.

    Returns
    -------
    int
        The smallest ``r >= 1`` with ``2**r >= num_nodes - 1``.

    Examples
    --------
    >>> num_jump_rounds(4), num_jump_rounds(16), num_jump_rounds(60)
    (2, 4, 6)
    """
    return max(1, (max(num_nodes - 1, 1) - 1).bit_length())


def device_constant(maxsize: int = 64) -> Callable:
    """Decorator: cache the read-only tensor ``build(*args, device)`` per argument tuple.

    The planner's hot path uses per-shape constants (node ids, tie-break bases, ...) every step;
    building them once saves a few microseconds per op. The tensors are built outside
    ``inference_mode`` (usable from any grad mode) and shared: callers must never modify them.
    Arguments must be hashable; ``"cpu"`` and ``torch.device("cpu")`` are separate entries.

    Examples
    --------
    >>> @device_constant()
    ... def _ones(n, device):
    ...     return torch.ones(n, device=device)
    >>> _ones(3, "cpu") is _ones(3, "cpu"), _ones(3, "cpu").tolist()
    (True, [1.0, 1.0, 1.0])
    """

    def deco(build: Callable) -> Callable:
        @functools.lru_cache(maxsize=maxsize)
        @functools.wraps(build)
        def cached(*args):
            with torch.inference_mode(False):
                return build(*args)

        return cached

    return deco


@device_constant()
def _node_ids(n: int, device) -> torch.Tensor:  # [n] int64, read-only
    """Cached ``arange(n)`` on ``device`` (a per-shape constant of the planner's hot path)."""
    return torch.arange(n, dtype=torch.int64, device=device)


@device_constant()
def _constant(value, dtype: torch.dtype, device) -> torch.Tensor:  # 0-d, read-only
    """Cached 0-d tensor (cheaper than a Python scalar as the ``other`` of ``torch.where``).

    Pass NaN as ``math.nan`` (one shared object: NaN keys only hit the cache by identity).
    """
    return torch.tensor(value, dtype=dtype, device=device)


def _with_sentinel(
    x: torch.Tensor,  # [batch_size, num_nodes]
    fill,
) -> torch.Tensor:  # [batch_size, num_nodes + 1]
    """Append one sentinel column (index ``num_nodes``) holding ``fill``."""
    pad = torch.full((x.shape[0], 1), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)


def _links_to_sentinel(
    links: torch.Tensor,  # [batch_size, num_nodes], NO_LINK / NO_PARENT = -1
    num_nodes: int,
) -> torch.Tensor:  # [batch_size, num_nodes] int64, -1 replaced by num_nodes
    links = links.to(torch.int64)
    return torch.where(links < 0, torch.full_like(links, num_nodes), links)


@dataclass(frozen=True)
class TreeTopology:
    """Parent array and depths of a batch of draft trees.

    Attributes
    ----------
    parent : torch.Tensor
        ``[batch_size, num_nodes]`` int64; parent node index, ``NO_PARENT`` for the root and
        for nodes not linked to the root.
    depth : torch.Tensor
        ``[batch_size, num_nodes]`` int64; 0 for the root, ``UNREACHABLE_DEPTH`` for nodes not
        linked to the root.
    jumps : tuple of torch.Tensor
        Pointer-jumping table, ``ceil(log2(max depth))`` tensors ``[batch_size, num_nodes]``
        int64 (at most ``num_jump_rounds(num_nodes)``; the jumping stops once every pointer
        reached the top of its chain): ``jumps[k][b, v]`` is the ``2**k``-th ancestor of v,
        or the last ancestor on the way (nodes without a parent point to themselves). Path
        reductions (survival products, running minima) reuse it instead of re-jumping;
        ``None`` (a topology built by hand) makes them rebuild it from ``parent``.
    reachable_mask : torch.Tensor, optional
        ``[batch_size, num_nodes]`` bool, ``depth >= 0`` computed once by the constructors and
        shared read-only by the planner's hot path; ``None`` recomputes it from ``depth``.
        It is used only while ``depth`` is the very tensor it was computed from (a copy made
        with ``dataclasses.replace(topology, depth=...)`` recomputes it).
    """

    parent: torch.Tensor  # [batch_size, num_nodes]
    depth: torch.Tensor  # [batch_size, num_nodes]
    jumps: Optional[tuple] = None  # <= num_jump_rounds(num_nodes) x [batch_size, num_nodes]
    reachable_mask: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    mask_of_depth: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)  # depth it came from

    @property
    def batch_size(self) -> int:
        return self.parent.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.parent.shape[1]

    @property
    def reachable(self) -> torch.Tensor:  # [batch_size, num_nodes] bool
        """Nodes linked to their request's root (root included); a fresh tensor."""
        return self.depth >= 0

    def reachable_shared(self) -> torch.Tensor:  # [batch_size, num_nodes] bool, read-only
        """:attr:`reachable` without a copy when the constructor stored it (do not modify it).

        Examples
        --------
        >>> TreeTopology.from_parents(torch.tensor([[-1, 0, -1]])).reachable_shared().tolist()
        [[True, True, False]]
        """
        if self.reachable_mask is not None and self.mask_of_depth is self.depth:
            return self.reachable_mask
        return self.depth >= 0

    @classmethod
    def from_parents(
        cls,
        parent: torch.Tensor,  # [batch_size, num_nodes], NO_PARENT at the root
    ) -> "TreeTopology":
        """Build the topology from a parent array (node 0 is the root).

        Depths are computed by pointer jumping (list ranking), without a per-node loop.
        A node whose ancestor chain does not end at node 0 gets ``UNREACHABLE_DEPTH`` and
        ``NO_PARENT``.

        Parameters
        ----------
        parent : torch.Tensor
            ``[batch_size, num_nodes]`` integer parent indices, ``NO_PARENT`` for the root.

        Returns
        -------
        TreeTopology

        Examples
        --------
        Root 0 with children 1 and 2; node 3 is a child of 1::

            >>> t = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1]]))
            >>> t.depth.tolist()
            [[0, 1, 1, 2]]
        """
        parent = parent.to(torch.int64)
        n = parent.shape[1]
        has_parent = parent >= 0
        # Nodes without a parent point to themselves (broadcast [num_nodes] row of node ids).
        device = parent.device
        jump = torch.where(has_parent, parent, _node_ids(n, device))
        dist = has_parent.to(torch.int32)  # int32 adds are cheaper; depths < num_nodes
        jumps = []
        for _ in range(num_jump_rounds(n)):
            nxt = jump.gather(1, jump)
            if torch.equal(nxt, jump):
                # Every pointer is at the top of its chain: the rounds done so far span the
                # deepest path (further rounds would only add the tops' identity values).
                break
            jumps.append(jump)
            dist += dist.gather(1, jump)
            jump = nxt
        # ``jump`` is now the top of each node's ancestor chain.
        reachable = jump == 0
        depth = torch.where(reachable, dist, _constant(UNREACHABLE_DEPTH, torch.int32, device))
        depth = depth.to(torch.int64)
        clean_parent = torch.where(
            reachable & has_parent, parent, _constant(NO_PARENT, torch.int64, device)
        )
        return cls(parent=clean_parent, depth=depth, jumps=tuple(jumps), reachable_mask=reachable,
                   mask_of_depth=depth)

    @classmethod
    def from_retrive(
        cls,
        retrive_next_token: torch.Tensor,  # [batch_size, num_nodes]
        retrive_next_sibling: torch.Tensor,  # [batch_size, num_nodes]
    ) -> "TreeTopology":
        """Build the topology from SGLang's first-child / next-sibling links.

        Parameters
        ----------
        retrive_next_token : torch.Tensor
            ``[batch_size, num_nodes]`` first child of each node, ``NO_LINK`` if none.
        retrive_next_sibling : torch.Tensor
            ``[batch_size, num_nodes]`` next sibling of each node, ``NO_LINK`` if none.

        Returns
        -------
        TreeTopology

        Examples
        --------
        >>> nt = torch.tensor([[1, 3, -1, -1]]); ns = torch.tensor([[-1, 2, -1, -1]])
        >>> TreeTopology.from_retrive(nt, ns).parent.tolist()
        [[-1, 0, 0, 1]]
        """
        return cls.from_parents(parents_from_retrive(retrive_next_token, retrive_next_sibling))

    @classmethod
    def chain(cls, batch_size: int, num_nodes: int, device=None) -> "TreeTopology":
        """Topology of ``batch_size`` chains of ``num_nodes`` nodes (parent of j is j - 1).

        Examples
        --------
        >>> TreeTopology.chain(1, 3).parent.tolist()
        [[-1, 0, 1]]
        """
        idx = torch.arange(num_nodes, device=device, dtype=torch.int64)
        return cls.from_parents((idx - 1).expand(batch_size, num_nodes))


def path_reduce(
    values: torch.Tensor,  # [batch_size, num_nodes]
    topology: TreeTopology,
    op: str,
) -> torch.Tensor:  # [batch_size, num_nodes]
    """Reduce ``values`` over each node's root path (the node and all its ancestors).

    Uses the topology's pointer-jumping table: ``num_jump_rounds(num_nodes)`` gathers.

    Parameters
    ----------
    values : torch.Tensor
        ``[batch_size, num_nodes]``. Nodes without a parent point to themselves in the jump
        table, so their value must be the identity of ``op`` (0 for ``"sum"``, ``+inf`` for
        ``"min"``), or NaN for detached nodes whose results are discarded.
    topology : TreeTopology
    op : {"sum", "min"}

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_nodes]`` path sums or path minima.

    Examples
    --------
    >>> topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 1, 1]]))
    >>> path_reduce(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), topo, "sum").tolist()
    [[0.0, 1.0, 3.0, 4.0]]
    """
    jumps = topology.jumps if topology.jumps is not None else TreeTopology.from_parents(topology.parent).jumps
    if op not in ("sum", "min"):
        raise ValueError(f"path_reduce: unknown op {op!r}")
    for k, jump in enumerate(jumps):
        up = values.gather(1, jump)
        if k == 0:  # the first round makes the private copy; later rounds update it in place
            values = values + up if op == "sum" else torch.minimum(values, up)
        elif op == "sum":
            values += up
        else:
            torch.minimum(values, up, out=values)
    return values


def parents_from_retrive(
    retrive_next_token: torch.Tensor,  # [batch_size, num_nodes]
    retrive_next_sibling: torch.Tensor,  # [batch_size, num_nodes]
) -> torch.Tensor:  # [batch_size, num_nodes] int64
    """Parent array of trees given in first-child / next-sibling form.

    A node's parent is the node whose first child heads the node's sibling list. The list head
    is found by pointer jumping over the reversed sibling links, so no per-node loop is needed.
    Nodes that are nobody's child (the root, detached nodes) get ``NO_PARENT``. Reachability
    from the root is not checked here; :meth:`TreeTopology.from_parents` does that.

    Parameters
    ----------
    retrive_next_token : torch.Tensor
        ``[batch_size, num_nodes]`` first child, ``NO_LINK`` if none.
    retrive_next_sibling : torch.Tensor
        ``[batch_size, num_nodes]`` next sibling, ``NO_LINK`` if none.

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_nodes]`` int64 parents.

    Examples
    --------
    Root 0 -> {1, 2}, 1 -> {3}::

        >>> parents_from_retrive(torch.tensor([[1, 3, -1, -1]]),
        ...                      torch.tensor([[-1, 2, -1, -1]])).tolist()
        [[-1, 0, 0, 1]]
    """
    bs, n = retrive_next_token.shape
    device = retrive_next_token.device
    # Shifted columns: node c lives in column c + 1, column 0 is the sink of NO_LINK (-1 + 1).
    first_child = torch.add(retrive_next_token.to(torch.int64), 1).clamp_(min=0)
    next_sib = torch.add(retrive_next_sibling.to(torch.int64), 1).clamp_(min=0)
    ids = _node_ids(n + 1, device)

    # parent_of_head[b, c + 1] = u when c is the first child of u (out-of-place scatters
    # onto expanded constants: one fresh tensor each).
    parent_of_head = _constant(NO_PARENT, torch.int64, device).expand(bs, n + 1).scatter(
        1, first_child, ids[:n].expand(bs, n)
    )

    # prev[b, v + 1] = (the sibling that links to v) + 1; v + 1 itself for list heads.
    prev = ids.expand(bs, n + 1).scatter(1, next_sib, ids[1:].expand(bs, n))
    prev.select(1, 0).fill_(0)  # the sink points to itself (real columns never point to it)
    head = prev
    for _ in range(num_jump_rounds(n + 1)):
        nxt = head.gather(1, head)
        if torch.equal(nxt, head):  # every pointer reached its list head
            break
        head = nxt
    return parent_of_head.gather(1, head[:, 1:])


def retrive_from_parents(
    parent: torch.Tensor,  # [batch_size, num_nodes], NO_PARENT at the root
) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [batch_size, num_nodes] int64
    """SGLang links (first child, next sibling) of trees given as a parent array.

    Follows SGLang's builder convention: the first child is the child with the smallest node
    index and siblings are chained in ascending node order.

    Parameters
    ----------
    parent : torch.Tensor
        ``[batch_size, num_nodes]`` parents, ``NO_PARENT`` for the root.

    Returns
    -------
    (retrive_next_token, retrive_next_sibling) : tuple of torch.Tensor
        Each ``[batch_size, num_nodes]`` int64, ``NO_LINK`` where absent.

    Examples
    --------
    >>> nt, ns = retrive_from_parents(torch.tensor([[-1, 0, 0, 1]]))
    >>> nt.tolist(), ns.tolist()
    ([[1, 3, -1, -1]], [[-1, 2, -1, -1]])
    """
    parent = parent.to(torch.int64)
    bs, n = parent.shape
    device = parent.device
    node = torch.arange(n, device=device, dtype=torch.int64).expand(bs, n)
    p = _links_to_sentinel(parent, n)  # roots grouped under sink n
    # Sort nodes by (parent, index): consecutive entries with the same parent are siblings.
    key = p * (n + 1) + node
    order = torch.argsort(key, dim=1)
    sorted_parent = p.gather(1, order)
    same_next = torch.zeros_like(order, dtype=torch.bool)
    same_next[:, :-1] = sorted_parent[:, :-1] == sorted_parent[:, 1:]
    succ = torch.full_like(order, NO_LINK)
    succ[:, :-1] = torch.where(same_next[:, :-1], order[:, 1:], succ[:, :-1])
    next_sibling = torch.full_like(order, NO_LINK).scatter(1, order, succ)
    next_sibling = torch.where(p < n, next_sibling, torch.full_like(next_sibling, NO_LINK))

    first_child = torch.full((bs, n + 1), n, dtype=torch.int64, device=device)
    first_child.scatter_reduce_(1, p, node, reduce="amin", include_self=True)
    first_child = first_child[:, :n]
    next_token = torch.where(first_child < n, first_child, torch.full_like(first_child, NO_LINK))
    return next_token, next_sibling


def chain_retrive(
    batch_size: int, num_nodes: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [batch_size, num_nodes] int64
    """SGLang links of ``batch_size`` chains: node j's first child is j + 1.

    Examples
    --------
    >>> nt, ns = chain_retrive(1, 3)
    >>> nt.tolist(), ns.tolist()
    ([[1, 2, -1]], [[-1, -1, -1]])
    """
    idx = torch.arange(1, num_nodes + 1, device=device, dtype=torch.int64)
    idx[-1] = NO_LINK
    nt = idx.expand(batch_size, num_nodes).clone()
    ns = torch.full((batch_size, num_nodes), NO_LINK, dtype=torch.int64, device=device)
    return nt, ns


def chain_keep_mask(
    keep_lens: torch.Tensor,  # [batch_size] kept drafts per request (root excluded)
    num_nodes: int,
) -> torch.Tensor:  # [batch_size, num_nodes] bool
    """Kept-node mask of chains truncated to ``keep_lens`` drafts (the root is always kept).

    Examples
    --------
    >>> chain_keep_mask(torch.tensor([0, 2]), 4).int().tolist()
    [[1, 0, 0, 0], [1, 1, 1, 0]]
    """
    idx = torch.arange(num_nodes, device=keep_lens.device)
    return idx.unsqueeze(0) <= keep_lens.to(torch.int64).unsqueeze(1)


def ancestor_mask(
    parent: torch.Tensor,  # [batch_size, num_nodes], NO_PARENT at the root
) -> torch.Tensor:  # [batch_size, num_nodes, num_nodes] bool
    """Tree-attention block: ``mask[b, v, u]`` is True iff ``u`` is ``v`` or an ancestor of ``v``.

    This is the ``[q, q]`` draft block of SGLang's tree mask (diagonal, root column, and
    lower-triangular when node order is topological). Built by pointer jumping on rows.

    Parameters
    ----------
    parent : torch.Tensor
        ``[batch_size, num_nodes]`` parents, ``NO_PARENT`` for the root.

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_nodes, num_nodes]`` bool.

    Examples
    --------
    >>> ancestor_mask(torch.tensor([[-1, 0, 0, 1]]))[0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """
    parent = parent.to(torch.int64)
    bs, n = parent.shape
    device = parent.device
    rows = torch.zeros((bs, n + 1, n), dtype=torch.bool, device=device)  # row n: sink
    rows[:, :n] = torch.eye(n, dtype=torch.bool, device=device)
    jump = _with_sentinel(_links_to_sentinel(parent, n), n)  # [bs, n + 1]
    # Row gathers as one index_select over the flattened rows (much faster than gather).
    offset = (torch.arange(bs, device=device, dtype=torch.int64) * (n + 1)).unsqueeze(1)
    on_cpu = device.type == "cpu"
    for _ in range(num_jump_rounds(n) + 1):
        # On CPU, stop once every pointer is at the sink (all-False row): later rounds would
        # OR in nothing. (Not on accelerators, where the check would be a host sync.)
        if on_cpu and bool((jump == n).all()):
            break
        picked = rows.view(bs * (n + 1), n).index_select(0, (jump + offset).view(-1))
        rows = rows | picked.view(bs, n + 1, n)
        jump = jump.gather(1, jump)
    return rows[:, :n]


def _first_kept_after(
    next_sibling: torch.Tensor,  # [batch_size, num_nodes]
    keep: torch.Tensor,  # [batch_size, num_nodes] bool
) -> torch.Tensor:  # [batch_size, num_nodes + 1] int64, sink index num_nodes = end of list
    """For every node v, the first kept node strictly after v in v's sibling list.

    Pointer jumping over the sibling list: a pointer that lands on a pruned node jumps on.
    """
    bs, n = next_sibling.shape
    marked = _with_sentinel(keep, True)  # the sink (end of list) counts as marked
    jump = _with_sentinel(_links_to_sentinel(next_sibling, n), n)
    for _ in range(num_jump_rounds(n + 1) + 1):
        target_marked = marked.gather(1, jump)
        jump = torch.where(target_marked, jump, jump.gather(1, jump))
    return jump


def cut_links(
    retrive_next_token: torch.Tensor,  # [batch_size, num_nodes]
    retrive_next_sibling: torch.Tensor,  # [batch_size, num_nodes]
    keep_mask: torch.Tensor,  # [batch_size, num_nodes] bool, ancestor-closed, root kept
) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [batch_size, num_nodes] int64
    """Cut pruned nodes out of SGLang's links ("Route C": same layout, pruned unreachable).

    Every kept node's child list keeps only its kept children, in the original order: its
    first child becomes the first kept child and sibling links skip pruned siblings. Pruned
    nodes get ``NO_LINK`` in both tensors. Greedy verification on the result walks exactly
    the kept subtree. Draft tokens are not touched (samplers index by token id).

    Parameters
    ----------
    retrive_next_token, retrive_next_sibling : torch.Tensor
        ``[batch_size, num_nodes]`` SGLang links, ``NO_LINK`` where absent.
    keep_mask : torch.Tensor
        ``[batch_size, num_nodes]`` bool, ancestor-closed (a kept node's parent is kept).

    Returns
    -------
    (next_token, next_sibling) : tuple of torch.Tensor
        ``[batch_size, num_nodes]`` int64 cut links.

    Examples
    --------
    Root 0 -> {1, 2, 3}; node 2 pruned::

        before  next_token [1, -1, -1, -1]   next_sibling [-1, 2, 3, -1]
        after   next_token [1, -1, -1, -1]   next_sibling [-1, 3, -1, -1]

    >>> nt, ns = cut_links(torch.tensor([[1, -1, -1, -1]]), torch.tensor([[-1, 2, 3, -1]]),
    ...                    torch.tensor([[True, True, False, True]]))
    >>> nt.tolist(), ns.tolist()
    ([[1, -1, -1, -1]], [[-1, 3, -1, -1]])
    """
    bs, n = retrive_next_token.shape
    keep = keep_mask.to(torch.bool)
    skip = _first_kept_after(retrive_next_sibling, keep)  # [bs, n + 1]
    fc = _links_to_sentinel(retrive_next_token, n)  # [bs, n]
    fc_kept = _with_sentinel(keep, True).gather(1, fc)
    new_fc = torch.where(fc_kept, fc, skip.gather(1, fc))
    new_ns = skip[:, :n]
    sentinel = torch.full_like(new_fc, NO_LINK)
    new_fc = torch.where((new_fc < n) & keep, new_fc, sentinel)
    new_ns = torch.where((new_ns < n) & keep, new_ns, sentinel)
    return new_fc, new_ns


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

"""Draft-tree encodings: topology, ancestor masks, cut links (pure torch).

SGLang encodes each request's draft tree (EAGLE topk > 1; a chain is the topk = 1 case) as
``num_nodes`` nodes with node 0 the root (the previous bonus token) and two link tensors:

* ``retrive_next_token[b, u]``: the first child of node ``u`` (``NO_LINK`` if none);
* ``retrive_next_sibling[b, v]``: the next sibling of ``v`` in its parent's child list.

SGLang's tree builder (``build_tree_kernel_efficient``) makes the first child the child with the
smallest node index and chains siblings in ascending node order; node order is topological
(a parent's index is smaller than its children's). This module converts between that encoding
and parent arrays, computes depths and ancestor masks, cuts pruned nodes out of the links
("Route C"); :mod:`sglang_ext.dcut.compaction` compacts a pruned tree into the ragged verify
inputs ("Route B").

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
    "num_jump_rounds",
    "path_reduce",
    "parents_from_retrive",
    "retrive_from_parents",
    "chain_retrive",
    "chain_keep_mask",
    "ancestor_mask",
    "cut_links",
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

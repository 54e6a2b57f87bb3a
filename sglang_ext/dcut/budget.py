"""Global top-K selection of draft nodes across a batch (pure torch).

Given survival scores for every candidate node of a batch, D-Cut keeps the K best candidates
across the whole batch (docs/algorithms.md#d-cut-global-top-k). Candidates are ranked by

    (score descending, depth ascending, request index ascending, node index ascending).

Before ranking, scores are made non-increasing along every root path (a running minimum, with
non-finite scores treated as ``-inf``): a no-op for valid survival scores, it guarantees that
the kept set is ancestor-closed (a prefix per chain, a rooted subtree per tree) whatever the
input, and that ineligible nodes take their descendants with them. Ineligible candidates are
never kept, so the number kept can be below the budget.

Scores are ranked as float32 (survival scores are float32 throughout D-Cut); expected-value
sums are accumulated in float64.

One :class:`Ranking` is computed per step and shared by the tier choice (prefix sums of the
sorted scores) and the selection. See ``tree.py`` for the glossary of shape names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_ext.dcut.tree import TreeTopology, _constant, _node_ids, device_constant, path_reduce

__all__ = [
    "Ranking",
    "rank_chain",
    "rank_tree",
    "top_sums",
    "select",
    "keep_lens_from_selection",
    "keep_mask_from_selection",
]


@dataclass(frozen=True)
class Ranking:
    """Candidates of one batch in keep order.

    Attributes
    ----------
    order : torch.Tensor
        ``[num_candidates]`` int64 flat candidate ids, best first. Chains: id ``b * K + j``
        for draft slot j (0-based) of request b; trees: ``b * num_nodes + u`` (roots are not
        candidates).
    sorted_scores : torch.Tensor
        ``[num_candidates]`` float64 scores in ``order``; 0 for ineligible candidates.
    prefix_sums : torch.Tensor
        ``[num_candidates + 1]`` float64, ``prefix_sums[k]`` = sum of the k best scores
        (leading 0); flat once the eligible candidates are exhausted.
    num_eligible : torch.Tensor
        0-d int64, eligible candidates.
    batch_size : int
        Requests.
    row_width : int
        Columns of the score tensor (``K`` for chains, ``num_nodes`` for trees).
    is_tree : bool
        Whether ids are tree node ids (root column included) or chain slot ids.
    """

    order: torch.Tensor
    sorted_scores: torch.Tensor
    prefix_sums: torch.Tensor
    num_eligible: torch.Tensor
    batch_size: int
    row_width: int
    is_tree: bool

    @property
    def num_candidates(self) -> int:
        return self.order.shape[0]


def _finish_ranking(
    order: torch.Tensor,  # [num_candidates]
    flat_scores: torch.Tensor,  # [batch_size * row_width], -inf = ineligible, no NaN / +inf
    batch_size: int,
    row_width: int,
    is_tree: bool,
    num_eligible: Optional[torch.Tensor] = None,  # 0-d int64 when the caller knows it
) -> Ranking:
    s32 = flat_scores.index_select(0, order)
    if num_eligible is None:
        num_eligible = torch.count_nonzero(s32 > float("-inf"))
    s = s32.to(torch.float64).nan_to_num_(neginf=0.0)  # ineligible (-inf) -> 0
    # Leading 0, then the running sums (cumsum accumulates from 0, so this is bit-identical
    # to writing the cumsum behind a zero).
    zero = _constant(0.0, torch.float64, s.device).expand(1)
    prefix = torch.cat([zero, torch.cumsum(s, dim=0)])
    return Ranking(
        order=order,
        sorted_scores=s,
        prefix_sums=prefix,
        num_eligible=num_eligible,
        batch_size=batch_size,
        row_width=row_width,
        is_tree=is_tree,
    )


_SCORE_SHIFT = 1 << 31
"""The score part of the int64 sort key is scaled by this; the tie-break part stays below it."""


def _monotone_float_bits(x: torch.Tensor) -> torch.Tensor:  # same shape, int32
    """Order-preserving map of float32 values (no NaN) to int32; ``-0.0`` and ``0.0`` tie.

    Non-negative floats keep their bit pattern; a negative float of magnitude bits ``m >= 1``
    maps to ``-1 - m``.

    Examples
    --------
    >>> _monotone_float_bits(torch.tensor([-1.0, -0.0, 0.0, 1.0])).tolist()
    [-1065353217, 0, 0, 1065353216]
    """
    bits = (x.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0
    return (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)


def _score_image(
    scores: torch.Tensor,  # [num] float32, finite or -inf (no NaN, no +inf)
) -> tuple[torch.Tensor, int]:  # [num] int32, and the smallest sort key of a -inf score
    """Monotone int32 image of sanitized float32 scores and the sort-key bound of ``-inf``.

    :func:`_monotone_float_bits` of every score (negative scores and ``-0.0`` included), with no
    host sync: the planner's step stays asynchronous (overlap scheduling). Sort keys
    ``tie - (mono + 1) * 2**31`` with ``tie - 2**31`` in ``[-2**31, 0)`` (every candidate) are
    below the returned bound exactly for finite scores; a ``-inf`` score (roots included,
    whatever their tie) is at or above it.

    Examples
    --------
    >>> _score_image(torch.tensor([0.5, float("-inf")]))[0].tolist()
    [1056964608, -2139095041]
    >>> _score_image(torch.tensor([-0.5, float("-inf")]))[0].tolist()
    [-1056964609, -2139095041]
    """
    return _monotone_float_bits(scores), (0x7F800000 - 1) * _SCORE_SHIFT


@device_constant()
def _tie_base(batch_size: int, num_nodes: int, device) -> torch.Tensor:  # [total] int64, read-only
    """``flat_id - 2**31``, plus ``(num_nodes + 1) * total`` at the roots (cached constant).

    Added to ``depth * total`` it gives the tie-break part of :func:`rank_tree`'s sort key
    minus ``2**31``, with the roots at depth ``num_nodes + 1`` (after every candidate). A root
    that is not reachable (a corrupt tree) lands even higher, past ``2**31``: still after
    every candidate, and the roots are cut off anyway.
    """
    total = batch_size * num_nodes
    base = torch.arange(total, dtype=torch.int64, device=device) - _SCORE_SHIFT
    base.view(batch_size, num_nodes)[:, 0] += (num_nodes + 1) * total
    return base


@device_constant()
def _col_to_row_major(rows: int, cols: int, device) -> torch.Tensor:  # [rows * cols], read-only
    """Row-major flat id of each column-major position (cached; never modify it)."""
    ids = torch.arange(rows * cols, dtype=torch.int64, device=device)
    return ids.view(rows, cols).t().reshape(-1)


def _sanitize(scores: torch.Tensor) -> torch.Tensor:
    # NaN and +-inf -> -inf (a new tensor).
    inf = float("-inf")
    return torch.nan_to_num(scores.float(), nan=inf, posinf=inf, neginf=inf)


def rank_chain(
    scores: torch.Tensor,  # [batch_size, num_draft_slots]
) -> Ranking:
    """Rank the draft slots of a batch of chains.

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch_size, num_draft_slots]`` survival scores (bonus slot excluded); non-finite
        entries are ineligible, and so is every later slot of the same request.

    Returns
    -------
    Ranking

    Examples
    --------
    Ties at score 1 go to the shallower slot first, then to the lower request::

        >>> r = rank_chain(torch.tensor([[1.0, 1.0], [1.0, 0.5]]))
        >>> r.order.tolist(), r.prefix_sums.tolist()
        ([0, 2, 1, 3], [0.0, 1.0, 2.0, 3.0, 3.5])
    """
    bs, k = scores.shape
    s = torch.cummin(_sanitize(scores), dim=1).values
    # Column-major flattening is (depth asc, request asc); a stable sort on the score keeps it.
    col_major = s.t().reshape(-1)
    perm = torch.sort(col_major, descending=True, stable=True).indices
    # Column-major position j * bs + b -> flat slot id b * k + j (a cached per-shape table).
    order = _col_to_row_major(bs, k, scores.device).index_select(0, perm)
    return _finish_ranking(order, s.reshape(-1), bs, k, is_tree=False)


def rank_tree(
    scores: torch.Tensor,  # [batch_size, num_nodes], root column ignored
    topology: TreeTopology,
    candidate_mask: Optional[torch.Tensor] = None,  # [batch_size, num_nodes] bool
) -> Ranking:
    """Rank the non-root nodes of a batch of trees.

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch_size, num_nodes]`` path-product survival scores (node 0 = root, ignored).
    topology : TreeTopology
        Parents and depths; nodes not linked to the root are ineligible.
    candidate_mask : torch.Tensor, optional
        ``[batch_size, num_nodes]`` bool; nodes outside it (and their descendants) are
        ineligible, e.g. padding nodes.

    Returns
    -------
    Ranking

    Examples
    --------
    Root 0 -> {1, 2}, 1 -> {3}; node 3 ties with its parent and ranks right after it::

        >>> topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1]]))
        >>> rank_tree(torch.tensor([[1.0, 0.5, 0.25, 0.5]]), topo).order.tolist()
        [1, 3, 2]
    """
    bs, n = scores.shape
    device = scores.device
    reachable = topology.reachable_shared()
    s = torch.where(reachable, scores.float(), _constant(float("-inf"), torch.float32, device))
    if candidate_mask is not None:
        s.masked_fill_(~candidate_mask.to(torch.bool), float("-inf"))
    inf = float("-inf")
    s.nan_to_num_(nan=inf, posinf=inf, neginf=inf)  # non-finite scores are ineligible
    # Running minimum along root paths; the root does not constrain (+inf, the identity).
    # Path-product survival scores are already non-increasing from parent to child (and an
    # ineligible node's descendants are ineligible), so one parent comparison usually
    # replaces the pointer-jumping minimum. ``jumps[0]`` equals the parent array on reachable
    # non-root nodes and points the root to itself; unreachable nodes (score -inf) pass the
    # comparison wherever they point.
    s.select(1, 0).fill_(float("inf"))
    up = topology.jumps[0] if topology.jumps else topology.parent.clamp(min=0)
    # ``all(s <= s[up])`` as one elementwise min and an equality test (-0.0 == 0.0 there).
    if not torch.equal(torch.minimum(s, s.gather(1, up)), s):
        s = path_reduce(s, topology, "min")
    s.select(1, 0).fill_(float("-inf"))  # roots are not candidates
    if (n + 2) * bs * n >= 1 << 31:
        raise ValueError(f"rank_tree: batch too large for the sort key (bs={bs}, nodes={n})")
    # One int64 sort key over the flat layout,
    #     key = tie - (mono + 1) * 2**31,  tie = depth * (bs * n) + flat_id in [0, 2**31),
    # ascending in (score desc, depth asc, request asc, node asc), where ``mono`` is a
    # monotone integer image of the float32 score. Unreachable nodes take depth n, so they
    # sort after every reachable node of the same score; roots (score -inf, depth n + 1)
    # sort after everything and are cut off.
    depth = torch.where(reachable, topology.depth, _constant(n, torch.int64, device))
    tie_shifted = torch.add(_tie_base(bs, n, device), depth.view(-1), alpha=bs * n)
    mono, ineligible_key_min = _score_image(s.view(-1))
    key = torch.add(tie_shifted, mono, alpha=-_SCORE_SHIFT)
    sorted_key, perm = torch.sort(key)
    order = perm[: bs * (n - 1)]
    # Keys below the smallest key of a -inf score belong to eligible (finite) candidates.
    num_eligible = torch.searchsorted(sorted_key, ineligible_key_min)
    return _finish_ranking(order, s.view(-1), bs, n, is_tree=True, num_eligible=num_eligible)


def top_sums(
    ranking: Ranking,
    keep_counts: torch.Tensor,  # [num_tiers] int64, each in [0, num_candidates]
) -> torch.Tensor:  # [num_tiers] float64
    """Sum of the ``keep`` best (eligible) scores for each keep count.

    Parameters
    ----------
    ranking : Ranking
    keep_counts : torch.Tensor
        ``[num_tiers]`` keep counts (draft slots, bonus excluded).

    Returns
    -------
    torch.Tensor
        ``[num_tiers]`` float64 ``S(keep)``.

    Examples
    --------
    >>> top_sums(rank_chain(torch.tensor([[0.5, 0.25], [0.75, 0.125]])),
    ...          torch.tensor([0, 1, 2, 4])).tolist()
    [0.0, 0.75, 1.25, 1.625]
    """
    idx = keep_counts.to(device=ranking.prefix_sums.device, dtype=torch.int64)
    idx = idx.clamp(0, ranking.num_candidates)
    return ranking.prefix_sums[idx]


def select(
    ranking: Ranking,
    budget: int,
) -> torch.Tensor:  # [batch_size * row_width] bool
    """Flat kept mask of the ``budget`` best candidates (ineligible ones excluded).

    Parameters
    ----------
    ranking : Ranking
    budget : int
        Draft slots to keep across the batch (bonus/root excluded), ``>= 0``.

    Returns
    -------
    torch.Tensor
        ``[batch_size * row_width]`` bool over the flat score layout (roots False).

    Examples
    --------
    >>> select(rank_chain(torch.tensor([[0.9, 0.5], [0.8, 0.1]])), 2).tolist()
    [True, False, True, False]
    """
    budget = max(0, min(int(budget), ranking.num_candidates))
    return _select(ranking, torch.clamp(ranking.num_eligible, max=budget))


def _select(
    ranking: Ranking,
    num_kept: torch.Tensor,  # 0-d int64, min(budget, num_eligible)
    out: Optional[torch.Tensor] = None,  # [batch_size * row_width] bool, fresh, roots preset
) -> torch.Tensor:  # [batch_size * row_width] bool
    """:func:`select` given the kept count (device tensor, no host sync).

    Writes into ``out`` when given (its non-candidate entries, the roots, are left as they are).
    """
    device = ranking.order.device
    take = _node_ids(ranking.num_candidates, device) < num_kept
    if out is None:
        out = torch.zeros(ranking.batch_size * ranking.row_width, dtype=torch.bool, device=device)
    return out.scatter_(0, ranking.order, take)


@device_constant()
def _root_mask(batch_size: int, num_nodes: int, device) -> torch.Tensor:  # [total] bool, read-only
    mask = torch.zeros((batch_size, num_nodes), dtype=torch.bool, device=device)
    mask[:, 0] = True
    return mask.view(-1)


def _roots_only(batch_size: int, num_nodes: int, device) -> torch.Tensor:
    """A fresh ``[batch_size * num_nodes]`` bool mask, True exactly at the roots."""
    return _root_mask(batch_size, num_nodes, device).clone()


def keep_lens_from_selection(
    selected: torch.Tensor,  # [batch_size * num_draft_slots] bool
    batch_size: int,
    row_width: Optional[int] = None,
) -> torch.Tensor:  # [batch_size] int64
    """Kept drafts per chain (a prefix length, bonus excluded) from a flat chain selection.

    ``row_width`` (``num_draft_slots``) is needed only for an empty batch.

    Examples
    --------
    >>> keep_lens_from_selection(torch.tensor([True, False, True, True]), 2).tolist()
    [1, 2]
    """
    return selected.view(batch_size, -1 if row_width is None else row_width).sum(dim=1)


def keep_mask_from_selection(
    selected: torch.Tensor,  # [batch_size * num_nodes] bool
    batch_size: int,
    row_width: Optional[int] = None,
) -> torch.Tensor:  # [batch_size, num_nodes] bool
    """Kept-node mask of trees (root always kept) from a flat tree selection.

    ``row_width`` (``num_nodes``) is needed only for an empty batch.

    Examples
    --------
    >>> keep_mask_from_selection(torch.tensor([False, True, False, False]), 1).tolist()
    [[True, True, False, False]]
    """
    mask = selected.view(batch_size, -1 if row_width is None else row_width).clone()
    mask[:, 0] = True
    return mask

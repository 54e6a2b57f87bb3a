"""Global top-K selection of draft nodes across a batch (pure torch).

Given survival scores for every candidate node of a batch, D-Cut keeps the K best candidates
across the whole batch (ALGORITHMS.md B.3, B.8). Candidates are ranked by

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

from sglang_ext.dcut.tree import TreeTopology, path_reduce

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
    flat_scores: torch.Tensor,  # [batch_size * row_width], -inf = ineligible
    batch_size: int,
    row_width: int,
    is_tree: bool,
) -> Ranking:
    s = flat_scores.index_select(0, order).to(torch.float64)
    eligible = s > float("-inf")
    s = torch.where(eligible, s, torch.zeros_like(s))
    prefix = torch.zeros(s.shape[0] + 1, dtype=torch.float64, device=s.device)
    prefix[1:] = torch.cumsum(s, dim=0)
    return Ranking(
        order=order,
        sorted_scores=s,
        prefix_sums=prefix,
        num_eligible=eligible.sum(),
        batch_size=batch_size,
        row_width=row_width,
        is_tree=is_tree,
    )


_FLOAT_KEY_MAX = (1 << 32) - 1


def _float_key(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving map of float32 values (no NaN) to int64 in ``[0, 2**32)``."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    mono = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF))  # -0.0 and 0.0 both map to 0
    return mono + (1 << 31)


def _sanitize(scores: torch.Tensor) -> torch.Tensor:
    scores = scores.float()
    return torch.where(torch.isfinite(scores), scores, torch.full_like(scores, float("-inf")))


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
    j = torch.div(perm, bs, rounding_mode="floor")
    b = perm - j * bs
    order = b * k + j
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
    scores = scores.float()
    eligible = topology.reachable & torch.isfinite(scores)
    if candidate_mask is not None:
        eligible &= candidate_mask.to(torch.bool)
    s = torch.where(eligible, scores, float("-inf"))
    # Running minimum along root paths; the root does not constrain (+inf, the identity).
    # Path-product survival scores are already non-increasing from parent to child (and an
    # ineligible node's descendants are ineligible), so one parent comparison usually
    # replaces the pointer-jumping minimum.
    s[:, 0] = float("inf")
    if not bool((s <= s.gather(1, topology.parent.clamp(min=0))).all()):
        s = path_reduce(s, topology, "min")
    s[:, 0] = float("-inf")  # roots are not candidates
    # One int64 sort key: score descending (monotone integer image of the float32 score) in
    # the high 32 bits, then (depth asc, request asc, node asc) in the low 31 bits.
    # Unreachable nodes sort after every reachable one, roots after everything.
    depth = torch.where(topology.reachable, topology.depth, torch.full_like(topology.depth, n))
    depth[:, 0] = n + 1
    flat_id = torch.arange(bs * n, device=device, dtype=torch.int64)
    key2 = depth.reshape(-1) * (bs * n) + flat_id
    if (n + 2) * bs * n >= 1 << 31:
        raise ValueError(f"rank_tree: batch too large for the sort key (bs={bs}, nodes={n})")
    flat_s = s.reshape(-1)
    key = ((_FLOAT_KEY_MAX - _float_key(flat_s)) << 31) | key2
    order = torch.sort(key).indices[: bs * (n - 1)]
    return _finish_ranking(order, flat_s, bs, n, is_tree=True)


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
    device = ranking.order.device
    take = torch.arange(ranking.num_candidates, device=device) < budget
    take &= torch.arange(ranking.num_candidates, device=device) < ranking.num_eligible
    flat = torch.zeros(ranking.batch_size * ranking.row_width, dtype=torch.bool, device=device)
    return flat.scatter_(0, ranking.order, take)


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

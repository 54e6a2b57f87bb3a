"""The D-Cut planner: scores -> tier -> global top-K plan for one decode step (pure torch).

:func:`choose` is the single entry point the SGLang glue, tools and tests call. It ranks all
candidate draft nodes of the batch once, picks the verify tier (auto objective, fixed ratio,
fallback or off) and returns a :class:`DCutPlan` with per-request keep lengths (chains) or
kept-node masks (trees). See ``tiers.py`` for the keep-count convention and ``tree.py`` for
the glossary of shape names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence, Union

import torch

from sglang_ext.dcut.budget import (
    Ranking,
    _roots_only,
    _select,
    keep_lens_from_selection,
    rank_chain,
    rank_tree,
)
from sglang_ext.dcut.cost_table import CostTable
from sglang_ext.dcut.tiers import (
    DEFAULT_TIERS,
    FALLBACK_RATIO,
    as_fraction,
    best_utility_index,
    keep_count,
    scan_budget,
    smallest_fitting_tier,
    tier_keep_counts,
)
from sglang_ext.dcut.tree import TreeTopology, device_constant

logger = logging.getLogger("sglang_ext.dcut")

__all__ = [
    "MODE_AUTO",
    "MODE_OFF",
    "MODE_RATIO",
    "MODE_FALLBACK",
    "MODE_SCAN",
    "DCutPlan",
    "choose",
    "choose_scan",
    "reset_fallback_warning",
]

MODE_AUTO = "auto"
MODE_OFF = "off"
MODE_RATIO = "ratio"
MODE_FALLBACK = "fallback"
MODE_SCAN = "scan"

_fallback_warned = False


def reset_fallback_warning() -> None:
    """Re-arm the one-time fallback warning (for tests and long-lived tools).

    Examples
    --------
    >>> reset_fallback_warning()
    """
    global _fallback_warned
    _fallback_warned = False


def _warn_fallback_once(message: str) -> None:
    global _fallback_warned
    if not _fallback_warned:
        _fallback_warned = True
        logger.warning(message)


@dataclass(frozen=True)
class DCutPlan:
    """What to verify in one decode step.

    Attributes
    ----------
    tier_index : int
        Index into the tiers of the verify graph to run (auto: the chosen tier; fixed ratio and
        fallback: the smallest tier whose keep count fits; off: the 1.0 tier), ``NO_TIER`` when
        none fits. For :func:`choose_scan`, the index of the chosen captured width.
    ratio : float
        Ratio behind ``budget`` (bonus-inclusive: ``ceil(bs * N * ratio) = bs + budget``
        before clipping).
    budget : int
        Draft slots to keep across the batch (bonus/root slots excluded), host-known.
    verify_width : int
        ``bs + budget``: target tokens of the verify forward (bonus-inclusive).
    keep_lens : torch.Tensor or None
        Chains: ``[batch_size]`` int64 kept drafts per request (a prefix, root excluded);
        verify length = ``keep_lens + 1``. ``None`` for trees.
    keep_mask : torch.Tensor or None
        Trees: ``[batch_size, num_nodes]`` bool kept nodes, ancestor-closed, roots True.
        ``None`` for chains.
    expected_accepted : torch.Tensor
        0-d float64: ``bs + sum(kept scores)``, expected committed tokens (bonus included).
    num_kept : torch.Tensor
        0-d int64 kept draft slots, ``<= budget`` (lower when candidates are ineligible).
    num_ineligible : torch.Tensor
        0-d int64 ineligible candidates (non-finite scores and their descendants).
    mode : str
        ``"auto"``, ``"ratio"``, ``"fallback"``, ``"off"`` or ``"scan"``.
    utilities : tuple of float or None
        Auto/scan mode: ``(bs + S_q) / C_q`` per tier (or width); else ``None``.
    profiled_batch_size : int or None
        Auto mode: the table row used (smallest profiled bs >= bs).
    """

    tier_index: int
    ratio: float
    budget: int
    verify_width: int
    keep_lens: Optional[torch.Tensor]
    keep_mask: Optional[torch.Tensor]
    expected_accepted: torch.Tensor
    num_kept: torch.Tensor
    num_ineligible: torch.Tensor
    mode: str
    utilities: Optional[tuple[float, ...]] = None
    profiled_batch_size: Optional[int] = None


def _rank(
    scores: torch.Tensor,
    topology: Optional[TreeTopology],
    candidate_mask: Optional[torch.Tensor],
) -> Ranking:
    if topology is None:
        if candidate_mask is not None:
            scores = torch.where(
                candidate_mask.to(torch.bool), scores.float(), torch.full_like(scores.float(), float("nan"))
            )
        return rank_chain(scores)
    return rank_tree(scores, topology, candidate_mask)


def _make_plan(
    ranking: Ranking,
    budget: int,
    tier_index: int,
    ratio: float,
    mode: str,
    utilities: Optional[Sequence[float]] = None,
    profiled_batch_size: Optional[int] = None,
) -> DCutPlan:
    bs = ranking.batch_size
    budget = max(0, min(int(budget), ranking.num_candidates))
    num_kept = torch.clamp(ranking.num_eligible, max=budget)
    if ranking.is_tree:  # roots are always kept
        device = ranking.order.device
        selected = _select(ranking, num_kept, out=_roots_only(bs, ranking.row_width, device))
        keep_lens, keep_mask = None, selected.view(bs, ranking.row_width)
    else:
        selected = _select(ranking, num_kept)
        keep_lens, keep_mask = keep_lens_from_selection(selected, bs, ranking.row_width), None
    return DCutPlan(
        tier_index=tier_index,
        ratio=float(ratio),
        budget=budget,
        verify_width=bs + budget,
        keep_lens=keep_lens,
        keep_mask=keep_mask,
        expected_accepted=torch.add(ranking.prefix_sums.select(0, budget), bs),
        num_kept=num_kept,
        num_ineligible=torch.rsub(ranking.num_eligible, ranking.num_candidates),
        mode=mode,
        utilities=None if utilities is None else tuple(float(u) for u in utilities),
        profiled_batch_size=profiled_batch_size,
    )


@device_constant(maxsize=256)
def _index_tensor(idx: tuple, device) -> torch.Tensor:  # [len(idx)] int64, read-only
    """Cached index tensor of the per-tier keep counts (the same every step)."""
    return torch.tensor(idx, dtype=torch.int64, device=device)


def _num_draft_tokens(scores: torch.Tensor, topology: Optional[TreeTopology], n: Optional[int]) -> int:
    if n is not None:
        return int(n)
    return scores.shape[1] if topology is not None else scores.shape[1] + 1


def choose(
    scores: torch.Tensor,  # chains: [batch_size, num_draft_slots]; trees: [batch_size, num_nodes]
    cost_table: Optional[CostTable],
    tiers: Optional[Sequence[float]] = None,
    mode: Union[str, float, Fraction] = MODE_AUTO,
    *,
    topology: Optional[TreeTopology] = None,
    num_draft_tokens: Optional[int] = None,
    candidate_mask: Optional[torch.Tensor] = None,  # same shape as scores, bool
) -> DCutPlan:
    """Plan one D-Cut step: pick the tier and keep the globally best draft nodes.

    Modes:

    * ``"auto"``: with ``bs'`` the smallest profiled batch size ``>= bs``, choose
      ``argmax_q (bs + S(keep_q)) / C(bs', rho_q)`` (exact ties: cheaper, then lower tier).
      Without a table, or without a row ``>= bs``, use the fallback ratio 0.75 as a fixed
      ratio and log a warning once (logger ``"sglang_ext.dcut"``).
    * a ratio in ``(0, 1]`` (float, ``Fraction`` or numeric string): keep
      ``ceil(bs * N * ratio) - bs`` slots (clipped); ``tier_index`` is the smallest tier
      that fits; no table is needed.
    * ``"off"``: ratio 1 (full verify).

    Candidates are ranked by (score desc, depth asc, request asc, node asc), so the plan is
    deterministic and ancestor-closed; non-finite scores are never kept.

    Parameters
    ----------
    scores : torch.Tensor
        Chains (``topology=None``): ``[batch_size, num_draft_slots]`` survival scores, bonus
        slot excluded. Trees: ``[batch_size, num_nodes]`` path-product scores, node 0 = root.
    cost_table : CostTable or None
        Profiled costs (auto mode only).
    tiers : sequence of float, optional
        Tier ratios; defaults to the table's tiers, else ``(0.25, 0.5, 0.75, 1.0)``. Must equal
        the table's tiers when both are given.
    mode : str, float or Fraction
        ``"auto"``, ``"off"`` or a fixed ratio.
    topology : TreeTopology, optional
        Tree structure; ``None`` means chains.
    num_draft_tokens : int, optional
        ``N`` for the keep counts; defaults to ``num_draft_slots + 1`` (chains) or
        ``num_nodes`` (trees). Set it when scoring a wider candidate pool (B.8).
    candidate_mask : torch.Tensor, optional
        Bool, same shape as ``scores``; False entries (and their descendants) are never kept.

    Returns
    -------
    DCutPlan

    Raises
    ------
    ValueError
        On an unknown mode, a ratio outside ``(0, 1]``, or tiers that differ from the table's.

    Examples
    --------
    Two chains of 3 drafts (N = 4), fixed ratio 0.5: width ``ceil(2 * 4 * 0.5) = 4`` tokens,
    so 2 drafts are kept, the two best slots::

        >>> s = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])
        >>> p = choose(s, None, mode=0.5)
        >>> p.budget, p.keep_lens.tolist(), p.tier_index, round(float(p.expected_accepted), 6)
        (2, [2, 0], 1, 3.7)
    """
    bs = scores.shape[0]
    n = _num_draft_tokens(scores, topology, num_draft_tokens)
    if tiers is None:
        tiers = cost_table.tiers if cost_table is not None else DEFAULT_TIERS
    tiers = tuple(float(t) for t in tiers)
    if cost_table is not None and tuple(cost_table.tiers) != tiers:
        raise ValueError(f"D-Cut tiers {list(tiers)} differ from the cost table's {list(cost_table.tiers)}")
    tier_keeps = tier_keep_counts(bs, n, tiers)

    if isinstance(mode, str) and mode.strip().lower() in (MODE_AUTO, MODE_OFF):
        mode_name = mode.strip().lower()
    else:
        mode_name = MODE_RATIO
        ratio = as_fraction(mode)  # raises ValueError on junk / out of range

    ranking = _rank(scores, topology, candidate_mask)

    if mode_name == MODE_AUTO:
        row = cost_table.lookup(bs) if cost_table is not None else None
        if row is not None:
            profiled_bs, costs = row
            # S(keep) per tier: one gather from the prefix sums and one host read.
            idx = tuple(min(k, ranking.num_candidates) for k in tier_keeps)
            sums = ranking.prefix_sums.index_select(0, _index_tensor(idx, scores.device)).tolist()
            utilities = [(bs + s) / c for s, c in zip(sums, costs)]
            q = best_utility_index(utilities, costs)
            return _make_plan(
                ranking, tier_keeps[q], q, tiers[q], MODE_AUTO, utilities, profiled_bs
            )
        if cost_table is None:
            _warn_fallback_once(
                f"D-Cut: no cost table; fallback ratio {FALLBACK_RATIO}"
            )
        else:
            _warn_fallback_once(
                f"D-Cut: no profiled cost for bs={bs} (largest profiled "
                f"bs={cost_table.batch_sizes[-1]}); fallback ratio {FALLBACK_RATIO}"
            )
        mode_name, ratio = MODE_FALLBACK, as_fraction(FALLBACK_RATIO)
    elif mode_name == MODE_OFF:
        ratio = Fraction(1)

    budget = keep_count(bs, n, ratio)
    return _make_plan(
        ranking, budget, smallest_fitting_tier(budget, tier_keeps), float(ratio), mode_name
    )


def choose_scan(
    scores: torch.Tensor,  # chains: [batch_size, num_draft_slots]; trees: [batch_size, num_nodes]
    widths: Sequence[int],
    costs_ms: Sequence[float],
    *,
    topology: Optional[TreeTopology] = None,
    num_draft_tokens: Optional[int] = None,
    candidate_mask: Optional[torch.Tensor] = None,
) -> DCutPlan:
    """Opt-in budget scan over every captured verify width (staircase-aware argmax).

    Evaluates ``(bs + S(w - bs)) / cost(w)`` at each captured width ``w`` (tokens,
    bonus-inclusive) and keeps the best; see :func:`sglang_ext.dcut.tiers.scan_budget`.

    Parameters
    ----------
    scores : torch.Tensor
        As for :func:`choose`.
    widths : sequence of int
        Captured verify widths in tokens.
    costs_ms : sequence of float
        Step cost of each width.
    topology, num_draft_tokens, candidate_mask
        As for :func:`choose`.

    Returns
    -------
    DCutPlan
        ``tier_index`` is the index of the chosen width, ``mode`` is ``"scan"``.

    Examples
    --------
    >>> s = torch.tensor([[0.9, 0.6, 0.5], [0.8, 0.1, 0.1]])
    >>> p = choose_scan(s, [2, 4, 8], [1.0, 1.2, 2.0])
    >>> p.budget, p.tier_index, p.keep_lens.tolist()
    (2, 1, [1, 1])
    """
    bs = scores.shape[0]
    n = _num_draft_tokens(scores, topology, num_draft_tokens)
    ranking = _rank(scores, topology, candidate_mask)
    max_keep = min(ranking.num_candidates, bs * (n - 1))
    prefix = ranking.prefix_sums[: max_keep + 1].tolist()
    keep, idx = scan_budget(prefix, bs, max_keep, widths, costs_ms)
    utilities = [
        (bs + prefix[min(max_keep, w - bs)]) / float(c) if w >= bs else float("-inf")
        for w, c in zip(widths, costs_ms)
    ]
    return _make_plan(ranking, keep, idx, (bs + keep) / (bs * n), MODE_SCAN, utilities)

"""The D-Cut planner: scores -> tier -> global top-K plan for one decode step (pure torch).

:func:`choose` is the single entry point the SGLang glue, tools and tests call. It ranks all
candidate draft nodes of the batch once, picks the verify tier (auto objective, fixed ratio,
fallback or off) and returns a :class:`DCutPlan` with per-request keep lengths (chains) or
kept-node masks (trees). See ``tiers.py`` for the keep-count convention and ``tree.py`` for
the glossary of shape names.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence, Union

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
    NO_TIER,
    as_fraction,
    best_utility_index,
    keep_count,
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
    "DCutMode",
    "TIER_POLICIES",
    "PolicyInput",
    "TierChoice",
    "DCutPlan",
    "choose",
    "parse_mode",
    "forward_costs",
    "reset_fallback_warning",
]

MODE_AUTO = "auto"
MODE_OFF = "off"
MODE_RATIO = "ratio"
MODE_FALLBACK = "fallback"

DCutMode = Union[str, float]
"""A configured D-Cut mode (``--dcut``, ``DCutConfig.mode``, ``choose(mode=...)``): the name of a
user tier policy (a key of :data:`TIER_POLICIES`: ``"off"``, ``"auto"``), or a fixed ratio in
``(0, 1]`` as a float (:func:`parse_mode` normalizes any spelling to one of these)."""

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

    The plan covers the whole batch: ``batch_size`` requests, ``num_exempt`` of them verified in
    full (their whole tree or block, see ``exempt`` in :func:`choose`), the others pruned to the
    globally best draft nodes. Widths and costs are those of the real verify forward (exempt
    requests included).

    Attributes
    ----------
    tier_index : int
        Index into ``tiers`` of the verify tier to run (auto: the chosen tier; fixed ratio and
        fallback: the smallest tier whose keep count fits; off: the 1.0 tier), ``NO_TIER`` when
        none fits.
    ratio : float
        Ratio behind ``budget`` (bonus-inclusive: ``ceil(nb * N * ratio) = nb + budget`` before
        clipping, ``nb`` the scored requests).
    budget : int
        Draft slots to keep across the scored requests (bonus/root slots excluded), host-known.
    verify_width : int
        Target tokens the kept nodes need (bonus-inclusive): ``nb + budget`` plus ``N`` per
        exempt request.
    keep_lens : torch.Tensor or None
        Chains: ``[batch_size]`` int64 kept drafts per request (a prefix, root excluded; ``N - 1``
        for exempt requests); verify length = ``keep_lens + 1``. ``None`` for trees.
    keep_mask : torch.Tensor or None
        Trees: ``[batch_size, num_nodes]`` bool kept nodes, ancestor-closed, roots True, every
        node of an exempt request True. ``None`` for chains.
    expected_accepted : torch.Tensor
        0-d float64: expected committed tokens of the step (bonus included): ``bs + sum(kept
        scores)``, exempt requests' drafts included.
    num_kept : torch.Tensor
        0-d int64 kept draft slots of the scored requests, ``<= budget`` (lower when candidates
        are ineligible).
    num_ineligible : torch.Tensor
        0-d int64 ineligible candidates of the scored requests (non-finite scores and their
        descendants).
    mode : str
        ``"auto"``, ``"ratio"``, ``"fallback"`` or ``"off"`` (the policy that decided).
    utilities : tuple of float or None
        Auto mode: ``(expected committed tokens) / (predicted cost)`` per tier; else ``None``.
    profiled_batch_size : int or None
        Auto mode: the table row used (smallest profiled bs >= ``batch_size``, else the largest).
    tiers : tuple of float
        The tier ratios ``tier_index`` refers to.
    tier_widths : tuple of int
        Rows of the verify forward at each tier: the scored requests' tier width
        ``ceil(nb * N * rho)`` plus ``N`` rows per exempt request.
    tier_costs_ms : tuple of float or None
        Auto mode: predicted cost of the forward at each tier (:func:`forward_costs`); else None.
    tier_expected : tuple of float or None
        Auto mode: expected committed tokens of the step at each tier, ``bs + S(keep_q)`` (exempt
        requests' drafts included; what the draft-off choice learns from, see
        :func:`observe_draft_gains`); else None.
    num_draft_tokens : int
        ``N``.
    num_exempt : int
        Requests verified in full.

    Examples
    --------
    >>> p = choose(torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]]), None, mode=0.5)
    >>> p.forward_width, p.tier_label, p.prunes, p.predicted_ms
    (4, '0.5', True, None)
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
    tiers: tuple[float, ...] = ()
    tier_widths: tuple[int, ...] = ()
    tier_costs_ms: Optional[tuple[float, ...]] = None
    num_draft_tokens: int = 0
    num_exempt: int = 0
    tier_expected: Optional[tuple[float, ...]] = None

    @property
    def batch_size(self) -> int:
        """Requests of the step (scored and exempt)."""
        k = self.keep_lens if self.keep_lens is not None else self.keep_mask
        return int(k.shape[0])

    @property
    def prunes(self) -> bool:
        """Whether any draft slot of a scored request is left out (False: verify in full)."""
        scored = self.batch_size - self.num_exempt
        return self.budget < scored * (self.num_draft_tokens - 1)

    @property
    def forward_width(self) -> int:
        """Rows of the verify forward: the tier's width (``verify_width`` without a tier)."""
        if self.tier_index == NO_TIER or not self.tier_widths:
            return self.verify_width
        return self.tier_widths[self.tier_index]

    @property
    def predicted_ms(self) -> Optional[float]:
        """Predicted cost of the verify step at ``tier_index`` (auto mode only, else None)."""
        if self.tier_costs_ms is None or self.tier_index == NO_TIER:
            return None
        return self.tier_costs_ms[self.tier_index]

    @property
    def tier_label(self) -> str:
        """Metrics key of the tier: ``"0.5"``, ``"ratio:0.6"`` (no tier fits), with a
        ``"fallback:"`` prefix in fallback mode."""
        if self.tier_index != NO_TIER and self.tiers:
            name = f"{self.tiers[self.tier_index]:g}"
        else:
            name = f"ratio:{self.ratio:g}"
        return f"{MODE_FALLBACK}:{name}" if self.mode == MODE_FALLBACK else name

    def at_tier(self, tier_index: int) -> "DCutPlan":
        """This plan with another tier (e.g. TP rank 0's, see the glue's ``agree_across_ranks``).

        Examples
        --------
        >>> p = choose(torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]]), None, mode=0.5)
        >>> q = p.at_tier(2)
        >>> q.tier_label, q.forward_width
        ('0.75', 6)
        """
        return dataclasses.replace(self, tier_index=int(tier_index))


@dataclass(frozen=True)
class PolicyInput:
    """What a tier policy sees for one step (host values; the ranking lives on the device).

    ``tier_keeps[q]`` draft slots of the scored requests are kept at tier ``q`` and the forward
    then has ``tier_widths[q]`` rows; ``exempt_accepted`` (0-d float64, device) is the expected
    accepted drafts of the exempt requests (None without any). A policy is a function
    ``PolicyInput -> TierChoice`` listed in :data:`TIER_POLICIES`.
    """

    ranking: Ranking
    batch_size: int
    num_exempt: int
    num_draft_tokens: int
    tiers: tuple[float, ...]
    tier_keeps: tuple[int, ...]
    tier_widths: tuple[int, ...]
    cost_table: Optional[CostTable]
    exempt_accepted: Optional[torch.Tensor] = None

    @property
    def num_scored(self) -> int:
        """Requests whose drafts compete for the budget."""
        return self.batch_size - self.num_exempt


@dataclass(frozen=True)
class TierChoice:
    """A tier policy's decision: keep ``budget`` draft slots and run tier ``tier_index``."""

    budget: int
    tier_index: int
    ratio: float
    mode: str
    utilities: Optional[tuple[float, ...]] = None
    profiled_batch_size: Optional[int] = None
    tier_costs_ms: Optional[tuple[float, ...]] = None
    tier_expected: Optional[tuple[float, ...]] = None


def forward_costs(
    forward_widths: Sequence[int],
    full_batch_widths: Sequence[int],
    costs_ms: Sequence[float],
) -> list[float]:
    """Predicted cost of a verify forward of each tier's width (the cost staircase).

    ``costs_ms[j]`` is the profiled cost of tier ``j`` of the whole batch, whose forward has
    ``full_batch_widths[j]`` rows. A forward of ``w`` rows costs what the smallest tier
    ``j >= q`` with ``full_batch_widths[j] >= w`` costs (the tier graph it runs in). Without
    exempt requests ``forward_widths == full_batch_widths`` and the costs are the table's.

    Parameters
    ----------
    forward_widths : sequence of int
        Rows of the forward at each tier (exempt blocks included), ``>= full_batch_widths``.
    full_batch_widths : sequence of int
        ``bs + keep_count(bs, N, rho_j)`` per tier (``ceil(bs * N * rho_j)`` clipped to
        ``[bs, bs * N]``), non-decreasing.
    costs_ms : sequence of float
        The cost-table row.

    Returns
    -------
    list of float

    Examples
    --------
    4 requests of N = 8, one of them exempt (8 rows): tier 0.5 keeps 12 rows of the other 3,
    so its forward has 20 rows and runs in the 0.75 tier of the batch (24 rows)::

        >>> forward_costs([14, 20, 26, 32], [8, 16, 24, 32], [1.0, 2.0, 3.0, 4.0])
        [2.0, 3.0, 4.0, 4.0]
    """
    out = []
    last = len(full_batch_widths) - 1
    for q, w in enumerate(forward_widths):
        j = q
        while j < last and full_batch_widths[j] < w:
            j += 1
        out.append(float(costs_ms[j]))
    return out


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


def _exempt_mask(
    exempt: Optional[Sequence[bool]], batch_size: int, device
) -> tuple[Optional[torch.Tensor], int]:  # ([batch_size] bool or None, count)
    if exempt is None:
        return None, 0
    flags = [bool(x) for x in exempt]
    if len(flags) != batch_size:
        raise ValueError(f"D-Cut: {len(flags)} exemption flags for a batch of {batch_size}")
    count = sum(flags)
    if count == 0:
        return None, 0
    return torch.tensor(flags, dtype=torch.bool, device=device), count


def _exempt_accepted(
    scores: torch.Tensor,  # chains: [batch_size, num_draft_slots]; trees: [batch_size, num_nodes]
    topology: Optional[TreeTopology],
    exempt_rows: torch.Tensor,  # [batch_size] bool
) -> torch.Tensor:  # 0-d float64
    """Expected accepted drafts of the exempt requests: the sum of their finite draft scores."""
    s = scores.to(torch.float64)
    take = exempt_rows.view(-1, 1) & torch.isfinite(s)
    if topology is not None:  # non-root nodes linked to the root
        take = take & topology.reachable_shared()
        take[:, 0] = False
    return torch.where(take, s, torch.zeros_like(s)).sum()


def _make_plan(
    ranking: Ranking,
    choice: TierChoice,
    inp: PolicyInput,
    exempt_rows: Optional[torch.Tensor],  # [batch_size] bool
) -> DCutPlan:
    bs = ranking.batch_size
    budget = max(0, min(int(choice.budget), ranking.num_candidates))
    num_kept = torch.clamp(ranking.num_eligible, max=budget)
    if ranking.is_tree:  # roots are always kept
        device = ranking.order.device
        selected = _select(ranking, num_kept, out=_roots_only(bs, ranking.row_width, device))
        keep_lens, keep_mask = None, selected.view(bs, ranking.row_width)
        if exempt_rows is not None:  # every node of an exempt request
            keep_mask.masked_fill_(exempt_rows.view(-1, 1), True)
        exempt_slots = inp.num_exempt * (ranking.row_width - 1)
    else:
        selected = _select(ranking, num_kept)
        keep_lens, keep_mask = keep_lens_from_selection(selected, bs, ranking.row_width), None
        if exempt_rows is not None:  # the whole chain of an exempt request
            keep_lens = keep_lens.masked_fill(exempt_rows, ranking.row_width)
        exempt_slots = inp.num_exempt * ranking.row_width
    expected = torch.add(ranking.prefix_sums.select(0, budget), bs)
    if inp.exempt_accepted is not None:
        expected = expected + inp.exempt_accepted
    return DCutPlan(
        tier_index=choice.tier_index,
        ratio=float(choice.ratio),
        budget=budget,
        verify_width=bs + budget + exempt_slots,
        keep_lens=keep_lens,
        keep_mask=keep_mask,
        expected_accepted=expected,
        num_kept=num_kept,
        num_ineligible=torch.rsub(ranking.num_eligible, ranking.num_candidates - exempt_slots),
        mode=choice.mode,
        utilities=choice.utilities,
        profiled_batch_size=choice.profiled_batch_size,
        tiers=inp.tiers,
        tier_widths=inp.tier_widths,
        tier_costs_ms=choice.tier_costs_ms,
        num_draft_tokens=inp.num_draft_tokens,
        num_exempt=inp.num_exempt,
        tier_expected=choice.tier_expected,
    )


@device_constant(maxsize=256)
def _index_tensor(idx: tuple, device) -> torch.Tensor:  # [len(idx)] int64, read-only
    """Cached index tensor of the per-tier keep counts (the same every step)."""
    return torch.tensor(idx, dtype=torch.int64, device=device)


def _num_draft_tokens(scores: torch.Tensor, topology: Optional[TreeTopology], n: Optional[int]) -> int:
    if n is not None:
        return int(n)
    return scores.shape[1] if topology is not None else scores.shape[1] + 1


# ----------------------------------------------------------------------------- tier policies
def _ratio_choice(inp: PolicyInput, ratio: Fraction, mode: str) -> TierChoice:
    """Keep ``ceil(nb * N * ratio) - nb`` slots of the scored requests; the smallest tier that fits."""
    budget = keep_count(inp.num_scored, inp.num_draft_tokens, ratio)
    return TierChoice(budget, smallest_fitting_tier(budget, inp.tier_keeps), float(ratio), mode)


def _policy_off(inp: PolicyInput) -> TierChoice:
    """``off``: ratio 1 (full verify)."""
    return _ratio_choice(inp, Fraction(1), MODE_OFF)


def _policy_auto(inp: PolicyInput) -> TierChoice:
    """``auto``: the tier of best expected committed tokens per predicted ms (fallback ratio
    0.75 without a cost table, warned once)."""
    table = inp.cost_table
    row = table.lookup(inp.batch_size) if table is not None else None
    if row is None:
        if table is None:
            _warn_fallback_once(f"D-Cut: no cost table; fallback ratio {FALLBACK_RATIO}")
        else:
            _warn_fallback_once(
                f"D-Cut: no profiled cost for bs={inp.batch_size} (largest profiled "
                f"bs={table.batch_sizes[-1]}); fallback ratio {FALLBACK_RATIO}"
            )
        return _ratio_choice(inp, as_fraction(FALLBACK_RATIO), MODE_FALLBACK)
    profiled_bs, costs = row
    bs, n = inp.batch_size, inp.num_draft_tokens
    full_widths = [bs + k for k in tier_keep_counts(bs, n, inp.tiers)]
    costs_q = forward_costs(inp.tier_widths, full_widths, costs)
    ranking = inp.ranking
    # S(keep) per tier: one gather from the prefix sums and one host read (the tier, hence the
    # forward's row count and its graph, must be known on the host).
    idx = tuple(min(k, ranking.num_candidates) for k in inp.tier_keeps)
    sums = ranking.prefix_sums.index_select(0, _index_tensor(idx, ranking.prefix_sums.device))
    if inp.exempt_accepted is not None:
        sums = sums + inp.exempt_accepted
    expected = [bs + s for s in sums.tolist()]
    utilities = [e / c for e, c in zip(expected, costs_q)]
    q = best_utility_index(utilities, costs_q)
    return TierChoice(inp.tier_keeps[q], q, inp.tiers[q], MODE_AUTO, tuple(utilities), profiled_bs,
                      tuple(costs_q), tuple(expected))


TIER_POLICIES: dict[str, Callable[[PolicyInput], TierChoice]] = {
    MODE_OFF: _policy_off,
    MODE_AUTO: _policy_auto,
}
"""The mode table: each user mode name (``--dcut NAME``) and the tier policy that runs it. A fixed
ratio (``--dcut 0.5``) is not a named policy. To add a tier policy, write a function
``PolicyInput -> TierChoice`` here and add its name to this table: the flag parser, the config
check and both runners take the modes from it."""


def parse_mode(value: Union[str, float, Fraction]) -> DCutMode:
    """Normalize a D-Cut mode: a name of :data:`TIER_POLICIES` (any case, surrounding spaces
    ignored) or a ratio in ``(0, 1]`` (number or numeric text) as a float.

    Raises
    ------
    ValueError
        On anything else (booleans, ``nan``, ratios outside ``(0, 1]``, unknown names).

    Examples
    --------
    >>> parse_mode(" Auto "), parse_mode("0.5"), parse_mode(1)
    ('auto', 0.5, 1.0)
    """
    if isinstance(value, str) and value.strip().lower() in TIER_POLICIES:
        return value.strip().lower()
    try:
        return float(as_fraction(value))
    except ValueError:
        raise ValueError(f"expected {', '.join(TIER_POLICIES)} or a ratio in (0, 1], got {value!r}") from None


def choose(
    scores: torch.Tensor,  # chains: [batch_size, num_draft_slots]; trees: [batch_size, num_nodes]
    cost_table: Optional[CostTable],
    tiers: Optional[Sequence[float]] = None,
    mode: Union[str, float, Fraction] = MODE_AUTO,
    *,
    topology: Optional[TreeTopology] = None,
    num_draft_tokens: Optional[int] = None,
    candidate_mask: Optional[torch.Tensor] = None,  # same shape as scores, bool
    exempt: Optional[Sequence[bool]] = None,  # [batch_size] host flags
) -> DCutPlan:
    """Plan one D-Cut step: pick the tier and keep the globally best draft nodes.

    Modes (:data:`TIER_POLICIES`, plus fixed ratios):

    * ``"auto"``: with ``bs'`` the smallest profiled batch size ``>= bs``, choose
      ``argmax_q (bs + S(keep_q)) / C_q`` (exact ties: cheaper, then lower tier), ``C_q`` the
      profiled cost of the forward of tier ``q`` (:func:`forward_costs`; the table's
      ``C(bs', rho_q)`` without exempt requests; a batch beyond the table uses its largest row,
      see ``CostTable.lookup``). Without a table, use the fallback ratio 0.75 as a fixed ratio
      and log a warning once (logger ``"sglang_ext.dcut"``).
    * a ratio in ``(0, 1]`` (float, ``Fraction`` or numeric string): keep
      ``ceil(nb * N * ratio) - nb`` slots (clipped, ``nb`` the scored requests);
      ``tier_index`` is the smallest tier that fits; no table is needed.
    * ``"off"``: ratio 1 (full verify).

    Requests flagged in ``exempt`` are verified in full: they are not ranked, keep every draft,
    add ``N`` rows to the forward at every tier, and count in the cost (batch size ``bs`` and
    forward width) and in the expected tokens (their finite draft scores) of the auto choice.

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
        A name of :data:`TIER_POLICIES` or a fixed ratio.
    topology : TreeTopology, optional
        Tree structure; ``None`` means chains.
    num_draft_tokens : int, optional
        ``N`` for the keep counts; defaults to ``num_draft_slots + 1`` (chains) or
        ``num_nodes`` (trees). Set it when scoring a wider candidate pool (B.8).
    candidate_mask : torch.Tensor, optional
        Bool, same shape as ``scores``; False entries (and their descendants) are never kept.
    exempt : sequence of bool, optional
        ``[batch_size]`` host flags: True = verify this request in full (grammar, logprobs,
        penalties).

    Returns
    -------
    DCutPlan

    Raises
    ------
    ValueError
        On an unknown mode, a ratio outside ``(0, 1]``, tiers that differ from the table's, or
        ``exempt`` of the wrong length.

    Examples
    --------
    Two chains of 3 drafts (N = 4), fixed ratio 0.5: width ``ceil(2 * 4 * 0.5) = 4`` tokens,
    so 2 drafts are kept, the two best slots::

        >>> s = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])
        >>> p = choose(s, None, mode=0.5)
        >>> p.budget, p.keep_lens.tolist(), p.tier_index, round(float(p.expected_accepted), 6)
        (2, [2, 0], 1, 3.7)

    Request 0 exempt: it keeps its 3 drafts; request 1 alone at ratio 0.5 keeps
    ``ceil(4 * 0.5) - 1 = 1`` draft, and the forward has ``2 + 4 = 6`` rows::

        >>> p = choose(s, None, mode=0.5, exempt=[True, False])
        >>> p.keep_lens.tolist(), p.forward_width
        ([3, 1], 6)
    """
    bs = scores.shape[0]
    n = _num_draft_tokens(scores, topology, num_draft_tokens)
    if tiers is None:
        tiers = cost_table.tiers if cost_table is not None else DEFAULT_TIERS
    tiers = tuple(float(t) for t in tiers)
    if cost_table is not None and tuple(cost_table.tiers) != tiers:
        raise ValueError(f"D-Cut tiers {list(tiers)} differ from the cost table's {list(cost_table.tiers)}")
    if isinstance(mode, str) and mode.strip().lower() in TIER_POLICIES:
        policy, ratio = TIER_POLICIES[mode.strip().lower()], None
    else:
        policy, ratio = None, as_fraction(mode)  # raises ValueError on junk / out of range

    exempt_rows, num_exempt = _exempt_mask(exempt, bs, scores.device)
    if exempt_rows is not None:
        rows = ~exempt_rows.view(-1, 1)
        candidate_mask = rows if candidate_mask is None else candidate_mask.to(torch.bool) & rows
        candidate_mask = candidate_mask.expand(scores.shape)
    nb = bs - num_exempt
    tier_keeps = tuple(tier_keep_counts(nb, n, tiers))
    inp = PolicyInput(
        ranking=_rank(scores, topology, candidate_mask),
        batch_size=bs,
        num_exempt=num_exempt,
        num_draft_tokens=n,
        tiers=tiers,
        tier_keeps=tier_keeps,
        tier_widths=tuple(nb + k + num_exempt * n for k in tier_keeps),
        cost_table=cost_table,
        exempt_accepted=None if exempt_rows is None else _exempt_accepted(scores, topology, exempt_rows),
    )
    choice = policy(inp) if policy is not None else _ratio_choice(inp, ratio, MODE_RATIO)
    return _make_plan(inp.ranking, choice, inp, exempt_rows)

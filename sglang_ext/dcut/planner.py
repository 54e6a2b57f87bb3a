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
import math
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
    "DRAFT_OFF_TIER",
    "DraftOffParams",
    "DraftOffState",
    "DraftOffDecision",
    "draft_off_decision",
    "observe_draft_gains",
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


# ----------------------------------------------------------------------------- draft-off steps
DRAFT_OFF_TIER = "draft_off"
"""Tier label (histogram key) of a draft-off step: no drafting, one verified token per request."""


@dataclass(frozen=True)
class DraftOffParams:
    """Tuning of the draft-off choice of ``--dcut auto`` (:func:`draft_off_decision`).

    Attributes
    ----------
    margin : float
        Hysteresis: the other choice must promise more than ``1 + margin`` times the committed
        tokens per ms of the current one before the server switches.
    min_dwell : int
        Steps a choice is kept at least after a switch. While drafting is off it is also the
        first number of draft-off steps before a *probe* step (one drafted step that refreshes
        the estimate, since a draft-off step yields no draft confidences).
    max_probe_interval : int
        Probe back-off: each probe that keeps drafting off doubles the number of draft-off steps
        before the next probe, up to this many (a probe costs a drafted step, about twice a
        draft-off one at high batch sizes); switching drafting on resets it to ``min_dwell``.
        ``max_probe_interval = min_dwell`` probes at a fixed interval.
    alpha : float
        Weight of the newest drafted step in the smoothed per-request gains (EWMA), in (0, 1].
    decisive_margin : float
        While drafting, draft-off wins *at once*, before ``min_dwell`` drafted steps, when it
        promises more than ``1 + decisive_margin`` times the committed tokens per ms of drafting:
        the dwell guards near-ties from flapping, not clear losses (entering a 16-request batch on
        the real pair, 8 dwell steps of ~2.3x a draft-off step cost ~8 % of a 128-token run).
        ``>= margin``; ``inf`` turns it off.
    probe_budget : float
        Share of the draft-off time that probes may cost, going by the cost table: a run of off
        steps before a probe lasts at least ``ceil((min_q C_q - C_off) / (probe_budget * C_off))``
        steps at the current batch size (:func:`probe_wait`), whatever the back-off has reached.
        Where a drafted step costs several draft-off steps (bs 64 on the real pair on CPU: 2.7 s
        against 0.85 s, one probe = 2.2 wasted off steps) the doubling alone probes about four times
        in 128 steps, ~7 % of the time; where drafting costs little more than draft-off (a GPU at
        small batches) the floor is small and the back-off rules. ``> 0``; ``inf`` turns it off.
    max_probe_wait : int
        Cap of that floor, in steps (the longest wait for a probe, so a workload whose drafts
        became good is noticed within this many steps even at a batch size where drafting is
        expensive). ``>= max_probe_interval``.
    explore_steps : int
        Length of an *exploration* burst: while drafting at a batch size whose draft-off cost
        has never been measured online (``off_observed`` False in :func:`draft_off_decision`),
        this many draft-off steps are run once the dwell allows, so the online costs measure the
        cell (the first 2 of them are the online costs' warm-up). A draft-off cost profiled too
        high (a loaded host) is otherwise never corrected: a cell that is never chosen is never
        timed. ``0`` turns exploring off.
    explore_gap : float
        Explore only where draft-off would win were its true cost ``explore_gap`` times lower
        than the table's: ``explore_gap * U_off > (1 + margin) * U_draft`` (a row where drafting
        wins by more is not worth the burst). ``>= 1``.
    """

    margin: float = 0.05
    min_dwell: int = 8
    alpha: float = 0.25
    max_probe_interval: int = 64
    decisive_margin: float = 0.25
    probe_budget: float = 0.02
    max_probe_wait: int = 256
    explore_steps: int = 8
    explore_gap: float = 2.0

    def __post_init__(self) -> None:
        if not (self.margin >= 0.0 and math.isfinite(self.margin)):
            raise ValueError(f"draft-off margin must be a finite number >= 0, got {self.margin}")
        if int(self.min_dwell) < 1:
            raise ValueError(f"draft-off min_dwell must be >= 1, got {self.min_dwell}")
        if not (0.0 < self.alpha <= 1.0):
            raise ValueError(f"draft-off alpha must be in (0, 1], got {self.alpha}")
        if not (self.decisive_margin >= self.margin):  # inf allowed (off); NaN refused
            raise ValueError(f"draft-off decisive_margin must be >= margin ({self.margin}), got {self.decisive_margin}")
        if int(self.max_probe_interval) < int(self.min_dwell):
            raise ValueError(f"draft-off max_probe_interval must be >= min_dwell ({self.min_dwell}), "
                             f"got {self.max_probe_interval}")
        if not (self.probe_budget > 0.0):  # inf allowed (no floor); NaN refused
            raise ValueError(f"draft-off probe_budget must be > 0 (inf: no floor), got {self.probe_budget}")
        if int(self.max_probe_wait) < int(self.max_probe_interval):
            raise ValueError(f"draft-off max_probe_wait must be >= max_probe_interval ({self.max_probe_interval}), "
                             f"got {self.max_probe_wait}")
        steps = self.explore_steps
        if isinstance(steps, bool) or int(steps) != steps or steps < 0:
            raise ValueError(f"draft-off explore_steps must be an integer >= 0, got {self.explore_steps!r}")
        if not (1.0 <= self.explore_gap < math.inf):
            raise ValueError(f"draft-off explore_gap must be a finite number >= 1, got {self.explore_gap}")


@dataclass(frozen=True)
class DraftOffState:
    """What the draft-off choice remembers between steps (one per worker; immutable, replaced).

    Attributes
    ----------
    drafting : bool
        The current choice (True: draft and verify at the planner's tier).
    dwell : int
        Steps run since the last switch or probe.
    probed : bool
        The previous step was a probe (drafted while drafting is off): decide again now.
    gains : tuple of float or None
        Smoothed expected accepted drafts *per request* at each tier, ``S_q / bs``, from the
        planner of drafted steps (:func:`observe_draft_gains`); None before the first one.
    probe_interval : int
        Draft-off steps before the next probe (0: ``min_dwell``; doubled by each probe that keeps
        drafting off, up to ``max_probe_interval``).
    explore_left : int
        Draft-off steps of the current exploration burst still to run (drafting stays the choice).
    explored : bool
        The previous step ended an exploration burst: the switch-off rule may act at once.
    explore_interval : int
        Drafted steps before the next burst (0: ``min_dwell``; doubled by each burst, up to
        ``max_probe_wait``; never reset, so exploring costs a bounded share of a server's life).
    """

    drafting: bool = True
    dwell: int = 0
    probed: bool = False
    gains: Optional[tuple[float, ...]] = None
    probe_interval: int = 0
    explore_left: int = 0
    explored: bool = False
    explore_interval: int = 0


@dataclass(frozen=True)
class DraftOffDecision:
    """One step's draft-off choice: ``off`` (skip drafting this step), the next state, and the
    committed tokens per ms it compared (None when no comparison was possible); ``probe`` marks a
    drafted step while drafting is off, ``explore`` a draft-off step of an exploration burst."""

    off: bool
    state: DraftOffState
    off_utility: Optional[float] = None
    draft_utility: Optional[float] = None
    probe: bool = False
    explore: bool = False


def observe_draft_gains(
    state: DraftOffState,
    batch_size: int,
    tier_expected: Sequence[float],
    params: DraftOffParams = DraftOffParams(),
) -> DraftOffState:
    """Fold one drafted step's expected committed tokens per tier (``DCutPlan.tier_expected``,
    ``bs + S_q``) into the smoothed per-request gains ``S_q / bs`` (EWMA, weight ``alpha``).

    Examples
    --------
    >>> s = observe_draft_gains(DraftOffState(), 4, [6.0, 8.0])
    >>> s.gains
    (0.5, 1.0)
    >>> observe_draft_gains(s, 2, [2.0, 2.0], DraftOffParams(alpha=0.5)).gains
    (0.25, 0.5)
    """
    bs = int(batch_size)
    if bs <= 0 or not tier_expected:
        return state
    new = tuple(max(0.0, (float(e) - bs) / bs) for e in tier_expected)
    if state.gains is None or len(state.gains) != len(new):
        return dataclasses.replace(state, gains=new)
    a = float(params.alpha)
    return dataclasses.replace(state, gains=tuple((1.0 - a) * g + a * x for g, x in zip(state.gains, new)))


def probe_wait(tier_costs: Sequence[float], off_cost: float, params: DraftOffParams = DraftOffParams()) -> int:
    """Fewest draft-off steps before a probe so that probes cost at most ``probe_budget`` of the
    draft-off time: ``ceil((min_q C_q - C_off) / (probe_budget * C_off))``, clipped to
    ``[0, max_probe_wait]`` (0 when a tier costs no more than draft-off or the budget is ``inf``).

    A probe is a drafted step planned as usual; the cheapest tier is what it costs at least, so
    the wait bounds the probes' share from below (the catch-up extend a probe triggers is the
    draft's own work, deferred, and not counted).

    Examples
    --------
    The real pair on CPU at bs 64 (ms): tier 0.25 costs 2746, draft-off 845, so one probe wastes
    2.25 off steps and 2 % allows one every 113 steps; a GPU-like row (1.2x) every 10:

    >>> probe_wait([2746.0, 4397.0, 5610.0, 6814.0], 845.0)
    113
    >>> probe_wait([1.2, 1.5], 1.0), probe_wait([0.9, 1.5], 1.0), probe_wait([90.0], 1.0)
    (10, 0, 256)
    >>> probe_wait([2746.0], 845.0, DraftOffParams(probe_budget=float("inf")))
    0
    """
    extra = min(float(c) for c in tier_costs) - float(off_cost)
    if extra <= 0.0 or math.isinf(params.probe_budget) or off_cost <= 0.0:
        return 0
    return min(int(params.max_probe_wait), math.ceil(extra / (params.probe_budget * float(off_cost)) - 1e-9))


def draft_off_decision(
    state: DraftOffState,
    batch_size: int,
    cost_table: Optional[CostTable],
    params: DraftOffParams = DraftOffParams(),
    off_observed: Optional[bool] = None,
) -> DraftOffDecision:
    """Decide, *before drafting*, whether step ``t + 1`` drafts or runs draft-off.

    The draft confidences of a step exist only after its drafting, so the choice for the next
    step is made from what earlier steps left: the smoothed per-request gains ``g_q = S_q / bs``
    (:func:`observe_draft_gains`) and the cost table. With ``C_q`` the table's cost of tier ``q``
    and ``C_off`` its draft-off cost at the row of ``bs`` (:meth:`CostTable.lookup`)::

        U_off = bs / C_off          U_draft = max_q bs * (1 + g_q) / C_q

    (expected committed tokens per ms). Rules, with ``m = margin`` and ``D = min_dwell``:

    * no estimate yet, or no draft-off costs in the table: draft (state ``dwell`` counts on);
    * drafting: switch off when ``dwell >= D`` and ``U_off > (1 + m) * U_draft``, or at once
      (any ``dwell``) when ``U_off > (1 + M) * U_draft`` with ``M = decisive_margin``;
    * drafting off: switch on at once when ``U_draft > (1 + m) * U_off`` with the gains at hand
      (the batch size moved to where drafting pays); otherwise stay off for ``I`` steps, then
      draft one *probe* step (the planner plans it as usual and refreshes ``g``); the step after
      a probe drafts again (switch on) only if ``U_draft > (1 + m) * U_off``, else it starts
      another run of off steps with ``I`` doubled (``I`` starts at ``D``, at most
      ``max_probe_interval``; back to ``D`` when drafting switches on). The run before a probe
      lasts ``max(I, W)`` steps, ``W`` = :func:`probe_wait` at the current batch size (the probe
      budget);
    * exploring (``off_observed`` False: the online costs have not measured the draft-off cost
      of this row; None, without online costs, never explores): while drafting and not switching
      off, once ``dwell >= E`` and ``explore_gap * U_off > (1 + m) * U_draft``, run
      ``explore_steps`` draft-off steps (drafting stays the choice; the gains are kept), then
      decide again at once: the switch-off rule may act without the dwell, on the table the
      burst corrected. ``E`` starts at ``D`` and doubles with each burst, up to
      ``max_probe_wait``; the dwell restarts after a burst.

    Returns the decision and the next state (the input is not changed).

    Examples
    --------
    Draft-off costs 1 ms and tier costs 4 ms at bs 4; 0.5 accepted drafts per request make a
    drafted step worth 6 / 4 = 1.5 tokens/ms against 4 / 1 = 4 for draft-off::

        >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4], [[4.0]], tiers=(1.0,), off_ms=[1.0])
        >>> s = DraftOffState(gains=(0.5,), dwell=8)
        >>> d = draft_off_decision(s, 4, t, DraftOffParams(min_dwell=8))
        >>> d.off, d.off_utility, d.draft_utility, d.state.drafting
        (True, 4.0, 1.5, False)

    After one drafted step (``dwell`` 1) the same gains already decide (4 > 1.25 * 1.5); a near
    tie (gains 2.4: 4 * 3.4 / 4 = 3.4, 4 / 3.4 = 1.18 <= 1.25) waits for the dwell:

        >>> draft_off_decision(DraftOffState(gains=(0.5,), dwell=1), 4, t, DraftOffParams(min_dwell=8)).off
        True
        >>> draft_off_decision(DraftOffState(gains=(2.4,), dwell=1), 4, t, DraftOffParams(min_dwell=8)).off
        False

    Gains 3.5 make drafting worth 4.5 tokens/ms, more than draft-off's 4 at its table cost; were
    draft-off 2x cheaper (8 > 1.05 * 4.5) it would win, so a row whose draft-off cost was never
    measured online explores it after the dwell:

        >>> d = draft_off_decision(DraftOffState(gains=(3.5,), dwell=8), 4, t, off_observed=False)
        >>> d.off, d.explore, d.state.drafting, d.state.explore_left, d.state.explore_interval
        (True, True, True, 7, 16)
        >>> draft_off_decision(DraftOffState(gains=(3.5,), dwell=8), 4, t, off_observed=True).off
        False
    """
    bs = int(batch_size)
    dwell = int(params.min_dwell)
    off_row = cost_table.lookup_off(bs) if cost_table is not None else None
    if off_row is None or state.gains is None or bs <= 0:
        return DraftOffDecision(False, dataclasses.replace(state, drafting=True, probed=False, explore_left=0,
                                                           explored=False,
                                                           dwell=state.dwell + 1 if state.drafting else 1))
    costs = cost_table.lookup(bs)[1]
    u_off = bs / off_row[1]
    u_draft = max(bs * (1.0 + g) / c for g, c in zip(state.gains, costs))
    better_off = u_off > (1.0 + params.margin) * u_draft
    better_draft = u_draft > (1.0 + params.margin) * u_off
    decisive_off = u_off > (1.0 + params.decisive_margin) * u_draft
    interval = int(state.probe_interval) or dwell
    explore_every = int(state.explore_interval) or dwell
    if state.drafting:
        if state.explore_left > 0:  # inside an exploration burst: off, drafting stays the choice
            left = state.explore_left - 1
            nxt = dataclasses.replace(state, explore_left=left, explored=left == 0, probed=False)
            return DraftOffDecision(True, nxt, u_off, u_draft, explore=True)
        if ((state.dwell >= dwell or state.explored) and better_off) or decisive_off:
            nxt = DraftOffState(drafting=False, dwell=1, probed=False, gains=state.gains, probe_interval=dwell,
                                explore_interval=state.explore_interval)
            return DraftOffDecision(True, nxt, u_off, u_draft)
        if (off_observed is False and params.explore_steps > 0 and state.dwell >= explore_every
                and params.explore_gap * u_off > (1.0 + params.margin) * u_draft):
            left = int(params.explore_steps) - 1
            nxt = dataclasses.replace(state, dwell=0, probed=False, explore_left=left, explored=left == 0,
                                      explore_interval=min(2 * explore_every, int(params.max_probe_wait)))
            return DraftOffDecision(True, nxt, u_off, u_draft, explore=True)
        nxt = dataclasses.replace(state, dwell=state.dwell + 1, probed=False, explored=False)
        return DraftOffDecision(False, nxt, u_off, u_draft)
    if better_draft:  # after a probe, or the batch size moved to where drafting pays
        return DraftOffDecision(False, DraftOffState(True, 1, False, state.gains,
                                                     explore_interval=state.explore_interval), u_off, u_draft)
    if state.probed:  # the probe confirmed draft-off: back off before the next one
        longer = min(2 * interval, int(params.max_probe_interval))  # >= min_dwell (checked)
        return DraftOffDecision(True, dataclasses.replace(state, dwell=1, probed=False, probe_interval=longer),
                                u_off, u_draft)
    if state.dwell >= max(interval, probe_wait(costs, off_row[1], params)):  # probe: one drafted step
        return DraftOffDecision(False, dataclasses.replace(state, dwell=0, probed=True, probe_interval=interval),
                                u_off, u_draft, probe=True)
    return DraftOffDecision(True, dataclasses.replace(state, dwell=state.dwell + 1), u_off, u_draft)

"""D-Cut's draft-off choice for ``--dcut auto``: whole decode steps without drafting (pure torch).

Where the cost table says a step without drafting (a one-token verify per request) commits more
tokens per ms than every tier, ``auto`` switches drafting off, with hysteresis (:class:`DraftOffParams`),
a minimum dwell, probes that refresh the draft's expected gains while it is off (:func:`probe_wait`)
and exploration bursts where the table's draft-off cost was never measured. :func:`draft_off_decision`
is the step decision, :func:`observe_draft_gains` the smoothed gains it reads. Rules and numbers:
``docs/algorithms.md#d-cut-draft-off``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from sglang_ext.dcut.cost_table import CostTable

__all__ = [
    "DRAFT_OFF_TIER",
    "DraftOffParams",
    "DraftOffState",
    "DraftOffDecision",
    "draft_off_decision",
    "observe_draft_gains",
    "probe_wait",
]

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
    catch_up: Optional[Tuple[float, float]] = None,
) -> DraftOffDecision:
    """Decide, *before drafting*, whether step ``t + 1`` drafts or runs draft-off.

    The draft confidences of a step exist only after its drafting, so the choice for the next
    step is made from what earlier steps left: the smoothed per-request gains ``g_q = S_q / bs``
    (:func:`observe_draft_gains`) and the cost table. With ``C_q`` the table's cost of tier ``q``
    and ``C_off`` its draft-off cost at the row of ``bs`` (:meth:`CostTable.lookup`)::

        U_off = bs / (C_off + X)          U_draft = max_q bs * (1 + g_q) / C_q

    (expected committed tokens per ms). ``X`` is the switching cost a draft-off step causes
    besides its own time: with ``catch_up = (fixed, per_row)`` (the fit of
    :class:`sglang_ext.dcut.switch_cost.CatchUpCost`; None, e.g. without deferral or before a
    catch-up was measured: ``X = 0``) each off step leaves ``bs`` rows for the catch-up extend
    and a run of ``R`` off steps pays its fixed part once, ``X = per_row * bs + fixed / R``, with
    ``R = D`` when deciding whether to switch off (the shortest run) and ``R`` = the current probe
    interval while off (runs lengthen as probes back off). Switching off thus needs a margin the
    measured catch-up sets, and staying off gets cheaper as runs lengthen.
    Rules, with ``m = margin`` and ``D = min_dwell``:

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
    interval = int(state.probe_interval) or dwell
    off_cost = off_row[1]
    if catch_up is not None:
        fixed, per_row = catch_up
        run = dwell if state.drafting else max(interval, dwell)
        off_cost += max(float(per_row), 0.0) * bs + max(float(fixed), 0.0) / run
    u_off = bs / off_cost
    u_draft = max(bs * (1.0 + g) / c for g, c in zip(state.gains, costs))
    better_off = u_off > (1.0 + params.margin) * u_draft
    better_draft = u_draft > (1.0 + params.margin) * u_off
    decisive_off = u_off > (1.0 + params.decisive_margin) * u_draft
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
    if state.dwell >= max(interval, probe_wait(costs, off_cost, params)):  # probe: one drafted step
        return DraftOffDecision(False, dataclasses.replace(state, dwell=0, probed=True, probe_interval=interval),
                                u_off, u_draft, probe=True)
    return DraftOffDecision(True, dataclasses.replace(state, dwell=state.dwell + 1), u_off, u_draft)

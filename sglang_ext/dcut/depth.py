"""Chain depth as a D-Cut tier: how many draft steps a chain step runs (pure).

On a chain (``topk 1``) keeping the first ``s`` drafts of every request is a tier of its own: the
verify holds ``s + 1`` tokens per request, a fraction ``(s + 1) / (S + 1)`` of the full chain of
``S`` drafts. Unlike the global top-K tiers it also saves drafting, since drafts past ``s`` are
never made -- which is what SGLang's ``--speculative-adaptive`` does with one runtime state per
candidate step count. Choosing the depth needs, *before drafting*, the committed tokens each
depth would bring: the draft confidences of positions past the current depth do not exist, so
this module keeps a model of the acceptance along the chain learned from the verify results.

Acceptance model (:class:`ChainAcceptance`). For position ``j`` (1-based) the conditional rate
``p_j = P(draft j accepted | drafts 1 .. j-1 accepted)``. A verify step drafted to depth ``d``
with per-request accepted counts ``a_r`` (``0 <= a_r <= d``) *tried* position ``j <= d`` for the
requests with ``a_r >= j - 1`` and saw it *accepted* by those with ``a_r >= j``. Per position the
model keeps discounted sums ``A_j <- g A_j + accepted_j``, ``T_j <- g T_j + tried_j`` (``g`` =
``discount``, for positions the step tried), so a batch of 64 weighs 64 times one request and old
steps fade; the rate is ``p_j = (A_j + w * prior) / (T_j + w)`` (``w = prior_weight``
pseudo-requests at ``prior``: one rejection alone does not pin a position at 0). Expected accepted
drafts per request at depth ``s``::

    E(s) = sum_{j=1..s} prod_{i=1..j} p_i

with a position never tried taking the rate of the deepest tried position before it (a geometric
tail: the chain is expected to keep accepting as it did at its deepest measured step), or
``prior`` when nothing is tried yet. ``E`` grows with ``s``; a depth beyond the tried ones is
valued by extrapolation, so depth can grow again after the model has seen only shallow steps.

Choice (:func:`depth_decision`): with ``C_s`` the cost table's cost of the depth's column at the
row of ``bs``, ``U_s = bs * (1 + E(s)) / C_s`` (expected committed tokens per ms); switch from the
current depth to the best one when ``U_best > (1 + margin) * U_current`` and the current depth has
run ``min_dwell`` steps (or at once when no depth is current). Depth 0 (no drafting) is not a
column: it is the draft-off choice of :func:`sglang_ext.dcut.draft_off.draft_off_decision`, given
``E`` of every depth as its gains and this table (the depths' tiers as columns).

Examples
--------
Half of every step's requests accept the first draft and a quarter both; depth 2 is worth
``0.5 + 0.5 * 0.5 = 0.75`` accepted drafts per request, depth 4 (extrapolated at 0.5) 0.9375:

>>> m = observe_chain_accepts(ChainAcceptance.empty(4), [0, 0, 1, 2], depth=2)
>>> m.accepted, m.tried
((2.0, 1.0, 0.0, 0.0), (4.0, 2.0, 0.0, 0.0))
>>> expected_accepts(m, 2, prior_weight=0.0), expected_accepts(m, 4, prior_weight=0.0)
(0.75, 0.9375)
>>> depth_tiers([1, 3, 7], 7)
(0.25, 0.5, 1.0)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from sglang_ext.dcut.cost_table import CostTable

__all__ = [
    "NO_DEPTH",
    "ChainAcceptance",
    "DepthDecision",
    "DepthParams",
    "DepthState",
    "depth_decision",
    "depth_gains",
    "depth_tiers",
    "expected_accepts",
    "observe_chain_accepts",
]

NO_DEPTH = -1
"""``DepthState.depth`` before the first decision (no depth is current)."""


@dataclass(frozen=True)
class ChainAcceptance:
    """Discounted accept / try counts along a chain (immutable; replaced on each observation).

    Attributes
    ----------
    accepted, tried : tuple of float
        ``A_j`` and ``T_j`` for positions ``1 .. S`` (see the module docstring).
    """

    accepted: tuple[float, ...]
    tried: tuple[float, ...]

    @staticmethod
    def empty(max_depth: int) -> "ChainAcceptance":
        """A model of ``max_depth`` positions with nothing observed."""
        if isinstance(max_depth, bool) or int(max_depth) != max_depth or max_depth < 1:
            raise ValueError(f"chain depth: max_depth must be an integer >= 1, got {max_depth!r}")
        return ChainAcceptance((0.0,) * int(max_depth), (0.0,) * int(max_depth))

    @property
    def max_depth(self) -> int:
        return len(self.tried)

    def rates(self, prior: float = 0.5, prior_weight: float = 1.0) -> tuple[Optional[float], ...]:
        """``p_j`` of every tried position, None where never tried."""
        return tuple(None if t <= 0.0 else (a + prior_weight * prior) / (t + prior_weight)
                     for a, t in zip(self.accepted, self.tried))


def observe_chain_accepts(
    model: ChainAcceptance,
    accepted: Sequence[int],  # [batch_size] accepted drafts per request, 0 .. depth
    depth: int,
    discount: float = 0.98,
) -> ChainAcceptance:
    """Fold one verify step drafted to ``depth`` into the per-position counts (see the module
    docstring). ``discount`` in (0, 1]. Raises ValueError on a depth outside ``1 .. S`` or a count
    outside ``0 .. depth``.

    Examples
    --------
    >>> m = observe_chain_accepts(ChainAcceptance.empty(3), [3, 3], depth=3)
    >>> m.accepted, m.tried
    ((2.0, 2.0, 2.0), (2.0, 2.0, 2.0))
    >>> m = observe_chain_accepts(m, [0, 1], depth=3, discount=0.5)
    >>> m.accepted, m.tried  # position 3 was not reached: untouched
    ((2.0, 1.0, 2.0), (3.0, 2.0, 2.0))
    """
    d = int(depth)
    if not (1 <= d <= model.max_depth):
        raise ValueError(f"chain depth: depth must be in 1 .. {model.max_depth}, got {depth!r}")
    if not (0.0 < discount <= 1.0):
        raise ValueError(f"chain depth: discount must be in (0, 1], got {discount}")
    counts = [int(a) for a in accepted]
    if any(a < 0 or a > d for a in counts):
        raise ValueError(f"chain depth: accepted counts must be in 0 .. {d}, got {counts}")
    acc, tried = list(model.accepted), list(model.tried)
    for j in range(1, d + 1):
        t = sum(1 for a in counts if a >= j - 1)
        if t == 0:
            break  # no request reached position j, nor any deeper one
        acc[j - 1] = discount * acc[j - 1] + sum(1 for a in counts if a >= j)
        tried[j - 1] = discount * tried[j - 1] + t
    return ChainAcceptance(tuple(acc), tuple(tried))


def expected_accepts(model: ChainAcceptance, depth: int, prior: float = 0.5, prior_weight: float = 1.0) -> float:
    """``E(depth)``: expected accepted drafts per request when drafting ``depth`` steps; a position
    never tried takes the rate of the deepest tried one before it, else ``prior``.

    Examples
    --------
    >>> m = ChainAcceptance((4.0, 0.0, 0.0), (5.0, 0.0, 0.0))
    >>> round(expected_accepts(m, 3, prior_weight=0.0), 3), expected_accepts(m, 0)
    (1.952, 0.0)
    >>> expected_accepts(ChainAcceptance.empty(2), 2, prior=0.5)
    0.75
    """
    d = int(depth)
    if not (0 <= d <= model.max_depth):
        raise ValueError(f"chain depth: depth must be in 0 .. {model.max_depth}, got {depth!r}")
    if not (0.0 <= prior <= 1.0) or not (prior_weight >= 0.0):
        raise ValueError(f"chain depth: prior must be in [0, 1] and prior_weight >= 0, got {prior}, {prior_weight}")
    rates = model.rates(prior, prior_weight)
    total, survive, rate = 0.0, 1.0, float(prior)
    for j in range(d):
        if rates[j] is not None:
            rate = rates[j]
        survive *= rate
        total += survive
    return total


def depth_gains(model: ChainAcceptance, depths: Sequence[int], prior: float = 0.5,
                prior_weight: float = 1.0) -> tuple[float, ...]:
    """``E(s)`` for every depth of ``depths`` (the gains of the draft-off choice, one per column)."""
    return tuple(expected_accepts(model, s, prior, prior_weight) for s in depths)


def depth_tiers(depths: Sequence[int], max_depth: int) -> tuple[float, ...]:
    """The tier of each depth: the fraction ``(s + 1) / (S + 1)`` of the full chain's verify tokens
    (the cost table's columns for depth mode). ``depths`` strictly increasing, in ``1 .. S``."""
    ds = [int(s) for s in depths]
    if not ds or any(s < 1 or s > max_depth for s in ds) or any(b <= a for a, b in zip(ds, ds[1:])):
        raise ValueError(f"chain depth: depths must be strictly increasing in 1 .. {max_depth}, got {list(depths)}")
    return tuple((s + 1) / (max_depth + 1) for s in ds)


@dataclass(frozen=True)
class DepthParams:
    """Tuning of :func:`depth_decision`.

    Attributes
    ----------
    margin : float
        Hysteresis: another depth must promise more than ``1 + margin`` times the committed tokens
        per ms of the current one.
    min_dwell : int
        Steps a depth runs at least before another switch.
    discount : float
        Per-step discount of the accept / try counts (:func:`observe_chain_accepts`), in (0, 1].
    prior : float
        Conditional acceptance assumed before anything is tried.
    prior_weight : float
        Pseudo-requests at ``prior`` in every position's rate, ``>= 0``.
    """

    margin: float = 0.05
    min_dwell: int = 8
    discount: float = 0.98
    prior: float = 0.5
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.margin >= 0.0 and math.isfinite(self.margin)):
            raise ValueError(f"chain depth: margin must be a finite number >= 0, got {self.margin}")
        if isinstance(self.min_dwell, bool) or int(self.min_dwell) != self.min_dwell or self.min_dwell < 1:
            raise ValueError(f"chain depth: min_dwell must be an integer >= 1, got {self.min_dwell!r}")
        if not (0.0 < self.discount <= 1.0):
            raise ValueError(f"chain depth: discount must be in (0, 1], got {self.discount}")
        if not (0.0 <= self.prior <= 1.0):
            raise ValueError(f"chain depth: prior must be in [0, 1], got {self.prior}")
        if not (self.prior_weight >= 0.0 and math.isfinite(self.prior_weight)):
            raise ValueError(f"chain depth: prior_weight must be a finite number >= 0, got {self.prior_weight}")


@dataclass(frozen=True)
class DepthState:
    """The current depth (:data:`NO_DEPTH` before the first decision) and the steps it has run."""

    depth: int = NO_DEPTH
    dwell: int = 0


@dataclass(frozen=True)
class DepthDecision:
    """One step's depth, the next state, and each depth's committed tokens per ms."""

    depth: int
    state: DepthState
    utilities: tuple[float, ...]


def depth_decision(
    state: DepthState,
    batch_size: int,
    cost_table: CostTable,
    depths: Sequence[int],
    gains: Sequence[float],
    params: DepthParams = DepthParams(),
) -> DepthDecision:
    """The depth of the next drafted step (see the module docstring).

    ``cost_table`` has one column per depth of ``depths`` (in that order: :func:`depth_tiers`);
    ``gains[i]`` is ``E(depths[i])``.

    Examples
    --------
    At bs 8, depth 1 costs 4 ms and depth 3 costs 6 ms; with ``p = 0.8`` along the chain depth 1
    is worth ``8 * 1.8 / 4 = 3.6`` tokens/ms and depth 3 ``8 * 2.952 / 6 = 3.94`` (9 % more):

    >>> from sglang_ext.dcut.cost_table import CostTableKey
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 8, 1, 7, "t", 64, "0.5.23", "0.1")
    >>> t = CostTable.build(k, [8], [[4.0, 6.0]], tiers=depth_tiers([1, 3], 7))
    >>> g = depth_gains(ChainAcceptance((0.8,) * 7, (1.0,) * 7), [1, 3], prior_weight=0.0)
    >>> d = depth_decision(DepthState(), 8, t, [1, 3], g)
    >>> d.depth, [round(u, 2) for u in d.utilities]
    (3, [3.6, 3.94])

    A 9 % gain beats the 5 % margin, but only after the dwell:

    >>> depth_decision(DepthState(depth=1, dwell=3), 8, t, [1, 3], g).depth
    1
    >>> depth_decision(DepthState(depth=1, dwell=8), 8, t, [1, 3], g).depth
    3
    """
    ds = [int(s) for s in depths]
    if len(ds) != len(cost_table.tiers) or len(gains) != len(ds):
        raise ValueError(f"chain depth: {len(ds)} depths, {len(gains)} gains and {len(cost_table.tiers)} table "
                         "columns must match")
    bs = int(batch_size)
    if bs < 1:
        raise ValueError(f"chain depth: batch_size must be >= 1, got {batch_size!r}")
    costs = cost_table.lookup(bs)[1]
    util = tuple(bs * (1.0 + float(g)) / float(c) for g, c in zip(gains, costs))
    best = max(range(len(ds)), key=lambda i: (util[i], -i))  # ties: the shallower depth
    if state.depth not in ds:
        return DepthDecision(ds[best], DepthState(ds[best], 1), util)
    cur = ds.index(state.depth)
    if best != cur and state.dwell >= params.min_dwell and util[best] > (1.0 + params.margin) * util[cur]:
        return DepthDecision(ds[best], DepthState(ds[best], 1), util)
    return DepthDecision(state.depth, dataclasses.replace(state, dwell=state.dwell + 1), util)

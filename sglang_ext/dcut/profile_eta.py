"""How long the rest of the launch-time cost profile will take (pure: stdlib only).

The profiler times one row (every tier and the draft-off step) per batch size. A row's wall time
has two parts: its decode steps, whose cost grows with the batch size (close to affine in it), and
the rest -- the prefill of the synthetic requests, and on the first row the one-time costs of a
fresh server (allocations, lazy initialisation), which can be several times the row's steps.

So each timed row is split (:class:`RowTime`): ``steady_s`` is what its steps cost at their
median (every step of the row at the median of its tier), ``other_s`` the rest. The profiler runs
the largest batch size first (it fails early if memory is short), then the smallest, then the
rest, so from the second row on every remaining row lies between two measured ones:

* its steps are interpolated between the measured rows' ``steady_s`` (piecewise linear in the
  batch size); after the first row only, a prior stands in for the missing point: a row at ``bs``
  costs ``PRIOR_FIXED + (1 - PRIOR_FIXED) * bs / bs_max`` of the measured one;
* its other part is interpolated the same way between the rows after the first (the first row's
  holds the one-time costs), and counted as zero while only the first row is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Sequence, Tuple

#: Share of the largest row's steps that does not shrink with the batch size, before a second row
#: is measured (on the CPU testbed a bs-1 step costs 0.15-0.35 of a bs-64 one).
PRIOR_FIXED = 0.25


@dataclass(frozen=True)
class RowTime:
    """One timed row: ``steady_s`` its decode steps at their median cost, ``other_s`` the rest of its
    wall time (prefill, one-time costs); both in seconds."""

    steady_s: float
    other_s: float

    @classmethod
    def split(cls, wall_s: float, step_ms: Sequence[float], steps_per_column: int) -> "RowTime":
        """From a row's wall time and its per-column median step costs.

        >>> RowTime.split(5.0, [100.0, 150.0], 8)
        RowTime(steady_s=2.0, other_s=3.0)
        """
        steady = sum(float(c) for c in step_ms) * int(steps_per_column) / 1e3
        return cls(steady, max(0.0, float(wall_s) - steady))


def profile_order(measured: Sequence[int]) -> Tuple[int, ...]:
    """The order the rows are timed in: largest, smallest, then the others largest first.

    >>> profile_order([64, 32, 16, 8, 4, 1])
    (64, 1, 32, 16, 8, 4)
    >>> profile_order([8]), profile_order([])
    ((8,), ())
    """
    sizes = sorted(set(int(b) for b in measured), reverse=True)
    if len(sizes) <= 2:
        return tuple(sizes)
    return (sizes[0], sizes[-1]) + tuple(sizes[1:-1])


def _interpolate(points: List[Tuple[int, float]], bs: int) -> float:
    """Piecewise-linear through ``points`` (sorted by batch size, at least two), extended by the end
    segments, never below zero; one point: a constant."""
    if len(points) == 1:
        return points[0][1]
    if bs <= points[0][0]:
        lo, hi = points[0], points[1]
    elif bs >= points[-1][0]:
        lo, hi = points[-2], points[-1]
    else:
        i = next(k for k in range(1, len(points)) if points[k][0] >= bs)
        lo, hi = points[i - 1], points[i]
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return max(0.0, lo[1] + slope * (bs - lo[0]))


def row_seconds(done: Mapping[int, RowTime], bs: int, first: int) -> float:
    """Estimated wall time of the row at ``bs`` from the rows already timed (``{bs: RowTime}``;
    ``first``: the batch size timed first).

    >>> first = {64: RowTime(2.0, 6.0)}
    >>> row_seconds(first, 64, 64), row_seconds(first, 32, 64)
    (2.0, 1.25)
    >>> two = {65: RowTime(2.0, 6.0), 1: RowTime(1.0, 0.5)}
    >>> row_seconds(two, 33, 65)
    2.0
    """
    if not done:
        raise ValueError("no row timed yet")
    steady = sorted((int(b), r.steady_s) for b, r in done.items())
    if len(steady) == 1:
        b0, t0 = steady[0]
        step = t0 * (PRIOR_FIXED + (1.0 - PRIOR_FIXED) * bs / b0)
    else:
        step = _interpolate(steady, bs)
    other = sorted((int(b), r.other_s) for b, r in done.items() if int(b) != int(first))
    return step + (_interpolate(other, bs) if other else 0.0)


def remaining_seconds(done: Mapping[int, RowTime], remaining: Sequence[int], first: int) -> float:
    """Estimated wall time of the rows still to run.

    >>> two = {65: RowTime(2.0, 6.0), 1: RowTime(1.0, 0.5)}
    >>> remaining_seconds(two, [33, 17], 65)
    3.75
    >>> remaining_seconds(two, [], 65)
    0.0
    """
    return float(sum(row_seconds(done, b, first) for b in remaining))

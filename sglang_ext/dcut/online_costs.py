"""Online correction of the D-Cut cost table from the step times the server observes (pure).

The launch-time profile (``engine/dcut/profiler.py``) times a few synthetic steps per (batch size,
tier) at one context length; on a noisy host, with other tenants or other clocks, a row can come
out wrong, and while serving a step's cost grows with the context its requests attend to.
:class:`OnlineCosts` learns, per table row, one correction per column (a tier index or
:data:`OFF_COLUMN`, the draft-off step, ``CostTable.off_ms``) and one context slope shared by the
row's columns, from the wall time of the steps the server runs (``--dcut-online-costs``; the glue
measures them, see ``DCutRunner.begin_step``).

Model of a row (``b`` its profiled batch size, ``j`` a column, ``c`` the batch's mean context
length of a step, ``c_p`` the table's profiling context, ``x = log(c / c_p)``)::

    log(observed_ms / expected_ms) = a_j + beta * x

* ``expected_ms`` is what the *uncorrected* table predicts at the step's own batch size
  (:meth:`OnlineCosts.expected_ms`: linear between the profiled row below ``bs`` and the row the
  planner uses, :meth:`CostTable.lookup`). A row serves every batch size down to the row below, and
  the steps of a batch that thins out (requests finishing at different steps) would otherwise pull
  its corrections down, most of all at the end of a burst of requests;
* ``beta`` (``>= 0``, at most ``max_slope``) is the power of the context in the step cost, one per
  row: the columns' costs grow alike with the context (measured on the testbed at bs 64: tier 0.25
  x2.2 and draft-off x2.0 over one run), so the choice between columns compares them at the same
  context. A cell timed only now and then (the draft-off step, timed in exploration bursts while a
  tier runs every step) keeps the level it was measured at, moved along the row's slope to the
  current context, instead of being compared, as one factor per cell would, with cells measured
  hundreds of tokens later;
* the fit is weighted least squares with forgetting: each counted observation of a row multiplies
  the weights of the row's earlier observations by ``forget`` (0.95, the levels ``a_j``) and by
  ``slow_forget`` (0.995, the slope: the context moves by a few tokens a step and the slope needs
  a longer span), so the levels follow the host and the slope a whole run. The slope is the
  within-column regression ``sum_j cov_j(x, y) / (sum_j var_j(x) + ridge)``, clipped to
  ``[0, max_slope]``; the level of a column is its weighted mean of ``y - beta * x``;
* an observation's ratio is clipped to ``[min_ratio, max_ratio]`` (default ``[0.1, 10]``), and
  what enters the fit at the observation's context is the median of the cell's last ``window`` (3)
  log-ratios, each moved along the slope to that context (the mean of two while only two are
  known): one stalled step among ordinary ones moves nothing;
* warm-up: the first ``warmup`` (2) observations of a cell *at a batch size that cell has not seen
  before* are not counted. They hold what a first step at a new shape pays once (first replays of a
  graph, allocator growth); batch sizes recur in serving, so later steps at the same size count at
  once. (Intervals that span a prefill, an idle gap, a forced step or a catch-up draft extend never
  reach this module: the glue drops them.)

Correction (factor) of column ``j`` at context ``c``: ``exp(a_j + beta * x)`` for a column with
counted observations, ``exp(beta * x)`` for one without (the profile, at its own context, moved
along the row's slope); 1.0 in a row with no counted observation. A cell never observed is not
given its row's level: the planner then explores by itself (a tier whose observed cost is higher
than profiled loses utility, the planner tries another tier, which then gets measured). Every
choice of auto mode compares tokens per ms across columns of one row, so the common factor
``exp(beta * x)`` changes predicted times, not choices; what the slope changes is the level each
column is credited with. Agreement across TP ranks is the glue's business.

:meth:`OnlineCosts.factors` gives the corrections of every cell at a context,
:meth:`OnlineCosts.corrected_table` the whole corrected :class:`CostTable`, which the planner uses
for the tier choice and the draft-off choice.

Worked example: a row profiled flat while full verification really costs 25 % more::

    profiled     0.25: 197  0.5: 216  0.75: 216  full: 209 ms
    observed                                      full: 263 ms  -> ratio 1.258
    factor after 1 step 1.258 (the weighted mean of one observation)

Examples
--------
>>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
>>> k = CostTableKey("m", "d", "cpu", 1, "float32", 16, 1, 15, "t", 64, "0.5.23", "0.1")
>>> t = CostTable.build(k, [32], [[197.0, 216.0, 216.0, 209.0]], off_ms=[100.0])
>>> oc = OnlineCosts(t, OnlineCostParams(warmup=0))
>>> oc.observe(32, 3, 263.0)
True
>>> oc.corrected(32)
CorrectedRow(profiled_batch_size=32, step_ms=(197.0, 216.0, 216.0, 263.0), off_ms=100.0)
>>> oc.factor(20, 3) == oc.factor(32, 3), oc.factor(32, 0), oc.factor(32, OFF_COLUMN)
(True, 1.0, 1.0)

Two columns, both 1.5x their profile at context 64 and growing as ``sqrt(context)``: the draft-off
step is timed once, at context 100, while tier 0 runs every step from context 64 to 318. Both are
compared at context 318 near their true ratio to the profile, ``1.5 * sqrt(318 / 64) = 3.34``;
one factor per cell would have left draft-off at
``1.5 * sqrt(100 / 64) = 1.88``, 44 % cheap against tier 0:

>>> oc = OnlineCosts(t, OnlineCostParams(warmup=0))
>>> for c in range(64, 320, 2):
...     _ = oc.observe(32, 0, 197.0 * 1.5 * (c / 64) ** 0.5, context=c)
...     if c == 100:
...         _ = oc.observe(32, OFF_COLUMN, 100.0 * 1.5 * (c / 64) ** 0.5, context=c)
>>> round(oc.slope(32), 3), round(oc.factor(32, 0), 2), round(oc.factor(32, OFF_COLUMN), 2)
(0.502, 3.34, 3.35)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from sglang_ext.dcut.cost_table import CostTable

__all__ = [
    "OFF_COLUMN",
    "OnlineCostParams",
    "CorrectedRow",
    "OnlineCosts",
    "apply_factors",
    "unit_factors",
]

OFF_COLUMN = -1
"""Column of the draft-off step (``CostTable.off_ms``) in :meth:`OnlineCosts.observe`; in a factor
matrix (:meth:`OnlineCosts.factors`) it is the last entry of a row, after the tiers."""

_MIN_WEIGHT = 1e-30
"""A cell whose total weight fell below this is not decayed further (no underflow after a long run
without observations; its level is kept, its share of the slope is nil)."""


@dataclass(frozen=True)
class OnlineCostParams:
    """Tuning of :class:`OnlineCosts` (see the module docstring).

    Attributes
    ----------
    forget : float
        Decay of a row's earlier weights per counted observation of the row, for the levels, in (0, 1].
    slow_forget : float
        The same for the context slope, in ``[forget, 1]``.
    min_ratio, max_ratio : float
        Band an observed / predicted ratio is clipped to, ``0 < min_ratio <= 1 <= max_ratio``.
    warmup : int
        Observations of a cell at a batch size new to that cell that are not counted, ``>= 0``.
    window : int
        Counted log-ratios of a cell whose median (moved along the slope to the newest context)
        enters the fit, ``>= 1`` (1: no median).
    ridge : float
        Added to the slope's denominator (observations x squared log context), ``> 0``: with no
        spread of contexts the slope stays 0.
    max_slope : float
        Upper clip of the slope, ``>= 0``; 0 fits no slope (one level per cell).
    """

    forget: float = 0.95
    slow_forget: float = 0.995
    min_ratio: float = 0.1
    max_ratio: float = 10.0
    warmup: int = 2
    window: int = 3
    ridge: float = 0.01
    max_slope: float = 2.0

    def __post_init__(self) -> None:
        if not (0.0 < self.forget <= self.slow_forget <= 1.0):
            raise ValueError(f"online costs: need 0 < forget <= slow_forget <= 1, got {self.forget}, "
                             f"{self.slow_forget}")
        if not (0.0 < self.min_ratio <= 1.0 <= self.max_ratio and math.isfinite(self.max_ratio)):
            raise ValueError(f"online costs: need 0 < min_ratio <= 1 <= max_ratio < inf, got "
                             f"[{self.min_ratio}, {self.max_ratio}]")
        if isinstance(self.warmup, bool) or int(self.warmup) != self.warmup or self.warmup < 0:
            raise ValueError(f"online costs: warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 1:
            raise ValueError(f"online costs: window must be an integer >= 1, got {self.window!r}")
        if not (self.ridge > 0.0 and math.isfinite(self.ridge)):
            raise ValueError(f"online costs: ridge must be finite and > 0, got {self.ridge}")
        if not (0.0 <= self.max_slope and math.isfinite(self.max_slope)):
            raise ValueError(f"online costs: max_slope must be finite and >= 0, got {self.max_slope}")


@dataclass(frozen=True)
class CorrectedRow:
    """A table row's costs times their corrections (:meth:`OnlineCosts.corrected`)."""

    profiled_batch_size: int
    step_ms: tuple[float, ...]  # per tier
    off_ms: Optional[float]  # draft-off step; None when the table has no draft-off costs


@dataclass
class _Sums:
    """Weighted sums of one cell's counted observations ``(x, y)``."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def decay(self, g: float) -> None:
        if self.w >= _MIN_WEIGHT:
            self.w, self.x, self.y, self.xx, self.xy = (g * self.w, g * self.x, g * self.y, g * self.xx,
                                                        g * self.xy)

    def add(self, wt: float, x: float, y: float) -> None:
        self.w += wt
        self.x += wt * x
        self.y += wt * y
        self.xx += wt * x * x
        self.xy += wt * x * y

    def var_cov(self) -> tuple[float, float]:
        """Within-cell ``(sum w (x - mean x)^2, sum w (x - mean x)(y - mean y))``."""
        if self.w <= 0.0:
            return 0.0, 0.0
        return max(self.xx - self.x * self.x / self.w, 0.0), self.xy - self.x * self.y / self.w


@dataclass
class _Cell:
    """One (row, column): the sums of the levels (fast forgetting) and of the slope (slow), how many
    observations were counted, and per batch size the observations seen up to the warm-up."""

    fast: _Sums = field(default_factory=_Sums)
    slow: _Sums = field(default_factory=_Sums)
    used: int = 0
    seen: Dict[int, int] = field(default_factory=dict)
    recent: List[tuple[float, float]] = field(default_factory=list)  # the last `window` (x, y)


@dataclass
class _Row:
    """One table row: its cells by column index, the log context of its last counted observation
    and the fit ``(slope, levels by column index)`` cached until the next observation."""

    cells: Dict[int, _Cell] = field(default_factory=dict)
    last_x: float = 0.0
    fit: Optional[tuple[float, Dict[int, float]]] = None

    @property
    def counted(self) -> bool:
        """Whether any cell has a counted observation (a cell in warm-up only has none)."""
        return any(c.used for c in self.cells.values())


def unit_factors(table: CostTable) -> tuple[tuple[float, ...], ...]:
    """The identity correction of ``table``: ``[len(batch_sizes)][len(tiers) + 1]`` ones.

    Examples
    --------
    >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> unit_factors(CostTable.build(k, [1, 4], [[1, 2], [3, 4]], tiers=(0.5, 1.0)))
    ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0))
    """
    return tuple((1.0,) * (len(table.tiers) + 1) for _ in table.batch_sizes)


def apply_factors(table: CostTable, factors: Sequence[Sequence[float]]) -> CostTable:
    """``table`` with every cost multiplied by its factor (``factors[row][column]``, the draft-off
    column last, as :meth:`OnlineCosts.factors` gives them). The key, tiers, batch sizes and
    creation time are kept, so the corrected table looks the same to ``CostTable.lookup``.

    Raises
    ------
    ValueError
        When ``factors`` does not have the table's shape or holds a non-finite or non-positive
        value.

    Examples
    --------
    >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> t = CostTable.build(k, [4], [[2.0, 4.0]], tiers=(0.5, 1.0), off_ms=[1.0])
    >>> c = apply_factors(t, [[1.0, 2.0, 3.0]])
    >>> c.step_ms, c.off_ms, c.created == t.created
    (((2.0, 8.0),), (3.0,), True)
    """
    ntiers = len(table.tiers)
    if len(factors) != len(table.batch_sizes) or any(len(r) != ntiers + 1 for r in factors):
        raise ValueError(f"online costs: factors must be [{len(table.batch_sizes)}][{ntiers + 1}]")
    if not all(math.isfinite(f) and f > 0 for r in factors for f in r):
        raise ValueError("online costs: factors must be finite and > 0")
    step = tuple(tuple(c * float(f) for c, f in zip(row, fr[:ntiers])) for row, fr in zip(table.step_ms, factors))
    off = None
    if table.off_ms is not None:
        off = tuple(c * float(fr[ntiers]) for c, fr in zip(table.off_ms, factors))
    return dataclasses.replace(table, step_ms=step, off_ms=off)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


class OnlineCosts:
    """Per table row, corrections of a cost table's columns and a context slope, learned online.

    Parameters
    ----------
    table : CostTable
        The launch-time table (never changed; observations are compared with its uncorrected
        costs, :meth:`expected_ms`; its ``key.context_len`` is the context the profile ran at).
    params : OnlineCostParams

    Attributes
    ----------
    version : int
        Bumped whenever a fit changes (callers cache on it and on the context).
    counted, warmup_skipped, clipped, ignored : int
        Observations that updated a fit, that the warm-up skipped, that were clipped to the band
        (also counted), and that were ignored (unknown column, no draft-off costs, a non-finite or
        non-positive time, a batch size < 1).
    """

    def __init__(self, table: CostTable, params: OnlineCostParams = OnlineCostParams()):
        self.table = table
        self.params = params
        self._ntiers = len(table.tiers)
        self._rows: Dict[int, _Row] = {}
        self._row_of_bs = {bs: i for i, bs in enumerate(table.batch_sizes)}
        ctx = int(getattr(table.key, "context_len", 0) or 0)
        self.profile_context = float(ctx) if ctx > 0 else None
        self.version = 0
        self.counted = 0
        self.warmup_skipped = 0
        self.clipped = 0
        self.ignored = 0
        self._cached: Optional[tuple[int, Optional[float], CostTable]] = None

    # ------------------------------------------------------------------ lookups
    def _column_index(self, column: int) -> Optional[int]:
        if isinstance(column, bool) or not isinstance(column, int):
            return None
        if column == OFF_COLUMN:
            return self._ntiers if self.table.has_draft_off else None
        return column if 0 <= column < self._ntiers else None

    def row_index(self, batch_size: int) -> int:
        """Index of the table row the planner uses for ``batch_size`` (``CostTable.lookup``)."""
        return self._row_of_bs[self.table.lookup(int(batch_size))[0]]

    def log_context(self, context: Optional[float]) -> Optional[float]:
        """``x = log(context / profiling context)``; None for an unknown context (None, not finite,
        ``<= 0``) or a table without its profiling context.

        Examples
        --------
        >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
        >>> oc = OnlineCosts(CostTable.build(k, [4], [[1, 2]], tiers=(0.5, 1.0)))
        >>> round(oc.log_context(128), 6), oc.log_context(64), oc.log_context(None), oc.log_context(0)
        (0.693147, 0.0, None, None)
        """
        if context is None or self.profile_context is None:
            return None
        c = float(context)
        return math.log(c / self.profile_context) if math.isfinite(c) and c > 0.0 else None

    def predicted_ms(self, batch_size: int, column: int) -> Optional[float]:
        """The uncorrected table cost of ``column`` at the row of ``batch_size`` (None for an unknown
        column, or the draft-off column of a table without draft-off costs).

        Examples
        --------
        >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
        >>> oc = OnlineCosts(CostTable.build(k, [4, 8], [[1, 2], [3, 4]], tiers=(0.5, 1.0)))
        >>> oc.predicted_ms(5, 1), oc.predicted_ms(5, OFF_COLUMN), oc.predicted_ms(5, 2)
        (4.0, None, None)
        """
        col = self._column_index(column)
        return None if col is None else self._cost(self.row_index(batch_size), col)

    def _cost(self, row: int, col: int) -> float:
        """The uncorrected cost of table row ``row`` in column index ``col`` (the draft-off column
        is ``len(tiers)``, as :meth:`_column_index` gives it)."""
        return float(self.table.off_ms[row] if col == self._ntiers else self.table.step_ms[row][col])

    def expected_ms(self, batch_size: int, column: int) -> Optional[float]:
        """What the uncorrected table predicts for a step of ``batch_size`` in ``column``: linear
        in the batch size between the largest profiled row below ``batch_size`` and the row the
        planner uses (:meth:`row_index`); the row's own cost at a profiled size, below the first
        row and beyond the last. None for an unknown column (as :meth:`predicted_ms`).

        Examples
        --------
        >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
        >>> oc = OnlineCosts(CostTable.build(k, [1, 4, 8], [[10, 20], [40, 50], [80, 90]], tiers=(0.5, 1.0),
        ...                                  off_ms=[5.0, 20.0, 60.0]))
        >>> [oc.expected_ms(b, 0) for b in (1, 2, 3, 4, 6, 8, 16)]
        [10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 80.0]
        >>> oc.expected_ms(2, OFF_COLUMN), oc.predicted_ms(2, OFF_COLUMN), oc.expected_ms(2, 2)
        (10.0, 20.0, None)
        """
        col = self._column_index(column)
        if col is None:
            return None
        bs = int(batch_size)
        sizes = self.table.batch_sizes
        hi = self.row_index(bs)
        if hi == 0 or sizes[hi] <= bs:  # the first row, a profiled size, or beyond the table
            return self._cost(hi, col)
        lo = hi - 1
        w = (bs - sizes[lo]) / (sizes[hi] - sizes[lo])
        return self._cost(lo, col) + w * (self._cost(hi, col) - self._cost(lo, col))

    # ------------------------------------------------------------------ the fit
    def _fit(self, row: _Row) -> tuple[float, Dict[int, float]]:
        """``(slope, level a_j of every counted column)`` of a row (cached until it changes)."""
        if row.fit is None:
            p = self.params
            var = cov = 0.0
            for cell in row.cells.values():
                v, c = cell.slow.var_cov()
                var, cov = var + v, cov + c
            slope = min(max(cov / (var + p.ridge), 0.0), p.max_slope)
            levels = {col: (c.fast.y - slope * c.fast.x) / c.fast.w
                      for col, c in row.cells.items() if c.used > 0 and c.fast.w > 0.0}
            row.fit = (slope, levels)
        return row.fit

    def _log_factor(self, row_index: int, col: int, x: Optional[float]) -> float:
        row = self._rows.get(row_index)
        if row is None or not row.counted:
            return 0.0
        slope, levels = self._fit(row)
        return levels.get(col, 0.0) + slope * (row.last_x if x is None else x)

    def slope(self, batch_size: int) -> float:
        """The context slope of the row of ``batch_size`` (0.0 before any counted observation)."""
        row = self._rows.get(self.row_index(batch_size))
        return 0.0 if row is None or not row.counted else self._fit(row)[0]

    def factor(self, batch_size: int, column: int, context: Optional[float] = None) -> float:
        """The correction of ``column`` at the row of ``batch_size`` and at ``context`` (the row's
        last observed context when None or unknown; 1.0 in a row never counted)."""
        col = self._column_index(column)
        if col is None:
            return 1.0
        return math.exp(self._log_factor(self.row_index(batch_size), col, self.log_context(context)))

    def observed(self, batch_size: int, column: int) -> bool:
        """Whether ``column`` has counted observations at the row of ``batch_size``."""
        col = self._column_index(column)
        row = self._rows.get(self.row_index(batch_size))
        cell = None if col is None or row is None else row.cells.get(col)
        return cell is not None and cell.used > 0

    def observed_mask(self) -> tuple[tuple[bool, ...], ...]:
        """``[len(batch_sizes)][len(tiers) + 1]``: which cells have counted observations (the
        draft-off column last, as in :meth:`factors`)."""
        out = []
        for i in range(len(self.table.batch_sizes)):
            row = self._rows.get(i)
            cells = {} if row is None else row.cells
            out.append(tuple(cells.get(j) is not None and cells[j].used > 0 for j in range(self._ntiers + 1)))
        return tuple(out)

    # ------------------------------------------------------------------ learning
    def observe(self, batch_size: int, column: int, observed_ms: float, context: Optional[float] = None) -> bool:
        """Fold one measured step into its row's fit; True when the fit changed.

        Parameters
        ----------
        batch_size : int
            Requests of the step (the row is the planner's row for it).
        column : int
            Tier index the step ran, or :data:`OFF_COLUMN` for a draft-off step.
        observed_ms : float
            The step's wall time.
        context : float or None
            The batch's mean context length (tokens per request) at the step; None when unknown
            (the observation then counts as taken at the profiling context).
        """
        pred = self.expected_ms(batch_size, column) if int(batch_size) >= 1 else None
        ms = float(observed_ms)
        if pred is None or not (math.isfinite(ms) and ms > 0.0):
            self.ignored += 1
            return False
        p = self.params
        bs = int(batch_size)
        ri, col = self.row_index(bs), self._column_index(column)
        row = self._rows.setdefault(ri, _Row())
        cell = row.cells.setdefault(col, _Cell())
        seen = cell.seen.get(bs, 0)
        if seen < p.warmup:
            cell.seen[bs] = seen + 1
            self.warmup_skipped += 1
            return False
        ratio = ms / pred
        if not (p.min_ratio <= ratio <= p.max_ratio):
            self.clipped += 1
            ratio = min(max(ratio, p.min_ratio), p.max_ratio)
        y = math.log(ratio)
        lx = self.log_context(context)
        x = 0.0 if lx is None else lx
        cell.recent = (cell.recent + [(x, y)])[-int(p.window):]
        slope = self._fit(row)[0] if cell.used > 0 else 0.0
        z = _median([yi + slope * (x - xi) for xi, yi in cell.recent])
        for c in row.cells.values():
            c.fast.decay(p.forget)
            c.slow.decay(p.slow_forget)
        cell.fast.add(1.0, x, z)
        cell.slow.add(1.0, x, z)
        cell.used += 1
        row.last_x, row.fit = x, None
        self.counted += 1
        self.version += 1
        return True

    # ------------------------------------------------------------------ corrected costs
    def factors(self, context: Optional[float] = None) -> tuple[tuple[float, ...], ...]:
        """``[len(batch_sizes)][len(tiers) + 1]`` corrections at ``context`` (each row at its last
        observed context when None or unknown), the draft-off column last."""
        x = self.log_context(context)
        return tuple(tuple(math.exp(self._log_factor(i, j, x)) for j in range(self._ntiers + 1))
                     for i in range(len(self.table.batch_sizes)))

    def corrected(self, batch_size: int, context: Optional[float] = None) -> CorrectedRow:
        """The row of ``batch_size``: its costs times their corrections at ``context``, every column."""
        row = self.row_index(batch_size)
        f = self.factors(context)[row]
        costs = self.table.step_ms[row]
        off = None if self.table.off_ms is None else self.table.off_ms[row] * f[self._ntiers]
        return CorrectedRow(self.table.batch_sizes[row], tuple(c * x for c, x in zip(costs, f)), off)

    def corrected_table(self, context: Optional[float] = None) -> CostTable:
        """The whole table with every cost corrected at ``context`` (cached until the fit or the
        context changes)."""
        key = None if context is None else float(context)
        if self._cached is None or self._cached[:2] != (self.version, key):
            table = self.table if not self._rows else apply_factors(self.table, self.factors(context))
            self._cached = (self.version, key, table)
        return self._cached[2]

    def summary(self, factors: Optional[Sequence[Sequence[float]]] = None) -> Dict[str, Any]:
        """JSON-able state (``/server_info``): per profiled batch size, the factor and the
        corrected cost of every column that is not 1.0 (keys ``"0.5"`` ..., ``"draft_off"``); per
        profiled batch size with observations, the row's context slope; and the counters. ``factors`` shows another factor matrix of this
        table (the one in use)."""
        fac = self.factors() if factors is None else factors
        corrected = apply_factors(self.table, fac)
        names = [f"{t:g}" for t in self.table.tiers] + ["draft_off"]
        rows: Dict[str, Dict[str, Any]] = {}
        for i, bs in enumerate(self.table.batch_sizes):
            cells: Dict[str, Any] = {}
            for j, name in enumerate(names):
                if fac[i][j] == 1.0 or (j == self._ntiers and corrected.off_ms is None):
                    continue
                ms = corrected.off_ms[i] if j == self._ntiers else corrected.step_ms[i][j]
                cells[name] = {"factor": round(float(fac[i][j]), 4), "ms": round(float(ms), 3)}
            if cells:
                rows[str(bs)] = cells
        slopes = {str(bs): round(self._fit(self._rows[i])[0], 4) for i, bs in enumerate(self.table.batch_sizes)
                  if i in self._rows and self._rows[i].counted}
        return {"corrections": rows, "context_slope": slopes, "counted": self.counted,
                "warmup_skipped": self.warmup_skipped,
                "clipped": self.clipped, "ignored": self.ignored,
                "profile_context": self.profile_context, "params": dataclasses.asdict(self.params)}

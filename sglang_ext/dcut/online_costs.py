"""Online correction of the D-Cut cost table from the step times the server observes (pure).

The launch-time profile (``engine/dcut/profiler.py``) times a few synthetic steps per (batch size,
tier); on a noisy host, with a short synthetic context, other tenants or other clocks, a row can
come out wrong and ``--dcut auto`` then keeps choosing the wrong tier. :class:`OnlineCosts` keeps
one multiplicative correction per (table row, column), where a column is a tier index or
:data:`OFF_COLUMN` (the draft-off step, ``CostTable.off_ms``), and learns it from the wall time of
the steps the server runs (``--dcut-online-costs on``; the glue measures them, see
``DCutRunner.begin_step``).

Update rule for one observed step (``observe(bs, column, observed_ms)``):

* the step is attributed to the row the planner used for ``bs`` (:meth:`CostTable.lookup`, the
  smallest profiled batch size ``>= bs``, else the largest);
* ``ratio = observed_ms / expected_ms``, clipped to ``[min_ratio, max_ratio]`` (default
  ``[0.1, 10]``: one stalled step cannot move a factor beyond that band). ``expected_ms`` is what
  the *uncorrected* table predicts at the step's own batch size (:meth:`OnlineCosts.expected_ms`:
  linear between the profiled row below ``bs`` and the row used; the row's cost at a profiled size,
  below the first row and beyond the last). A row serves every batch size down to the row below,
  and the steps of a batch that thins out (requests finishing at different steps) are cheaper than
  the row's cost: compared with the row's cost they would pull its factor down, most of all at the
  end of a burst of requests, where the EMA weighs them most;
* the EMA input is the median of the cell's last ``window`` (3) clipped log-ratios (the mean of two
  while only two are known), so one stalled step among ordinary ones moves nothing;
* the correction is an exponential moving average in log space, ``log f <- (1 - a) log f + a x``,
  ``x`` that median (a geometric mean: over- and under-estimates weigh alike, and even a run of
  outliers moves the factor by at most ``max_ratio ** a`` per step), with ``a = first_alpha`` (0.5)
  for a cell's first counted observation and ``alpha`` (0.2) after it;
* the EMA of a cell starts, at its first counted observation, from the mean log factor of the
  cells of the same row already counted (``row_prior``; 0, the profiled cost, when there are
  none). A profile taken while the host was loaded is off by a similar factor in every cell of a
  row, and a cell the server rarely runs (the draft-off step, measured in short exploration bursts
  while the tiers are timed every step) would otherwise stay pulled towards its profiled cost for
  many steps: from 1.0, six counted steps leave ``0.5 * 0.8 ** 5 = 16 %`` of the log error, which
  turns a profile 3x too slow into a cost still 1.2x too high;
* warm-up: the first ``warmup`` (2) observations of a cell *at a batch size that cell has not seen
  before* are not counted. They hold what a first step at a new shape pays once (first replays of a
  graph, allocator growth); batch sizes recur in serving, so later steps at the same size count at
  once. (Intervals that span a prefill, an idle gap or a forced step never reach this module: the
  glue drops them.)

:meth:`OnlineCosts.corrected` gives a row's costs times their corrections for every column and
:meth:`OnlineCosts.corrected_table` the whole corrected :class:`CostTable`, which the planner uses
for the tier choice and the draft-off choice. A cell never observed keeps factor 1.0, even when a
neighbouring column of the same row is corrected: nothing is extrapolated. The planner then
explores by itself: a tier whose observed cost is higher than profiled loses utility, the planner
tries another tier, which then gets measured. Agreement across TP ranks is the glue's business.

Worked example: a row profiled flat while full verification really costs 25 % more::

    profiled     0.25: 197  0.5: 216  0.75: 216  full: 209 ms
    observed                                      full: 263 ms  -> ratio 1.258
    factor after 1 step  exp(0.5 * ln 1.258) = 1.122, after 10 more steps 1.24

Examples
--------
>>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
>>> k = CostTableKey("m", "d", "cpu", 1, "float32", 16, 1, 15, "t", 64, "0.5.23", "0.1")
>>> t = CostTable.build(k, [32], [[197.0, 216.0, 216.0, 209.0]], off_ms=[100.0])
>>> oc = OnlineCosts(t, OnlineCostParams(warmup=0, first_alpha=1.0))
>>> oc.observe(32, 3, 263.0)
True
>>> oc.corrected(32)
CorrectedRow(profiled_batch_size=32, step_ms=(197.0, 216.0, 216.0, 263.0), off_ms=100.0)
>>> oc.factor(20, 3) == oc.factor(32, 3), oc.factor(32, 0), oc.factor(32, OFF_COLUMN)
(True, 1.0, 1.0)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

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


@dataclass(frozen=True)
class OnlineCostParams:
    """Tuning of :class:`OnlineCosts` (see the module docstring).

    Attributes
    ----------
    alpha : float
        Weight of a new observation in the log-space EMA of a cell's correction, in (0, 1].
    first_alpha : float
        Weight of a cell's first counted observation (a larger first step), in (0, 1].
    min_ratio, max_ratio : float
        Band an observed / predicted ratio is clipped to, ``0 < min_ratio <= 1 <= max_ratio``.
    warmup : int
        Observations of a cell at a batch size new to that cell that are not counted, ``>= 0``.
    window : int
        Counted log-ratios of a cell whose median feeds the EMA, ``>= 1`` (1: no median).
    row_prior : bool
        Start a cell's EMA from the mean log factor of its row's counted cells (else from 0).
    """

    alpha: float = 0.2
    first_alpha: float = 0.5
    min_ratio: float = 0.1
    max_ratio: float = 10.0
    warmup: int = 2
    window: int = 3
    row_prior: bool = True

    def __post_init__(self) -> None:
        for name in ("alpha", "first_alpha"):
            v = getattr(self, name)
            if not (0.0 < v <= 1.0):
                raise ValueError(f"online costs: {name} must be in (0, 1], got {v}")
        if not (0.0 < self.min_ratio <= 1.0 <= self.max_ratio and math.isfinite(self.max_ratio)):
            raise ValueError(f"online costs: need 0 < min_ratio <= 1 <= max_ratio < inf, got "
                             f"[{self.min_ratio}, {self.max_ratio}]")
        if isinstance(self.warmup, bool) or int(self.warmup) != self.warmup or self.warmup < 0:
            raise ValueError(f"online costs: warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 1:
            raise ValueError(f"online costs: window must be an integer >= 1, got {self.window!r}")


@dataclass(frozen=True)
class CorrectedRow:
    """A table row's costs times their corrections (:meth:`OnlineCosts.corrected`)."""

    profiled_batch_size: int
    step_ms: tuple[float, ...]  # per tier
    off_ms: Optional[float]  # draft-off step; None when the table has no draft-off costs


@dataclass
class _Cell:
    """One (row, column) correction: ``log_factor`` and how many observations were counted;
    ``seen`` counts the observations per batch size up to the warm-up."""

    log_factor: float = 0.0
    used: int = 0
    seen: Dict[int, int] = field(default_factory=dict)
    recent: list = field(default_factory=list)  # the last `window` clipped log-ratios


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


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


class OnlineCosts:
    """Per-(table row, column) multiplicative corrections of a cost table, learned online.

    Parameters
    ----------
    table : CostTable
        The launch-time table (never changed; observations are compared with its uncorrected
        costs, :meth:`expected_ms`).
    params : OnlineCostParams

    Attributes
    ----------
    version : int
        Bumped whenever a factor changes (callers cache :meth:`corrected_table` on it).
    counted, warmup_skipped, clipped, ignored : int
        Observations that updated a factor, that the warm-up skipped, that were clipped to the
        band (also counted), and that were ignored (unknown column, no draft-off costs, a
        non-finite or non-positive time, a batch size < 1).
    """

    def __init__(self, table: CostTable, params: OnlineCostParams = OnlineCostParams()):
        self.table = table
        self.params = params
        self._ntiers = len(table.tiers)
        self._cells: Dict[tuple[int, int], _Cell] = {}
        self._row_of_bs = {bs: i for i, bs in enumerate(table.batch_sizes)}
        self.version = 0
        self.counted = 0
        self.warmup_skipped = 0
        self.clipped = 0
        self.ignored = 0
        self._cached: Optional[tuple[int, CostTable]] = None

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

    def factor(self, batch_size: int, column: int) -> float:
        """The current correction of ``column`` at the row of ``batch_size`` (1.0 when untouched)."""
        col = self._column_index(column)
        if col is None:
            return 1.0
        cell = self._cells.get((self.row_index(batch_size), col))
        return 1.0 if cell is None else math.exp(cell.log_factor)

    # ------------------------------------------------------------------ learning
    def observe(self, batch_size: int, column: int, observed_ms: float) -> bool:
        """Fold one measured step into its cell's correction; True when a factor changed.

        Parameters
        ----------
        batch_size : int
            Requests of the step (the row is the planner's row for it).
        column : int
            Tier index the step ran, or :data:`OFF_COLUMN` for a draft-off step.
        observed_ms : float
            The step's wall time.
        """
        pred = self.expected_ms(batch_size, column) if int(batch_size) >= 1 else None
        ms = float(observed_ms)
        if pred is None or not (math.isfinite(ms) and ms > 0.0):
            self.ignored += 1
            return False
        p = self.params
        bs = int(batch_size)
        row = self.row_index(bs)
        cell = self._cells.setdefault((row, self._column_index(column)), _Cell())
        seen = cell.seen.get(bs, 0)
        if seen < p.warmup:
            cell.seen[bs] = seen + 1
            self.warmup_skipped += 1
            return False
        ratio = ms / pred
        if not (p.min_ratio <= ratio <= p.max_ratio):
            self.clipped += 1
            ratio = min(max(ratio, p.min_ratio), p.max_ratio)
        cell.recent = (cell.recent + [math.log(ratio)])[-int(p.window):]
        if cell.used == 0 and p.row_prior:
            cell.log_factor = self._row_log_factor(row)
        a = p.first_alpha if cell.used == 0 else p.alpha
        cell.log_factor = (1.0 - a) * cell.log_factor + a * _median(cell.recent)
        cell.used += 1
        self.counted += 1
        self.version += 1
        return True

    def _row_log_factor(self, row: int) -> float:
        """Mean log factor of the counted cells of table row ``row`` (0.0 when there are none):
        the prior a new cell of that row starts from.

        Examples
        --------
        A tier timed at half its profiled cost; the draft-off cell's first observation (a third
        of its profiled cost) starts from that tier's factor, not from the profile's 1.0:

        >>> from sglang_ext.dcut.cost_table import CostTable, CostTableKey
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4], [[10.0, 20.0]], tiers=(0.5, 1.0), off_ms=[9.0])
        >>> oc = OnlineCosts(t, OnlineCostParams(warmup=0))
        >>> oc.observe(4, 0, 5.0)
        True
        >>> round(oc.factor(4, 0), 4), oc.factor(4, 1), oc.factor(4, OFF_COLUMN)
        (0.7071, 1.0, 1.0)
        >>> oc.observe(4, OFF_COLUMN, 3.0)
        True
        >>> round(oc.factor(4, OFF_COLUMN), 4), round(math.sqrt(0.7071 / 3.0), 4), round(math.sqrt(1 / 3), 4)
        (0.4855, 0.4855, 0.5774)
        """
        logs = [c.log_factor for (r, _), c in self._cells.items() if r == row and c.used > 0]
        return sum(logs) / len(logs) if logs else 0.0

    # ------------------------------------------------------------------ corrected costs
    def factors(self) -> tuple[tuple[float, ...], ...]:
        """``[len(batch_sizes)][len(tiers) + 1]`` corrections, the draft-off column last."""
        out = [[1.0] * (self._ntiers + 1) for _ in self.table.batch_sizes]
        for (row, col), cell in self._cells.items():
            out[row][col] = math.exp(cell.log_factor)
        return tuple(tuple(r) for r in out)

    def corrected(self, batch_size: int) -> CorrectedRow:
        """The row of ``batch_size``: its costs times their corrections, every column."""
        row = self.row_index(batch_size)
        f = self.factors()[row]
        costs = self.table.step_ms[row]
        off = None if self.table.off_ms is None else self.table.off_ms[row] * f[self._ntiers]
        return CorrectedRow(self.table.batch_sizes[row], tuple(c * x for c, x in zip(costs, f)), off)

    def corrected_table(self) -> CostTable:
        """The whole table with every cost corrected (cached until a factor changes)."""
        if self._cached is None or self._cached[0] != self.version:
            table = self.table if not self._cells else apply_factors(self.table, self.factors())
            self._cached = (self.version, table)
        return self._cached[1]

    def summary(self, factors: Optional[Sequence[Sequence[float]]] = None) -> Dict[str, Any]:
        """JSON-able state (``/server_info``): per profiled batch size, the factor and the
        corrected cost of every column that is not 1.0 (keys ``"0.5"`` ..., ``"draft_off"``), and
        the counters. ``factors`` shows another factor matrix of this table (the one in use)."""
        fac = self.factors() if factors is None else factors
        corrected = apply_factors(self.table, fac)
        names = [f"{t:g}" for t in self.table.tiers] + ["draft_off"]
        rows: Dict[str, Dict[str, Any]] = {}
        for i, bs in enumerate(self.table.batch_sizes):
            cells = {}
            for j, name in enumerate(names):
                if fac[i][j] == 1.0 or (j == self._ntiers and corrected.off_ms is None):
                    continue
                ms = corrected.off_ms[i] if j == self._ntiers else corrected.step_ms[i][j]
                cells[name] = {"factor": round(float(fac[i][j]), 4), "ms": round(float(ms), 3)}
            if cells:
                rows[str(bs)] = cells
        return {"corrections": rows, "counted": self.counted, "warmup_skipped": self.warmup_skipped,
                "clipped": self.clipped, "ignored": self.ignored,
                "params": dataclasses.asdict(self.params)}

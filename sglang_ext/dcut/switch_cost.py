"""The cost of switching drafting back on after deferred draft-off steps (pure, stdlib only).

A D-Cut draft-off step defers its draft extend (``--dcut-draft-off-extend defer``): each request
leaves one row behind per off step, and the draft-off step before drafting resumes replays them
all in one *catch-up* extend. That extra time is caused by the off steps, not by the step that
happens to pay it, so it is neither a draft-off cost nor a tier cost (the online costs leave
catch-up steps out of their fit). This module models it and charges it back:

* :class:`CatchUpCost` fits ``extra_ms = fixed + per_row * rows`` online from the catch-up steps
  the server runs: ``rows`` the deferred rows the step replayed, ``extra_ms`` its measured time
  less what a draft-off step at its batch size and context is expected to cost. Weighted least
  squares with forgetting over the observations, a small ridge that pulls ``fixed`` towards 0
  (with a single row count the split is not identified: the whole cost is then per row), both
  coefficients clipped at 0.
* :meth:`CatchUpCost.per_off_step_ms` is what one draft-off step really costs on top of its own
  time: the ``per_row * batch_size`` rows it leaves behind, plus the fixed part shared by the
  ``run_steps`` off steps of one run (the extend's per-call cost is paid once per switch back).
  ``draft_off_decision`` adds it to the draft-off cost with ``run_steps`` = the minimum dwell, so
  a short off run, which pays the fixed part over few steps, must win by that much more: the
  hysteresis comes from the measured switching cost, not only from the hand-set dwell.

Before any catch-up was measured (or with deferral off: SGLang's extend in every off step, no
catch-up) the surcharge is 0, the behaviour without this module.

Examples
--------
Catch-ups of 64 and 192 rows measured at 26 and 42 ms: ``fixed`` ~18 ms, ``per_row`` 0.125 ms.
A bs-64 off step in runs of 8 then costs ``0.125 * 64 + 18 / 8`` ~ 10.3 ms more than its own time:

>>> c = CatchUpCost()
>>> for _ in range(3):
...     _ = c.observe(64, 26.0), c.observe(192, 42.0)
>>> fixed, per_row = c.estimate()
>>> round(fixed, 1), round(per_row, 3), round(c.per_off_step_ms(64, 8), 1)
(18.0, 0.125, 10.3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass
class CatchUpCost:
    """Online ``fixed + per_row * rows`` fit of the catch-up extends' extra time (module docstring).

    Attributes
    ----------
    forget : float
        Weight kept by earlier observations at each new one (the fit follows a drifting host).
    ridge : float
        Pull of ``fixed`` towards 0, relative to the observations' weight (identifies the split
        when every catch-up replayed the same number of rows).
    max_ms : float
        Observations above this (a stall, a swap) are not fitted.
    """

    forget: float = 0.9
    ridge: float = 1e-4
    max_ms: float = 60_000.0
    observations: int = 0
    _sw: float = 0.0  # sum of weights
    _sx: float = 0.0  # weighted sums of rows, rows^2, ms, rows*ms
    _sxx: float = 0.0
    _sy: float = 0.0
    _sxy: float = 0.0

    def observe(self, rows: int, extra_ms: float) -> bool:
        """Fit one catch-up: ``rows`` replayed (> 0), ``extra_ms`` its time beyond a draft-off
        step's (negative values count as 0: the step was not slower than expected). Returns
        False (nothing fitted) for no rows or a non-finite or stalled time.

        Examples
        --------
        >>> c = CatchUpCost(); c.observe(0, 5.0), c.observe(10, float("nan")), c.observe(10, 5.0)
        (False, False, True)
        """
        if rows <= 0 or not math.isfinite(extra_ms) or extra_ms > self.max_ms:
            return False
        x, y = float(rows), max(float(extra_ms), 0.0)
        f = self.forget
        self._sw = f * self._sw + 1.0
        self._sx = f * self._sx + x
        self._sxx = f * self._sxx + x * x
        self._sy = f * self._sy + y
        self._sxy = f * self._sxy + x * y
        self.observations += 1
        return True

    def estimate(self) -> Optional[Tuple[float, float]]:
        """``(fixed_ms, per_row_ms)``, both >= 0; None before the first observation.

        Examples
        --------
        One row count only: the ridge leaves the whole cost per row.

        >>> c = CatchUpCost(); _ = c.observe(50, 10.0); f, r = c.estimate()
        >>> round(f, 3), round(r, 4)
        (0.0, 0.2)
        """
        if self.observations == 0:
            return None
        # normal equations of min sum w (y - a - b x)^2 + ridge * sw * a^2
        lam = self.ridge * self._sw
        a11, a12, a22 = self._sw + lam, self._sx, self._sxx
        b1, b2 = self._sy, self._sxy
        det = a11 * a22 - a12 * a12
        if det <= 1e-12 * max(a11 * a22, 1e-300):
            per_row = b2 / a22 if a22 > 0 else 0.0
            return 0.0, max(per_row, 0.0)
        fixed = (b1 * a22 - a12 * b2) / det
        per_row = (a11 * b2 - a12 * b1) / det
        if fixed < 0.0:  # refit through the origin
            return 0.0, max(b2 / a22, 0.0) if a22 > 0 else 0.0
        if per_row < 0.0:  # refit a constant
            return max(b1 / self._sw, 0.0), 0.0
        return fixed, per_row

    def per_off_step_ms(self, batch_size: int, run_steps: int) -> float:
        """The catch-up time one draft-off step at ``batch_size`` causes, in runs of ``run_steps``
        off steps: ``per_row * batch_size + fixed / run_steps``; 0 before any observation.

        Examples
        --------
        >>> CatchUpCost().per_off_step_ms(64, 8)
        0.0
        """
        est = self.estimate()
        if est is None or batch_size <= 0:
            return 0.0
        fixed, per_row = est
        return per_row * int(batch_size) + fixed / max(int(run_steps), 1)

    def summary(self) -> dict:
        """``/server_info`` form: the fit and how many catch-ups it saw."""
        est = self.estimate()
        return {"observations": self.observations,
                "fixed_ms": None if est is None else round(est[0], 3),
                "per_row_ms": None if est is None else round(est[1], 5)}

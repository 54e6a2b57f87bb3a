"""Online calibration of D-Cut survival scores (pure torch/stdlib).

Draft confidences are raw softmax values, not acceptance probabilities (docs/algorithms.md#d-cut-losslessness,
"where it breaks" 1): a draft that is over-confident deep in its chain makes ``S(K)``, the
expected accepted drafts of a budget, too large, and ``auto`` keeps more than pays. This module
fits one exponent ``tau`` online so that calibrated scores ``s ** tau`` predict the accepted
drafts that verification actually reports:

* every step, the raw survival scores of the **kept** draft slots go into a log-spaced histogram
  (counts and sum of ``log s`` per bin) and the accepted drafts of the same requests into a
  total; both decay geometrically per refit interval, so the fit follows the workload;
* every ``refit_interval`` steps (the only host read), ``tau`` solves the moment equation
  ``sum_bins count_b * exp(tau * mean_log_b) = accepted`` by bisection (the left side falls
  monotonically in ``tau``); ``tau`` is clamped to ``[tau_min, tau_max]``.

Why the kept slots only: a kept slot's acceptance is observed (verification tells whether it
was accepted), a pruned one's is not, and ``E[accepted drafts | kept set] = sum_kept P(accept)``
by linearity (B.8), for chains and trees alike. Why a power: ``s -> s ** tau`` is strictly
increasing on ``(0, 1]``, so the kept set at any budget, ancestor closure and therefore
losslessness are untouched; only ``S(K)`` -- the tier choice -- changes.

Zero, negative, non-finite and ineligible scores pass through :meth:`PowerCalibration.apply`
unchanged and are never observed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

__all__ = ["PowerCalibration", "solve_power"]

NO_OBSERVATIONS = None  # sentinel: device accumulators not allocated yet


def solve_power(
    counts: torch.Tensor,  # [num_bins] float64 weight of the kept scores per bin
    mean_log: torch.Tensor,  # [num_bins] float64 mean log score per bin (<= 0)
    accepted: float,
    tau_min: float = 0.25,
    tau_max: float = 8.0,
    iters: int = 60,
) -> float:
    """The exponent ``tau`` with ``sum_b counts_b * exp(tau * mean_log_b) = accepted``.

    The left side decreases in ``tau`` (every ``mean_log_b <= 0``), so bisection finds the root;
    the result is clamped to ``[tau_min, tau_max]`` (more accepted than kept slots gives
    ``tau_min``, nothing accepted gives ``tau_max``).

    Examples
    --------
    Ten kept slots of score 0.8 and 4.096 accepted (0.8 ** 3 * 10 = 5.12 would be 3; here 0.8**4):

    >>> c = torch.tensor([10.0], dtype=torch.float64)
    >>> round(solve_power(c, torch.tensor([math.log(0.8)], dtype=torch.float64), 4.096), 6)
    4.0
    >>> solve_power(c, torch.tensor([math.log(0.8)], dtype=torch.float64), 10.0)
    0.25
    """
    counts = counts.to(torch.float64)
    mean_log = mean_log.to(torch.float64).clamp(max=0.0)

    def predicted(tau: float) -> float:
        return float((counts * torch.exp(tau * mean_log)).sum())

    if predicted(tau_min) <= accepted:
        return float(tau_min)
    if predicted(tau_max) >= accepted:
        return float(tau_max)
    lo, hi = float(tau_min), float(tau_max)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if predicted(mid) > accepted:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass
class PowerCalibration:
    """Online power calibration ``s -> s ** tau`` of survival scores (see the module docstring).

    Parameters
    ----------
    num_bins, log_min : histogram of ``log s`` over ``[log_min, 0]`` (scores below ``exp(log_min)``
        fall into the lowest bin).
    decay : weight kept by the old observations at each refit (per ``refit_interval`` steps).
    refit_interval : steps between refits (each refit is one host read of the accumulators).
    min_kept : decayed kept-slot weight needed before ``tau`` leaves 1.0.
    tau_min, tau_max : clamp of the fitted exponent.

    Attributes
    ----------
    tau : float
        The current exponent (1.0 until ``min_kept`` slots were observed).
    refits : int
        Refits done so far.

    Examples
    --------
    A draft whose kept slots all say 0.9 while only 0.9 ** 2 of them are accepted:

    >>> cal = PowerCalibration(refit_interval=1, min_kept=1.0)
    >>> for _ in range(3):
    ...     cal.observe(torch.full((100,), 0.9), torch.tensor(81.0))
    >>> round(cal.tau, 3)
    2.0
    >>> [round(x, 4) for x in cal.apply(torch.tensor([1.0, 0.5, 0.0, float("-inf")])).tolist()]
    [1.0, 0.25, 0.0, -inf]
    """

    num_bins: int = 128
    log_min: float = -16.0
    decay: float = 0.9
    refit_interval: int = 16
    min_kept: float = 256.0
    tau_min: float = 0.25
    tau_max: float = 8.0
    tau: float = 1.0
    refits: int = 0
    _steps: int = 0
    _dev_counts: Optional[torch.Tensor] = field(default=NO_OBSERVATIONS, repr=False)  # [num_bins]
    _dev_logsum: Optional[torch.Tensor] = field(default=NO_OBSERVATIONS, repr=False)  # [num_bins]
    _dev_accepted: Optional[torch.Tensor] = field(default=NO_OBSERVATIONS, repr=False)  # 0-d
    _counts: Optional[torch.Tensor] = field(default=None, repr=False)  # [num_bins] float64, host
    _logsum: Optional[torch.Tensor] = field(default=None, repr=False)  # [num_bins] float64, host
    _accepted: float = 0.0

    def __post_init__(self) -> None:
        if self.num_bins < 1 or not self.log_min < 0:
            raise ValueError(f"need num_bins >= 1 and log_min < 0, got {self.num_bins}, {self.log_min}")
        if not 0.0 < self.decay <= 1.0 or self.refit_interval < 1:
            raise ValueError(f"need 0 < decay <= 1 and refit_interval >= 1, got {self.decay}, {self.refit_interval}")
        if not 0.0 < self.tau_min <= 1.0 <= self.tau_max:
            raise ValueError(f"need 0 < tau_min <= 1 <= tau_max, got {self.tau_min}, {self.tau_max}")
        self._counts = torch.zeros(self.num_bins, dtype=torch.float64)
        self._logsum = torch.zeros(self.num_bins, dtype=torch.float64)

    # ------------------------------------------------------------------ scores
    def apply(self, scores: torch.Tensor) -> torch.Tensor:  # [batch_size, num_slots] survival
        """``scores ** tau`` where ``0 < s``; other values (0, ineligible, NaN) unchanged."""
        if self.tau == 1.0:
            return scores
        return torch.where(scores > 0, scores.clamp(min=0).pow(self.tau), scores)

    # ------------------------------------------------------------------ observations
    def observe(
        self,
        scores: torch.Tensor,  # [batch_size, num_slots] raw survival (any shape)
        accepted_drafts: torch.Tensor,  # 0-d: accepted drafts (bonus excluded) of the same requests
        kept: Optional[torch.Tensor] = None,  # scores' shape, bool: the kept slots; None = all
    ) -> None:
        """Add one step's kept slots and accepted drafts (device ops, no host read; refits every
        ``refit_interval`` calls)."""
        s = scores.detach().reshape(-1).float()
        w = torch.isfinite(s) & (s > 0)  # [m] observed slots
        if kept is not None:
            w = w & kept.reshape(-1).to(device=s.device, dtype=torch.bool)
        logs = torch.where(w, s, torch.ones_like(s)).clamp(max=1.0).log().clamp(min=self.log_min)  # [m]
        idx = ((logs - self.log_min) * (self.num_bins / -self.log_min)).long().clamp(0, self.num_bins - 1)
        if self._dev_counts is NO_OBSERVATIONS or self._dev_counts.device != s.device:
            self._dev_counts = torch.zeros(self.num_bins, dtype=torch.float64, device=s.device)
            self._dev_logsum = torch.zeros(self.num_bins, dtype=torch.float64, device=s.device)
            self._dev_accepted = torch.zeros((), dtype=torch.float64, device=s.device)
        wd = w.to(torch.float64)
        self._dev_counts.index_add_(0, idx, wd)
        self._dev_logsum.index_add_(0, idx, logs.to(torch.float64) * wd)
        self._dev_accepted += accepted_drafts.detach().to(device=s.device, dtype=torch.float64).sum()
        self._steps += 1
        if self._steps % self.refit_interval == 0:
            self.refit()

    def refit(self) -> float:
        """Fold the device accumulators into the decayed host totals and solve for ``tau``."""
        if self._dev_counts is not NO_OBSERVATIONS:
            self._counts.mul_(self.decay).add_(self._dev_counts.cpu())
            self._logsum.mul_(self.decay).add_(self._dev_logsum.cpu())
            self._accepted = self._accepted * self.decay + float(self._dev_accepted.cpu())
            self._dev_counts.zero_()
            self._dev_logsum.zero_()
            self._dev_accepted.zero_()
        self.refits += 1
        total = float(self._counts.sum())
        if total >= self.min_kept:
            mean_log = self._logsum / self._counts.clamp(min=1e-12)
            self.tau = solve_power(self._counts, mean_log, self._accepted, self.tau_min, self.tau_max)
        return self.tau

    def summary(self) -> dict:
        """JSON-able state for ``/server_info``: ``tau``, ``refits``, decayed ``kept_weight``,
        ``accepted_weight`` and ``predicted_raw`` (what the raw scores predict for them)."""
        mean_log = self._logsum / self._counts.clamp(min=1e-12)
        raw = float((self._counts * torch.exp(mean_log)).sum())
        return {
            "tau": self.tau,
            "refits": self.refits,
            "kept_weight": float(self._counts.sum()),
            "accepted_weight": self._accepted,
            "predicted_raw": raw if math.isfinite(raw) else None,
        }

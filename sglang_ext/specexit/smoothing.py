"""Batched SpecExit smoothers over request slots (pure torch).

docs/algorithms.md#specexit-smoothing. Each request slot holds one predictor per signal. A predictor receives
at most one observation per decode step and returns a smoothed score, or "undefined":

==================  ========================================================  ===============
kind                score after the observations x_1..x_t                     undefined while
==================  ========================================================  ===============
``ewma``            e_1 = x_1;  e_t = alpha * x_t + (1 - alpha) * e_{t-1}      t = 0
``momentum``        x_t + (x_t - x_{t-W+1}) / (W - 1): the last value plus    t < W
                    the mean of the last W - 1 first differences
``mean``            mean of the last min(t, W) observations                  t = 0
``paragraph_mean``  as ``mean``, but a paragraph cut keeps only the most      t = 0
                    recent observation in the history
==================  ========================================================  ===============

``momentum`` with W = 1 has no differences to average and scores the last value.

Project rules:

* The kind, alpha and W are per slot, so one batch can mix requests with different
  per-request smoothing options. All kinds share one state layout; the score of a slot is
  selected by its kind.
* "Undefined" is explicit: :meth:`SmootherState.scores` returns a ``defined`` mask and NaN
  scores where undefined, so an undefined score can never pass a threshold.
* A non-finite observation (NaN or +-inf) of one signal is not pushed: that signal's
  predictor keeps its state for the step (e.g. a ``draft-confidence`` step with no accepted
  draft, or an overflowing ``exp``).

State layout (``SmootherState``): ``history[slot, signal, i]`` is the i-th most recent
observation (``i = 0`` newest); ``length[slot, signal]`` counts the valid history entries,
capped at the slot's window and cut to at most 1 by a paragraph cut. EWMA values are kept
separately. Nothing here synchronises with the host except :meth:`SmootherState.reset`,
which validates its arguments.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import torch

from sglang_ext.specexit.defaults import MAX_WINDOW, SMOOTHING_NAMES


class SmoothingKind(enum.IntEnum):
    """Smoother type; the value is what the per-slot ``kind`` tensor stores."""

    EWMA = 0
    MOMENTUM = 1
    MEAN = 2
    PARAGRAPH_MEAN = 3

    @property
    def label(self) -> str:
        """The flag / ``custom_params`` spelling (``"ewma"``, ...)."""
        return SMOOTHING_NAMES[int(self)]

    @classmethod
    def parse(cls, name: str) -> "SmoothingKind":
        """Parse a smoother name; unknown names are an error (no fallback to ``mean``).

        Examples
        --------
        >>> SmoothingKind.parse("paragraph_mean")
        <SmoothingKind.PARAGRAPH_MEAN: 3>
        """
        if name not in SMOOTHING_NAMES:
            raise ValueError(
                f"unknown smoothing {name!r}; expected one of {', '.join(SMOOTHING_NAMES)}"
            )
        return cls(SMOOTHING_NAMES.index(name))


IndexLike = Union[torch.Tensor, Sequence[int]]


def as_slot_index(slots: IndexLike, device: torch.device) -> torch.Tensor:  # [n]
    """Slots (tensor or sequence) as a flat int64 tensor on ``device``.

    Examples
    --------
    >>> as_slot_index([2, 0], torch.device("cpu")).tolist()
    [2, 0]
    """
    return torch.as_tensor(slots, dtype=torch.int64, device=device).reshape(-1)


@dataclass
class SmootherState:
    """Per-slot predictors for ``num_signals`` signals, batched over request slots.

    Attributes
    ----------
    kind : torch.Tensor
        ``[max_slots]`` int64 ``SmoothingKind`` values.
    alpha : torch.Tensor
        ``[max_slots]`` EWMA weight of the newest observation.
    window : torch.Tensor
        ``[max_slots]`` int64 window W, ``1 <= W <= max_window``.
    history : torch.Tensor
        ``[max_slots, num_signals, max_window]`` past observations, newest first.
    length : torch.Tensor
        ``[max_slots, num_signals]`` int64 valid entries of ``history``.
    ewma : torch.Tensor
        ``[max_slots, num_signals]`` current EWMA values (meaningful where ``length > 0``).

    Examples
    --------
    Two slots, one signal: slot 0 uses ``mean`` with W = 2, slot 1 ``ewma`` with alpha 0.5.

    >>> s = SmootherState.allocate(max_slots=2, num_signals=1, max_window=4)
    >>> s.reset([0, 1], kind=[SmoothingKind.MEAN, SmoothingKind.EWMA], alpha=[0.5, 0.5],
    ...         window=[2, 2])
    >>> for x in (1.0, 2.0, 4.0):
    ...     s.push([0, 1], torch.tensor([[x], [x]]))
    >>> values, defined = s.scores([0, 1])
    >>> values.tolist(), defined.tolist()
    ([[3.0], [2.75]], [[True], [True]])
    """

    kind: torch.Tensor  # [max_slots]
    alpha: torch.Tensor  # [max_slots]
    window: torch.Tensor  # [max_slots]
    history: torch.Tensor  # [max_slots, num_signals, max_window]
    length: torch.Tensor  # [max_slots, num_signals]
    ewma: torch.Tensor  # [max_slots, num_signals]

    @classmethod
    def allocate(
        cls,
        max_slots: int,
        num_signals: int,
        max_window: int = MAX_WINDOW,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
    ) -> "SmootherState":
        """Allocate state for ``max_slots`` slots, every slot empty (``ewma``, W = 1).

        Examples
        --------
        >>> SmootherState.allocate(3, 2, max_window=5).history.shape
        torch.Size([3, 2, 5])
        """
        if max_slots < 1 or num_signals < 1 or max_window < 1:
            raise ValueError("max_slots, num_signals and max_window must be >= 1")
        device = torch.device(device)
        return cls(
            kind=torch.full((max_slots,), int(SmoothingKind.EWMA), dtype=torch.int64, device=device),
            alpha=torch.ones((max_slots,), dtype=dtype, device=device),
            window=torch.ones((max_slots,), dtype=torch.int64, device=device),
            history=torch.zeros((max_slots, num_signals, max_window), dtype=dtype, device=device),
            length=torch.zeros((max_slots, num_signals), dtype=torch.int64, device=device),
            ewma=torch.zeros((max_slots, num_signals), dtype=dtype, device=device),
        )

    @property
    def max_slots(self) -> int:
        """Number of request slots."""
        return self.kind.shape[0]

    @property
    def num_signals(self) -> int:
        """Signals per slot."""
        return self.length.shape[1]

    @property
    def max_window(self) -> int:
        """Capacity of the per-signal history."""
        return self.history.shape[2]

    def reset(
        self,
        slots: IndexLike,  # [n]
        kind: IndexLike,  # [n]
        alpha: Union[torch.Tensor, Sequence[float]],  # [n]
        window: IndexLike,  # [n]
    ) -> None:
        """Start fresh predictors in ``slots`` (a new request took them).

        Validates its arguments (host-side; called at admission, not per step).

        Parameters
        ----------
        slots : tensor or sequence of int
            ``[n]`` request-pool slots, no duplicates.
        kind : tensor or sequence of int
            ``[n]`` ``SmoothingKind`` per slot.
        alpha : tensor or sequence of float
            ``[n]`` EWMA weights in (0, 1].
        window : tensor or sequence of int
            ``[n]`` windows in 1..max_window.

        Examples
        --------
        >>> s = SmootherState.allocate(2, 1, max_window=4)
        >>> s.push([1], torch.tensor([[3.0]]))
        >>> s.reset([1], kind=[SmoothingKind.MEAN], alpha=[0.1], window=[3])
        >>> s.scores([1])[1].tolist()
        [[False]]
        """
        device = self.kind.device
        slots_t = as_slot_index(slots, device)
        kind_t = as_slot_index(kind, device)
        window_t = as_slot_index(window, device)
        alpha_t = torch.as_tensor(alpha, dtype=self.alpha.dtype, device=device).reshape(-1)
        n = slots_t.numel()
        if not (kind_t.numel() == alpha_t.numel() == window_t.numel() == n):
            raise ValueError("slots, kind, alpha and window must have the same length")
        if n == 0:
            return
        if int(slots_t.min()) < 0 or int(slots_t.max()) >= self.max_slots:
            raise ValueError(f"slot index out of range 0..{self.max_slots - 1}")
        if int(kind_t.min()) < 0 or int(kind_t.max()) >= len(SmoothingKind):
            raise ValueError("unknown smoothing kind")
        if int(window_t.min()) < 1 or int(window_t.max()) > self.max_window:
            raise ValueError(f"window must be in 1..{self.max_window}")
        if not bool(((alpha_t > 0) & (alpha_t <= 1)).all()):
            raise ValueError("ewma alpha must be in (0, 1]")
        self.kind[slots_t] = kind_t
        self.alpha[slots_t] = alpha_t
        self.window[slots_t] = window_t
        self.history[slots_t] = 0
        self.length[slots_t] = 0
        self.ewma[slots_t] = 0

    def push(
        self,
        slots: IndexLike,  # [n]
        observations: torch.Tensor,  # [n, num_signals]
        mask: torch.Tensor = None,  # [n] bool
    ) -> None:
        """Push one observation per signal into each slot where ``mask`` holds.

        Non-finite observations are skipped per signal (that predictor is unchanged).

        Parameters
        ----------
        slots : tensor or sequence of int
            ``[n]`` slots, no duplicates.
        observations : torch.Tensor
            ``[n, num_signals]`` this step's values.
        mask : torch.Tensor, optional
            ``[n]`` bool; only rows where it is True are pushed (default: all).

        Examples
        --------
        >>> s = SmootherState.allocate(1, 2, max_window=3)
        >>> s.reset([0], kind=[SmoothingKind.EWMA], alpha=[0.5], window=[3])
        >>> s.push([0], torch.tensor([[2.0, float("nan")]]))
        >>> s.scores([0])[1].tolist()  # signal 1 got no observation yet
        [[True, False]]
        """
        device = self.kind.device
        slots_t = as_slot_index(slots, device)
        x = observations.to(device=device, dtype=self.history.dtype)  # [n, num_signals]
        ok = torch.isfinite(x)  # [n, num_signals]
        if mask is not None:
            ok = ok & mask.to(device=device, dtype=torch.bool)[:, None]
        history = self.history[slots_t]  # [n, num_signals, max_window]
        shifted = torch.cat([x[:, :, None], history[:, :, :-1]], dim=2)
        length = self.length[slots_t]  # [n, num_signals]
        window = self.window[slots_t][:, None]  # [n, 1]
        alpha = self.alpha[slots_t][:, None]  # [n, 1]
        ewma = self.ewma[slots_t]  # [n, num_signals]
        blended = torch.where(length == 0, x, alpha * x + (1 - alpha) * ewma)
        self.history[slots_t] = torch.where(ok[:, :, None], shifted, history)
        self.length[slots_t] = torch.where(ok, torch.minimum(length + 1, window), length)
        self.ewma[slots_t] = torch.where(ok, blended, ewma)

    def paragraph_cut(
        self,
        slots: IndexLike,  # [n]
        mask: torch.Tensor = None,  # [n] bool
    ) -> None:
        """Cut the histories of ``paragraph_mean`` slots to their most recent observation.

        Called when a paragraph boundary is evaluated for the slot (docs/algorithms.md#specexit-step-procedure,
        step 3), whatever the outcome. Slots of other kinds are unaffected.

        Parameters
        ----------
        slots : tensor or sequence of int
            ``[n]`` slots, no duplicates.
        mask : torch.Tensor, optional
            ``[n]`` bool; only rows where it is True are cut (default: all).

        Examples
        --------
        >>> s = SmootherState.allocate(1, 1, max_window=4)
        >>> s.reset([0], kind=[SmoothingKind.PARAGRAPH_MEAN], alpha=[0.1], window=[4])
        >>> for x in (1.0, 2.0):
        ...     s.push([0], torch.tensor([[x]]))
        >>> s.paragraph_cut([0])
        >>> s.push([0], torch.tensor([[4.0]]))
        >>> s.scores([0])[0].tolist()  # mean of [2, 4]
        [[3.0]]
        """
        device = self.kind.device
        slots_t = as_slot_index(slots, device)
        cut = self.kind[slots_t] == int(SmoothingKind.PARAGRAPH_MEAN)  # [n]
        if mask is not None:
            cut = cut & mask.to(device=device, dtype=torch.bool)
        length = self.length[slots_t]  # [n, num_signals]
        self.length[slots_t] = torch.where(cut[:, None], length.clamp(max=1), length)

    def scores(
        self,
        slots: IndexLike,  # [n]
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([n, num_signals], [n, num_signals])
        """Smoothed scores of ``slots`` and whether each is defined.

        Returns
        -------
        values : torch.Tensor
            ``[n, num_signals]`` scores; NaN where undefined.
        defined : torch.Tensor
            ``[n, num_signals]`` bool.

        Examples
        --------
        ``momentum`` with W = 3 is undefined until the third observation:

        >>> s = SmootherState.allocate(1, 1, max_window=3)
        >>> s.reset([0], kind=[SmoothingKind.MOMENTUM], alpha=[0.1], window=[3])
        >>> out = []
        >>> for x in (1.0, 2.0, 4.0):
        ...     s.push([0], torch.tensor([[x]]))
        ...     out.append(s.scores([0])[0].item())
        >>> out  # third: 4 + (4 - 1) / 2
        [nan, nan, 5.5]
        """
        device = self.kind.device
        slots_t = as_slot_index(slots, device)
        history = self.history[slots_t]  # [n, num_signals, max_window]
        length = self.length[slots_t]  # [n, num_signals]
        window = self.window[slots_t][:, None]  # [n, 1]
        kind = self.kind[slots_t][:, None]  # [n, 1]
        n, num_signals, max_window = history.shape

        in_history = torch.arange(max_window, device=device)[None, None, :] < length[:, :, None]
        total = torch.where(in_history, history, torch.zeros_like(history)).sum(dim=2)
        mean = total / length.clamp(min=1).to(history.dtype)

        newest = history[:, :, 0]
        oldest_index = (window - 1).expand(n, num_signals)[:, :, None]  # [n, num_signals, 1]
        oldest = history.gather(2, oldest_index).squeeze(2)  # x_{t-W+1}
        steps = (window - 1).clamp(min=1).to(history.dtype)
        momentum = newest + (newest - oldest) / steps

        values = torch.where(kind == int(SmoothingKind.EWMA), self.ewma[slots_t], mean)
        values = torch.where(kind == int(SmoothingKind.MOMENTUM), momentum, values)
        defined = torch.where(kind == int(SmoothingKind.MOMENTUM), length >= window, length > 0)
        values = torch.where(defined, values, torch.full_like(values, float("nan")))
        return values, defined

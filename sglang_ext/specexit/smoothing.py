"""Batched SpecExit smoothers over request slots (pure torch).

docs/algorithms.md#specexit-smoothing. Each request slot holds one predictor per signal. A predictor receives
one observation per thinking token (``SpecExitState.step`` pushes them in token order) and returns a
smoothed score, or "undefined":

==================  ========================================================  ===============
kind                score after the observations x_1..x_t                     undefined while
==================  ========================================================  ===============
``ewma``            e_1 = x_1;  e_t = alpha * x_t + (1 - alpha) * e_{t-1}      t = 0
                    (computed as ``lerp(e_{t-1}, x_t, alpha)``)
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
    widest : int
        The largest window of any reset so far; history entries past it are never read.

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
    widest: int = 1
    """The largest window any slot was reset with (host side): histories are read up to it only."""

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
        self.widest = max(self.widest, int(window_t.max()))
        self.kind[slots_t] = kind_t
        self.alpha[slots_t] = alpha_t
        self.window[slots_t] = window_t
        self.history[slots_t] = 0
        self.length[slots_t] = 0
        self.ewma[slots_t] = 0

    def view(self, slots: IndexLike) -> "SlotView":  # [n]
        """A gathered copy of the state of ``slots`` to update several times (then :meth:`store`).

        Examples
        --------
        >>> s = SmootherState.allocate(2, 1, max_window=4)
        >>> s.reset([1], kind=[SmoothingKind.MEAN], alpha=[0.5], window=[2])
        >>> v = s.view([1])
        >>> for x in (1.0, 2.0, 6.0):
        ...     v.push(torch.tensor([[x]]))
        >>> s.store([1], v); s.scores([1])[0].tolist()
        [[4.0]]
        """
        slots_t = as_slot_index(slots, self.kind.device)
        return SlotView.gather(self, slots_t)

    def store(self, slots: IndexLike, view: "SlotView") -> None:  # [n]
        """Write a view's history, lengths and EWMA values back into ``slots`` (no duplicates)."""
        slots_t = as_slot_index(slots, self.kind.device)
        self.history[slots_t, :, : view.history.shape[2]] = view.history
        self.length[slots_t] = view.length
        self.ewma[slots_t] = view.ewma

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
            ``[n, num_signals]`` this token's values.
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
        view = self.view(slots)
        view.push(observations, mask)
        self.store(slots, view)

    def paragraph_cut(
        self,
        slots: IndexLike,  # [n]
        mask: torch.Tensor = None,  # [n] bool
    ) -> None:
        """Cut the histories of ``paragraph_mean`` slots to their most recent observation.

        Called when a paragraph boundary token was examined for the slot and did not exit
        (docs/algorithms.md#specexit-step-procedure, step 3), after its own observation was pushed.
        Slots of other kinds are unaffected.

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
        view = self.view(slots)
        view.paragraph_cut(mask)
        self.store(slots, view)

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
        return self.view(slots).scores()


@dataclass
class SlotView:
    """The smoother state of ``n`` gathered slots, updated in place by a sequence of tokens.

    All per-slot constants (kind masks, EWMA weights, the momentum's oldest index) are computed
    once at :meth:`gather`, so a loop over a step's tokens runs only the update arithmetic. The
    arithmetic of one slot does not depend on the other slots of the view.

    Examples
    --------
    >>> s = SmootherState.allocate(1, 1, max_window=4)
    >>> s.reset([0], kind=[SmoothingKind.EWMA], alpha=[0.5], window=[1])
    >>> v = s.view([0])
    >>> v.push(torch.tensor([[2.0]])); v.push(torch.tensor([[4.0]]))
    >>> v.scores()[0].tolist(), s.scores([0])[1].tolist()  # the view changed, the state not yet
    ([[3.0]], [[False]])
    """

    history: torch.Tensor  # [n, num_signals, widest], newest first
    length: torch.Tensor  # [n, num_signals]
    ewma: torch.Tensor  # [n, num_signals]
    window: torch.Tensor  # [n, 1]
    alpha: torch.Tensor  # [n, 1]
    is_ewma: torch.Tensor  # [n, 1] bool
    is_momentum: torch.Tensor  # [n, 1] bool
    is_paragraph: torch.Tensor  # [n] bool
    oldest_index: torch.Tensor  # [n, num_signals, 1]: x_{t-W+1} in the history
    steps: torch.Tensor  # [n, 1]: W - 1, at least 1
    positions: torch.Tensor  # [1, 1, widest]

    @classmethod
    def gather(
        cls,
        state: SmootherState,
        slots: torch.Tensor,  # [n]
    ) -> "SlotView":
        """Copy the state of ``slots`` out of ``state``."""
        history = state.history[slots, :, : state.widest]  # [n, num_signals, widest]
        n, num_signals, max_window = history.shape
        window = state.window[slots][:, None]  # [n, 1]
        alpha = state.alpha[slots][:, None]  # [n, 1]
        kind = state.kind[slots]  # [n]
        return cls(
            history=history,
            length=state.length[slots],
            ewma=state.ewma[slots],
            window=window,
            alpha=alpha,
            is_ewma=(kind == int(SmoothingKind.EWMA))[:, None],
            is_momentum=(kind == int(SmoothingKind.MOMENTUM))[:, None],
            is_paragraph=kind == int(SmoothingKind.PARAGRAPH_MEAN),
            oldest_index=(window - 1).expand(n, num_signals)[:, :, None],
            steps=(window - 1).clamp(min=1).to(history.dtype),
            positions=torch.arange(max_window, device=history.device)[None, None, :],
        )

    def push(
        self,
        observations: torch.Tensor,  # [n, num_signals]
        mask: torch.Tensor = None,  # [n] bool
    ) -> None:
        """One observation per slot and signal, where finite and ``mask`` holds."""
        x = observations.to(device=self.history.device, dtype=self.history.dtype)  # [n, num_signals]
        ok = torch.isfinite(x)  # [n, num_signals]
        if mask is not None:
            ok = ok & mask.to(device=x.device, dtype=torch.bool)[:, None]
        shifted = torch.cat([x[:, :, None], self.history[:, :, :-1]], dim=2)
        blended = torch.where(self.length == 0, x, torch.lerp(self.ewma, x, self.alpha))
        self.history = torch.where(ok[:, :, None], shifted, self.history)
        self.ewma = torch.where(ok, blended, self.ewma)
        self.length = torch.where(ok, torch.minimum(self.length + 1, self.window), self.length)

    def paragraph_cut(
        self,
        mask: torch.Tensor = None,  # [n] bool
    ) -> None:
        """Cut ``paragraph_mean`` histories to their newest observation where ``mask`` holds."""
        cut = self.is_paragraph
        if mask is not None:
            cut = cut & mask.to(device=cut.device, dtype=torch.bool)
        self.length = torch.where(cut[:, None], self.length.clamp(max=1), self.length)

    def scores(self) -> Tuple[torch.Tensor, torch.Tensor]:  # ([n, num_signals], [n, num_signals])
        """Smoothed scores (NaN where undefined) and the ``defined`` mask."""
        history, length = self.history, self.length
        in_history = self.positions < length[:, :, None]  # [n, num_signals, max_window]
        total = torch.where(in_history, history, torch.zeros_like(history)).sum(dim=2)
        mean = total / length.clamp(min=1).to(history.dtype)
        newest = history[:, :, 0]
        oldest = history.gather(2, self.oldest_index).squeeze(2)  # x_{t-W+1}
        momentum = newest + (newest - oldest) / self.steps
        values = torch.where(self.is_ewma, self.ewma, mean)
        values = torch.where(self.is_momentum, momentum, values)
        defined = torch.where(self.is_momentum, length >= self.window, length > 0)
        values = torch.where(defined, values, torch.full_like(values, float("nan")))
        return values, defined

    def run_tokens(
        self,
        observations: torch.Tensor,  # [n, num_tokens, num_signals]
        examined: torch.Tensor,  # [n, num_tokens] bool
        cut: torch.Tensor,  # [n, num_tokens] bool
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([n, num_tokens, num_signals], [n, num_tokens, num_signals])
        """A run of tokens at once: push column ``j``'s observation (where finite and ``examined``),
        read the scores, then cut ``paragraph_mean`` histories where ``cut`` holds, for j = 0, 1, ..

        The same numbers as that loop of :meth:`push`, :meth:`scores` and :meth:`paragraph_cut`
        (tested bit for bit), with the window sums, lengths and momentum of every column computed
        together; only the EWMA runs column by column (3 ops each). Leaves the view at the state
        after the last column.

        Returns
        -------
        values, defined : torch.Tensor
            ``[n, num_tokens, num_signals]``: the scores after each column's push (NaN where
            undefined), before its cut.

        Examples
        --------
        ``mean`` with W = 2 over the tokens 1, 2, 6; ``paragraph_mean`` with W = 4 cut after 2:

        >>> s = SmootherState.allocate(2, 1, max_window=4)
        >>> s.reset([0, 1], kind=[SmoothingKind.MEAN, SmoothingKind.PARAGRAPH_MEAN], alpha=[0.5, 0.5],
        ...         window=[2, 4])
        >>> v = s.view([0, 1])
        >>> x = torch.tensor([[[1.0], [2.0], [6.0]]] * 2)
        >>> cut = torch.tensor([[False, True, False]] * 2)
        >>> values, _ = v.run_tokens(x, torch.ones(2, 3, dtype=torch.bool), cut)
        >>> values[:, :, 0].tolist()
        [[1.0, 1.5, 4.0], [1.0, 1.5, 4.0]]
        """
        history = self.history  # [n, num_signals, widest]
        n, num_signals, widest = history.shape
        num_tokens = observations.shape[1]
        device = history.device
        x = observations.to(device=device, dtype=history.dtype).transpose(1, 2)  # [n, num_signals, num_tokens]
        ok = torch.isfinite(x) & examined.to(device=device, dtype=torch.bool)[:, None, :]
        pushes = torch.cumsum(ok.to(torch.int64), dim=2)  # observations pushed through column j
        start = self.length[:, :, None]  # [n, num_signals, 1]

        # lengths after column j's push, before its cut: min(W, what the last earlier cut kept + pushes since)
        column = torch.arange(num_tokens, device=device)
        cuts = cut.to(device=device, dtype=torch.bool) & self.is_paragraph[:, None]  # [n, num_tokens]
        last_cut = torch.cummax(torch.where(cuts, column, -1), dim=1).values  # at or before j
        before = torch.cat([torch.full((n, 1), -1, dtype=torch.int64, device=device), last_cut[:, :-1]], dim=1)
        pushed_at_cut = pushes.gather(2, before.clamp(min=0)[:, None, :].expand(n, num_signals, num_tokens))
        kept = ((start + pushed_at_cut) >= 1).to(torch.int64)  # a cut keeps one observation if there is one
        base = torch.where((before >= 0)[:, None, :], kept - pushed_at_cut, start)
        length = torch.minimum(base + pushes, self.window[:, :, None])  # [n, num_signals, num_tokens]

        # the history after each column: the pushed observations in order after the stored ones
        sequence = torch.cat([history.flip(2), torch.zeros((n, num_signals, num_tokens + 1), dtype=history.dtype,
                                                           device=device)], dim=2)
        dump = widest + num_tokens  # where skipped observations go (never read)
        sequence.scatter_(2, torch.where(ok, widest - 1 + pushes, dump), x)
        newest = widest - 1 + pushes  # [n, num_signals, num_tokens]
        index = newest[:, :, :, None] - self.positions[:, :, None, :]  # [n, num_signals, num_tokens, widest]
        windows = sequence.gather(2, index.reshape(n, num_signals, num_tokens * widest))
        windows = windows.view(n, num_signals, num_tokens, widest)  # newest first, as ``history``

        in_history = self.positions[:, :, None, :] < length[:, :, :, None]
        mean = torch.where(in_history, windows, torch.zeros_like(windows)).sum(dim=3)
        mean = mean / length.clamp(min=1).to(history.dtype)
        oldest = windows.gather(3, self.oldest_index[:, :, :, None].expand(n, num_signals, num_tokens, 1))
        momentum = windows[:, :, :, 0] + (windows[:, :, :, 0] - oldest.squeeze(3)) / self.steps[:, :, None]

        first = (start + pushes - ok.to(torch.int64)) == 0  # no observation before this one
        ewma = self.ewma
        smoothed = []
        for j in range(num_tokens):
            blended = torch.where(first[:, :, j], x[:, :, j], torch.lerp(ewma, x[:, :, j], self.alpha))
            ewma = torch.where(ok[:, :, j], blended, ewma)
            smoothed.append(ewma)
        ewma_values = torch.stack(smoothed, dim=2)  # [n, num_signals, num_tokens]

        values = torch.where(self.is_ewma[:, :, None], ewma_values, mean)
        values = torch.where(self.is_momentum[:, :, None], momentum, values)
        defined = torch.where(self.is_momentum[:, :, None], length >= self.window[:, :, None], length > 0)
        values = torch.where(defined, values, torch.full_like(values, float("nan")))

        self.history = windows[:, :, -1]
        last = length[:, :, -1]
        self.length = torch.where(cuts[:, -1:], last.clamp(max=1), last)
        self.ewma = ewma
        return values.transpose(1, 2), defined.transpose(1, 2)

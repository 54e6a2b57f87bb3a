"""SpecExit per-request state for the engine, indexed by request-pool slot (pure torch).

One :class:`SpecExitState` lives in the worker, sized ``max_slots`` (the request-to-token
pool size). A request is :meth:`SpecExitState.reset` into its slot when it is admitted
(this also erases whatever an earlier request left there). Each verify step of a batch then
runs, for ``req_pool_indices`` ``[batch_size]``, one call

``decision = state.step(req_pool_indices, root_ids, accepted_ids, bonus_ids, observations)``

with ``observations`` ``[batch_size, max_drafts + 1, NUM_SIGNALS]``: one observation per
committed token ``r_0..r_a`` (docs/algorithms.md#specexit-step-procedure). In token order, for
each examined position j (a thinking token, see ``criterion.examined_positions``) it pushes the
observation of ``r_j``, runs the exit test on the smoothed scores and, if ``r_j`` is a
boundary, cuts ``paragraph_mean`` histories; then ``criterion.decide_exit`` picks the exit
position from the per-position test results and the guards, and the think-token counts and
thinking flags are committed. The engine applies the cut of the decision afterwards.

Because every token is pushed and tested in token order, the smoothed scores and the
decision at a token depend only on the request's tokens and per-token observations up to
it: splitting the same tokens into steps differently (another verify width, D-Cut tier,
draft-off step, batch) gives the same exit token. The columns are computed together
(``SlotView.run_tokens``: window sums, lengths and momentum for every column at once, only the
EWMA column by column), batched over the requests: no loop per request, no host sync.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from sglang_ext.specexit.criterion import (
    NO_MAX_THINK,
    ExitDecision,
    decide_exit,
    examined_positions,
    signal_test,
    step_run,
)
from sglang_ext.specexit.defaults import MAX_WINDOW
from sglang_ext.specexit.overrides import SpecExitOptions
from sglang_ext.specexit.signals import NUM_SIGNALS
from sglang_ext.specexit.smoothing import IndexLike, SmootherState, SmoothingKind, as_slot_index

BEST_OBSERVATION = (1.0, 1.0, 0.0)
"""The most favourable value of an unknown observation per signal column (confidence, progress,
remain): the first two pass when high and are probabilities, remain passes when low and is >= 0."""


@dataclass
class SpecExitState:
    """Tensor-backed SpecExit state of every request slot.

    Attributes
    ----------
    thinking : torch.Tensor
        ``[max_slots]`` bool: in the thinking phase with SpecExit enabled.
    think_tokens : torch.Tensor
        ``[max_slots]`` int64 thinking tokens emitted so far, the next root included.
    active_signals : torch.Tensor
        ``[max_slots, NUM_SIGNALS]`` bool: the slot's method.
    thresholds : torch.Tensor
        ``[max_slots, NUM_SIGNALS]`` (confidence, progress, remain) thresholds.
    min_think_tokens, max_think_tokens, max_think_grace : torch.Tensor
        ``[max_slots]`` int64 guards; ``max_think_tokens`` is ``NO_MAX_THINK`` when off.
    smoother : SmootherState
        Per-slot predictors of the ``NUM_SIGNALS`` signals.
    boundary_ids : torch.Tensor
        ``[num_boundary_ids]`` int64 paragraph-boundary token ids (server-wide).
    stop_think_id : int
        The stop-think token id (server-wide).

    Examples
    --------
    One request in slot 3, confidence only, EWMA alpha 0.5, threshold 0.8, boundary id 7,
    stop id 9. The tokens 5, 4, 7 come with confidences 0.5, 0.9, 0.9: the EWMA is 0.5, 0.7,
    0.8 (not > 0.8) at the boundary; the next boundary, after one more 0.9, has 0.9 and exits.

    >>> from sglang_ext.specexit.overrides import SpecExitOptions
    >>> state = SpecExitState.allocate(max_slots=4, boundary_ids=[7], stop_think_id=9)
    >>> state.reset([3], [SpecExitOptions(method="confidence", ewma_alpha=0.5)], think_tokens=1)
    >>> slots = torch.tensor([3])
    >>> def obs(*conf):
    ...     return torch.tensor([[[c, float("nan"), float("nan")] for c in conf]])
    >>> d = state.step(slots, torch.tensor([5]), torch.tensor([[4, 7]]), torch.tensor([4]), obs(0.5, 0.9, 0.9))
    >>> d.exit.tolist(), d.first_boundary.tolist()
    ([False], [2])
    >>> d = state.step(slots, torch.tensor([4]), torch.tensor([[7, 4]]), torch.tensor([4]), obs(0.9, 0.9, 0.9))
    >>> d.exit.tolist(), d.keep_drafts.tolist(), state.thinking[3].item()
    ([True], [1], False)
    """

    thinking: torch.Tensor  # [max_slots]
    think_tokens: torch.Tensor  # [max_slots]
    active_signals: torch.Tensor  # [max_slots, NUM_SIGNALS]
    thresholds: torch.Tensor  # [max_slots, NUM_SIGNALS]
    min_think_tokens: torch.Tensor  # [max_slots]
    max_think_tokens: torch.Tensor  # [max_slots]
    max_think_grace: torch.Tensor  # [max_slots]
    smoother: SmootherState
    boundary_ids: torch.Tensor  # [num_boundary_ids]
    stop_think_id: int
    backlog_len: Optional[torch.Tensor] = None  # [max_slots] int64, lagged steps only
    backlog_examined: Optional[torch.Tensor] = None  # [max_slots, backlog_width] bool
    backlog_cut: Optional[torch.Tensor] = None  # [max_slots, backlog_width] bool

    @classmethod
    def allocate(
        cls,
        max_slots: int,
        boundary_ids: Union[torch.Tensor, Sequence[int]],  # [num_boundary_ids]
        stop_think_id: int,
        max_window: int = MAX_WINDOW,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
    ) -> "SpecExitState":
        """Allocate state for ``max_slots`` slots; every slot starts not thinking.

        Parameters
        ----------
        max_slots : int
            Request-pool size (largest ``req_pool_indices`` value + 1).
        boundary_ids : tensor or sequence of int
            ``[num_boundary_ids]`` the boundary set B (non-empty).
        stop_think_id : int
            The stop-think token id.
        max_window : int
            History capacity; every request window must fit.
        dtype : torch.dtype
            Dtype of scores and thresholds.
        device : str or torch.device
            Where all tensors live.

        Examples
        --------
        >>> SpecExitState.allocate(8, [271], 151668).thinking.tolist()
        [False, False, False, False, False, False, False, False]
        """
        device = torch.device(device)
        boundary = torch.as_tensor(boundary_ids, dtype=torch.int64, device=device).reshape(-1)
        if boundary.numel() == 0:
            raise ValueError("the paragraph-boundary set is empty: SpecExit could never exit")

        def zeros_int() -> torch.Tensor:
            return torch.zeros((max_slots,), dtype=torch.int64, device=device)

        return cls(
            thinking=torch.zeros((max_slots,), dtype=torch.bool, device=device),
            think_tokens=zeros_int(),
            active_signals=torch.zeros((max_slots, NUM_SIGNALS), dtype=torch.bool, device=device),
            thresholds=torch.zeros((max_slots, NUM_SIGNALS), dtype=dtype, device=device),
            min_think_tokens=zeros_int(),
            max_think_tokens=torch.full((max_slots,), NO_MAX_THINK, dtype=torch.int64, device=device),
            max_think_grace=zeros_int(),
            smoother=SmootherState.allocate(max_slots, NUM_SIGNALS, max_window, dtype, device),
            boundary_ids=boundary,
            stop_think_id=int(stop_think_id),
        )

    @property
    def max_slots(self) -> int:
        """Number of request slots."""
        return self.thinking.shape[0]

    def reset(
        self,
        slots: IndexLike,  # [n]
        options: Sequence[SpecExitOptions],
        think_tokens: Union[int, Sequence[int]] = 1,
        thinking: Union[bool, Sequence[bool]] = True,
    ) -> None:
        """Initialise ``slots`` for newly admitted requests (host-side, once per request).

        Parameters
        ----------
        slots : tensor or sequence of int
            ``[n]`` request-pool slots, no duplicates.
        options : sequence of SpecExitOptions
            Resolved options per request (server defaults merged with ``custom_params``).
        think_tokens : int or sequence of int
            Thinking tokens already emitted, including the first decode step's root; 1 for
            a request whose prefill sampled its first thinking token.
        thinking : bool or sequence of bool
            Whether each request is in its thinking phase (reasoning enabled). Requests with
            ``options.enable`` False are never thinking for SpecExit.

        Examples
        --------
        >>> state = SpecExitState.allocate(2, [7], 9)
        >>> state.reset([0, 1], [SpecExitOptions(), SpecExitOptions(enable=False)])
        >>> state.thinking.tolist()
        [True, False]
        """
        device = self.thinking.device
        slots_t = as_slot_index(slots, device)
        n = slots_t.numel()
        if len(options) != n:
            raise ValueError(f"got {n} slots but {len(options)} options")
        if n == 0:
            return
        think_list = [think_tokens] * n if isinstance(think_tokens, int) else list(think_tokens)
        flag_list = [thinking] * n if isinstance(thinking, bool) else list(thinking)
        if len(think_list) != n or len(flag_list) != n:
            raise ValueError("think_tokens and thinking must have one entry per slot")
        self.smoother.reset(
            slots_t,
            kind=[int(o.smoothing) for o in options],
            alpha=[o.ewma_alpha for o in options],
            window=[o.window for o in options],
        )
        self.thinking[slots_t] = torch.tensor(
            [bool(f) and o.enable for f, o in zip(flag_list, options)], dtype=torch.bool, device=device
        )
        self.think_tokens[slots_t] = torch.tensor(think_list, dtype=torch.int64, device=device)
        self.active_signals[slots_t] = torch.tensor(
            [o.method.active_columns for o in options], dtype=torch.bool, device=device
        )
        self.thresholds[slots_t] = torch.tensor(
            [o.thresholds for o in options], dtype=self.thresholds.dtype, device=device
        )
        self.min_think_tokens[slots_t] = torch.tensor(
            [o.min_think_tokens for o in options], dtype=torch.int64, device=device
        )
        self.max_think_tokens[slots_t] = torch.tensor(
            [NO_MAX_THINK if o.max_think_tokens is None else o.max_think_tokens for o in options],
            dtype=torch.int64,
            device=device,
        )
        self.max_think_grace[slots_t] = torch.tensor(
            [o.max_think_grace for o in options], dtype=torch.int64, device=device
        )
        if self.backlog_len is not None:
            self.backlog_len[slots_t] = 0

    def release(self, slots: IndexLike) -> None:  # [n]
        """Mark ``slots`` as not thinking (e.g. the request finished or was aborted).

        Examples
        --------
        >>> state = SpecExitState.allocate(1, [7], 9)
        >>> state.reset([0], [SpecExitOptions()])
        >>> state.release([0]); state.thinking.tolist()
        [False]
        """
        self.thinking[as_slot_index(slots, self.thinking.device)] = False

    def scores(
        self, req_pool_indices: torch.Tensor  # [batch_size]
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, NUM_SIGNALS], [batch_size, NUM_SIGNALS])
        """Smoothed scores (NaN where undefined) and their ``defined`` mask.

        Examples
        --------
        >>> state = SpecExitState.allocate(1, [7], 9)
        >>> state.reset([0], [SpecExitOptions()])
        >>> state.scores(torch.tensor([0]))[1].tolist()
        [[False, False, False]]
        """
        return self.smoother.scores(req_pool_indices)

    def signals_pass(self, req_pool_indices: torch.Tensor) -> torch.Tensor:  # [batch_size] -> [batch_size]
        """Whether each slot's smoothed signals pass all its enabled thresholds now.

        Examples
        --------
        >>> state = SpecExitState.allocate(1, [7], 9)
        >>> state.reset([0], [SpecExitOptions()])
        >>> state.signals_pass(torch.tensor([0])).tolist()  # nothing observed yet
        [False]
        """
        index = as_slot_index(req_pool_indices, self.thinking.device)
        values, defined = self.smoother.scores(index)
        return signal_test(values, defined, self.active_signals[index], self.thresholds[index])

    # ------------------------------------------------------------------ lagged observations
    def truncation(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_ids: torch.Tensor,  # [batch_size]
        accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
        bonus_ids: torch.Tensor,  # [batch_size]
        known_columns: int,
        observations: Optional[torch.Tensor] = None,  # [batch_size, max_drafts + 1, NUM_SIGNALS]
        backlog_observations: Optional[torch.Tensor] = None,  # [batch_size, backlog_width, NUM_SIGNALS]
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size] bool, [batch_size] int64)
        """Where a step must end early because a signal exit could need an observation not known yet.

        With observations known only for the columns ``j < known_columns`` of a run (the lagged
        mode of :meth:`step`), a signal exit is possible only there. A step whose run holds an
        examined boundary ``r_j`` with ``j >= known_columns`` and ``n_j >= min_think_tokens`` at
        which the signal rule could fire is cut short before it: it keeps ``j - 1`` drafts and
        ``r_j`` becomes its bonus, so ``r_j`` is the next step's root (column 0), decided once its
        observation is known. The committed tokens are the same; only where one step ends and the
        next begins moves.

        "Could fire": given the known ``observations`` (and the owed ``backlog_observations``
        :meth:`step` would push first), the rule is tested on scores smoothed as if every unknown
        observation took its most favourable value (:data:`BEST_OBSERVATION`: confidence and
        progress 1, remain 0; the ``draft-confidence`` values are probabilities, at most 1). The
        ``ewma``, ``mean`` and ``paragraph_mean`` scores are monotone in every observation, so a
        boundary that fails this test fails for every value the unknowns can take and needs no
        cut; ``momentum`` (not monotone: it subtracts an older value) and calls without
        ``observations`` cut at every such boundary.

        Returns
        -------
        truncate, keep_drafts : torch.Tensor
            ``[batch_size]`` bool (cut this request's step short) and int64 drafts to keep
            (``a`` where not truncated).

        Examples
        --------
        Boundary id 7, two known columns: the boundary at ``j = 3`` of request 0 makes ``r_3``
        the bonus (keep 2 drafts); request 1's boundary at ``j = 1`` is decidable now.

        >>> state = SpecExitState.allocate(2, [7], 9)
        >>> state.reset([0, 1], [SpecExitOptions(), SpecExitOptions()])
        >>> t, keep = state.truncation(torch.tensor([0, 1]), torch.tensor([5, 5]),
        ...                            torch.tensor([[4, 4, 7, 4], [7, 4, 4, -1]]), torch.tensor([3, 3]), 2)
        >>> t.tolist(), keep.tolist()
        ([True, False], [2, 3])
        """
        device = self.thinking.device
        index = as_slot_index(req_pool_indices, device)
        accepted = accepted_ids.to(device=device, dtype=torch.int64)
        run, valid = step_run(root_ids.to(device), accepted)  # [batch_size, max_drafts + 1]
        examined, _ = examined_positions(self.thinking[index], run, valid, bonus_ids, self.stop_think_id)
        boundary = torch.isin(run, self.boundary_ids) & examined
        position = torch.arange(run.shape[1], device=device)  # j
        length = self.think_tokens[index][:, None] + position  # n_j
        firing = boundary & (length >= self.min_think_tokens[index][:, None]) & (position >= max(int(known_columns), 1))
        if observations is not None:
            best = torch.tensor(BEST_OBSERVATION, dtype=observations.dtype, device=device)
            optimistic = torch.where(torch.isfinite(observations.to(device)), observations.to(device), best)
            owed = None
            if backlog_observations is not None:
                owed = backlog_observations.to(device=device, dtype=observations.dtype)
                owed = torch.where(torch.isfinite(owed), owed, best)
            view = self.smoother.view(index)  # a copy: nothing is stored
            values, defined = self._run_with_backlog(view, index, optimistic, examined, boundary, owed)
            could = signal_test(values, defined, self.active_signals[index][:, None, :],
                                self.thresholds[index][:, None, :])  # [batch_size, width]
            momentum = self.smoother.kind[index] == int(SmoothingKind.MOMENTUM)  # [batch_size]
            firing &= could | momentum[:, None]
        beyond = run.shape[1]
        first = torch.where(firing, position, beyond).min(dim=1).values  # [batch_size]
        truncate = first < beyond
        num_accepted = valid.sum(dim=1) - 1  # a
        keep = torch.where(truncate, first - 1, num_accepted)
        return truncate, keep

    def backlog_positions(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_positions: torch.Tensor,  # [batch_size] position of this step's root r_0
    ) -> torch.Tensor:  # [batch_size, backlog_width] int64, -1 past the slot's backlog
        """Positions of the tokens whose observations :meth:`step` still owes (lagged mode).

        They are the last ``backlog_len`` tokens before the root: ``r_known_columns..r_a`` of the
        slot's previous step. ``[batch_size, 0]`` before any lagged step.

        Examples
        --------
        >>> state = SpecExitState.allocate(1, [7], 9)
        >>> state.reset([0], [SpecExitOptions()])
        >>> state.backlog_positions(torch.tensor([0]), torch.tensor([10])).shape
        torch.Size([1, 0])
        """
        device = self.thinking.device
        index = as_slot_index(req_pool_indices, device)
        if self.backlog_len is None:
            return torch.zeros((index.numel(), 0), dtype=torch.int64, device=device)
        count = self.backlog_len[index][:, None]  # [batch_size, 1]
        column = torch.arange(self.backlog_examined.shape[1], device=device)[None, :]
        positions = root_positions.to(device=device, dtype=torch.int64)[:, None] - count + column
        return torch.where(column < count, positions, torch.full_like(positions, -1))

    def _ensure_backlog(self, width: int) -> None:
        old = 0 if self.backlog_examined is None else self.backlog_examined.shape[1]
        if self.backlog_len is not None and width <= old:
            return
        device = self.thinking.device
        examined = torch.zeros((self.max_slots, max(width, old)), dtype=torch.bool, device=device)
        cut = torch.zeros_like(examined)
        if self.backlog_len is None:
            self.backlog_len = torch.zeros((self.max_slots,), dtype=torch.int64, device=device)
        else:
            examined[:, :old] = self.backlog_examined
            cut[:, :old] = self.backlog_cut
        self.backlog_examined, self.backlog_cut = examined, cut

    def _run_with_backlog(
        self,
        view,  # SlotView of index
        index: torch.Tensor,  # [batch_size]
        observations: torch.Tensor,  # [batch_size, width, NUM_SIGNALS]
        examined: torch.Tensor,  # [batch_size, width] bool, the run's columns to push
        cut: torch.Tensor,  # [batch_size, width] bool
        backlog_observations: Optional[torch.Tensor],  # [batch_size, <= backlog_width, NUM_SIGNALS]
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, width, NUM_SIGNALS], same)
        """``view.run_tokens`` over the slots' owed backlog, then the run; scores of the run's columns."""
        device = self.thinking.device
        if self.backlog_len is None:
            return view.run_tokens(observations, examined, cut)
        owed = self.backlog_examined.shape[1]
        column = torch.arange(owed, device=device)[None, :]
        owed_examined = self.backlog_examined[index] & (column < self.backlog_len[index][:, None])
        owed_cut = self.backlog_cut[index] & owed_examined
        if backlog_observations is None:
            backlog_observations = torch.full((index.numel(), owed, NUM_SIGNALS), float("nan"), device=device)
        given = backlog_observations.shape[1]
        if backlog_observations.shape[0] != index.numel() or given > owed:
            raise ValueError(f"backlog_observations must be [batch_size, backlog_width, NUM_SIGNALS] = "
                             f"[{index.numel()}, {owed}, {NUM_SIGNALS}], got {list(backlog_observations.shape)}")
        if given < owed:  # positions read before this step widened the backlog: nothing owed there
            backlog_observations = torch.nn.functional.pad(backlog_observations, (0, 0, 0, owed - given),
                                                           value=float("nan"))
        values, defined = view.run_tokens(
            torch.cat([backlog_observations.to(device=device, dtype=observations.dtype), observations], dim=1),
            torch.cat([owed_examined, examined], dim=1),
            torch.cat([owed_cut, cut], dim=1))
        return values[:, owed:], defined[:, owed:]

    def step(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_ids: torch.Tensor,  # [batch_size]
        accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
        bonus_ids: torch.Tensor,  # [batch_size]
        observations: Optional[torch.Tensor] = None,  # [batch_size, max_drafts + 1, NUM_SIGNALS]
        known_columns: Optional[int] = None,
        backlog_observations: Optional[torch.Tensor] = None,  # [batch_size, backlog_width, NUM_SIGNALS]
    ) -> ExitDecision:
        """Observe, test and decide one verify step, token by token (see the module docstring).

        Parameters
        ----------
        req_pool_indices : torch.Tensor
            ``[batch_size]`` slots, no duplicates.
        root_ids, accepted_ids, bonus_ids : torch.Tensor
            The committed run ``r_0``, ``r_1..r_a`` (``PAD_TOKEN`` after) and the bonus.
        observations : torch.Tensor, optional
            ``[batch_size, max_drafts + 1, NUM_SIGNALS]`` the observation of each committed
            token ``r_j`` (NaN where a signal has none; columns past ``a`` are ignored). None
            pushes nothing: the guards still run, signal exits use the scores as they are.
        known_columns : int, optional
            Lagged mode (a source whose observation of ``r_j`` is known only one step later
            for ``j >= known_columns``, e.g. ``draft-confidence``): only columns
            ``j < known_columns`` are pushed and may exit by signals; the examined tokens after
            them become the slot's backlog, pushed in token order at the start of its next
            step from ``backlog_observations``. Call :meth:`truncation` first and cut the step
            there, so that no boundary the signal rule could fire at lands in a backlog.
        backlog_observations : torch.Tensor, optional
            ``[batch_size, backlog_width, NUM_SIGNALS]`` observations of the tokens at
            :meth:`backlog_positions` (lagged mode; None: NaN, nothing pushed).

        Returns
        -------
        ExitDecision

        Examples
        --------
        Max-think guard M = 3 with no grace; thinking length through r_j is 1 + j:

        >>> state = SpecExitState.allocate(2, [7], 9)
        >>> state.reset([0], [SpecExitOptions(max_think_tokens=3, max_think_grace=0)], think_tokens=1)
        >>> d = state.step(torch.tensor([0]), torch.tensor([5]), torch.tensor([[5, 5, 5]]), torch.tensor([5]))
        >>> d.exit.tolist(), d.keep_drafts.tolist(), d.reason.tolist(), state.think_tokens[0].item()
        ([True], [2], [2], 4)
        """
        device = self.thinking.device
        index = as_slot_index(req_pool_indices, device)
        accepted = accepted_ids.to(device=device, dtype=torch.int64)
        run, valid = step_run(root_ids.to(device), accepted)  # [batch_size, max_drafts + 1]
        thinking = self.thinking[index]  # [batch_size]
        examined, _ = examined_positions(thinking, run, valid, bonus_ids, self.stop_think_id)
        boundary = torch.isin(run, self.boundary_ids) & examined  # [batch_size, max_drafts + 1]
        active = self.active_signals[index]  # [batch_size, NUM_SIGNALS]
        thresholds = self.thresholds[index]  # [batch_size, NUM_SIGNALS]
        if observations is not None and observations.shape[:2] != run.shape:
            raise ValueError(f"observations must be [batch_size, max_drafts + 1, NUM_SIGNALS] = "
                             f"[{run.shape[0]}, {run.shape[1]}, {NUM_SIGNALS}], got {list(observations.shape)}")
        if observations is None:
            observations = torch.full((*run.shape, NUM_SIGNALS), float("nan"), device=device)
        width = run.shape[1]
        view = self.smoother.view(index)
        if known_columns is None:
            values, defined = view.run_tokens(observations, examined, boundary)  # [batch_size, width, S]
            known = torch.ones((1, width), dtype=torch.bool, device=device)
        else:
            known = torch.arange(width, device=device)[None, :] < int(known_columns)  # [1, width]
            self._ensure_backlog(width - int(known_columns))
            values, defined = self._run_with_backlog(view, index, observations.to(device), examined & known,
                                                     boundary & known, backlog_observations)
        self.smoother.store(index, view)
        passes = signal_test(values, defined, active[:, None, :], thresholds[:, None, :])  # [batch_size, width]
        passes = passes & known
        decision = decide_exit(
            thinking=thinking,
            root_ids=run[:, 0],
            accepted_ids=accepted,
            bonus_ids=bonus_ids,
            think_tokens=self.think_tokens[index],
            signals_pass=passes,
            min_think_tokens=self.min_think_tokens[index],
            max_think_tokens=self.max_think_tokens[index],
            max_think_grace=self.max_think_grace[index],
            boundary_ids=self.boundary_ids,
            stop_think_id=self.stop_think_id,
        )
        counts = self.think_tokens[index]
        self.think_tokens[index] = torch.where(decision.was_thinking, counts + decision.emitted_len, counts)
        self.thinking[index] = decision.still_thinking
        if known_columns is not None:
            k = int(known_columns)
            owed = self.backlog_examined.shape[1]
            tail_examined = examined[:, k:] & decision.still_thinking[:, None]  # [batch_size, width - k]
            pad = owed - tail_examined.shape[1]
            self.backlog_examined[index] = torch.nn.functional.pad(tail_examined, (0, pad))
            self.backlog_cut[index] = torch.nn.functional.pad(boundary[:, k:] & tail_examined, (0, pad))
            self.backlog_len[index] = torch.where(decision.still_thinking,
                                                  (valid.sum(dim=1) - k).clamp(min=0), torch.zeros_like(counts))
        return decision

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
from sglang_ext.specexit.smoothing import IndexLike, SmootherState, as_slot_index


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

    def step(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_ids: torch.Tensor,  # [batch_size]
        accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
        bonus_ids: torch.Tensor,  # [batch_size]
        observations: Optional[torch.Tensor] = None,  # [batch_size, max_drafts + 1, NUM_SIGNALS]
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
        view = self.smoother.view(index)
        values, defined = view.run_tokens(observations, examined, boundary)  # [batch_size, max_drafts + 1, S]
        self.smoother.store(index, view)
        passes = signal_test(values, defined, active[:, None, :], thresholds[:, None, :])  # [batch_size, width]
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
        return decision

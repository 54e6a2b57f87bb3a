"""SpecExit per-request state for the engine, indexed by request-pool slot (pure torch).

One :class:`SpecExitState` lives in the worker, sized ``max_slots`` (the request-to-token
pool size). A request is :meth:`SpecExitState.reset` into its slot when it is admitted
(this also erases whatever an earlier request left there). Each verify step of a batch then
runs, for ``req_pool_indices`` ``[batch_size]``:

1. ``decision = state.decide(req_pool_indices, root_ids, accepted_ids, bonus_ids)``:
   reads the scores smoothed up to the previous step; changes nothing.
2. The engine applies the cut of ``decision`` (docs/sglang_internals.md#the-specexit-cut) and computes
   this step's signals over the committed positions (root + accepted drafts).
3. ``state.observe(req_pool_indices, decision, signals)``: cuts ``paragraph_mean``
   histories where a boundary was evaluated, pushes the signals of requests still thinking,
   advances think-token counts and clears the thinking flag of exited/finished requests.

:meth:`SpecExitState.step` runs 1 and 3 together. The decisions are a deterministic function
of the resets and the per-step inputs, so a log of (resets, per-step tokens and signals)
replays to the same decisions. No step function synchronises with the host.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from sglang_ext.specexit.criterion import (
    NO_BOUNDARY,
    NO_MAX_THINK,
    ExitDecision,
    decide_exit,
    signal_test,
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
    One request in slot 3, confidence only, EWMA alpha 0.5, boundary id 7, stop id 9:

    >>> from sglang_ext.specexit.overrides import SpecExitOptions
    >>> state = SpecExitState.allocate(max_slots=4, boundary_ids=[7], stop_think_id=9)
    >>> state.reset([3], [SpecExitOptions(method="confidence", ewma_alpha=0.5)], think_tokens=1)
    >>> slots = torch.tensor([3])
    >>> signals = torch.tensor([[0.9, float("nan"), float("nan")]])
    >>> d = state.step(slots, torch.tensor([5]), torch.tensor([[4, 7]]), torch.tensor([4]), signals)
    >>> d.exit.tolist()  # no observation before this step: cannot exit yet
    [False]
    >>> d = state.step(slots, torch.tensor([4]), torch.tensor([[7, 4]]), torch.tensor([4]), signals)
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

    def decide(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_ids: torch.Tensor,  # [batch_size]
        accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
        bonus_ids: torch.Tensor,  # [batch_size]
    ) -> ExitDecision:
        """This step's exit decisions, from the state after the previous step (read-only).

        See :func:`sglang_ext.specexit.criterion.decide_exit` for the rules.

        Examples
        --------
        Max-think guard M = 3 with no grace; thinking length through r_j is 1 + j:

        >>> state = SpecExitState.allocate(2, [7], 9)
        >>> state.reset([0], [SpecExitOptions(max_think_tokens=3, max_think_grace=0)], think_tokens=1)
        >>> d = state.decide(torch.tensor([0]), torch.tensor([5]), torch.tensor([[5, 5, 5]]),
        ...                  torch.tensor([5]))
        >>> d.exit.tolist(), d.keep_drafts.tolist(), d.reason.tolist()
        ([True], [2], [2])
        """
        index = as_slot_index(req_pool_indices, self.thinking.device)
        return decide_exit(
            thinking=self.thinking[index],
            root_ids=root_ids,
            accepted_ids=accepted_ids,
            bonus_ids=bonus_ids,
            think_tokens=self.think_tokens[index],
            signals_pass=self.signals_pass(index),
            min_think_tokens=self.min_think_tokens[index],
            max_think_tokens=self.max_think_tokens[index],
            max_think_grace=self.max_think_grace[index],
            boundary_ids=self.boundary_ids,
            stop_think_id=self.stop_think_id,
        )

    def observe(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        decision: ExitDecision,
        signals: Optional[torch.Tensor] = None,  # [batch_size, NUM_SIGNALS]
    ) -> None:
        """Commit a step: paragraph cuts, signal pushes, think counts, thinking flags.

        Parameters
        ----------
        req_pool_indices : torch.Tensor
            ``[batch_size]`` the slots passed to :meth:`decide`.
        decision : ExitDecision
            What :meth:`decide` returned for this step.
        signals : torch.Tensor, optional
            ``[batch_size, NUM_SIGNALS]`` this step's observations (mean over root +
            accepted drafts, NaN where unused). Only requests still thinking are pushed;
            None pushes nothing.

        Examples
        --------
        >>> state = SpecExitState.allocate(1, [7], 9)
        >>> state.reset([0], [SpecExitOptions()], think_tokens=1)
        >>> d = state.decide(torch.tensor([0]), torch.tensor([5]), torch.tensor([[5, -1]]),
        ...                  torch.tensor([5]))
        >>> state.observe(torch.tensor([0]), d, torch.tensor([[0.9, 0.5, 20.0]]))
        >>> state.thinking[0].item(), state.think_tokens[0].item()  # 1 + (r_1, bonus)
        (True, 3)
        """
        index = as_slot_index(req_pool_indices, self.thinking.device)
        evaluated = decision.first_boundary != NO_BOUNDARY  # [batch_size]
        self.smoother.paragraph_cut(index, evaluated)
        still_thinking = decision.still_thinking  # [batch_size]
        if signals is not None:
            self.smoother.push(index, signals, still_thinking)
        counts = self.think_tokens[index]
        self.think_tokens[index] = torch.where(
            decision.was_thinking, counts + decision.emitted_len, counts
        )
        self.thinking[index] = still_thinking

    def step(
        self,
        req_pool_indices: torch.Tensor,  # [batch_size]
        root_ids: torch.Tensor,  # [batch_size]
        accepted_ids: torch.Tensor,  # [batch_size, max_drafts]
        bonus_ids: torch.Tensor,  # [batch_size]
        signals: Optional[torch.Tensor] = None,  # [batch_size, NUM_SIGNALS]
    ) -> ExitDecision:
        """:meth:`decide` then :meth:`observe` for one verify step (see the class example)."""
        decision = self.decide(req_pool_indices, root_ids, accepted_ids, bonus_ids)
        self.observe(req_pool_indices, decision, signals)
        return decision

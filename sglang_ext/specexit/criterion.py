"""SpecExit exit criterion for one verify step of a batch (pure torch, no host sync).

docs/algorithms.md#specexit-step-procedure (exit test, guards);
docs/sglang_internals.md#the-specexit-cut for how the engine applies it.

Token diagram of one request in one step (SGLang convention, ``a`` accepted drafts)::

    position j         0     1     2   ...   a    | bonus
    token              r_0   r_1   r_2 ...   r_a  | b
                       root (emitted by the previous step)
    emitted this step        r_1 ... r_a, b                 (accept_lens = a + 1)
    thinking length    n_j = think_tokens + j     (think_tokens counts r_0 already)

The rules are **per token**: each position is examined once, in token order, and whether a
position exits depends only on the tokens and per-token signals up to it, never on how the
tokens were split into steps (the same request exits at the same token whatever the verify
width, D-Cut tier, batch or draft-off pattern). A position is *examined* if the request is
thinking and no stop-think token comes before it (``examined_positions``):

* **Natural end.** A stop-think token among r_0..r_a, or as the bonus b, ends thinking on its
  own at its position; positions before it are still examined (a boundary there can exit),
  positions from it on are not. The bonus is position ``a + 1``: r_0..r_a are all examined.
* **Boundary.** ``r_j`` is a boundary if its id is in the boundary set B. The first examined
  one is ``j*`` (``first_boundary``, reported).
* **Signal exit** at the first examined j with ``r_j`` in B, ``n_j >= min_think_tokens`` and
  every enabled signal passing at j (``signals_pass[:, j]``: the test on the scores smoothed
  over the observations of every thinking token up to and including r_j, computed by
  ``SpecExitState.step``; a ``[batch_size]`` vector applies to every position).
* **Forced exit** (``max_think_tokens = M`` set, grace ``G``): at the first examined j with
  ``r_j`` in B and ``n_j >= M``, or, failing that, at the first examined j with
  ``n_j >= M + G``, with no signal test. The thinking span is never longer than ``M + G``.
* The exit point is the first position where either rule fires (reason ``SIGNALS`` wins if
  both fire there). The step then keeps ``r_1..r_j`` (``keep_drafts = j``) and the engine
  emits ``(r_1..r_j, stop_think)``: ``accept_lens' = j + 1``. Without an exit
  ``keep_drafts = a``. An exit before a stop-think token of the same step wins (the request
  is exited, not ended naturally).

Every position 0..a is examined once per step and the bonus becomes the next step's root,
so every thinking token is examined exactly once.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Tuple

import torch

from sglang_ext.specexit.signals import NUM_SIGNALS, Signal

#: Padding of accepted-run token ids after a request's ``a`` accepted drafts.
PAD_TOKEN = -1

#: ``first_boundary`` when no boundary was evaluated for the request this step.
NO_BOUNDARY = -1

#: ``max_think_tokens`` value of a slot whose max-think guard is off.
NO_MAX_THINK = -1


class ExitReason(enum.IntEnum):
    """Why a request was exited this step (``ExitDecision.reason``)."""

    NONE = 0
    SIGNALS = 1
    MAX_THINK = 2


@dataclass(frozen=True)
class ExitDecision:
    """Per-request outcome of one verify step. All tensors are ``[batch_size]``.

    Attributes
    ----------
    exit : torch.Tensor
        bool: SpecExit ends thinking at this step (emit ``(r_1..r_keep, stop_think)``).
    keep_drafts : torch.Tensor
        int64 accepted drafts to keep, ``0..a``; equals ``a`` when not exiting.
    reason : torch.Tensor
        int64 ``ExitReason`` values (``NONE`` when not exiting).
    natural_end : torch.Tensor
        bool: the stop-think token is among the step's tokens and no exit fired before it;
        the request left thinking on its own (only for requests that were thinking).
    first_boundary : torch.Tensor
        int64 ``j*`` in ``0..a``: the first examined boundary, at or before the exit position;
        ``NO_BOUNDARY`` if there is none.
    num_accepted : torch.Tensor
        int64 ``a``, accepted drafts before the cut.
    was_thinking : torch.Tensor
        bool thinking flag at the start of the step.

    Examples
    --------
    One request that exits at ``j* = 1`` out of ``a = 3`` accepted drafts:

    >>> d = ExitDecision(exit=torch.tensor([True]), keep_drafts=torch.tensor([1]),
    ...                  reason=torch.tensor([1]), natural_end=torch.tensor([False]),
    ...                  first_boundary=torch.tensor([1]), num_accepted=torch.tensor([3]),
    ...                  was_thinking=torch.tensor([True]))
    >>> d.emitted_len.tolist(), d.still_thinking.tolist()
    ([2], [False])
    """

    exit: torch.Tensor  # [batch_size]
    keep_drafts: torch.Tensor  # [batch_size]
    reason: torch.Tensor  # [batch_size]
    natural_end: torch.Tensor  # [batch_size]
    first_boundary: torch.Tensor  # [batch_size]
    num_accepted: torch.Tensor  # [batch_size]
    was_thinking: torch.Tensor  # [batch_size]

    @property
    def emitted_len(self) -> torch.Tensor:  # [batch_size]
        """Tokens the step emits after the cut: ``keep_drafts + 1`` (the new accept_lens)."""
        return self.keep_drafts + 1

    @property
    def still_thinking(self) -> torch.Tensor:  # [batch_size]
        """Thinking after this step: was thinking, no natural end, no exit."""
        return self.was_thinking & ~self.natural_end & ~self.exit


def signal_test(
    scores: torch.Tensor,  # [batch_size, NUM_SIGNALS] (or [..., NUM_SIGNALS])
    defined: torch.Tensor,  # [batch_size, NUM_SIGNALS]
    active: torch.Tensor,  # [batch_size, NUM_SIGNALS]
    thresholds: torch.Tensor,  # [batch_size, NUM_SIGNALS]
) -> torch.Tensor:  # [batch_size]
    """Whether every enabled signal passes its threshold (docs/algorithms.md#specexit-exit-test).

    confidence > threshold, progress > threshold, remain < threshold, all strict. An
    undefined or NaN score fails. A request with no enabled signal never passes. The signals
    are the last dimension; leading dimensions broadcast (e.g. ``[batch_size, num_tokens,
    NUM_SIGNALS]`` scores with ``[batch_size, 1, NUM_SIGNALS]`` thresholds).

    Parameters
    ----------
    scores : torch.Tensor
        ``[batch_size, NUM_SIGNALS]`` smoothed scores in the fixed columns.
    defined : torch.Tensor
        ``[batch_size, NUM_SIGNALS]`` bool, False where a score has no value yet.
    active : torch.Tensor
        ``[batch_size, NUM_SIGNALS]`` bool, the request's method.
    thresholds : torch.Tensor
        ``[batch_size, NUM_SIGNALS]`` thresholds in the fixed columns.

    Returns
    -------
    torch.Tensor
        ``[batch_size]`` bool.

    Examples
    --------
    Confidence exactly at its threshold fails (strict); the second request passes:

    >>> scores = torch.tensor([[0.8, 0.5, 100.0], [0.81, 0.5, 100.0]])
    >>> thresholds = torch.tensor([[0.8, 0.3, 200.0]]).expand(2, 3)
    >>> ones = torch.ones(2, 3, dtype=torch.bool)
    >>> signal_test(scores, ones, ones, thresholds).tolist()
    [False, True]
    """
    thresholds = thresholds.to(scores.dtype)
    is_remain = torch.arange(NUM_SIGNALS, device=scores.device) == int(Signal.REMAIN)  # [NUM_SIGNALS]
    passes = torch.where(is_remain, scores < thresholds, scores > thresholds)
    passes = passes & defined.to(torch.bool)
    active = active.to(torch.bool)
    return (passes | ~active).all(dim=-1) & active.any(dim=-1)


def decide_exit(
    thinking: torch.Tensor,  # [batch_size] bool
    root_ids: torch.Tensor,  # [batch_size]
    accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
    bonus_ids: torch.Tensor,  # [batch_size]
    think_tokens: torch.Tensor,  # [batch_size]
    signals_pass: torch.Tensor,  # [batch_size] or [batch_size, max_drafts + 1] bool
    min_think_tokens: torch.Tensor,  # [batch_size]
    max_think_tokens: torch.Tensor,  # [batch_size], NO_MAX_THINK when off
    max_think_grace: torch.Tensor,  # [batch_size]
    boundary_ids: torch.Tensor,  # [num_boundary_ids]
    stop_think_id: int,
) -> ExitDecision:
    """Decide, for each request of a verify step, whether and where SpecExit cuts.

    See the module docstring for the rules. Vectorised, no host synchronisation.

    Parameters
    ----------
    thinking : torch.Tensor
        ``[batch_size]`` bool: the request is in its thinking phase with SpecExit enabled.
    root_ids : torch.Tensor
        ``[batch_size]`` root token r_0 (the previous step's bonus).
    accepted_ids : torch.Tensor
        ``[batch_size, max_drafts]`` accepted drafts r_1..r_a, then ``PAD_TOKEN``.
    bonus_ids : torch.Tensor
        ``[batch_size]`` this step's bonus (correction) token b.
    think_tokens : torch.Tensor
        ``[batch_size]`` thinking tokens emitted before this step, r_0 included.
    signals_pass : torch.Tensor
        ``[batch_size, max_drafts + 1]`` bool, :func:`signal_test` at each position ``j`` on
        the scores smoothed through ``r_j`` (``SpecExitState.step``); or ``[batch_size]``,
        the same outcome at every position.
    min_think_tokens : torch.Tensor
        ``[batch_size]`` no signal exit at a position with ``n_j`` below this.
    max_think_tokens : torch.Tensor
        ``[batch_size]`` forced-exit length M, or ``NO_MAX_THINK``.
    max_think_grace : torch.Tensor
        ``[batch_size]`` grace window G after M.
    boundary_ids : torch.Tensor
        ``[num_boundary_ids]`` the paragraph-boundary token ids B.
    stop_think_id : int
        Token id of the stop-think token.

    Returns
    -------
    ExitDecision

    Examples
    --------
    Boundary id 7, stop id 9. Request 0 has ``r_2 = 7`` and passing signals: keep 2
    drafts. Request 1 accepts the stop token before its boundary: natural end, no exit.

    >>> d = decide_exit(
    ...     thinking=torch.tensor([True, True]),
    ...     root_ids=torch.tensor([5, 5]),
    ...     accepted_ids=torch.tensor([[4, 7, 4], [9, 7, -1]]),
    ...     bonus_ids=torch.tensor([3, 3]),
    ...     think_tokens=torch.tensor([10, 10]),
    ...     signals_pass=torch.tensor([True, True]),
    ...     min_think_tokens=torch.tensor([0, 0]),
    ...     max_think_tokens=torch.tensor([NO_MAX_THINK, NO_MAX_THINK]),
    ...     max_think_grace=torch.tensor([64, 64]),
    ...     boundary_ids=torch.tensor([7]),
    ...     stop_think_id=9,
    ... )
    >>> d.exit.tolist(), d.keep_drafts.tolist(), d.reason.tolist(), d.natural_end.tolist()
    ([True, False], [2, 2], [1, 0], [False, True])
    """
    device = accepted_ids.device
    thinking = thinking.to(device=device, dtype=torch.bool)
    accepted = accepted_ids.to(torch.int64)
    batch_size, max_drafts = accepted.shape
    run, valid = step_run(root_ids, accepted)  # [batch_size, max_drafts + 1] each
    examined, natural_end = examined_positions(thinking, run, valid, bonus_ids, stop_think_id)

    position = torch.arange(max_drafts + 1, device=device)  # j
    boundary = torch.isin(run, boundary_ids.to(device=device, dtype=torch.int64)) & examined
    length = think_tokens.to(device=device, dtype=torch.int64)[:, None] + position  # n_j

    passes = signals_pass.to(device=device, dtype=torch.bool)
    if passes.dim() == 1:
        passes = passes[:, None]
    min_think = min_think_tokens.to(device=device, dtype=torch.int64)[:, None]
    by_signals = boundary & (length >= min_think) & passes

    max_think = max_think_tokens.to(device=device, dtype=torch.int64)[:, None]
    grace = max_think_grace.to(device=device, dtype=torch.int64)[:, None]
    capped = max_think != NO_MAX_THINK
    forced = capped & examined & ((boundary & (length >= max_think)) | (length >= max_think + grace))

    beyond = max_drafts + 1  # "no such position"
    candidate = by_signals | forced
    exit_at = torch.where(candidate, position, beyond).min(dim=1).values  # [batch_size]
    do_exit = exit_at < beyond
    exit_col = exit_at.clamp(max=max_drafts)[:, None]
    signal_reason = by_signals.gather(1, exit_col).squeeze(1)
    reason = torch.where(
        do_exit,
        torch.where(signal_reason, int(ExitReason.SIGNALS), int(ExitReason.MAX_THINK)),
        int(ExitReason.NONE),
    )
    reached = boundary & (position[None, :] <= exit_at[:, None])  # boundaries up to the exit
    first = torch.where(reached, position, beyond).min(dim=1).values
    first_boundary = torch.where(first < beyond, first, NO_BOUNDARY)
    return ExitDecision(
        exit=do_exit,
        keep_drafts=torch.where(do_exit, exit_at, valid[:, 1:].sum(dim=1)),
        reason=reason.to(torch.int64),
        natural_end=natural_end & ~do_exit,
        first_boundary=first_boundary,
        num_accepted=valid[:, 1:].sum(dim=1),
        was_thinking=thinking,
    )


def step_run(
    root_ids: torch.Tensor,  # [batch_size]
    accepted_ids: torch.Tensor,  # [batch_size, max_drafts], PAD_TOKEN after the a drafts
) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, max_drafts + 1], [batch_size, max_drafts + 1])
    """The committed run ``r_0..r_a`` of each request and which of its columns hold a token.

    Column 0 is the root (always valid, also with no draft column: a draft-off step).

    Examples
    --------
    >>> run, valid = step_run(torch.tensor([5]), torch.tensor([[4, -1]]))
    >>> run.tolist(), valid.tolist()
    ([[5, 4, -1]], [[True, True, False]])
    """
    accepted = accepted_ids.to(torch.int64)
    device = accepted.device
    root = root_ids.to(device=device, dtype=torch.int64)
    batch_size = accepted.shape[0]
    run = torch.cat([root[:, None], accepted], dim=1)
    valid = torch.cat([torch.ones((batch_size, 1), dtype=torch.bool, device=device), accepted != PAD_TOKEN], dim=1)
    return run, valid


def examined_positions(
    thinking: torch.Tensor,  # [batch_size] bool
    run: torch.Tensor,  # [batch_size, max_drafts + 1]: r_0..r_a, then PAD_TOKEN
    valid: torch.Tensor,  # [batch_size, max_drafts + 1] bool
    bonus_ids: torch.Tensor,  # [batch_size]
    stop_think_id: int,
) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, max_drafts + 1], [batch_size])
    """Positions that are thinking tokens of a thinking request, and where thinking ends by itself.

    A position is examined if the request is thinking, the position holds a token, and no
    stop-think token comes before it (the stop token's own position is not examined). A
    stop-think bonus ends thinking after ``r_a``.

    Returns
    -------
    examined : torch.Tensor
        ``[batch_size, max_drafts + 1]`` bool.
    natural_end : torch.Tensor
        ``[batch_size]`` bool: a thinking request has a stop-think token among r_0..r_a or b.

    Examples
    --------
    >>> run = torch.tensor([[5, 7, 9, 4], [5, 7, -1, -1]])
    >>> valid = run != -1
    >>> e, n = examined_positions(torch.tensor([True, True]), run, valid, torch.tensor([3, 9]), 9)
    >>> e.tolist(), n.tolist()
    ([[True, True, False, False], [True, True, False, False]], [True, True])
    """
    device = run.device
    thinking = thinking.to(device=device, dtype=torch.bool)
    bonus = bonus_ids.to(device=device, dtype=torch.int64)
    is_stop = (run == stop_think_id) & valid  # [batch_size, max_drafts + 1]
    before_stop = torch.cumsum(is_stop.to(torch.int64), dim=1) == 0
    examined = thinking[:, None] & valid & before_stop
    natural_end = thinking & (is_stop.any(dim=1) | (bonus == stop_think_id))
    return examined, natural_end


def split_emitted_run(
    next_token_ids: torch.Tensor,  # [batch_size * num_draft_tokens]
    accept_lens: torch.Tensor,  # [batch_size]
    num_draft_tokens: int,
) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, num_draft_tokens - 1], [batch_size])
    """Split SGLang's strided emitted runs into accepted drafts and bonus tokens.

    Request ``b`` emits ``E = next_token_ids[b*N : b*N + L]`` with ``L = accept_lens[b]``:
    ``E = (r_1 .. r_a, bonus)`` with ``a = L - 1`` (docs/sglang_internals.md#the-specexit-cut).
    The root ``r_0`` is not in this tensor: it is ``draft_token.view(bs, N)[:, 0]`` of the verify input.

    Parameters
    ----------
    next_token_ids : torch.Tensor
        ``[batch_size * N]`` target tokens, stride N (front-compacted for trees).
    accept_lens : torch.Tensor
        ``[batch_size]`` L = a + 1, ``1 <= L <= N``.
    num_draft_tokens : int
        N, the verify width per request.

    Returns
    -------
    accepted : torch.Tensor
        ``[batch_size, N - 1]`` int64 r_1..r_a then ``PAD_TOKEN``.
    bonus : torch.Tensor
        ``[batch_size]`` int64 bonus tokens.

    Examples
    --------
    >>> acc, bonus = split_emitted_run(torch.tensor([11, 12, 13, 99, 21, 22, 77, 0]),
    ...                                torch.tensor([4, 3]), num_draft_tokens=4)
    >>> acc.tolist(), bonus.tolist()
    ([[11, 12, 13], [21, 22, -1]], [99, 77])
    """
    lengths = accept_lens.to(device=next_token_ids.device, dtype=torch.int64)
    batch_size = lengths.numel()
    rows = next_token_ids.to(torch.int64).view(batch_size, num_draft_tokens)
    column = torch.arange(num_draft_tokens - 1, device=rows.device)
    accepted = torch.where(
        column[None, :] < (lengths - 1)[:, None], rows[:, :-1], torch.full_like(rows[:, :-1], PAD_TOKEN)
    )
    bonus = rows.gather(1, (lengths - 1)[:, None]).squeeze(1)
    return accepted, bonus


def pad_ragged(
    values: torch.Tensor,  # [total]
    indptr: torch.Tensor,  # [batch_size + 1], exclusive offsets, indptr[0] == 0
    width: int,
    pad: int = PAD_TOKEN,
) -> torch.Tensor:  # [batch_size, width]
    """Turn ragged token ids (values + exclusive indptr) into a padded matrix.

    ``width`` must be at least the longest segment (longer segments are truncated).

    Parameters
    ----------
    values : torch.Tensor
        ``[total]`` concatenated per-request ids.
    indptr : torch.Tensor
        ``[batch_size + 1]`` exclusive offsets with a leading 0.
    width : int
        Columns of the result.
    pad : int
        Fill value after each segment (default ``PAD_TOKEN``).

    Returns
    -------
    torch.Tensor
        ``[batch_size, width]`` int64.

    Examples
    --------
    >>> pad_ragged(torch.tensor([4, 7, 8]), torch.tensor([0, 2, 2, 3]), width=2).tolist()
    [[4, 7], [-1, -1], [8, -1]]
    """
    indptr = indptr.to(device=values.device, dtype=torch.int64)
    batch_size = indptr.numel() - 1
    out = torch.full((batch_size, width), pad, dtype=torch.int64, device=values.device)
    if values.numel() == 0 or width == 0:
        return out
    start = indptr[:-1][:, None]  # [batch_size, 1]
    column = torch.arange(width, device=values.device)[None, :]
    index = (start + column).clamp(max=values.numel() - 1)
    inside = column < (indptr[1:] - indptr[:-1])[:, None]
    return torch.where(inside, values.to(torch.int64)[index], out)


def single_token_ids(
    encode: Callable[[str], Sequence[int]], strings: Iterable[str]
) -> Tuple[Tuple[int, ...], Tuple[str, ...]]:
    """Ids of the strings that encode to exactly one token (the boundary set B, A.6).

    Parameters
    ----------
    encode : callable
        ``text -> token ids`` without special tokens (e.g.
        ``lambda s: tokenizer.encode(s, add_special_tokens=False)``).
    strings : iterable of str
        Candidate step-split strings.

    Returns
    -------
    ids : tuple of int
        Distinct single-token ids, in the order first seen.
    dropped : tuple of str
        Strings that did not encode to one token (the caller warns; an empty ``ids`` is a
        launch error).

    Examples
    --------
    >>> vocab = {"\\n\\n": [5], ".\\n\\n": [6], " \\n\\n": [1, 5]}
    >>> single_token_ids(vocab.__getitem__, ["\\n\\n", ".\\n\\n", " \\n\\n"])
    ((5, 6), (' \\n\\n',))
    """
    ids = []
    dropped = []
    for text in strings:
        encoded = list(encode(text))
        if len(encoded) == 1:
            if int(encoded[0]) not in ids:
                ids.append(int(encoded[0]))
        else:
            dropped.append(text)
    return tuple(ids), tuple(dropped)


def stop_think_token_id(encode: Callable[[str], Sequence[int]], text: str) -> int:
    """The single token id of the stop-think text; a multi-token text is an error (A.6).

    Examples
    --------
    >>> stop_think_token_id({"</think>": [151668]}.__getitem__, "</think>")
    151668
    """
    encoded = list(encode(text))
    if len(encoded) != 1:
        raise ValueError(
            f"stop-think token {text!r} encodes to {len(encoded)} tokens {encoded}; it must be exactly one"
        )
    return int(encoded[0])

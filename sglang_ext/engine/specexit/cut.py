"""The SpecExit cut: exact in-place edits of a verify result (docs/sglang_internals.md#the-specexit-cut).

After the base ``EAGLEWorkerV2.verify()`` returned, a request ``b`` that SpecExit exits at
``j*`` (``keep_drafts = j*`` accepted drafts kept out of ``a``) must emit
``(r_1 .. r_{j*}, STOP)`` instead of ``(r_1 .. r_a, bonus)``. With ``N`` verify tokens per
request, ``L = accept_lens[b] = a + 1`` and ``L' = j* + 1``::

    next_token_ids[b*N + L' - 1]  = STOP            (entries >= L' are ignored downstream)
    accept_lens[b]                = L'
    new_seq_lens[b]              -= L - L'          (published by on_publish after verify)
    bonus_tokens[b]               = STOP            (the next step's root)
    prepared_draft_extend_inputs  = (L' - 1, b*N + L' - 1, ids with ids[b*N + L' - 1] = STOP)
    accept_index[b, L':]          = NO_NODE         (hygiene; read later by PP only)
    next_token_logprobs[b, L'-1]  = log p(STOP)     (only when logprobs are returned)

Everything else (KV slots, ``req_to_token``, hidden states, ``seq_lens``) is already right:
the dropped positions become ordinary over-allocation past the new length (section 3).
Trees (topk > 1) need no special case: the base verify already compacted the accepted path
to the front of each request's block.

Every edit is vectorised over the batch with ``torch.where`` (no boolean-mask indexing), so
nothing synchronises with the host. Requests that do not exit are rewritten with their own
values. Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

#: Padding of ``accept_index`` after a request's accepted nodes (SGLang's convention).
NO_NODE = -1


def cut_lengths(
    accept_lens: torch.Tensor,  # [batch_size]
    exit_mask: torch.Tensor,  # [batch_size] bool
    keep_drafts: torch.Tensor,  # [batch_size]
) -> torch.Tensor:  # [batch_size] int64
    """New emitted lengths ``L'``: ``keep_drafts + 1`` where exiting, else ``accept_lens``.

    Examples
    --------
    >>> cut_lengths(torch.tensor([4, 3]), torch.tensor([True, False]), torch.tensor([1, 2])).tolist()
    [2, 3]
    """
    old = accept_lens.to(torch.int64)
    new = keep_drafts.to(device=old.device, dtype=torch.int64) + 1
    return torch.where(exit_mask.to(device=old.device, dtype=torch.bool), torch.minimum(new, old), old)


def _set_at(
    flat: torch.Tensor,  # [batch_size * num_draft_tokens]
    index: torch.Tensor,  # [batch_size] flat positions, one per request
    exit_mask: torch.Tensor,  # [batch_size] bool
    value: int,
) -> None:
    """``flat[index[b]] = value`` where ``exit_mask[b]`` (in place, no host sync)."""
    current = flat[index]
    flat[index] = torch.where(exit_mask, torch.full_like(current, value), current)


def apply_exit_cut(
    next_token_ids: torch.Tensor,  # [batch_size * num_draft_tokens]
    accept_lens: torch.Tensor,  # [batch_size]
    new_seq_lens: torch.Tensor,  # [batch_size]
    bonus_tokens: torch.Tensor,  # [batch_size]
    exit_mask: torch.Tensor,  # [batch_size] bool
    keep_drafts: torch.Tensor,  # [batch_size]
    stop_think_id: int,
    num_draft_tokens: int,
    accept_index: Optional[torch.Tensor] = None,  # [batch_size, spec_steps + 1]
    prepared_draft_extend_inputs: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:  # [batch_size] int64
    """Rewrite a verify result in place so that exiting requests emit ``(r_1..r_j*, STOP)``.

    Parameters
    ----------
    next_token_ids : torch.Tensor
        ``[batch_size * N]`` emitted tokens, stride N (``GenerationBatchResult.next_token_ids``).
    accept_lens : torch.Tensor
        ``[batch_size]`` ``L = a + 1`` per request; set to ``L'``.
    new_seq_lens : torch.Tensor
        ``[batch_size]`` ``seq_lens + L``; reduced by ``L - L'``.
    bonus_tokens : torch.Tensor
        ``[batch_size]`` ``next_draft_input.bonus_tokens``; STOP where exiting.
    exit_mask : torch.Tensor
        ``[batch_size]`` bool, the requests SpecExit exits this step.
    keep_drafts : torch.Tensor
        ``[batch_size]`` accepted drafts to keep (``j*``), ``0 <= keep <= a``.
    stop_think_id : int
        The stop-think token id.
    num_draft_tokens : int
        ``N``, the stride of ``next_token_ids``.
    accept_index : torch.Tensor, optional
        ``[batch_size, spec_steps + 1]`` accepted global node ids; ``NO_NODE`` past ``L'``.
    prepared_draft_extend_inputs : tuple, optional
        ``(num_correct_drafts [batch_size], select_index [batch_size],
        next_token_ids [batch_size * N])`` of the CUDA topk=1 commit, updated consistently.

    Returns
    -------
    torch.Tensor
        ``[batch_size]`` int64 ``L'``.

    Examples
    --------
    The worked example of docs/sglang_internals.md#the-specexit-cut (stop id 9): request 0 exits after
    its first accepted draft, request 1 is untouched.

    >>> ids = torch.tensor([11, 12, 13, 99, 21, 22, 77, 0], dtype=torch.int32)
    >>> lens = torch.tensor([4, 3], dtype=torch.int32)
    >>> seq = torch.tensor([14, 23])
    >>> bonus = torch.tensor([99, 77], dtype=torch.int32)
    >>> new = apply_exit_cut(ids, lens, seq, bonus, torch.tensor([True, False]),
    ...                      torch.tensor([1, 2]), stop_think_id=9, num_draft_tokens=4)
    >>> ids.tolist(), lens.tolist(), seq.tolist(), bonus.tolist(), new.tolist()
    ([11, 9, 13, 99, 21, 22, 77, 0], [2, 3], [12, 23], [9, 77], [2, 3])
    """
    exit_mask = exit_mask.to(device=next_token_ids.device, dtype=torch.bool)
    new, last = _shorten(accept_lens, new_seq_lens, exit_mask, keep_drafts, num_draft_tokens, accept_index,
                         prepared_draft_extend_inputs)
    _set_at(next_token_ids, last, exit_mask, stop_think_id)
    bonus_tokens.copy_(torch.where(exit_mask, torch.full_like(bonus_tokens, stop_think_id), bonus_tokens))
    if prepared_draft_extend_inputs is not None:
        ids_copy = prepared_draft_extend_inputs[2]
        _set_at(ids_copy, last.to(device=ids_copy.device), exit_mask.to(ids_copy.device), stop_think_id)
    return new


def apply_truncation(
    next_token_ids: torch.Tensor,  # [batch_size * num_draft_tokens]
    accept_lens: torch.Tensor,  # [batch_size]
    new_seq_lens: torch.Tensor,  # [batch_size]
    bonus_tokens: torch.Tensor,  # [batch_size]
    truncate: torch.Tensor,  # [batch_size] bool
    keep_drafts: torch.Tensor,  # [batch_size]
    num_draft_tokens: int,
    accept_index: Optional[torch.Tensor] = None,  # [batch_size, spec_steps + 1]
    prepared_draft_extend_inputs: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:  # [batch_size] int64
    """End a request's step after ``keep_drafts`` accepted drafts, its next accepted draft as the bonus.

    The same tokens are committed over two steps instead of one: ``r_{keep + 1}`` (already at
    ``next_token_ids[b*N + keep]``, and its logprob in that column) becomes the bonus, so it is
    the next step's root; the rest of the run is dropped as a cut drops it (lengths, the next
    root, the prepared draft-extend inputs, ``accept_index``). SpecExit's lagged signals
    (``SpecExitState.truncation``) cut a step short before a boundary they cannot decide yet.

    Examples
    --------
    >>> ids = torch.tensor([11, 12, 13, 99, 21, 22, 77, 0], dtype=torch.int32)
    >>> lens, seq = torch.tensor([4, 3], dtype=torch.int32), torch.tensor([14, 23])
    >>> bonus = torch.tensor([99, 77], dtype=torch.int32)
    >>> new = apply_truncation(ids, lens, seq, bonus, torch.tensor([True, False]), torch.tensor([1, 2]), 4)
    >>> ids.tolist(), lens.tolist(), seq.tolist(), bonus.tolist()
    ([11, 12, 13, 99, 21, 22, 77, 0], [2, 3], [12, 23], [12, 77])
    """
    truncate = truncate.to(device=next_token_ids.device, dtype=torch.bool)
    new, last = _shorten(accept_lens, new_seq_lens, truncate, keep_drafts, num_draft_tokens, accept_index,
                         prepared_draft_extend_inputs)
    kept = next_token_ids[last].to(bonus_tokens.dtype)
    bonus_tokens.copy_(torch.where(truncate.to(bonus_tokens.device), kept.to(bonus_tokens.device), bonus_tokens))
    return new


def _shorten(
    accept_lens: torch.Tensor,  # [batch_size]
    new_seq_lens: torch.Tensor,  # [batch_size]
    mask: torch.Tensor,  # [batch_size] bool
    keep_drafts: torch.Tensor,  # [batch_size]
    num_draft_tokens: int,
    accept_index: Optional[torch.Tensor],  # [batch_size, spec_steps + 1]
    prepared_draft_extend_inputs: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size] L', [batch_size] flat index of the last token)
    """The length edits shared by a cut and a truncation (in place); returns ``L'`` and ``b*N + L' - 1``."""
    device = mask.device
    batch_size = accept_lens.shape[0]
    old = accept_lens.to(torch.int64, copy=True)  # a copy: accept_lens is rewritten below
    new = cut_lengths(accept_lens, mask, keep_drafts)
    last = torch.arange(batch_size, device=device, dtype=torch.int64) * num_draft_tokens + new - 1
    accept_lens.copy_(new.to(accept_lens.dtype))
    new_seq_lens.sub_((old - new).to(new_seq_lens.dtype))
    if accept_index is not None:
        column = torch.arange(accept_index.shape[1], device=device)[None, :]
        beyond = mask[:, None] & (column >= new[:, None])
        accept_index.copy_(torch.where(beyond, torch.full_like(accept_index, NO_NODE), accept_index))
    if prepared_draft_extend_inputs is not None:
        num_correct, select_index, _ = prepared_draft_extend_inputs
        num_correct.copy_((new - 1).to(num_correct.dtype))
        select_index.copy_(last.to(select_index.dtype))
    return new, last


def stop_token_logprobs(
    next_token_logits: torch.Tensor,  # [batch_size * num_draft_tokens, vocab_size]
    rows: torch.Tensor,  # [batch_size] logits row of each request's forced position
    stop_think_id: int,
    temperatures: Optional[torch.Tensor] = None,  # [batch_size, 1]
) -> torch.Tensor:  # [batch_size]
    """Log-probability of the stop token at the forced position (the logprob fix, row 7).

    Same formula as SGLang's speculative logprobs: ``log_softmax(logits / T)`` (``T = 1``
    for greedy batches), clamped at the dtype's minimum.

    Examples
    --------
    >>> logits = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    >>> round(stop_token_logprobs(logits, torch.tensor([0]), stop_think_id=1).exp().item(), 6)
    0.75
    """
    gathered = next_token_logits[rows.to(torch.int64)].to(torch.float32)  # [batch_size, vocab_size]
    if temperatures is not None:
        gathered = gathered / temperatures.to(gathered.dtype).reshape(-1, 1)
    logprobs = torch.log_softmax(gathered, dim=-1)
    logprobs.clamp_(min=torch.finfo(logprobs.dtype).min)
    return logprobs[:, stop_think_id]

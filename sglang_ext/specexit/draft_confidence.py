"""Training-free SpecExit confidence from the draft's own token probabilities.

Signal source ``draft-confidence`` (``--specexit-signal-source draft-confidence``): SpecExit
without a trained signal head, for any EAGLE3 draft. It provides ``confidence`` only, so it
is valid only with the method ``confidence``; progress and remain columns are NaN.

Definition (per token)
----------------------
The observation of the committed token at position ``p`` is the draft's one-step confidence
there: the max-softmax ``exp(max(l) - logsumexp(l))`` of the draft logits ``l`` that predict
position ``p`` from the target's own hidden state at ``p - 2`` and the token at ``p - 1`` -- the
row an EAGLE3 draft extend runs for position ``p - 2`` after the verify that computed that hidden
state (a STANDALONE draft's extend row for the token at ``p - 1`` likewise). It is the draft's
certainty about the next token given text the target has committed, whatever the draft
proposed there and whether it was accepted. Because every row depends only on the committed
tokens before ``p``, the observation, and with it the exit, is a function of the committed
token sequence alone: not of the verify width, D-Cut's tier, draft-off steps or the batch.
Exception: the first output token (sampled by the prefill, whose draft extend keeps only its
last row, the one that predicts the second) has no observation.

When it is known. At a verify step with root ``r_0`` at position ``P``, the values of ``r_0``
and ``r_1`` come from earlier extends; those of ``r_2..r_a`` and the bonus only from this step's
extend, which runs after the decision. So the state runs lagged (:data:`KNOWN_COLUMNS` columns
known, the rest pushed first thing in the next step) and a step whose ``r_j``, ``j >= 2``, is a
boundary the rule could fire at is cut short before it, so that ``r_j`` is decided as the next
step's root (``SpecExitState.truncation``). The observations then go through the request's
smoother (default EWMA, alpha 0.1) and the usual test ``x_hat > confidence_threshold`` at a
paragraph boundary. It is not a calibrated probability of a correct answer; the threshold
should be tuned for this source (the head's default 0.8 is a starting point).

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import torch

from sglang_ext.specexit.defaults import SIGNAL_SOURCES
from sglang_ext.specexit.signals import NUM_SIGNALS, Signal, SpecExitMethod

#: The signal source this module implements (``--specexit-signal-source``).
DRAFT_CONFIDENCE_SOURCE = "draft-confidence"

#: Columns of a verify step's run whose observations are known at its decision: ``r_0``, ``r_1``.
KNOWN_COLUMNS = 2

#: A draft-extend row run for position ``q`` gives the observation of position ``q + OBSERVED_OFFSET``.
OBSERVED_OFFSET = 2


def check_signal_source(source: str, method: SpecExitMethod) -> None:
    """Reject an unknown signal source, or ``draft-confidence`` with progress or remain.

    Parameters
    ----------
    source : str
        ``"head"`` or ``"draft-confidence"``.
    method : SpecExitMethod
        The server's method.

    Raises
    ------
    ValueError
        With a message naming the source and the offending signals.

    Examples
    --------
    >>> from sglang_ext.specexit.signals import parse_method
    >>> check_signal_source("draft-confidence", parse_method("confidence"))
    >>> check_signal_source("draft-confidence", parse_method("confidence_remain"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: signal source 'draft-confidence' provides confidence only; ... also asks for remain
    """
    if source not in SIGNAL_SOURCES:
        raise ValueError(f"unknown signal source {source!r}; expected one of {', '.join(SIGNAL_SOURCES)}")
    if source == DRAFT_CONFIDENCE_SOURCE:
        extra = [n for n in method.names if n != Signal.CONFIDENCE.label]
        if extra:
            raise ValueError(
                f"signal source {source!r} provides confidence only; method '{method.name}' also asks for "
                f"{', '.join(extra)}"
            )


def max_softmax(
    logits: torch.Tensor,  # [num_tokens, vocab_size]
) -> torch.Tensor:  # [num_tokens]
    """Probability of the argmax token: ``exp(max - logsumexp)``, in at least float32.

    Computed as ``1 / sum(exp(l - max(l)))``, which is the same number without the
    cancellation of ``max - logsumexp`` at large logits.

    Parameters
    ----------
    logits : torch.Tensor
        ``[num_tokens, vocab_size]`` draft logits (any vocabulary, e.g. EAGLE3 hot tokens).

    Returns
    -------
    torch.Tensor
        ``[num_tokens]`` probabilities in (0, 1].

    Examples
    --------
    >>> max_softmax(torch.tensor([[0.0, 0.0], [0.0, -float("inf")]])).tolist()
    [0.5, 1.0]
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    shifted = logits - logits.max(dim=-1, keepdim=True).values  # [num_tokens, vocab_size], max 0
    return 1.0 / torch.exp(shifted).sum(dim=-1)


def draft_confidence_signals(
    values: torch.Tensor,  # [batch_size, known]
    width: int,
) -> torch.Tensor:  # [batch_size, width, NUM_SIGNALS]
    """Observations of one step's run in the fixed signal columns: confidence, NaN elsewhere.

    Column ``j < known`` is the observation of ``r_j`` (``values[:, j]``); the columns after
    it are NaN (not known yet: the lagged state does not push them). Ready for
    ``SpecExitState.step(known_columns=known)`` in place of the head's decoded signals.

    Parameters
    ----------
    values : torch.Tensor
        ``[batch_size, known]`` per-token confidences of ``r_0 .. r_{known-1}`` (NaN: none).
    width : int
        Columns of the result (the longest run ``r_0..r_a``).

    Examples
    --------
    >>> draft_confidence_signals(torch.tensor([[0.5, 1.0]]), width=3)[:, :, 0].tolist()
    [[0.5, 1.0, nan]]
    """
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    batch_size = values.shape[0]
    out = torch.full((batch_size, width, NUM_SIGNALS), float("nan"), dtype=values.dtype, device=values.device)
    columns = min(width, values.shape[1])
    out[:, :columns, int(Signal.CONFIDENCE)] = values[:, :columns]
    return out

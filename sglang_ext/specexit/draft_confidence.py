"""Training-free SpecExit confidence from the draft's own token probabilities.

Signal source ``draft-confidence`` (``--specexit-signal-source draft-confidence``): SpecExit
without a trained signal head, for any EAGLE3 draft. It provides ``confidence`` only, so it
is valid only with the method ``confidence``; progress and remain columns are NaN.

Definition
----------
Let ``q_j`` be the draft probability of the j-th draft token of a request in this step:
the draft's max-softmax ``exp(max(l) - logsumexp(l))`` of its logits ``l`` under greedy
drafting (the probability of its own proposal), or ``q(x_j)`` under sampled drafting; for a
tree node, its probability given its parent. Each *accepted* draft ``r_j`` is observed with
``q_j``, in token order; the root and the bonus have no draft probability (the draft did not
propose them) and are not observed (NaN: the smoother skips them). The observations then go
through the request's smoother (default EWMA, alpha 0.1) and the usual test
``x_hat > confidence_threshold`` at a paragraph boundary, per token as for the head. The score
reflects how certain the draft is on text that the target agreed with; it is not a calibrated
probability of a correct answer, and the confidence threshold should be tuned for this source
(the head's default 0.8 is a starting point, not a calibrated value).

**Not a function of the tokens alone.** Which committed tokens were drafted (and at which
draft depth, i.e. from which draft features) depends on how the tokens were split into
steps: the verify width, D-Cut's tier and draft-off steps, the batch. So with this source
the exit token can move with D-Cut and the load, unlike the head's signal, which is read
from the target's own hidden state at every committed token (docs/algorithms.md).

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import torch

from sglang_ext.specexit.defaults import SIGNAL_SOURCES
from sglang_ext.specexit.signals import NUM_SIGNALS, Signal, SpecExitMethod

#: The signal source this module implements (``--specexit-signal-source``).
DRAFT_CONFIDENCE_SOURCE = "draft-confidence"


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
    draft_probs: torch.Tensor,  # [batch_size, max_drafts]
    width: int,
) -> torch.Tensor:  # [batch_size, width, NUM_SIGNALS]
    """Per-token observations of one step in the fixed signal columns: confidence, NaN elsewhere.

    Column ``j`` is the observation of ``r_j``: ``q_j`` for an accepted draft (``j >= 1``),
    NaN for the root (the draft did not propose it). Columns past a request's ``a`` are
    ignored by ``SpecExitState.step``. Ready for ``SpecExitState.step`` in place of the
    head's decoded signals.

    Parameters
    ----------
    draft_probs : torch.Tensor
        ``[batch_size, max_drafts]``: ``draft_probs[b, j - 1]`` is ``q_j`` of the j-th draft
        on the accepted path.
    width : int
        Columns of the result, ``1 + max_drafts`` or fewer (the longest run ``r_0..r_a``).

    Examples
    --------
    >>> draft_confidence_signals(torch.tensor([[0.5, 1.0]]), width=3)[:, :, 0].tolist()
    [[nan, 0.5, 1.0]]
    """
    probs = draft_probs.to(torch.promote_types(draft_probs.dtype, torch.float32))
    batch_size = probs.shape[0]
    out = torch.full((batch_size, width, NUM_SIGNALS), float("nan"), dtype=probs.dtype, device=probs.device)
    columns = min(width - 1, probs.shape[1])
    out[:, 1 : 1 + columns, int(Signal.CONFIDENCE)] = probs[:, :columns]
    return out

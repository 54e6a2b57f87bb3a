"""Training-free SpecExit confidence from the draft's own token probabilities.

Signal source ``draft-confidence`` (``--specexit-signal-source draft-confidence``): SpecExit
without a trained signal head, for any EAGLE3 draft. It provides ``confidence`` only, so it
is valid only with the method ``confidence``; progress and remain columns are NaN.

Definition
----------
Let ``q_j`` be the draft probability of the j-th draft token of a request in this step:
the draft's max-softmax ``exp(max(l) - logsumexp(l))`` of its logits ``l`` under greedy
drafting (the probability of its own proposal), or ``q(x_j)`` under sampled drafting; for a
tree node, its probability given its parent. With ``a`` accepted drafts, the per-step
observation is the mean over the *accepted* run::

    x_t = (1 / a) * sum_{j=1..a} q_j            (a >= 1)
    x_t = NaN  ("no observation")               (a == 0)

``x_t`` then goes through the request's smoother (default EWMA, alpha 0.1) and the usual
test ``x_hat > confidence_threshold`` at a paragraph boundary. The root and the bonus have
no draft probability (the draft did not propose them) and are not part of the mean. A step
with no accepted draft pushes nothing (the smoother skips non-finite observations), so the
score reflects how certain the draft is on text that the target agreed with; it is not a
calibrated probability of a correct answer, and the confidence threshold should be tuned
for this source (the head's default 0.8 is a starting point, not a calibrated value).

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


def draft_confidence_observation(
    draft_probs: torch.Tensor,  # [batch_size, max_drafts]
    num_accepted: torch.Tensor,  # [batch_size]
) -> torch.Tensor:  # [batch_size]
    """Mean draft probability over each request's accepted drafts (NaN when none).

    Parameters
    ----------
    draft_probs : torch.Tensor
        ``[batch_size, max_drafts]``: ``draft_probs[b, j - 1]`` is ``q_j`` of the j-th
        draft on the accepted path; entries past ``num_accepted[b]`` are ignored.
    num_accepted : torch.Tensor
        ``[batch_size]`` accepted drafts ``a``.

    Returns
    -------
    torch.Tensor
        ``[batch_size]`` observations ``x_t``.

    Examples
    --------
    >>> p = torch.tensor([[0.5, 1.0, 0.2], [0.9, 0.1, 0.1]])
    >>> draft_confidence_observation(p, torch.tensor([2, 0])).tolist()
    [0.75, nan]
    """
    probs = draft_probs.to(torch.promote_types(draft_probs.dtype, torch.float32))
    count = num_accepted.to(device=probs.device, dtype=torch.int64)
    on_run = torch.arange(probs.shape[1], device=probs.device)[None, :] < count[:, None]
    total = torch.where(on_run, probs, torch.zeros_like(probs)).sum(dim=1)
    return total / count.to(probs.dtype)  # 0 / 0 = NaN: no observation


def draft_confidence_signals(
    draft_probs: torch.Tensor,  # [batch_size, max_drafts]
    num_accepted: torch.Tensor,  # [batch_size]
) -> torch.Tensor:  # [batch_size, NUM_SIGNALS]
    """Per-step observations in the fixed signal columns: confidence, NaN elsewhere.

    Ready for ``SpecExitState.observe`` in place of the head's decoded signals.

    Examples
    --------
    >>> draft_confidence_signals(torch.tensor([[0.5, 1.0]]), torch.tensor([2])).tolist()
    [[0.75, nan, nan]]
    """
    observation = draft_confidence_observation(draft_probs, num_accepted)  # [batch_size]
    out = torch.full(
        (observation.shape[0], NUM_SIGNALS), float("nan"), dtype=observation.dtype, device=observation.device
    )
    out[:, int(Signal.CONFIDENCE)] = observation
    return out

"""Draft confidences and survival scores for D-Cut (pure torch).

The survival score of a draft node is the probability that greedy verification reaches and
accepts it: the product of the draft confidences along its root path,
``s_j = prod_{t <= j} c_t`` (docs/algorithms.md#d-cut-survival-scores, draft indexing; the root/bonus slot is not
scored and is always kept). Products are computed in log space.

Non-finite confidences (NaN, +-inf) make their node and all its descendants *ineligible*:
their score is ``INELIGIBLE_SCORE`` and the planner never keeps them, so the keep count can
fall below the budget. They are counted in :class:`SurvivalScores`, never raised. Finite
confidences are clamped to ``[0, 1]``.

See ``tree.py`` for the glossary of shape names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_ext.dcut.tree import TreeTopology, _constant, path_reduce

INELIGIBLE_SCORE = float("-inf")

__all__ = [
    "INELIGIBLE_SCORE",
    "SurvivalScores",
    "confidence_from_logits",
    "confidence_from_probs",
    "chain_survival",
    "tree_survival",
]


@dataclass(frozen=True)
class SurvivalScores:
    """Survival scores plus the counts of bad inputs (device tensors, no host sync).

    Attributes
    ----------
    scores : torch.Tensor
        Float32 survival scores in ``[0, 1]``, ``INELIGIBLE_SCORE`` for ineligible nodes.
        Chains: ``[batch_size, num_draft_slots]``; trees: ``[batch_size, num_nodes]`` with the
        root column equal to 1.
    num_nonfinite : torch.Tensor
        0-d int64: confidences that were NaN or infinite.
    num_ineligible : torch.Tensor
        0-d int64: scored nodes made ineligible (the non-finite ones and their descendants).
    """

    scores: torch.Tensor
    num_nonfinite: torch.Tensor
    num_ineligible: torch.Tensor


def confidence_from_logits(
    logits: torch.Tensor,  # [..., vocab_size]
    token_ids: Optional[torch.Tensor] = None,  # [...] proposed tokens; None = the argmax
) -> torch.Tensor:  # [...] float32
    """Draft confidence for greedy drafting: the softmax probability of the proposed token.

    ``c = exp(logit[x] - logsumexp(logits))``; with ``token_ids=None`` the proposal is the
    argmax and ``c = exp(max(logits) - logsumexp(logits))`` (the max-softmax). Computed in
    float32. Rows with NaN/inf logits produce non-finite confidences (made ineligible later).

    Parameters
    ----------
    logits : torch.Tensor
        ``[..., vocab_size]`` draft logits (EAGLE3: over the draft's own vocabulary).
    token_ids : torch.Tensor, optional
        ``[...]`` indices of the proposed tokens in the same vocabulary.

    Returns
    -------
    torch.Tensor
        ``[...]`` float32 confidences in ``[0, 1]`` (or non-finite for bad rows).

    Examples
    --------
    >>> confidence_from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.2]]))).tolist()
    [0.5]
    >>> round(confidence_from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.2]])),
    ...                              torch.tensor([1])).item(), 6)
    0.3
    """
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    if token_ids is None:
        chosen = logits.amax(dim=-1)
    else:
        chosen = logits.gather(-1, token_ids.to(torch.int64).unsqueeze(-1)).squeeze(-1)
    return torch.exp(chosen - lse)


def confidence_from_probs(
    draft_probs: torch.Tensor,  # [..., vocab_size]
    token_ids: torch.Tensor,  # [...] sampled tokens
) -> torch.Tensor:  # [...] float32
    """Draft confidence for sampled drafting: ``q(x)``, the draft probability of the sampled token.

    Parameters
    ----------
    draft_probs : torch.Tensor
        ``[..., vocab_size]`` draft distribution the token was sampled from.
    token_ids : torch.Tensor
        ``[...]`` sampled token indices.

    Returns
    -------
    torch.Tensor
        ``[...]`` float32.

    Examples
    --------
    >>> confidence_from_probs(torch.tensor([[0.1, 0.9], [0.6, 0.4]]),
    ...                       torch.tensor([1, 1])).mul(100).round().tolist()
    [90.0, 40.0]
    """
    return draft_probs.float().gather(-1, token_ids.to(torch.int64).unsqueeze(-1)).squeeze(-1)


def _log_conf(conf: torch.Tensor) -> torch.Tensor:
    """log of clamped confidences, NaN exactly where the confidence is not finite."""
    conf = conf.float()
    # ``conf - conf`` is 0 for finite confidences and NaN for NaN / +-inf; adding it leaves
    # the finite logs unchanged (``log`` never returns -0.0).
    return conf.clamp(0.0, 1.0).log_().add_(conf - conf)


def _scores_from_log(
    log_s: torch.Tensor,  # NaN where ineligible
) -> torch.Tensor:  # float32 survival scores, INELIGIBLE_SCORE where ineligible
    # Path sums of logs of [0, 1] values are <= 0, so ``exp`` is finite: only NaN is replaced.
    return log_s.exp().nan_to_num_(nan=INELIGIBLE_SCORE)


def chain_survival(
    conf: torch.Tensor,  # [batch_size, num_draft_slots]
) -> SurvivalScores:
    """Survival scores of chains: ``s[i, k] = prod_{t <= k} conf[i, t]`` over draft slots.

    The bonus/root slot is not part of the input (it is always kept). Computed as
    ``exp(cumsum(log c))``. A non-finite confidence makes its slot and every later slot of
    that request ineligible.

    Parameters
    ----------
    conf : torch.Tensor
        ``[batch_size, num_draft_slots]`` per-draft confidences (``K = N - 1`` columns).

    Returns
    -------
    SurvivalScores
        ``scores`` is ``[batch_size, num_draft_slots]`` float32.

    Examples
    --------
    >>> s = chain_survival(torch.tensor([[0.5, 0.5, 1.0], [0.9, float("nan"), 0.9]]))
    >>> s.scores.tolist(), int(s.num_nonfinite), int(s.num_ineligible)
    ([[0.5, 0.25, 0.25], [0.8999999761581421, -inf, -inf]], 1, 2)
    """
    logc = _log_conf(conf)
    nonfinite = torch.isnan(logc)
    log_s = torch.cumsum(logc, dim=1)  # NaN propagates to all later slots
    ineligible = torch.isnan(log_s)
    return SurvivalScores(
        scores=_scores_from_log(log_s),
        num_nonfinite=torch.count_nonzero(nonfinite),
        num_ineligible=torch.count_nonzero(ineligible),
    )


def tree_survival(
    conf: torch.Tensor,  # [batch_size, num_nodes], column 0 (root) ignored
    topology: TreeTopology,
) -> SurvivalScores:
    """Survival scores of trees: the product of confidences on each root -> node path.

    ``conf[b, v]`` is the draft's probability of node v given its parent (the root's entry is
    ignored). Path sums of ``log c`` are accumulated by pointer jumping, so scores never
    increase from parent to child. Nodes not linked to the root are ineligible (not counted
    as non-finite).

    Parameters
    ----------
    conf : torch.Tensor
        ``[batch_size, num_nodes]`` per-node conditional confidences.
    topology : TreeTopology
        Parents and depths of the same trees.

    Returns
    -------
    SurvivalScores
        ``scores`` is ``[batch_size, num_nodes]`` float32 with the root column 1.

    Examples
    --------
    Root 0 -> {1, 2}, 1 -> {3}::

        >>> topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1]]))
        >>> tree_survival(torch.tensor([[1.0, 0.5, 0.25, 0.5]]), topo).scores.tolist()
        [[1.0, 0.5, 0.25, 0.25]]
    """
    logc = _log_conf(conf)
    # Root: log 1 = 0 (the sum identity; the root is not scored, so it is never non-finite).
    logc.select(1, 0).fill_(0.0)
    nonfinite = torch.isnan(logc)
    reachable = topology.reachable_shared()
    # Nodes not linked to the root: NaN (ineligible, not counted as non-finite).
    logc = torch.where(reachable, logc, _constant(math.nan, torch.float32, logc.device))
    log_s = path_reduce(logc, topology, "sum")
    num_nonfinite = torch.count_nonzero(nonfinite & reachable)
    num_ineligible = torch.count_nonzero(torch.isnan(log_s[:, 1:]))  # scored (non-root) nodes
    return SurvivalScores(
        scores=_scores_from_log(log_s), num_nonfinite=num_nonfinite, num_ineligible=num_ineligible
    )

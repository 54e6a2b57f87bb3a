"""D-Cut for DFlash blocks: the project's ``DFlashWorkerV2`` subclass (SGLang glue).

The plugin selects ``sglang_ext.engine.dflash_worker.ExtDFlashWorker`` (which drives
:class:`DFlashDCutRunner`) for ``--speculative-algorithm DFLASH --dcut ...``.
A DFlash step drafts one block per request (the anchor/bonus token plus ``K = N - 1`` drafts from
one non-causal draft forward) and the target verifies the block as a chain, so D-Cut on DFlash is
a per-request prefix cut (docs/algorithms.md#d-cut-on-dflash-blocks)::

    draft forward (full block, unchanged)
      -> confidence of each proposed token c[b, j] = softmax(lm_head(h[b, j]))[draft[b, j]]
         (the draft proposes the argmax, so c is the max-softmax, i.e. q_draft(x_j) of the token it
          proposes, for greedy and sampled requests alike; computed from the same logits inside the
          draft graph: ConfidenceDraftSampler, or after the eager greedy head)
      -> survival s[b, j] = prod_{t <= j} c[b, t]                sglang_ext.dcut.chain_survival
      -> exemptions (grammar, logprobs, penalties: full block)
      -> tier + global top-K -> keep_lens[b] (kept drafts)       sglang_ext.dcut.choose
      -> agree on (keep, tier) across TP ranks                    runner.agree_across_ranks
      -> target verify forward over the kept prefixes only, ragged rows padded to the tier width
         (compact_verify.TargetForwardInterceptor; logits and hidden states scattered back to
          the strided [bs * N] layout, pruned rows 0)
      -> SGLang's own accept, capped at keep_lens[b]:
         greedy (argmax) accept: every draft past a request's kept prefix replaced by NO_TOKEN in a
           copy of the candidates, so acceptance stops at keep_lens[b]; the bonus is the target's
           argmax at the last accepted row, which is always a kept row
         sampled accept (SGLang's target-only speculative sampling, used when a request samples and
           the build has the kernel): the unmodified candidates, then clamp_to_kept_prefix
      -> commit and draft-KV materialization: unchanged (they read only rows < commit_lens)

Worked example (bs = 2, N = 4, fixed tier 0.5 -> width ceil(2 * 4 * 0.5) = 4 rows)::

    confidences        [[0.9, 0.9, 0.1], [0.8, 0.2, 0.5]]
    survival           [[0.9, 0.81, 0.081], [0.8, 0.16, 0.08]]  -> keep 2 slots: keep_lens [2, 0]
    strided rows       [a0 d1 d2 d3 | a1 d1 d2 d3]
    verified rows      [a0 d1 d2 | a1]            (kept_index [0, 1, 2, 4])
    candidates seen by accept   [[a0, d1, d2, NO_TOKEN], [a1, NO_TOKEN, NO_TOKEN, NO_TOKEN]]
    accept_len <= [2, 0]; bonus = target argmax at row accept_len (a kept row)

Greedy output is therefore identical to the unpruned worker's (a pruned draft can only be
accepted after every kept draft before it was; cutting it only ends the run earlier, and the bonus
is the same target argmax).

Sampled requests stay exact in distribution. DFlash's draft is deterministic (greedy head), and
SGLang's sampled accept is chain speculative sampling against that point-mass proposal: draft
``x_j`` is accepted with probability ``p_{j-1}(x_j)`` (target row ``j - 1``), on rejection the
committed token is drawn from ``p_{j-1}`` without ``x_j``. Every decision up to draft ``k + 1``
reads only rows ``0..k``. With ``k = keep_lens[b]`` kept drafts, :func:`clamp_to_kept_prefix` turns
"accepted ``x_{k+1}`` (and maybe more)" into "stop at ``k``, bonus ``x_{k+1}``": the token at
position ``k`` is then ``x_{k+1}`` with probability ``p_k(x_{k+1})`` and any other ``y`` with
probability ``(1 - p_k(x_{k+1})) * p_k(y) / (1 - p_k(x_{k+1})) = p_k(y)``, i.e. a draw from
``p_k``, exactly what speculative sampling on the chain cut to ``k`` drafts commits. Runs that stop
before ``k`` are untouched. Pruned rows carry zero logits (uniform target rows): the kernel may
read them past ``k + 1``, and what it decides there is discarded by the clamp. Poisoning with
``NO_TOKEN`` is not used on this path (the kernel indexes the target probabilities with the
candidate ids). KV: kept rows write their own window slots, pruned slots are never
written and lie past every committed length (over-allocation that the request's release frees);
nothing is allocated or freed here.

GPU: a compacted step carries a ``RaggedVerifyLayout`` and no mask; SGLang's own eager
FlashInfer path already plans it (``DFlashVerifyInput.generate_attn_arg_prefill`` reads the layout:
ragged ``qo_indptr``, keys = prefix + kept prefix of the window), as do FA3/trtllm_mha. The compacted
forward sets ``spec_info.num_tokens_per_req = N + 1`` so the bs-keyed width-N target graphs refuse it
(SGLang's ``can_run_graph`` lets widths <= 0 through); per-tier graphs need the ``flashinfer_dcut``
backend (``sglang_ext.engine.attention.flashinfer_dcut``) plus the tier-graph runner that captures them
(``sglang_ext.engine.dcut.graphs``; written and CPU-tested, never run on a GPU).

Launch-time cost profiling, the cost table on the model config and ``/server_info``, metrics and
TP agreement are the EAGLE3 D-Cut glue's (:class:`DFlashDCutRunner` subclasses
``runner.DCutRunner``, whose ``decide`` / ``compact_verify`` make the step decision of both
runners; ``profiler.obtain_cost_table`` times full steps of this worker through
``DCutRunner.forced_ratio``).

Not pruned (full verification, counted in the metrics): requests with a grammar, logprobs,
penalties/logit bias/min_new_tokens (per request, as for EAGLE3); DFlash selector / LiLiCorr /
Domino drafters, simulated acceptance
(``SGLANG_SIMULATE_ACC_LEN``), pipeline parallelism, adaptive spec, hybrid (mamba) targets and DP
attention (D-Cut disabled for the server with a warning).

Can ``DFlashWorkerV2`` run on the CPU testbed? No, not through the stand-ins and the torch
backend alone (checked against the installed SGLang 0.5.23 source, and on this machine):

1. **Device gate at launch.** ``arg_groups/speculative_hook.py::_handle_dflash`` raises
   ``ValueError("DFLASH speculative decoding is not supported by ... on device 'cpu'")`` unless
   ``--device`` is ``cuda*``, ``npu`` or ``xpu`` (or an out-of-tree platform that declares DFLASH).
2. **Draft attention backend allowlist.** ``_resolve_dflash_draft_attention_backend`` accepts only
   ``DRAFT_ATTENTION_BACKEND_CHOICES`` (flashinfer, fa3, fa4, triton, ascend, trtllm_mha,
   intel_xpu) and otherwise falls back to flashinfer; ``draft_worker_common.build_draft_tp_worker``
   re-checks. ``torch_sdpa`` is not accepted; only ``triton`` (interpreted) could run on CPU.
3. **Non-causal draft attention.** The DFlash draft layers use ``AttentionType.ENCODER_ONLY``
   (``models/dflash.py::_get_dflash_layer_attention_params``; non-causal inside the block, the
   target context as cached keys) in ``ForwardMode.TARGET_VERIFY``; the project's ``torch_sdpa``
   backend refuses every non-DECODER attention type (``TorchSDPABackend._check_supported``).
4. **CUDA-stream call on every decode step.** ``DFlashWorkerV2.forward_batch_generation`` calls
   ``batch.seq_lens.record_stream(torch.get_device_module(device).current_stream())``
   unconditionally; with CPU torch 2.13 ``Tensor.record_stream`` raises ``RuntimeError: unknown
   parameter type`` (run here). The call sits inside the ~700-line decode method, so avoiding it
   means replacing that method, i.e. copying SGLang's source, which the project rules forbid.

Not blockers: the Triton block-prepare / accept-bonus / compact-rebuild / fused-KV paths are gated
on ``is_cuda() or is_hip() or is_xpu()`` with torch fallbacks, and
``compute_dflash_correct_drafts_and_bonus`` has a torch path off CUDA. A DFlash draft checkpoint
for the tiny target would also be needed (none exists in the testbed). Items 1-3 could be
hooked/extended; item 4 is decisive. Upstream, DFLASH on CPU is SGLang PR #36782 (open).

Hence the worker is covered on CPU by integration tests on CPU tensors of SGLang's own DFlash
pieces (``DFlashVerifyInput``, ``_DflashDraftSampler``, ``DFlashWorkerV2._accept_block``,
``compute_dflash_correct_drafts_and_bonus``, ``RaggedVerifyLayout``) and the torch backend's
planner (``tests/integration/test_dflash_worker.py``). GPU path not yet run.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple

import torch

import sglang.srt.speculative.dflash_worker_v2 as _dflash_v2
from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

from sglang_ext.dcut import chain_keep_mask, chain_retrive, chain_survival
from sglang_ext.engine.dcut.compact_verify import CompactVerify, TargetForwardInterceptor, graph_ineligible_width
from sglang_ext.engine.dcut.metrics import StepDecision
from sglang_ext.engine.dcut.runner import DCutRunner

logger = logging.getLogger(__name__)

__all__ = [
    "NO_TOKEN",
    "DFlashDCutRunner",
    "DFlashPrune",
    "ConfidenceDraftSampler",
    "shard_stats",
    "combine_shard_stats",
    "head_confidences",
    "poison_candidates",
    "clamp_to_kept_prefix",
    "uses_sampled_accept",
    "restore_out_tokens",
    "graph_ineligible_width",
]

NO_TOKEN = -1
"""Candidate id past a request's kept prefix: never equals a target argmax (ids are >= 0)."""


# ----------------------------------------------------------------------------- confidences
def shard_stats(
    hidden: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [local_vocab, hidden_size] (this rank's rows of the LM head)
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # 3 x [num_tokens]
    """Per-row (max logit, its local index, log-sum-exp) over one vocabulary shard.

    The max and index come from the logits in the weight's dtype (as SGLang's greedy head picks
    them); the log-sum-exp is taken in float32.

    Examples
    --------
    >>> mx, arg, lse = shard_stats(torch.eye(2), torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]))
    >>> mx.tolist(), arg.tolist(), [round(x, 4) for x in lse.tolist()]
    ([2.0, 1.0], [1, 0], [2.2395, 1.5514])
    """
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    logits = torch.matmul(hidden, weight.T)  # [num_tokens, local_vocab]
    mx, arg = torch.max(logits, dim=-1)
    return mx, arg, torch.logsumexp(logits.float(), dim=-1)


def combine_shard_stats(
    gathered_max: torch.Tensor,  # [tp_size, num_tokens] per-rank max logits
    gathered_lse: torch.Tensor,  # [tp_size, num_tokens] per-rank log-sum-exp
) -> torch.Tensor:  # [num_tokens] float32
    """Max-softmax over the full vocabulary from per-shard statistics.

    ``c = exp(max_r max_r - logsumexp_r lse_r)``: the probability of the argmax token, which is
    the token the greedy DFlash head proposes.

    Examples
    --------
    Two shards of a 4-token vocabulary with logits ``[0, log 3 | 0, 0]``: p(argmax) = 3 / 6.

    >>> import math
    >>> mx = torch.tensor([[math.log(3.0)], [0.0]])
    >>> lse = torch.tensor([[math.log(4.0)], [math.log(2.0)]])
    >>> round(combine_shard_stats(mx, lse).item(), 6)
    0.5
    """
    top = gathered_max.float().amax(dim=0)
    return torch.exp(top - torch.logsumexp(gathered_lse.float(), dim=0))


def head_confidences(
    hidden: torch.Tensor,  # [num_tokens, hidden_size] draft hidden states of the proposed rows
    weight: torch.Tensor,  # [local_vocab, hidden_size]
    num_org: int,
    tp_group: Any = None,
    chunk_size: int = 1024,
) -> torch.Tensor:  # [num_tokens] float32
    """Draft confidences of a greedy LM head (optionally vocabulary-parallel).

    Uses rows ``weight[:num_org]`` (the real vocabulary of this shard, padding excluded) and, with
    ``tp_group`` (``world_size > 1``, ``all_gather_into_tensor``), combines every rank's shard
    statistics with :func:`combine_shard_stats`. Chunked over rows to bound the logits memory.

    Examples
    --------
    >>> w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> c = head_confidences(torch.tensor([[2.0, 0.0]]), w, num_org=2)
    >>> round(c.item(), 4)  # softmax([2, 0])[0]
    0.8808
    """
    n = hidden.shape[0]
    out = torch.empty(n, dtype=torch.float32, device=hidden.device)
    w = weight[: int(num_org)]
    tp = int(getattr(tp_group, "world_size", 1)) if tp_group is not None else 1
    for start in range(0, n, int(chunk_size)):
        end = min(n, start + int(chunk_size))
        mx, _, lse = shard_stats(hidden[start:end], w)
        if tp == 1:
            out[start:end] = torch.exp(mx.float() - lse)
            continue
        m = end - start
        gmax = torch.empty(tp * m, dtype=torch.float32, device=hidden.device)
        glse = torch.empty(tp * m, dtype=torch.float32, device=hidden.device)
        tp_group.all_gather_into_tensor(gmax, mx.float().contiguous())
        tp_group.all_gather_into_tensor(glse, lse.contiguous())
        out[start:end] = combine_shard_stats(gmax.view(tp, m), glse.view(tp, m))
    return out


def eager_head_confidences(hidden: torch.Tensor, lm_head: Any) -> Optional[torch.Tensor]:  # hidden: [num_tokens, hidden_size]
    """Confidences for the eager greedy head, or None for heads it cannot read (quantized, added vocab)."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.dflash_utils import is_dense_head_weight

    weight = getattr(lm_head, "weight", None)
    if not is_dense_head_weight(weight):
        return None
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        return head_confidences(hidden, weight, int(weight.shape[0]))
    if int(shard.num_added_elements) != 0:
        return None
    group = get_parallel().tp_group
    return head_confidences(hidden, weight, int(shard.num_org_elements),
                            group if int(group.world_size) > 1 else None)


class ConfidenceDraftSampler(_DflashDraftSampler):
    """SGLang's in-graph greedy DFlash head that also writes each proposal's confidence.

    Tokens are chosen exactly as ``_DflashDraftSampler`` chooses them (same logits, same
    first-max tie rule, same cross-rank select); the confidence of row ``i`` goes to the
    persistent buffer ``conf_out[i]`` (float32, ``[max_bs * (block_size - 1)]``), so it is
    replayed with the draft CUDA graph. Rows ``[:bs * (block_size - 1)]`` are valid after a step.
    """

    def __init__(self, *, weight, block_size, num_org, org_vocab_start, max_bs, tp_group=None):
        super().__init__(weight=weight, block_size=block_size, num_org=num_org,
                         org_vocab_start=org_vocab_start, max_bs=max_bs, tp_group=tp_group)
        max_tokens = self.out.shape[0]
        device = weight.device
        self.conf_out = torch.zeros(max_tokens, dtype=torch.float32, device=device)  # [max_tokens]
        if self.tp_size > 1:
            self.local_lse = torch.empty(max_tokens, dtype=torch.float32, device=device)
            self.gathered_lse = torch.empty(self.tp_size * max_tokens, dtype=torch.float32, device=device)

    @classmethod
    def like(cls, sampler: _DflashDraftSampler) -> "ConfidenceDraftSampler":
        """A confidence sampler with the same head, block size, shard and capacity as ``sampler``."""
        max_bs = sampler.out.shape[0] // max(sampler.block_size - 1, 1)
        return cls(weight=sampler.weight, block_size=sampler.block_size, num_org=sampler.num_org,
                   org_vocab_start=sampler.org_vocab_start, max_bs=max_bs, tp_group=sampler.tp_group)

    def __call__(self, hidden_states, input_ids=None):  # hidden_states: [bs * block_size, hidden_size]
        bs = hidden_states.shape[0] // self.block_size
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])
        if hs.dtype != self.weight.dtype:
            hs = hs.to(self.weight.dtype)
        n = hs.shape[0]
        logits = torch.matmul(hs, self.weight[: self.num_org].T)  # [n, local_vocab]
        lse = torch.logsumexp(logits.float(), dim=-1)
        if self.tp_size == 1:
            tokens = torch.argmax(logits, dim=-1).to(torch.long)
            top = logits.gather(1, tokens.unsqueeze(1)).squeeze(1).float()
            self.conf_out[:n].copy_(torch.exp(top - lse))
            if self.org_vocab_start:
                tokens += self.org_vocab_start
            self.out[:n].copy_(tokens)
            return
        local_max, local_arg = self.local_max[:n], self.local_arg[:n]
        torch.max(logits, dim=-1, out=(local_max, local_arg))
        if self.org_vocab_start:
            local_arg.add_(self.org_vocab_start)
        self.local_lse[:n].copy_(lse)
        gathered_max = self.gathered_max[: self.tp_size * n]
        gathered_ids = self.gathered_ids[: self.tp_size * n]
        gathered_lse = self.gathered_lse[: self.tp_size * n]
        self.tp_group.all_gather_into_tensor(gathered_max, local_max)
        self.tp_group.all_gather_into_tensor(gathered_ids, local_arg)
        self.tp_group.all_gather_into_tensor(gathered_lse, self.local_lse[:n])
        best_rank = self.best_rank[:, :n]
        torch.argmax(gathered_max.view(self.tp_size, n), dim=0, out=best_rank[0])
        selected = self.selected_ids[:, :n]
        torch.gather(gathered_ids.view(self.tp_size, n), 0, best_rank, out=selected)
        self.out[:n].copy_(selected.view(-1))
        self.conf_out[:n].copy_(combine_shard_stats(gathered_max.view(self.tp_size, n),
                                                    gathered_lse.view(self.tp_size, n)))


# ----------------------------------------------------------------------------- accept helpers
def poison_candidates(
    candidates: torch.Tensor,  # [batch_size, block_size], column 0 = anchor
    keep_lens: torch.Tensor,  # [batch_size] kept drafts per request
) -> torch.Tensor:  # [batch_size, block_size], a new tensor
    """Copy of ``candidates`` with every draft past a request's kept prefix set to ``NO_TOKEN``.

    Greedy DFlash acceptance compares ``candidates[:, j]`` with the target argmax of row
    ``j - 1``; a ``NO_TOKEN`` never matches, so at most ``keep_lens[b]`` drafts are accepted.

    Examples
    --------
    >>> poison_candidates(torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]]), torch.tensor([2, 0])).tolist()
    [[5, 6, 7, -1], [1, -1, -1, -1]]
    """
    keep = chain_keep_mask(keep_lens.to(candidates.device), candidates.shape[1])
    return torch.where(keep, candidates, torch.full_like(candidates, NO_TOKEN))


def restore_out_tokens(
    out_tokens: torch.Tensor,  # [batch_size, block_size], written in place
    candidates: torch.Tensor,  # [batch_size, block_size] original (unpoisoned)
    commit_lens: torch.Tensor,  # [batch_size] committed tokens (accepted drafts + bonus)
) -> torch.Tensor:
    """Put the original drafts back into ``out_tokens`` past each request's committed run.

    SGLang's accept writes ``out_tokens[b, :-1] = candidates[b, 1:]`` and the bonus at
    ``accept_len``; entries past ``commit_lens`` are never read, but restoring them keeps the
    buffer identical to an unpruned step with the same acceptance (no ``NO_TOKEN`` escapes).

    Examples
    --------
    >>> out = torch.tensor([[6, 9, -1, 0]])
    >>> restore_out_tokens(out, torch.tensor([[5, 6, 7, 8]]), torch.tensor([2])).tolist()
    [[6, 9, 8, 0]]
    """
    bs, width = out_tokens.shape
    shifted = torch.zeros_like(out_tokens)
    shifted[:, :-1] = candidates[:, 1:].to(out_tokens.dtype)
    col = torch.arange(width, device=out_tokens.device).unsqueeze(0)
    past = col >= commit_lens.to(out_tokens.device).to(torch.int64).unsqueeze(1)
    out_tokens.copy_(torch.where(past, shifted, out_tokens))
    return out_tokens


def clamp_to_kept_prefix(
    candidates: torch.Tensor,  # [batch_size, block_size], column 0 = anchor
    accept_len: torch.Tensor,  # [batch_size] drafts accepted by the sampled accept
    bonus: torch.Tensor,  # [batch_size] token committed after the accepted drafts
    keep_lens: torch.Tensor,  # [batch_size] kept drafts per request
) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size] accept_len, [batch_size] bonus), new tensors
    """Cap a sampled (speculative-sampling) accept at each request's kept prefix.

    Where ``accept_len[b] > keep_lens[b]`` the request accepted draft ``keep_lens[b] + 1``, so the
    cut run stops at ``keep_lens[b]`` with that draft as its bonus (a draw from the target row
    ``keep_lens[b]``; see the module docstring). Other requests are returned unchanged.

    Examples
    --------
    >>> cand = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    >>> acc, bon = clamp_to_kept_prefix(cand, torch.tensor([3, 0]), torch.tensor([9, 9]), torch.tensor([1, 2]))
    >>> acc.tolist(), bon.tolist()
    ([1, 0], [7, 9])
    """
    keep = keep_lens.to(device=accept_len.device, dtype=accept_len.dtype)
    over = accept_len > keep  # [batch_size]
    rows = torch.arange(candidates.shape[0], device=candidates.device)
    next_draft = candidates[rows, (keep.to(torch.int64) + 1).clamp(max=candidates.shape[1] - 1)]  # [batch_size]
    new_bonus = torch.where(over, next_draft.to(bonus.dtype), bonus)
    return torch.where(over, keep, accept_len), new_bonus


def uses_sampled_accept(sampling_info: Any, target_predict: Optional[torch.Tensor]) -> bool:
    """Whether ``DFlashWorkerV2._accept_block`` takes its sampled (speculative-sampling) branch.

    SGLang takes it for a non-greedy batch with no precomputed argmax when the build has the
    sampling kernel; otherwise it accepts by target argmax (the greedy branch).
    """
    if target_predict is not None or sampling_info is None or sampling_info.is_all_greedy:
        return False
    return bool(_dflash_v2.is_dflash_sampling_verify_available())


# ----------------------------------------------------------------------------- the runner
@dataclass
class DFlashPrune:
    """A pruned DFlash step: kept drafts per request and the compacted verify."""

    keep_lens: torch.Tensor  # [batch_size] int64 kept drafts (anchor excluded)
    compact: CompactVerify


@dataclass
class DFlashStepState:
    """Per-step scratch of :class:`DFlashDCutRunner` (one decode step of the worker)."""

    batch: Any
    eager_ran: bool = False
    eager_conf: Optional[torch.Tensor] = None  # [bs * (N - 1)]
    verified: bool = False
    decision: Optional[StepDecision] = None
    prune: Optional[DFlashPrune] = None


def dflash_unsupported_reason(worker: Any) -> Optional[str]:
    """Why D-Cut cannot prune this DFlash server (None when it can)."""
    if getattr(worker, "selector", None) is not None:
        return "DFlash selector drafts"
    if getattr(worker, "lilicorr", None) is not None:
        return "DFlash LiLiCorr drafts"
    if getattr(worker, "_is_domino", False):
        return "DFlash Domino drafts"
    if int(getattr(_dflash_v2, "SIMULATE_ACC_LEN", 0) or 0) > 0:
        return "SGLANG_SIMULATE_ACC_LEN (simulated acceptance)"
    if int(worker.speculative_num_draft_tokens) <= 1:
        return "block size 1 (no drafts)"
    return None


class DFlashDCutRunner(DCutRunner):
    """D-Cut for one ``ExtDFlashWorker``: the EAGLE3 runner's table, metrics and TP
    agreement, with a DFlash planner (chains from block confidences) and verify hook."""

    def __init__(self, worker: Any, cfg: Any):
        super().__init__(worker, cfg)
        if self.unsupported is None:
            self.unsupported = dflash_unsupported_reason(worker)
            if self.unsupported is not None:
                logger.warning("D-Cut disabled: not supported with %s (full verification is used)",
                               self.unsupported)
        self.state: Optional[DFlashStepState] = None

    # ------------------------------------------------------------------ confidences
    def step_confidences(self, worker: Any, bs: int) -> Optional[torch.Tensor]:  # -> [bs, N - 1]
        """This step's draft confidences, or None when they were not captured."""
        k = self.num_draft_tokens - 1
        st = self.state
        if st is not None and st.eager_ran:
            return None if st.eager_conf is None else st.eager_conf[: bs * k].view(bs, k)
        sampler = getattr(worker, "_draft_sampler", None)
        if isinstance(sampler, ConfidenceDraftSampler):
            return sampler.conf_out[: bs * k].view(bs, k)
        return None

    # ------------------------------------------------------------------ planning
    def plan(self, worker: Any, batch: Any, verify_input: Any) -> Tuple[StepDecision, Optional[DFlashPrune]]:
        """Decide this step's verify rows from the block confidences.

        ``verify_input`` is SGLang's ``DFlashVerifyInput`` (``draft_token``/``positions``
        ``[bs * N]``). Returns the step's decision and, when anything is pruned, the prune.
        """
        bs = int(batch.seq_lens.shape[0])
        n = self.num_draft_tokens
        if self.unsupported is not None or bs == 0:
            return StepDecision.full(bs, n), None
        device = verify_input.draft_token.device

        def step_scores():
            conf = self.step_confidences(worker, bs)
            return None if conf is None else (chain_survival(conf.to(device)).scores, None)  # [bs, N - 1]

        step = self.decide(batch, bs, n, step_scores)
        if step.keep is None:
            return step.decision, None
        nt, ns = chain_retrive(bs, n, device=device)
        compact, _ = self.compact_verify(step, verify_input.draft_token, verify_input.positions, nt, ns)
        keep_lens = step.keep.to(torch.int64).sum(dim=1) - 1  # [bs] kept drafts (TP rank 0's)
        return step.decision, DFlashPrune(keep_lens=keep_lens, compact=compact)

    # ------------------------------------------------------------------ the verify forward
    def verify_plan(self, worker: Any, forward_batch: Any) -> Optional[CompactVerify]:
        """Plan this step at its target verify forward (called by the interceptor); the compacted
        verify, or None to run the forward in full."""
        st = self.state
        decision, prune = self.plan(worker, st.batch, forward_batch.spec_info)
        st.verified, st.decision, st.prune = True, decision, prune
        return None if prune is None else prune.compact

    @contextlib.contextmanager
    def step(self, worker: Any, batch: Any) -> Iterator[DFlashStepState]:
        """Arm confidence capture and intercept the target's verify forward for one decode step."""
        st = DFlashStepState(batch=batch)
        self.state = st
        try:
            with TargetForwardInterceptor(worker.target_worker, lambda fb: self.verify_plan(worker, fb)):
                yield st
        finally:
            self.state = None

    def finish_step(self, st: DFlashStepState, result: Any) -> None:
        """Record the step's metrics (and log periodically)."""
        if st.decision is None:
            return
        self.metrics.record(st.decision, getattr(result, "accept_lens", None))
        self.observe_step(getattr(result, "accept_lens", None))
        if self.log_interval and self.metrics.steps % self.log_interval == 0:
            logger.info(self.metrics.log_line())

"""The project's ``DFlashWorkerV2`` subclass (selected by the plugin for ``--speculative-algorithm
DFLASH --dcut ...``).

D-Cut on DFlash blocks lives in :mod:`sglang_ext.engine.dcut.dflash` (the runner, the confidence
sampler, the candidate poisoning and the sampled-accept cap); this class only routes SGLang's worker methods to it.
"""

from __future__ import annotations

import logging
from typing import Optional

import sglang.srt.speculative.dflash_worker_v2 as _dflash_v2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _DflashDraftSampler

from sglang_ext.config import get_extension_config
from sglang_ext.engine.dcut.dflash import (
    ConfidenceDraftSampler,
    DFlashDCutRunner,
    clamp_to_kept_prefix,
    eager_head_confidences,
    poison_candidates,
    restore_out_tokens,
    uses_sampled_accept,
)
from sglang_ext.engine.dcut.runner import batch_context, is_decode_batch

logger = logging.getLogger(__name__)


class ExtDFlashWorker(DFlashWorkerV2):
    """``DFlashWorkerV2`` with D-Cut on blocks (``self.dcut``; None when ``--dcut off``)."""

    dcut: Optional[DFlashDCutRunner] = None  # class default: SGLang's __getattr__ delegates unknown names

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port, target_worker=target_worker)
        self.ext_config = get_extension_config(server_args)
        # The shared D-Cut glue and profiler read these (EAGLE names; DFlash is a chain of N - 1).
        self.topk = 1
        self.speculative_num_steps = 1
        if self.ext_config.dcut.enabled:
            self.dcut = DFlashDCutRunner(self, self.ext_config.dcut)
        logger.info("sglang_ext DFlash worker active: dcut=%s block=%d", self.ext_config.dcut.mode,
                    self.speculative_num_draft_tokens)

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        if self.dcut is not None:
            self.dcut.init_after_graphs(self)

    def _maybe_build_draft_sampler(self):
        sampler = super()._maybe_build_draft_sampler()
        if (self.dcut is not None and self.dcut.unsupported is None
                and type(sampler) is _DflashDraftSampler):
            sampler = ConfidenceDraftSampler.like(sampler)
        return sampler

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size: int = 256):
        tokens = super()._greedy_sample_from_vocab_parallel_head(
            hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size)
        st = self.dcut.state if self.dcut is not None else None
        if st is not None and not st.verified:
            st.eager_ran = True
            st.eager_conf = eager_head_confidences(hidden_states, lm_head)
        return tokens

    def _accept_block(self, *, candidates, next_token_logits, sampling_info, draft_input, prefix_lens, bs,
                      target_predict=None):
        st = self.dcut.state if self.dcut is not None else None
        prune = st.prune if st is not None else None
        kwargs = dict(next_token_logits=next_token_logits, sampling_info=sampling_info, draft_input=draft_input,
                      prefix_lens=prefix_lens, bs=bs, target_predict=target_predict)
        if prune is None:
            return super()._accept_block(candidates=candidates, **kwargs)
        if uses_sampled_accept(sampling_info, target_predict):
            # speculative sampling on the full chain, capped at the kept prefix (exact in distribution)
            accept_len, _, bonus, _, _ = super()._accept_block(candidates=candidates, **kwargs)
            accept_len, bonus = clamp_to_kept_prefix(candidates, accept_len, bonus, prune.keep_lens)
            out_tokens, commit_lens = _dflash_v2._commit_accept(candidates, accept_len, bonus)
            return accept_len, commit_lens, bonus, out_tokens, None  # None: SGLang recomputes new_seq_lens
        poisoned = poison_candidates(candidates, prune.keep_lens)
        accept_len, commit_lens, bonus, out_tokens, new_seq_lens = super()._accept_block(candidates=poisoned, **kwargs)
        restore_out_tokens(out_tokens, candidates, commit_lens)
        return accept_len, commit_lens, bonus, out_tokens, new_seq_lens

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        def run():
            return super(ExtDFlashWorker, self).forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors)

        if self.dcut is not None:  # the step clock of --dcut-online-costs (no device sync)
            self.dcut.begin_step(is_decode_batch(batch), batch_context(batch))
        if (self.dcut is None or batch.forward_mode.is_extend() or batch.is_extend_in_batch
                or batch.forward_mode.is_idle()):
            return run()
        with self.dcut.step(self, batch) as st:
            result = run()
        self.dcut.finish_step(st, result)
        return result

"""The project's ``EAGLEWorkerV2`` subclass (selected by the plugin when --specexit or --dcut is on).

``verify()`` is the seam for both features (see ``docs/sglang_internals.md#workers-and-the-verify-seam`` and
``docs/architecture.md#one-decode-step``): D-Cut prunes what the target verifies (it owns the verify call),
SpecExit edits the ``GenerationBatchResult`` after it, and both run before lengths are
published. Each feature lives in its own glue module and is driven from here:

* ``sglang_ext.engine.dcut.runner.DCutRunner`` -- ``verify(worker, batch, pp_proxy_tensors,
  grammar_barrier, base_verify) -> GenerationBatchResult`` (``base_verify`` is the stock
  ``EAGLEWorkerV2.verify`` bound to the worker), plus ``init_after_graphs(worker)`` for the
  launch-time cost profiling;
* ``sglang_ext.engine.specexit.runner.SpecExitRunner`` -- ``on_prefill(worker, batch, result)``
  after a prefill/extend batch and ``after_verify(worker, batch, verify_input, result) ->
  GenerationBatchResult`` after every verify.

With a feature off its runner is ``None`` and the stock path runs unchanged.

Draft-off steps (``--dcut auto --dcut-draft-off auto``, ``patches/zero_step_draft_off.md``): before a
decode step drafts, ``DCutRunner.draft_off_for_step`` may decide to skip drafting. The step then runs
SGLang's own zero-step round of ``EAGLEWorkerV2.forward_batch_generation`` (``speculative_num_steps
== 0``: ``_build_trivial_verify_input``, a one-node verify rooted at the last bonus token, then the
draft extend over that one row, so the draft's KV and hidden state stay current): the worker's and
the draft worker's ``speculative_num_steps`` / ``speculative_num_draft_tokens`` are 0 / 1 for that
one call and restored after it. The scheduler reads the step's row stride from the result
(``speculative_num_draft_tokens`` = 1) and the KV reserve of the next step is unchanged.
With ``--dcut-draft-off-extend defer`` (default) the draft extend of those steps is deferred and
caught up before drafting resumes (``sglang_ext.engine.dcut.deferred_extend``,
``patches/draft_off_deferred_extend.md``): for the call, the draft worker's
``_draft_extend_for_decode`` is shadowed by an instance attribute that routes to
``DeferredDraftExtend.extend``; a step that would draft while rows are still pending runs
draft-off once more to catch up first.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

from sglang_ext.config import get_extension_config

logger = logging.getLogger(__name__)


class ExtEAGLEWorker(EAGLEWorkerV2):
    """EAGLE/EAGLE3 worker with SpecExit and D-Cut (``self.ext_config`` holds both configs)."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port, target_worker=target_worker)
        self.ext_config = get_extension_config(server_args)
        # [dcut] per-node draft confidences (D-Cut scores, SpecExit draft-confidence signal)
        from sglang_ext.engine.draft_capture import install as install_draft_capture

        self.draft_capture = install_draft_capture(self)
        # eager draft extends over the accepted rows only (same output; --dcut-draft-extend)
        self.draft_extend_rows = None
        if self.draft_capture is not None:
            from sglang_ext.engine.dcut.draft_extend import AcceptedRowsDraftExtend

            self.draft_extend_rows = AcceptedRowsDraftExtend(self._draft_worker.draft_runner,
                                                             self.ext_config.dcut.draft_extend)
            self.draft_capture.extend_forward = self.draft_extend_rows
        self.dcut = None
        self.specexit = None
        self.deferred_extend = None
        if self.ext_config.dcut.enabled:
            from sglang_ext.engine.dcut.runner import DCutRunner

            self.dcut = DCutRunner(self, self.ext_config.dcut)
            if self.dcut.depth is not None:
                self._install_depth_policy()
            elif self._draft_worker is not None:
                from sglang_ext.engine.dcut.deferred_extend import DeferredDraftExtend

                self.deferred_extend = DeferredDraftExtend(self, self.ext_config.dcut.draft_off_extend,
                                                           self.dcut.preview_draft_off)
                self.dcut.trace_extra = self.deferred_extend.stats.summary  # step-trace lines
                self.dcut.catch_up_rows = self._caught_up_rows  # a catch-up step: a switching cost, not an off one
        if self.ext_config.specexit.enabled:
            from sglang_ext.engine.specexit.runner import SpecExitRunner

            self.specexit = SpecExitRunner(self, self.ext_config.specexit)
            if self.deferred_extend is not None and self.specexit.active and self.specexit.lagged:
                self.deferred_extend.every_extend_needed_by = ("SpecExit's draft-confidence signal reads every "
                                                               "draft extend")
        logger.info("sglang_ext worker active: specexit=%s dcut=%s", self.ext_config.specexit.enabled,
                    self.ext_config.dcut.mode)

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        if self.dcut is not None:
            self.dcut.init_after_graphs(self)

    # ------------------------------------------------------------------ D-Cut depth mode
    def _install_depth_policy(self) -> None:
        """Depth mode (``--dcut auto --speculative-adaptive``, ``patches/dcut_depth_policy.md``): the
        adaptive controller is rebuilt with D-Cut's policy through SGLang's public constructor,
        before its runtime states are built (``init_cuda_graphs``). Draft-off steps run SGLang's
        one-row draft extend every step (the deferred catch-up is not combined with the runtime
        states' per-depth draft-extend backends)."""
        from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

        from sglang_ext.engine.dcut.depth_mode import DCutDepthPolicy

        self.adaptive_controller = AdaptiveController(self, DCutDepthPolicy(self.dcut, self.adaptive_controller.params))

    def _caught_up_rows(self) -> int:
        return self.deferred_extend.stats.caught_up_rows

    def activate_step_by_batch(self, batch_size):
        # a draft-off step runs the zero-step configuration set by _zero_step: no runtime-state switch
        if self.dcut is not None and self.dcut.step_draft_off:
            return
        super().activate_step_by_batch(batch_size)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if self.dcut is not None:  # the step clock of --dcut-online-costs (no device sync)
            from sglang_ext.engine.dcut.runner import batch_context, is_decode_batch

            self.dcut.begin_step(is_decode_batch(batch), batch_context(batch))
        if self.deferred_extend is not None and batch.reqs:
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                self.deferred_extend.drop(batch.reqs)  # a prefill extends their draft itself
            elif not batch.forward_mode.is_idle():
                self.deferred_extend.forget_absent(batch)
        off = self._draft_off_now(batch)
        if not off and self.deferred_extend is not None and self.deferred_extend.has_pending(batch):
            logger.warning("D-Cut: a step drafts while deferred draft-extend rows are pending (dropped)")
            self.deferred_extend.drop(batch.reqs)
        if off:
            with self._zero_step():
                result = super().forward_batch_generation(batch, on_publish=on_publish,
                                                          grammar_barrier=grammar_barrier,
                                                          pp_proxy_tensors=pp_proxy_tensors)
            return result
        result = super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                                   pp_proxy_tensors=pp_proxy_tensors)
        if self.specexit is not None and (batch.forward_mode.is_extend() or batch.is_extend_in_batch):
            self.specexit.on_prefill(self, batch, result)
        return result

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        verify_input = batch.spec_info
        if self.dcut is not None:
            result = self.dcut.verify(self, batch, pp_proxy_tensors, grammar_barrier, super().verify)
        else:
            result = super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        if self.specexit is not None:
            result = self.specexit.after_verify(self, batch, verify_input, result)
        return result

    # ------------------------------------------------------------------ draft-off steps
    def _draft_off_now(self, batch) -> bool:
        """A decode step (not idle, not a pre-built PP verify input) whose drafting D-Cut skips."""
        if self.dcut is None or self._draft_worker is None:
            return False
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or batch.spec_info is None:
            return False
        if batch.spec_info.is_verify_input() or self.speculative_num_steps == 0:
            return False
        from sglang.srt.environ import envs

        if envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get():  # would leave the draft model stale
            if not getattr(self, "_skip_extend_warned", False):
                self._skip_extend_warned = True
                logger.warning("D-Cut: draft-off steps disabled: SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND would skip "
                               "the draft extend of a zero-step round and leave the draft model stale")
            return False
        bs = int(batch.seq_lens.shape[0])
        deferred = self.deferred_extend
        if deferred is not None and deferred.has_pending(batch) and not self.dcut.preview_draft_off(bs):
            # This step would draft, but the draft still misses deferred rows: run it draft-off once
            # more and catch up in its extend (the choice is not advanced, so the next step drafts).
            deferred.flush_requested = True
            deferred.stats.extra_draft_off_steps += 1
            return True
        return self.dcut.draft_off_for_step(bs)

    @contextlib.contextmanager
    def _zero_step(self):
        """SGLang's zero-step configuration for one ``forward_batch_generation`` call: no drafting,
        a one-node verify and a one-row draft extend per request (the attributes the adaptive
        controller switches, without its per-step-count attention backends and graphs)."""
        dw = self._draft_worker
        saved = (self.speculative_num_steps, self.speculative_num_draft_tokens, dw.speculative_num_steps,
                 dw.speculative_num_draft_tokens)
        self.speculative_num_steps, self.speculative_num_draft_tokens = 0, 1
        dw.speculative_num_steps, dw.speculative_num_draft_tokens = 0, 1
        self.dcut.step_draft_off = True
        deferred = self.deferred_extend
        defer = deferred is not None and self.dcut.forced_draft_off is None  # the profiler times SGLang's step
        # shadow the draft worker's extend for this call (instance attribute, restored below). It wraps
        # what the attribute resolves to now -- SGLang's method, or the per-step timer the D-Cut runner
        # installs as an instance attribute (SGLANG_EXT_DCUT_TIMING), which must survive the call.
        had, prev = "_draft_extend_for_decode" in vars(dw), vars(dw).get("_draft_extend_for_decode")
        if defer:
            dw._draft_extend_for_decode = functools.partial(deferred.extend, dw._draft_extend_for_decode)
        try:
            yield
        finally:
            if defer and had:
                dw._draft_extend_for_decode = prev
            elif defer:
                dw.__dict__.pop("_draft_extend_for_decode", None)
            self.dcut.step_draft_off = False
            (self.speculative_num_steps, self.speculative_num_draft_tokens, dw.speculative_num_steps,
             dw.speculative_num_draft_tokens) = saved


class ExtStandaloneWorker(ExtEAGLEWorker, StandaloneWorkerV2):
    """``--speculative-algorithm STANDALONE`` with SpecExit and D-Cut: SGLang's ``StandaloneWorkerV2``
    (a small LM of the target's family drafts, with its own embeddings and head) under the same
    extension as EAGLE (``patches/standalone_worker.md``). The method resolution order puts
    ``ExtEAGLEWorker`` first and ``StandaloneWorkerV2`` next, so ``ExtEAGLEWorker.__init__``'s
    ``super().__init__`` builds SGLang's standalone worker (its own draft worker and SGLang's own
    vocabulary check) and every hook above wraps the methods both share with ``EAGLEWorkerV2``.
    D-Cut's scores and SpecExit's draft-confidence signal are the draft model's own token
    probabilities (``sglang_ext.engine.draft_capture``, which re-classes the
    ``StandaloneDraftWorker`` as it does the EAGLE draft worker)."""

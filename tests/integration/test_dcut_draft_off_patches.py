"""Drift guard for the D-Cut draft-off step (``patches/zero_step_draft_off.md``): the SGLang pieces
of the zero-step round that ``ExtEAGLEWorker`` runs for one decode step, and those its deferred
draft extend relies on (``patches/draft_off_deferred_extend.md``).

Budget: < 30 s (imports SGLang's speculative modules; no engine).
"""

from __future__ import annotations

import inspect

from drift_guard import param_names as _params


def test_zero_step_round_of_forward_batch_generation():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    fn = EAGLEWorkerV2.forward_batch_generation
    assert _params(fn) == ["self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"]
    src = inspect.getsource(fn)
    # the zero-step branch reads the worker attribute per call and builds SGLang's one-node verify
    assert "elif self.speculative_num_steps == 0:" in src
    assert "verify_input = self._build_trivial_verify_input(batch)" in src
    # ... and still runs the draft extend unless SGLang's skip flag is set (the worker refuses it)
    assert "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND" in src
    assert "self.draft_worker._draft_extend_for_decode(" in src
    assert src.index("self._build_trivial_verify_input(batch)") < src.index("self.verify(")


def test_trivial_verify_input_is_a_one_node_tree_at_the_bonus_token():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    fn = EAGLEWorkerV2._build_trivial_verify_input
    assert _params(fn) == ["self", "batch"]
    src = inspect.getsource(fn)
    assert "draft_token=draft_input.bonus_tokens" in src and "draft_token_num=1" in src
    assert "spec_steps=0" in src and "capture_hidden_mode=CaptureHiddenMode.FULL" in src


def test_widths_come_from_the_worker_attributes_the_worker_switches():
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    # verify width: the worker's speculative_num_draft_tokens, read per call
    assert "num_draft_tokens=self.speculative_num_draft_tokens" in inspect.getsource(EAGLEWorkerV2.verify)
    # draft extend width: the draft worker's speculative_num_draft_tokens, read per call
    ext = inspect.getsource(EagleDraftWorker._draft_extend_for_decode)
    assert "num_tokens_per_req=self.speculative_num_draft_tokens" in ext
    # the adaptive controller switches the same four attributes (plus its backends / graphs)
    apply = inspect.getsource(EAGLEWorkerV2.apply_runtime_state)
    for line in ("self.speculative_num_steps = state.speculative_num_steps",
                 "self.speculative_num_draft_tokens = state.speculative_num_draft_tokens",
                 "dw.speculative_num_steps = state.speculative_num_steps",
                 "dw.speculative_num_draft_tokens = state.speculative_num_draft_tokens"):
        assert line in apply


def test_scheduler_reads_the_row_stride_from_the_result():
    import sglang.srt.managers.scheduler_components.batch_result_processor as brp
    from sglang.srt.speculative.eagle_worker_common import run_eagle_verify

    assert "result.speculative_num_draft_tokens" in inspect.getsource(brp._get_speculative_output_stride)
    assert "speculative_num_draft_tokens=num_draft_tokens" in inspect.getsource(run_eagle_verify)


def test_skip_flag_exists():
    from sglang.srt.environ import envs

    assert envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get() in (False, True)


def test_deferred_extend_inputs():
    """What ``DeferredDraftExtend`` hands to / expects from SGLang's draft extend."""
    from sglang.srt.speculative.eagle_worker_common import prepare_for_draft_extend
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    stub = EAGLEWorkerV2._stub_skipped_draft_extend
    assert _params(stub) == ["self", "batch", "batch_output"]
    src = inspect.getsource(stub)
    for field in ("next_draft_input.topk_p", "next_draft_input.topk_index", "next_draft_input.hidden_states"):
        assert field in src
    ext = EagleDraftWorker._draft_extend_for_decode
    assert _params(ext) == ["self", "batch", "batch_result", "kv_loc_plan"]
    src = inspect.getsource(ext)
    for read in ("batch_result.prepared_draft_extend_inputs", "batch_result.accept_lens",
                 "batch_result.next_token_ids", "hidden_states=batch_result.logits_output.hidden_states",
                 "next_draft_input = batch_result.next_draft_input", "kv_loc_plan=kv_loc_plan"):
        assert read in src, read
    # the CPU row selection: each request's last row of a uniform window of the draft worker's width
    assert "len(batch.seq_lens) * self.speculative_num_draft_tokens" in src
    assert "+ batch_result.accept_lens" in src
    # the window starts at the batch's seq_lens and writes its out_cache_loc (no widening)
    prep = inspect.getsource(prepare_for_draft_extend)
    assert "batch.prefix_lens = [" in prep and "batch.seq_lens_cpu.tolist()" in prep
    assert "batch.input_ids = predict" in prep
    assert "forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu + num_draft_tokens" in prep
    fbg = inspect.getsource(EAGLEWorkerV2.forward_batch_generation)
    assert "self.draft_worker._draft_extend_for_decode(" in fbg  # an attribute lookup per call
    # A STANDALONE draft: the worker's algorithm says so, and its verify captures no hidden state
    # (the rows then keep tokens only and the catch-up hands SGLang none, as its own extend gets)
    from sglang.srt.speculative.eagle_utils import eagle_prepare_for_verify
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    assert "self.speculative_algorithm = SpeculativeAlgorithm.from_string(" in inspect.getsource(
        StandaloneWorkerV2.__init__)
    verify_prep = inspect.getsource(eagle_prepare_for_verify)
    assert "CaptureHiddenMode.NULL" in verify_prep and "spec_algorithm.is_standalone()" in verify_prep


def test_tree_path_compaction_runs_only_for_topk_above_one():
    """A draft-off verify runs with the worker's ``topk`` at 1 (``one_node_verify``) so that
    SGLang skips the tree-path compaction, an identity for one node per request; that relies on
    the compaction's ``topk > 1`` condition and on ``verify`` reading ``self.topk`` per call."""
    from sglang.srt.speculative.eagle_worker_common import run_eagle_verify
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    src = inspect.getsource(run_eagle_verify)
    assert "finalize_tree_path" in _params(run_eagle_verify) and "topk" in _params(run_eagle_verify)
    assert "if finalize_tree_path and not batch.forward_mode.is_idle() and topk > 1:" in src
    assert "predict = _finalize_accept_tree_path(" in src
    assert "topk=self.topk" in inspect.getsource(EAGLEWorkerV2.verify)


def test_one_node_verify_sets_topk_one_for_the_call_only():
    import pytest

    from sglang_ext.engine.dcut.runner import one_node_verify

    class Worker:
        topk = 4

    w, seen = Worker(), []
    assert one_node_verify(w, lambda: seen.append(w.topk) or "result") == "result"
    assert seen == [1] and w.topk == 4

    def fails():
        raise RuntimeError("verify failed")

    with pytest.raises(RuntimeError, match="verify failed"):
        one_node_verify(w, fails)
    assert w.topk == 4


def test_zero_step_shadows_the_current_extend_and_restores_an_instance_attribute():
    """The deferred extend wraps whatever ``_draft_extend_for_decode`` resolves to -- with
    ``SGLANG_EXT_DCUT_TIMING`` that is the runner's timer, an instance attribute -- and puts it back
    afterwards (popping it lost the draft-extend timing after the first draft-off step)."""
    import functools
    from types import SimpleNamespace

    from sglang_ext.engine.eagle_worker import ExtEAGLEWorker

    class Draft:
        speculative_num_steps, speculative_num_draft_tokens = 3, 4

        def _draft_extend_for_decode(self, batch, batch_result, kv_loc_plan=None):
            return "sglang"

    calls = []

    def extend(original, batch, batch_result, **kw):
        calls.append(original(batch, batch_result, **kw))
        return None

    def timer(batch, batch_result, kv_loc_plan=None):
        return "timed"

    for installed in (None, timer):
        dw = Draft()
        if installed is not None:
            dw._draft_extend_for_decode = installed
        fake = SimpleNamespace(_draft_worker=dw, speculative_num_steps=3, speculative_num_draft_tokens=4,
                               dcut=SimpleNamespace(step_draft_off=False, forced_draft_off=None),
                               deferred_extend=SimpleNamespace(extend=extend))
        with ExtEAGLEWorker._zero_step(fake):
            assert isinstance(dw._draft_extend_for_decode, functools.partial)
            assert (dw.speculative_num_steps, fake.speculative_num_draft_tokens) == (0, 1)
            dw._draft_extend_for_decode("batch", "result")
        assert calls[-1] == ("sglang" if installed is None else "timed")
        if installed is None:
            assert "_draft_extend_for_decode" not in vars(dw)
        else:
            assert vars(dw)["_draft_extend_for_decode"] is timer
        assert (dw.speculative_num_steps, fake.speculative_num_draft_tokens) == (3, 4)

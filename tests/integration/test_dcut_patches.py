"""Drift guards for the SGLang internals the D-Cut glue and the draft-confidence capture hook
(see ``patches/organize_draft_results.md``, ``patches/eagle_draft_worker.md``), plus the capture
logic on SGLang's real ``organize_draft_results`` and a re-classed ``EagleDraftWorker``.

Budget: < 60 s (imports SGLang's speculative modules on the loaded 2-core machine; no engine).
"""

from __future__ import annotations

import inspect

import torch


from drift_guard import param_names as _params  # noqa: E402
from drift_guard import resolve as _resolve  # noqa: E402


def test_organize_draft_results_target():
    from sglang_ext.engine.draft_capture import HOOK_ORGANIZE_DRAFT_RESULTS

    fn = _resolve(HOOK_ORGANIZE_DRAFT_RESULTS)
    assert _params(fn) == ["score_list", "token_list", "parents_list", "num_draft_token"]
    src = inspect.getsource(fn)
    # the selected indices are sorted and the values are dropped (what the hook re-gathers)
    assert "torch.topk(score_list" in src and "torch.sort(top_scores_index)" in src
    import sglang.srt.speculative.eagle_worker_v2 as ew

    # looked up as a module global at call time by the draft loop (so the hook reaches it)
    assert "organize_draft_results(" in inspect.getsource(ew.EagleDraftWorker.draft_forward)
    assert hasattr(ew, "organize_draft_results")


def test_eagle_draft_worker_targets():
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    assert _params(EagleDraftWorker.draft_forward) == ["self", "forward_batch"]
    assert _params(EagleDraftWorker.draft) == ["self", "batch", "with_topology"]
    draft_src = inspect.getsource(EagleDraftWorker.draft)
    assert "self.cuda_graph_runner.execute(" in draft_src and "self.draft_forward(" in draft_src
    assert _params(EagleDraftWorker._draft_extend_for_decode) == ["self", "batch", "batch_result", "kv_loc_plan"]
    assert _params(EagleDraftWorker.init_cuda_graphs) == ["self"]
    fwd = inspect.getsource(EagleDraftWorker.draft_forward)
    assert "self.draft_runner.forward(" in fwd and "spec_info.topk_p" in fwd
    ext = inspect.getsource(EagleDraftWorker._draft_extend_for_decode)
    # topk=1 placeholder probability that the capture replaces, and the two logits producers
    assert "torch.ones_like(ret_topk_index" in ext
    assert "self.draft_runner.forward(" in ext and "cuda_graph_runner_for_draft_extend.execute(" in ext
    assert "next_draft_input.topk_p" in ext
    from sglang.srt.model_executor.model_runner import ModelRunner

    assert _params(ModelRunner.forward)[:2] == ["self", "forward_batch"]
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    assert _params(EAGLEDraftExtendCudaGraphRunner.execute) == ["self", "forward_batch", "select_index"]
    # SpecExit's per-token draft-confidence: every extend row before the selection, the eager path
    # when the graph (which selects before the LM head) says it cannot run, and the prefill's last row
    assert _params(EAGLEDraftExtendCudaGraphRunner.can_run_graph) == ["self", "forward_batch"]
    assert "can_run_graph(forward_batch)" in ext and "next_token_logits[select_index]" in ext
    pre = inspect.getsource(EagleDraftWorker._draft_extend_for_prefill)
    assert "self.draft_runner.forward(" in pre and "next_token_logits" in pre


def test_reclass_keeps_sglang_methods():
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    from sglang_ext.engine.draft_capture import _capture_class

    obj = object.__new__(EagleDraftWorker)
    obj.__class__ = _capture_class(EagleDraftWorker)
    assert isinstance(obj, EagleDraftWorker)
    assert type(obj).draft_forward is not EagleDraftWorker.draft_forward
    assert type(obj).draft_extend is EagleDraftWorker.draft_extend  # everything else inherited unchanged


def _tree_draft_lists(bs, topk, steps, gen):
    """Score/token/parent lists shaped as ``select_top_k_tokens`` emits them."""
    scores, tokens, parents = [], [], []
    cum = torch.rand(bs, topk, generator=gen).sort(dim=1, descending=True).values  # step 0
    scores.append(cum.unsqueeze(1))
    tokens.append(torch.randint(0, 50, (bs, topk), generator=gen))
    parents.append(torch.zeros(bs, topk + 1, dtype=torch.long))
    for _ in range(steps - 1):
        child = torch.rand(bs, topk, topk, generator=gen)
        expanded = cum.unsqueeze(2) * child  # [bs, topk, topk]
        scores.append(expanded)
        tokens.append(torch.randint(0, 50, (bs, topk * topk), generator=gen))
        parents.append(torch.zeros(bs, topk, dtype=torch.long))
        cum = expanded.flatten(1).topk(topk, dim=1).values
    return scores, tokens, parents


def test_tree_capture_through_real_organize_draft_results():
    """The hook returns SGLang's result unchanged and records the selected path scores."""
    from sglang.srt.speculative.eagle_utils import organize_draft_results

    from sglang_ext.engine import draft_capture as dc

    gen = torch.Generator().manual_seed(0)
    bs, topk, steps, n = 3, 2, 3, 6
    sl, tl, pl = _tree_draft_lists(bs, topk, steps, gen)
    cap = dc.DraftCapture(topk=topk, num_steps=steps, num_draft_tokens=n, device="cpu", max_rows=4)
    cap.begin_draft(None, rows=bs)
    dc._active.capture = cap
    try:
        out = dc.around_organize_draft_results(organize_draft_results, sl, tl, pl, n)
    finally:
        dc._active.capture = None
        cap.end_draft()
    ref = organize_draft_results(sl, tl, pl, n)
    for a, b in zip(out, ref):
        assert torch.equal(a, b)
    flat = torch.cat([s.reshape(bs, -1) for s in sl], dim=1)
    # independent expectation: the n - 1 largest path scores of each request, in index order
    idx = flat.topk(n - 1, dim=1).indices.sort(dim=1).values
    expected = torch.cat([torch.ones(bs, 1), flat.gather(1, idx)], dim=1)
    got = cap.scores(bs)
    assert got.valid and got.is_tree
    assert torch.allclose(got.survival, expected)
    # pass-through when no capture is active: nothing recorded
    cap2 = dc.DraftCapture(topk=topk, num_steps=steps, num_draft_tokens=n, device="cpu", max_rows=4)
    dc.around_organize_draft_results(organize_draft_results, sl, tl, pl, n)
    assert torch.equal(cap2.path_score, torch.ones_like(cap2.path_score))


def test_chain_capture_columns_and_extend_fix():
    """d_1 from topk_p, d_2.. from the step logits (column i + 2), and the draft-extend fix."""
    from types import SimpleNamespace

    from sglang_ext.engine import draft_capture as dc

    cap = dc.DraftCapture(topk=1, num_steps=3, num_draft_tokens=4, device="cpu", max_rows=1)
    # extend of the previous step: the selected logits give d_1's probability 0.6
    cap.begin_extend()
    cap.record_extend_output(SimpleNamespace(next_token_logits=torch.log(torch.tensor([[0.6, 0.3, 0.1],
                                                                                       [0.2, 0.7, 0.1]]))))
    nxt = SimpleNamespace(topk_p=torch.ones(2, 1))
    cap.end_extend(nxt, batch_size=2)
    assert torch.allclose(nxt.topk_p, torch.tensor([[0.6], [0.7]]))
    # this step's draft: grows past the initial single row (eager), steps write columns 2, 3
    cap.begin_draft(nxt.topk_p, rows=2)
    cap.record_step_logits(torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]])))
    cap.record_step_logits(torch.log(torch.tensor([[0.25, 0.75], [0.4, 0.6]])))
    cap.end_draft()
    s = cap.scores(2)
    assert s.valid and not s.is_tree
    assert torch.allclose(s.confidence, torch.tensor([[1.0, 0.6, 0.5, 0.75], [1.0, 0.7, 0.9, 0.6]]))
    assert torch.allclose(s.survival, torch.tensor([[1.0, 0.6, 0.3, 0.225], [1.0, 0.7, 0.63, 0.378]]))
    # sampled drafting: q(x) of the drafted tokens replaces the max-softmax
    probs = torch.tensor([[[0.1, 0.9], [0.3, 0.7], [0.5, 0.5]], [[0.2, 0.8], [0.6, 0.4], [0.9, 0.1]]])
    tokens = torch.tensor([7, 0, 1, 0, 7, 1, 0, 1])
    q = cap.scores(2, draft_probs=probs, draft_token=tokens).confidence
    assert torch.allclose(q, torch.tensor([[1.0, 0.1, 0.7, 0.5], [1.0, 0.8, 0.6, 0.1]]))
    # several readers see the same step; once the draft extend starts, reads are flagged stale
    assert cap.scores(2).valid
    cap.begin_extend()
    assert not cap.scores(2).valid
    cap.end_extend(None, 2)


def test_scheduler_info_targets():
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components import internal_state as ist

    from sglang_ext.engine.dcut.hooks import HOOK_GET_INIT_INFO, HOOK_GET_INTERNAL_STATE, HOOK_UPDATE_HANDLERS

    assert _params(_resolve(HOOK_GET_INIT_INFO)) == ["self"]
    assert "result_dict" in inspect.getsource(_resolve(HOOK_GET_INIT_INFO))
    assert _params(_resolve(HOOK_GET_INTERNAL_STATE)) == ["self", "recv_req"]
    assert "internal_state" in GetInternalStateReqOutput.__struct_fields__
    # the speculative worker is reachable from the scheduler as draft_worker
    assert "self.draft_worker" in inspect.getsource(Scheduler.maybe_init_draft_worker)
    upd = _resolve(HOOK_UPDATE_HANDLERS)
    assert _params(upd) == ["self"] and "_UpdateHandler(" in inspect.getsource(upd)
    assert _params(ist._UpdateHandler.__init__) == ["self", "validate", "apply"]
    assert issubclass(ist.UpdateRejected, Exception)
    src = inspect.getsource(ist.SchedulerInternalStateController.set_internal_state)
    assert "handler.validate(key, value)" in src and "handlers[key].apply(key, value)" in src


def test_target_verify_forward_targets():
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.speculative import eagle_worker_common, eagle_utils
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout
    from sglang.srt.speculative.spec_info import SpecInput

    assert _params(TpModelWorker.forward_batch_generation)[:5] == [
        "self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify"]
    src = inspect.getsource(eagle_worker_common.run_eagle_verify)
    # exactly one keyword-only target call with the TARGET_VERIFY batch, then eagle_sample on the verify input
    assert src.count("target_worker.forward_batch_generation(") == 1
    assert "forward_batch=verify_forward_batch" in src and "is_verify=True" in src
    assert "batch=None" in src and "eagle_sample(" in src
    assert _params(KVLocPlan.bind) == ["self", "batch", "reader", "cols"]
    assert {"verify_lens", "graph_num_tokens", "extend_start_loc", "qo_indptr_device"} <= set(
        RaggedVerifyLayout.__struct_fields__)
    assert hasattr(SpecInput, "ragged_verify_layout") and hasattr(SpecInput, "num_tokens_per_req")
    sample = inspect.getsource(eagle_utils.eagle_sample)
    assert "retrieve_next_token" in sample and "retrieve_next_sibling" in sample
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    assert {"next_token_logits", "hidden_states"} <= set(inspect.signature(LogitsProcessorOutput).parameters)


def test_interceptor_compacts_and_restores():
    """The per-instance wrapper compacts the TARGET_VERIFY batch, scatters outputs back, restores it."""
    from types import SimpleNamespace as NS

    from sglang_ext.engine.dcut.compact_verify import CompactVerify, TargetForwardInterceptor

    class Mode:
        def is_target_verify(self):
            return True

    seen = {}

    class Worker:
        model_runner = NS(kv_index_translator=None, device="cpu")

        def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kw):
            fb = forward_batch
            if is_verify:
                seen.update(ids=fb.input_ids.tolist(), loc=fb.out_cache_loc.tolist(), pos=fb.positions.tolist(),
                            layout=fb.spec_info.ragged_verify_layout)
            rows = fb.input_ids.shape[0]
            return NS(logits_output=NS(next_token_logits=torch.arange(rows * 2, dtype=torch.float32).view(rows, 2),
                                       hidden_states=None))

    w = Worker()
    spec = NS(custom_mask=None, positions=None, ragged_verify_layout=None, num_tokens_per_req=4)
    fb = NS(forward_mode=Mode(), input_ids=torch.arange(8) + 100, positions=torch.arange(8),
            out_cache_loc=torch.arange(8) + 10, spec_info=spec, kv_loc_plan=None)
    plan = CompactVerify(kept_index=torch.tensor([0, 1, 4, -1]), draft_token=torch.tensor([100, 101, 104, 0]),
                          positions=torch.tensor([0, 1, 4, 0]), custom_mask=torch.ones(1, dtype=torch.bool),
                          layout="L", total_nodes=8)
    with TargetForwardInterceptor(w, plan) as icpt:
        out = w.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
        passthrough = w.forward_batch_generation(batch=None, forward_batch=fb, is_verify=False)
    assert icpt.calls == 1 and "forward_batch_generation" not in vars(w)
    assert seen["ids"] == [100, 101, 104, 0] and seen["loc"] == [10, 11, 14, 0] and seen["layout"] == "L"
    logits = out.logits_output.next_token_logits
    assert logits.tolist() == [[0, 1], [2, 3], [0, 0], [0, 0], [4, 5], [0, 0], [0, 0], [0, 0]]
    assert fb.spec_info is spec and fb.input_ids.tolist() == list(range(100, 108))
    assert fb.out_cache_loc.tolist() == list(range(10, 18))
    assert passthrough.logits_output.next_token_logits.shape == (8, 2)


def test_draft_extend_rows_targets():
    """What ``sglang_ext.engine.dcut.draft_extend`` relies on (patches/draft_extend_rows.md)."""
    import sglang.srt.speculative.eagle_worker_common as common
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    fields = EagleDraftExtendInput.__dataclass_fields__
    for name in ("hidden_states", "num_accept_tokens", "num_front_tokens", "num_tokens_per_req", "select_index"):
        assert name in fields, name
    ext = inspect.getsource(EagleDraftWorker._draft_extend_for_decode)
    # the window is N rows per request, accept lengths ride on the spec info, the eager path
    # calls the draft runner and selects the rows afterwards
    assert "num_accept_tokens=batch_result.accept_lens" in ext
    assert "num_tokens_per_req=self.speculative_num_draft_tokens" in ext
    assert "self.draft_runner.forward(" in ext
    assert "draft_logits_output.next_token_logits[select_index]" in ext
    prep = inspect.getsource(common.prepare_for_draft_extend)
    assert "batch.extend_lens = [num_window_tokens] * bs" in prep
    assert "forward_batch.seq_lens + num_draft_tokens" in prep and "mark_forward_metadata_ready()" in prep
    # trees: the accepted path is moved to the front of each request's block before the extend
    verify = inspect.getsource(common.run_eagle_verify)
    assert "_finalize_accept_tree_path(" in verify and "topk > 1" in verify
    # an unmarked batch is planned again in the forward
    assert "if not self.forward_metadata_ready:\n            return True" in inspect.getsource(
        ForwardBatch.needs_forward_metadata_init)

"""Drift guards for the SGLang internals the D-Cut glue and the draft-confidence capture hook
(see ``patches/organize_draft_results.md``, ``patches/eagle_draft_worker.md``), plus the capture
logic on SGLang's real ``organize_draft_results`` and a re-classed ``EagleDraftWorker``.

Budget: < 60 s (imports SGLang's speculative modules on the loaded 2-core machine; no engine).
"""

from __future__ import annotations

import inspect
import pkgutil

import pytest
import torch


def _resolve(target: str):
    mod, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(mod)
    return inspect.unwrap(getattr(owner, attr))


def _params(fn):
    return list(inspect.signature(fn).parameters)


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


def test_reclass_keeps_sglang_methods():
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    from sglang_ext.engine.draft_capture import _capture_class

    obj = object.__new__(EagleDraftWorker)
    obj.__class__ = _capture_class(EagleDraftWorker)
    assert isinstance(obj, EagleDraftWorker)
    assert type(obj).draft_forward is not EagleDraftWorker.draft_forward
    assert type(obj).draft is EagleDraftWorker.draft


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
    # a read without a new draft is flagged
    cap.mark_consumed()
    assert not cap.scores(2).valid

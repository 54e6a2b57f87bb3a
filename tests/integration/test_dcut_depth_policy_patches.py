"""Drift guard for D-Cut depth mode (``patches/dcut_depth_policy.md``): SGLang's adaptive controller,
its policy protocol, the worker seams it is driven through, and the policy the project passes.

Budget: < 30 s (imports SGLang's speculative modules; no engine).
"""

from __future__ import annotations

import inspect

from drift_guard import param_names as _params


def test_controller_takes_any_policy_and_asks_it_per_batch():
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    assert _params(AdaptiveController.__init__) == ["self", "worker", "policy"]
    assert _params(AdaptiveController.activate_step_by_batch) == ["self", "batch_size"]
    assert _params(AdaptiveController.on_verify_complete) == ["self", "num_correct_drafts_per_req", "batch_size"]
    act = inspect.getsource(AdaptiveController.activate_step_by_batch)
    assert "self.params.get_steps_for_batch(batch_size)" in act
    init = inspect.getsource(AdaptiveController.init_states)
    # one runtime state per candidate, chain-shaped, for the graph batch sizes the policy names
    assert "for steps in self.candidate_steps:" in init and "self.params.cuda_graph_bs_for_step(steps)" in init
    assert "speculative_num_draft_tokens=steps + 1" in init


def test_the_project_policy_has_the_protocol_members():
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveSpecPolicy

    from sglang_ext.engine.dcut.depth_mode import DCutDepthPolicy

    wanted = {n for n in vars(AdaptiveSpecPolicy) if not n.startswith("_")}
    assert wanted == {"candidate_steps", "set_cuda_graph_bs", "get_steps_for_batch", "on_verify_complete",
                      "cuda_graph_bs_for_step"}
    for name in wanted:
        assert hasattr(DCutDepthPolicy, name), name
        theirs, ours = getattr(AdaptiveSpecPolicy, name), getattr(DCutDepthPolicy, name)
        if callable(theirs) and not isinstance(theirs, property):
            assert _params(ours) == _params(theirs), name


def test_worker_builds_the_controller_in_init_and_its_states_in_init_cuda_graphs():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    init = inspect.getsource(EAGLEWorkerV2.__init__)
    assert "self.adaptive_controller = AdaptiveController(" in init
    assert "AdaptiveSpeculativeParams(" in init
    graphs = inspect.getsource(EAGLEWorkerV2.init_cuda_graphs)
    assert "self.adaptive_controller.init_states(" in graphs  # after __init__: our policy sizes the states


def test_step_activation_and_verify_feedback_seams():
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    assert _params(BaseSpecWorker.activate_step_by_batch) == ["self", "batch_size"]
    assert _params(BaseSpecWorker.on_verify_complete_cpu) == ["self", "num_correct_drafts_per_req", "batch_size"]
    fbg = inspect.getsource(EAGLEWorkerV2.forward_batch_generation)
    # activation before drafting, in the decode branch; the zero-step branch reads the worker's steps
    assert fbg.index("self.activate_step_by_batch(batch.seq_lens.shape[0])") < fbg.index(
        "elif self.speculative_num_steps == 0:")
    feed = inspect.getsource(EAGLEWorkerV2.on_verify_complete_cpu)
    assert "self.adaptive_controller.on_verify_complete(" in feed
    import sglang.srt.managers.scheduler_components.batch_result_processor as brp

    assert "self.model_worker.on_verify_complete_cpu(" in inspect.getsource(brp)


def test_adaptive_policy_object_exposes_candidate_steps():
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    p = AdaptiveSpeculativeParams(initial_steps=3)  # SGLang's default config
    assert all(isinstance(s, int) for s in p.candidate_steps) and 3 in p.candidate_steps

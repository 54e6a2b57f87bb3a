"""D-Cut depth mode (``--dcut auto --speculative-adaptive``) on the trained testbed models.

One engine: the EAGLE3 chain (7 steps, topk 1, 8 draft tokens), SGLang's ``--speculative-adaptive``
with candidate steps 1, 3, 7 for every batch size, ``--specexit --dcut auto``, a short launch-time
profile (the depths and the draft-off step are the table's columns). Requests run with SpecExit off
unless it is tested. 16 held-out problems, greedy, up to 256 new tokens, stopping at EOS (the
run helpers of ``test_dcut_draft_off.py``).

Checks: D-Cut is on in depth mode (``/server_info``: the depths, tiers ``(s + 1) / 8``); the
configured choice runs shallower depths than the deepest chain and learns the acceptance along the
chain, with the same tokens as the reference (``dcut_force_ratio`` 1.0: the deepest chain every
step), which equals the target's greedy decoding without speculation (HF transformers); two of every three steps
draft-off (the project's zero-step round inside SGLang's adaptive runtime states), with requests
joining while others decode, gives the same tokens; SpecExit exits with the prefix property. Every
KV slot is back at the end.

Also: a fixed ratio keeps SGLang's adaptive policy (D-Cut off, the reason in ``/server_info``), and
the runner without an engine attributes every verify result to the depth its step drafted.

Budget: ~2.5 min on the loaded 2-core host (two engine starts, one with a 3 x 4 profile; five
16-problem runs; one HF pass).
"""

from __future__ import annotations

import json
import os

import pytest

from engine_utils import hf_greedy, make_engine
from test_dcut_draft_off import MAX_NEW, _generate, _held, _run, _state, count_exits_with_prefix_property
from trained_models import MODELS, requires_trained_models
from trained_models import held_out_prompts as _prompts

pytestmark = requires_trained_models

STEPS, DEPTHS = 7, [1, 3, 7]
FULL = 1.0
CONFIGURED = 0.0
SPECEXIT_OFF = {"specexit_enable": False}


def _launch(tmp, **kw):
    """The 7-step chain under SGLang's adaptive mode, candidate steps DEPTHS for every batch size."""
    cfg = tmp / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": DEPTHS}}))
    return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                       speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                       speculative_num_steps=STEPS, speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1,
                       speculative_adaptive=True, speculative_adaptive_config=str(cfg),
                       dcut_cache_dir=str(tmp / "cache"), **kw)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = _launch(tmp_path_factory.mktemp("depth"), max_total_tokens=32768, max_running_requests=64, specexit=True,
                  dcut="auto", dcut_profile_batch_sizes="1,4,16", dcut_profile_steps=2, dcut_profile_warmup=1)
    yield eng
    eng.shutdown()


def _ids(outs):
    return [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in outs]


def test_depth_mode_is_lossless_learns_and_drafts_off(engine):
    from sglang_ext.engine.dcut.client import dcut_info, set_force_draft_off, set_force_ratio

    info = dcut_info(engine)
    assert info["unsupported"] is None and info["depth_mode"] == DEPTHS, info
    assert info["tiers"] == [(s + 1) / (STEPS + 1) for s in DEPTHS]
    assert info["cost_table_info"]["source"] == "profiled"
    table = info["cost_table"]
    assert len(table["step_ms"][0]) == len(DEPTHS) and table["off_ms"] is not None
    prompts = _prompts(16)
    held0 = _held(_state(engine)["kv_pool"])
    try:
        # the configured choice first: with nothing observed yet (prior 0.5 per position) the
        # cheapest depth wins (a 7-step chain costs more than 1.33x a 1-step one), then the
        # observed acceptance moves it; the tokens are checked against the reference below
        depths_run, auto_outs = set(), []
        for _ in range(2):
            outs, steps, off, hist = _run(engine, prompts, CONFIGURED, 0)
            auto_outs.append(_ids(outs))
            depths_run |= {k for k, v in hist.items() if k.startswith("steps=") and v}
        assert depths_run - {f"steps={STEPS}"}, f"the configured choice never left the deepest chain: {depths_run}"

        outs, steps, off, hist = _run(engine, prompts, FULL, 0)
        ref = _ids(outs)
        assert {k for k, v in hist.items() if v} == {f"steps={STEPS}"} and off == 0, hist  # forced full: depth 7
        assert all(reason == "stop" for _, reason in ref)
        hf = hf_greedy(os.path.join(MODELS, "target"), prompts, MAX_NEW)
        bad = [i for i, ((ids, _), h) in enumerate(zip(ref, hf)) if ids != h[:len(ids)]]
        assert not bad, f"{len(bad)} reference outputs differ from greedy decoding without speculation"
        assert all(got == ref for got in auto_outs), "depth mode changed the output"
        dm = _state(engine)["depth_mode"]
        assert dm["observed_steps"] > 0 and dm["acceptance"][0] is not None, dm

        # draft-off steps inside the adaptive runtime states, requests joining while others decode
        outs, steps, off, hist = _run(engine, prompts, FULL, 3, staggered=True)
        assert _ids(outs) == ref, "draft-off steps in depth mode changed the output"
        assert 0 < off < steps, hist

        # SpecExit across depth changes: the exit keeps the prefix property
        outs, steps, off, hist = _run(engine, prompts, CONFIGURED, 0, custom={"specexit_enable": True})
        exited = count_exits_with_prefix_property(outs, ref)
        assert exited >= 1, "no SpecExit exit in depth mode"
        print(f"depth mode: depths run {sorted(depths_run)}, acceptance {dm['acceptance']}, exits {exited} / 16")
    finally:
        set_force_ratio(engine, CONFIGURED)
        set_force_draft_off(engine, 0)
    pool = _state(engine)["kv_pool"]
    assert pool["running_requests"] == 0 and _held(pool) == held0, "KV slots not returned after the runs"


def test_fixed_ratio_keeps_sglang_adaptive_and_says_why(tmp_path):
    """A fixed ratio has no depth to choose: D-Cut stays off under --speculative-adaptive, with the reason."""
    from sglang_ext.engine.dcut.client import dcut_info

    eng = _launch(tmp_path, max_total_tokens=8192, max_running_requests=8, dcut="0.5")
    try:
        info = dcut_info(eng)
        assert info["depth_mode"] is None
        assert info["unsupported"] == "--speculative-adaptive (depth choice needs --dcut auto)", info
        out = _generate(eng, _prompts(2), SPECEXIT_OFF)
        assert all(o["output_ids"] for o in out)
    finally:
        eng.shutdown()


def test_runner_attributes_each_verify_to_the_depth_it_ran():
    """The runner without an engine: profiling steps (forced columns) queue nothing, a real step's
    accepted counts update the model for the depth it drafted, a result that does not match the
    queued step is dropped (never mis-attributed), a draft-off step teaches nothing, and
    ``dcut_force_ratio`` 1.0 is the deepest chain."""
    from types import SimpleNamespace as NS

    from sglang_ext.config import DCutConfig
    from sglang_ext.dcut import CostTable, CostTableKey
    from sglang_ext.dcut.depth import depth_tiers
    from sglang_ext.engine.dcut.runner import DCutRunner

    runner = DCutRunner(NS(speculative_num_draft_tokens=8, topk=1, speculative_num_steps=7), DCutConfig(mode="auto"))
    runner.enable_depth_mode((1, 3, 7), 7)
    assert runner.tiers == depth_tiers((1, 3, 7), 7) == (0.25, 0.5, 1.0) and runner.num_draft_tokens == 8
    key = CostTableKey("m", "d", "cpu", 1, "float32", 8, 1, 7, "torch_sdpa", 64, "0.5.23", "test")
    runner.cost_table = CostTable.build(key, [4], [[10.0, 14.0, 30.0]], tiers=runner.tiers, off_ms=[8.0])
    runner.reset_online_costs()
    dm = runner.depth

    runner.forced_draft_off, runner.forced_ratio = False, 0.5  # a profiling step of the depth-3 column
    assert runner.depth_for_step(4) == 3 and not dm.pending
    runner.forced_draft_off = runner.forced_ratio = None

    d = runner.depth_for_step(4)  # nothing observed: every position at the prior 0.5
    assert d == 1 and list(dm.pending) == [(4, 1)]  # U = 4 * 1.5 / 10 = 0.6 > 4 * 1.875 / 14 > 4 * 1.99 / 30
    runner.observe_depth([1, 1, 1, 0], 4)
    assert dm.observed_steps == 1 and dm.model.tried[:2] == (4.0, 0.0) and dm.model.accepted[0] == 3.0
    assert runner.draft_off_state.gains is not None and len(runner.draft_off_state.gains) == 3

    runner.depth_for_step(4)
    runner.observe_depth([0, 0], 2)  # not the queued step's batch
    assert dm.dropped_observations == 1 and not dm.pending and dm.observed_steps == 1

    dm.pending.append((4, 0))  # what a draft-off step queues
    runner.observe_depth([0, 0, 0, 0], 4)
    assert dm.observed_steps == 1 and not dm.pending

    runner.set_override_ratio(1.0)
    assert runner.depth_for_step(4) == 7
    runner.observe_depth([7, 7, 2, 5], 4)  # the deepest chain teaches every position it reached
    assert dm.model.tried[2] == 4.0 and dm.model.accepted[2] == 3.0  # position 3: all reached it, 3 passed
    assert dm.model.tried[6] == 2.0 and dm.model.accepted[6] == 2.0  # position 7: two reached and passed it

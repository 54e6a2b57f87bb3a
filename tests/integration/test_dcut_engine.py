"""D-Cut through real SGLang 0.5.23 on the CPU testbed (torch_sdpa attention, tiny models).

One engine per draft shape, each serving every D-Cut mode in turn (switched at runtime through
``/set_internal_state`` ``dcut_force_ratio``: 1.0 = full verification, i.e. ``--dcut off``
behaviour, then the fixed tiers 0.25 / 0.5 / 0.75, then the configured mode):

* EAGLE3 chain, 7 steps / 8 draft tokens, ``--dcut auto`` (profiled at launch);
* EAGLE3 chain, 15 steps / 16 draft tokens, ``--dcut 0.5``;
* EAGLE3 tree, topk 2, 3 steps / 8 draft tokens, ``--dcut auto`` with ``--dcut-cost-table``.

For each: 8 prompts decoded together (batch size 8, 32 tokens) are token-for-token identical to
HF ``generate`` greedy output in every mode (lossless); pruning really happened for the
ratios < 1 (kept fraction below 1, pruned steps counted) and never for 1.0; after the batch
finishes, and after an abort of in-flight requests, the KV allocator's free + evictable slots
return to their start value and flushing the radix cache returns every slot (no leak; SGLang's own
idle leak checks run in strict mode too); the cost table in ``/server_info`` is the one stored on
the target model config and its ``hf_config``.

Budget: < 5 min on the shared 2-core machine (3 engine start-ups of ~45-75 s, one of them with
a small launch-time profile; plus the session's tiny-model fit when not yet built).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from engine_utils import engine_generate, hf_greedy, make_engine

NUM_PROMPTS = 8
MAX_NEW_TOKENS = 32
FORCED_RATIOS = (1.0, 0.25, 0.5, 0.75)
CONFIGS = {
    "chain8-auto": dict(topk=1, steps=7, n=8, dcut="auto"),
    "chain16-0.5": dict(topk=1, steps=15, n=16, dcut=0.5),
    "tree2x8-auto-table": dict(topk=2, steps=3, n=8, dcut="auto", table_file=True),
}
TIERS = (0.25, 0.5, 0.75, 1.0)


def _table_file(path: str, n: int, topk: int, steps: int) -> str:
    """A hand-written cost table (costs grow with the tier) for ``--dcut-cost-table``."""
    from sglang_ext.dcut import CostTable, CostTableKey

    key = CostTableKey("hand-written", "hand-written", "cpu", 1, "float32", n, topk, steps, "torch_sdpa", 64,
                       "0.5.23", "test")
    CostTable.build(key, [1, 8, 16], [[10, 11, 12, 13], [10, 14, 18, 22], [10, 18, 26, 34]],
                    tiers=TIERS).save(path)
    return path


@pytest.fixture(scope="module")
def strict_mem_checks():
    old = os.environ.get("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE")
    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"  # inherited by the scheduler
    yield
    if old is None:
        os.environ.pop("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", None)
    else:
        os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = old


@pytest.fixture(scope="module")
def prompts(tiny_prompts):
    assert len(tiny_prompts) >= NUM_PROMPTS
    return [list(p) for p in tiny_prompts[:NUM_PROMPTS]]


@pytest.fixture(scope="module")
def hf_reference(tiny_models, prompts):
    return hf_greedy(tiny_models.target, prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def served(request, tiny_models, tmp_path_factory, strict_mem_checks):
    """(config, engine, cost-table file or None); the engine lives for all tests of its config."""
    cfg = CONFIGS[request.param]
    tmp = tmp_path_factory.mktemp(f"dcut-{request.param}")
    extra = {}
    table = None
    if cfg.get("table_file"):
        table = _table_file(str(tmp / "table.json"), cfg["n"], cfg["topk"], cfg["steps"])
        extra["dcut_cost_table"] = table
    eng = make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=tiny_models.draft, speculative_num_steps=cfg["steps"],
                      speculative_eagle_topk=cfg["topk"], speculative_num_draft_tokens=cfg["n"],
                      max_running_requests=16, dcut=cfg["dcut"], dcut_cache_dir=str(tmp / "cache"),
                      dcut_profile_batch_sizes="1,8", dcut_profile_steps=2, dcut_profile_warmup=1, **extra)
    try:
        yield cfg, eng, table
    finally:
        eng.shutdown()


def _state(eng):
    from sglang_ext.engine.dcut.client import dcut_states

    states = dcut_states(eng)
    assert len(states) == 1
    return states[0]


def test_lossless_in_every_mode(served, prompts, hf_reference):
    from sglang_ext.engine.dcut.client import set_force_ratio

    cfg, eng, _ = served
    for ratio in FORCED_RATIOS + (0.0,):  # 0.0: back to the configured --dcut mode
        before = _state(eng)["metrics"]
        assert set_force_ratio(eng, ratio)
        outs = engine_generate(eng, prompts, MAX_NEW_TOKENS)
        got = [o["output_ids"] for o in outs]
        assert got == hf_reference, f"mode {ratio or cfg['dcut']}: output differs from greedy HF"
        after = _state(eng)["metrics"]
        pruned = after["pruned_steps"] - before["pruned_steps"]
        verified = after["verified_tokens"] - before["verified_tokens"]
        full = after["full_tokens"] - before["full_tokens"]
        assert after["steps"] > before["steps"]
        if ratio == 1.0:
            assert pruned == 0 and verified == full
        elif ratio > 0:
            assert pruned > 0 and verified < full, f"ratio {ratio} never pruned"
            # a fixed ratio keeps at most ceil(bs * N * ratio) rows per step
            assert verified <= full * ratio + (after["steps"] - before["steps"])
        accepted = after["accepted_tokens"] - before["accepted_tokens"]
        assert 0 < accepted <= verified
    assert set_force_ratio(eng, 0.0)


def test_metrics_and_tiers(served):
    cfg, eng, _ = served
    m = _state(eng)["metrics"]
    assert m["steps"] > 0 and 0 < m["keep_ratio"] < 1
    assert m["exempt_requests"] == {"grammar": 0, "logprobs": 0, "penalties": 0, "rejection_sampling": 0}
    names = {f"{t:g}" for t in TIERS} | {"full"}
    assert set(m["tier_histogram"]) <= names, m["tier_histogram"]
    assert 0 < m["draft_accept_rate"] <= 1


def test_cost_table_in_server_info_and_model_config(served):
    from sglang_ext.engine.dcut.client import dcut_info

    cfg, eng, table = served
    info = dcut_info(eng)
    assert info["tiers"] == list(TIERS) and info["num_draft_tokens"] == cfg["n"]
    src = info["cost_table_info"]["source"]
    if cfg["dcut"] != "auto":
        assert src == "not needed" and info["cost_table"] is None
        return
    assert info["hf_config_matches"] is True
    if table is not None:
        assert src == "file"
        with open(table) as f:
            assert info["cost_table"] == json.load(f)
    else:
        assert src == "profiled"
        with open(info["cost_table_info"]["path"]) as f:
            assert info["cost_table"] == json.load(f)
        assert info["cost_table"]["batch_sizes"] == [1, 8]
        assert info["cost_table"]["key"]["draft_tokens"] == cfg["n"]


def _pool(eng):
    return _state(eng)["kv_pool"]


def test_no_kv_leak_after_finish_and_abort(served, prompts):
    cfg, eng, _ = served
    start = _pool(eng)
    held0 = start["kv_total"] - start["kv_available"] - start["kv_evictable"]
    engine_generate(eng, prompts, MAX_NEW_TOKENS)
    done = _pool(eng)
    assert done["running_requests"] == 0
    assert done["kv_total"] - done["kv_available"] - done["kv_evictable"] == held0
    assert done["req_rows_free"] == start["req_rows_free"]

    async def abort_in_flight():
        params = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}
        tasks = [asyncio.ensure_future(eng.async_generate(input_ids=p, sampling_params=params)) for p in prompts]
        for _ in range(600):  # wait until decoding is under way
            await asyncio.sleep(0.05)
            states = await eng.tokenizer_manager.get_internal_state()
            if states[0]["dcut"]["kv_pool"]["running_requests"] > 0:
                break
        await asyncio.sleep(0.5)
        eng.tokenizer_manager.abort_request(abort_all=True)
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = eng.loop.run_until_complete(abort_in_flight())
    assert len(results) == len(prompts)
    for _ in range(100):
        after = _pool(eng)
        if after["running_requests"] == 0:
            break
        eng.loop.run_until_complete(asyncio.sleep(0.1))
    assert after["running_requests"] == 0
    assert after["kv_total"] - after["kv_available"] - after["kv_evictable"] == held0
    assert after["req_rows_free"] == start["req_rows_free"]
    eng.flush_cache()
    flushed = _pool(eng)
    assert flushed["kv_evictable"] == 0
    assert flushed["kv_available"] == flushed["kv_total"] - held0


def test_exempt_requests_keep_their_full_tree(served, prompts, hf_reference):
    """Logprob and penalty requests are verified in full (counted); output stays lossless."""
    from sglang_ext.engine.dcut.client import set_force_ratio

    cfg, eng, _ = served
    if cfg["dcut"] != "auto" or cfg["topk"] != 1:
        pytest.skip("one configuration is enough")
    assert set_force_ratio(eng, 0.25)
    try:
        before = _state(eng)["metrics"]
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        outs = eng.generate(input_ids=prompts[:2], sampling_params=params, return_logprob=True)
        assert [o["output_ids"] for o in outs] == hf_reference[:2]
        mid = _state(eng)["metrics"]
        assert mid["exempt_requests"]["logprobs"] > before["exempt_requests"]["logprobs"]
        assert mid["pruned_steps"] == before["pruned_steps"]  # every request exempt: nothing pruned
        # a penalised request next to plain ones: it is exempt, the plain ones are still pruned
        pen = dict(params, frequency_penalty=0.5)
        assert set_force_ratio(eng, 1.0)
        ref_pen = eng.generate(input_ids=prompts[:1], sampling_params=pen)[0]["output_ids"]
        assert set_force_ratio(eng, 0.25)
        outs = eng.generate(input_ids=prompts[:4], sampling_params=[pen, params, params, params])
        after = _state(eng)["metrics"]
        assert outs[0]["output_ids"] == ref_pen
        assert [o["output_ids"] for o in outs[1:]] == hf_reference[1:4]
        assert after["exempt_requests"]["penalties"] > mid["exempt_requests"]["penalties"]
        assert after["pruned_steps"] > mid["pruned_steps"]
    finally:
        set_force_ratio(eng, 0.0)


def test_link_cut_oracle_matches_compacted_verify(served, prompts, hf_reference):
    """Route C (same layout, pruned links cut, full-width forward) == compacted verify == HF."""
    from sglang_ext.engine.dcut.client import set_compact, set_force_ratio

    cfg, eng, _ = served
    if cfg["n"] != 8:
        pytest.skip("the 8-token configurations are enough")
    assert set_force_ratio(eng, 0.5)
    try:
        before = _state(eng)["metrics"]
        assert set_compact(eng, False)
        oracle = [o["output_ids"] for o in engine_generate(eng, prompts, MAX_NEW_TOKENS)]
        mid = _state(eng)["metrics"]
        assert set_compact(eng, True)
        compact = [o["output_ids"] for o in engine_generate(eng, prompts, MAX_NEW_TOKENS)]
        after = _state(eng)["metrics"]
    finally:
        set_compact(eng, True)
        set_force_ratio(eng, 0.0)
    assert oracle == compact == hf_reference
    # the oracle prunes the same way but runs full-width forwards; the compacted verify does not
    assert mid["pruned_steps"] > before["pruned_steps"]
    assert mid["padded_tokens"] - before["padded_tokens"] == mid["full_tokens"] - before["full_tokens"]
    assert after["padded_tokens"] - mid["padded_tokens"] < after["full_tokens"] - mid["full_tokens"]

"""Launch-time D-Cut cost profiling through real SGLang on the CPU testbed (tiny models).

Three launches with ``--dcut auto`` and one cache directory:

1. empty cache: the scheduler profiles with the default CPU settings (batch sizes 1, 4, 8, 16,
   32, 64 at ``--max-running-requests 64``; every tier; 3 warm-up + 5 timed steps), writes the JSON
   cache, the table is in ``/server_info`` (``source == "profiled"``), equals the file, is stored
   on the target model config and its ``hf_config``, every cost is a positive number and the
   launch profile took < 30 s;
2. same settings again: the cache is reused (``source == "cache"``, the very same table,
   ``created`` included: no second profiling);
3. the cache file corrupted: a warning, the fixed fallback ratio 0.75 (``source == "fallback"``,
   no table) and the server still serves lossless output;
4. other ``--dcut-tiers`` and batch sizes on the same cache directory: a new cache file is profiled
   (not the old one refused as corrupt); a batch size whose requests do not fit the request pool is
   skipped with a warning and its row copied from the nearest measured one; the prefill runs in groups
   of ``--chunked-prefill-size`` tokens; the plan and the expected duration are logged first; the
   server serves lossless output.

The cost-table key, cache path and fallback decisions are also checked without an engine.

Budget: < 5 min on the shared 2-core machine (four engine start-ups of ~45-75 s).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from engine_utils import engine_generate, hf_greedy, make_engine

STEPS, TOPK, N = 3, 1, 4
PROFILE_BATCH_SIZES = [1, 4, 8, 16, 32, 64]
MAX_PROFILE_S = 30.0


def _engine(tiny_models, cache_dir):
    # default profiling settings: CPU batch sizes 1, 4, 8, 16, 32, 64 (max running requests 64),
    # 3 warm-up + 5 timed steps per (batch size, tier)
    return make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                       speculative_draft_model_path=tiny_models.draft, speculative_num_steps=STEPS,
                       speculative_eagle_topk=TOPK, speculative_num_draft_tokens=N, max_running_requests=64,
                       max_total_tokens=16384, dcut="auto", dcut_cache_dir=cache_dir, log_level="info")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dcut-cache"))


@pytest.fixture(scope="module")
def first_launch(tiny_models, cache_dir):
    from sglang_ext.engine.dcut.client import dcut_info

    eng = _engine(tiny_models, cache_dir)
    try:
        return dcut_info(eng)
    finally:
        eng.shutdown()


def test_profiled_table_written_and_published(first_launch, cache_dir):
    info = first_launch
    src = info["cost_table_info"]
    assert src["source"] == "profiled", src
    path = src["path"]
    assert os.path.dirname(path) == cache_dir and re.fullmatch(r"dcut-[0-9a-f]{16}\.json", os.path.basename(path))
    with open(path) as f:
        on_disk = json.load(f)
    table = info["cost_table"]
    assert table == on_disk
    assert info["hf_config_matches"] is True
    assert table["batch_sizes"] == PROFILE_BATCH_SIZES and table["tiers"] == [0.25, 0.5, 0.75, 1.0]
    assert all(len(row) == 4 and all(c > 0 for c in row) for row in table["step_ms"])
    # --dcut-draft-off auto (the default): the draft-off step is timed too (schema version 2)
    assert table["version"] == 2 and len(table["off_ms"]) == len(PROFILE_BATCH_SIZES)
    assert all(c > 0 for c in table["off_ms"])
    key = table["key"]
    assert (key["draft_tokens"], key["topk"], key["num_steps"], key["tp"]) == (N, TOPK, STEPS, 1)
    assert key["attention_backend"] == "torch_sdpa" and key["dtype"] == "float32"
    assert 0 < src["profile_s"] < MAX_PROFILE_S


def test_cache_reused_without_profiling(first_launch, tiny_models, cache_dir):
    from sglang_ext.engine.dcut.client import dcut_info

    eng = _engine(tiny_models, cache_dir)
    try:
        info = dcut_info(eng)
    finally:
        eng.shutdown()
    assert info["cost_table_info"]["source"] == "cache"
    assert info["cost_table_info"]["path"] == first_launch["cost_table_info"]["path"]
    assert info["cost_table"] == first_launch["cost_table"]  # same 'created': not profiled again


def test_corrupt_cache_falls_back_and_serves(first_launch, tiny_models, tiny_prompts, cache_dir):
    from sglang_ext.engine.dcut.client import dcut_info, dcut_states

    path = first_launch["cost_table_info"]["path"]
    with open(path, "w") as f:
        f.write('{"version": 1, "key": {"model": ')  # truncated JSON
    prompts = [list(p) for p in tiny_prompts[:4]]
    ref = hf_greedy(tiny_models.target, prompts, 16)
    eng = _engine(tiny_models, cache_dir)
    try:
        info = dcut_info(eng)
        got = [o["output_ids"] for o in engine_generate(eng, prompts, 16)]
        states = dcut_states(eng)
    finally:
        eng.shutdown()
    assert info["cost_table_info"]["source"] == "fallback"
    assert "not valid JSON" in info["cost_table_info"]["error"]
    assert info["cost_table"] is None and info["hf_config_matches"] is True
    assert got == ref
    hist = states[0]["metrics"]["tier_histogram"]
    assert hist and all(k.startswith("fallback:") or k == "full" for k in hist), hist


def test_cache_key_and_path_are_stable():
    from sglang_ext.dcut import CostTableKey
    from sglang_ext.engine.dcut.profiler import cache_path

    k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "0.1.0")
    k2 = CostTableKey("m", "d", "cpu", 2, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "0.1.0")
    k3 = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 128, "0.5.23", "0.1.0")
    tiers, bss = (0.25, 0.5, 0.75, 1.0), (1, 4, 8)
    path = cache_path(k, tiers, bss, "/c")
    assert path == cache_path(k, list(tiers), list(bss), "/c") and path.startswith("/c/dcut-")
    others = [cache_path(k2, tiers, bss, "/c"), cache_path(k3, tiers, bss, "/c"),  # key, profiling context
              cache_path(k, (0.5, 1.0), bss, "/c"), cache_path(k, tiers, (1, 4, 8, 16), "/c")]  # tiers, sizes
    assert len({path, *others}) == 5


def test_profile_plan_skips_what_does_not_fit():
    from sglang_ext.engine.dcut.profiler import plan_profile

    # 4 x (64 + 14) = 312 slots fit in 90 % of 400; 8 x 78 = 624 do not; 65 > 64 request rows
    plan = plan_profile([1, 4, 8, 65], context_len=64, reserve=14, kv_free=400, req_rows=64, prefill_tokens=128)
    assert plan.measured == (4, 1)  # largest first: its first step gives the expected duration
    assert sorted(plan.skipped) == [8, 65]
    assert "624 KV slots exceed 90 % of the 400 free" in plan.skipped[8]
    assert "65 requests exceed the 64 free request rows" in plan.skipped[65]
    assert plan.group_size == 2  # 128 prefill tokens per forward / 64 context
    assert plan_profile([4], 64, 14, 400, 64, 8).group_size == 1


def test_second_setup_profiles_anew_and_fills_skipped_sizes(first_launch, tiny_models, tiny_prompts, cache_dir,
                                                            capfd):
    from sglang_ext.engine.dcut.client import dcut_info

    prompts = [list(p) for p in tiny_prompts[:4]]
    ref = hf_greedy(tiny_models.target, prompts, 16)
    eng = make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=tiny_models.draft, speculative_num_steps=STEPS,
                      speculative_eagle_topk=TOPK, speculative_num_draft_tokens=N, max_running_requests=8,
                      max_total_tokens=16384, chunked_prefill_size=128, dcut="auto", dcut_cache_dir=cache_dir,
                      dcut_tiers="0.5,1.0", dcut_profile_batch_sizes="1,4,4096", dcut_profile_steps=2,
                      dcut_profile_warmup=1, log_level="info")
    try:
        info = dcut_info(eng)
        got = [o["output_ids"] for o in engine_generate(eng, prompts, 16)]
    finally:
        eng.shutdown()
    log = capfd.readouterr().err
    src = info["cost_table_info"]
    assert src["source"] == "profiled", src  # not the first launch's file refused as corrupt
    assert src["path"] != first_launch["cost_table_info"]["path"] and os.path.dirname(src["path"]) == cache_dir
    table = info["cost_table"]
    assert table["tiers"] == [0.5, 1.0] and table["batch_sizes"] == [1, 4, 4096]
    assert table["step_ms"][2] == table["step_ms"][1]  # 4096 copied from 4, the nearest measured size
    assert table["off_ms"][2] == table["off_ms"][1]  # the draft-off cost is filled the same way
    assert src["filled"] == {"4096": 4} and "request rows" in src["skipped"]["4096"]
    assert "profiling skips batch size 4096" in log
    assert re.search(r"D-Cut: profiling the cost table: batch sizes \[4, 1\] .* prefill groups of 2 requests", log)
    # one progress line per batch size (largest first), the last one with nothing left
    plan_at = log.index("D-Cut: profiling the cost table")
    rows = re.findall(r"D-Cut: cost profiling (\d)/2 batch sizes done \(batch size (\d+) in [\d.]+ s\), about (\d+) s left",
                      log)
    assert [(int(k), int(b)) for k, b, _ in rows] == [(1, 4), (2, 1)], rows
    assert rows[-1][2] == "0"
    assert plan_at < log.index("D-Cut: cost profiling 1/2") < log.index("D-Cut: profiled 2 batch sizes")
    assert got == ref


def test_profiler_doctests_and_interleaving():
    # Median cost and the round-robin order of timed steps (no engine).
    import doctest

    from sglang_ext.engine.dcut import profiler

    assert doctest.testmod(profiler).failed == 0
    order = profiler.interleaved_order(4, 5)
    assert [order.count(q) for q in range(4)] == [5, 5, 5, 5]
    assert order[:8] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert profiler._robust_cost([3.0, 1000.0, 2.0, 4.0, 5.0]) == 4.0

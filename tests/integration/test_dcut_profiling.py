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
   no table) and the server still serves lossless output.

The cost-table key, cache path and fallback decisions are also checked without an engine.

Budget: < 4 min on the shared 2-core machine (three engine start-ups of ~45-75 s).
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
    assert cache_path(k, "/c") == cache_path(k, "/c") != cache_path(k2, "/c")
    assert cache_path(k, "/c").startswith("/c/dcut-")


def test_profiler_doctests_and_interleaving():
    # Median cost and the round-robin order of timed steps (no engine).
    import doctest

    from sglang_ext.engine.dcut import profiler

    assert doctest.testmod(profiler).failed == 0
    order = profiler.interleaved_order(4, 5)
    assert [order.count(q) for q in range(4)] == [5, 5, 5, 5]
    assert order[:8] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert profiler._robust_cost([3.0, 1000.0, 2.0, 4.0, 5.0]) == 4.0

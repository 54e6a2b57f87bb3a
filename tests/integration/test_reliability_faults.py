"""Reliability: injected faults end in a warning and a fallback, or in one clear launch error, never in a crash.

D-Cut cost table (in-process, through ``DCutRunner.init_after_graphs``, the call the worker makes
once its graphs are ready; the scheduler's TP group is stubbed as a single rank):

* ``--dcut-cost-table`` files that are corrupt in many ways (a file profiled for another server is
  used, with one warning naming every differing key field), and a corrupt cost-table *cache*
  (truncated, binary, another setup's key, a directory): fallback ratio 0.75 with a warning,
  the error recorded in the table info, ``None`` published on the model config, the cache file
  left as it was (no silent re-profiling);
* the profiler raising (allocation failure, arithmetic error, out of memory) and an unwritable
  cache directory; and the runtime context missing altogether.

Real engine (one launch, CPU testbed, tiny models): an EAGLE3 draft whose weights are NaN (every
draft confidence NaN) with SpecExit (draft-confidence signals) and ``--dcut auto`` whose
profiler cannot run for real (its only profiled batch size is larger than the request pool, so no
batch size fits; a size that does not fit next to ones that do is filled instead, see
``test_dcut_profiling.py``): the launch
falls back with a warning, greedy output equals HF transformers token for token, SpecExit
sees no signal and exits nothing, and no KV slot leaks.

Launch errors: a stop-think token that is not one token of the vocabulary, and step-split
strings none of which is one token, are refused with the flag named (in-process through the
resolver the worker calls at start; the slow tier launches a real server). A draft checkpoint
without SpecExit rows with ``--specexit-signal-source head`` is covered by
``test_specexit_glue_unit.py`` (in-process) and ``test_specexit_slow.py`` (real launch).

Budget: < 3 min (in-process checks ~10 s; one engine start-up of ~45-90 s; slow tier: + ~90 s).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

TIERS = (0.25, 0.5, 0.75, 1.0)


# ----------------------------------------------------------------------------- in-process helpers
def _key(**changes):
    from sglang_ext.dcut import CostTableKey

    key = CostTableKey("tiny-target", "tiny-draft", "cpu:x86_64:2cpus", 1, "float32", 4, 1, 3, "torch_sdpa", 64,
                       "0.5.23", "0.1.0")
    return dataclasses.replace(key, **changes)


def _table_dict(**changes):
    from sglang_ext.dcut import CostTable

    d = CostTable.build(_key(), [1, 4], [[4.0, 5.0, 6.0, 7.0], [5.0, 6.5, 8.0, 9.5]], tiers=TIERS,
                        created="2026-01-01T00:00:00+00:00").to_dict()
    d.update(changes)
    return d


def _fake_worker():
    """The attributes ``DCutRunner`` and ``publish_cost_table`` read from the EAGLE worker."""
    model_config = SimpleNamespace(hf_config=SimpleNamespace(), mambaish_config=None)
    return SimpleNamespace(target_worker=SimpleNamespace(model_runner=SimpleNamespace(model_config=model_config)),
                           speculative_num_draft_tokens=4, topk=1)


@pytest.fixture
def single_rank(monkeypatch):
    """Outside a scheduler there is no TP group: stub it as a single rank (what a TP=1 server has)."""
    from sglang_ext.engine.dcut import profiler

    monkeypatch.setattr(profiler, "_tp_group", lambda: None)


@pytest.fixture
def cache_setup(monkeypatch, single_rank):
    """Profiling plan and key of a fixed server, so the cache path is known in advance."""
    from sglang_ext.engine.dcut import profiler

    monkeypatch.setattr(profiler, "profile_batch_sizes", lambda cfg, worker: (1, 4))
    monkeypatch.setattr(profiler, "profile_context_len", lambda cfg, worker, max_bs: 64)
    monkeypatch.setattr(profiler, "cost_table_key", lambda worker, context_len: _key())
    monkeypatch.setattr(profiler, "make_plan", lambda cfg, worker, bss, ctx: profiler.plan_profile(
        bss, ctx, reserve=14, kv_free=1 << 20, req_rows=64, prefill_tokens=8192))


def _cache_file(cache_dir):
    """The cache file of the ``cache_setup`` server (key, tiers, batch sizes and, as ``--dcut auto`` times the
    draft-off step by default, the draft-off column hashed)."""
    from sglang_ext.config import DCutConfig
    from sglang_ext.engine.dcut import profiler

    assert DCutConfig(mode="auto").may_draft_off
    return profiler.cache_path(_key(), TIERS, (1, 4), str(cache_dir), draft_off=True)


def _launch(cfg, caplog):
    """``DCutRunner.init_after_graphs`` on a fake worker; returns (runner, worker, warnings)."""
    from sglang_ext.engine.dcut.runner import DCutRunner

    worker = _fake_worker()
    runner = DCutRunner(worker, cfg)
    with caplog.at_level(logging.WARNING):
        runner.init_after_graphs(worker)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return runner, worker, warnings


def _assert_fallback(runner, worker, warnings, needle):
    from sglang_ext.engine.dcut.profiler import MODEL_CONFIG_ATTR, MODEL_CONFIG_INFO_ATTR

    info = runner.table_info
    assert runner.cost_table is None
    assert info["source"] == "fallback", info
    assert needle in info["error"], info["error"]
    assert any("fallback ratio 0.75" in w for w in warnings), warnings
    mc = worker.target_worker.model_runner.model_config
    for obj in (mc, mc.hf_config):  # what the planner's server sees: no table, and why
        assert getattr(obj, MODEL_CONFIG_ATTR) is None
        assert getattr(obj, MODEL_CONFIG_INFO_ATTR)["source"] == "fallback"


# ----------------------------------------------------------------------------- --dcut-cost-table files
_NAN_COST = _table_dict(step_ms=[[4.0, float("nan"), 6.0, 7.0], [5.0, 6.5, 8.0, 9.5]])
BAD_TABLE_FILES = [
    ("truncated", '{"version": 1, "key": {"model": ', "not valid JSON"),
    ("empty", "", "not valid JSON"),
    ("not-an-object", "[1, 2, 3]", "expected a JSON object"),
    ("future-version", json.dumps(_table_dict(version=3)), "unsupported version 3"),
    ("missing-fields", json.dumps({"version": 1, "key": _key().to_dict()}), "missing field(s)"),
    ("nan-cost", json.dumps(_NAN_COST), "finite positive"),
    ("negative-cost", json.dumps(_table_dict(step_ms=[[4.0, -5.0, 6.0, 7.0], [5.0, 6.5, 8.0, 9.5]])),
     "finite positive"),
    ("ragged-row", json.dumps(_table_dict(step_ms=[[4.0, 5.0, 6.0], [5.0, 6.5, 8.0, 9.5]])), "values for 4 tiers"),
    ("bad-key-field", json.dumps(_table_dict(key=dict(_key().to_dict(), tp="one"))), "'tp' must be an int"),
    ("other-tiers", json.dumps(_table_dict(tiers=[0.25, 0.5, 0.8, 1.0])), "differ from --dcut-tiers"),
]


@pytest.mark.parametrize("name,text,needle", BAD_TABLE_FILES, ids=[c[0] for c in BAD_TABLE_FILES])
def test_corrupt_cost_table_file_falls_back(single_rank, caplog, tmp_path, name, text, needle):
    from sglang_ext.config import DCutConfig

    path = tmp_path / "table.json"
    path.write_text(text)
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cost_table=str(path)), caplog)
    _assert_fallback(runner, worker, warnings, needle)
    assert runner.table_info["path"] == str(path)


def test_valid_cost_table_file_is_used(cache_setup, caplog, tmp_path):
    """The control case of the table above: the same file, uncorrupted, is loaded as is."""
    from sglang_ext.config import DCutConfig
    from sglang_ext.engine.dcut.profiler import MODEL_CONFIG_ATTR

    path = tmp_path / "table.json"
    path.write_text(json.dumps(_table_dict()))
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cost_table=str(path)), caplog)
    assert runner.table_info == {"source": "file", "path": str(path)} and not warnings
    assert getattr(worker.target_worker.model_runner.model_config, MODEL_CONFIG_ATTR) == _table_dict()


def test_cost_table_file_of_another_setup_warns_naming_each_field(cache_setup, caplog, tmp_path):
    """``--dcut-cost-table`` profiled for another server: used, with one warning naming every differing field."""
    from sglang_ext.config import DCutConfig

    path = tmp_path / "table.json"
    path.write_text(json.dumps(_table_dict(key=_key(tp=2, context_len=2048, device="NVIDIA H200").to_dict())))
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cost_table=str(path)), caplog)
    assert runner.cost_table is not None and runner.table_info["source"] == "file"
    assert runner.table_info["key_mismatch"] == ["device", "tp", "context_len"]
    (warning,) = warnings
    for part in ("device: file 'NVIDIA H200' != server 'cpu:x86_64:2cpus'", "tp: file 2 != server 1",
                 "context_len: file 2048 != server 64", str(path)):
        assert part in warning, warning


def test_cost_table_file_key_unverifiable_warns(single_rank, caplog, tmp_path):
    """Without the server's runtime context the key cannot be compared: the table is used, with a warning."""
    from sglang_ext.config import DCutConfig

    path = tmp_path / "table.json"
    path.write_text(json.dumps(_table_dict()))
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cost_table=str(path)), caplog)
    assert runner.cost_table is not None and runner.table_info["key_check"].startswith("not checked")
    assert any("cannot compare the key of --dcut-cost-table" in w for w in warnings), warnings


# ----------------------------------------------------------------------------- corrupt cache
def _write_cache(path, kind):
    if kind == "truncated":
        path.write_text('{"version": 1, "key": ')
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "other-setup":
        path.write_text(json.dumps(_table_dict(key=_key(tp=2).to_dict())))
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(kind)


CORRUPT_CACHES = [("truncated", "not valid JSON"), ("binary", "not UTF-8 text"),
                  ("other-setup", "profiled for another setup (tp: file 2 != expected 1)"),
                  ("directory", "cannot read cost table")]


@pytest.mark.parametrize("kind,needle", CORRUPT_CACHES, ids=[c[0] for c in CORRUPT_CACHES])
def test_corrupt_cache_falls_back_without_reprofiling(cache_setup, monkeypatch, caplog, tmp_path, kind, needle):
    from sglang_ext.config import DCutConfig
    from sglang_ext.engine.dcut import profiler

    def must_not_profile(*args, **kwargs):
        raise AssertionError("a corrupt cache must not trigger profiling")

    monkeypatch.setattr(profiler, "profile_cost_table", must_not_profile)
    cache = tmp_path / "cache"
    cache.mkdir()
    path = _cache_file(cache)
    _write_cache(tmp_path / "cache" / os.path.basename(path), kind)
    before = sorted(os.listdir(cache))
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cache_dir=str(cache)), caplog)
    _assert_fallback(runner, worker, warnings, needle)
    assert sorted(os.listdir(cache)) == before  # left for the operator to inspect


def test_binary_cache_error_names_the_file(cache_setup, caplog, tmp_path):
    from sglang_ext.config import DCutConfig

    cache = tmp_path / "cache"
    cache.mkdir()
    path = _cache_file(cache)
    _write_cache(tmp_path / "cache" / os.path.basename(path), "binary")
    runner, _, warnings = _launch(DCutConfig(mode="auto", cache_dir=str(cache)), caplog)
    assert runner.table_info.get("path") == path and path in runner.table_info["error"]


# ----------------------------------------------------------------------------- profiler faults
PROFILER_FAULTS = [
    (RuntimeError("alloc_req_slots runs out of memory"), "RuntimeError: alloc_req_slots runs out of memory"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError"),
    (torch.OutOfMemoryError("CUDA out of memory"), "OutOfMemoryError"),
    (KeyError("token_to_kv_pool_allocator"), "KeyError"),
]


@pytest.mark.parametrize("error,needle", PROFILER_FAULTS, ids=[type(e).__name__ for e, _ in PROFILER_FAULTS])
def test_profiler_raising_falls_back_and_writes_no_cache(cache_setup, monkeypatch, caplog, tmp_path, error, needle):
    from sglang_ext.config import DCutConfig
    from sglang_ext.engine.dcut import profiler

    def failing_profile(*args, **kwargs):
        raise error

    monkeypatch.setattr(profiler, "profile_cost_table", failing_profile)
    cache = tmp_path / "cache"
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cache_dir=str(cache)), caplog)
    _assert_fallback(runner, worker, warnings, "profiling failed: " + needle)
    assert not cache.exists() or os.listdir(cache) == []


def test_unwritable_cache_keeps_the_profiled_table(cache_setup, monkeypatch, caplog, tmp_path):
    from sglang_ext.config import DCutConfig
    from sglang_ext.dcut import CostTable
    from sglang_ext.engine.dcut import profiler

    monkeypatch.setattr(profiler, "profile_cost_table",
                        lambda runner, worker, key, plan: CostTable.from_dict(_table_dict()))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    runner, worker, warnings = _launch(DCutConfig(mode="auto", cache_dir=str(blocker / "dcut")), caplog)
    assert runner.cost_table is not None and runner.table_info["source"] == "profiled"
    assert runner.table_info["error"].startswith("cache not written")
    assert any("cannot write the cost table cache" in w for w in warnings), warnings


def test_missing_runtime_context_falls_back(caplog):
    """No stubs: outside a scheduler SGLang's runtime context raises; the runner still falls back."""
    from sglang_ext.config import DCutConfig

    runner, worker, warnings = _launch(DCutConfig(mode="auto"), caplog)
    _assert_fallback(runner, worker, warnings, "RuntimeError")


# ----------------------------------------------------------------------------- stop-think token / vocabulary
@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models.target)


@pytest.mark.parametrize("text", ["</reflect>", "<|end_of_thinking|>", "</think></think>"])
def test_stop_think_token_outside_the_vocabulary_is_refused(tokenizer, text):
    from sglang_ext.config import ConfigError, SpecExitConfig, resolve_token_ids

    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731 (what the worker passes)
    assert len(encode(text)) != 1  # the premise: not a single token of this vocabulary
    with pytest.raises(ConfigError) as exc:
        resolve_token_ids(SpecExitConfig(enabled=True, stop_think_token=text), encode)
    assert str(exc.value).startswith(f"--specexit-stop-think-token: {text!r} must encode to exactly one token")
    ok = resolve_token_ids(SpecExitConfig(enabled=True), encode)  # the default resolves
    assert ok.stop_think_id == tokenizer.convert_tokens_to_ids("</think>")


def test_step_split_strings_without_a_single_token_are_refused(tokenizer):
    from sglang_ext.config import ConfigError, SpecExitConfig, resolve_token_ids

    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    cfg = SpecExitConfig(enabled=True, step_split_tokens=("zz qq xx", "~~~~ ~~~~"))
    with pytest.raises(ConfigError, match=r"^--specexit-step-split-tokens: none of"):
        resolve_token_ids(cfg, encode)


@pytest.mark.slow
def test_launch_with_unknown_stop_think_token_fails_naming_the_flag(tiny_models, tmp_path):
    """A real ``python -m sglang.launch_server`` exits non-zero with the flag in its output."""
    from sglang_ext import demo
    from sglang_ext.engine.cpu.standins import cpu_testbed_env

    models = demo.DemoModels(tiny_models.target, tiny_models.draft, trained=False)
    cmd = demo.server_command(models, demo.free_port(), ["--specexit-stop-think-token", "</reflect>",
                                                          "--dcut", "off"])
    proc = subprocess.run(cmd, env=cpu_testbed_env(), capture_output=True, text=True, timeout=480,
                          start_new_session=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "--specexit-stop-think-token: '</reflect>' must encode to exactly one token" in out, out[-3000:]


# ----------------------------------------------------------------------------- real engine: NaN draft + failing profiler
NUM_PROMPTS, MAX_NEW = 6, 24


def _nan_draft(src: str, dst: str) -> str:
    """A copy of an EAGLE3 draft whose fc weights are NaN: every draft logit, so every confidence, is NaN."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = os.path.join(dst, "model.safetensors")
    state = load_file(weights)
    (fc,) = [k for k in state if k.endswith("fc.weight")]
    state[fc] = torch.full_like(state[fc], float("nan"))
    save_file(state, weights)
    return dst


@pytest.fixture(scope="module")
def faulty_run(tiny_models, tmp_path_factory):
    from engine_utils import engine_generate, make_engine

    from sglang_ext.engine.dcut.client import dcut_info, dcut_states, server_info
    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = corpus_prompts(vocab, NUM_PROMPTS, 4, seed=1).tolist()
    draft = _nan_draft(tiny_models.draft, str(tmp_path_factory.mktemp("nan_draft") / "draft"))
    eng = make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=draft, speculative_num_steps=3, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=4, max_running_requests=8,
                      specexit=True, specexit_method="confidence", specexit_signal_source="draft-confidence",
                      specexit_ewma_alpha=1.0, specexit_confidence_threshold=0.0,
                      dcut="auto", dcut_cache_dir=str(tmp_path_factory.mktemp("dcut_cache")),
                      dcut_profile_batch_sizes="4096", dcut_profile_steps=1, dcut_profile_warmup=0)
    try:
        start = dcut_states(eng)[0]["kv_pool"]
        info = dcut_info(eng)
        half = NUM_PROMPTS // 2
        plain = engine_generate(eng, prompts[:half], MAX_NEW)
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
        thinking = eng.generate(input_ids=prompts[half:], sampling_params=params, require_reasoning=True)
        states = server_info(eng)["internal_states"][0]
        end = states["dcut"]["kv_pool"]
    finally:
        eng.shutdown()
    return SimpleNamespace(prompts=prompts, info=info, outputs=plain + thinking, thinking=thinking,
                           specexit=states["specexit"], dcut=states["dcut"], start=start, end=end)


def test_failing_profiler_in_the_scheduler_falls_back(faulty_run):
    src = faulty_run.info["cost_table_info"]
    assert src["source"] == "fallback", src
    assert "profiling failed" in src["error"] and "no profiled batch size fits" in src["error"], src
    assert "4096 requests exceed the" in src["error"], src
    assert faulty_run.info["cost_table"] is None and faulty_run.info["hf_config_matches"] is True
    hist = faulty_run.dcut["metrics"]["tier_histogram"]
    assert faulty_run.dcut["metrics"]["steps"] > 0 and hist, faulty_run.dcut["metrics"]
    assert all(k.startswith("fallback:") or k == "full" for k in hist), hist
    start = faulty_run.start  # after the failed profiling, before any request: every KV slot is free
    assert start["kv_available"] == start["kv_total"] and start["running_requests"] == 0, start


def test_nan_draft_confidences_keep_output_lossless(faulty_run, tiny_models):
    from engine_utils import hf_greedy

    ref = hf_greedy(tiny_models.target, faulty_run.prompts, MAX_NEW)
    assert [o["output_ids"] for o in faulty_run.outputs] == ref


def test_nan_draft_confidences_make_every_draft_ineligible(faulty_run):
    """NaN confidences were captured (not skipped) and D-Cut kept only the roots: 1 of N=4 verify rows."""
    m = faulty_run.dcut["metrics"]
    assert m["uncaptured_steps"] == 0 and m["pruned_steps"] == m["steps"] > 0, m
    assert m["keep_ratio"] == 0.25 and m["verified_tokens"] == m["accepted_tokens"], m
    assert m["mean_accept_length"] == 1.0, m


def test_nan_signals_never_end_thinking(faulty_run):
    """Thinking requests are watched but never exited: with NaN drafts nothing is accepted, so the
    draft-confidence source observes no signal (threshold 0 and alpha 1 would exit on any finite one)."""
    assert all(o["meta_info"]["specexit_active"] for o in faulty_run.thinking)
    assert not any(o["meta_info"]["specexit_exited"] for o in faulty_run.thinking)
    assert faulty_run.specexit["exits_total"] == 0, faulty_run.specexit


def test_no_kv_leak_after_the_faults(faulty_run):
    held = lambda p: p["kv_total"] - p["kv_available"] - p["kv_evictable"]  # noqa: E731
    assert faulty_run.end["running_requests"] == 0
    assert held(faulty_run.end) == held(faulty_run.start)
    assert faulty_run.end["req_rows_free"] == faulty_run.start["req_rows_free"]

"""Reliability against one launched CPU server (SpecExit + D-Cut on): bad per-request options and a concurrency soak.

The server is the CPU demo preset (``configs/cpu_demo.yaml``: EAGLE3, ``--reasoning-parser
qwen3-thinking``, ``--specexit``, ``--dcut auto``, 64 running requests) on the tiny testbed models,
with SpecExit's training-free signal (``draft-confidence``, method ``confidence``) and a D-Cut cost
table profiled at launch into a fresh cache directory (batch sizes 1, 8, 64).

* every bad ``custom_params`` of ``reliability_cases.BAD_CUSTOM_PARAMS`` gets HTTP 400 naming the
  key, through ``/generate`` and through the OpenAI chat API, and the server keeps serving;
* a 20-second soak (CI) and a 2-minute soak (slow tier): 64 concurrent HTTP clients sending the
  mixed thinking / non-thinking kinds of ``reliability_soak.KINDS`` while the D-Cut mode is
  switched every 2 s between the pruned tiers, ``auto`` and full verification (on the tiny CPU
  models ``auto`` alone mostly verifies in full); zero errors, zero lost requests, every forced
  exit counted once in ``/server_info``, pruned D-Cut steps recorded, and the KV pool back to
  its state before the soak.

Budget: < 3 min in CI (one server start-up ~60-90 s incl. profiling, 46 rejected requests, a
20-second soak and its drain); slow tier + ~2.5 min.
"""

from __future__ import annotations

import os

import pytest

from reliability_cases import BAD_CUSTOM_PARAMS
from reliability_soak import DCUT_MODE_CYCLE, FORCED_KINDS, KINDS, DCutModeCycler, SoakInputs, run_soak

CLIENTS = 64
QUESTIONS = ["Compute: 7 + 4 - 2", "Compute: 3 * 5 + 1", "Compute: 9 - 6 + 8", "Compute: 2 + 2 * 3"]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    from sglang_ext import demo

    models = demo.DemoModels(tiny_models.target, tiny_models.draft, trained=False)
    root = tmp_path_factory.mktemp("reliability_server")
    extra = ["--dcut-cache-dir", str(root / "dcut"), "--dcut-profile-batch-sizes", "1,8,64",
             "--dcut-profile-steps", "2", "--dcut-profile-warmup", "1", "--log-level", "warning"]
    log = str(root / "server.log")
    try:
        with demo.running_server(models, extra, log_path=log, timeout_s=600) as (url, _proc):
            yield url
    except Exception:
        with open(log) as f:
            print(f.read()[-5000:])
        raise


@pytest.fixture(scope="module")
def inputs(tiny_models):
    import json

    from transformers import AutoTokenizer

    from sglang_ext.testbed.tiny import corpus_prompts

    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    thinking = tok.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}], tokenize=False,
                                       add_generation_prompt=True)
    assert thinking.rstrip().endswith("<think>")
    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = corpus_prompts(vocab, 8, 4, seed=2).tolist()
    return SoakInputs(questions=QUESTIONS, thinking_text=thinking, plain_texts=QUESTIONS, prompt_ids=ids)


def _state(url):
    import requests

    info = requests.get(url + "/server_info", timeout=60).json()
    state = info["internal_states"][0]
    return info, state["specexit"], state["dcut"]


# ----------------------------------------------------------------------------- bad custom_params
@pytest.mark.parametrize("params,field", BAD_CUSTOM_PARAMS, ids=[f"{i}:{f}" for i, (_, f) in
                                                                  enumerate(BAD_CUSTOM_PARAMS)])
def test_bad_custom_params_get_400_on_both_apis(server, params, field):
    import requests

    gen = requests.post(server + "/generate", json={"text": QUESTIONS[0], "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 4, "custom_params": params}}, timeout=120)
    assert gen.status_code == 400, gen.text[:500]
    assert field in gen.text and "invalid SpecExit option" in gen.text, gen.text[:500]
    chat = requests.post(server + "/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": QUESTIONS[1]}], "max_tokens": 4,
        "custom_params": params}, timeout=120)
    assert chat.status_code == 400, chat.text[:500]
    assert field in chat.text and "invalid SpecExit option" in chat.text, chat.text[:500]


def test_server_keeps_serving_after_bad_requests(server):
    import requests

    r = requests.post(server + "/generate", json={"text": QUESTIONS[2], "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True,
        "custom_params": {"specexit_window": 4, "other_feature": "kept as is"}}}, timeout=300)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8, r.text[:500]


# ----------------------------------------------------------------------------- soak
def _soak_and_check(server, inputs, duration_s):
    _, se0, dc0 = _state(server)
    held = lambda p: p["kv_total"] - p["kv_available"] - p["kv_evictable"]  # noqa: E731
    with DCutModeCycler(server, period_s=2.0) as cycler:
        report = run_soak(server, inputs, clients=CLIENTS, duration_s=duration_s)
    summary = report.summary()
    print("soak:", summary, "D-Cut mode switches:", cycler.switches)
    assert cycler.failures == [] and cycler.switches >= len(DCUT_MODE_CYCLE), (cycler.switches, cycler.failures)
    assert report.errors == [], report.errors[:10]
    assert report.lost == 0, report.lost_detail[:10]
    assert report.total_sent == report.total_ok
    assert set(report.ok) == set(KINDS), summary  # every kind completed at least once
    assert report.total_ok >= CLIENTS, summary  # every client got at least one answer
    _, se1, dc1 = _state(server)
    forced = sum(report.ok[k] for k in FORCED_KINDS)
    exits = se1["exits_by_reason"]["max_think_tokens"] - se0["exits_by_reason"]["max_think_tokens"]
    assert exits == forced, (exits, forced)
    m0, m1 = dc0["metrics"], dc1["metrics"]
    print("D-Cut during the soak:", {k: v - m0["tier_histogram"].get(k, 0) for k, v in m1["tier_histogram"].items()},
          "steps", m1["steps"] - m0["steps"], "pruned", m1["pruned_steps"] - m0["pruned_steps"])
    assert m1["steps"] > m0["steps"] and m1["pruned_steps"] > m0["pruned_steps"]  # pruned verify under load
    assert dc1["override_ratio"] is None  # the configured mode is back (live state)
    assert m1["exempt_requests"]["logprobs"] > m0["exempt_requests"]["logprobs"]  # logprob requests kept whole
    pool = dc1["kv_pool"]
    assert pool["running_requests"] == 0 and held(pool) == held(dc0["kv_pool"]), (dc0["kv_pool"], pool)
    assert pool["req_rows_free"] == dc0["kv_pool"]["req_rows_free"]
    return report


def test_profiled_table_is_in_use(server):
    info, _, dcut = _state(server)
    src = info["dcut"]["cost_table_info"]
    assert src["source"] == "profiled", src
    assert info["dcut"]["cost_table"]["batch_sizes"] == [1, 8, 64]


def test_soak_20s_64_clients(server, inputs):
    _soak_and_check(server, inputs, duration_s=20.0)


@pytest.mark.slow
def test_soak_2min_64_clients(server, inputs):
    report = _soak_and_check(server, inputs, duration_s=120.0)
    assert report.total_ok >= 4 * CLIENTS, report.summary()

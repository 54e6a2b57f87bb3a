"""SGLang's own tools against a launched CPU demo server (``sglang_ext.demo.running_server``, EAGLE3 +
SpecExit + ``--dcut auto`` on the committed trained testbed models, ``--enable-metrics``):

* ``python -m sglang.bench_serving --backend sglang --dataset-name random-ids`` run through the CPU
  wrapper (``python -m sglang_ext.cpu_run``) for a few prompts; its printed and saved figures agree;
* Prometheus ``/metrics``: the D-Cut and SpecExit series equal the ``/server_info`` figures after a run
  with early exits and pruned verify steps.

Budget: < 3 min (one server start-up, 8 benchmark prompts, 10 chat requests).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_ext import demo
from sglang_ext.engine.dcut.client import dcut_states, server_info, set_force_ratio

NUM_PROMPTS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = demo.pick_models()
    if not models.trained:
        pytest.skip("needs the committed trained testbed models (SpecExit rows in the draft)")
    log = tmp_path_factory.mktemp("server_tools") / "server.log"
    try:
        with demo.running_server(models, ["--enable-metrics"], log_path=str(log), timeout_s=420) as (url, _):
            yield url
    except Exception:
        if log.exists():
            print(log.read_text()[-5000:])
        raise


def test_bench_serving_random_ids(server, tmp_path):
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang_ext.cpu_run", "sglang.bench_serving", "--backend", "sglang",
           "--base-url", server, "--dataset-name", "random-ids", "--num-prompts", str(NUM_PROMPTS),
           "--random-input-len", "32", "--random-output-len", "32", "--seed", "0", "--output-file", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    printed = dict(re.findall(r"^([A-Za-z][^:\n]*):\s+([0-9.]+)\s*$", res.stdout, flags=re.M))
    row = json.loads(out.read_text().splitlines()[-1])
    assert int(printed["Successful requests"]) == row["completed"] == NUM_PROMPTS
    assert int(printed["Total generated tokens"]) == row["total_output_tokens"] > 0
    assert row["duration"] > 0
    assert row["output_throughput"] == pytest.approx(row["total_output_tokens"] / row["duration"], rel=1e-6)
    assert float(printed["Output token throughput (tok/s)"]) == pytest.approx(row["output_throughput"], abs=0.01)
    # SGLang's avg_spec_accept_length appears in /server_info once its scheduler logged decode stats
    # (every --decode-log-interval batches); when present the draft is accepted (> 1 token per step)
    if row["accept_length"] is not None:
        assert row["accept_length"] > 1.0
        assert float(printed["Accept length"]) == pytest.approx(row["accept_length"], abs=0.01)


def _chat(base: str, question: str) -> dict:
    r = requests.post(base + "/v1/chat/completions", timeout=300,
                      json={"model": "default", "messages": [{"role": "user", "content": question}],
                            "max_tokens": 256, "temperature": 0.0})
    r.raise_for_status()
    return r.json()


def _scrape(base: str) -> dict:
    """``/metrics`` samples of the extension: (name, frozenset of extra labels) -> value, plus the labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(base + "/metrics", timeout=30).text
    out, labels = {}, None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("sglang:dcut_", "sglang:specexit_")) and not s.name.endswith("_created"):
                extra = {k: v for k, v in s.labels.items() if k in ("tier", "reason")}
                out[(s.name, frozenset(extra.items()))] = s.value
                labels = {k: v for k, v in s.labels.items() if k not in ("tier", "reason")}
    return {"samples": out, "labels": labels}


def _value(scraped, name, **extra):
    return scraped["samples"].get((name, frozenset(extra.items())))


def test_prometheus_metrics_match_server_info(server):
    questions = [f"Compute: {a} + {b} - 2" for a, b in ((7, 4), (5, 6), (9, 3), (8, 8), (2, 9), (6, 1))]
    with ThreadPoolExecutor(len(questions)) as pool:
        list(pool.map(lambda q: _chat(server, q), questions))
    assert set_force_ratio(server, 0.5)  # prune for sure: a fixed tier below full verification
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda q: _chat(server, q), questions[:4]))
    finally:
        assert set_force_ratio(server, 0.0)

    deadline = time.time() + 60
    while True:  # the idle scheduler publishes the final figures
        state = server_info(server)["internal_states"][0]
        m = dcut_states(server)[0]["metrics"]
        scraped = _scrape(server)
        if _value(scraped, "sglang:dcut_verify_steps_total") == m["steps"] or time.time() > deadline:
            break
        time.sleep(1.0)
    se = state["specexit"]

    assert scraped["labels"]["model_name"] == state["served_model_name"] and scraped["labels"]["tp_rank"] == "0"
    assert _value(scraped, "sglang:dcut_verify_steps_total") == m["steps"] > 0
    assert _value(scraped, "sglang:dcut_pruned_steps_total") == m["pruned_steps"] > 0
    for key in ("verified", "accepted", "full", "padded"):
        assert _value(scraped, f"sglang:dcut_{key}_tokens_total") == m[f"{key}_tokens"], key
    assert m["tier_histogram"].get("0.5", 0) > 0
    for tier, steps in m["tier_histogram"].items():
        assert _value(scraped, "sglang:dcut_tier_steps_total", tier=tier) == steps, tier
    for reason, count in m["exempt_requests"].items():
        assert _value(scraped, "sglang:dcut_exempt_requests_total", reason=reason) == count, reason
    assert _value(scraped, "sglang:dcut_keep_ratio") == pytest.approx(m["keep_ratio"], rel=1e-9)
    assert m["keep_ratio"] < 1.0
    assert _value(scraped, "sglang:dcut_predicted_step_ms") == pytest.approx(m["predicted_step_ms"], rel=1e-9)
    assert _value(scraped, "sglang:dcut_measured_step_ms") == pytest.approx(m["measured_step_ms"], rel=1e-9)
    tau = dcut_states(server)[0]["calibration"]["tau"]
    assert _value(scraped, "sglang:dcut_calibration_tau") == pytest.approx(tau, rel=1e-9)

    assert se["exits_total"] > 0
    for reason, count in se["exits_by_reason"].items():
        assert _value(scraped, "sglang:specexit_exits_total", reason=reason) == count, reason
    n = se["finished_thinking_requests"]
    assert _value(scraped, "sglang:specexit_finished_thinking_requests_total") == n >= len(questions) + 4
    assert _value(scraped, "sglang:specexit_thinking_tokens_total") == pytest.approx(se["mean_think_tokens"] * n)
    assert _value(scraped, "sglang:specexit_natural_ends_total") == se["natural_ends"]
    assert _value(scraped, "sglang:specexit_skipped_tokens_estimate_total") == pytest.approx(
        se["skipped_tokens_estimate_total"], rel=1e-9)

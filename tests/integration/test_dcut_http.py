"""64 concurrent HTTP clients against a launched CPU server with ``--dcut auto``.

``python -m sglang.launch_server`` (the plugin loaded through its entry point, started by
``sglang_ext.demo.running_server`` with the ``PRESET`` below as its ``--config``) with the tiny
models, EAGLE3 chain 7 steps / 8 draft tokens, ``--max-running-requests 64``, launch-time
profiling at batch sizes 1, 16, 64. Then 64 client threads send greedy ``/generate`` requests
(prompt and output lengths vary) in a loop for 20 s (CI) or 2 minutes (``-m slow``):

* no HTTP error, every request completes with its requested number of tokens;
* ``/server_info`` shows D-Cut steps under ``auto`` (first half) and pruned steps at the fixed tier 0.5
  switched on at runtime (second half: auto may keep full verification on the tiny models' flat cost
  table), and batch sizes above 16 were served;
* when the traffic drains, no request is running and the KV pool holds nothing but the radix
  cache (no leak under concurrency, aborts-free traffic).

Budget: CI < 2.5 min (server start ~60-90 s incl. profiling, 20 s of traffic; the launch-line check < 1 s);
slow < 4.5 min.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import random
import time

import pytest

NUM_CLIENTS = 64

#: The server's settings, as an SGLang ``--config`` preset (``sglang_ext.demo.running_server`` adds the
#: models, host and port). The batch sizes are a YAML list: read through the extension's preset hook.
PRESET = f"""\
device: cpu
dtype: float32
attention-backend: torch_sdpa
sampling-backend: pytorch
cuda-graph-backend-decode: disabled
cuda-graph-backend-prefill: disabled
mem-fraction-static: 0.5
max-running-requests: {NUM_CLIENTS}
max-total-tokens: 40000
chunked-prefill-size: -1
skip-server-warmup: true
random-seed: 0
speculative-algorithm: EAGLE3
speculative-num-steps: 7
speculative-eagle-topk: 1
speculative-num-draft-tokens: 8
dcut: auto
dcut-profile-batch-sizes: [1, 16, 64]
dcut-profile-steps: 2
dcut-profile-warmup: 1
"""
#: KV/req-pool leak checks at idle raise in the scheduler (SGLang's default; set in case the caller's
#: environment turns them off).
SERVER_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    from sglang_ext import demo

    tmp = tmp_path_factory.mktemp("dcut-http")
    preset = tmp / "dcut_http.yaml"
    preset.write_text(PRESET)
    models = demo.DemoModels(tiny_models.target, tiny_models.draft, trained=False)
    log = tmp / "server.log"
    try:
        with demo.running_server(models, ["--dcut-cache-dir", str(tmp / "cache")], config=str(preset),
                                 log_path=str(log), timeout_s=600, env=SERVER_ENV) as (base, proc):
            yield base, proc, log
    except Exception:
        if log.exists():
            print(log.read_text()[-5000:])
        raise


def test_running_server_passes_the_preset_and_environment(monkeypatch, tmp_path):
    """The fixture's launch line and environment, without starting a server."""
    import subprocess

    from sglang_ext import demo

    seen = {}

    class _Exited:
        pid = -1

        def poll(self):
            return 0

    def fake_popen(cmd, env=None, **kwargs):
        seen.update(cmd=cmd, env=env)
        return _Exited()

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    monkeypatch.setattr(demo, "wait_healthy", lambda *a, **k: None)
    models = demo.DemoModels("target-dir", "draft-dir", trained=True)
    with demo.running_server(models, ["--dcut-cache-dir", "c"], config="p.yaml", env=SERVER_ENV) as (base, _):
        assert base.startswith("http://127.0.0.1:")
    cmd = seen["cmd"]
    assert cmd[cmd.index("--config") + 1] == "p.yaml" and cmd[cmd.index("--model-path") + 1] == "target-dir"
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == "draft-dir" and cmd[-2:] == ["--dcut-cache-dir", "c"]
    assert seen["env"]["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    assert seen["env"]["SGLANG_USE_CPU_ENGINE"] == "1"  # still the CPU testbed environment


def _soak(base: str, vocab: int, seconds: float) -> dict:
    import requests

    deadline = time.time() + seconds

    def client(i: int) -> dict:
        rng = random.Random(i)
        sess = requests.Session()
        done = errors = 0
        bad = []
        while time.time() < deadline:
            n_in, n_out = rng.randint(3, 24), rng.randint(4, 48)
            body = {"input_ids": [rng.randrange(1, vocab - 1) for _ in range(n_in)],
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": n_out, "ignore_eos": True}}
            try:
                r = sess.post(base + "/generate", json=body, timeout=300)
                out = r.json() if r.status_code == 200 else None
            except Exception as e:  # any transport error counts
                errors += 1
                bad.append(repr(e))
                continue
            if out is None or len(out.get("output_ids", [])) != n_out:
                errors += 1
                bad.append(f"status {r.status_code}: {str(out)[:200]}")
            else:
                done += 1
        return {"done": done, "errors": errors, "bad": bad[:3]}

    with cf.ThreadPoolExecutor(NUM_CLIENTS) as ex:
        results = list(ex.map(client, range(NUM_CLIENTS)))
    return {"done": sum(r["done"] for r in results), "errors": sum(r["errors"] for r in results),
            "bad": [b for r in results for b in r["bad"]][:5], "idle_clients": sum(r["done"] == 0 for r in results)}


def _check(server, tiny_models, seconds):
    import json

    from sglang_ext.engine.dcut.client import dcut_info, dcut_states, set_force_ratio

    base, proc, log = server
    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    before = dcut_states(base)[0]
    # First half under --dcut auto. On the tiny models the profiled cost is flat across tiers, so auto
    # may rightly verify in full throughout; the second half runs at the fixed tier 0.5, so pruned
    # steps are served under the same concurrency whatever the launch-time table says.
    res = _soak(base, vocab, seconds / 2)
    mid = dcut_states(base)[0]["metrics"]
    assert mid["steps"] > before["metrics"]["steps"]
    assert set_force_ratio(base, 0.5)
    try:
        res2 = _soak(base, vocab, seconds / 2)
    finally:
        assert set_force_ratio(base, 0)
    for r in (res, res2):
        assert r["errors"] == 0, r
        assert r["done"] >= NUM_CLIENTS and r["idle_clients"] == 0, r
    assert proc.poll() is None
    for _ in range(100):
        st = dcut_states(base)[0]
        if st["kv_pool"]["running_requests"] == 0:
            break
        time.sleep(0.2)
    m, pool = st["metrics"], st["kv_pool"]
    assert pool["running_requests"] == 0
    held_before = before["kv_pool"]["kv_total"] - before["kv_pool"]["kv_available"] - before["kv_pool"]["kv_evictable"]
    assert pool["kv_total"] - pool["kv_available"] - pool["kv_evictable"] == held_before
    assert m["steps"] > before["metrics"]["steps"] and m["pruned_steps"] > before["metrics"]["pruned_steps"]
    assert dcut_info(base)["cost_table"]["batch_sizes"] == [1, 16, 64]


def test_64_clients_20s(server, tiny_models):
    _check(server, tiny_models, 20.0)


@pytest.mark.slow
def test_64_clients_2min(server, tiny_models):
    _check(server, tiny_models, 120.0)

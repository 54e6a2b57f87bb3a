"""``bench/dcut_throughput.py --url``: the request/summary logic against an in-process stub server.

A real CPU demo server takes 60-90 s to start (see ``test_dcut_http.py``), over this test's budget, so
a ``http.server`` stub in a thread answers ``/server_info``, ``/set_internal_state`` and ``/generate``
the way SGLang does (canned outputs; the D-Cut metrics advance per request; each request sleeps a time
that depends on the D-Cut ratio in force: full verification 2x slower than ``auto``). Checks: ``bs``
requests are in flight together, every mode is switched through ``dcut_force_ratio`` and the configured
mode restored, the held-out prompts go out as text, greedy/ignore_eos/max_new_tokens are sent, the
printed table shows ``auto`` faster than ``full``, the keep ratio comes from the metrics deltas, the
PNG is written; a server without D-Cut is measured as is (no ``/set_internal_state``).
``--refill K``: each run sends ``K x bs`` requests with at most ``bs`` in flight, over HTTP and through
an engine's ``async_generate`` (a fake engine in-process: outputs in prompt order, a new request
submitted only when one finished).

Budget: < 20 s CI (about 100 stub requests of 0.05-0.1 s).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import bench_script
import http_stub
from http_stub import JsonHandler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: seconds per /generate request by the forced ratio (0 = the configured auto mode)
SLEEP = {0.0: 0.05, 0.25: 0.06, 0.5: 0.06, 0.75: 0.08, 1.0: 0.1}
KEEP = {0.0: 8, 0.25: 4, 0.5: 8, 0.75: 12, 1.0: 16}  # verified rows of 16 per request-step
N = 16


class Stub:
    def __init__(self, with_dcut: bool):
        self.with_dcut = with_dcut
        self.ratio = 0.0
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        self.ratios_set = []
        self.generate_bodies = []
        self.metrics = {"steps": 0, "pruned_steps": 0, "verified_tokens": 0, "full_tokens": 0,
                        "accepted_tokens": 0, "tier_histogram": {}}

    def server_info(self):
        info = {"model_path": "stub-model", "speculative_algorithm": "EAGLE3" if self.with_dcut else None}
        if self.with_dcut:
            with self.lock:
                m = json.loads(json.dumps(self.metrics))
            info["dcut"] = {"mode": "auto", "cost_table": None, "cost_table_info": {"source": "stub"}}
            info["internal_states"] = [{"dcut": {"metrics": m}}]
        return info

    def generate(self, body):
        with self.lock:
            self.generate_bodies.append(body)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            r = self.ratio
        time.sleep(SLEEP[r])
        n = body["sampling_params"]["max_new_tokens"]
        with self.lock:
            self.inflight -= 1
            m = self.metrics
            m["steps"] += 1
            m["full_tokens"] += N
            m["verified_tokens"] += KEEP[r]
            m["pruned_steps"] += int(KEEP[r] < N)
            m["accepted_tokens"] += 5
            m["tier_histogram"][str(r)] = m["tier_histogram"].get(str(r), 0) + 1
        return {"text": "x" * n, "output_ids": list(range(n)), "meta_info": {"completion_tokens": n}}


def _serve(stub):
    class H(JsonHandler):
        def do_GET(self):
            if self.path == "/server_info":
                return self.send_json(200, stub.server_info())
            self.send_json(404, {"error": "not found"})

        def do_POST(self):
            body = self.read_json()
            if self.path == "/generate":
                return self.send_json(200, stub.generate(body))
            if self.path == "/set_internal_state" and stub.with_dcut:
                with stub.lock:
                    stub.ratio = float(body["server_args"]["dcut_force_ratio"])
                    stub.ratios_set.append(stub.ratio)
                return self.send_json(200, {"updated": True})
            self.send_json(404, {"error": "not found"})

    return http_stub.start(H)


def _bench():
    return bench_script.load("dcut_throughput")


def _main(stub, tmp_path, capsys, extra=()):
    srv, url = _serve(stub)
    png = tmp_path / "url.png"
    try:
        _bench().main(["--url", url, "--batch-sizes", "1,4", "--max-new-tokens", "16", "--repeats", "2",
                       "--out", str(png), "--json", str(tmp_path / "url.json"), *extra])
    finally:
        srv.shutdown()
        srv.server_close()
    with open(png, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    return capsys.readouterr().out, json.load(open(tmp_path / "url.json"))


def test_url_mode_switches_dcut_modes_and_reports_ratios(tmp_path, capsys):
    stub = Stub(with_dcut=True)
    out, res = _main(stub, tmp_path, capsys)
    assert stub.max_inflight == 4  # bs=4: four concurrent requests
    # 5 modes x (1 warm-up + 2 repeats) x 2 batch sizes, then back to the configured mode
    assert sorted(set(stub.ratios_set)) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len(stub.ratios_set) == 5 * 3 * 2 + 1 and stub.ratios_set[-1] == 0.0
    texts = [b["text"] for b in stub.generate_bodies]
    assert all(t.startswith("<|im_start|>user\n") and t.endswith("<think>\n") for t in texts)
    assert len(set(texts)) == 4
    sp = stub.generate_bodies[-1]["sampling_params"]
    assert sp == {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
    assert sum(len(b["text"]) > 0 for b in stub.generate_bodies) == 5 * 3 * (1 + 4)
    # the stub makes full verification 2x slower than auto: the printed ratio must show it
    m = re.search(r"^auto/full\s+(\S+)\s+(\S+)$", out, re.M)
    assert m and all(float(x) > 1.3 for x in m.groups()), out
    # keep ratio of auto from the metrics deltas: 8 of 16 rows per request-step
    assert re.search(r"bs=\s+4: keep 0\.5 ", out), out
    assert res["lossless_vs_full"] == {m: True for m in ("full", "r0.25", "r0.5", "r0.75", "auto")}
    assert res["dcut"]["auto"]["4"]["steps"] == 2 * 4 and res["dcut"]["full"]["1"]["tier_histogram"] == {"1.0": 2}


def test_url_mode_without_dcut_measures_the_server_as_is(tmp_path, capsys):
    stub = Stub(with_dcut=False)
    out, res = _main(stub, tmp_path, capsys)
    assert stub.ratios_set == [] and "D-Cut off" in out
    assert list(res["tok_s"]) == ["server"] and sorted(res["tok_s"]["server"]) == ["1", "4"]
    assert re.search(r"^server\s+\d+\.\d\s+\d+\.\d$", out, re.M), out
    assert len(stub.generate_bodies) == 3 * (1 + 4)  # (1 warm-up + 2 repeats) x (bs 1 + bs 4)
    assert "ratios" not in out


def test_url_refill_keeps_bs_requests_in_flight(tmp_path, capsys):
    stub = Stub(with_dcut=False)
    out, res = _main(stub, tmp_path, capsys, extra=("--refill", "3"))
    assert stub.max_inflight == 4  # 12 requests per bs-4 run, never more than 4 at once
    # bs 1: warm-up 1 + 2 repeats x 3; bs 4: warm-up 4 + 2 repeats x 12
    assert len(stub.generate_bodies) == (1 + 2 * 3) + (4 + 2 * 12)
    assert res["settings"]["refill"] == 3 and "refilled batches (3 x bs requests, bs in flight)" in out
    assert len(set(b["text"] for b in stub.generate_bodies[-12:])) > 4  # more prompts than the batch size


class _FakeAsyncEngine:
    """``loop`` and ``async_generate`` as ``sglang.Engine`` has them; request ``i`` takes ``1 + i % 3``
    ticks of 10 ms, so requests finish out of order."""

    def __init__(self):
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.inflight = 0
        self.max_inflight = 0
        self.finished = 0
        self.started = []  # (prompt id, in flight, finished) at each submission, in order

    async def async_generate(self, input_ids, sampling_params):
        import asyncio

        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self.started.append((input_ids[0], self.inflight, self.finished))
        await asyncio.sleep(0.01 * (1 + input_ids[0] % 3))
        self.inflight -= 1
        self.finished += 1
        n = sampling_params["max_new_tokens"]
        return {"output_ids": [input_ids[0]] * n, "meta_info": {"completion_tokens": n}}


def test_engine_refill_submits_as_requests_finish():
    bench = _bench()
    eng = _FakeAsyncEngine()
    try:
        prompts = [[i, 7] for i in range(10)]
        tps, ids, verify_ct, tokens = bench._run(eng, prompts, 5, concurrency=3)
    finally:
        eng.loop.close()
    assert ids == [[i] * 5 for i in range(10)]  # prompt order, although they finished out of order
    assert tokens == 50 and verify_ct == 0 and tps > 0
    assert eng.max_inflight == 3
    # the first three start together; the j-th later one only after j + 1 finished, refilling to 3
    assert [(c, f) for _, c, f in eng.started[:3]] == [(1, 0), (2, 0), (3, 0)]
    assert all(f >= j - 2 for j, (_, _, f) in enumerate(eng.started) if j >= 3), eng.started
    assert sum(c == 3 for _, c, _ in eng.started[3:]) >= 3, eng.started


def test_refill_below_one_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        _bench()._parse_args(["--refill", "0"])
    assert "--refill 0: must be at least 1" in capsys.readouterr().err


def test_cost_table_line_warns_only_without_draft_off_costs(capsys):
    """A table with draft-off costs read from a file gets a note (costs of another host), not the
    warning that auto cannot switch drafting off, which is kept for a table without them."""
    say = _bench()._say_table
    v2 = {"version": 2, "batch_sizes": [1, 4], "off_ms": [197.0, 447.6]}
    say({"cost_table_info": {"source": "profiled"}, "cost_table": v2})
    out = capsys.readouterr().out
    assert "bs 1: 197.0 ms, bs 4: 447.6 ms" in out and "WARNING" not in out and "note:" not in out
    say({"cost_table_info": {"source": "file"}, "cost_table": v2})
    out = capsys.readouterr().out
    assert "WARNING" not in out and "note: the cost table was not profiled by this run (source: file)" in out
    say({"cost_table_info": {"source": "file"}, "cost_table": {"version": 1, "batch_sizes": [1]}})
    out = capsys.readouterr().out
    assert "none: auto never switches drafting off" in out and "WARNING: the draft-off comparison needs" in out

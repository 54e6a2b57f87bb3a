"""bench/specexit_eval.py ``--url``: the same variants sent to a running server over HTTP.

* fast: an in-process stub HTTP server (``http.server`` in a thread) with canned ``/generate``
  answers (long thinking when the request switches SpecExit off, a short exited one otherwise),
  ``/server_info`` and ``/flush_cache``: the script's table, JSON and PNGs, every request's
  ``custom_params`` as the variant asks (baseline off, reference none, tuned = the preset, the
  budget peer SpecExit's guard as a plain budget, the SGLang budget peer ``max_thinking_tokens``
  at the top level of the body with SpecExit off), the numbers recomputed here from the canned answers; a server without a SpecExit section in
  ``/server_info`` ends the script with exit code 2 and a message naming ``--url``.
* slow tier (the server part alone took 97 s at load average 3-7 on the shared 2-core machine,
  over the 90 s CI allowance): the CPU demo server (``sglang_ext.demo.running_server``, the committed trained testbed
  models, ``configs/cpu_demo.yaml``) and the script with ``--url --n 4 --repeats 1``; the summary
  is checked against values recomputed from the raw per-request outcomes of its JSON, the
  baseline outcomes against ``/generate`` requests this test sends itself, and every variant's
  per-request outcomes (tokens, think tokens, answer, exit) against an in-process run of the
  script on the same problems (the server runs with ``--dcut off`` like the in-process engine).

Budget: CI (the stub tests) < 15 s (one in-process run of ``main`` against the stub, no model);
slow (the demo-server test) ~2 min (server start, warm-up, 3 x 4 requests, 4 more of this test,
then one in-process run of the script; measured 108 s at load average 4-5) on a shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

import bench_script
import http_stub
from http_stub import JsonHandler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "specexit_eval.py")
PRESET = os.path.join(ROOT, "configs", "specexit_testbed_tuned.yaml")
MODELS = os.path.join(ROOT, "sglang_ext", "testbed", "models")
TARGET = os.path.join(MODELS, "target")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 4

needs_models = pytest.mark.skipif(not os.path.isfile(os.path.join(TARGET, "config.json")),
                                  reason="trained testbed models not found")


def _load_script():
    return bench_script.load("specexit_eval")


def _preset_request_options():
    with open(PRESET) as f:
        raw = yaml.safe_load(f)
    server_only = {"specexit", "specexit-stop-think-token", "specexit-step-split-tokens", "specexit-signal-source"}
    return {k.replace("-", "_"): v for k, v in raw.items() if k.startswith("specexit-") and k not in server_only}


# ---------------------------------------------------------------------------------------------- stub server

#: Canned completions: (text with {a} for the answer, completion_tokens, exited). Token counts are what the
#: stub reports; the think tokens are counted by the script in the ``output_ids`` the stub sends (one id per
#: word here, ``</think>`` is id 99).
LONG = ("Step 1: a. So the result is {a}.\n\nCheck again. </think> The answer is {a}.", 40, False)
SHORT = ("Step 1: a. </think> The answer is {a}.", 12, True)
WRONG = ("Step </think> The answer is {a}1.", 7, True)
THINK_WORDS = {LONG: 9, SHORT: 3, WRONG: 1}


class _Stub:
    def __init__(self, with_specexit: bool = True, problems=()):
        self.with_specexit = with_specexit
        self.answers = {p["question"]: p["answer"] for p in problems}
        self.requests = []  # every /generate body
        self.flushes = 0
        self.server, self.url = None, None

    def canned(self, body):
        """The canned completion of a request: LONG with SpecExit off, WRONG for the tuned preset's
        requests (they carry options) of the first problem, SHORT otherwise."""
        custom = body["sampling_params"].get("custom_params") or {}
        if custom.get("specexit_enable") is False:
            return LONG
        if custom and self.answers and next(iter(self.answers)) in "".join(map(chr, body["input_ids"])):
            return WRONG
        return SHORT

    def answer(self, body):
        prompt = "".join(map(chr, body["input_ids"]))
        return next(a for q, a in self.answers.items() if q in prompt)

    def _handler(stub):  # noqa: N805 - closure over the stub
        class Handler(JsonHandler):

            def do_GET(self):
                if self.path.startswith("/server_info"):
                    state = {"specexit": {"enabled": True, "requests_exited": 0}} if stub.with_specexit else {}
                    self.send_json(200, {"model_path": TARGET, "tokenizer_path": TARGET, "internal_states": [state]})
                else:
                    self.send_json(404, {"error": self.path})

            def do_POST(self):
                body = self.read_json()
                if self.path.startswith("/flush_cache"):
                    stub.flushes += 1
                    self.send_json(200, b"Cache flushed.")
                    return
                if not self.path.startswith("/generate"):
                    self.send_json(404, {"error": self.path})
                    return
                stub.requests.append(body)
                text, n, exited = stub.canned(body)
                text = text.format(a=stub.answer(body))
                words = text.split(" ")
                ids = [99 if w == "</think>" else 1 for w in words]
                self.send_json(200, {"text": text.replace(" </think> ", "</think>"), "output_ids": ids,
                                 "meta_info": {"completion_tokens": n, "specexit_exited": exited,
                                               "specexit_exit_reason": "signals" if exited else None}})

        return Handler

    def __enter__(self):
        self.server, self.url = http_stub.start(self._handler())
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _Tok:
    """Stand-in tokenizer: ``</think>`` is id 99; prompts are encoded one id per character."""

    def convert_tokens_to_ids(self, token):
        return 99

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_url_path_against_a_stub_server(tmp_path, monkeypatch):
    mod = _load_script()
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda path: _Tok()))
    out, png = tmp_path / "url.json", tmp_path / "url.png"
    with _Stub(problems=mod.held_out_problems(N, 2026)) as stub:
        summary = mod.main(["--url", stub.url, "--n", str(N), "--repeats", "1", "--concurrency", "3",
                            "--budgets", "32", "--sglang-budgets", "32", "--out", str(out), "--png", str(png)])
    assert png.read_bytes()[:8] == PNG_MAGIC
    record = json.loads(out.read_text())
    assert record["url"] == stub.url and summary["url"] == stub.url
    # warm-up (min(n, concurrency) requests), then 3 variants x N, each after a flush, then the budget 32
    # peers (SpecExit's guard as a plain budget, SGLang's max_thinking_tokens), N each, each after a flush
    assert len(stub.requests) == 3 + 5 * N and stub.flushes == 5
    passes = stub.requests[3:3 + 3 * N]
    own, sgl = stub.requests[3 + 3 * N:3 + 4 * N], stub.requests[3 + 4 * N:]
    assert [r["sampling_params"]["custom_params"] for r in own] == [
        {"specexit_method": "confidence", "specexit_confidence_threshold": 1.0, "specexit_max_think_tokens": 32,
         "specexit_max_think_grace": 0}] * N
    assert all("max_thinking_tokens" not in r for r in own + passes)
    assert [(r["max_thinking_tokens"], r["sampling_params"]["custom_params"]) for r in sgl] == [
        (32, {"specexit_enable": False})] * N
    customs = [r["sampling_params"].get("custom_params") for r in passes]
    assert customs[:N] == [{"specexit_enable": False}] * N
    assert customs[N:2 * N] == [None] * N
    assert customs[2 * N:] == [_preset_request_options()] * N
    assert all(r["sampling_params"]["temperature"] == 0.0 and r["sampling_params"]["max_new_tokens"] == 512
               for r in passes)
    # the numbers, from the canned answers
    expected = {}
    for name, bodies in (("baseline", passes[:N]), ("reference", passes[N:2 * N]), ("tuned", passes[2 * N:])):
        canned = [stub.canned(b) for b in bodies]
        expected[name] = (sum(c[1] for c in canned) / N, sum(c is not WRONG for c in canned) / N,
                          sum(c[2] for c in canned) / N, sum(THINK_WORDS[c] for c in canned) / N)
        got = record[name]
        assert (got["mean_output_tokens"], got["accuracy"], got["exited_rate"],
                got["mean_think_tokens"]) == pytest.approx(expected[name])
    assert record["baseline"]["accuracy"] == 1.0 and record["reference"]["exited_rate"] == 1.0
    assert sum(stub.canned(b) is WRONG for b in passes[2 * N:]) == 1, "the stub should make the tuned variant err"
    assert record["tuned"]["tokens_ratio"] == pytest.approx(expected["tuned"][0] / expected["baseline"][0])
    assert record["tuned"]["accuracy_drop_points"] == pytest.approx(
        100 * (expected["baseline"][1] - expected["tuned"][1]))
    assert record["server_info"] == {"enabled": True, "requests_exited": 0}
    for kind, bodies in (("budget", own), ("sglang_budget", sgl)):
        canned = [stub.canned(b) for b in bodies]
        entry = record["budgets"][kind]
        assert entry["status"] == "measured" and [r["budget"] for r in entry["rows"]] == [32]
        row = entry["rows"][0]
        assert (row["mean_output_tokens"], row["accuracy"], row["mean_think_tokens"]) == pytest.approx(
            (sum(c[1] for c in canned) / N, sum(c is not WRONG for c in canned) / N,
             sum(THINK_WORDS[c] for c in canned) / N))
    assert (tmp_path / "url_curves.png").read_bytes()[:8] == PNG_MAGIC
    # the baseline's think span has the answer sentence; the exited ones' do not
    assert all(o["oracle_think_tokens"] is not None for o in record["outcomes"]["baseline"])
    assert all(o["oracle_think_tokens"] is None for o in record["outcomes"]["reference"])
    assert record["reference"]["before_answer_rate"] == 1.0  # 3 think tokens < the baseline's answer paragraph


def test_url_without_specexit_exits_2(tmp_path, capsys):
    mod = _load_script()
    with _Stub(with_specexit=False) as stub:
        with pytest.raises(SystemExit) as err:
            mod.main(["--url", stub.url, "--n", "1", "--out", str(tmp_path / "x.json"), "--png", ""])
        assert stub.requests == []
    assert err.value.code == 2
    msg = capsys.readouterr().err
    assert "--url" in msg and "no SpecExit" in msg
    assert not (tmp_path / "x.json").exists()


# ------------------------------------------------------------------------------------------- demo server

@pytest.mark.slow
@needs_models
def test_url_path_against_the_demo_server(tmp_path):
    import requests

    from sglang_ext import demo
    from sglang_ext.testbed import task
    from transformers import AutoTokenizer

    models = demo.pick_models()
    assert models.trained
    out, png = tmp_path / "url.json", tmp_path / "url.png"
    log = tmp_path / "server.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    try:
        # D-Cut off: the in-process run below has none, and D-Cut changes at which decode steps SpecExit
        # reads its signals (it is lossless for the baseline, not step-for-step for an exiting request)
        with demo.running_server(models, ["--dcut", "off"], log_path=str(log), timeout_s=600) as (base, _proc):
            res = subprocess.run([sys.executable, SCRIPT, "--url", base, "--n", str(N), "--repeats", "1",
                                  "--out", str(out), "--png", str(png)], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=600)
            assert res.returncode == 0, res.stderr[-4000:]
            record = json.loads(out.read_text())
            # this test's own baseline requests (SpecExit off, greedy) for the same problems
            tok = AutoTokenizer.from_pretrained(models.target)
            raw = []
            for o in record["outcomes"]["baseline"]:
                problem = next(p for p in _problems(record) if p["id"] == o["id"])
                ids = tok.encode(task.prompt_text(problem["question"], True), add_special_tokens=False)
                body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 512,
                                                               "custom_params": {"specexit_enable": False}}}
                raw.append(requests.post(base + "/generate", json=body, timeout=300).json())
    except Exception:
        if log.exists():
            print(log.read_text()[-5000:])
        raise
    lines = res.stdout.splitlines()
    for name in ("baseline", "reference", "tuned"):
        assert any(line.startswith(name + " ") for line in lines), res.stdout
    assert any(line.startswith("tuned preset") and "acceptance" in line for line in lines)
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert record["url"] == base and isinstance(record["server_info"], dict)

    outcomes = record["outcomes"]
    base_runs = outcomes["baseline"]
    assert len({o["id"] for o in base_runs}) == N
    for o, r in zip(base_runs, raw):
        assert o["output_tokens"] == r["meta_info"]["completion_tokens"]
        assert o["predicted"] == task.parse_answer(r["text"]) and not o["exited"]
    assert all(o["correct"] for o in base_runs), "the trained target solves these held-out problems"
    for name in ("baseline", "reference", "tuned"):
        runs = outcomes[name]
        assert [o["id"] for o in runs] == [o["id"] for o in base_runs]
        s = record[name]
        assert s["mean_output_tokens"] == pytest.approx(sum(o["output_tokens"] for o in runs) / N)
        assert s["mean_think_tokens"] == pytest.approx(sum(o["think_tokens"] for o in runs) / N)
        assert s["accuracy"] == pytest.approx(sum(o["correct"] for o in runs) / N)
        assert s["exited_rate"] == pytest.approx(sum(o["exited"] for o in runs) / N)
        if name != "baseline":
            assert any(o["exited"] for o in runs)
            for o, b in zip(runs, base_runs):
                if o["exited"]:
                    assert o["output_tokens"] < b["output_tokens"]
                else:
                    assert o["output_tokens"] == b["output_tokens"]
            ratio = sum(o["output_tokens"] for o in runs) / sum(o["output_tokens"] for o in base_runs)
            assert s["tokens_ratio"] == pytest.approx(ratio)

    # the in-process path on the same problems (server stopped): the same per-request outcomes
    inproc_out = tmp_path / "inproc.json"
    res2 = subprocess.run([sys.executable, SCRIPT, "--n", str(N), "--repeats", "1", "--out", str(inproc_out),
                           "--png", ""], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res2.returncode == 0, res2.stderr[-4000:]
    inproc = json.loads(inproc_out.read_text())
    keys = ("id", "predicted", "correct", "output_tokens", "think_tokens", "exited", "exit_reason",
            "oracle_think_tokens")
    for name in ("baseline", "reference", "tuned"):
        got = [{k: o[k] for k in keys} for o in outcomes[name]]
        want = [{k: o[k] for k in keys} for o in inproc["outcomes"][name]]
        assert got == want, name


def _problems(record):
    mod = _load_script()
    return mod.held_out_problems(record["n"], record["seed"])

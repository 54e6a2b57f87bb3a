"""SpecExit checks that need their own engine or an HTTP server (slow tier, ``-m slow``).

* ``--specexit-signal-source draft-confidence`` with the stock tiny EAGLE3 draft (no signal rows):
  exits happen, with the prefix property;
* ``head`` with a draft that has no signal rows is a launch error naming the flag;
* ``python -m sglang.launch_server ... --reasoning-parser qwen3-thinking --specexit``: a bad
  ``custom_params`` gets HTTP 400 naming the field on ``/generate`` and ``/v1/chat/completions``
  while other requests are served; a forced exit (``specexit_max_think_tokens``) is split by the
  reasoning parser at the forced ``</think>`` exactly as the parser splits the raw text;
  ``/server_info`` counts the exits;
* with D-Cut at a fixed ratio: SpecExit-off outputs and forced exits are unchanged (lossless pruning),
  signal exits keep the prefix property.

Budget: < 9 min (five start-ups of ~30-60 s each on the shared 2-core machine).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from engine_utils import make_engine
from test_specexit_engine import GREEDY, MAX_NEW, NUM_PROMPTS, OFF, STOP, THINK_OPEN, _check_prefix, \
    choose_boundaries

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts(tiny_models):
    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, NUM_PROMPTS, 4, seed=0).tolist()


def test_draft_confidence_source_exits_with_the_stock_draft(tiny_models, prompts):
    boundary, ids, _ = choose_boundaries(tiny_models.target, [prompts])
    eng = make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=tiny_models.draft, speculative_num_steps=3,
                      speculative_eagle_topk=1, speculative_num_draft_tokens=4, specexit=True,
                      specexit_method="confidence", specexit_signal_source="draft-confidence",
                      specexit_confidence_threshold=0.5, specexit_ewma_alpha=0.5,
                      specexit_step_split_tokens=json.dumps(boundary))
    try:
        sp = [dict(GREEDY, custom_params=p) for p in [None] * len(prompts) + [OFF] * len(prompts)]
        outs = eng.generate(input_ids=prompts + prompts, sampling_params=sp, require_reasoning=True)
        info = eng.get_server_info()["internal_states"][0]["specexit"]
    finally:
        eng.shutdown()
    exits = [_check_prefix(o, b, ids) for o, b in zip(outs[: len(prompts)], outs[len(prompts):])]
    assert sum(k is not None for k in exits) >= 4, exits
    assert info["signal_source"] == "draft-confidence" and info["exits_total"] == sum(k is not None for k in exits)


def _server_cmd(target, draft, port, *extra):
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", target,
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
            "--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_sdpa",
            "--sampling-backend", "pytorch", "--disable-cuda-graph", "--mem-fraction-static", "0.5",
            "--max-total-tokens", "4096", "--chunked-prefill-size", "-1", "--skip-server-warmup",
            "--host", "127.0.0.1", "--port", str(port), *extra]


def test_head_source_without_signal_rows_is_a_launch_error(tiny_models):
    # in a subprocess: a failing scheduler makes its launcher kill its own process tree
    cmd = _server_cmd(tiny_models.target, tiny_models.draft, _free_port(), "--specexit")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, start_new_session=True)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "--specexit-signal-source head" in out and "no SpecExit signal rows" in out, out[-3000:]


# ----------------------------------------------------------------------------- HTTP server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    from sglang_ext.engine.specexit.checkpoint import add_signal_rows

    draft = add_signal_rows(tiny_models.draft, str(tmp_path_factory.mktemp("http_draft")), torch.zeros(3, 3 * 64))
    port = _free_port()
    log = tmp_path_factory.mktemp("http_log") / "server.log"
    cmd = _server_cmd(tiny_models.target, draft, port, "--reasoning-parser", "qwen3-thinking", "--specexit")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    import requests

    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, open(log).read()[-4000:]
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


FORCED = {"specexit_max_think_tokens": 8, "specexit_max_think_grace": 0, "specexit_confidence_threshold": 1.0}
MESSAGES = [{"role": "user", "content": "Compute: 7 + 4 - 2"}]


def test_http_bad_custom_params_get_400_and_others_are_served(server):
    import requests

    bad = requests.post(server + "/generate", json={"text": "Compute: 1 + 2", "sampling_params": dict(
        GREEDY, custom_params={"specexit_window": "ten"})}, timeout=120)
    assert bad.status_code == 400 and "specexit_window" in bad.text
    bad_chat = requests.post(server + "/v1/chat/completions", json={
        "model": "default", "messages": MESSAGES, "max_tokens": 16, "custom_params": {"specexit_smoothing": "median"}},
        timeout=120)
    assert bad_chat.status_code == 400 and "specexit_smoothing" in bad_chat.text
    good = requests.post(server + "/generate", json={"text": "Compute: 1 + 2", "sampling_params": GREEDY},
                         timeout=300)
    assert good.status_code == 200 and good.json()["meta_info"]["completion_tokens"] == MAX_NEW


def test_http_forced_exit_is_split_by_the_reasoning_parser(server, tiny_models):
    import requests
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.rstrip().endswith("<think>")  # the template opens the think block
    raw = requests.post(server + "/generate", json={
        "text": prompt, "sampling_params": dict(GREEDY, custom_params=FORCED)}, timeout=300).json()
    meta = raw["meta_info"]
    assert meta["specexit_exited"] is True and meta["specexit_exit_reason"] == "max_think_tokens"
    assert meta["specexit_think_tokens"] == 8 and "</think>" in raw["text"]
    chat = requests.post(server + "/v1/chat/completions", json={
        "model": "default", "messages": MESSAGES, "max_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True,
        "custom_params": FORCED}, timeout=300).json()
    message = chat["choices"][0]["message"]
    reasoning, content = ReasoningParser("qwen3-thinking", stream_reasoning=False).parse_non_stream(raw["text"])
    assert message["reasoning_content"] == reasoning and message["content"] == content
    assert "</think>" not in (message["reasoning_content"] or "") + (message["content"] or "")
    # streaming: every chunk carries the fields, the last one says the request exited
    chunks = []
    with requests.post(server + "/generate", json={"text": prompt, "stream": True, "sampling_params": dict(
            GREEDY, custom_params=FORCED)}, stream=True, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith(b"data:") and line != b"data: [DONE]":
                chunks.append(json.loads(line[5:]))
    assert len(chunks) > 2 and all("specexit_exited" in c["meta_info"] for c in chunks)
    assert chunks[0]["meta_info"]["specexit_exited"] is False and chunks[-1]["meta_info"]["specexit_exited"] is True
    assert chunks[-1]["meta_info"]["specexit_think_tokens"] == 8
    info = requests.get(server + "/server_info", timeout=60).json()["internal_states"][0]["specexit"]
    assert info["exits_by_reason"]["max_think_tokens"] >= 3


def test_specexit_with_dcut(tiny_models, prompts, tmp_path_factory):
    """D-Cut only prunes what the target verifies (lossless), so with a fixed ratio: SpecExit-off outputs and
    forced exits at a fixed think length are identical to the runs without D-Cut, and signal exits keep the
    prefix property (their position may move: per-step signal means depend on how many drafts each step
    accepted)."""
    from sglang_ext.engine.specexit.checkpoint import add_signal_rows
    from test_specexit_engine import SERVER_FLAGS, random_signal_rows

    boundary, ids, feats = choose_boundaries(tiny_models.target, [prompts])
    draft = add_signal_rows(tiny_models.draft, str(tmp_path_factory.mktemp("dcut_draft")), random_signal_rows(feats))
    forced = {"specexit_max_think_tokens": 10, "specexit_max_think_grace": 0, "specexit_confidence_threshold": 1.0}
    n = len(prompts)
    params = [dict(GREEDY, custom_params=p) for p in [forced] * n + [None] * n + [OFF] * n]
    outs = {}
    for dcut in ("off", "0.5"):
        eng = make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                          speculative_draft_model_path=draft, speculative_num_steps=3, speculative_eagle_topk=1,
                          speculative_num_draft_tokens=4, specexit_step_split_tokens=json.dumps(boundary), dcut=dcut,
                          **SERVER_FLAGS)
        try:
            outs[dcut] = eng.generate(input_ids=prompts * 3, sampling_params=params, require_reasoning=True)
        finally:
            eng.shutdown()
    with_cut, without = outs["0.5"], outs["off"]
    assert [o["output_ids"] for o in with_cut[2 * n:]] == [o["output_ids"] for o in without[2 * n:]]
    assert [o["output_ids"] for o in with_cut[:n]] == [o["output_ids"] for o in without[:n]]
    assert all(o["output_ids"][10] == STOP for o in with_cut[:n])
    exits = [_check_prefix(o, b, ids) for o, b in zip(with_cut[n:2 * n], without[2 * n:])]
    assert any(k is not None for k in exits)

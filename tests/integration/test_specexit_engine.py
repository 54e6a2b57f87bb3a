"""SpecExit end to end in real SGLang on the CPU testbed (tiny random target, fitted EAGLE3 draft).

The draft gets 3 SpecExit rows (confidence, progress, remain) that are random directions of the
target's EAGLE3 features (orthogonal to their mean, so signals vary around sigmoid(0) = 0.5).
The random target rarely writes ``\\n\\n``, so the boundary set is made of the tokens its greedy
continuations use most (HF ``generate`` on the same prompts), passed as
``--specexit-step-split-tokens``. Server thresholds: confidence > 0.5 (about half of the steps
pass), progress > 0 and remain < 1e9 (always pass), EWMA alpha 0.5.

One engine per tree shape (topk=1 chain: 3 steps / 4 tokens; topk=2 tree: 2 steps / 4 tokens):

* prefix property: with SpecExit the output equals the SpecExit-off output (same engine,
  ``custom_params`` ``specexit_enable: false``) up to the exit, then ``</think>`` right after a
  boundary token; ``meta_info`` says so; at most one exit per request, none after it;
* replay: the runner's trace (resets, per-step tokens and signals) replayed through a fresh
  pure ``SpecExitState`` gives the same exits and cut positions, step by step, and the emitted
  runs end with the stop token exactly where the decisions cut (j* < a, j* = a, j* = 0 seen);
* mixed batch of 24 (thinking via an unclosed ``<think>``, non-thinking, SpecExit disabled);
* all 7 methods and all 4 smoothers (per-request ``custom_params``) produce exits;
* bad ``custom_params`` raise for that request only (the HTTP server turns this ValueError
  into a 400) while concurrent requests are served;
* no KV leak after many exits and after aborting requests mid-thinking;
* ``/server_info`` counts, reasoning-parser split of an exited output.

Budget: CI tier < 6 min on the shared 2-core machine (2 engine start-ups of ~30-60 s, the
session's tiny-model fit when not yet built, ~150 generated requests of <= 64 tokens).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os

import pytest
import torch

from engine_utils import make_engine

STOP = 4  # "</think>" in the project tokenizer
THINK_OPEN = 3  # "<think>"
MAX_NEW = 48
NUM_PROMPTS = 32
SERVER_FLAGS = dict(
    specexit=True,
    specexit_confidence_threshold=0.5,
    specexit_progress_threshold=0.0,
    specexit_remain_threshold=1e9,
    specexit_ewma_alpha=0.5,
)
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
OFF = {"specexit_enable": False}
ALL_PASS = {"specexit_confidence_threshold": 0.0, "specexit_progress_threshold": 0.0,
            "specexit_remain_threshold": 1e30}
NEVER = {"specexit_confidence_threshold": 1.0}


# ----------------------------------------------------------------------------- models and prompts
@pytest.fixture(scope="module")
def prompts(tiny_models):
    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, NUM_PROMPTS, 4, seed=0).tolist()


def choose_boundaries(target_dir, prompt_sets, count=3):
    """The ``count`` tokens the target's greedy continuations of ``prompt_sets`` use most, as strings
    that encode back to exactly that token (so they form the boundary set), plus the features of the
    last set's continuations ``[positions, 3H]``."""
    from transformers import AutoModelForCausalLM

    from sglang_ext.testbed.modeling import capture_features
    from sglang_ext.testbed.tokenizer import build_tokenizer

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    counts = collections.Counter()
    with torch.no_grad():
        for batch in prompt_sets:
            batch = torch.tensor(batch)
            out = target.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=MAX_NEW,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
            counts.update(out[:, batch.shape[1]:].reshape(-1).tolist())
        _, feats = capture_features(target, out)
    tok = build_tokenizer()
    boundary = []
    for tid, _ in counts.most_common():
        text = tok.decode([tid])
        if tid not in (STOP, THINK_OPEN) and tok.encode(text, add_special_tokens=False) == [tid]:
            boundary.append(text)
        if len(boundary) == count:
            break
    ids = [tok.encode(b, add_special_tokens=False)[0] for b in boundary]
    return boundary, ids, feats.reshape(-1, feats.shape[-1])


def random_signal_rows(features, seed=11):
    """``[3, 3H]`` random directions orthogonal to the mean feature, scaled so that the raw
    signals have standard deviations 1.5, 1.5 and 1.0 on ``features`` ``[positions, 3H]``."""
    mean = features.mean(0)
    unit = mean / mean.norm()
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(3, features.shape[1], generator=g)
    rows = rows - (rows @ unit)[:, None] * unit[None, :]
    z = features @ rows.T
    return rows / z.std(0)[:, None] * torch.tensor([1.5, 1.5, 1.0])[:, None]


@pytest.fixture(scope="module")
def setup(tiny_models, prompts, tmp_path_factory):
    """SpecExit draft (random feature directions as signal rows) and the boundary strings."""
    from sglang_ext.engine.specexit.checkpoint import add_signal_rows

    boundary, ids, feats = choose_boundaries(tiny_models.target, [prompts, [p + [THINK_OPEN] for p in prompts]])
    rows = random_signal_rows(feats)
    draft = add_signal_rows(tiny_models.draft, str(tmp_path_factory.mktemp("specexit_draft")), rows)
    return {"draft": draft, "boundary": boundary, "boundary_ids": ids}


def _engine(tiny_models, setup, trace_path, topk, steps, num_draft_tokens):
    os.environ["SGLANG_EXT_SPECEXIT_TRACE"] = trace_path
    try:
        return make_engine(tiny_models.target, attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                           speculative_draft_model_path=setup["draft"], speculative_num_steps=steps,
                           speculative_eagle_topk=topk, speculative_num_draft_tokens=num_draft_tokens,
                           specexit_step_split_tokens=json.dumps(setup["boundary"]), **SERVER_FLAGS)
    finally:
        os.environ.pop("SGLANG_EXT_SPECEXIT_TRACE", None)


@pytest.fixture(scope="module", params=[(1, 3, 4), (2, 2, 4)], ids=["chain-topk1", "tree-topk2"])
def served(request, tiny_models, setup, tmp_path_factory):
    topk, steps, n = request.param
    trace = str(tmp_path_factory.mktemp("trace") / "specexit_trace.jsonl")
    eng = _engine(tiny_models, setup, trace, topk, steps, n)
    try:
        yield {"engine": eng, "trace": trace, "topk": topk, **setup}
    finally:
        eng.shutdown()


def _gen(eng, prompts, params, require_reasoning=True):
    sp = [dict(GREEDY, custom_params=p) for p in params]
    return eng.generate(input_ids=[list(p) for p in prompts], sampling_params=sp, require_reasoning=require_reasoning)


def _specexit_info(eng):
    return eng.get_server_info()["internal_states"][0]["specexit"]


def _check_prefix(out, base, boundary_ids):
    """Returns the exit position (index of the forced stop token) or None."""
    ids, ref, meta = out["output_ids"], base["output_ids"], out["meta_info"]
    if not meta["specexit_exited"]:
        assert ids == ref
        assert meta["specexit_exit_reason"] is None
        return None
    k = ids.index(STOP)
    assert ids[:k] == ref[:k], "output differs from the SpecExit-off output before the exit"
    assert ref[k] != STOP, "the baseline ended thinking itself here: not an early exit"
    assert k >= 1 and ids[k - 1] in boundary_ids, "exit not right after a paragraph boundary"
    assert meta["specexit_think_tokens"] == k and meta["specexit_exit_reason"] == "signals"
    assert meta["specexit_active"] is True
    return k


# ----------------------------------------------------------------------------- tests
def test_prefix_property_and_meta_info(served, prompts):
    eng = served["engine"]
    before = _specexit_info(eng)
    outs = _gen(eng, prompts + prompts, [None] * len(prompts) + [OFF] * len(prompts))
    on, off = outs[: len(prompts)], outs[len(prompts):]
    exits = [_check_prefix(o, b, served["boundary_ids"]) for o, b in zip(on, off)]
    assert all(b["meta_info"]["specexit_active"] is False and not b["meta_info"]["specexit_exited"] for b in off)
    exited = sum(k is not None for k in exits)
    assert exited >= len(prompts) // 4, f"only {exited} of {len(prompts)} requests exited"
    assert exited < len(prompts), "every request exited: the signal test is not discriminating"
    after = _specexit_info(eng)
    assert after["exits_by_reason"]["signals"] - before["exits_by_reason"]["signals"] == exited
    assert after["finished_thinking_requests"] - before["finished_thinking_requests"] == len(prompts)
    assert after["mean_think_tokens"] is not None and after["method"] == "confidence_progress_remain"

    from sglang.srt.parser.reasoning_parser import ReasoningParser

    sample = next(o for o, k in zip(on, exits) if k is not None)
    reasoning, content = ReasoningParser("qwen3-thinking", stream_reasoning=False).parse_non_stream(sample["text"])
    assert "</think>" not in (reasoning or "") and "</think>" not in (content or "")
    assert (reasoning or "") + "</think>" + (content or "") == sample["text"]


def _load_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_replay_engine_decisions_equal_the_pure_criterion(served, prompts):
    from sglang_ext.specexit.overrides import SpecExitOptions
    from sglang_ext.specexit.state import SpecExitState

    events = _load_trace(served["trace"])
    assert any(e["event"] == "step" for e in events), "no verify step traced"
    slots = 1 + max(max(e["slots"]) for e in events if e["slots"])
    state = SpecExitState.allocate(slots, served["boundary_ids"], STOP)
    seen = collections.Counter()
    exits_per_rid = collections.Counter()
    ended = set()
    for e in events:
        if e["event"] == "reset":
            state.reset(e["slots"], [SpecExitOptions(**o) for o in e["options"]], think_tokens=e["think_tokens"],
                        thinking=e["options"] and [bool(t) for t in e["thinking"]])
            continue
        if e["event"] == "release":
            state.release(e["slots"])
            continue
        index = torch.tensor(e["slots"])
        d = state.step(index, torch.tensor(e["roots"]), torch.tensor(e["accepted"]), torch.tensor(e["bonus"]),
                       torch.tensor(e["signals"], dtype=torch.float32))
        for key, logged in e["decision"].items():
            assert getattr(d, key).tolist() == logged, (key, e)
        n = len(e["roots"])
        for i in range(n):
            rid = e["rids"][i]
            a = sum(t != -1 for t in e["accepted"][i])
            run = e["next_token_ids"][i][: e["accept_lens"][i]]
            if e["decision"]["exit"][i]:
                keep = e["decision"]["keep_drafts"][i]
                assert rid not in ended, "exit after the request left its think span"
                assert e["accept_lens"][i] == keep + 1 and run[-1] == STOP
                assert run[:-1] == e["accepted"][i][:keep]
                seen["root" if keep == 0 else ("last" if keep == a else "inside")] += 1
                exits_per_rid[rid] += 1
                ended.add(rid)
            else:
                assert e["accept_lens"][i] == a + 1
                if e["decision"]["first_boundary"][i] != -1:
                    seen["boundary_without_exit"] += 1
            if e["decision"]["natural_end"][i]:
                ended.add(rid)
    assert max(exits_per_rid.values()) == 1
    # the trace must exercise the cut cases, or the comparison proves little
    assert seen["inside"] >= 1 and seen["boundary_without_exit"] >= 1, seen
    assert seen["root"] + seen["last"] >= 1, seen


def test_mixed_batch(served, prompts):
    eng = served["engine"]
    think = [p + [THINK_OPEN] for p in prompts[:8]]
    plain = prompts[8:16]
    batch = think + think + plain  # 24 requests in one generate call
    params = [None] * 8 + [OFF] * 8 + [None] * 8
    outs = _gen(eng, batch, params, require_reasoning=False)
    on, off, non_thinking = outs[:8], outs[8:16], outs[16:]
    exits = [_check_prefix(o, b, served["boundary_ids"]) for o, b in zip(on, off)]
    assert sum(k is not None for k in exits) >= 1
    assert all(o["meta_info"]["specexit_active"] for o in on)
    assert not any(o["meta_info"]["specexit_active"] or o["meta_info"]["specexit_exited"] for o in off + non_thinking)
    reference = _gen(eng, plain, [OFF] * 8, require_reasoning=False)
    assert [o["output_ids"] for o in non_thinking] == [o["output_ids"] for o in reference]


def test_all_methods_and_smoothers_exit(served, prompts):
    from sglang_ext.specexit.signals import ALL_METHODS
    from sglang_ext.specexit.defaults import SMOOTHING_NAMES

    combos = [(m.name, s) for m in ALL_METHODS for s in SMOOTHING_NAMES]  # 28 requests
    params = [dict(ALL_PASS, specexit_method=m, specexit_smoothing=s, specexit_window=2) for m, s in combos]
    batch = [prompts[i % len(prompts)] for i in range(len(combos))]
    outs = _gen(served["engine"], batch, params)
    by_method, by_smoother = collections.Counter(), collections.Counter()
    for (m, s), o in zip(combos, outs):
        if o["meta_info"]["specexit_exited"]:
            by_method[m] += 1
            by_smoother[s] += 1
            assert STOP in o["output_ids"]
    assert set(by_method) == {m.name for m in ALL_METHODS}, by_method
    assert set(by_smoother) == set(SMOOTHING_NAMES), by_smoother


def test_bad_custom_params_rejected_per_request(served, prompts):
    eng = served["engine"]
    bad = [{"specexit_confidence_threshold": "high"}, {"specexit_window": 0}, {"specexit_windw": 3},
           {"specexit_enable": 1}]
    fields = ["specexit_confidence_threshold", "specexit_window", "specexit_windw", "specexit_enable"]

    async def run():
        jobs = [eng.async_generate(input_ids=prompts[i], sampling_params=dict(GREEDY, custom_params=p),
                                   require_reasoning=True)
                for i, p in enumerate([None, bad[0], {"specexit_min_think_tokens": 4}, bad[1], None, bad[2],
                                       bad[3]])]
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = eng.loop.run_until_complete(run())
    good = [results[i] for i in (0, 2, 4)]
    errors = [results[i] for i in (1, 3, 5, 6)]
    for r in good:
        assert isinstance(r, dict) and r["meta_info"]["completion_tokens"] == MAX_NEW
    for err, field in zip(errors, fields):
        assert isinstance(err, ValueError) and field in str(err), err
    # the server keeps serving
    assert _gen(eng, prompts[:2], [None, None])[0]["meta_info"]["completion_tokens"] == MAX_NEW


def _idle_pool(eng, timeout_s=60.0):
    """KV pool usage once the scheduler is idle and the prefix cache is flushed."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        flushed = eng.flush_cache()
        pool = _specexit_info(eng)["kv_pool"]
        if (getattr(flushed, "success", flushed) and pool["running_requests"] == 0) or time.monotonic() > deadline:
            return pool
        time.sleep(0.5)


def test_no_kv_leak_after_exits_and_aborts(served, prompts):
    eng = served["engine"]
    start = _idle_pool(eng)
    assert start["running_requests"] == 0
    outs = _gen(eng, prompts, [dict(ALL_PASS)] * len(prompts))  # many early exits
    assert sum(o["meta_info"]["specexit_exited"] for o in outs) >= len(prompts) // 4
    assert _idle_pool(eng)["available_tokens"] == start["available_tokens"]

    async def run():
        long = dict(GREEDY, max_new_tokens=400, custom_params=NEVER)
        rids = [f"abort-{i}" for i in range(6)]
        jobs = [asyncio.ensure_future(eng.async_generate(input_ids=prompts[i], sampling_params=long,
                                                         require_reasoning=True, rid=rid))
                for i, rid in enumerate(rids)]
        while eng.tokenizer_manager.rid_to_state.get(rids[0]) is None or \
                len(eng.tokenizer_manager.rid_to_state[rids[0]].output_ids) < 8:
            await asyncio.sleep(0.05)
        for rid in rids[:3]:
            eng.tokenizer_manager.abort_request(rid=rid)
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = eng.loop.run_until_complete(run())
    aborted = [r for r in results[:3]]
    for r in aborted:
        finish = r["meta_info"]["finish_reason"] if isinstance(r, dict) else {"type": "abort"}
        assert finish["type"] == "abort"
        if isinstance(r, dict):
            assert r["meta_info"]["completion_tokens"] < 400
    assert all(isinstance(r, dict) and r["meta_info"]["completion_tokens"] == 400 for r in results[3:])
    end = _idle_pool(eng)
    assert end["running_requests"] == 0
    assert end["available_tokens"] == start["available_tokens"]


def test_think_length_guards(served, prompts):
    """max_think_tokens M (grace G) forces the exit within [M, M + G]; min_think_tokens delays it."""
    m, g, floor = 12, 4, 20
    forced = dict(NEVER, specexit_max_think_tokens=m, specexit_max_think_grace=g)
    delayed = dict(ALL_PASS, specexit_min_think_tokens=floor)
    batch = prompts[:8] * 3
    outs = _gen(served["engine"], batch, [forced] * 8 + [delayed] * 8 + [OFF] * 8)
    base = outs[16:]
    for o, b in zip(outs[:8], base):
        k = o["output_ids"].index(STOP)  # every request is forced out
        assert o["meta_info"]["specexit_exit_reason"] == "max_think_tokens"
        assert m <= k <= m + g and (o["output_ids"][k - 1] in served["boundary_ids"] or k == m + g), k
        assert o["output_ids"][:k] == b["output_ids"][:k]
    late = [o for o in outs[8:16] if o["meta_info"]["specexit_exited"]]
    for o, b in zip(outs[8:16], base):
        k = _check_prefix(o, b, served["boundary_ids"])
        assert k is None or k >= floor
    assert late, "no exit after the min-think floor"


def test_forced_stop_token_logprob(served, prompts, tiny_models):
    """With return_logprob the forced </think> carries the target's log-probability of </think> there."""
    from transformers import AutoModelForCausalLM

    batch = prompts[:8]
    outs = served["engine"].generate(input_ids=batch, sampling_params=[dict(GREEDY, custom_params=ALL_PASS)] * 8,
                                     require_reasoning=True, return_logprob=True)
    exited = [(p, o) for p, o in zip(batch, outs) if o["meta_info"]["specexit_exited"]]
    assert exited
    target = AutoModelForCausalLM.from_pretrained(tiny_models.target, dtype=torch.float32).eval()
    for prompt, o in exited[:3]:
        k = o["output_ids"].index(STOP)
        logprobs = o["meta_info"]["output_token_logprobs"]
        assert len(logprobs) == len(o["output_ids"]) and logprobs[k][1] == STOP
        with torch.no_grad():
            logits = target(torch.tensor([prompt + o["output_ids"][:k]])).logits[0, -1]
        expected = torch.log_softmax(logits, -1)[STOP].item()
        assert logprobs[k][0] == pytest.approx(expected, abs=1e-3)
        # the token before the cut keeps its own logprob
        with torch.no_grad():
            prev = target(torch.tensor([prompt + o["output_ids"][: k - 1]])).logits[0, -1]
        assert logprobs[k - 1][0] == pytest.approx(torch.log_softmax(prev, -1)[o["output_ids"][k - 1]].item(),
                                                   abs=1e-3)


def test_engine_signals_equal_the_offline_probe(served, prompts, tiny_models):
    """The signals the engine observes are, token by token, the draft's signal rows applied to the target's
    EAGLE3 features at each committed position (HF, teacher-forced), decoded: column j of a step is r_j."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from sglang_ext.testbed.modeling import capture_features

    batch = prompts[:6]
    outs = _gen(served["engine"], batch, [NEVER] * len(batch))
    rids = {o["meta_info"]["id"]: (p, o["output_ids"]) for p, o in zip(batch, outs)}
    steps = collections.defaultdict(list)  # rid -> [(accepted drafts a, per-token signals)]
    for e in _load_trace(served["trace"]):
        if e["event"] != "step":
            continue
        for i, rid in enumerate(e["rids"]):
            if rid in rids:
                steps[rid].append((sum(t != -1 for t in e["accepted"][i]), e["signals"][i]))
    fc = load_file(os.path.join(served["draft"], "model.safetensors"))["fc.weight"]
    rows = fc[fc.shape[0] - 3:]  # confidence, progress, remain
    target = AutoModelForCausalLM.from_pretrained(tiny_models.target, dtype=torch.float32).eval()
    compared = 0
    for rid, (prompt, output) in rids.items():
        with torch.no_grad():
            _, feats = capture_features(target, torch.tensor([prompt + output]))
        z = feats[0] @ rows.T  # [positions, 3]
        decoded = torch.stack([torch.sigmoid(z[:, 0]), torch.sigmoid(z[:, 1]), torch.exp(z[:, 2])], dim=1)
        start = len(prompt)  # position of the prefill-sampled token, the first step's root
        for a, logged in steps[rid]:
            if start + a + 1 > len(prompt) + len(output) - 1:
                break  # the last step may run past max_new_tokens
            for j in range(a + 1):
                expected = decoded[start + j]
                assert logged[j] == pytest.approx(expected.tolist(), rel=1e-3, abs=1e-4), (rid, start, j)
                compared += 1
            start += a + 1  # the bonus becomes the next root
    assert compared >= 60

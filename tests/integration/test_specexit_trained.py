"""SpecExit acceptance on the trained testbed models (thinking target + EAGLE3 draft with 3 signal rows).

Uses ``sglang_ext/testbed/models/{target,draft}`` (or the directory named by the environment
variable ``SGLANG_EXT_TESTBED_MODELS``); skipped while the trained weights are not there.
Held-out problems come from an RNG stream the training never used (``bench/specexit_eval.py``).

CI tier (one chain engine, topk=1):

* prefix property on 50 held-out problems, reference defaults and the tuned preset: the output
  equals the SpecExit-off output up to the exit, the exit follows a paragraph break inside the
  think span of the SpecExit-off output, and the answer is complete (EOS, parsable, correct when
  the SpecExit-off answer is);
* fewer tokens at no accuracy cost (tuned <= 0.6x, accuracy drop <= 1 point on these 50);
* all 7 methods and all 4 smoothers exit on held-out problems (per-request ``custom_params``);
* mixed batch of 24: thinking, non-thinking (``enable_thinking=False`` prompt) and SpecExit disabled;
* replay of the engine's trace through the pure criterion.

Slow tier: the same prefix property with topk=2 trees; no KV leak after exits and aborts.

Budget: CI tier < 3 min; slow tier < 3 min more (shared 2-core machine).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from engine_utils import make_engine
from test_specexit_engine import STOP, _idle_pool, _load_trace

MODELS_ENV = "SGLANG_EXT_TESTBED_MODELS"
DEFAULT_MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_ext", "testbed", "models")
MODELS = os.environ.get(MODELS_ENV) or DEFAULT_MODELS
NUM_PROBLEMS = 50
MAX_NEW = 256
PARAGRAPH = 6  # "\n\n" in the project tokenizer (the only single-token step-split string)
EOS = 2  # <|im_end|>
BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
from specexit_eval import DEFAULT_TUNED, held_out_problems, preset_custom_params  # noqa: E402

TUNED = preset_custom_params(DEFAULT_TUNED)  # the shipped preset configs/specexit_testbed_tuned.yaml
OFF = {"specexit_enable": False}
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW}

pytestmark = pytest.mark.skipif(
    not (os.path.isdir(os.path.join(MODELS, "target")) and os.path.isdir(os.path.join(MODELS, "draft"))),
    reason=f"trained testbed models not found in {MODELS} (set {MODELS_ENV} to use another directory)")


@pytest.fixture(scope="module")
def problems():
    return held_out_problems(NUM_PROBLEMS, 2026)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(MODELS, "target"))


def _prompts(tok, problems, thinking=True):
    from sglang_ext.testbed import task

    return [tok.encode(task.prompt_text(p["question"], thinking), add_special_tokens=False) for p in problems]


def _engine(topk, steps, n, trace=None):
    if trace:
        os.environ["SGLANG_EXT_SPECEXIT_TRACE"] = trace
    try:
        return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                           speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                           speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=n,
                           max_total_tokens=32768, max_running_requests=64, specexit=True)
    finally:
        os.environ.pop("SGLANG_EXT_SPECEXIT_TRACE", None)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trained_trace") / "trace.jsonl")
    eng = _engine(1, 3, 4, trace)
    try:
        yield {"engine": eng, "trace": trace}
    finally:
        eng.shutdown()


def _gen(eng, prompts, params):
    return eng.generate(input_ids=prompts, sampling_params=[dict(GREEDY, custom_params=p) for p in params])


def _check(out, base, problem):
    """Prefix property for one problem; returns (exit position, correct)."""
    from sglang_ext.testbed import task

    ids, ref, meta = out["output_ids"], base["output_ids"], out["meta_info"]
    assert meta["specexit_active"] and STOP in ref, "the SpecExit-off output must close its think span"
    natural = ref.index(STOP)
    k = ids.index(STOP)
    if meta["specexit_exited"]:
        assert ids[:k] == ref[:k] and k < natural, "exit outside the think span or output changed before it"
        assert ids[k - 1] == PARAGRAPH and meta["specexit_think_tokens"] == k
    else:
        assert ids == ref
    assert ids[-1] == EOS and out["meta_info"]["finish_reason"]["type"] == "stop", "answer cut"
    predicted = task.parse_answer(out["text"])
    assert predicted is not None
    return (k if meta["specexit_exited"] else None), predicted == problem["answer"]


def test_prefix_property_and_savings_on_held_out_problems(chain, problems, tok):
    prompts = _prompts(tok, problems)
    n = len(prompts)
    outs = _gen(chain["engine"], prompts * 3, [OFF] * n + [None] * n + [TUNED] * n)
    base, reference, tuned = outs[:n], outs[n:2 * n], outs[2 * n:]
    from sglang_ext.testbed import task

    base_correct = sum(task.parse_answer(o["text"]) == p["answer"] for o, p in zip(base, problems))
    for variant in (reference, tuned):
        results = [_check(o, b, p) for o, b, p in zip(variant, base, problems)]
        assert sum(k is not None for k, _ in results) >= 0.9 * n
        assert 100.0 * (base_correct - sum(c for _, c in results)) / n <= 1.0
    tokens = lambda outs_: sum(o["meta_info"]["completion_tokens"] for o in outs_)  # noqa: E731
    assert tokens(tuned) <= 0.6 * tokens(base)
    assert tokens(tuned) < tokens(reference) < tokens(base)


def test_all_methods_and_smoothers_exit(chain, problems, tok):
    from sglang_ext.specexit.defaults import SMOOTHING_NAMES
    from sglang_ext.specexit.signals import ALL_METHODS

    combos = [(m.name, s) for m in ALL_METHODS for s in SMOOTHING_NAMES]
    prompts = _prompts(tok, problems[: len(combos)])
    params = [{"specexit_method": m, "specexit_smoothing": s, "specexit_window": 3} for m, s in combos]
    outs = _gen(chain["engine"], prompts, params)
    exited_methods = {m for (m, _), o in zip(combos, outs) if o["meta_info"]["specexit_exited"]}
    exited_smoothers = {s for (_, s), o in zip(combos, outs) if o["meta_info"]["specexit_exited"]}
    assert exited_methods == {m.name for m in ALL_METHODS}
    assert exited_smoothers == set(SMOOTHING_NAMES)


def test_mixed_batch(chain, problems, tok):
    thinking = _prompts(tok, problems[:8])
    plain = _prompts(tok, problems[8:16], thinking=False)
    outs = _gen(chain["engine"], thinking + thinking + plain, [TUNED] * 8 + [OFF] * 8 + [TUNED] * 8)
    for o, b, p in zip(outs[:8], outs[8:16], problems[:8]):
        _check(o, b, p)
    assert all(o["meta_info"]["specexit_exited"] for o in outs[:8])
    for o in outs[8:]:
        assert not o["meta_info"]["specexit_active"] and not o["meta_info"]["specexit_exited"]
    assert all(STOP not in o["output_ids"] for o in outs[16:])  # non-thinking answers: no think span at all
    again = _gen(chain["engine"], plain, [OFF] * 8)
    assert [o["output_ids"] for o in outs[16:]] == [o["output_ids"] for o in again]


def test_replay_of_the_trained_run(chain):
    from sglang_ext.specexit.overrides import SpecExitOptions
    from sglang_ext.specexit.state import SpecExitState

    events = _load_trace(chain["trace"])
    slots = 1 + max(max(e["slots"]) for e in events if e["slots"])
    state = SpecExitState.allocate(slots, [PARAGRAPH], STOP)
    exits = 0
    for e in events:
        if e["event"] == "reset":
            state.reset(e["slots"], [SpecExitOptions(**o) for o in e["options"]], think_tokens=e["think_tokens"],
                        thinking=[bool(t) for t in e["thinking"]])
        elif e["event"] == "release":
            state.release(e["slots"])
        else:
            d = state.step(torch.tensor(e["slots"]), torch.tensor(e["roots"]), torch.tensor(e["accepted"]),
                           torch.tensor(e["bonus"]), torch.tensor(e["signals"], dtype=torch.float32))
            for key, logged in e["decision"].items():
                assert getattr(d, key).tolist() == logged, key
            exits += sum(e["decision"]["exit"])
    assert exits >= NUM_PROBLEMS


@pytest.mark.slow
def test_tree_prefix_property(problems, tok):
    prompts = _prompts(tok, problems[:20])
    eng = _engine(2, 3, 8)
    try:
        outs = _gen(eng, prompts * 2, [OFF] * 20 + [TUNED] * 20)
    finally:
        eng.shutdown()
    results = [_check(o, b, p) for o, b, p in zip(outs[20:], outs[:20], problems)]
    assert sum(k is not None for k, _ in results) >= 18


@pytest.mark.slow
def test_no_kv_leak_after_exits_and_aborts(chain, problems, tok):
    import asyncio

    eng = chain["engine"]
    start = _idle_pool(eng)
    outs = _gen(eng, _prompts(tok, problems), [TUNED] * len(problems))
    assert sum(o["meta_info"]["specexit_exited"] for o in outs) >= 45
    assert _idle_pool(eng)["available_tokens"] == start["available_tokens"]
    prompts = _prompts(tok, problems[:8])

    async def run():
        # ignore_eos keeps every request running to max_new_tokens, so the aborts below land
        # while the first requests are still in their think span.
        never = dict(GREEDY, ignore_eos=True, custom_params={"specexit_confidence_threshold": 1.0})
        rids = [f"trained-abort-{i}" for i in range(8)]
        jobs = [asyncio.ensure_future(eng.async_generate(input_ids=p, sampling_params=never, rid=r))
                for p, r in zip(prompts, rids)]
        deadline = time.monotonic() + 120
        while len(getattr(eng.tokenizer_manager.rid_to_state.get(rids[0]), "output_ids", [])) < 20:
            assert not any(j.done() for j in jobs), "a request finished before the aborts were sent"
            assert time.monotonic() < deadline, "no output within 120 s"
            await asyncio.sleep(0.02)
        for rid in rids[:4]:
            eng.tokenizer_manager.abort_request(rid=rid)
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = eng.loop.run_until_complete(run())
    for r in results[:4]:
        assert not isinstance(r, dict) or r["meta_info"]["finish_reason"]["type"] == "abort"
    assert all(isinstance(r, dict) and r["meta_info"]["finish_reason"]["type"] == "length" for r in results[4:])
    end = _idle_pool(eng)
    assert end["running_requests"] == 0 and end["available_tokens"] == start["available_tokens"]

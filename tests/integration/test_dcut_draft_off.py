"""D-Cut draft-off steps on the trained testbed models: lossless, with SpecExit, under concurrency.

Uses ``sglang_ext/testbed/models/{target,draft}`` (or ``SGLANG_EXT_TESTBED_MODELS``); skipped while
the trained weights are not there. Held-out problems of the synthetic task (``bench/specexit_eval.py``)
through the chat template with thinking on, greedy, up to 256 new tokens, stopping at EOS.

One engine per draft shape (CI: the EAGLE3 chain, 3 steps / 4 tokens, and the tree, topk 4, 3 steps,
16 tokens), ``--specexit --dcut auto`` with a hand-written version-2 cost table whose draft-off step
is cheap from batch size 2 on (so ``auto`` really switches drafting off there) but not at batch
size 1. Requests run with ``custom_params={"specexit_enable": false}`` unless SpecExit is tested.
Modes, switched through ``/set_internal_state`` (``sglang_ext.engine.dcut.client``):

* reference: ``dcut_force_ratio`` 1.0 (full verification, drafting every step);
* ``dcut_force_draft_off`` 1 (no step drafts) and 3 (two of every three steps without drafting,
  so drafting is switched off and on again all the time), requests joining while others run and
  leaving at EOS (submitted one by one, 50 ms apart);
* the configured ``--dcut auto`` (draft-off chosen by the cost table, with probe steps).

Checks: output ids and finish reasons equal the reference token for token in every mode, and the
reference equals the target's own greedy continuation without speculation (HF transformers, fp32);
the draft-off steps are counted in the tier histogram (``draft_off``) and the ``/server_info``
metrics; every KV slot is back after the runs. With SpecExit on and two of every three steps
without drafting, the exits still happen and keep the prefix property (the output equals the
reference up to the exit, which follows a paragraph break). Slow tier: the timing of a draft-off
step against a drafted one is printed (``-s``), from the opt-in per-step time split, with the draft
extend of draft-off steps deferred (default) and run every step. ``--dcut-draft-off-extend``:
``defer`` against ``always`` with two of every three steps without drafting -- both lossless, every
deferred row caught up (or dropped with its finished request) before drafting resumes, and no
more steps than with the extend run every step.

Budget: CI tier ~3 min on the shared 2-core host (two engine starts of ~40 s, seven 16-problem
runs on the chain, six 8-problem runs on the tree, one HF greedy pass); the slow timing test two
more engine starts and three runs each.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from engine_utils import hf_greedy, make_engine
from trained_models import MODELS, hand_written_table, requires_trained_models
from trained_models import held_out_prompts as _prompts

MAX_NEW = 256
FULL = 1.0
CONFIGURED = 0.0  # dcut_force_ratio 0 / dcut_force_draft_off 0: back to the configured choice
PARAGRAPH = 6  # "\n\n" in the project tokenizer
SPECEXIT_OFF = {"specexit_enable": False}
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW}

pytestmark = requires_trained_models


def _table_file(path, n, topk, steps):
    """Tier costs grow with the tier; the draft-off step is dear at bs 1 and cheap from bs 2 on."""
    return hand_written_table(path, n, topk, steps, off_ms=[50, 1, 2])


def _launch(tmp, topk, steps, n, algorithm="EAGLE3"):
    """``--specexit --dcut auto`` on the EAGLE3 draft; ``STANDALONE``: the testbed's standalone draft
    LM without SpecExit (its only signal source, the draft confidence, turns deferral off)."""
    standalone = algorithm == "STANDALONE"
    os.environ["SGLANG_EXT_DCUT_TIMING"] = "1"  # the per-step time split (read when the runner starts)
    try:
        return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                           speculative_algorithm=algorithm,
                           speculative_draft_model_path=os.path.join(MODELS, "standalone_draft" if standalone else "draft"),
                           speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=n,
                           max_total_tokens=32768, max_running_requests=64, specexit=not standalone, dcut="auto",
                           dcut_cost_table=_table_file(str(tmp / "table.json"), n, topk, steps),
                           dcut_cache_dir=str(tmp / "cache"))
    finally:
        os.environ.pop("SGLANG_EXT_DCUT_TIMING", None)


def _state(eng):
    from sglang_ext.engine.dcut.client import dcut_states

    states = dcut_states(eng)
    assert len(states) == 1
    return states[0]


def _held(pool):
    return pool["kv_total"] - pool["kv_available"] - pool["kv_evictable"]


def _generate(eng, prompts, custom, staggered=False):
    params = dict(GREEDY, custom_params=custom)
    if not staggered:
        return eng.generate(input_ids=prompts, sampling_params=params)

    async def run():
        jobs = []
        for p in prompts:  # requests join while the earlier ones decode
            jobs.append(asyncio.ensure_future(eng.async_generate(input_ids=p, sampling_params=params)))
            await asyncio.sleep(0.05)
        return await asyncio.gather(*jobs)

    return eng.loop.run_until_complete(run())


def _hist_delta(before, after):
    keys = set(before["tier_histogram"]) | set(after["tier_histogram"])
    return {k: after["tier_histogram"].get(k, 0) - before["tier_histogram"].get(k, 0) for k in keys}


def _run(eng, prompts, ratio, every, staggered=False, custom=SPECEXIT_OFF):
    from sglang_ext.engine.dcut.client import set_force_draft_off, set_force_ratio

    assert set_force_ratio(eng, ratio) and set_force_draft_off(eng, every)
    before = _state(eng)["metrics"]
    outs = _generate(eng, prompts, custom, staggered)
    after = _state(eng)["metrics"]
    hist = _hist_delta(before, after)
    steps = after["steps"] - before["steps"]
    off = after["draft_off_steps"] - before["draft_off_steps"]
    assert off == hist.get("draft_off", 0) and steps > 0
    return outs, steps, off, hist


def check_draft_off(eng, prompts, hf_ref=None, custom=SPECEXIT_OFF):
    """Every draft-off mode equals full verification token for token; returns the reference."""
    from sglang_ext.engine.dcut.client import dcut_info, set_force_draft_off, set_force_ratio

    info = dcut_info(eng)
    assert info["cost_table_info"]["source"] == "file" and info["draft_off"] == "auto"
    assert info["cost_table"]["off_ms"] == [50, 1, 2]
    held0 = _held(_state(eng)["kv_pool"])
    try:
        outs, steps, off, _ = _run(eng, prompts, FULL, 0, custom=custom)
        assert off == 0
        ref = [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in outs]
        assert all(reason == "stop" for _, reason in ref), "reference outputs must end at EOS"
        if hf_ref is not None:  # no speculation: the target's own greedy continuation
            bad = [i for i, ((ids, _), h) in enumerate(zip(ref, hf_ref)) if ids != h[:len(ids)]]
            assert not bad, f"{len(bad)} reference outputs differ from greedy decoding without speculation"
        for name, ratio, every, staggered in (("all steps draft-off", FULL, 1, False),
                                              ("2 of 3 steps draft-off, staggered", FULL, 3, True),
                                              ("auto", CONFIGURED, 0, False)):
            outs, steps, off, hist = _run(eng, prompts, ratio, every, staggered, custom=custom)
            got = [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in outs]
            bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert not bad, f"{name}: {len(bad)} of {len(prompts)} outputs differ from full verification"
            if every == 1:
                assert off == steps, f"{name}: {steps - off} steps drafted"
            else:
                assert 0 < off < steps, f"{name}: draft-off steps {off} of {steps} (histogram {hist})"
            print(f"{name}: {off} of {steps} steps without drafting, tiers {hist}")
    finally:
        set_force_ratio(eng, CONFIGURED)
        set_force_draft_off(eng, 0)
    pool = _state(eng)["kv_pool"]
    assert pool["running_requests"] == 0 and _held(pool) == held0, "KV slots not returned after the runs"
    return ref


def check_deferred_extend(eng, prompts, ref, custom=SPECEXIT_OFF):
    """``--dcut-draft-off-extend defer`` (the default) against ``always`` (SGLang's one-row extend
    every draft-off step), two of every three steps without drafting: both equal the reference,
    the deferred rows are caught up before every drafted step, and the drafted steps accept as
    much as with the draft extended every step (a draft that missed the skipped rows would need
    more steps for the same outputs)."""
    from sglang_ext.engine.dcut.client import set_draft_off_extend

    steps_of = {}
    assert not set_draft_off_extend(eng, "sometimes")  # not a mode: rejected, the setting kept
    assert _state(eng)["draft_off_extend"]["mode"] == "defer"
    try:
        for mode in ("always", "defer"):
            assert set_draft_off_extend(eng, mode)
            before = _state(eng)["draft_off_extend"]
            outs, steps, off, _ = _run(eng, prompts, FULL, 3, custom=custom)
            after = _state(eng)["draft_off_extend"]
            got = [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in outs]
            bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert not bad, f"draft-off extend {mode}: {len(bad)} outputs differ from full verification"
            delta = {k: after[k] - before[k] for k in ("deferred_rows", "catch_ups", "caught_up_rows", "dropped_rows")}
            if mode == "always":
                assert delta["deferred_rows"] == 0 and delta["catch_ups"] == 0, delta
            else:
                # every drafted step after a draft-off run follows a catch-up; every deferred row
                # is caught up, or dropped with its finished request (at the next decode batch: the
                # rows of requests that finished in the run's last steps are still held)
                assert delta["catch_ups"] >= (steps - off) // 2 and delta["deferred_rows"] > 0, delta
                held = after["pending_rows"] - before["pending_rows"]
                assert delta["caught_up_rows"] + delta["dropped_rows"] + held == delta["deferred_rows"], delta
                assert after["pending_requests"] <= len(prompts)
            steps_of[mode] = steps
            print(f"draft-off extend {mode}: {steps} steps ({off} draft-off), {delta}")
    finally:
        set_draft_off_extend(eng, "defer")
    assert steps_of["defer"] <= 1.05 * steps_of["always"], steps_of


def count_exits_with_prefix_property(outs, ref) -> int:
    """Requests of ``outs`` that SpecExit ended early; each equals its ``ref`` (SpecExit-off)
    output up to the exit, which follows a paragraph break, and the others equal it entirely."""
    exited = 0
    for o, (ids_ref, _) in zip(outs, ref):
        meta, ids = o["meta_info"], o["output_ids"]
        if not meta["specexit_exited"]:
            assert ids == ids_ref, "a request that did not exit changed its output"
            continue
        exited += 1
        k = meta["specexit_think_tokens"]
        assert ids[:k] == ids_ref[:k], "the output before the exit differs from the SpecExit-off output"
        assert PARAGRAPH in ids[:k], "no paragraph break before the exit"
    return exited


def check_specexit(eng, prompts, ref):
    """SpecExit across draft-off steps: exits happen, with the prefix property."""
    outs, steps, off, _ = _run(eng, prompts, FULL, 3, custom={"specexit_enable": True})
    try:
        assert 0 < off < steps
        exited = count_exits_with_prefix_property(outs, ref)
        assert exited >= 1, "no SpecExit exit with draft-off steps"
        print(f"SpecExit with draft-off steps: {exited} of {len(prompts)} exited, {off} of {steps} steps draft-off")
    finally:
        from sglang_ext.engine.dcut.client import set_force_draft_off

        set_force_draft_off(eng, 0)


def print_step_times(eng, label):
    t = _state(eng)["metrics"].get("step_timing")
    if t:
        print(f"{label}: step time split (ms per step, all steps) {t['ms_per_step']}")


def _time_modes(eng, prompts, label):
    """Wall time per step of all-draft-off against full drafting (printed, not asserted)."""
    import time

    from sglang_ext.engine.dcut.client import set_draft_off_extend, set_force_draft_off, set_force_ratio

    rows = []
    try:
        for name, every, extend in (("drafting", 0, "defer"), ("draft-off, extend deferred", 1, "defer"),
                                    ("draft-off, extend every step", 1, "always")):
            assert set_force_ratio(eng, FULL) and set_force_draft_off(eng, every)
            assert set_draft_off_extend(eng, extend)
            before = _state(eng)["metrics"]
            t0 = time.perf_counter()
            _generate(eng, prompts, SPECEXIT_OFF)
            dt = time.perf_counter() - t0
            after = _state(eng)["metrics"]
            steps = after["steps"] - before["steps"]
            toks = after["accepted_tokens"] - before["accepted_tokens"]
            parts = ""
            tb, ta = before.get("step_timing"), after.get("step_timing")
            if tb and ta and ta["steps"] > tb["steps"]:  # the time split of this run's steps only
                n = ta["steps"] - tb["steps"]
                parts = ", ".join(f"{k} {(ta['ms_per_step'][k] * ta['steps'] - tb['ms_per_step'][k] * tb['steps']) / n:.2f}"
                                  for k in ta["ms_per_step"])
            rows.append(f"{name}: {dt * 1e3 / steps:.2f} ms/step, {toks / dt:.0f} tok/s [{parts}]")
    finally:
        set_force_ratio(eng, CONFIGURED)
        set_force_draft_off(eng, 0)
        set_draft_off_extend(eng, "defer")
    print(f"{label} bs {len(prompts)}: " + "; ".join(rows))


@pytest.fixture(scope="module")
def prompts16():
    return _prompts(16)


def test_chain_draft_off_lossless_with_specexit(tmp_path, prompts16):
    hf = hf_greedy(os.path.join(MODELS, "target"), prompts16, MAX_NEW)
    eng = _launch(tmp_path, topk=1, steps=3, n=4)
    try:
        ref = check_draft_off(eng, prompts16, hf)
        check_deferred_extend(eng, prompts16, ref)
        check_specexit(eng, prompts16, ref)
    finally:
        eng.shutdown()


def test_tree_draft_off_lossless(tmp_path, prompts16):
    eng = _launch(tmp_path, topk=4, steps=3, n=16)
    try:
        ref = check_draft_off(eng, prompts16[:8])
        check_deferred_extend(eng, prompts16[:8], ref)
    finally:
        eng.shutdown()


def test_standalone_draft_off_defers_the_draft_lm_extend(tmp_path, prompts16):
    """A STANDALONE draft (a small LM: no target hidden state to keep) defers the draft extend of
    its draft-off steps too, and catches up before drafting resumes: lossless against full
    verification and the target's own greedy output, no more steps than extending every step."""
    hf = hf_greedy(os.path.join(MODELS, "target"), prompts16[:8], MAX_NEW)
    eng = _launch(tmp_path, topk=1, steps=3, n=4, algorithm="STANDALONE")
    try:
        ref = check_draft_off(eng, prompts16[:8], hf, custom=None)
        check_deferred_extend(eng, prompts16[:8], ref, custom=None)
    finally:
        eng.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("topk,steps,n,bs", [(1, 3, 4, 16), (4, 3, 16, 8)], ids=["chain3x4", "tree4x3x16"])
def test_draft_off_step_times(tmp_path, prompts16, topk, steps, n, bs):
    """The wall time per step of all-draft-off against full drafting, with the draft extend of
    draft-off steps deferred and run every step (printed with ``-s``, not asserted: noisy host)."""
    eng = _launch(tmp_path, topk=topk, steps=steps, n=n)
    try:
        _time_modes(eng, prompts16[:bs], f"topk {topk}, {steps}/{n}")
        print_step_times(eng, f"topk {topk}, {steps}/{n}")
    finally:
        eng.shutdown()

"""SpecExit decides per token: the same request gives the same output whatever D-Cut, the load or draft-off do.

Uses ``sglang_ext/testbed/models/{target,draft}`` (or ``SGLANG_EXT_TESTBED_MODELS``); skipped while the
trained weights are not there. 40 held-out problems of the synthetic task through the chat template with
thinking on, greedy, up to 256 new tokens, SpecExit on with the tuned preset
(``configs/specexit_testbed_tuned.yaml`` through ``custom_params``) and with the reference defaults.

One engine: the EAGLE3 chain (3 steps, 4 tokens), ``--specexit --dcut auto`` with the hand-written
version-2 cost table of ``test_dcut_draft_off.py`` (draft-off cheap from batch size 2 on, so ``auto``
switches drafting off under load). Runs, switched through ``/set_internal_state``
(``sglang_ext.engine.dcut.client``): full verification (``--dcut off``) with all 40 requests in one
batch (the reference) and one request at a time; tiers 0.25 and 0.5 forced; the configured ``auto``
with 40 and with 4 requests in flight; two of every three steps draft-off, requests joining 50 ms
apart. Every run must give the reference's output ids token for token, and the reference must
exit early on most problems (otherwise the comparison proves nothing). With the per-step exit rule
of earlier versions tiers 0.5 and ``auto`` agreed on 0 of 40 problems.

The same comparison with the training-free signal (``--specexit-signal-source draft-confidence``):
``test_specexit_invariance_dc.py``.

Slow tier: a TP 2 engine (two ranks, ``SGLANG_CPU_OMP_THREADS_BIND="0|1"``) gives the same 40 outputs as
the TP 1 engine, under ``auto`` and a forced tier 0.5 (TP 2 sums its all-reduce in another order than TP 1).

Budget: CI tier ~2 min on the shared 2-core host (one engine start, nine 40-problem runs); slow tier
~1.5 min more (one TP 2 engine start, three 40-problem runs).
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from engine_utils import make_engine
from trained_models import MODELS, hand_written_table, requires_trained_models
from trained_models import held_out_prompts as _prompts

N = 40
MAX_NEW = 256
FULL = 1.0
CONFIGURED = 0.0  # dcut_force_ratio 0 / dcut_force_draft_off 0: the configured choice (auto)
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW}
BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
from dcut_throughput import _generate_refilled  # noqa: E402
from specexit_eval import DEFAULT_TUNED, preset_custom_params  # noqa: E402

TUNED = preset_custom_params(DEFAULT_TUNED)
DEFAULTS = None  # the server's SpecExit flags: the reference defaults

pytestmark = requires_trained_models


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("specexit_invariance")
    table = hand_written_table(str(tmp / "table.json"), 4, 1, 3, off_ms=[50, 1, 2])
    eng = make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                      speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                      speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                      max_total_tokens=32768, max_running_requests=64, specexit=True, dcut="auto",
                      dcut_cost_table=table, dcut_cache_dir=str(tmp / "cache"))
    try:
        yield eng
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def prompts():
    return _prompts(N)


def _generate(eng, prompts, custom, in_flight):
    """Greedy outputs of ``prompts`` with at most ``in_flight`` requests running; ``"staggered"``
    submits every request 50 ms after the previous one."""
    params = dict(GREEDY, custom_params=custom)
    if in_flight == "staggered":
        async def run():
            jobs = []
            for p in prompts:
                jobs.append(asyncio.ensure_future(eng.async_generate(input_ids=p, sampling_params=params)))
                await asyncio.sleep(0.05)
            return await asyncio.gather(*jobs)

        return eng.loop.run_until_complete(run())

    return _generate_refilled(eng, prompts, params, in_flight)  # a new request as one finishes


def _run(eng, prompts, custom, ratio, every, in_flight):
    from sglang_ext.engine.dcut.client import dcut_states, set_force_draft_off, set_force_ratio

    assert set_force_ratio(eng, ratio) and set_force_draft_off(eng, every)
    try:
        before = dcut_states(eng)[0]["metrics"]
        outs = _generate(eng, prompts, custom, in_flight)
        after = dcut_states(eng)[0]["metrics"]
    finally:
        set_force_ratio(eng, CONFIGURED)
        set_force_draft_off(eng, 0)
    hist = {k: after["tier_histogram"].get(k, 0) - before["tier_histogram"].get(k, 0)
            for k in set(before["tier_histogram"]) | set(after["tier_histogram"])}
    return outs, {k: v for k, v in hist.items() if v}


RUNS = (
    # name, dcut_force_ratio, dcut_force_draft_off, requests in flight
    ("--dcut off, one request at a time", FULL, 0, 1),
    ("tier 0.25", 0.25, 0, N),
    ("tier 0.5, 4 in flight", 0.5, 0, 4),
    ("auto", CONFIGURED, 0, N),
    ("auto, 4 in flight", CONFIGURED, 0, 4),
    ("2 of 3 steps draft-off, staggered", FULL, 3, "staggered"),
)


def _compare_with_reference(eng, prompts, custom, label=""):
    """The reference (full verification, all in one batch), then every run of ``RUNS`` against it;
    returns the reference outputs and the runs whose outputs differ."""
    ref, _ = _run(eng, prompts, custom, FULL, 0, N)
    ref_ids = [o["output_ids"] for o in ref]
    exited = sum(bool(o["meta_info"]["specexit_exited"]) for o in ref)
    assert exited >= 0.75 * N, f"only {exited} of {N} reference outputs exited early"
    failures = []
    for name, ratio, every, in_flight in RUNS:
        outs, hist = _run(eng, prompts, custom, ratio, every, in_flight)
        bad = [i for i, o in enumerate(outs) if o["output_ids"] != ref_ids[i]]
        print(f"{label}{name}: {N - len(bad)}/{N} identical, tiers {hist}")
        if bad:
            failures.append(f"{name}: {len(bad)} of {N} outputs differ (first: problem {bad[0]})")
        if ratio in (0.25, 0.5):
            assert hist.get(str(ratio), 0) > 0, (name, hist)  # the forced tier really ran
        if every:
            assert hist.get("draft_off", 0) > 0, (name, hist)
    return ref_ids, failures


@pytest.mark.parametrize("custom", [TUNED, DEFAULTS], ids=["tuned", "defaults"])
def test_same_output_under_every_dcut_setting_load_and_draft_off_pattern(engine, prompts, custom):
    _, failures = _compare_with_reference(engine, prompts, custom)
    assert not failures, failures


def compare_tp2_with_tp1(tp1, prompts, custom, start_tp2, label=""):
    """The TP 1 engine's outputs under ``auto``, then a TP 2 engine (``start_tp2()``, two ranks bound to
    one core each) under ``auto`` and tier 0.5 must give them; returns the TP 2 engine's SpecExit
    ``/server_info`` (taken before it shuts down)."""
    from sglang_ext.engine.dcut.client import set_force_ratio

    ref, _ = _run(tp1, prompts, custom, CONFIGURED, 0, N)
    ref_ids = [o["output_ids"] for o in ref]
    assert sum(bool(o["meta_info"]["specexit_exited"]) for o in ref) >= 0.75 * N
    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    try:
        tp2 = start_tp2()
    finally:
        os.environ.pop("SGLANG_CPU_OMP_THREADS_BIND", None)
    try:
        for name, ratio in (("TP 2, auto", CONFIGURED), ("TP 2, tier 0.5", 0.5)):
            assert set_force_ratio(tp2, ratio)
            outs = tp2.generate(input_ids=prompts, sampling_params=dict(GREEDY, custom_params=custom))
            bad = [i for i, o in enumerate(outs) if o["output_ids"] != ref_ids[i]]
            print(f"{label}{name}: {N - len(bad)}/{N} identical to TP 1")
            assert not bad, f"{name}: {len(bad)} of {N} outputs differ from TP 1 (first: problem {bad[0]})"
        return tp2.get_server_info()["internal_states"][0]["specexit"]
    finally:
        tp2.shutdown()


@pytest.mark.slow
def test_tp2_gives_the_same_outputs_as_tp1(engine, prompts, tmp_path):
    table = hand_written_table(str(tmp_path / "table.json"), 4, 1, 3, off_ms=[50, 1, 2])
    compare_tp2_with_tp1(engine, prompts, TUNED, lambda: make_engine(
        os.path.join(MODELS, "target"), attention_backend="torch_sdpa", tp_size=2,
        speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
        speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
        max_total_tokens=32768, max_running_requests=64, specexit=True, dcut="auto",
        dcut_cost_table=table, dcut_cache_dir=str(tmp_path / "cache")))

"""``--dcut-online-costs`` on the trained testbed models: lossless, and a wrong cost table corrected.

EAGLE3 tree (topk 4, 3 steps, 16 draft tokens; the shape where pruning pays on CPU, see
``bench/README.md``), 16 held-out problems at once (one batch of 16 for every step: all requests
are prefilled together and ``ignore_eos`` keeps them to the same length), greedy.

1. Engine 1, ``--dcut auto`` with a cost table profiled at launch for batch size 16 (online costs
   on, the default): the configured ``auto`` run gives the same tokens as full verification
   (``dcut_force_ratio`` 1.0), and ``/server_info`` shows the corrections being learned.
2. Engine 2, ``--dcut-cost-table`` = engine 1's profiled table with full verification made 8x
   cheaper than profiled, so ``auto`` on the launch-time costs would always verify in full (its
   utility beats every tier's by far). The full step is measured ~8x dearer than predicted, its
   correction grows, and auto moves to pruning tiers: the tier histogram of the last run is mostly
   pruning steps and the full column's factor is large. Outputs equal engine 1's full verification.

Large factors, no timed assertions: an 8x error against a correction band of [0.1, 10].
Budget: ~2 min (two engine starts, one with a one-row profile; four short runs).
"""

from __future__ import annotations

import json
import os

import pytest

from engine_utils import make_engine
from trained_models import MODELS, dcut_state, requires_trained_models, run_at_ratio
from trained_models import held_out_prompts as _prompts

pytestmark = requires_trained_models

BS = 16
MAX_NEW = 80
FULL = 1.0
CONFIGURED = 0.0
FULL_CHEAPER = 8.0  # engine 2's table: full verification this much cheaper than profiled
TOPK, STEPS, N = 4, 3, 16


def _launch(tmp, **dcut):
    return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                       speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                       speculative_num_steps=STEPS, speculative_eagle_topk=TOPK, speculative_num_draft_tokens=N,
                       max_total_tokens=32768, max_running_requests=BS, dcut="auto",
                       dcut_cache_dir=str(tmp / "cache"), dcut_draft_off="never", **dcut)


def test_online_costs_lossless_and_correct_a_wrong_table(tmp_path):
    from sglang_ext.engine.dcut.client import dcut_info, set_force_ratio

    prompts = _prompts(BS)
    eng = _launch(tmp_path, dcut_profile_batch_sizes="16")
    try:
        info = dcut_info(eng)
        assert info["online_costs"] == "on" and info["cost_table_info"]["source"] == "profiled"
        table = info["cost_table"]
        ref, hist = run_at_ratio(eng, prompts, FULL, MAX_NEW)
        assert set(hist) == {"full"}
        got, hist = run_at_ratio(eng, prompts, CONFIGURED, MAX_NEW)
        bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"auto with online costs: {len(bad)} of {BS} outputs differ from full verification"
        oc = dcut_state(eng)["online_costs"]
        assert oc["active"] and oc["counted"] > 0, oc
        print(f"engine 1 (profiled {table['step_ms']}): auto tiers {hist}, online costs {oc}")
    finally:
        set_force_ratio(eng, CONFIGURED)
        eng.shutdown()

    assert table["batch_sizes"] == [BS]
    wrong = dict(table)
    wrong["step_ms"] = [row[:-1] + [row[-1] / FULL_CHEAPER] for row in table["step_ms"]]
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(wrong))
    eng = _launch(tmp_path, dcut_cost_table=str(path))
    try:
        info = dcut_info(eng)
        assert info["cost_table_info"]["source"] == "file" and info["cost_table"]["step_ms"] == wrong["step_ms"]
        runs = []
        for _ in range(4):
            got, hist = run_at_ratio(eng, prompts, CONFIGURED, MAX_NEW)
            bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert not bad, f"wrong table, auto: {len(bad)} of {BS} outputs differ from full verification"
            runs.append(hist)
            pruned = sum(v for k, v in hist.items() if k != "full")
            if len(runs) >= 2 and pruned * 2 > sum(hist.values()):
                break
        oc = dcut_state(eng)["online_costs"]
        print(f"engine 2 (full {FULL_CHEAPER}x too cheap): tiers per run {runs}, online costs {oc}")
        assert runs[0].get("full", 0) > 0, f"the wrong table did not start on full verification: {runs[0]}"
        full_cell = oc["corrections"][str(BS)]["1"]
        assert full_cell["factor"] > 3.0, oc  # ~8 measured against the table
        # Once corrected, full verification is chosen only where it is no dearer than the pruned
        # tiers (on a loaded 2-core host the steps of bs 16 can come out nearly flat): otherwise
        # the planner must have left it.
        later_pruned = sum(v for h in runs[1:] for k, v in h.items() if k != "full")
        corrected = [oc["corrections"][str(BS)].get(q, {}).get("ms", table["step_ms"][0][i])
                     for i, q in enumerate(("0.25", "0.5", "0.75"))]
        assert later_pruned > 0 or full_cell["ms"] <= 1.1 * min(corrected), (runs, oc)
    finally:
        set_force_ratio(eng, CONFIGURED)
        eng.shutdown()


def test_step_clock_attributes_intervals_to_the_earlier_step(monkeypatch):
    """The runner's step clock without an engine: decode-to-decode intervals reach the corrections,
    attributed to the earlier step's (bs, column); a prefill in between, a forced ratio or a step
    outside auto drop them; the planner then plans with the corrected table."""
    from types import SimpleNamespace as NS

    import sglang_ext.engine.dcut.runner as runner_mod
    from sglang_ext.config import DCutConfig
    from sglang_ext.dcut import CostTable, CostTableKey
    from sglang_ext.engine.dcut.metrics import StepDecision
    from sglang_ext.engine.dcut.runner import DCutRunner

    key = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "test")
    table = CostTable.build(key, [4, 16], [[10.0, 20.0, 30.0, 40.0], [50.0, 60.0, 70.0, 80.0]])
    now = [0.0]  # seconds; the steps below are given in ms
    monkeypatch.setattr(runner_mod.time, "perf_counter", lambda: now[0])
    runner = DCutRunner(NS(speculative_num_draft_tokens=4, topk=1), DCutConfig(mode="auto"))
    runner.cost_table = table
    runner.reset_online_costs()
    oc = runner.online_costs
    assert oc is not None and runner.planning_table() is table

    def step(at_ms, decision=None, decode=True):
        now[0] = at_ms / 1e3
        runner.begin_step(decode)
        if decision is not None:
            runner.metrics.record(decision, None)

    def auto(bs, q):
        d = StepDecision.full(bs, 4)
        d.cost_column = q
        return d

    step(0, auto(3, 2))
    for t in range(1, 5):  # bs 3 uses the bs-4 row; steps of 90 ms against a predicted 30 ms
        step(90 * t, auto(3, 2))
    assert oc.warmup_skipped == 2 and oc.counted == 2
    assert oc.factors()[0][2] > 1.5 and oc.factors()[1] == (1.0,) * 5
    assert runner.planning_table().step_ms[0][2] > 45.0 and runner.planning_table().step_ms[0][:2] == (10.0, 20.0)
    counted = oc.counted
    step(500, None, decode=False)  # a prefill: the interval of the step before it is dropped
    step(600, auto(3, 2))
    step(690, StepDecision.full(3, 4))  # the 600 ms step counts (90 ms); this one is not auto
    step(780, auto(3, 2))  # ... so its interval is dropped
    assert oc.counted == counted + 1
    runner.set_override_ratio(0.5)  # dcut_force_ratio: decide() marks no column (checked below)
    assert not runner._observed_mode()
    runner.set_override_ratio(None)
    assert runner._observed_mode()
    step(10_000, auto(3, 2))  # an idle gap > 5 s: dropped
    assert oc.counted == counted + 1
    info = runner.online_costs_summary()
    assert info["active"] and info["corrections"]["4"]["0.75"]["factor"] > 1.5 and "16" not in info["corrections"]
    off = DCutRunner(NS(speculative_num_draft_tokens=4, topk=1), DCutConfig(mode="auto", online_costs="off"))
    off.cost_table = table
    off.reset_online_costs()
    assert off.online_costs is None and off.planning_table() is table
    assert off.online_costs_summary() == {"setting": "off", "active": False}


def test_runner_explores_a_draft_off_cost_the_table_overstates(monkeypatch):
    """The runner without an engine: the table says a draft-off step costs 12 ms at bs 4, it really
    costs 4 ms; drafted steps cost what the table says (10 ms at tier 0.25). Drafting looks better
    (0.6 against 0.33 committed tokens per ms) but not by the exploration gap, so after the dwell the
    runner runs one burst of draft-off steps, the online costs measure the row, and drafting is
    switched off at once (4 / 4.8 ms > 0.6). Without online costs it never explores."""
    from types import SimpleNamespace as NS

    import sglang_ext.engine.dcut.runner as runner_mod
    from sglang_ext.config import DCutConfig
    from sglang_ext.dcut import CostTable, CostTableKey, DraftOffParams, observe_draft_gains
    from sglang_ext.dcut.online_costs import OFF_COLUMN
    from sglang_ext.engine.dcut.metrics import StepDecision
    from sglang_ext.engine.dcut.runner import DCutRunner

    key = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "test")
    table = CostTable.build(key, [4, 16], [[10.0, 20.0, 30.0, 40.0], [50.0, 60.0, 70.0, 80.0]],
                            off_ms=[12.0, 30.0])
    now = [0.0]
    monkeypatch.setattr(runner_mod.time, "perf_counter", lambda: now[0])
    expected = [4 * 1.5, 4 * 2.0, 4 * 2.2, 4 * 2.3]  # bs + S_q: gains 0.5 / 1 / 1.2 / 1.3 per request

    def serve(online, steps=40):
        runner = DCutRunner(NS(speculative_num_draft_tokens=4, topk=1),
                            DCutConfig(mode="auto", online_costs="on" if online else "off"))
        runner.cost_table = table
        runner.reset_online_costs()
        params = runner.draft_off_params
        offs = []
        for _ in range(steps):
            runner.begin_step(True)
            off = runner.draft_off_for_step(4)
            offs.append(off)
            if off:
                decision = StepDecision.draft_off(4, 12.0, OFF_COLUMN if online else None)
            else:
                decision = StepDecision.full(4, 4)
                decision.cost_column = 0 if online else None
                runner.draft_off_state = observe_draft_gains(runner.draft_off_state, 4, expected, params)
            runner.metrics.record(decision, None)
            now[0] += (4.0 if off else 10.0) / 1e3
        return runner, offs

    runner, offs = serve(online=True)
    burst = DraftOffParams().explore_steps
    dwell = DraftOffParams().min_dwell
    assert burst >= 3  # the online costs' warm-up (2) plus at least one counted step
    # drafted until the dwell, one burst, then draft-off for good (probes aside: drafting loses)
    assert offs[:dwell] == [False] * dwell and offs[dwell:dwell + burst] == [True] * burst, offs
    assert offs[dwell + burst] is True and not runner.draft_off_state.drafting, offs
    assert runner.explore_steps == burst
    assert runner.online_costs.factor(4, OFF_COLUMN) < 0.5  # 4 ms measured against 12 predicted
    summary = runner.draft_off_summary()
    assert summary["explore_steps"] == burst and summary["exploring"] is False and summary["drafting"] is False
    runner, offs = serve(online=False)
    assert not any(offs) and runner.explore_steps == 0


def test_step_clock_fits_the_context_and_leaves_catch_up_steps_out(monkeypatch):
    """The runner without an engine: steps carry their batch's mean context (``begin_step(decode,
    context)``), whose cost grows as sqrt(context / 64); the planning table follows the context
    (the row's slope, evaluated at the step about to run). A draft-off step during which the
    worker's count of caught-up rows grew (it replayed the deferred draft extends) is not a draft-off
    cost: it is counted in ``catch_up_steps`` and leaves the draft-off cell unobserved; its time
    beyond the expected draft-off step is the switching cost's (``catch_up_cost``: rows replayed,
    extra ms), which the draft-off choice is given from the next decode step on."""
    from types import SimpleNamespace as NS

    import sglang_ext.engine.dcut.runner as runner_mod
    from sglang_ext.config import DCutConfig
    from sglang_ext.dcut import CostTable, CostTableKey
    from sglang_ext.dcut.online_costs import OFF_COLUMN
    from sglang_ext.engine.dcut.metrics import StepDecision
    from sglang_ext.engine.dcut.runner import DCutRunner

    key = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "test")
    table = CostTable.build(key, [4, 16], [[10.0, 20.0, 30.0, 40.0], [50.0, 60.0, 70.0, 80.0]],
                            off_ms=[5.0, 30.0])
    now = [0.0]
    monkeypatch.setattr(runner_mod.time, "perf_counter", lambda: now[0])
    runner = DCutRunner(NS(speculative_num_draft_tokens=4, topk=1), DCutConfig(mode="auto"))
    runner.cost_table = table
    runner.reset_online_costs()
    rows = [0]
    runner.catch_up_rows = lambda: rows[0]
    oc = runner.online_costs

    def auto(q):
        d = StepDecision.full(4, 4)
        d.cost_column = q
        return d

    ctx = 64.0
    for _ in range(120):  # tier 0 every step: 10 ms * sqrt(context / 64)
        runner.begin_step(True, ctx)
        runner.metrics.record(auto(0), None)
        now[0] += 10.0 * (ctx / 64) ** 0.5 / 1e3
        ctx += 2.0
    runner.begin_step(True, ctx)  # closes the last one; plans at ctx (302)
    assert oc.slope(4) == pytest.approx(0.5, abs=0.05)
    planned = runner.planning_table()
    assert planned.step_ms[0][0] == pytest.approx(10.0 * (ctx / 64) ** 0.5, rel=0.03)
    assert planned.step_ms[0][1] == pytest.approx(20.0 * (ctx / 64) ** 0.5, rel=0.03)  # moved along the slope
    assert planned.off_ms[0] == pytest.approx(5.0 * (ctx / 64) ** 0.5, rel=0.03)
    assert not runner._off_observed(4)
    runner.metrics.record(StepDecision.draft_off(4, 5.0, OFF_COLUMN), None)
    rows[0] += 32  # this draft-off step ran a catch-up extend over 32 deferred rows
    now[0] += 0.050
    expected_off = planned.off_ms[0]  # the draft-off step's cost at that context
    assert runner._applied_catch_up is None
    runner.begin_step(True, ctx + 1)
    assert runner.catch_up_steps == 1 and not oc.observed(4, OFF_COLUMN) and not runner._off_observed(4)
    summary = runner.online_costs_summary()
    assert summary["catch_up_steps"] == 1 and summary["catch_up_cost"]["observations"] == 1
    # one row count: the whole extra time per row, handed to the draft-off choice
    assert runner._applied_catch_up == pytest.approx((0.0, (50.0 - expected_off) / 32), rel=0.01)
    for _ in range(4):  # ordinary draft-off steps: 2 warm-up, then counted
        runner.metrics.record(StepDecision.draft_off(4, 5.0, OFF_COLUMN), None)
        now[0] += 5.0 * (ctx / 64) ** 0.5 / 1e3
        ctx += 1.0
        runner.begin_step(True, ctx)
    assert oc.observed(4, OFF_COLUMN) and runner._off_observed(4) and runner.catch_up_steps == 1

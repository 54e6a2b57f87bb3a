"""D-Cut step traces (``SGLANG_EXT_DCUT_STEP_TRACE``): the line each timed decode step writes
(``engine/dcut/metrics.py``, no SGLang import) and their summary (``bench/dcut_step_trace.py``).

Budget: < 2 s.
"""

import json
import os
import sys

import pytest

from sglang_ext.engine.dcut.metrics import STEP_TRACE_ENV, DCutMetrics, StepDecision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import dcut_step_trace as dst  # noqa: E402


def _tier(bs, tier="0.25", column=0, predicted=10.0):
    return StepDecision(bs, 16, tier, "auto", bs * 4, bs * 4, 0, predicted, pruned=True, cost_column=column)


def test_one_line_per_closed_decode_step(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_TRACE_ENV, str(tmp_path / "trace"))
    m = DCutMetrics(tiers=(0.25, 0.5, 0.75, 1.0))
    rows = {"caught_up_rows": 0}
    m.trace.context = lambda: {"forced": False, **rows}
    t = 100.0
    plan = [(_tier(4), 0.010), (_tier(4), 0.012), (StepDecision.draft_off(4, 5.0, -1), 0.004),
            (StepDecision.draft_off(4, 5.0, -1), 0.020), (_tier(4), 0.011)]
    for i, (d, dt) in enumerate(plan):
        assert m.start_step(t, decode=True) is None or i > 0
        m.record(d, None)
        if i == 3:
            rows["caught_up_rows"] = 12  # this draft-off step caught the draft up
        t += dt
    m.start_step(t, decode=False)  # a prefill: the last interval is dropped, not traced
    lines = [json.loads(x) for x in open(m.trace.path)]
    assert [x["tier"] for x in lines] == ["0.25", "0.25", "draft_off", "draft_off"]
    assert [x["ms"] for x in lines] == pytest.approx([10.0, 12.0, 4.0, 20.0])
    assert [x["column"] for x in lines] == [0, 0, -1, -1] and lines[0]["predicted_ms"] == 10.0
    assert [x["caught_up_rows"] for x in lines] == [0, 0, 0, 12]
    kinds = [k for _, k in dst.classify(lines)]
    assert kinds == ["steady", "last", "first", "catch_up"]
    summary = dst.summarize(lines)
    assert summary[(4, "draft_off")]["catch_up"] == (1, pytest.approx(20.0))
    assert summary[(4, "0.25")]["all"] == (2, pytest.approx(11.0))
    out = "\n".join(dst.format_summary(lines))
    assert "switches 1" in out and "draft_off median 2" in out


def test_unset_means_no_trace(monkeypatch):
    monkeypatch.delenv(STEP_TRACE_ENV, raising=False)
    assert DCutMetrics(tiers=(1.0,)).trace is None


def test_forced_steps_are_left_out_unless_asked(tmp_path):
    p = tmp_path / "t.1.jsonl"
    p.write_text("\n".join(json.dumps({"step": i, "bs": 2, "tier": "full", "ms": 5.0, "forced": i < 2})
                           for i in range(4)) + "\n")
    assert [len(s) for s in dst.read_trace([str(p)])] == [2]
    assert [len(s) for s in dst.read_trace([str(p)], include_forced=True)] == [4]
    assert dst.main([str(p)]) == 0

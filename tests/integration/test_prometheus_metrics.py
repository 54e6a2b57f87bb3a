"""D-Cut and SpecExit Prometheus metrics (``sglang_ext.engine.metrics``): the drift guard of the two
SGLang reporter methods they hook (``patches/prometheus_metrics.md``) and the publication logic on
SGLang's real ``prometheus_client`` registry with a stand-in reporter (no server; the launched-server
check against ``/server_info`` is in ``test_server_tools.py``).

Budget: < 60 s (imports SGLang's scheduler modules on the loaded 2-core machine; no engine).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from drift_guard import param_names as _params  # noqa: E402
from drift_guard import resolve as _resolve  # noqa: E402

LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


def test_metrics_reporter_targets():
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components import batch_result_processor as brp
    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

    from sglang_ext.engine.metrics import HOOK_IDLE_METRICS, HOOK_REPORT_DECODE

    report = _resolve(HOOK_REPORT_DECODE)
    assert _params(report) == ["self", "can_run_cuda_graph", "running_batch", "num_generated_tokens"]
    src = inspect.getsource(report)
    # SGLang's own cadence: the heavy gauges are logged every decode_log_interval decode batches
    assert "self.forward_ct_decode % self.decode_log_interval" in src
    assert "self.current_scheduler_metrics_enabled" in src
    assert _params(_resolve(HOOK_IDLE_METRICS)) == ["self"]
    assert "self.metrics_collector.log_stats(self.stats)" in inspect.getsource(_resolve(HOOK_IDLE_METRICS))
    post = inspect.getsource(SchedulerMetricsReporter.__post_init__)
    assert "self.current_scheduler_metrics_enabled" in post
    assert "self.decode_log_interval" in inspect.getsource(SchedulerMetricsReporter._init_metrics)
    # the reporter reaches the scheduler, whose speculative worker carries the runners
    assert "scheduler=self" in inspect.getsource(Scheduler.init_metrics_reporter)
    assert "self.draft_worker" in inspect.getsource(Scheduler.maybe_init_draft_worker)
    # the collector's labels are SGLang's metric labels
    assert "self.labels = labels" in inspect.getsource(SchedulerMetricsCollector.__init__)
    labels_src = inspect.getsource(SchedulerMetricsCollector.init_new)
    assert all(f'"{k}"' in labels_src for k in ("model_name", "engine_type", "tp_rank", "pp_rank"))
    # both hooked methods are called by the scheduler loop
    assert "self.metrics_reporter.report_decode_stats(" in inspect.getsource(brp)
    assert "self.metrics_reporter._maybe_log_idle_metrics()" in inspect.getsource(Scheduler.on_idle)


def _sample(name, **extra):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, {**LABELS, **extra})


class _DCutMetricsStub:
    """The slice of ``DCutMetrics`` the publisher reads (``steps`` and ``summary()``)."""

    def __init__(self, **summary):
        self.s = summary
        self.steps = summary["steps"]

    def summary(self):
        return dict(self.s)


def _dcut_summary(steps, pruned, verified, accepted, full, tiers, tau_ms=(3.0, 5.0)):
    return dict(steps=steps, pruned_steps=pruned, verified_tokens=verified, accepted_tokens=accepted,
                full_tokens=full, padded_tokens=verified, tier_histogram=tiers, keep_ratio=verified / full,
                exempt_requests={"grammar": 0, "logprobs": 1}, predicted_step_ms=tau_ms[0],
                measured_step_ms=tau_ms[1])


@pytest.fixture
def reporter():
    from sglang_ext.engine.specexit.report import SpecExitRequestReport, SpecExitStats

    stats = SpecExitStats()
    for think, reason in ((30, "signals"), (50, "signals"), (70, None)):
        r = SpecExitRequestReport(active=True, exited=reason is not None, reason=reason, think_tokens=think,
                                  skipped_tokens_estimate=12.5 if reason else None, natural_end=reason is None)
        if reason:
            stats.record_exit(r)
        stats.record_finished(r)
    dcut = SimpleNamespace(metrics=_DCutMetricsStub(**_dcut_summary(10, 4, 60, 30, 80, {"full": 6, "0.5": 4})),
                           calibration=SimpleNamespace(summary=lambda: {"tau": 2.5}))
    scheduler = SimpleNamespace(draft_worker=SimpleNamespace(dcut=dcut, specexit=SimpleNamespace(stats=stats)))
    return SimpleNamespace(scheduler=scheduler, current_scheduler_metrics_enabled=True, forward_ct_decode=0,
                           decode_log_interval=40, metrics_collector=SimpleNamespace(labels=dict(LABELS)))


def test_publish_copies_the_server_info_figures(reporter):
    from sglang_ext.engine import metrics as pm

    before = {k: _sample(f"sglang:{k}_total") or 0.0 for k in ("dcut_verify_steps", "dcut_verified_tokens")}
    assert pm.after_report_decode_stats(None, reporter) is None  # forward_ct_decode 0: a publication
    assert _sample("sglang:dcut_verify_steps_total") - before["dcut_verify_steps"] == 10
    assert _sample("sglang:dcut_verified_tokens_total") - before["dcut_verified_tokens"] == 60
    assert _sample("sglang:dcut_tier_steps_total", tier="0.5") >= 4
    assert _sample("sglang:dcut_keep_ratio") == pytest.approx(0.75)
    assert _sample("sglang:dcut_calibration_tau") == 2.5
    assert _sample("sglang:dcut_measured_step_ms") == 5.0
    assert _sample("sglang:specexit_exits_total", reason="signals") >= 2
    assert _sample("sglang:specexit_exits_total", reason="max_think_tokens") is not None  # zero series exported
    assert _sample("sglang:specexit_thinking_tokens_total") >= 150
    assert _sample("sglang:specexit_skipped_tokens_estimate_total") >= 25.0

    # the next publication advances the counters by the difference only
    steps0 = _sample("sglang:dcut_verify_steps_total")
    reporter.scheduler.draft_worker.dcut.metrics = m2 = _DCutMetricsStub(
        **_dcut_summary(10, 4, 60, 30, 80, {"full": 6, "0.5": 4}))
    m2.s.update(steps=13, tier_histogram={"full": 6, "0.5": 7})
    m2.steps = 13
    # a new DCutMetrics object counts from zero again (the profiler replaces the metrics at launch)
    pm.publish(reporter)
    assert _sample("sglang:dcut_verify_steps_total") - steps0 == 13
    # idle: nothing changed -> no publication; a changed step count -> published
    assert pm.after_maybe_log_idle_metrics("r", reporter) == "r"
    assert pm.publish(reporter, only_if_changed=True) is False
    m2.s["steps"] = m2.steps = 14
    assert pm.publish(reporter, only_if_changed=True) is True
    assert _sample("sglang:dcut_verify_steps_total") - steps0 == 14


def test_publish_skips_off_ranks_and_intervals(reporter):
    from sglang_ext.engine import metrics as pm

    reporter.forward_ct_decode = 7  # not a multiple of decode_log_interval
    marker = getattr(reporter, pm.STATE_ATTR, None)
    pm.after_report_decode_stats(None, reporter)
    assert getattr(reporter, pm.STATE_ATTR, None) is marker  # nothing published
    reporter.current_scheduler_metrics_enabled = False  # --enable-metrics off, or not the logging rank
    assert pm.publish(reporter) is False
    reporter.current_scheduler_metrics_enabled = True
    reporter.scheduler = SimpleNamespace(draft_worker=None)  # no extension worker
    assert pm.publish(reporter) is False


def test_counter_never_decreases():
    from sglang_ext.engine.metrics import _Published

    incs = []
    child = SimpleNamespace(inc=incs.append)
    state = _Published(labels={}, metrics={"c": SimpleNamespace(labels=lambda **kw: child)})
    state.advance("c", 5)
    state.advance("c", 3)  # a smaller total (never from the same source object) is not a negative step
    state.advance("c", torch.tensor(7).item())
    assert incs == [5.0, 2.0]

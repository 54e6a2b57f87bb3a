"""Prometheus metrics of D-Cut and SpecExit on SGLang's ``/metrics`` (``--enable-metrics``).

SGLang's scheduler process writes its metrics with ``prometheus_client`` in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, set by the launcher) and the HTTP server serves them all from
``/metrics``. The extension's metrics are created the same way, in the scheduler process, with
SGLang's naming (prefix ``sglang:``, counters exported with ``_total``) and SGLang's labels (the
scheduler collector's ``labels``: ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank``, ``dp_rank`` under DP, any ``--extra-metric-labels``) plus one label of their own
where a figure is split (``tier``, ``reason``).

==========================================  =======  =========================================
metric                                      type     meaning
==========================================  =======  =========================================
``sglang:dcut_verify_steps_total``          counter  verify steps D-Cut planned
``sglang:dcut_pruned_steps_total``          counter  steps that verified fewer than bs x N rows
``sglang:dcut_verified_tokens_total``       counter  target rows kept (roots included)
``sglang:dcut_accepted_tokens_total``       counter  accepted tokens (bonus included)
``sglang:dcut_full_tokens_total``           counter  rows of full verification (bs x N)
``sglang:dcut_padded_tokens_total``         counter  rows of the tier-padded forward
``sglang:dcut_tier_steps_total{tier}``      counter  steps per tier (``full``, ``0.5``, ``fallback:0.75``, ``draft_off``)
``sglang:dcut_exempt_requests_total{reason}``  counter  requests kept whole, by reason
``sglang:dcut_keep_ratio``                  gauge    verified / full rows since start
``sglang:dcut_predicted_step_ms``           gauge    mean cost-table prediction per step
``sglang:dcut_measured_step_ms``            gauge    mean wall time between decode step starts
``sglang:dcut_calibration_tau``             gauge    exponent of the calibrated scores ``s^tau``
``sglang:specexit_exits_total{reason}``     counter  early exits (``signals``, ``max_think_tokens``)
``sglang:specexit_thinking_tokens_total``   counter  think tokens of finished thinking requests
``sglang:specexit_finished_thinking_requests_total``  counter  finished requests SpecExit watched
``sglang:specexit_natural_ends_total``      counter  of those, thinking closed by the model
``sglang:specexit_skipped_tokens_estimate_total``  counter  sum of the estimated skipped tokens
==========================================  =======  =========================================

The values are the ``/server_info`` figures (``internal_states[i].dcut.metrics`` / ``.specexit``)
since start-up. Publication (see ``patches/prometheus_metrics.md``): AFTER hooks on SGLang's
``SchedulerMetricsReporter.report_decode_stats`` (every ``--decode-log-interval`` decode batches,
where SGLang itself logs its gauges, so the one host read of the accepted-token count stays off the
per-step path) and ``._maybe_log_idle_metrics`` (when the scheduler is idle and a figure changed,
so a scrape after a run reads the final values). Only schedulers whose SGLang metrics are on
publish (``current_scheduler_metrics_enabled``: attention-TP rank 0 unless
``--enable-metrics-for-all-schedulers``). Nothing is created or published without
``--enable-metrics``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

logger = logging.getLogger(__name__)

HOOK_REPORT_DECODE = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats"
HOOK_IDLE_METRICS = (
    "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter._maybe_log_idle_metrics"
)
PREFIX = "sglang:"
#: Attribute of SGLang's ``SchedulerMetricsReporter`` holding this module's :class:`_Published` state.
STATE_ATTR = "_sglang_ext_metrics"

#: counters: metric name (without ``_total``) -> (help text, ``DCutMetrics.summary()`` key)
DCUT_COUNTERS: Dict[str, Tuple[str, str]] = {
    "dcut_verify_steps": ("D-Cut verify steps.", "steps"),
    "dcut_pruned_steps": ("D-Cut verify steps that verified fewer than batch size x draft tokens rows.",
                          "pruned_steps"),
    "dcut_verified_tokens": ("Target rows D-Cut kept for verification (roots included).", "verified_tokens"),
    "dcut_accepted_tokens": ("Tokens accepted by D-Cut verify steps (bonus token included).", "accepted_tokens"),
    "dcut_full_tokens": ("Rows full verification would have verified (batch size x draft tokens).",
                         "full_tokens"),
    "dcut_padded_tokens": ("Rows of the tier-padded verify forward.", "padded_tokens"),
}
#: labelled counters: name -> (help, summary key of a {label value: count} dict, label name)
DCUT_LABELLED: Dict[str, Tuple[str, str, str]] = {
    "dcut_tier_steps": ("D-Cut verify steps per verify-size tier.", "tier_histogram", "tier"),
    "dcut_exempt_requests": ("Requests D-Cut kept whole (full draft tree), by reason.", "exempt_requests", "reason"),
}
#: gauges: name -> (help, summary key)
DCUT_GAUGES: Dict[str, Tuple[str, str]] = {
    "dcut_keep_ratio": ("Verified / full verify rows since start.", "keep_ratio"),
    "dcut_predicted_step_ms": ("Mean cost-table prediction of a verify step (ms).", "predicted_step_ms"),
    "dcut_measured_step_ms": ("Mean wall time between the starts of consecutive decode steps (ms).", "measured_step_ms"),
}
CALIBRATION_TAU = "dcut_calibration_tau"
SPECEXIT_COUNTERS: Dict[str, Tuple[str, str]] = {
    "specexit_thinking_tokens": ("Thinking tokens of finished requests SpecExit watched.", "thinking_tokens"),
    "specexit_finished_thinking_requests": ("Finished requests whose thinking phase SpecExit watched.",
                                            "finished_thinking_requests"),
    "specexit_natural_ends": ("Watched requests whose thinking the model closed itself.", "natural_ends"),
    "specexit_skipped_tokens_estimate": ("Sum of the estimated thinking tokens skipped by early exits.",
                                         "skipped_tokens_estimate_total"),
}
SPECEXIT_EXITS = "specexit_exits"

_metrics_lock = threading.Lock()
_metrics: Optional[Dict[str, Any]] = None  # name -> prometheus_client metric, created once per process
_registered = False


def _create_metrics(labelnames: Tuple[str, ...]) -> Dict[str, Any]:
    """The extension's metric objects (one set per process, as SGLang's collectors)."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            # imported here: prometheus_client must see PROMETHEUS_MULTIPROC_DIR (set by the launcher)
            from prometheus_client import Counter, Gauge

            m: Dict[str, Any] = {}
            for name, (doc, _key) in {**DCUT_COUNTERS, **SPECEXIT_COUNTERS}.items():
                m[name] = Counter(name=PREFIX + name, documentation=doc, labelnames=labelnames)
            for name, (doc, _key, label) in DCUT_LABELLED.items():
                m[name] = Counter(name=PREFIX + name, documentation=doc, labelnames=labelnames + (label,))
            m[SPECEXIT_EXITS] = Counter(name=PREFIX + SPECEXIT_EXITS, documentation="SpecExit early exits by reason.",
                                        labelnames=labelnames + ("reason",))
            for name, (doc, _key) in DCUT_GAUGES.items():
                m[name] = Gauge(name=PREFIX + name, documentation=doc, labelnames=labelnames,
                                multiprocess_mode="mostrecent")
            m[CALIBRATION_TAU] = Gauge(name=PREFIX + CALIBRATION_TAU,
                                       documentation="Exponent tau of D-Cut's calibrated draft scores s^tau "
                                                     "(1 = raw confidences).",
                                       labelnames=labelnames, multiprocess_mode="mostrecent")
            _metrics = m
        return _metrics


@dataclass
class _Published:
    """What one scheduler has published so far (counters advance by the difference)."""

    labels: Dict[str, str]
    metrics: Dict[str, Any]
    totals: Dict[Tuple[str, str], float] = field(default_factory=dict)  # (metric, label value) -> published total
    dcut_source: Optional[int] = None  # id() of the DCutMetrics object the totals came from
    specexit_source: Optional[int] = None  # id() of the SpecExitStats object
    change_marker: Optional[Tuple[Any, ...]] = None

    def advance(self, name: str, value: Optional[float], label: Optional[Tuple[str, str]] = None) -> None:
        """Bring counter ``name`` (with extra ``label`` = (name, value)) to the cumulative ``value``."""
        if value is None:
            return
        key = (name, "" if label is None else label[1])
        labels = self.labels if label is None else {**self.labels, label[0]: label[1]}
        child = self.metrics[name].labels(**labels)  # exported from its first publication on, 0 included
        delta = float(value) - self.totals.get(key, 0.0)
        if delta > 0:
            child.inc(delta)
            self.totals[key] = float(value)

    def forget(self, prefix: str) -> None:
        """A new source object (e.g. the profiler replaced the metrics): count from zero again."""
        self.totals = {k: v for k, v in self.totals.items() if not k[0].startswith(prefix)}

    def set_gauge(self, name: str, value: Optional[float]) -> None:
        if value is not None:
            self.metrics[name].labels(**self.labels).set(float(value))


def _runner(scheduler: Any, attr: str) -> Optional[Any]:
    """The ``dcut`` / ``specexit`` runner of a scheduler's speculative worker, or None."""
    return getattr(getattr(scheduler, "draft_worker", None), attr, None)


def _labels_of(reporter: Any) -> Dict[str, str]:
    collector = getattr(reporter, "metrics_collector", None)
    labels: Mapping[str, Any] = getattr(collector, "labels", None) or {}
    return {str(k): str(v) for k, v in labels.items()}


def _state(reporter: Any) -> _Published:
    state = getattr(reporter, STATE_ATTR, None)
    if state is None:
        labels = _labels_of(reporter)
        state = _Published(labels=labels, metrics=_create_metrics(tuple(labels)))
        setattr(reporter, STATE_ATTR, state)
    return state


def publish_dcut(state: _Published, runner: Any) -> None:
    """Publish one D-Cut runner's figures (``DCutMetrics.summary()``, calibration)."""
    metrics = runner.metrics
    if state.dcut_source != id(metrics):
        state.forget("dcut_")
        state.dcut_source = id(metrics)
    s = metrics.summary()
    for name, (_doc, key) in DCUT_COUNTERS.items():
        state.advance(name, s.get(key))
    for name, (_doc, key, label) in DCUT_LABELLED.items():
        for value, count in (s.get(key) or {}).items():
            state.advance(name, count, (label, str(value)))
    for name, (_doc, key) in DCUT_GAUGES.items():
        state.set_gauge(name, s.get(key))
    calibration = getattr(runner, "calibration", None)
    if calibration is not None:
        state.set_gauge(CALIBRATION_TAU, calibration.summary().get("tau"))


def publish_specexit(state: _Published, runner: Any) -> None:
    """Publish one SpecExit runner's counters (``SpecExitStats``)."""
    stats = runner.stats
    if state.specexit_source != id(stats):
        state.forget("specexit_")
        state.specexit_source = id(stats)
    s = dict(stats.as_dict())
    n = s.get("finished_thinking_requests") or 0
    mean = s.get("mean_think_tokens")
    s["thinking_tokens"] = int(round(mean * n)) if mean is not None else 0  # an integer total / n
    for name, (_doc, key) in SPECEXIT_COUNTERS.items():
        state.advance(name, s.get(key))
    for reason, count in (s.get("exits_by_reason") or {}).items():
        state.advance(SPECEXIT_EXITS, count, ("reason", str(reason)))


def _change_marker(dcut: Any, specexit: Any) -> Tuple[Any, ...]:
    """Cheap host-side fingerprint of the figures (no device read)."""
    marker: Tuple[Any, ...] = ()
    if dcut is not None:
        m = dcut.metrics
        marker += (id(m), m.steps)  # every verify step counts one (the token sums may be folded lazily)
    if specexit is not None:
        st = specexit.stats
        marker += (id(st), st.finished_thinking_requests, sum(st.exits_by_reason.values()))
    return marker


def publish(reporter: Any, only_if_changed: bool = False) -> bool:
    """Publish the scheduler's D-Cut and SpecExit figures; True when something was published."""
    if not getattr(reporter, "current_scheduler_metrics_enabled", False):
        return False
    scheduler = getattr(reporter, "scheduler", None)
    dcut, specexit = _runner(scheduler, "dcut"), _runner(scheduler, "specexit")
    if dcut is None and specexit is None:
        return False
    marker = _change_marker(dcut, specexit)
    state = _state(reporter)
    if only_if_changed and marker == state.change_marker:
        return False
    if dcut is not None:
        publish_dcut(state, dcut)
    if specexit is not None:
        publish_specexit(state, specexit)
    state.change_marker = marker
    return True


def _safe_publish(reporter: Any, only_if_changed: bool) -> None:
    try:
        publish(reporter, only_if_changed)
    except Exception as e:  # metrics must never take the scheduler down
        logger.warning("sglang_ext: Prometheus metrics not published: %s", e)


def after_report_decode_stats(result, reporter, *args, **kwargs):
    """Every ``--decode-log-interval`` decode batches (SGLang's own gauge cadence)."""
    if getattr(reporter, "current_scheduler_metrics_enabled", False):
        interval = getattr(reporter, "decode_log_interval", 1) or 1
        if getattr(reporter, "forward_ct_decode", 0) % interval == 0:
            _safe_publish(reporter, only_if_changed=False)
    return result


def after_maybe_log_idle_metrics(result, reporter, *args, **kwargs):
    """When the scheduler is idle and a figure changed since the last publication."""
    if getattr(reporter, "current_scheduler_metrics_enabled", False):
        _safe_publish(reporter, only_if_changed=True)
    return result


def register_hooks() -> None:
    """Register the two publication hooks with SGLang's ``HookRegistry`` (idempotent)."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_REPORT_DECODE, after_report_decode_stats, HookType.AFTER)
    HookRegistry.register(HOOK_IDLE_METRICS, after_maybe_log_idle_metrics, HookType.AFTER)
    _registered = True

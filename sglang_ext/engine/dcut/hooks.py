"""HookRegistry hooks of the D-Cut glue (registered from the plugin's ``register_hooks``).

=====================================================================  =====  ==========================
target                                                                 type   purpose
=====================================================================  =====  ==========================
``sglang.srt.speculative.eagle_utils.organize_draft_results``           AROUND tree path scores (draft_capture)
``sglang.srt.managers.scheduler.Scheduler.get_init_info``               AFTER  ``dcut``: table + settings
``sglang.srt.managers.scheduler.Scheduler.get_internal_state``          AFTER  ``dcut``: live metrics
``...internal_state.SchedulerInternalStateController._update_handlers``  AFTER  ``dcut_force_ratio`` knob
=====================================================================  =====  ==========================

``/set_internal_state`` with ``{"server_args": {"dcut_force_ratio": r}}`` switches the running
server to the fixed ratio ``r`` in (0, 1] (1.0 = full verification) and ``0`` back to the
configured ``--dcut`` mode (used by tests and benches to compare modes on one server);
``dcut_compact`` 0 switches to the link-cut-only oracle (full-width forward, "Route C"), 1 back
to the compacted verify; ``dcut_force_draft_off`` ``k`` runs decode steps without drafting (1: every
step, ``k >= 2``: every step but each k-th, 0: back to the configured choice); ``dcut_draft_extend`` ``"window"`` / ``"accepted"`` switches the rows of
the eager draft extend (``--dcut-draft-extend``, :mod:`sglang_ext.engine.dcut.draft_extend`);
``dcut_draft_off_extend`` ``"defer"`` / ``"always"`` the draft extend of draft-off steps
(``--dcut-draft-off-extend``, :mod:`sglang_ext.engine.dcut.deferred_extend`).

``get_init_info`` is the scheduler's start-up handshake; its dict is merged into ``/server_info``
(and ``Engine.get_server_info()``) at top level, so the cost table appears there as
``server_info["dcut"]["cost_table"]``. ``get_internal_state`` answers every ``/server_info``
request; the metrics appear as ``server_info["internal_states"][i]["dcut"]`` (with
``online_costs``: the cost-table corrections of ``--dcut-online-costs`` in use). Both are
pass-throughs when the scheduler's worker has no D-Cut runner. See ``patches/scheduler_info.md``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

HOOK_GET_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
HOOK_GET_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
HOOK_UPDATE_HANDLERS = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._update_handlers"
)
FORCE_RATIO_KEY = "dcut_force_ratio"
FORCE_DRAFT_OFF_KEY = "dcut_force_draft_off"
COMPACT_KEY = "dcut_compact"
DRAFT_EXTEND_KEY = "dcut_draft_extend"
DRAFT_OFF_EXTEND_KEY = "dcut_draft_off_extend"
SERVER_INFO_KEY = "dcut"

__all__ = ["register_hooks", "after_get_init_info", "after_get_internal_state", "dcut_runner_of",
           "SERVER_INFO_KEY"]


def dcut_runner_of(scheduler: Any) -> Optional[Any]:
    """The ``DCutRunner`` of a scheduler's speculative worker, or None."""
    worker = getattr(scheduler, "draft_worker", None)
    return getattr(worker, "dcut", None)


def after_get_init_info(result, scheduler, *args, **kwargs):
    runner = dcut_runner_of(scheduler)
    if runner is not None and isinstance(result, dict):
        result[SERVER_INFO_KEY] = runner.info(scheduler.draft_worker)
    return result


def kv_pool_state(scheduler: Any) -> dict:
    """Free / evictable / total KV slots and free request rows (the no-leak checks read these)."""
    alloc = scheduler.token_to_kv_pool_allocator
    tree = getattr(scheduler, "tree_cache", None)
    evictable = tree.evictable_size() if tree is not None and hasattr(tree, "evictable_size") else 0
    r2t = getattr(scheduler, "req_to_token_pool", None)
    return {
        "kv_available": int(alloc.available_size()),
        "kv_evictable": int(evictable),
        "kv_total": int(getattr(scheduler, "max_total_num_tokens", 0) or 0),
        "req_rows_free": None if r2t is None else len(getattr(r2t, "free_slots", [])),
        "running_requests": sum(1 for r in (getattr(getattr(scheduler, "running_batch", None), "reqs", None) or [])
                                if not r.finished()),
    }


def tier_graph_stats(scheduler: Any) -> Optional[dict]:
    """Replay counts of the per-(batch size, tier) verify graphs (``dcut_graphs``), or None when
    the target runs no ``DCutVerifyGraphRunner`` (CPU, other attention backends, graphs off)."""
    worker = getattr(scheduler, "draft_worker", None)
    model_runner = getattr(getattr(worker, "target_worker", None), "model_runner", None)
    stats = getattr(getattr(model_runner, "decode_cuda_graph_runner", None), "dcut_graph_stats", None)
    return stats() if callable(stats) else None


def draft_extend_rows_of(scheduler: Any) -> Optional[Any]:
    """The worker's ``AcceptedRowsDraftExtend`` (eager draft extend rows), or None."""
    return getattr(getattr(scheduler, "draft_worker", None), "draft_extend_rows", None)


def deferred_extend_of(scheduler: Any) -> Optional[Any]:
    """The worker's ``DeferredDraftExtend`` (draft extend of draft-off steps), or None."""
    return getattr(getattr(scheduler, "draft_worker", None), "deferred_extend", None)


def deferred_extend_stats(scheduler: Any) -> Optional[dict]:
    """Mode, held rows and counters of the deferred draft extend, or None without one."""
    deferred = deferred_extend_of(scheduler)
    return None if deferred is None else deferred.summary()


def draft_extend_stats(scheduler: Any) -> Optional[dict]:
    """Mode and counters of the accepted-rows draft extend, or None without one."""
    rows = draft_extend_rows_of(scheduler)
    return None if rows is None else {"mode": rows.mode, **rows.stats.summary()}


def after_get_internal_state(result, scheduler, *args, **kwargs):
    runner = dcut_runner_of(scheduler)
    state = getattr(result, "internal_state", None)
    if runner is not None and isinstance(state, dict):
        try:
            state[SERVER_INFO_KEY] = {"metrics": runner.metrics.summary(),
                                      "cost_table_info": dict(runner.table_info),
                                      "override_ratio": runner.override_ratio,
                                      "calibration": (None if runner.calibration is None
                                                      else runner.calibration.summary()),
                                      "tier_graphs": tier_graph_stats(scheduler),
                                      "draft_extend": draft_extend_stats(scheduler),
                                      "draft_off": runner.draft_off_summary(),
                                      "draft_off_extend": deferred_extend_stats(scheduler),
                                      "online_costs": runner.online_costs_summary(),
                                      "depth_mode": None if runner.depth is None else runner.depth.summary(),
                                      "kv_pool": kv_pool_state(scheduler)}
        except Exception as e:  # metrics must never break /server_info
            logger.warning("D-Cut metrics unavailable: %s", e)
    return result


def after_update_handlers(result, controller, *args, **kwargs):
    """Offer ``dcut_force_ratio`` to ``/set_internal_state`` when the worker runs D-Cut."""
    runner = dcut_runner_of(getattr(controller, "scheduler", None))
    if runner is None or not isinstance(result, dict):
        return result
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler as handler_cls

    def validate(key, value):
        try:
            ok = value is not None and (float(value) == 0.0 or 0.0 < float(value) <= 1.0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UpdateRejected(f"{key} must be a ratio in (0, 1], or 0 for the configured --dcut mode; got {value!r}")

    def apply(key, value):
        runner.set_override_ratio(float(value))
        logger.info("D-Cut: %s=%s (mode now %s)", key, value, runner._mode())
        return None  # a worker command, not a server arg

    def validate_compact(key, value):
        if value not in (0, 1):
            raise UpdateRejected(f"{key} must be 1 (compacted verify) or 0 (cut links only, full-width forward)")

    def apply_compact(key, value):
        runner.compact = bool(value)
        logger.info("D-Cut: %s=%s", key, value)
        return None

    def validate_draft_off(key, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UpdateRejected(f"{key} must be an integer >= 0 (0: the configured choice, 1: every step without "
                                 f"drafting, k: every step but each k-th); got {value!r}")

    def apply_draft_off(key, value):
        runner.set_force_draft_off(int(value))
        logger.info("D-Cut: %s=%s", key, value)
        return None

    result[FORCE_RATIO_KEY] = handler_cls(validate, apply)
    result[FORCE_DRAFT_OFF_KEY] = handler_cls(validate_draft_off, apply_draft_off)
    result[COMPACT_KEY] = handler_cls(validate_compact, apply_compact)

    def mode_knob(target, choices):
        """A knob that sets ``target.mode`` to one of ``choices``."""

        def validate_mode(key, value):
            if value not in choices:
                raise UpdateRejected(f"{key} must be one of {', '.join(choices)}; got {value!r}")

        def apply_mode(key, value):
            target.mode = value
            logger.info("D-Cut: %s=%s", key, value)
            return None

        return handler_cls(validate_mode, apply_mode)

    scheduler = getattr(controller, "scheduler", None)
    rows = draft_extend_rows_of(scheduler)
    if rows is not None:
        from sglang_ext.config import DRAFT_EXTEND_CHOICES

        result[DRAFT_EXTEND_KEY] = mode_knob(rows, DRAFT_EXTEND_CHOICES)
    deferred = deferred_extend_of(scheduler)
    if deferred is not None:  # rows still pending are caught up at the next draft-off step
        from sglang_ext.config import DRAFT_OFF_EXTEND_CHOICES

        result[DRAFT_OFF_EXTEND_KEY] = mode_knob(deferred, DRAFT_OFF_EXTEND_CHOICES)
    return result


def _registered(HookRegistry, target, hook) -> bool:
    return any(h is hook for _, h, _ in HookRegistry._hooks.get(target, ()))


def register_hooks() -> None:
    """Register the D-Cut / draft-capture hooks (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ext.engine.draft_capture import register_hooks as register_draft_capture_hooks

    register_draft_capture_hooks()
    from sglang_ext.engine.metrics import register_hooks as register_metrics_hooks

    register_metrics_hooks()  # D-Cut / SpecExit on /metrics (patches/prometheus_metrics.md)
    for target, hook in ((HOOK_GET_INIT_INFO, after_get_init_info),
                         (HOOK_GET_INTERNAL_STATE, after_get_internal_state),
                         (HOOK_UPDATE_HANDLERS, after_update_handlers)):
        if not _registered(HookRegistry, target, hook):
            HookRegistry.register(target, hook, HookType.AFTER)

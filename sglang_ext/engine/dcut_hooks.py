"""HookRegistry hooks of the D-Cut glue (registered from the plugin's ``register_hooks``).

=====================================================================  =====  ==========================
target                                                                 type   purpose
=====================================================================  =====  ==========================
``sglang.srt.speculative.eagle_utils.organize_draft_results``           AROUND tree path scores (draft_capture)
``sglang.srt.managers.scheduler.Scheduler.get_init_info``               AFTER  ``dcut``: table + settings
``sglang.srt.managers.scheduler.Scheduler.get_internal_state``          AFTER  ``dcut``: live metrics
=====================================================================  =====  ==========================

``get_init_info`` is the scheduler's start-up handshake; its dict is merged into ``/server_info``
(and ``Engine.get_server_info()``) at top level, so the cost table appears there as
``server_info["dcut"]["cost_table"]``. ``get_internal_state`` answers every ``/server_info``
request; the metrics appear as ``server_info["internal_states"][i]["dcut"]``. Both are
pass-throughs when the scheduler's worker has no D-Cut runner. See ``patches/scheduler_info.md``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

HOOK_GET_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
HOOK_GET_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
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
        result[SERVER_INFO_KEY] = runner.info()
    return result


def after_get_internal_state(result, scheduler, *args, **kwargs):
    runner = dcut_runner_of(scheduler)
    state = getattr(result, "internal_state", None)
    if runner is not None and isinstance(state, dict):
        try:
            state[SERVER_INFO_KEY] = {"metrics": runner.metrics.summary(),
                                      "cost_table_info": dict(runner.table_info)}
        except Exception as e:  # metrics must never break /server_info
            logger.warning("D-Cut metrics unavailable: %s", e)
    return result


def _registered(HookRegistry, target, hook) -> bool:
    return any(h is hook for _, h, _ in HookRegistry._hooks.get(target, ()))


def register_hooks() -> None:
    """Register the D-Cut / draft-capture hooks (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ext.engine.draft_capture import register_hooks as register_draft_capture_hooks

    register_draft_capture_hooks()
    for target, hook in ((HOOK_GET_INIT_INFO, after_get_init_info),
                         (HOOK_GET_INTERNAL_STATE, after_get_internal_state)):
        if not _registered(HookRegistry, target, hook):
            HookRegistry.register(target, hook, HookType.AFTER)

"""SGLang hooks of SpecExit (registered from ``plugin.register_hooks``).

=============================================================================  ======  ==================================
target                                                                         type    purpose
=============================================================================  ======  ==================================
``sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object``  AFTER   reject bad ``custom_params`` (400)
``sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class``           AROUND  per-request ``meta_info`` fields
``sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info``  AROUND  scalar ``meta_info`` values
``sglang.srt.managers.scheduler.Scheduler.get_internal_state``                  AFTER   ``/server_info`` exit counters
``sglang.srt.model_loader.utils.get_model_architecture``                        AROUND  SpecExit draft class, head check
=============================================================================  ======  ==================================

Each target is documented in ``patches/`` (``specexit_*.md``, ``model_architecture.md``)
with a drift guard in ``tests/integration/test_specexit_patches.py``. The hook functions
import SGLang lazily and do nothing when ``--specexit`` is off.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Dict, List

from sglang_ext.engine.specexit.report import META_KEYS, REPORT_ATTR

logger = logging.getLogger(__name__)

HOOK_TOKENIZED_OBJECT = "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object"
HOOK_OUTPUT_STREAMER = "sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class"
HOOK_META_INFO = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
HOOK_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
HOOK_MODEL_ARCHITECTURE = "sglang.srt.model_loader.utils.get_model_architecture"

#: Former ``architectures`` entry of the project's SpecExit drafts (``draft_models.ARCHITECTURE``,
#: ``checkpoint.LEGACY_SPECEXIT_ARCHITECTURE``); still registered. New drafts use SGLang's
#: ``LlamaForCausalLMEagle3`` (the class is chosen from the ``fc`` shape).
SPECEXIT_DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3SpecExit"

#: Key of the SpecExit counters in each scheduler's ``internal_states`` (``/server_info``).
SERVER_INFO_KEY = "specexit"


def _specexit_config(server_args: Any):
    from sglang_ext.config import get_extension_config

    return get_extension_config(server_args).specexit


# ----------------------------------------------------------------------------- custom_params
@functools.lru_cache(maxsize=8)
def _server_defaults(cfg):
    from sglang_ext.engine.specexit.runner import server_options

    return server_options(cfg)


def validate_custom_params(cfg, custom_params) -> None:
    """Raise ``ValueError`` naming the field if a request's SpecExit options are invalid.

    Examples
    --------
    >>> from sglang_ext.config import SpecExitConfig
    >>> validate_custom_params(SpecExitConfig(enabled=True), {"specexit_window": 4})
    >>> validate_custom_params(SpecExitConfig(enabled=True), {"specexit_window": 0})
    Traceback (most recent call last):
    ...
    ValueError: invalid SpecExit option custom_params['specexit_window']: must be an integer in 1..256, got 0
    """
    from sglang_ext.specexit.overrides import SpecExitOptionError, options_for_request

    if not cfg.enabled or not custom_params:
        return
    server = _server_defaults(cfg)
    try:
        options_for_request(server, custom_params, server.method)
    except SpecExitOptionError as e:
        raise ValueError(f"invalid SpecExit option {e}") from None


def _after_create_tokenized_object(result, self, *args, **kwargs):
    cfg = _specexit_config(getattr(self, "server_args", None))
    params = getattr(getattr(result, "sampling_params", None), "custom_params", None)
    validate_custom_params(cfg, params)
    return result


# ----------------------------------------------------------------------------- meta_info
def report_values(req) -> List[object]:
    """``META_KEYS`` values of one request (Nones when SpecExit never saw it)."""
    report = getattr(req, REPORT_ATTR, None)
    if report is None:
        return [False, False, None, None, None]
    return report.meta_values()


@functools.lru_cache(maxsize=None)
def streamer_class_with_specexit(base: type) -> type:
    """A subclass of SGLang's output streamer that adds :data:`META_KEYS` to every output.

    Each value is sent as a one-element list (the tokenizer side accumulates lists); the
    tokenizer hook below turns it into the scalar of the latest output.
    """

    class SpecExitOutputStreamer(base):
        __slots__ = ()
        has_additional_customized_info = True

        def build_additional_customized_info(self, reqs) -> Dict[str, list]:
            info = dict(super().build_additional_customized_info(reqs))
            values = [report_values(req) for req in reqs]
            for i, key in enumerate(META_KEYS):
                info[key] = [[v[i]] for v in values]
            return info

        def is_request_level_customized_info_key(self, key: str) -> bool:
            return key in META_KEYS or super().is_request_level_customized_info_key(key)

    SpecExitOutputStreamer.__qualname__ = SpecExitOutputStreamer.__name__ = f"SpecExit{base.__name__}"
    return SpecExitOutputStreamer


def _around_get_output_streamer_class(original_fn, self, *args, **kwargs):
    cls = original_fn(self, *args, **kwargs)
    if not _specexit_config(getattr(self, "server_args", None)).enabled:
        return cls
    if getattr(self, "rust_server", None) is not None:  # SGLang refuses extra fields on Rust egress
        return cls
    return streamer_class_with_specexit(cls)


def _around_update_request_meta_info(original_fn, self, meta_info, state, customized_info, index,
                                     finish_reason, *args, **kwargs):
    ours = [k for k in META_KEYS if k in customized_info]
    if not ours:
        return original_fn(self, meta_info, state, customized_info, index, finish_reason, *args, **kwargs)
    rest = {k: v for k, v in customized_info.items() if k not in META_KEYS}
    out = original_fn(self, meta_info, state, rest, index, finish_reason, *args, **kwargs)
    for key in ours:
        value = customized_info[key][index]
        meta_info[key] = value[-1] if isinstance(value, list) and value else value
    return out


# ----------------------------------------------------------------------------- /server_info
def specexit_runner_of(scheduler):
    """The scheduler's :class:`SpecExitRunner`, or None."""
    worker = getattr(scheduler, "draft_worker", None)
    return getattr(worker, "specexit", None)


def _after_get_internal_state(result, self, *args, **kwargs):
    runner = specexit_runner_of(self)
    state = getattr(result, "internal_state", None)
    if runner is not None and isinstance(state, dict):
        info = runner.server_info()
        info["kv_pool"] = kv_pool_usage(self)
        state[SERVER_INFO_KEY] = info
    return result


def kv_pool_usage(scheduler) -> Dict[str, Any]:
    """Free and cached token slots of the scheduler's KV pool (for leak checks).

    With no request running, ``available_tokens + evictable_tokens`` is the whole pool, and
    after ``flush_cache`` ``available_tokens`` is back to its value at start-up.
    """
    out: Dict[str, Any] = {}
    allocator = getattr(scheduler, "token_to_kv_pool_allocator", None)
    tree_cache = getattr(scheduler, "tree_cache", None)
    try:
        out["available_tokens"] = int(allocator.available_size())
    except Exception:  # pragma: no cover - allocator variants without the method
        out["available_tokens"] = None
    try:
        out["evictable_tokens"] = int(tree_cache.evictable_size())
        out["protected_tokens"] = int(tree_cache.protected_size())
    except Exception:  # pragma: no cover
        out["evictable_tokens"] = out["protected_tokens"] = None
    out["running_requests"] = len(getattr(getattr(scheduler, "running_batch", None), "reqs", None) or [])
    return out


# ----------------------------------------------------------------------------- draft class
@functools.lru_cache(maxsize=16)
def _draft_head(model_path: str):
    """:func:`checkpoint.inspect_draft` of a local checkpoint directory (None: not local / unreadable)."""
    import os

    from sglang_ext.engine.specexit.checkpoint import inspect_draft

    if not model_path or not os.path.isdir(model_path):
        return None
    try:
        return inspect_draft(model_path)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        logger.warning("SpecExit: cannot read the fc shape of %s (%s); its class is chosen without it",
                       model_path, e)
        return None


def _server_specexit():
    """The running server's SpecExit config, or None outside a server process."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return _specexit_config(get_server_args())
    except Exception:
        return None


def select_draft_class(model_config, model_cls: type, arch: str) -> type:
    """The class SGLang should build for ``model_config`` (see :func:`_around_get_model_architecture`)."""
    from sglang_ext.engine.specexit.checkpoint import HEAD_SIGNAL_SOURCE, STANDARD_EAGLE3_ARCHITECTURES, head_rows

    if arch not in STANDARD_EAGLE3_ARCHITECTURES or model_cls.__name__ != arch:
        return model_cls  # another model, or a class already replaced
    path = str(getattr(model_config, "model_path", "") or "")
    head = _draft_head(path)
    cfg = _server_specexit()
    check = (cfg is not None and cfg.enabled and cfg.signal_source == HEAD_SIGNAL_SOURCE
             and getattr(model_config, "is_draft_model", True))
    if head is not None and head.known:
        if check:  # before any weight is read; the class re-checks the loaded head
            head_rows(head.num_signals, head.recorded_method, cfg.method, where=f"the draft ({path})")
        if head.num_signals == 0:
            return model_cls
    elif not check:
        return model_cls  # weights not inspectable (e.g. a hub id not downloaded yet) and no SpecExit head wanted
    from sglang_ext.engine.specexit.draft_models import LlamaForCausalLMEagle3SpecExit

    return LlamaForCausalLMEagle3SpecExit


def _around_get_model_architecture(original_fn, model_config, *args, **kwargs):
    """Resolve SpecExit drafts: the former architecture name is registered before SGLang resolves it,
    and a standard ``LlamaForCausalLMEagle3`` checkpoint whose ``fc`` has rows beyond ``hidden_size``
    (the EAGLE3 trainers' format) gets the SpecExit draft class (SGLang's own class would reject the
    shape). With ``--specexit --specexit-signal-source head`` the head is checked against the flags
    here, before any weight is read. The architecture name SGLang sees is unchanged."""
    from sglang_ext.engine.specexit.checkpoint import LEGACY_SPECEXIT_ARCHITECTURE

    hf_config = getattr(model_config, "hf_config", None)
    if LEGACY_SPECEXIT_ARCHITECTURE in (getattr(hf_config, "architectures", None) or []):
        from sglang_ext.engine.specexit.draft_models import register_draft_models

        register_draft_models()
    model_cls, arch = original_fn(model_config, *args, **kwargs)
    return select_draft_class(model_config, model_cls, arch), arch


# ----------------------------------------------------------------------------- registration
def register_specexit_hooks() -> None:
    """Register every SpecExit hook with SGLang's ``HookRegistry`` (called once by the plugin)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_TOKENIZED_OBJECT, _after_create_tokenized_object, HookType.AFTER)
    HookRegistry.register(HOOK_OUTPUT_STREAMER, _around_get_output_streamer_class, HookType.AROUND)
    HookRegistry.register(HOOK_META_INFO, _around_update_request_meta_info, HookType.AROUND)
    HookRegistry.register(HOOK_INTERNAL_STATE, _after_get_internal_state, HookType.AFTER)
    HookRegistry.register(HOOK_MODEL_ARCHITECTURE, _around_get_model_architecture, HookType.AROUND)

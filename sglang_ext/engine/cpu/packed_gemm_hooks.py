"""Glue of the row-blocked packed GEMM (:mod:`sglang_ext.engine.cpu.packed_gemm`) into SGLang.

Two AROUND hooks, registered only when ``SGLANG_EXT_CPU_PACKED_GEMM`` is set (patches/cpu_packed_gemm.md):

* ``UnquantizedLinearMethod.apply`` -- every unquantized linear layer (QKV, output, MLP, EAGLE3
  ``fc``); a layer with LoRA or another quantization method is not an ``UnquantizedLinearMethod``.
* ``LogitsProcessor._compute_lm_head`` -- the LM head's ``hidden @ weight.T`` (target and draft),
  when the head is a plain unquantized weight without LoRA, the hidden states are fp32 like the
  weight and there is no embedding bias.

Anything else (other dtypes, GPU tensors, more rows than the bound) goes to SGLang's own code.
An AFTER hook on ``Scheduler.get_internal_state`` puts the counters in ``/server_info``
(``internal_states[i]["cpu_packed_gemm"]``: rows, min_rows, max_rows, packed_layers, blocked_calls,
fallback_calls).
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang_ext.engine.cpu.packed_gemm import PackedLinearCache, mkl_packed_available, settings_from_env

logger = logging.getLogger(__name__)

HOOK_LINEAR_APPLY = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
HOOK_LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
HOOK_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
SERVER_INFO_KEY = "cpu_packed_gemm"
UNQUANTIZED_HEAD_METHODS = ("UnquantizedEmbeddingMethod",)
"""``lm_head.quant_method`` class names whose head is a plain weight (else SGLang's path)."""

_cache: Optional[PackedLinearCache] = None


def _around_linear_apply(original_fn, self, layer, x, bias=None):
    c = _cache
    if c is None:
        return original_fn(self, layer, x, bias)
    return c.linear(layer, x, layer.weight, bias)


def _plain_head(lm_head) -> bool:
    if hasattr(lm_head, "set_lora") or not hasattr(lm_head, "weight"):
        return False
    method = getattr(lm_head, "quant_method", None)
    return method is None or type(method).__name__ in UNQUANTIZED_HEAD_METHODS


def _around_compute_lm_head(original_fn, self, hidden_states, lm_head, embedding_bias=None, **kwargs):
    c = _cache
    if (c is None or embedding_bias is not None or not _plain_head(lm_head)
            or getattr(self, "use_fp32_lm_head", False) or getattr(self, "rl_on_policy_target", None) is not None
            or hidden_states.dtype != lm_head.weight.dtype):
        return original_fn(self, hidden_states, lm_head, embedding_bias, **kwargs)
    return c.linear(lm_head, hidden_states, lm_head.weight)


def server_info(c: PackedLinearCache) -> dict:
    """The counters shown in ``/server_info`` under :data:`SERVER_INFO_KEY`."""
    s = c.settings
    return {"rows": s.rows, "min_rows": s.min_rows, "max_rows": s.max_rows, "packed_layers": c.packed_layers,
            "blocked_calls": c.blocked_calls, "fallback_calls": c.fallback_calls}


def _after_get_internal_state(result, self, *args, **kwargs):
    state = getattr(result, "internal_state", None)
    if _cache is not None and isinstance(state, dict):
        state[SERVER_INFO_KEY] = server_info(_cache)
    return result


def register(env=None) -> bool:
    """Register both hooks when the environment asks for the packed GEMM; returns whether it did.

    A bad value raises ValueError naming the variable; a torch without MKL's packed ops logs a
    warning and leaves SGLang's linear layers as they are."""
    global _cache
    settings = settings_from_env(env)
    if not settings.enabled:
        return False
    import torch

    if torch.cuda.is_available():
        logger.warning("sglang_ext: SGLANG_EXT_CPU_PACKED_GEMM=%d ignored: a CUDA device is present (the packed "
                       "GEMM is for fp32 serving on CPU)", settings.rows)
        return False
    if not mkl_packed_available():
        logger.warning("sglang_ext: SGLANG_EXT_CPU_PACKED_GEMM=%d ignored: this torch build has no MKL packed "
                       "GEMM (torch.ops.mkl._mkl_reorder_linear_weight)", settings.rows)
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _cache = PackedLinearCache(settings)
    HookRegistry.register(HOOK_LINEAR_APPLY, _around_linear_apply, HookType.AROUND)
    HookRegistry.register(HOOK_LM_HEAD, _around_compute_lm_head, HookType.AROUND)
    HookRegistry.register(HOOK_INTERNAL_STATE, _after_get_internal_state, HookType.AFTER)
    return True

"""Drift guards of the packed-GEMM hooks (patches/cpu_packed_gemm.md): the hooked SGLang functions
still have the parameters the hooks pass on and still compute what the hooks replace."""

from __future__ import annotations

import inspect

from drift_guard import param_names, resolve

from sglang_ext.engine.cpu.packed_gemm_hooks import (
    HOOK_INTERNAL_STATE,
    HOOK_LINEAR_APPLY,
    HOOK_LM_HEAD,
    UNQUANTIZED_HEAD_METHODS,
)


def test_linear_apply_target():
    fn = resolve(HOOK_LINEAR_APPLY)
    assert param_names(fn) == ["self", "layer", "x", "bias"]
    # the plain path the hook replaces: F.linear of the layer's own weight
    assert "return F.linear(x, layer.weight, bias)" in inspect.getsource(fn)


def test_lm_head_target():
    fn = resolve(HOOK_LM_HEAD)
    assert param_names(fn) == ["self", "hidden_states", "lm_head", "embedding_bias", "out"]
    src = inspect.getsource(fn)
    # the plain head is hidden @ weight.T; the fields the hook checks before taking it over
    assert "lm_head.weight.T" in src and "use_fp32_lm_head" in src and "rl_on_policy_target" in src
    import sglang.srt.layers.logits_processor as lp

    assert set(UNQUANTIZED_HEAD_METHODS) <= set(lp._UNQUANTIZED_LM_HEAD_METHODS)


def test_internal_state_target():
    fn = resolve(HOOK_INTERNAL_STATE)
    assert param_names(fn)[0] == "self"
    assert "internal_state" in inspect.getsource(fn)

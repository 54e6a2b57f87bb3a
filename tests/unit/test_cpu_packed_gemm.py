"""The row-blocked packed GEMM (sglang_ext/engine/cpu/packed_gemm.py), without SGLang."""

import pytest
import torch
import torch.nn.functional as F

from sglang_ext.engine.cpu.packed_gemm import (
    ENV_MAX_ROWS,
    ENV_MIN_ROWS,
    ENV_ROWS,
    PackedGemmSettings,
    PackedLinearCache,
    blocked_linear,
    can_pack,
    mkl_packed_available,
    pack_weight,
    settings_from_env,
)

needs_mkl = pytest.mark.skipif(not mkl_packed_available(), reason="torch without MKL packed GEMM")


def test_settings_parse_and_refuse_bad_values():
    assert settings_from_env({}) == PackedGemmSettings()
    assert not settings_from_env({ENV_ROWS: "0"}).enabled
    s = settings_from_env({ENV_ROWS: "4"})
    assert s.enabled and s.rows == 4 and s.max_rows == 4 and s.min_rows == 4
    assert settings_from_env({ENV_ROWS: " 8 ", ENV_MAX_ROWS: "24", ENV_MIN_ROWS: "2"}) == PackedGemmSettings(8, 24, 2)
    with pytest.raises(ValueError, match=ENV_ROWS):
        settings_from_env({ENV_ROWS: "four"})
    with pytest.raises(ValueError, match=ENV_ROWS):
        settings_from_env({ENV_ROWS: "-1"})
    with pytest.raises(ValueError, match=ENV_MAX_ROWS):
        settings_from_env({ENV_ROWS: "8", ENV_MAX_ROWS: "4"})
    for bad in ("0", "17"):
        with pytest.raises(ValueError, match=ENV_MIN_ROWS):
            settings_from_env({ENV_ROWS: "4", ENV_MIN_ROWS: bad})


@needs_mkl
@pytest.mark.parametrize("rows", [1, 3, 4, 8])
def test_blocked_rows_are_independent_of_the_batch_and_match_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    # a shape where MKL's plain sgemm changes its blocking with the row count
    w = torch.randn(896, 384, generator=g) * 0.05
    b = torch.randn(896, generator=g)
    x = torch.randn(3 * rows + 2, 384, generator=g)
    pw = pack_weight(w, rows)
    full = blocked_linear(x, pw, b)
    torch.testing.assert_close(full, F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    for start, stop in ((0, 1), (1, 2), (0, rows), (2, 2 + rows + 1), (rows - 1, 3 * rows + 2)):
        part = blocked_linear(x[start:stop], pw, b)
        assert torch.equal(part, full[start:stop]), (start, stop)
    # a row's result does not depend on the other rows' values either
    y = x.clone()
    y[1:] = torch.randn(y.shape[0] - 1, 384, generator=g)
    assert torch.equal(blocked_linear(y, pw, b)[0], full[0])
    assert blocked_linear(x[:0], pw, b).shape == (0, 896)


@needs_mkl
def test_cache_routes_by_rows_dtype_and_grad_and_repacks_a_modified_weight():
    lin = torch.nn.Linear(64, 48)
    cache = PackedLinearCache(PackedGemmSettings(rows=4, max_rows=8, min_rows=2))
    x = torch.randn(10, 64)
    with torch.no_grad():
        one = cache.linear(lin, x[:1], lin.weight, lin.bias)  # 1 row < min_rows: F.linear
        assert cache.fallback_calls == 1 and cache.blocked_calls == 0 and cache.packed_layers == 0
        assert torch.equal(one, F.linear(x[:1], lin.weight, lin.bias))
        cache.fallback_calls = 0
        out = cache.linear(lin, x[:3], lin.weight, lin.bias)
        assert cache.blocked_calls == 1 and cache.packed_layers == 1
        torch.testing.assert_close(out, lin(x[:3]), rtol=1e-5, atol=1e-5)
        cache.linear(lin, x[:8].view(2, 4, 64), lin.weight, lin.bias)  # 3-D input: 8 rows, blocked
        assert cache.blocked_calls == 2
        big = cache.linear(lin, x, lin.weight, lin.bias)  # 10 rows > max_rows: F.linear
        assert cache.fallback_calls == 1 and torch.equal(big, F.linear(x, lin.weight, lin.bias))
        cache.linear(lin, x[:2].double(), lin.weight.double(), None)  # not fp32
        assert cache.fallback_calls == 2
        lin.weight.mul_(2.0)  # in-place change: the packed copy is stale
        again = cache.linear(lin, x[:3], lin.weight, lin.bias)
        assert cache.packed_layers == 2
        torch.testing.assert_close(again, F.linear(x[:3], lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    cache.linear(lin, x[:2], lin.weight, lin.bias)  # grad enabled (training): SGLang never is
    assert cache.fallback_calls == 3


def test_only_fp32_cpu_matrices_are_packed():
    assert not can_pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert not can_pack(torch.zeros(4))
    with pytest.raises(ValueError, match="float32"):
        pack_weight(torch.zeros(4, 4, dtype=torch.float64), 4)

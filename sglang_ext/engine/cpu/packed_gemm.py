"""Row-blocked packed GEMM for linear layers on CPU: a verify of a few tokens at decode's price.

Why: on x86 CPUs torch's fp32 ``F.linear`` (MKL sgemm) costs about the same for 1, 2 or 3 input
rows but about twice as much from 4 rows on (measured on the 1536 x 8960 projection of
Qwen2.5-1.5B, ``bench/cpu_packed_gemm.py``): a speculative verify of 4-8 tokens pays most of the
extra step the draft was meant to save. MKL's packed GEMM (``torch.ops.mkl._mkl_reorder_linear_weight``
+ ``torch.ops.mkl._mkl_linear``) reorders the weight once for a fixed row count ``P``; at exactly ``P``
rows it runs at close to the one-row price.

What: every input of ``min_rows <= m <= max_rows`` rows (default: exactly ``P``) is computed in
blocks of exactly ``P`` rows (the last one zero-padded) against the weight packed for ``P``. Fewer rows (a decode step at
batch size 1, a one-row draft step) keep ``F.linear``, which is cheaper there than a padded block;
more rows (prefill chunks, large batches) too, where a larger GEMM is already efficient. Within
the blocked path a row's result does not depend on how many rows share the call (a row's output
depends only on that row: padding rows are separate rows of the GEMM, and every block runs the
same kernel); with ``min_rows = 1`` that holds for every small input, so a token's logits are
bit-identical whether it is decoded alone or verified among drafts -- plain ``F.linear`` does not
have that property (its first row at ``m = 2`` differs from ``m = 1`` in the last bits).

Switched on per process by ``SGLANG_EXT_CPU_PACKED_GEMM=P`` (``P`` rows per block; unset or 0:
off); ``SGLANG_EXT_CPU_PACKED_GEMM_MIN_ROWS`` (default ``P``) and ``..._MAX_ROWS`` (default
``DEFAULT_MAX_BLOCKS * P``) bound the blocked path. fp32 weights only (MKL's packed sgemm); other dtypes and non-CPU tensors keep
``F.linear``. The packed copy is kept beside the original weight (about 1.24x its size: memory
for the weights roughly 2.2x) and is rebuilt when the weight is modified in place. Pure torch:
no SGLang import (the glue is in :mod:`sglang_ext.engine.cpu.packed_gemm_hooks`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

ENV_ROWS = "SGLANG_EXT_CPU_PACKED_GEMM"
ENV_MIN_ROWS = "SGLANG_EXT_CPU_PACKED_GEMM_MIN_ROWS"
ENV_MAX_ROWS = "SGLANG_EXT_CPU_PACKED_GEMM_MAX_ROWS"
PACKED_OFF = 0
"""``rows`` of the switched-off setting."""
DEFAULT_MAX_BLOCKS = 1
"""Default bound of the blocked path, in blocks: ``max_rows = DEFAULT_MAX_BLOCKS * rows``. Two
blocks cost about twice one (bench/cpu_packed_gemm.py), no less than ``F.linear`` of as many rows."""


@dataclass(frozen=True)
class PackedGemmSettings:
    """The process's packed-GEMM setting (:func:`settings_from_env`)."""

    rows: int = PACKED_OFF  # rows per block (P); PACKED_OFF = off
    max_rows: int = 0  # inputs with more rows use F.linear
    min_rows: int = 0  # inputs with fewer rows use F.linear

    @property
    def enabled(self) -> bool:
        return self.rows != PACKED_OFF


def settings_from_env(env: Optional[Mapping[str, str]] = None) -> PackedGemmSettings:
    """Read :data:`ENV_ROWS`, :data:`ENV_MIN_ROWS`, :data:`ENV_MAX_ROWS`; ValueError names the
    variable on a bad value.

    Examples
    --------
    >>> settings_from_env({}), settings_from_env({"SGLANG_EXT_CPU_PACKED_GEMM": "4"})
    (PackedGemmSettings(rows=0, max_rows=0, min_rows=0), PackedGemmSettings(rows=4, max_rows=4, min_rows=4))
    >>> settings_from_env({"SGLANG_EXT_CPU_PACKED_GEMM": "8", "SGLANG_EXT_CPU_PACKED_GEMM_MAX_ROWS": "8",
    ...                    "SGLANG_EXT_CPU_PACKED_GEMM_MIN_ROWS": "1"})
    PackedGemmSettings(rows=8, max_rows=8, min_rows=1)
    """
    env = os.environ if env is None else env
    rows = _int_var(env, ENV_ROWS, str(PACKED_OFF))
    if rows < 0:
        raise ValueError(f"{ENV_ROWS}: rows per block must be >= 0 (0 = off), got {rows}")
    if rows == PACKED_OFF:
        return PackedGemmSettings()
    max_rows = _int_var(env, ENV_MAX_ROWS, str(DEFAULT_MAX_BLOCKS * rows))
    if max_rows < rows:
        raise ValueError(f"{ENV_MAX_ROWS}: must be >= {ENV_ROWS} ({rows}), got {max_rows}")
    min_rows = _int_var(env, ENV_MIN_ROWS, str(rows))
    if not 1 <= min_rows <= max_rows:
        raise ValueError(f"{ENV_MIN_ROWS}: must be in [1, {ENV_MAX_ROWS} ({max_rows})], got {min_rows}")
    return PackedGemmSettings(rows=rows, max_rows=max_rows, min_rows=min_rows)


def _int_var(env: Mapping[str, str], name: str, default: str) -> int:
    text = env.get(name, default).strip() or default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {text!r}") from None


def mkl_packed_available() -> bool:
    """Whether this torch build has MKL's packed GEMM ops."""
    try:
        return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


def can_pack(weight: torch.Tensor) -> bool:  # [out_features, in_features]
    """Whether :func:`pack_weight` takes this weight (2-D fp32 on CPU, MKL present)."""
    return weight.dim() == 2 and weight.dtype == torch.float32 and weight.device.type == "cpu" and mkl_packed_available()


@dataclass
class PackedWeight:
    """A weight reordered by MKL for blocks of ``rows`` input rows."""

    packed: torch.Tensor  # MKL's opaque reordered buffer
    shape_view: torch.Tensor  # [out_features, in_features], stride 0: gives the op the output width, no memory
    rows: int
    version: int  # the source weight's in-place version counter when packed


def pack_weight(weight: torch.Tensor, rows: int) -> PackedWeight:  # weight: [out_features, in_features]
    """Reorder ``weight`` for blocks of ``rows`` rows."""
    if not can_pack(weight):
        raise ValueError(f"packed GEMM needs a 2-D float32 CPU weight with MKL, got {tuple(weight.shape)} "
                         f"{weight.dtype} on {weight.device}")
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    w = weight.detach().contiguous()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    shape_view = torch.zeros((), dtype=w.dtype).expand(w.shape[0], w.shape[1])
    return PackedWeight(packed=packed, shape_view=shape_view, rows=rows, version=weight._version)


def blocked_linear(
    x: torch.Tensor,  # [num_rows, in_features]
    pw: PackedWeight,
    bias: Optional[torch.Tensor] = None,  # [out_features]
) -> torch.Tensor:  # [num_rows, out_features]
    """``x @ W.T (+ bias)`` in blocks of exactly ``pw.rows`` rows (the last zero-padded).

    A row's result does not depend on ``num_rows`` nor on the other rows.

    Examples
    --------
    >>> if mkl_packed_available():
    ...     w = torch.randn(64, 32); x = torch.randn(5, 32); pw = pack_weight(w, 4)
    ...     y = blocked_linear(x, pw)
    ...     ok = torch.allclose(y, x @ w.T, atol=1e-5) and torch.equal(blocked_linear(x[2:3], pw), y[2:3])
    ... else:
    ...     ok = True
    >>> ok
    True
    """
    m, k = x.shape
    p = pw.rows
    n = pw.shape_view.shape[0]
    if m == 0:
        out = x.new_empty(0, n)
    else:
        blocks = -(-m // p)
        if blocks * p != m:
            xp = x.new_zeros(blocks * p, k)
            xp[:m] = x
        else:
            xp = x.contiguous()
        if blocks == 1:
            out = torch.ops.mkl._mkl_linear(xp, pw.packed, pw.shape_view, None, p)
        else:
            out = torch.cat([torch.ops.mkl._mkl_linear(xp[b * p:(b + 1) * p], pw.packed, pw.shape_view, None, p)
                             for b in range(blocks)])
        if blocks * p != m:
            out = out[:m]
    if bias is not None:
        out = out + bias
    return out


class PackedLinearCache:
    """Packs weights on first use and routes each call: blocked packed GEMM or ``F.linear``.

    One instance per process; the packed weights live on the modules (attribute
    :data:`MODULE_ATTR`) so they go away with the model.
    """

    MODULE_ATTR = "_sglang_ext_packed_weight"

    def __init__(self, settings: PackedGemmSettings):
        self.settings = settings
        self.packed_layers = 0
        self.blocked_calls = 0
        self.fallback_calls = 0

    def packed_for(self, module: torch.nn.Module, weight: torch.Tensor) -> Optional[PackedWeight]:
        """The module's packed weight (made or remade now if missing or stale); None if it cannot be packed."""
        pw = getattr(module, self.MODULE_ATTR, None)
        if pw is not None and pw.version == weight._version:
            return pw
        if not can_pack(weight):
            return None
        pw = pack_weight(weight, self.settings.rows)
        setattr(module, self.MODULE_ATTR, pw)
        self.packed_layers += 1
        if self.packed_layers == 1:
            logger.info("sglang_ext: packed GEMM on for fp32 CPU linear layers: blocks of %d rows, for %d to %d rows",
                        self.settings.rows, self.settings.min_rows, self.settings.max_rows)
        return pw

    def linear(
        self,
        module: torch.nn.Module,
        x: torch.Tensor,  # [..., in_features]
        weight: torch.Tensor,  # [out_features, in_features]
        bias: Optional[torch.Tensor] = None,  # [out_features]
    ) -> torch.Tensor:  # [..., out_features]
        """``F.linear(x, weight, bias)``, through :func:`blocked_linear` when the input has
        ``min_rows`` to ``max_rows`` rows, is fp32 on CPU outside autograd and the weight can be packed."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        s = self.settings
        if (0 < rows and s.min_rows <= rows <= s.max_rows and x.dtype == torch.float32 and x.device.type == "cpu"
                and not torch.is_grad_enabled()):
            pw = self.packed_for(module, weight)
            if pw is not None:
                self.blocked_calls += 1
                out = blocked_linear(x.reshape(rows, x.shape[-1]), pw, bias)
                return out.view(*x.shape[:-1], out.shape[-1])
        self.fallback_calls += 1
        return F.linear(x, weight, bias)

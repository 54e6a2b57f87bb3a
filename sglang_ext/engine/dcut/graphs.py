"""One target-verify CUDA graph per (batch size, tier) for D-Cut's compacted verify steps.

A D-Cut step verifies only the kept draft nodes: its TARGET_VERIFY forward is ragged
(``spec_info.ragged_verify_layout``, ``W`` rows = kept rows plus D-Cut's own pad rows, see
``dcut_glue.TargetForwardInterceptor``). SGLang's ``DecodeCudaGraphRunner`` only replays the
uniform width ``bs * N`` (``can_run_graph`` rejects ``num_tokens_per_req != N``), so without this
module every compacted step runs eagerly on GPU. :class:`DCutVerifyGraphRunner` (built by
:func:`dcut_verify_graph_runner_class`) is a ``DecodeCudaGraphRunner`` subclass that

* captures SGLang's uniform graphs unchanged (``super()``), then, in the same capture session and
  memory pool, one extra TARGET_VERIFY graph per :class:`TierGraphKey` ``(bs, T)`` with
  ``T = bs + keep_count(bs, N, rho)`` for every configured tier ``rho < 1`` and every captured
  ``bs`` (:func:`tier_graph_keys`). Each capture goes through SGLang's own ``capture_one_shape``;
  only ``capture_prepare`` (``T`` rows, a ragged capture layout, an all-true mask for trees) and
  the graph key (``ShapeKey(size=T, attention_variant="dcut_tier:<bs>x<T>:<mask|causal>")``) are
  overridden. The ``flashinfer_dcut`` backend plans its ``(bs, T)`` wrapper at that capture;
* accepts a compacted step in ``can_run_graph`` when some captured key fits it
  (:meth:`TierGraphTable.lookup`: the smallest ``T >= W``, then the smallest ``bs >= raw bs``,
  same mask kind), else returns False (eager fallback, counted);
* replays it by padding (``load_batch``): SGLang's buffer registry copies the ``W`` live rows and
  resets the tail (rows ``W..T``: position 0, ``out_cache_loc`` 0 = the sink slot, so padding rows
  write their KV nowhere that is ever read; requests ``raw_bs..bs``: ``seq_len`` = the fill value,
  request row 0); the layout is padded with zero-row requests (:func:`pad_ragged_layout`: no query
  rows, no mask cells, their ``seq_len_fill_value`` keys are never attended) and the backend
  re-plans the ``(bs, T)`` wrapper from that padded view outside the graph. Rows past
  ``qo_indptr[-1]`` form the plan's padding request (``flashinfer_dcut.PAD_REQUESTS``: sink keys
  only); ``execute`` returns the first ``W`` rows and the D-Cut scatter-back drops D-Cut's own
  pad rows. All tier graphs plan into one shared set of fixed buffers
  (``flashinfer_dcut.SharedGraphBuffers``, SGLang's own graph buffers when large enough), reserved
  before the first tier capture.

The runner is selected by an AROUND hook on ``ModelRunner._decode_cuda_graph_runner_cls``
(:func:`register_hooks`, ``patches/dcut_graph_runner.md``) only for the target model runner of a
speculative server with ``--dcut`` on whose attention backend is ``flashinfer_dcut``; setting
``SGLANG_EXT_DCUT_TIER_GRAPHS=0`` keeps SGLang's runner. Configurations it does not handle (LoRA,
PDMux, two-batch overlap, DP/MLP sync, PP, attention graph variants, a non-``full`` graph backend,
SGLang's own ragged mode, hisparse, encoder-decoder, sliding-window / cross-attention models with
more than one FlashInfer wrapper) capture no tier graph (:func:`tier_graph_unsupported_reason`,
logged; a warning for the wrapper count, where the backend also keeps D-Cut at full width):
compacted steps then run eagerly as before.

Worked example (N = 4, tiers 0.25 / 0.5 / 0.75 / 1.0, captured bs [1, 2, 4])::

    tier graphs (T, bs)      (1,1) (2,1) (3,1) | (2,2) (4,2) (6,2) | (4,4) (8,4) (12,4)
    live step: 3 requests, W = 5 rows (kept counts [2, 1, 1] + 1 D-Cut pad row)
    lookup(3, 5)             -> (T=8, bs=4): smallest T >= 5 with bs >= 3
    padded qo_indptr         [0, 2, 3, 4, 4]       request 3 has no rows
    rows 5..7                position 0, out_cache_loc 0 (sink), outputs dropped

Everything above the ``SGLang`` section is pure (torch, ``sglang_ext.dcut`` and the pure part of
``flashinfer_verify``; no SGLang import) and unit-tested on CPU (``tests/unit/test_dcut_graph_shapes.py``);
the runner's replay path is tested on CPU with SGLang's real buffer registry, replay view and the
``flashinfer_dcut`` planning (``tests/integration/test_dcut_graph_patches.py``); the padded replay
of a ``(bs, T)`` FlashInfer graph wrapper is part (a2) of ``tests/gpu/run_gpu_checks.py``.

GPU status: written for SGLang 0.5.23 / flashinfer-python 0.7.2 and **never run on a GPU** (no CUDA
graph has been captured or replayed by this runner yet).
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from sglang_ext.dcut.tiers import DEFAULT_TIERS
from sglang_ext.engine.attention.flashinfer_dcut import capture_counts, verify_graph_shapes

logger = logging.getLogger(__name__)

__all__ = [
    "TIER_GRAPH_VARIANT",
    "TIER_GRAPHS_ENV",
    "TierGraphKey",
    "TierGraphTable",
    "PaddedLayout",
    "tier_graph_keys",
    "pad_ragged_layout",
    "capture_layout",
    "capture_mask",
    "tier_graph_unsupported_reason",
    "log_unsupported",
    "tier_graphs_enabled",
    "HOOK_DECODE_GRAPH_RUNNER_CLS",
    "dcut_verify_graph_runner_class",
    "select_graph_runner_class",
    "register_hooks",
]

TIER_GRAPH_VARIANT = "dcut_tier"
"""Prefix of the ``ShapeKey.attention_variant`` of a tier graph (keeps its key apart from the
uniform graph whose ``size`` (a batch size) may equal a tier's row count)."""
TIER_GRAPHS_ENV = "SGLANG_EXT_DCUT_TIER_GRAPHS"
"""Environment variable: ``0`` keeps SGLang's own decode graph runner (compacted steps run eagerly)."""


# ============================================================================= pure part
@dataclass(frozen=True, order=True)
class TierGraphKey:
    """One captured tier graph: ``num_tokens`` (``T``) query rows over ``batch_size`` requests.

    ``masked`` is the attention kind the graph's FlashInfer wrapper was built for: a custom tree
    mask (EAGLE; D-Cut always passes the compacted mask) or causal (DFlash chains, no mask). The
    field order makes keys sort by ``T``, then ``bs``.

    Examples
    --------
    >>> TierGraphKey(8, 4, True).variant
    'dcut_tier:4x8:mask'
    """

    num_tokens: int
    batch_size: int
    masked: bool

    @property
    def variant(self) -> str:
        """``ShapeKey.attention_variant`` of this graph."""
        return f"{TIER_GRAPH_VARIANT}:{self.batch_size}x{self.num_tokens}:{'mask' if self.masked else 'causal'}"


def tier_graph_keys(
    batch_sizes: Iterable[int],
    num_draft_tokens: int,
    tiers: Sequence[float] = DEFAULT_TIERS,
    masked: bool = True,
) -> List[TierGraphKey]:
    """Tier graphs to capture for these capture batch sizes: one per distinct ``(bs, T)``, ``T < bs * N``.

    ``T = bs + keep_count(bs, N, rho)`` (``flashinfer_verify.verify_graph_shapes``). The full width
    ``T = bs * N`` is left out: D-Cut compacts a step only when it prunes something, so a compacted
    step never has ``bs * N`` rows of its own batch size (a wider one is served by a larger ``bs``'s
    tier graph or runs eagerly). Returned sorted by ``(T, bs)``.

    Examples
    --------
    >>> [(k.batch_size, k.num_tokens) for k in tier_graph_keys([1, 2], 4)]
    [(1, 1), (1, 2), (2, 2), (1, 3), (2, 4), (2, 6)]
    >>> tier_graph_keys([1], 1)  # one verify row per request: nothing to prune
    []
    """
    n = int(num_draft_tokens)
    keys = {
        TierGraphKey(s.num_tokens, s.batch_size, bool(masked))
        for s in verify_graph_shapes(sorted({int(b) for b in batch_sizes}), n, tiers)
        if s.num_tokens < s.batch_size * n
    }
    return sorted(keys)


class TierGraphTable:
    """The captured tier graphs, looked up per step on the host (no device sync).

    Examples
    --------
    >>> t = TierGraphTable(tier_graph_keys([1, 2, 4], 4))
    >>> t.lookup(3, 5, True)
    TierGraphKey(num_tokens=8, batch_size=4, masked=True)
    >>> t.lookup(2, 4, True), t.lookup(2, 4, False), t.lookup(4, 13, True)
    (TierGraphKey(num_tokens=4, batch_size=2, masked=True), None, None)
    """

    def __init__(self, keys: Iterable[TierGraphKey] = ()):
        self._keys: Tuple[TierGraphKey, ...] = tuple(sorted(set(keys)))
        self._tokens = [k.num_tokens for k in self._keys]

    @property
    def keys(self) -> Tuple[TierGraphKey, ...]:
        return self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def lookup(self, batch_size: int, num_tokens: int, masked: bool) -> Optional[TierGraphKey]:
        """Graph for a compacted step of ``batch_size`` requests and ``num_tokens`` rows (``W``).

        The smallest captured ``T >= W`` (the forward's cost is mostly its row count), then the
        smallest ``bs >= batch_size`` at that ``T`` (padding requests have no rows), of the same
        mask kind. ``None``: no graph fits, the step runs eagerly.
        """
        i = bisect.bisect_left(self._tokens, int(num_tokens))
        for k in self._keys[i:]:
            if k.masked == bool(masked) and k.batch_size >= int(batch_size):
                return k
        return None


@dataclass(frozen=True)
class PaddedLayout:
    """Ragged query layout of a replayed (or captured) tier graph: ``batch_size`` requests.

    ``verify_lens`` ``[bs]`` int32 rows per request, ``qo_indptr`` ``[bs + 1]`` int32 exclusive
    offsets (leading 0), ``num_tokens`` the graph's row count ``T`` (``>= qo_indptr[-1]``).
    """

    verify_lens: torch.Tensor  # [batch_size] int32
    qo_indptr: torch.Tensor  # [batch_size + 1] int32
    num_tokens: int

    @property
    def batch_size(self) -> int:
        return int(self.verify_lens.shape[0])


def pad_ragged_layout(
    qo_indptr: torch.Tensor,  # [raw_bs + 1] exclusive offsets of the live step's rows
    batch_size: int,
    num_tokens: int,
) -> PaddedLayout:
    """Pad a live ragged layout to a graph's ``batch_size`` with zero-row requests (device only).

    The padding requests repeat the last offset: no query rows and so no mask cells (the compact
    mask of the live step is valid unchanged); the rows past ``qo_indptr[-1]`` up to
    ``num_tokens`` belong to no request.

    Examples
    --------
    >>> lay = pad_ragged_layout(torch.tensor([0, 2, 3, 4]), 5, 8)
    >>> lay.qo_indptr.tolist(), lay.verify_lens.tolist(), lay.num_tokens
    ([0, 2, 3, 4, 4, 4], [2, 1, 1, 0, 0], 8)
    """
    raw_bs = int(qo_indptr.shape[0]) - 1
    if raw_bs < 1 or batch_size < raw_bs:
        raise ValueError(f"cannot pad a layout of {raw_bs} requests to a graph of {batch_size}")
    qo = qo_indptr.to(torch.int32)
    if batch_size > raw_bs:
        qo = torch.cat([qo, qo[-1:].expand(batch_size - raw_bs)])
    return PaddedLayout(verify_lens=(qo[1:] - qo[:-1]).to(torch.int32), qo_indptr=qo, num_tokens=int(num_tokens))


def capture_layout(batch_size: int, num_draft_tokens: int, num_tokens: int, device: Any = "cpu") -> PaddedLayout:
    """Layout a tier graph is captured with: exactly ``num_tokens`` rows, every request ``1..N`` rows.

    FlashInfer sizes a CUDA-graph wrapper's schedule from its first plan, so the capture plan has
    the graph's full row count (``flashinfer_verify.capture_counts``).

    Examples
    --------
    >>> capture_layout(3, 4, 7).verify_lens.tolist()
    [3, 2, 2]
    """
    counts = torch.tensor(capture_counts(batch_size, num_draft_tokens, num_tokens), dtype=torch.int32, device=device)
    qo = torch.zeros(batch_size + 1, dtype=torch.int32, device=device)
    qo[1:] = torch.cumsum(counts, dim=0)
    return PaddedLayout(verify_lens=counts, qo_indptr=qo, num_tokens=int(num_tokens))


def capture_mask(
    counts: Sequence[int], prefix_lens: Union[int, Sequence[int]], device: Any = "cpu"
) -> torch.Tensor:  # [sum_b q_b * (p_b + q_b)] bool
    """All-true FULL-layout mask for a capture batch (``q_b`` rows over ``p_b + q_b`` keys each).

    ``prefix_lens`` is one length for every request (SGLang's ``seq_len_fill_value``) or one per
    request. Its values do not matter for the capture (every replay re-plans the mask); its length
    must match the capture plan's keys.

    Examples
    --------
    >>> capture_mask([2, 1], 1).shape  # 2 * 3 + 1 * 2 cells
    torch.Size([8])
    >>> capture_mask([2, 1], [1, 4]).shape  # 2 * 3 + 1 * 5 cells
    torch.Size([11])
    """
    p = [int(prefix_lens)] * len(counts) if isinstance(prefix_lens, int) else [int(x) for x in prefix_lens]
    if len(p) != len(counts):
        raise ValueError(f"{len(counts)} row counts but {len(p)} prefix lengths")
    cells = sum(int(q) * (pb + int(q)) for q, pb in zip(counts, p))
    return torch.ones(cells, dtype=torch.bool, device=device)


_UNSUPPORTED = (
    ("not_target_verify", "not a TARGET_VERIFY runner"),
    ("draft_worker", "draft model runner"),
    ("sglang_ragged_mode", "SGLang's own ragged verify mode (SGLANG_RAGGED_VERIFY_MODE=compact) is on"),
    ("graph_backend_not_full", "CUDA-graph backend is not 'full'"),
    ("attention_backend_not_dcut", "attention backend is not flashinfer_dcut"),
    ("pdmux", "PDMux"),
    ("two_batch_overlap", "two-batch overlap"),
    ("lora", "LoRA"),
    ("mlp_sync", "DP attention / MLP sync"),
    ("attention_variants", "attention graph variants"),
    ("pipeline", "pipeline parallelism"),
    ("encoder_decoder", "encoder-decoder model"),
    ("hisparse", "hisparse"),
    ("multiple_attention_wrappers", "sliding-window or cross-attention model (more than one FlashInfer wrapper)"),
    ("no_prunable_width", "one verify row per request"),
)
_WARN_FACTS = frozenset({"multiple_attention_wrappers"})
"""Facts that skip the tier graphs of a configuration that asked for them (logged as a warning)."""


def tier_graph_unsupported_reason(**facts: bool) -> Optional[str]:
    """Why no tier graph is captured (first true fact, in a fixed order), or None when they are.

    Keys: ``not_target_verify``, ``draft_worker``, ``sglang_ragged_mode``, ``graph_backend_not_full``,
    ``attention_backend_not_dcut``, ``pdmux``, ``two_batch_overlap``, ``lora``, ``mlp_sync``,
    ``attention_variants``, ``pipeline``, ``encoder_decoder``, ``hisparse``,
    ``multiple_attention_wrappers``, ``no_prunable_width`` (missing keys count as False; an
    unknown key is a ``KeyError``).

    Examples
    --------
    >>> tier_graph_unsupported_reason(lora=True, pdmux=False) , tier_graph_unsupported_reason()
    ('LoRA', None)
    """
    known = {k for k, _ in _UNSUPPORTED}
    unknown = set(facts) - known
    if unknown:
        raise KeyError(f"unknown facts {sorted(unknown)}")
    for k, why in _UNSUPPORTED:
        if facts.get(k, False):
            return why
    return None


def log_unsupported(reason: str) -> None:
    """Log why no tier graph is captured: a warning for a model the tier graphs cannot serve
    (:data:`_WARN_FACTS`), else info (configurations that do not use them)."""
    warn = any(reason == why for k, why in _UNSUPPORTED if k in _WARN_FACTS)
    logger.log(logging.WARNING if warn else logging.INFO,
               "D-Cut tier graphs not captured (%s): compacted verify steps run eagerly or at full width", reason)


def tier_graphs_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """False when :data:`TIER_GRAPHS_ENV` is ``0`` / ``false`` / ``off`` / ``no``.

    Examples
    --------
    >>> tier_graphs_enabled({}), tier_graphs_enabled({"SGLANG_EXT_DCUT_TIER_GRAPHS": "0"})
    (True, False)
    """
    env = os.environ if environ is None else environ
    return str(env.get(TIER_GRAPHS_ENV, "1")).strip().lower() not in ("0", "false", "off", "no")


# ============================================================================= SGLang part
HOOK_DECODE_GRAPH_RUNNER_CLS = "sglang.srt.model_executor.model_runner.ModelRunner._decode_cuda_graph_runner_cls"

_runner_cls: Optional[type] = None


def _is_compact_verify(forward_batch: Any) -> bool:
    """A D-Cut compacted verify step: TARGET_VERIFY carrying ``spec_info.ragged_verify_layout``."""
    spec = getattr(forward_batch, "spec_info", None)
    return (
        spec is not None
        and forward_batch.forward_mode.is_target_verify()
        and getattr(spec, "ragged_verify_layout", None) is not None
    )


def _dcut_attention_backend(backend: Any) -> bool:
    from sglang_ext.engine.attention import flashinfer_dcut as fv

    cls = fv._backend_cls  # built when the flashinfer_dcut backend was created
    return cls is not None and isinstance(backend, cls)


def _dcut_tiers(model_runner: Any) -> Tuple[float, ...]:
    from sglang_ext.config import get_extension_config

    return tuple(float(t) for t in get_extension_config(model_runner.server_args).dcut.tiers)


def dcut_verify_graph_runner_class() -> type:
    """Build (once) ``DCutVerifyGraphRunner``, the ``DecodeCudaGraphRunner`` subclass (imports SGLang).

    Attributes of an instance: ``dcut_table`` (:class:`TierGraphTable` of the captured tier
    graphs), ``dcut_unsupported`` (why none was captured, or None), ``dcut_graph_replays`` /
    ``dcut_eager_steps`` (compacted steps replayed / run eagerly because no graph fitted).
    """
    global _runner_cls
    if _runner_cls is not None:
        return _runner_cls

    import copy

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner.shape_key import ShapeKey
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from sglang_ext.engine.dcut.compact_verify import make_ragged_layout

    class DCutVerifyGraphRunner(DecodeCudaGraphRunner):
        """SGLang's decode/verify graph runner plus one TARGET_VERIFY graph per (bs, tier)."""

        def __init__(self, model_runner, *args, **kwargs):
            # read during capture, which runs inside super().__init__
            self.dcut_tiers = _dcut_tiers(model_runner)
            self.dcut_masked = not model_runner.spec_algorithm.is_dflash_family()  # DFlash chains: causal
            self.dcut_table = TierGraphTable()
            self.dcut_unsupported: Optional[str] = None
            self.dcut_graph_replays = 0
            self.dcut_eager_steps = 0
            self._dcut_capture_key: Optional[TierGraphKey] = None
            super().__init__(model_runner, *args, **kwargs)

        # ------------------------------------------------------------ capture
        def _dcut_unsupported_reason(self) -> Optional[str]:
            mr = self.model_runner
            return tier_graph_unsupported_reason(
                not_target_verify=self.capture_forward_mode != ForwardMode.TARGET_VERIFY,
                draft_worker=bool(mr.is_draft_worker),
                sglang_ragged_mode=bool(self.ragged_verify_mode),
                graph_backend_not_full=not isinstance(self.backend, FullCudaGraphBackend),
                attention_backend_not_dcut=not _dcut_attention_backend(self.attn_backend),
                pdmux=bool(self.enable_pdmux),
                two_batch_overlap=bool(self.enable_two_batch_overlap),
                lora=mr.lora_manager is not None,
                mlp_sync=bool(self.require_mlp_sync),
                attention_variants=self.attention_graph_variants is not None,
                pipeline=self.pp_size > 1,
                encoder_decoder=bool(self.is_encoder_decoder),
                hisparse=getattr(mr, "hisparse_coordinator", None) is not None,
                multiple_attention_wrappers=int(getattr(self.attn_backend, "num_wrappers", 1)) > 1,
                no_prunable_width=self.captured_req_width <= 1,
            )

        def _capture_one_stream(self, stream_idx: Optional[int] = None) -> None:
            super()._capture_one_stream(stream_idx)
            self._capture_tier_graphs(stream_idx)

        def _capture_tier_graphs(self, stream_idx: Optional[int]) -> None:
            self.dcut_unsupported = self._dcut_unsupported_reason()
            if self.dcut_unsupported is not None:
                log_unsupported(self.dcut_unsupported)
                return
            keys = tier_graph_keys(self.capture_bs, self.captured_req_width, self.dcut_tiers, self.dcut_masked)
            reserve = getattr(self.attn_backend, "dcut_reserve_graph_buffers", None)
            if keys and reserve is not None:  # one shared set of key-index / mask buffers for every tier graph
                reserve([(k.batch_size, k.num_tokens) for k in keys])
            logger.info("D-Cut: capturing %d tier verify graphs after SGLang's %d", len(keys), len(self.capture_bs))
            t0 = time.perf_counter()
            captured: List[TierGraphKey] = []
            for key in reversed(keys):  # largest first: smaller graphs reuse the pool
                self._dcut_capture_key = key
                try:
                    # the plain forward: what SGLang's torch_compile_decoration.patch_model yields for a
                    # batch size outside the compile set (tier graphs are never torch.compile'd)
                    self.capture_one_shape(key.batch_size, self.model_runner.model.forward, stream_idx)
                finally:
                    self._dcut_capture_key = None
                captured.append(key)
            self.dcut_table = TierGraphTable(captured)
            logger.info("D-Cut: captured %d tier verify graphs (bs %s, tiers %s, %s) in %.1f s", len(captured),
                        sorted({k.batch_size for k in captured}), list(self.dcut_tiers),
                        "tree mask" if self.dcut_masked else "causal", time.perf_counter() - t0)

        def capture_prepare(self, size: int, stream_idx: Optional[int] = None, num_tokens: Optional[int] = None):
            key = self._dcut_capture_key
            if key is None:
                return super().capture_prepare(size, stream_idx=stream_idx, num_tokens=num_tokens)
            fb, attn_backend, pp = super().capture_prepare(key.batch_size, stream_idx=stream_idx,
                                                           num_tokens=key.num_tokens)
            lay = capture_layout(key.batch_size, self.captured_req_width, key.num_tokens, device=fb.input_ids.device)
            spec = fb.spec_info
            spec.ragged_verify_layout = make_ragged_layout(lay.verify_lens, lay.qo_indptr, key.num_tokens)
            counts = capture_counts(key.batch_size, self.captured_req_width, key.num_tokens)
            prefix = fb.seq_lens[: key.batch_size].tolist()  # SGLang's fill value (capture time: a sync is fine)
            spec.custom_mask = capture_mask(counts, prefix, device=fb.input_ids.device) if key.masked else None
            return fb, attn_backend, pp

        def _make_graph_key(self, size, stream_idx=None, variant_label=None, attention_variant=None):
            key = self._dcut_capture_key
            if key is not None:
                return self._dcut_shape_key(key, stream_idx)
            return super()._make_graph_key(size, stream_idx=stream_idx, variant_label=variant_label,
                                           attention_variant=attention_variant)

        @staticmethod
        def _dcut_shape_key(key: TierGraphKey, stream_idx: Optional[int] = None):
            return ShapeKey(size=key.num_tokens, stream_idx=stream_idx, variant_label=None,
                            attention_variant=key.variant)

        # ------------------------------------------------------------ replay
        def _dcut_lookup(self, forward_batch) -> Optional[TierGraphKey]:
            if (
                not len(self.dcut_table)
                or not _is_compact_verify(forward_batch)
                or forward_batch.replace_embeds is not None
                or forward_batch.capture_hidden_mode > self.capture_hidden_mode
            ):
                return None
            return self.dcut_table.lookup(forward_batch.batch_size, int(forward_batch.input_ids.shape[0]),
                                          forward_batch.spec_info.custom_mask is not None)

        def can_run_graph(self, forward_batch) -> bool:
            if not len(self.dcut_table) or not _is_compact_verify(forward_batch):
                return super().can_run_graph(forward_batch)
            ok = self._dcut_lookup(forward_batch) is not None
            if not ok:
                self.dcut_eager_steps += 1
            return ok

        def load_batch(self, forward_batch, pp_proxy_tensors=None):
            key = self._dcut_lookup(forward_batch)
            if key is None:
                return super().load_batch(forward_batch, pp_proxy_tensors)
            self._load_tier_batch(forward_batch, key, pp_proxy_tensors)

        def _load_tier_batch(self, forward_batch, key: TierGraphKey, pp_proxy_tensors=None) -> None:
            raw_bs = int(forward_batch.batch_size)
            width = int(forward_batch.input_ids.shape[0])
            self._validate_capture_hidden_mode(forward_batch)
            self.deepep_adapter.replay()
            # live rows/requests in, padded tail reset by SGLang's per-slot policy (positions and
            # out_cache_loc 0 = sink slot, seq_lens the fill value, req_pool_indices 0)
            self.buffer_registry.fill_from(forward_batch, raw_bs=raw_bs, padded_bs=key.batch_size,
                                           raw_num_tokens=width, padded_num_tokens=key.num_tokens,
                                           pp_proxy_tensors=pp_proxy_tensors)
            self._set_dp_real_num_tokens(width)
            live = forward_batch.spec_info
            lay = pad_ragged_layout(live.ragged_verify_layout.qo_indptr_device, key.batch_size, key.num_tokens)
            padded = copy.copy(live)
            padded.ragged_verify_layout = make_ragged_layout(lay.verify_lens, lay.qo_indptr, key.num_tokens)
            forward_batch.spec_info = padded  # the replay view reads spec_info from the live batch
            try:
                self._init_replay_attn_metadata_from_view(forward_batch, raw_bs=raw_bs, bs=key.batch_size,
                                                          num_tokens=key.num_tokens, glue_key=None,
                                                          attention_variant=None)
            finally:
                forward_batch.spec_info = live
            self.raw_bs = raw_bs
            self.raw_num_token = width  # execute() returns the first `width` rows
            self.bs = key.batch_size
            self._replay_graph_key = self._dcut_shape_key(key)
            self.dcut_graph_replays += 1

        def dcut_graph_stats(self) -> Dict[str, Any]:
            """JSON-able state of the tier graphs (for logs / ``/server_info``)."""
            return {
                "tier_graphs": len(self.dcut_table),
                "unsupported": self.dcut_unsupported,
                "replays": self.dcut_graph_replays,
                "eager_steps": self.dcut_eager_steps,
            }

    DCutVerifyGraphRunner.__name__ = "DCutVerifyGraphRunner"
    DCutVerifyGraphRunner.__qualname__ = "DCutVerifyGraphRunner"
    _runner_cls = DCutVerifyGraphRunner
    return _runner_cls


def select_graph_runner_class(base_cls: Any, model_runner: Any) -> Any:
    """``DCutVerifyGraphRunner`` instead of SGLang's ``DecodeCudaGraphRunner`` when it applies.

    Applies to the target model runner of a speculative server with ``--dcut`` on, whose attention
    backend is ``flashinfer_dcut`` and whose base class is exactly ``DecodeCudaGraphRunner``
    (specialised runners such as UNO's are kept), unless :data:`TIER_GRAPHS_ENV` is ``0``.
    """
    if not tier_graphs_enabled() or getattr(model_runner, "is_draft_worker", True):
        return base_cls
    spec = getattr(model_runner, "spec_algorithm", None)
    if spec is None or not spec.is_speculative():
        return base_cls
    from sglang_ext.config import get_extension_config

    server_args = getattr(model_runner, "server_args", None)
    if server_args is None or not get_extension_config(server_args).dcut.enabled:
        return base_cls
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    if base_cls is not DecodeCudaGraphRunner:
        return base_cls
    if not _dcut_attention_backend(getattr(model_runner, "attn_backend", None)):
        return base_cls
    return dcut_verify_graph_runner_class()


def _around_decode_cuda_graph_runner_cls(original_fn, self, *args, **kwargs):
    return select_graph_runner_class(original_fn(self, *args, **kwargs), self)


def register_hooks() -> None:
    """Register the AROUND hook on ``ModelRunner._decode_cuda_graph_runner_cls`` (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not any(h is _around_decode_cuda_graph_runner_cls for _, h, _ in
               HookRegistry._hooks.get(HOOK_DECODE_GRAPH_RUNNER_CLS, ())):
        HookRegistry.register(HOOK_DECODE_GRAPH_RUNNER_CLS, _around_decode_cuda_graph_runner_cls, HookType.AROUND)

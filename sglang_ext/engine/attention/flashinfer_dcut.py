"""FlashInfer verify path for D-Cut: ragged (pruned) target verification, one CUDA graph per tier.

SGLang's FlashInfer backend plans TARGET_VERIFY with a uniform ``qo_indptr`` (every request
verifies ``N`` rows), keys its graph wrappers by batch size only and refuses a ragged layout
inside a CUDA graph (``docs/sglang_internals.md#verify-graphs-and-attention-backends``). D-Cut verifies a different number of rows per
request, so this module plans ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` itself:

* **ragged queries**: ``qo_indptr`` from the kept-row counts (exclusive, leading 0);
* **paged keys**: request ``b`` reads its committed prefix, then the window slots of its *kept*
  nodes in compact order (``kv_indptr``/``kv_indices``, page size 1, ``kv_last_page_len = 1``);
* **mask**: the compacted tree mask in FlashInfer's layout (request ``b`` owns
  ``q_b * (p_b + q_b)`` cells, row-major, key columns = prefix then kept nodes), which is exactly
  :func:`sglang_ext.dcut.build_full_mask`; packed little-endian per request
  (:func:`pack_mask_segments`, FlashInfer's ``segment_packbits(..., bitorder="little")``). Chains
  (DFlash blocks, EAGLE topk=1) may use ``causal=True`` with no mask: FlashInfer's causal mask is
  bottom-right aligned, which is the chain mask;
* **graphs per tier**: for batch size ``bs`` and tier ratio ``rho`` the verify forward has
  ``T = ceil(bs * N * rho) = bs + keep_count(bs, N, rho)`` rows (:func:`verify_graph_shapes`).
  One graph is captured per ``(bs, T)``: its wrapper is planned at capture with ``T`` rows
  (FlashInfer then accepts any later plan with ``qo_indptr[-1] <= T`` at replay) and a step whose
  kept rows total ``<= T`` replays it with the rows past ``qo_indptr[-1]`` as padding lanes
  (their outputs are dropped by the scatter-back, ``PAD_INDEX``).

Everything above is pure torch (no SGLang, no FlashInfer import), lives in
:mod:`sglang_ext.engine.attention.flashinfer_verify_plan` (re-exported here) and runs on CPU;
:func:`paged_attention_reference` computes what FlashInfer computes from the same plan, so the
plan is tested on CPU against the project's torch backend (``tests/unit/test_flashinfer_plan.py``)
and the GPU script (``tests/gpu/run_gpu_checks.py``) compares FlashInfer against the same
reference. :func:`register` adds the SGLang backend subclass ``flashinfer_dcut`` (built lazily by
:func:`flashinfer_dcut_backend_class`); the plugin calls it only when CUDA is available.

Worked example (bs = 2, N = 4, prefixes ``p = [2, 1]``; request 0 keeps nodes {0, 2} of the tree
0 -> {1, 2}, request 1 keeps its chain prefix {0, 1, 2})::

    window slots   req 0: R0[0:2] | R0[2:6]        req 1: R1[0:1] | R1[1:5]
    kept cols      [0, 2 | 0, 1, 2]                (local node ids of the ragged rows)
    qo_indptr      [0, 2, 5]
    kv per req     [R0[0], R0[1], R0[2], R0[4]]    [R1[0], R1[1], R1[2], R1[3]]
    kv_indptr      [0, 4, 8]
    mask cells     2 * 4 + 3 * 4 = 20              mask_indptr [0, 8, 20]

The graphs themselves are captured and replayed by ``dcut_graphs.DCutVerifyGraphRunner`` (one
TARGET_VERIFY graph per ``(bs, T)``, compacted steps padded to the smallest fitting one with
zero-row padding requests), which plans through this backend.

GPU status: the planning math is tested on CPU; the FlashInfer calls, the backend subclass and the
tier-graph runner are written for SGLang 0.5.23 / flashinfer-python 0.7.2 and have **not been run**
on a GPU yet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import torch

from sglang_ext.engine.attention.flashinfer_verify_plan import (  # noqa: F401 (re-exported: the planning math)
    NO_COL,
    PAD_REQUESTS,
    PAGE_SIZE,
    SINK_SLOT,
    GraphBufferSizes,
    VerifyGraphShape,
    VerifyPlan,
    capture_counts,
    chain_kept_cols,
    graph_buffer_sizes,
    kept_cols_from_index,
    mask_indptr_from,
    pack_mask_segments,
    padded_num_tokens,
    paged_attention_reference,
    plan_verify,
    ragged_qo_indptr,
    select_kept_kv,
    shared_graph_buffer_sizes,
    tier_token_counts,
    unpack_mask_segments,
    verify_graph_shapes,
    verify_kept_cols,
    window_kv,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND_NAME",
    "PAGE_SIZE",
    "SINK_SLOT",
    "NO_COL",
    "VerifyGraphShape",
    "VerifyPlan",
    "GraphBufferSizes",
    "SharedGraphBuffers",
    "PAD_REQUESTS",
    "ragged_qo_indptr",
    "window_kv",
    "kept_cols_from_index",
    "chain_kept_cols",
    "select_kept_kv",
    "mask_indptr_from",
    "pack_mask_segments",
    "unpack_mask_segments",
    "plan_verify",
    "tier_token_counts",
    "verify_graph_shapes",
    "verify_kept_cols",
    "padded_num_tokens",
    "capture_counts",
    "graph_buffer_sizes",
    "shared_graph_buffer_sizes",
    "ragged_verify_unsupported_reason",
    "paged_attention_reference",
    "flashinfer_available",
    "make_prefill_wrapper",
    "plan_prefill_wrapper",
    "flashinfer_dcut_backend_class",
    "add_draft_backend_alias",
    "around_dflash_verify_mask_policy",
    "register",
]

BACKEND_NAME = "flashinfer_dcut"
"""Name of the backend subclass in SGLang's attention registry (``--attention-backend``)."""
DRAFT_BACKEND_BASE = "flashinfer"
"""Name under which SGLang's ``DraftBackendFactory`` builds the draft backends ``flashinfer_dcut`` uses."""
HOOK_DFLASH_MASK_POLICY = "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy"
BACKEND_CLASS_NAME = "FlashInferDCutBackend"
"""Class name of the backend subclass (what SGLang's DFlash mask policy reads)."""
BASE_CLASS_NAME = "FlashInferAttnBackend"


# ----------------------------------------------------------------------------- FlashInfer calls
def flashinfer_available() -> Tuple[bool, str]:
    """Whether ``flashinfer`` imports and a CUDA device is present, with the reason if not.

    Examples
    --------
    >>> ok, why = flashinfer_available(); isinstance(why, str)
    True
    """
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # ImportError, or a missing runtime dependency of flashinfer
        return False, f"flashinfer does not import: {type(e).__name__}: {e}"
    return True, "ok"


@dataclass
class WrapperBuffers:
    """Fixed buffers of one CUDA-graph wrapper (addresses captured into the graph).

    Sized for ``batch_size`` live requests plus the padding request (:data:`PAD_REQUESTS`).
    """

    qo_indptr: torch.Tensor  # [batch_size + PAD_REQUESTS + 1] int32
    kv_indptr: torch.Tensor  # [batch_size + PAD_REQUESTS + 1] int32
    kv_indices: torch.Tensor  # [capacity] int32
    kv_last_page_len: torch.Tensor  # [batch_size + PAD_REQUESTS] int32
    custom_mask: Optional[torch.Tensor]  # [capacity] uint8
    mask_indptr: Optional[torch.Tensor]  # [batch_size + PAD_REQUESTS + 1] int32

    @classmethod
    def allocate(cls, batch_size: int, sizes: GraphBufferSizes, use_custom_mask: bool, device) -> "WrapperBuffers":
        """Own buffers for one graph (the GPU script's single graphs); backends use :class:`SharedGraphBuffers`."""
        return SharedGraphBuffers.allocate(
            GraphBufferSizes(sizes.kv_indices, sizes.packed_mask, max(batch_size, sizes.max_batch_size)), device
        ).view(batch_size, use_custom_mask)


class SharedGraphBuffers:
    """The fixed buffers every tier-graph wrapper of one backend plans into (one allocation each).

    ``kv_indices`` ``[capacity]`` int32 and ``custom_mask`` ``[capacity]`` uint8 are shared whole;
    the indptr buffers have ``max_batch_size + PAD_REQUESTS + 1`` entries and each wrapper gets
    the leading ``bs + PAD_REQUESTS + 1`` (FlashInfer fixes a graph wrapper's batch size from its
    buffers' lengths). Sharing is safe because each replay is re-planned right before it.
    ``kv_indices`` / ``custom_mask`` may be SGLang's own ``cuda_graph_kv_indices[0]`` /
    ``cuda_graph_custom_mask`` (:meth:`from_tensors`).

    Examples
    --------
    >>> pool = SharedGraphBuffers.allocate(GraphBufferSizes(100, 50, 8), "cpu")
    >>> a, b = pool.view(2, True), pool.view(8, False)
    >>> a.qo_indptr.shape[0], b.qo_indptr.shape[0], a.kv_indices.data_ptr() == b.kv_indices.data_ptr()
    (4, 10, True)
    """

    def __init__(self, kv_indices: torch.Tensor, custom_mask: torch.Tensor, max_batch_size: int):
        n = int(max_batch_size) + PAD_REQUESTS
        z = dict(dtype=torch.int32, device=kv_indices.device)
        self.max_batch_size = int(max_batch_size)
        self.kv_indices = kv_indices  # [kv capacity] int32
        self.custom_mask = custom_mask  # [mask capacity] uint8
        self.qo_indptr = torch.zeros(n + 1, **z)
        self.kv_indptr = torch.zeros(n + 1, **z)
        self.kv_last_page_len = torch.ones(n, **z)
        self.mask_indptr = torch.zeros(n + 1, **z)

    @classmethod
    def allocate(cls, sizes: GraphBufferSizes, device) -> "SharedGraphBuffers":
        return cls(torch.zeros(sizes.kv_indices, dtype=torch.int32, device=device),
                   torch.zeros(sizes.packed_mask, dtype=torch.uint8, device=device), sizes.max_batch_size)

    @classmethod
    def from_tensors(cls, kv_indices: torch.Tensor, custom_mask: torch.Tensor, max_batch_size: int):
        """Share existing key-index / mask buffers (e.g. SGLang's graph buffers); only the small
        indptr buffers are allocated."""
        return cls(kv_indices, custom_mask, max_batch_size)

    def fits(self, sizes: GraphBufferSizes) -> bool:
        """Whether a graph needing ``sizes`` fits these buffers."""
        return (sizes.kv_indices <= self.kv_indices.numel() and sizes.packed_mask <= self.custom_mask.numel()
                and sizes.max_batch_size <= self.max_batch_size)

    def nbytes(self) -> int:
        """Bytes of device memory these buffers hold (shared ones counted once)."""
        ts = (self.kv_indices, self.custom_mask, self.qo_indptr, self.kv_indptr, self.kv_last_page_len,
              self.mask_indptr)
        return sum(t.numel() * t.element_size() for t in ts)

    def view(self, batch_size: int, use_custom_mask: bool) -> WrapperBuffers:
        """Buffers for a graph wrapper of ``batch_size`` live requests (views, no allocation)."""
        if batch_size > self.max_batch_size:
            raise ValueError(f"{BACKEND_NAME}: tier graph of batch size {batch_size} exceeds the shared buffers' "
                             f"{self.max_batch_size}")
        n = int(batch_size) + PAD_REQUESTS
        return WrapperBuffers(
            qo_indptr=self.qo_indptr[: n + 1],
            kv_indptr=self.kv_indptr[: n + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:n],
            custom_mask=self.custom_mask if use_custom_mask else None,
            mask_indptr=self.mask_indptr[: n + 1] if use_custom_mask else None,
        )


def make_prefill_wrapper(
    workspace: torch.Tensor,  # [workspace_bytes] uint8
    buffers: Optional[WrapperBuffers] = None,
    backend: str = "fa2",
) -> Any:
    """A ``BatchPrefillWithPagedKVCacheWrapper`` (NHD); CUDA-graph mode when ``buffers`` is given.

    ``fa2`` is SGLang's prefill backend and the one whose kernels take a custom mask on SM90.
    A graph wrapper built with a mask buffer always runs the custom-mask kernel, so tree tiers
    and chain (causal) tiers need separate wrappers.
    """
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper

    if buffers is None:
        return BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    extra = {}
    if buffers.custom_mask is not None:
        extra = {"custom_mask_buf": buffers.custom_mask, "mask_indptr_buf": buffers.mask_indptr}
    return BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, backend=backend,
        qo_indptr_buf=buffers.qo_indptr, paged_kv_indptr_buf=buffers.kv_indptr,
        paged_kv_indices_buf=buffers.kv_indices, paged_kv_last_page_len_buf=buffers.kv_last_page_len, **extra,
    )


def plan_prefill_wrapper(
    wrapper: Any,
    plan: VerifyPlan,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    kv_dtype: Optional[torch.dtype] = None,
    sm_scale: Optional[float] = None,
) -> None:
    """``wrapper.plan(...)`` from a :class:`VerifyPlan` (custom mask, or causal for chains).

    The *unpacked* mask is passed: FlashInfer packs it itself with ``segment_packbits(...,
    bitorder="little")`` and hands the kernel the packed **byte** offsets, which its mask lookup
    (``custom_mask + mask_indptr[b]``, bit ``q * kv_len + kv``) needs. A caller-packed mask would be
    paired with cell offsets by ``plan`` (0.7.2), so it is not used. The result equals
    :attr:`VerifyPlan.packed_mask` / :attr:`VerifyPlan.packed_mask_indptr`.

    Plans outside any graph capture (it copies indptrs to the host). Under CUDA-graph mode it
    refreshes the wrapper's fixed buffers, so a later replay runs the new layout.
    """
    wrapper.plan(
        plan.qo_indptr,
        plan.kv_indptr,
        plan.kv_indices,
        plan.kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        PAGE_SIZE,
        custom_mask=plan.custom_mask,
        causal=plan.causal,
        sm_scale=sm_scale,
        q_data_type=q_dtype,
        kv_data_type=kv_dtype or q_dtype,
    )


# ----------------------------------------------------------------------------- SGLang backend
def ragged_verify_unsupported_reason(num_wrappers: int) -> Optional[str]:
    """Why a FlashInfer backend with ``num_wrappers`` wrappers cannot run a ragged verify, or None.

    Sliding-window models (2 wrappers: window and full layers) and cross-attention models plan
    each wrapper over a different key range; the ragged plan covers one (full-attention) range.

    Examples
    --------
    >>> ragged_verify_unsupported_reason(1) is None, ragged_verify_unsupported_reason(2)
    (True, 'sliding-window or cross-attention model (2 attention wrappers)')
    """
    if int(num_wrappers) == 1:
        return None
    return f"sliding-window or cross-attention model ({int(num_wrappers)} attention wrappers)"


_backend_cls: Optional[type] = None


def flashinfer_dcut_backend_class() -> type:
    """Build (once) the SGLang backend subclass ``FlashInferDCutBackend`` (imports SGLang).

    It keeps SGLang's FlashInfer backend for every forward except a TARGET_VERIFY carrying a
    ``ragged_verify_layout`` (a D-Cut step), which it plans itself with :func:`plan_verify`:

    * eager: the verify wrapper is planned from the live batch;
    * CUDA graphs: wrappers and fixed buffers are keyed by ``(bs, num_tokens)`` instead of
      ``bs``, created at capture of a ragged verify batch (:func:`verify_graph_shapes`) and
      re-planned before each replay.

    Key columns: the full windows are packed by SGLang's own ``generate_attn_arg_prefill``
    (uniform, through the KV-index translator), then the kept columns are selected; the kept
    columns are the batch's ``kv_loc_cols`` (D-Cut binds the kept window ids there), or the chain
    prefix when none are bound. The mask is the compacted ``spec_info.custom_mask`` (None: causal).
    """
    global _backend_cls
    if _backend_cls is not None:
        return _backend_cls

    import copy

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

    class FlashInferDCutBackend(FlashInferAttnBackend):
        """SGLang's FlashInfer backend plus ragged (pruned) verify, eager and per-tier graphs."""

        #: read by the D-Cut glue (``dcut_glue.RAGGED_VERIFY_FLAG``): compact the verify forward
        supports_ragged_target_verify = True

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self._dcut_graph_wrappers = {}  # (bs, num_tokens, masked) -> [wrapper]
            self._dcut_graph_buffers: Optional[SharedGraphBuffers] = None  # shared by every tier wrapper
            self._dcut_graph_max_bs = 0
            self._dcut_max_context_len = int(model_runner.model_config.context_len)
            reason = ragged_verify_unsupported_reason(self.num_wrappers)
            if reason is not None:
                # read by the D-Cut glue: it keeps full-width verify (links cut only) for this backend
                self.supports_ragged_target_verify = False
                logger.warning("%s: %s; D-Cut verifies at full width (pruned links only, no FLOPs saved)",
                               BACKEND_NAME, reason)

        # ---------------------------------------------------------------- planning
        @staticmethod
        def _ragged(forward_batch) -> bool:
            spec = forward_batch.spec_info
            return (
                forward_batch.forward_mode.is_target_verify()
                and spec is not None
                and getattr(spec, "ragged_verify_layout", None) is not None
            )

        def _verify_plan(self, forward_batch) -> VerifyPlan:
            spec = forward_batch.spec_info
            layout = spec.ragged_verify_layout
            bs = forward_batch.batch_size
            n = int(spec.draft_token_num)
            uniform = copy.copy(spec)
            uniform.ragged_verify_layout = None
            uniform.custom_mask = _uniform_mask_placeholder(spec, forward_batch.req_pool_indices.device)
            upd = self.indices_updater_prefill
            prefix_total = int(forward_batch.seq_lens_sum)  # host-known: planning reads nothing back
            window_kv_indices, window_kv_indptr, _, _ = uniform.generate_attn_arg_prefill(
                req_pool_indices=forward_batch.req_pool_indices,
                paged_kernel_lens=forward_batch.seq_lens,
                paged_kernel_lens_sum=prefix_total,
                translator=upd.attn_backend.kv_index_translator,
                plan=forward_batch.kv_loc_plan,
            )
            qo_indptr = layout.qo_indptr_device.to(torch.int32)
            num_tokens = int(forward_batch.input_ids.shape[0])
            kept_cols = verify_kept_cols(
                getattr(forward_batch, "kv_loc_cols", None), getattr(spec, "dcut_kept_index", None),
                qo_indptr, num_tokens, n,
            )
            return plan_verify(
                window_kv_indptr, window_kv_indices, forward_batch.seq_lens[:bs], qo_indptr, kept_cols,
                custom_mask=spec.custom_mask, num_tokens=num_tokens, prefix_total=prefix_total,
            )

        def _plan_wrappers(self, wrappers, vp: VerifyPlan) -> None:
            upd = self.indices_updater_prefill
            for w in wrappers:
                plan_prefill_wrapper(
                    w, vp, upd.num_qo_heads, upd.num_kv_heads, upd.head_dim, upd.q_data_type, upd.data_type,
                )

        def _check_ragged_supported(self) -> None:
            reason = ragged_verify_unsupported_reason(self.num_wrappers)
            if reason is not None:  # the D-Cut glue never compacts for this backend (flag set in __init__)
                raise RuntimeError(f"{BACKEND_NAME}: a compacted verify reached a backend that cannot run it "
                                   f"({reason})")

        # ---------------------------------------------------------------- eager
        def init_forward_metadata(self, forward_batch):
            if not self._ragged(forward_batch):
                return super().init_forward_metadata(forward_batch)
            self._check_ragged_supported()
            self._plan_wrappers(self.prefill_wrappers_verify, self._verify_plan(forward_batch))
            self.forward_metadata = PrefillMetadata(self.prefill_wrappers_verify, False, False)

        # ---------------------------------------------------------------- graphs
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            self._dcut_graph_max_bs = int(max_bs)

        def dcut_reserve_graph_buffers(self, shapes: Sequence[Tuple[int, int]]) -> SharedGraphBuffers:
            """Fixed buffers for the tier graphs ``shapes`` = ``[(bs, T), ...]``, shared by all of them.

            SGLang's own ``cuda_graph_kv_indices[0]`` / ``cuda_graph_custom_mask`` (allocated by
            ``init_cuda_graph_state`` for the uniform graphs) are reused when large enough; else
            one max-size set is allocated. Call before the first tier capture (buffers never move
            once a graph holds their addresses).
            """
            if self._dcut_graph_buffers is not None:
                return self._dcut_graph_buffers
            sizes = shared_graph_buffer_sizes(shapes, self._dcut_max_context_len)
            max_bs = max(sizes.max_batch_size, self._dcut_graph_max_bs)
            sizes = GraphBufferSizes(sizes.kv_indices, sizes.packed_mask, max_bs)
            kv = getattr(self, "cuda_graph_kv_indices", None)  # SGLang's: one per wrapper
            kv = kv[0] if isinstance(kv, (list, tuple)) and kv else kv
            mask = getattr(self, "cuda_graph_custom_mask", None)
            pool = None
            if isinstance(kv, torch.Tensor) and isinstance(mask, torch.Tensor):
                pool = SharedGraphBuffers.from_tensors(kv, mask, max_bs)
                if not pool.fits(sizes):
                    pool = None
            self._dcut_graph_buffers = pool or SharedGraphBuffers.allocate(sizes, self.workspace_buffer.device)
            return self._dcut_graph_buffers

        def _dcut_wrappers(self, bs: int, num_tokens: int, use_custom_mask: bool):
            key = (bs, num_tokens, use_custom_mask)
            if key not in self._dcut_graph_wrappers:
                pool = self.dcut_reserve_graph_buffers([(bs, num_tokens)])
                need = graph_buffer_sizes(bs, num_tokens, self._dcut_max_context_len)
                if not pool.fits(need):
                    raise RuntimeError(f"{BACKEND_NAME}: tier graph (bs {bs}, {num_tokens} rows) does not fit the "
                                       "shared graph buffers reserved before capture")
                self._dcut_graph_wrappers[key] = [
                    make_prefill_wrapper(self.workspace_buffer, pool.view(bs, use_custom_mask),
                                         backend=self.prefill_backend)
                ]
            return self._dcut_graph_wrappers[key]

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
            if not self._ragged(forward_batch):
                return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
            self._check_ragged_supported()
            vp = self._verify_plan(forward_batch)
            wrappers = self._dcut_wrappers(vp.batch_size, vp.num_tokens, not vp.causal)
            self._plan_wrappers(wrappers, vp)
            self.forward_metadata = PrefillMetadata(wrappers, False, False)

    FlashInferDCutBackend.__name__ = BACKEND_CLASS_NAME
    FlashInferDCutBackend.__qualname__ = BACKEND_CLASS_NAME
    _backend_cls = FlashInferDCutBackend
    return _backend_cls


_NEVER_SHORT_MASK_NUMEL = 1 << 62
"""``numel()`` of the placeholder mask of the uniform window packing (see :func:`_uniform_mask_placeholder`)."""


def _uniform_mask_placeholder(spec: Any, device: Any) -> Optional[torch.Tensor]:
    """``custom_mask`` of the uniform copy whose ``generate_attn_arg_prefill`` packs the full windows.

    ``EagleVerifyInput.generate_attn_arg_prefill`` reads ``self.custom_mask.numel()`` and pads a
    short mask with a fresh all-true tensor (it fails on ``None``); only its window keys are used
    here, so an EAGLE input gets a zero-stride view that is never short (no allocation, never read).
    Other inputs (DFlash) accept ``None``.
    """
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    if not isinstance(spec, EagleVerifyInput):
        return None
    return torch.ones(1, dtype=torch.bool, device=device).expand(_NEVER_SHORT_MASK_NUMEL)


def _create_backend(model_runner):
    ok, why = flashinfer_available()
    if not ok:
        raise RuntimeError(f"--attention-backend {BACKEND_NAME}: needs a CUDA device and flashinfer ({why}); "
                           "use torch_sdpa on the CPU testbed")
    return flashinfer_dcut_backend_class()(model_runner)


def add_draft_backend_alias(backend_map: dict) -> bool:
    """Offer ``flashinfer_dcut`` in a ``DraftBackendFactory`` backend map as FlashInfer's entry.

    EAGLE's draft model runs plain decode / extend forwards: SGLang's FlashInfer draft backends
    (multi-step decode, draft extend) serve them; only the target's TARGET_VERIFY needs the
    subclass. Returns whether the alias was added (the map has a ``flashinfer`` entry and no
    ``flashinfer_dcut`` one). Called by the project's AROUND hook on ``_create_backend``
    (``patches/draft_backend_factory.md``).

    Examples
    --------
    >>> m = {"flashinfer": "fi-factory"}; add_draft_backend_alias(m), m[BACKEND_NAME]
    (True, 'fi-factory')
    >>> add_draft_backend_alias({"triton": "t"})
    False
    """
    if DRAFT_BACKEND_BASE not in backend_map or BACKEND_NAME in backend_map:
        return False
    backend_map[BACKEND_NAME] = backend_map[DRAFT_BACKEND_BASE]
    return True


def around_dflash_verify_mask_policy(original_fn, attn_backend, *args, **kwargs):
    """AROUND hook on SGLang's ``resolve_dflash_verify_mask_policy``: ``FlashInferDCutBackend``
    gets FlashInfer's policy (``patches/dflash_mask_policy.md``).

    SGLang decides by the resolved backend's class *name* whether DFlash verify graphs are
    captured with a custom mask; the subclass's name is not in its set, so its graphs would be
    captured with a mask that the live DFlash verify (``custom_mask=None``) never plans.
    """
    name, build_custom_mask = original_fn(attn_backend, *args, **kwargs)
    if name != BACKEND_CLASS_NAME:
        return name, build_custom_mask
    from sglang.srt.speculative import dflash_utils

    return name, BASE_CLASS_NAME not in dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS


def register(*, apply_hooks: bool = False) -> bool:
    """Register ``flashinfer_dcut`` in SGLang's attention registry and its DFlash hook (idempotent).

    The name is always registered, so that ``--attention-backend flashinfer_dcut`` (e.g. in a GPU
    preset) parses and validates everywhere; building the backend without a CUDA device or
    without ``flashinfer`` raises an error naming the flag. The AROUND hook on
    ``resolve_dflash_verify_mask_policy`` is registered through ``HookRegistry`` (applied by
    SGLang's ``load_plugins()``; ``apply_hooks=True`` applies pending hooks now, for tests and
    scripts). Returns whether the backend can be built here. The plugin calls this in every
    process (see ``patches/flashinfer_dcut_backend.md``).
    """
    ok, why = flashinfer_available()
    if not ok:
        logger.debug("%s registered but not buildable here: %s", BACKEND_NAME, why)
    from sglang_ext.engine.attention.registry import register_backend

    register_backend(BACKEND_NAME, _create_backend, [(HOOK_DFLASH_MASK_POLICY, around_dflash_verify_mask_policy)],
                     apply_hooks=apply_hooks)
    return ok

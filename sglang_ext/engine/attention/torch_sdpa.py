"""``torch_sdpa``: a torch SDPA tree-attention backend for SGLang 0.5.23 (CPU testbed, GPU oracle).

It serves every forward of EAGLE/EAGLE3 speculative decoding with plain torch
(``scaled_dot_product_attention`` with explicit boolean masks), so that real SGLang runs
speculative decoding on a CPU without interpreted Triton, and so that a GPU run has an exact
reference for FlashInfer's pruned-tree attention:

============================  =================================================================
forward mode                  what a request (group) attends
============================  =================================================================
EXTEND (target or draft)      cached prefix ``R[rp[i], 0:p_i]`` + its own rows, causal
DRAFT_EXTEND_V2               same as EXTEND (``p_i = extend_prefix_lens[i]``, ``q_i = N``)
TARGET_VERIFY                 committed prefix ``R[rp[i], 0:s_i]`` + its ``q_i`` draft rows under
                              the tree mask; ``q_i`` uniform (``N``) or ragged (pruned trees)
DECODE (plain)                ``R[rp[i], 0:seq_lens[i] - 1]`` + itself
DECODE (draft step ``j``)     via :class:`TorchSDPAMultiStepDraftBackend`: row ``b * topk + t``
                              attends ``R[rp[b], 0:s_b]``, its branch's slots of steps ``< j``
                              ``R[rp[b], s_b + t * steps + (0..j-1)]``, and itself
============================  =================================================================

Notation: ``R = req_to_token_pool.req_to_token`` (``[max_reqs, max_context_len]`` int32 slot
ids), ``rp = forward_batch.req_pool_indices``, ``B = len(rp)``. Every forward first writes the
new ``k``/``v`` rows to the KV pool at ``out_cache_loc`` (unless ``save_kv_cache=False``), then
each request attends over ``[K_cache[prefix slots]; k[qo_indptr[i]:qo_indptr[i + 1]]]``: the
current rows come from the ``k``/``v`` tensors, never back from the cache.

Shapes (``T`` = rows of the forward)::

    q    [T, H_q * qk_head_dim]     (or [T, H_q, qk_head_dim])
    k    [T, H_kv, qk_head_dim]     v [T, H_kv, v_head_dim]
    out  [T, H_q * v_head_dim]      rows past sum(q_i) (pad lanes of a ragged bucket) are 0

Tree-mask convention (TARGET_VERIFY). ``spec_info.custom_mask`` is a flat bool (or uint8,
nonzero = attend) tensor in SGLang's FULL layout: request ``i`` owns ``q_i * (s_i + q_i)``
cells starting at the exclusive offset ``mask_indptr[i] = sum_{j<i} q_j * (s_j + q_j)``, row
``r`` at ``mask_indptr[i] + r * (s_i + q_i)``; cell ``(r, s_i + c)`` is True iff draft ``c``
is draft ``r`` or an ancestor of it. Prefix cells ``c < s_i`` are treated as True whatever
they hold (as SGLang's Triton kernel does). The QLEN_ONLY layout (``q_i * q_i`` cells per
request, only the tree block) is accepted too; the two are told apart by size. Nodes are in
topological order (a parent before its children), so each tree block is lower-triangular.
This backend's :attr:`TorchSDPABackend.verify_mask` makes SGLang build the FULL layout.

Ragged verify (pruned trees, D-Cut). The per-request row counts come from
``spec_info.ragged_verify_layout``, SGLang's
``sglang.srt.speculative.ragged_verify.RaggedVerifyLayout``: ``q_i = verify_lens_cpu[i]``
(or ``verify_lens[i]``), rows packed at the exclusive ``qo_indptr`` (a leading 0). With it,
``input_ids``, ``positions``, ``out_cache_loc`` and ``k``/``v`` are packed ``[sum q_i]``
(optionally followed by pad lanes up to ``graph_num_tokens``, which get zero output), and
``custom_mask`` is the compact FULL layout above with the pruned ``q_i``. Build the layout
with ``RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=..., device=..., grid=[T])``.
Without a layout, ``q_i = spec_info.num_tokens_per_req`` (when positive) else
``spec_info.draft_token_num`` for every request.

Worked example: a 2-request TARGET_VERIFY batch. Request 0 verifies a chain of 3 nodes after
``s_0 = 3`` committed tokens; request 1 a tree of 4 nodes after ``s_1 = 2`` tokens, with
parents ``[NO_PARENT, 0, 0, 1]`` (node 0 is the root, nodes 1 and 2 its children, node 3 a
child of node 1)::

    q_lens     = [3, 4]          qo_indptr   = [0, 3, 7]      (q rows 0-2: req 0; 3-6: req 1)
    mask cells = 3*(3+3) + 4*(2+4) = 42                       mask_indptr = [0, 18, 42]

    request 0, rows of width 6     request 1, rows of width 6
    (3 prefix | 3 chain)           (2 prefix | 4 tree)
      r0: 1 1 1 | 1 0 0              n0: 1 1 | 1 0 0 0
      r1: 1 1 1 | 1 1 0              n1: 1 1 | 1 1 0 0
      r2: 1 1 1 | 1 1 1              n2: 1 1 | 1 0 1 0
                                     n3: 1 1 | 1 1 0 1

    keys of request 1 = [K[R[rp[1], 0]], K[R[rp[1], 1]], k[3], k[4], k[5], k[6]]

If D-Cut prunes request 1 to nodes {0, 1}, the ragged batch is ``verify_lens = [3, 2]``,
``qo_indptr = [0, 3, 5]``, 5 packed rows and ``3*6 + 2*4 = 26`` mask cells (request 1's rows
``n0: 1 1 | 1 0`` and ``n1: 1 1 | 1 1``).

Limits (raise ``NotImplementedError``): cross-attention and non-decoder attention types,
sliding windows, attention sinks, LSE outputs, CUDA graphs (run eager:
``disable_cuda_graph=True``). Logit soft-capping (tanh) is supported. ``page_size`` must be 1
for the multi-step draft (SGLang's CPU default).

Speed and memory. Each layer gathers its padded keys/values from the pool in one pass into
buffers the backend keeps (:class:`~sglang_ext.engine.attention.torch_sdpa_plan.KVWorkspace`; pads
read the group's own first cached key, masked): the buffers grow to the largest
``groups x max_kv`` rows seen and are held for the backend's lifetime (two tensors of
``rows x H_kv x head_dim`` in the forward's dtype). A multi-step draft round gathers its committed
prefix once per draft layer and appends each step's rows (:class:`DraftRound`). Both shortcuts
give bit-identical outputs (``tests/unit/test_torch_backend_plan_fastpaths.py``).

Registration: :func:`register` (idempotent) adds the name ``torch_sdpa`` to SGLang's
attention registry and CLI choices, and installs an AROUND hook on
``DraftBackendFactory._create_backend`` so EAGLE/EAGLE3 accept it (see ``patches/``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_ext.engine.attention.torch_sdpa_modes import (
    NO_DRAFT_ROUND,
    DraftRoundKV,
    DraftRoundPlan,
    plan_decode,
    plan_draft_decode,
    plan_draft_round,
    plan_extend,
    plan_target_verify,
    run_draft_round_step,
)
from sglang_ext.engine.attention.torch_sdpa_plan import AttentionPlan, KVWorkspace, empty_plan, run_plan

if TYPE_CHECKING:
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

BACKEND_NAME = "torch_sdpa"
HOOK_DRAFT_BACKEND_FACTORY = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend"
NO_SLIDING_WINDOW = -1  # RadixAttention.sliding_window_size when the layer has none


def _host_list(device_values: Optional[torch.Tensor], cpu_values, n: int) -> List[int]:
    """First ``n`` lengths as ints.

    The device tensor is authoritative (it is what SGLang's tree builder and the Triton backend
    read; a host mirror can lag it in some scheduler paths); the host mirror is used only when
    the tensor is absent. On CPU ``.tolist()`` costs nothing; on GPU it is one sync per forward,
    acceptable for an oracle backend.
    """
    if device_values is not None:
        values = device_values.tolist()
    elif cpu_values is not None:
        values = cpu_values.tolist() if isinstance(cpu_values, torch.Tensor) else list(cpu_values)
    else:
        raise ValueError("neither a tensor nor a host list of lengths was given")
    return [int(x) for x in values[:n]]


def _target_verify_q_lens(spec_info, batch_size: int) -> List[int]:
    """Rows per request of a TARGET_VERIFY forward (ragged layout, else uniform)."""
    layout = getattr(spec_info, "ragged_verify_layout", None)
    if layout is not None:
        q_lens = _host_list(layout.verify_lens, layout.verify_lens_cpu, batch_size)
        if len(q_lens) != batch_size:
            raise ValueError(f"ragged_verify_layout has {len(q_lens)} requests, batch has {batch_size}")
        return q_lens
    per_req = int(getattr(spec_info, "num_tokens_per_req", -1) or -1)
    if per_req <= 0:
        per_req = int(spec_info.draft_token_num)
    return [per_req] * batch_size


class TorchSDPABackend(AttentionBackend):
    """Attention backend in plain torch SDPA with explicit masks (see the module docstring).

    One instance per model runner (target, draft-extend) and one per draft step (children of
    :class:`TorchSDPAMultiStepDraftBackend`). ``forward_metadata`` holds the current
    :class:`~sglang_ext.engine.attention.torch_sdpa_plan.AttentionPlan`.
    """

    #: read by the D-Cut glue (``dcut_glue.RAGGED_VERIFY_FLAG``): ragged TARGET_VERIFY is served
    supports_ragged_target_verify = True
    #: read by ``draft_extend_rows.RAGGED_DRAFT_EXTEND_FLAG``: DRAFT_EXTEND_V2 plans from the
    #: batch's own ``extend_seq_lens`` (any per-request row count), so the draft extend may run
    #: over the accepted rows only
    supports_ragged_draft_extend = True

    needs_cpu_seq_lens = True

    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.is_draft_runner = bool(getattr(model_runner, "is_draft_worker", False))
        self.max_context_len = int(model_runner.model_config.context_len)
        self.forward_metadata: Optional[AttentionPlan] = None
        self._workspace = KVWorkspace()  # padded K/V buffers reused by every layer and forward
        self._draft_round: Optional["DraftRound"] = None  # set by the multi-step container
        self._draft_step = -1
        self._verify_mask = None
        if not self.is_draft_runner:
            from sglang.srt.layers.attention.verify_mask import VerifyMask
            from sglang.srt.speculative.eagle_utils import TreeMaskMode

            # max_bs = 0: never "fits", so SGLang allocates an exactly sized FULL mask per step.
            self._verify_mask = VerifyMask(
                buffer=torch.empty(0, dtype=torch.bool, device=self.device),
                mode=TreeMaskMode.FULL_MASK,
                max_bs=0,
            )

    # ------------------------------------------------------------------ metadata
    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        self._draft_round = None  # planned directly: not a step of a container's round
        self.forward_metadata = self.build_plan(forward_batch)

    def build_plan(self, forward_batch: "ForwardBatch") -> AttentionPlan:
        """The plan of one forward, read from the live batch (never cached across batches)."""
        mode = forward_batch.forward_mode
        rp = forward_batch.req_pool_indices
        r2t = self.req_to_token_pool.req_to_token
        bs = 0 if rp is None else int(rp.shape[0])
        if mode.is_idle() or bs == 0:
            return empty_plan(self.device)
        if mode.is_decode():
            seq_lens = _host_list(forward_batch.seq_lens, forward_batch.seq_lens_cpu, bs)
            return plan_decode(r2t, rp, seq_lens)
        if mode.is_target_verify():
            spec_info = forward_batch.spec_info
            seq_lens = _host_list(forward_batch.seq_lens, forward_batch.seq_lens_cpu, bs)
            q_lens = _target_verify_q_lens(spec_info, bs)
            return plan_target_verify(r2t, rp, seq_lens, q_lens, spec_info.custom_mask)
        if not (mode.is_extend() or mode.is_draft_extend_v2()) or mode.is_dllm_extend() or mode.is_split_prefill():
            raise NotImplementedError(f"{BACKEND_NAME}: forward mode {mode.name} is not supported")
        # EXTEND, MIXED (run as extend), DRAFT_EXTEND_V2
        prefix = _host_list(forward_batch.extend_prefix_lens, forward_batch.extend_prefix_lens_cpu, bs)
        extend = _host_list(forward_batch.extend_seq_lens, forward_batch.extend_seq_lens_cpu, bs)
        return plan_extend(r2t, rp, prefix, extend)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(f"{BACKEND_NAME} runs eager only: pass disable_cuda_graph=True")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def get_cpu_graph_seq_len_fill_value(self):
        return 1

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        pass  # the mask and positions are read from the live spec_info at plan time

    @property
    def verify_mask(self) -> Optional["VerifyMask"]:
        """FULL_MASK layout on the target runner (so no ``_is_cpu`` flip is needed); None on the draft."""
        return self._verify_mask

    def support_triton(self):
        return False

    # ------------------------------------------------------------------ forward
    def _check_supported(self, layer: "RadixAttention", forward_batch: "ForwardBatch", kwargs) -> None:
        from sglang.srt.layers.radix_attention import AttentionType

        if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"{BACKEND_NAME}: only decoder self-attention is supported")
        window = layer.sliding_window_size
        if window is not None and window > NO_SLIDING_WINDOW:
            raise NotImplementedError(f"{BACKEND_NAME}: sliding-window attention is not supported")
        if kwargs.get("sinks") is not None:
            raise NotImplementedError(f"{BACKEND_NAME}: attention sinks are not supported")
        if getattr(forward_batch, "mha_return_lse", False) or kwargs.get("return_lse"):
            raise NotImplementedError(f"{BACKEND_NAME}: returning the LSE is not supported")
        if layer.logit_cap and layer.logit_cap > 0 and layer.logit_capping_method != "tanh":
            raise NotImplementedError(f"{BACKEND_NAME}: only tanh logit capping is supported")

    def _forward(self, q, k, v, layer: "RadixAttention", forward_batch: "ForwardBatch", save_kv_cache, kwargs):
        self._check_supported(layer, forward_batch, kwargs)
        if self._draft_round is None and self.forward_metadata is None:
            self.forward_metadata = self.build_plan(forward_batch)
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        q3 = q.reshape(-1, hq, layer.qk_head_dim)
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        if k is None and v is None:
            # KV-shared layers: this layer's rows were written by another layer at out_cache_loc.
            loc = forward_batch.out_cache_loc
            k3, v3 = k_cache[loc], v_cache[loc]
        elif k is None or v is None:
            raise ValueError("k and v must both be given or both be None")
        else:
            k3 = k.reshape(-1, hkv, layer.qk_head_dim)
            v3 = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
            if save_kv_cache:
                loc = KVWriteLoc.for_batch(forward_batch)
                if layer.k_scale is None and layer.v_scale is None:
                    self.token_to_kv_pool.set_kv_buffer(layer, loc, k3, v3)
                else:  # the pool may divide in place by the scales: protect k/v
                    self.token_to_kv_pool.set_kv_buffer(
                        layer, loc, k3.clone(), v3.clone(), layer.k_scale, layer.v_scale
                    )
        logit_cap = float(layer.logit_cap or 0.0)
        if self._draft_round is not None:
            rnd = self._draft_round
            if rnd.serves(q3, k3, v3, k_cache, v_cache, layer, save_kv_cache):
                out = run_draft_round_step(
                    rnd.plan, self._draft_step, q3, k3, v3, k_cache, v_cache, rnd.layer_state(layer.layer_id),
                    scaling=layer.scaling, logit_cap=logit_cap,
                )
                return out.reshape(-1, hq * layer.v_head_dim)
            if self.forward_metadata is None:
                self.forward_metadata = rnd.step_plan(self._draft_step)
        out = run_plan(
            self.forward_metadata,
            q3,
            k3,
            v3,
            k_cache,
            v_cache,
            scaling=layer.scaling,
            logit_cap=logit_cap,
            workspace=self._workspace,
        )
        return out.reshape(-1, hq * layer.v_head_dim)

    def forward_extend(
        self,
        q: torch.Tensor,  # [num_tokens, num_q_heads * qk_head_dim]
        k: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, qk_head_dim]; None: read back at out_cache_loc
        v: Optional[torch.Tensor],  # [num_tokens, num_kv_heads, v_head_dim]
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
        **kwargs,
    ) -> torch.Tensor:  # [num_tokens, num_q_heads * v_head_dim]
        """EXTEND, MIXED, TARGET_VERIFY and DRAFT_EXTEND_V2 (SGLang routes all of them here)."""
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def forward_decode(
        self,
        q: torch.Tensor,  # [batch_size (* topk for draft steps), num_q_heads * qk_head_dim]
        k: Optional[torch.Tensor],  # [batch_size (* topk), num_kv_heads, qk_head_dim]
        v: Optional[torch.Tensor],  # [batch_size (* topk), num_kv_heads, v_head_dim]
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
        **kwargs,
    ) -> torch.Tensor:  # [batch_size (* topk), num_q_heads * v_head_dim]
        """DECODE: plain decode, or one multi-step draft step when planned by the container."""
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, kwargs)


class DraftRound:
    """Shared state of one multi-step draft round (all draft steps, all draft layers).

    Built by :meth:`TorchSDPAMultiStepDraftBackend.init_forward_metadata`. Each step's keys are
    the committed prefix plus the branch's rows of the earlier steps; with a
    :class:`~sglang_ext.engine.attention.torch_sdpa_modes.DraftRoundPlan` the prefix is gathered
    once per layer and round, and every step appends its own rows
    (:func:`~sglang_ext.engine.attention.torch_sdpa_modes.run_draft_round_step`). Where that shortcut
    is not exact (a quantized or differently typed pool, a layer that does not write its rows,
    a request with no committed token) the step runs its own
    :func:`~sglang_ext.engine.attention.torch_sdpa_modes.plan_draft_decode` plan instead.
    """

    def __init__(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: List[int],
                 topk: int, num_steps: int):
        self._args = (req_to_token, req_pool_indices, seq_lens, topk, num_steps)
        self.plan: Optional[DraftRoundPlan] = plan_draft_round(req_to_token, req_pool_indices, seq_lens, topk, num_steps)
        self._layers: dict = {}
        self._step_plans: dict = {}

    def serves(self, q3, k3, v3, k_cache, v_cache, layer: "RadixAttention", save_kv_cache: bool) -> bool:
        """Whether the shared buffer gives exactly the step plan's keys for this layer call."""
        return (
            self.plan is not NO_DRAFT_ROUND
            and save_kv_cache
            and layer.k_scale is None
            and layer.v_scale is None
            and k_cache.dtype == q3.dtype == k3.dtype
            and v_cache.dtype == q3.dtype == v3.dtype
            and q3.shape[0] == self.plan.num_groups
        )

    def layer_state(self, layer_id: int) -> DraftRoundKV:
        return self._layers.setdefault(layer_id, DraftRoundKV())

    def step_plan(self, step: int) -> AttentionPlan:
        """The step's own plan (fallback path), built once per round."""
        if step not in self._step_plans:
            r2t, rp, seq_lens, topk, num_steps = self._args
            self._step_plans[step] = plan_draft_decode(r2t, rp, seq_lens, topk, num_steps, step)
        return self._step_plans[step]


class TorchSDPAMultiStepDraftBackend:
    """Per-step container for ``EagleDraftWorker``'s multi-step draft decode.

    ``attn_backends[j]`` serves draft step ``j`` (``0 <= j <= num_steps - 2``).
    :meth:`init_forward_metadata` runs once per draft round, before the steps, and pre-plans
    every child from the committed lengths ``s`` of that moment (the draft loop advances
    ``positions`` in place but never ``seq_lens``). Query rows are ``B * topk`` in
    ``(request, branch)`` row-major order; see
    :func:`~sglang_ext.engine.attention.torch_sdpa_modes.plan_draft_decode` for the kv layout.
    """

    needs_cpu_seq_lens = True

    def __init__(self, model_runner: "ModelRunner", topk: int, speculative_num_steps: int):
        self.topk = int(topk)
        self.speculative_num_steps = int(speculative_num_steps)
        page_size = int(getattr(model_runner.token_to_kv_pool, "page_size", 1) or 1)
        if page_size != 1 and self.topk > 1:
            raise NotImplementedError(f"{BACKEND_NAME}: topk > 1 drafting needs page_size 1, got {page_size}")
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.attn_backends: List[TorchSDPABackend] = [
            TorchSDPABackend(model_runner) for _ in range(self.speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_idle() or bs == 0:
            for child in self.attn_backends:
                child.forward_metadata = empty_plan(self.device)
                child._draft_round = None
            return
        seq_lens = _host_list(forward_batch.seq_lens, forward_batch.seq_lens_cpu, bs)
        rnd = DraftRound(
            self.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            seq_lens,
            self.topk,
            self.speculative_num_steps,
        )
        for step, child in enumerate(self.attn_backends):
            child.forward_metadata = None  # built on demand (fallback path) by DraftRound.step_plan
            child._draft_round = rnd
            child._draft_step = step

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(f"{BACKEND_NAME} runs eager only: pass disable_cuda_graph=True")


# ---------------------------------------------------------------------- registration
def create_torch_sdpa_backend(model_runner: "ModelRunner") -> TorchSDPABackend:
    """Factory stored in SGLang's ``ATTENTION_BACKENDS`` under :data:`BACKEND_NAME`."""
    return TorchSDPABackend(model_runner)


def around_create_backend(
    original_fn,
    self,
    backend_name: str,
    backend_map: dict,
    error_template: str,
    stamps_children: bool = False,
):
    """AROUND hook on ``DraftBackendFactory._create_backend``: offer ``torch_sdpa`` in the
    factory's local backend map (the multi-step container for draft decode, a plain backend on
    the draft runner for draft extend) and ``flashinfer_dcut`` as FlashInfer's entry (its draft
    forwards are SGLang's FlashInfer draft backends), then let upstream pick, wrap, stamp and
    raise as usual.
    """
    from sglang_ext.engine.attention.flashinfer_dcut import add_draft_backend_alias

    add_draft_backend_alias(backend_map)  # flashinfer_dcut -> SGLang's "flashinfer" draft backends
    factory = self
    if stamps_children:

        def make():
            return BACKEND_NAME, TorchSDPAMultiStepDraftBackend(
                factory.draft_model_runner, factory.topk, factory.speculative_num_steps
            )

    else:

        def make():
            return BACKEND_NAME, TorchSDPABackend(factory.draft_model_runner)

    backend_map.setdefault(BACKEND_NAME, make)
    return original_fn(self, backend_name, backend_map, error_template, stamps_children=stamps_children)


def register(*, apply_hooks: bool = False) -> None:
    """Make ``torch_sdpa`` usable by SGLang in this process (idempotent).

    1. ``ATTENTION_BACKENDS["torch_sdpa"]`` (``--attention-backend torch_sdpa`` / ``Engine``);
    2. ``torch_sdpa`` in the CLI choices of ``--attention-backend``/``--prefill-…``/``--decode-…``;
    3. an AROUND hook on ``DraftBackendFactory._create_backend`` through ``HookRegistry``, applied
       by SGLang's ``load_plugins()`` after all plugins ran. Pass ``apply_hooks=True`` outside a
       plugin load (tests, scripts) to apply pending hooks now.

    Examples
    --------
    >>> register(); register()  # doctest: +SKIP
    >>> from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # doctest: +SKIP
    >>> ATTENTION_BACKENDS["torch_sdpa"] is create_torch_sdpa_backend  # doctest: +SKIP
    True
    """
    from sglang_ext.engine.attention.registry import register_backend

    register_backend(BACKEND_NAME, create_torch_sdpa_backend, [(HOOK_DRAFT_BACKEND_FACTORY, around_create_backend)],
                     apply_hooks=apply_hooks)

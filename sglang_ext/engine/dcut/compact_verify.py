"""Compacted target verification: the kept rows of a pruned D-Cut step, and the one swap of the
target forward that runs over them (SGLang glue, shared by the EAGLE and DFlash runners).

:class:`CompactVerify` holds what the intercepted forward needs (kept rows, their tokens,
positions, mask and ragged layout); :class:`TargetForwardInterceptor` compacts SGLang's strided
TARGET_VERIFY forward batch to them, runs the original forward and scatters the outputs back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch

from sglang_ext.dcut import scatter_to_full


@dataclass
class CompactVerify:
    """Everything the intercepted target forward needs for one pruned step.

    Built by :meth:`DCutRunner.compact_verify` (both runners) from ``sglang_ext.dcut.compact_tree``;
    consumed by :class:`TargetForwardInterceptor`.
    ``num_tokens`` is the tier's verify width (kept rows plus pad rows).

    Examples
    --------
    >>> import torch
    >>> cv = CompactVerify(kept_index=torch.tensor([0, 1, 4, -1]), draft_token=torch.tensor([7, 8, 9, 0]),
    ...                    positions=torch.tensor([5, 6, 3, 0]), custom_mask=torch.ones(0, dtype=torch.bool),
    ...                    layout=None, total_nodes=8)
    >>> int((cv.kept_index >= 0).sum())  # kept rows; the last row is padding
    3
    """

    kept_index: torch.Tensor  # [num_tokens] int64, strided global id, PAD_INDEX on pad rows
    draft_token: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    custom_mask: torch.Tensor  # [mask_len] bool, compact FULL layout
    layout: Any  # RaggedVerifyLayout
    total_nodes: int  # bs * N (rows of the strided layout)


def make_ragged_layout(counts: torch.Tensor, qo_indptr: torch.Tensor, num_tokens: int):
    """SGLang's ``RaggedVerifyLayout`` for per-request verify lengths (device only, no host sync).

    Parameters
    ----------
    counts : torch.Tensor
        ``[batch_size]`` kept verify rows per request.
    qo_indptr : torch.Tensor
        ``[batch_size + 1]`` exclusive offsets of each request's rows (leading 0).
    num_tokens : int
        Rows of the compacted forward (the tier width; ``>= qo_indptr[-1]``, the rest is padding).

    Returns
    -------
    sglang.srt.speculative.ragged_verify.RaggedVerifyLayout

    Examples
    --------
    >>> import torch
    >>> lay = make_ragged_layout(torch.tensor([3, 1]), torch.tensor([0, 3, 4]), 4)
    >>> lay.verify_lens.tolist(), lay.extend_start_loc.tolist(), lay.graph_num_tokens
    ([3, 1], [0, 3], 4)
    """
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    return RaggedVerifyLayout(
        verify_lens=counts.to(torch.int32),  # [batch_size]
        graph_num_tokens=int(num_tokens),
        extend_start_loc=qo_indptr[:-1].to(torch.int32),  # [batch_size]
        qo_indptr_device=qo_indptr.to(torch.int32),  # [batch_size + 1]
    )


def reset_token_counts(fb: Any, device: Any, *, is_draft_worker: bool) -> None:
    """Recount a forward batch's non-padded tokens after its rows were swapped (compacted or restored)."""
    init = getattr(fb, "_init_num_token_non_padded", None)
    if init is not None:
        init(device=device, is_draft_worker=is_draft_worker)


def graph_ineligible_width(num_draft_tokens: int) -> int:
    """``num_tokens_per_req`` of a compacted verify: positive and != N, so SGLang's bs-keyed target
    graphs (captured at width N) refuse it (``DecodeCudaGraphRunner.can_run_graph`` lets widths
    <= 0 through).

    Examples
    --------
    >>> graph_ineligible_width(16)
    17
    """
    return int(num_draft_tokens) + 1


VerifyPlanSource = Union[CompactVerify, Callable[[Any], Optional[CompactVerify]]]
"""What :class:`TargetForwardInterceptor` compacts: a :class:`CompactVerify` known before the verify
(EAGLE), or a function ``forward_batch -> CompactVerify | None`` called at the TARGET_VERIFY forward
(DFlash, whose draft confidences exist only then; None runs that forward uncompacted)."""


class TargetForwardInterceptor:
    """Per-instance wrapper of ``target_worker.forward_batch_generation`` for one verify call: the
    one target-forward swap of both D-Cut runners (EAGLE and DFlash).

    The first TARGET_VERIFY forward batch (strided, ``bs * N`` rows) is compacted in place to the
    plan's kept rows, the original forward runs over them (planned for them: a plan SGLang made for
    the strided batch is not reused), the outputs are scattered back to the strided layout, and
    every compacted field of the forward batch is restored. Any other call (draft forwards,
    non-verify modes, a second verify) passes through unchanged; ``calls`` counts the TARGET_VERIFY
    forwards. Used as a context manager around one verify::

        with TargetForwardInterceptor(worker.target_worker, plan, verify_input=vi) as icpt:
            result = base_verify(batch)
        assert icpt.calls == 1

    Parameters
    ----------
    target_worker : sglang TpModelWorker
        The target worker whose ``forward_batch_generation`` is wrapped (instance attribute,
        removed again on exit).
    plan : CompactVerify or callable
        See :data:`VerifyPlanSource`.
    verify_input : sglang SpecInput, optional
        The step's verify input, when ``plan`` is known before SGLang builds the verify batch: its
        ``num_tokens_per_req`` is :func:`graph_ineligible_width` inside the context, so SGLang's
        verify preparation (``eagle_prepare_for_verify``: ``can_run_graph``, then ``load_batch``)
        does not plan a uniform graph for the strided batch that the compacted forward would
        replace (one attention plan per compacted step).
    """

    def __init__(self, target_worker: Any, plan: VerifyPlanSource, verify_input: Any = None):
        self.target_worker = target_worker
        self.plan = plan
        self.verify_input = verify_input
        self.calls = 0
        self._saved = None
        self._saved_width = None

    def __enter__(self):
        tw = self.target_worker
        self._had_instance_attr = "forward_batch_generation" in vars(tw)
        self._saved = vars(tw).get("forward_batch_generation")
        original = tw.forward_batch_generation

        def forward_batch_generation(*args, **kwargs):
            fb = kwargs.get("forward_batch")
            if not kwargs.get("is_verify", False) or fb is None or not fb.forward_mode.is_target_verify():
                return original(*args, **kwargs)
            self.calls += 1
            plan = self.plan if self.calls == 1 else None
            if plan is not None and not isinstance(plan, CompactVerify):
                plan = plan(fb)
            if plan is None:
                return original(*args, **kwargs)
            return self._run(original, fb, plan, args, kwargs)

        tw.forward_batch_generation = forward_batch_generation
        vi = self.verify_input
        n = int(getattr(vi, "draft_token_num", 0) or 0)
        if n > 1 and isinstance(self.plan, CompactVerify):
            self._saved_width = vi.num_tokens_per_req
            vi.num_tokens_per_req = graph_ineligible_width(n)
        return self

    def __exit__(self, *exc):
        tw = self.target_worker
        if self._had_instance_attr:
            tw.forward_batch_generation = self._saved
        else:
            vars(tw).pop("forward_batch_generation", None)
        if self._saved_width is not None:
            self.verify_input.num_tokens_per_req = self._saved_width
            self._saved_width = None
        return False

    def _run(self, original: Callable, fb: Any, p: CompactVerify, args, kwargs):
        saved = {
            "input_ids": fb.input_ids,
            "positions": fb.positions,
            "spec_info": fb.spec_info,
            "out_cache_loc": fb.out_cache_loc,
            "out_cache_loc_virtual": getattr(fb, "out_cache_loc_virtual", None),
            "out_cache_loc_is_physical": getattr(fb, "out_cache_loc_is_physical", False),
            "kv_loc_cols": getattr(fb, "kv_loc_cols", None),
        }
        saved["metadata_ready"] = getattr(fb, "forward_metadata_ready", None)
        spec = copy.copy(fb.spec_info)
        spec.custom_mask = p.custom_mask
        spec.positions = p.positions
        spec.ragged_verify_layout = p.layout
        # The kept nodes' strided ids, for attention backends that plan the window columns
        # themselves when SGLang made no kv_loc_plan (trees): flashinfer_dcut's verify_kept_cols.
        spec.dcut_kept_index = p.kept_index
        # A positive width != N: the uniform-width target graph is never replayed for a compact
        # step (DecodeCudaGraphRunner.can_run_graph; docs/sglang_internals.md#pruned-verification, step 6) ...
        n = int(getattr(spec, "draft_token_num", 0) or 0)
        if n > 1:
            spec.num_tokens_per_req = graph_ineligible_width(n)
        fb.spec_info = spec
        if saved["metadata_ready"]:
            # ... and a plan made for the strided batch is not reused: neither a graph pre-plan
            # (load_batch) ...
            fb.forward_metadata_ready = False
        if kwargs.get("skip_attn_backend_init"):
            # ... nor an eager one the caller asks to keep (DFlash: prepare_for_verify planned the
            # strided batch; TpModelWorker maps this deprecated flag onto forward_metadata_ready).
            kwargs = dict(kwargs, skip_attn_backend_init=None)
        fb.input_ids = p.draft_token
        fb.positions = p.positions
        plan = getattr(fb, "kv_loc_plan", None)
        translator = getattr(self.target_worker.model_runner, "kv_index_translator", None)
        if plan is not None and translator is not None:
            plan.bind(fb, translator, cols=p.kept_index)
        else:  # no plan: gather the strided window directly (pad rows -> sink slot 0)
            loc = saved["out_cache_loc"]
            fb.out_cache_loc = torch.where(p.kept_index >= 0, loc[p.kept_index.clamp(min=0)],
                                           torch.zeros_like(p.kept_index).to(loc.dtype))
        reset_token_counts(fb, self.target_worker.model_runner.device, is_draft_worker=False)
        try:
            result = original(*args, **kwargs)
        finally:
            if saved["metadata_ready"] is not None:
                fb.forward_metadata_ready = saved["metadata_ready"]
            fb.spec_info = saved["spec_info"]
            fb.input_ids = saved["input_ids"]
            fb.positions = saved["positions"]
            if plan is not None and translator is not None:
                plan.bind(fb, translator, cols=saved["kv_loc_cols"])
            fb.out_cache_loc = saved["out_cache_loc"]
            if hasattr(fb, "out_cache_loc_virtual"):
                fb.out_cache_loc_virtual = saved["out_cache_loc_virtual"]
            fb.out_cache_loc_is_physical = saved["out_cache_loc_is_physical"]
            reset_token_counts(fb, self.target_worker.model_runner.device, is_draft_worker=False)
        lo = result.logits_output
        if lo is not None:
            if lo.next_token_logits is not None:
                lo.next_token_logits = scatter_to_full(lo.next_token_logits, p.kept_index, p.total_nodes)
            if lo.hidden_states is not None:
                lo.hidden_states = scatter_to_full(lo.hidden_states, p.kept_index, p.total_nodes)
        return result

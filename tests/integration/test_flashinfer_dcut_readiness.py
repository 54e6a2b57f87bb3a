"""First-run failures of ``--attention-backend flashinfer_dcut`` a source review predicted, on CPU.

* EAGLE3 launch: SGLang's ``DraftBackendFactory`` maps ``flashinfer_dcut`` to FlashInfer's draft
  backends (``patches/draft_backend_factory.md``; FlashInfer's constructors are stubbed, no CUDA);
* DFlash: ``resolve_dflash_verify_mask_policy`` gives ``FlashInferDCutBackend`` FlashInfer's
  policy (no custom mask in the verify graphs; ``patches/dflash_mask_policy.md``), with the drift
  guard of that function and its caller;
* tier graphs share one set of fixed key-index / mask buffers (SGLang's own graph buffers when
  they are large enough) instead of one set per (bs, T) key;
* sliding-window / cross-attention backends (more than one FlashInfer wrapper): no compacted
  verify (the D-Cut glue reads ``supports_ragged_target_verify``), no tier graphs, a warning.

Budget: < 30 s (mostly the SGLang import).
"""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.engine.attention import flashinfer_dcut as fv
from sglang_ext.engine.dcut import graphs as dg


# ---------------------------------------------------------------- 1. EAGLE draft backends
@pytest.fixture()
def factory(monkeypatch):
    from sglang.srt.speculative import draft_utils

    from sglang_ext.engine.attention import torch_sdpa

    torch_sdpa.register(apply_hooks=True)  # the project's AROUND hook on _create_backend
    monkeypatch.setattr(draft_utils, "attention_backends", lambda: (fv.BACKEND_NAME, fv.BACKEND_NAME))
    monkeypatch.setattr(draft_utils, "get_spec", lambda: SimpleNamespace(speculative_attention_mode="prefill"))
    built = []

    def fake_decode(self):  # FlashInferMultiStepDraftBackend needs CUDA
        built.append("decode")
        return "flashinfer", SimpleNamespace(attn_backends=[SimpleNamespace(), SimpleNamespace()])

    def fake_extend(self):
        built.append("extend")
        return "flashinfer", SimpleNamespace()

    monkeypatch.setattr(draft_utils.DraftBackendFactory, "_create_flashinfer_decode_backend", fake_decode)
    monkeypatch.setattr(draft_utils.DraftBackendFactory, "_create_flashinfer_prefill_backend", fake_extend)
    runner = SimpleNamespace(draft_attention_backend=None, model_config=SimpleNamespace(hf_config=SimpleNamespace(),
                                                                                       hf_text_config=SimpleNamespace()))
    return draft_utils.DraftBackendFactory(runner, topk=1, speculative_num_steps=3), built


def test_eagle_draft_backends_for_flashinfer_dcut_are_flashinfers(factory):
    f, built = factory
    dec = f.create_decode_backend()  # raised "EAGLE is not supported in decode attention backend flashinfer_dcut"
    ext = f.create_draft_extend_backend()
    assert built == ["decode", "extend"]
    assert dec.decode_attention_backend_str == "flashinfer" and ext.prefill_attention_backend_str == "flashinfer"
    assert all(c.decode_attention_backend_str == "flashinfer" for c in dec.attn_backends)


def test_draft_backend_alias_keeps_an_existing_entry():
    m = {"flashinfer": "fi", fv.BACKEND_NAME: "own"}
    assert fv.add_draft_backend_alias(m) is False and m[fv.BACKEND_NAME] == "own"


def test_draft_factory_maps_still_hold_flashinfer():  # drift guard: the name the alias points at
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    for fn in (DraftBackendFactory.create_decode_backend, DraftBackendFactory.create_draft_extend_backend):
        src = inspect.getsource(fn)
        assert f'"{fv.DRAFT_BACKEND_BASE}": self._create_flashinfer_' in src


# ---------------------------------------------------------------- 2. DFlash verify mask policy
def test_dflash_mask_policy_targets():  # drift guard (patches/dflash_mask_policy.md)
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr
    from sglang.srt.speculative import dflash_utils

    fn = inspect.unwrap(dflash_utils.resolve_dflash_verify_mask_policy)
    assert list(inspect.signature(fn).parameters) == ["attn_backend"]
    assert "type(backend).__name__" in inspect.getsource(fn)
    assert fv.BASE_CLASS_NAME in dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS
    src = inspect.getsource(dcgr)
    # imported inside the capture function, so the patched module attribute is what the runner calls
    assert "from sglang.srt.speculative.dflash_utils import (\n                resolve_dflash_verify_mask_policy," in src
    assert fv.HOOK_DFLASH_MASK_POLICY == f"{dflash_utils.__name__}.resolve_dflash_verify_mask_policy"


def test_dflash_mask_policy_treats_flashinfer_dcut_like_flashinfer():
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.plugins.hook_registry import HookRegistry

    fv.register(apply_hooks=True)
    fv.register(apply_hooks=True)
    assert sum(h is fv.around_dflash_verify_mask_policy for _, h, _ in HookRegistry._hooks[fv.HOOK_DFLASH_MASK_POLICY]) == 1
    from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy  # as the graph runner does

    dcut = object.__new__(fv.flashinfer_dcut_backend_class())
    assert resolve_dflash_verify_mask_policy(dcut) == (fv.BACKEND_CLASS_NAME, False)  # was (…, True)
    assert resolve_dflash_verify_mask_policy(object.__new__(FlashInferAttnBackend)) == (fv.BASE_CLASS_NAME, False)
    assert resolve_dflash_verify_mask_policy(object())[1] is True  # other backends: upstream's answer


# ---------------------------------------------------------------- 4. shared graph buffers
MAX_CTX, MAX_BS, N = 100, 8, 4


def _backend(monkeypatch, sglang_buffers: bool):
    made = []
    monkeypatch.setattr(fv, "make_prefill_wrapper", lambda ws, bufs, backend="fa2": made.append(bufs) or bufs)
    be = object.__new__(fv.flashinfer_dcut_backend_class())
    be._dcut_graph_wrappers, be._dcut_graph_buffers = {}, None
    be._dcut_graph_max_bs, be._dcut_max_context_len = MAX_BS, MAX_CTX
    be.workspace_buffer, be.prefill_backend = torch.zeros(16, dtype=torch.uint8), "fa2"
    if sglang_buffers:  # what SGLang's init_cuda_graph_state allocates (max_num_tokens * max_context_len)
        be.cuda_graph_kv_indices = [torch.zeros(MAX_BS * N * MAX_CTX, dtype=torch.int32)]
        be.cuda_graph_custom_mask = torch.zeros(MAX_BS * N * MAX_CTX, dtype=torch.uint8)
    return be, made


@pytest.mark.parametrize("sglang_buffers", [True, False])
def test_tier_graphs_share_one_set_of_buffers(monkeypatch, sglang_buffers):
    be, made = _backend(monkeypatch, sglang_buffers)
    keys = dg.tier_graph_keys([1, 2, 4, 8], N)
    shapes = [(k.batch_size, k.num_tokens) for k in keys]
    pool = be.dcut_reserve_graph_buffers(shapes)
    for k in reversed(keys):
        be._dcut_wrappers(k.batch_size, k.num_tokens, True)
    assert len(made) == len(keys)
    storages = {b.kv_indices.untyped_storage().data_ptr() for b in made}
    masks = {b.custom_mask.untyped_storage().data_ptr() for b in made}
    indptrs = {b.qo_indptr.untyped_storage().data_ptr() for b in made}
    assert len(storages) == len(masks) == len(indptrs) == 1  # one allocation each, not one per key
    for k, b in zip(reversed(keys), made):  # FlashInfer fixes a graph's batch size from these lengths
        assert b.qo_indptr.shape[0] == k.batch_size + fv.PAD_REQUESTS + 1
        assert b.kv_last_page_len.shape[0] == k.batch_size + fv.PAD_REQUESTS
    per_key = sum(4 * s.kv_indices + s.packed_mask for s in (fv.graph_buffer_sizes(b, t, MAX_CTX) for b, t in shapes))
    if sglang_buffers:
        assert made[0].kv_indices is be.cuda_graph_kv_indices[0] and made[0].custom_mask is be.cuda_graph_custom_mask
    else:
        need = fv.shared_graph_buffer_sizes(shapes, MAX_CTX)
        assert (pool.kv_indices.numel(), pool.custom_mask.numel()) == (need.kv_indices, need.packed_mask)
        assert pool.nbytes() < per_key / 3  # the per-key buffers this replaces
    assert be.dcut_reserve_graph_buffers(shapes) is pool  # reserved once: captured addresses never move


def test_shared_buffers_refuse_a_graph_that_does_not_fit(monkeypatch):
    be, _ = _backend(monkeypatch, False)
    be.dcut_reserve_graph_buffers([(2, 4)])
    with pytest.raises(RuntimeError, match="does not fit the shared graph buffers"):
        be._dcut_wrappers(8, 32, True)


# ---------------------------------------------------------------- 5. more than one FlashInfer wrapper
def test_sliding_window_backend_keeps_full_width_and_warns(monkeypatch, caplog):
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    cls = fv.flashinfer_dcut_backend_class()
    for wrappers, ragged in ((2, False), (1, True)):
        monkeypatch.setattr(FlashInferAttnBackend, "__init__",
                            lambda self, mr, *a, w=wrappers, **k: setattr(self, "num_wrappers", w))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=fv.__name__):
            be = cls(SimpleNamespace(model_config=SimpleNamespace(context_len=MAX_CTX)))
        assert be.supports_ragged_target_verify is ragged  # read by the D-Cut glue (RAGGED_VERIFY_FLAG)
        assert ("sliding-window" in caplog.text) is (not ragged)
    be.num_wrappers = 2
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                         spec_info=SimpleNamespace(ragged_verify_layout=object()))
    with pytest.raises(RuntimeError, match="cannot run it"):  # never NotImplementedError at capture
        be.init_forward_metadata_out_graph(fb, in_capture=True)


def test_tier_graphs_skip_a_multi_wrapper_backend_with_a_warning(caplog):
    runner = SimpleNamespace(attn_backend=SimpleNamespace(num_wrappers=2), model_runner=SimpleNamespace(
        is_draft_worker=False, lora_manager=None), capture_forward_mode=None, ragged_verify_mode=False,
        backend=None, enable_pdmux=False, enable_two_batch_overlap=False, require_mlp_sync=False,
        attention_graph_variants=None, pp_size=1, is_encoder_decoder=False, captured_req_width=4)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    runner.capture_forward_mode = ForwardMode.TARGET_VERIFY
    runner.backend = object.__new__(FullCudaGraphBackend)
    cls = dg.dcut_verify_graph_runner_class()
    fv_cls = fv.flashinfer_dcut_backend_class()
    runner.attn_backend = object.__new__(fv_cls)
    runner.attn_backend.num_wrappers = 2
    reason = cls._dcut_unsupported_reason(runner)
    assert reason == dg.tier_graph_unsupported_reason(multiple_attention_wrappers=True)
    runner.attn_backend.num_wrappers = 1
    assert cls._dcut_unsupported_reason(runner) is None
    with caplog.at_level(logging.INFO, logger=dg.__name__):
        dg.log_unsupported(reason)
        dg.log_unsupported(dg.tier_graph_unsupported_reason(lora=True))
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.INFO]


def test_graph_state_targets():  # drift guard (patches/flashinfer_dcut_backend.md)
    import dataclasses

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    fn = FlashInferAttnBackend.init_cuda_graph_state
    assert list(inspect.signature(fn).parameters)[:3] == ["self", "max_bs", "max_num_tokens"]
    src = inspect.getsource(fn)
    # the buffers the tier wrappers share: int32 key indices (one per wrapper), a uint8 packed mask
    assert "self.cuda_graph_kv_indices = [cuda_graph_kv_indices]" in src and "dtype=torch.int32" in src
    assert "self.cuda_graph_custom_mask = torch.zeros(" in src and "dtype=torch.uint8" in src
    assert "(max_num_tokens * self.max_context_len)" in src  # large enough for every tier graph
    assert "seq_lens_sum" in {f.name for f in dataclasses.fields(ForwardBatch)}
    assert "init_cuda_graph_state" in vars(fv.flashinfer_dcut_backend_class())

"""Drift guards for the SGLang internals the ``torch_sdpa`` backend hooks or relies on.

See ``patches/draft_backend_factory.md`` and ``patches/attention_registry.md``. Each check fails
when SGLang renames a symbol or changes a signature or a layout the backend depends on, and the
behaviour checks show the hook and the registration doing what the patch files say.

Budget: < 30 s on the shared 2-core machine (mostly the one SGLang import).
"""

from __future__ import annotations

import argparse
import inspect
from types import SimpleNamespace

import pytest
import torch


def params(fn):
    return list(inspect.signature(fn).parameters.values())


# ---------------------------------------------------------------- DraftBackendFactory._create_backend
def test_create_backend_signature():
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    fn = inspect.unwrap(DraftBackendFactory._create_backend)
    ps = params(fn)
    assert [p.name for p in ps] == ["self", "backend_name", "backend_map", "error_template", "stamps_children"]
    assert ps[-1].default is False


def test_draft_backend_factory_attributes_and_callers():
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    init = [p.name for p in params(DraftBackendFactory.__init__)]
    assert init[:4] == ["self", "draft_model_runner", "topk", "speculative_num_steps"]
    src_decode = inspect.getsource(DraftBackendFactory.create_decode_backend)
    src_extend = inspect.getsource(DraftBackendFactory.create_draft_extend_backend)
    # both still route through _create_backend with a local map; decode stamps children
    assert "self._create_backend(" in src_decode and "stamps_children=True" in src_decode
    assert "self._create_backend(" in src_extend
    src_init = inspect.getsource(DraftBackendFactory.__init__)
    for attr in ("self.draft_model_runner", "self.topk", "self.speculative_num_steps"):
        assert attr in src_init


def test_hook_registry_api():
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    assert [p.name for p in params(HookRegistry.register)][:3] == ["target", "hook", "hook_type"]
    assert HookType.AROUND.value == "around"
    assert isinstance(HookRegistry._hooks, dict)  # read by register() for idempotency


# ---------------------------------------------------------------- registry, choices, base class
def test_attention_registry_api():
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention import attention_registry

    assert isinstance(attention_registry.ATTENTION_BACKENDS, dict)
    assert [p.name for p in params(attention_registry.register_attention_backend)] == ["name"]
    assert choices.add_attention_backend_choices.__self__ is choices.ATTENTION_BACKEND_CHOICES
    src = inspect.getsource(
        __import__(
            "sglang.srt.model_executor.model_runner_components.attention_backend_setup", fromlist=["x"]
        )._build_full_attention_backend_from_str
    )
    assert "ATTENTION_BACKENDS[backend_str](model_runner)" in src


def test_attention_backend_base_contract():
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    for name in ("init_forward_metadata", "forward", "forward_extend", "forward_decode",
                 "update_verify_buffers_to_fill_after_draft", "get_cuda_graph_seq_len_fill_value"):
        assert callable(getattr(AttentionBackend, name)), name
    assert isinstance(AttentionBackend.__dict__["verify_mask"], property)
    assert [p.name for p in params(AttentionBackend.forward_extend)][:7] == [
        "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"]
    assert [p.name for p in params(AttentionBackend.update_verify_buffers_to_fill_after_draft)] == [
        "self", "spec_info", "cuda_graph_bs"]


def test_verify_mask_and_layouts():
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.speculative.eagle_utils import TreeMaskMode, per_step_draft_out_cache_loc
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout
    from sglang.srt.speculative.spec_info import SpecInput

    vm = VerifyMask(buffer=torch.empty(0, dtype=torch.bool), mode=TreeMaskMode.FULL_MASK, max_bs=0)
    assert not vm.fits(1)
    assert {"verify_lens", "verify_lens_cpu", "qo_indptr_device", "graph_num_tokens"} <= set(
        RaggedVerifyLayout.__struct_fields__)
    assert SpecInput.ragged_verify_layout is None
    # the multi-step draft layout the container reproduces: loc[b*topk*steps + t*steps + i] at step i
    loc = torch.arange(2 * 2 * 3)
    per_step = per_step_draft_out_cache_loc(loc, 2, 2, 3)
    assert per_step[1].tolist() == [1, 4, 7, 10]


def test_forward_batch_fields_read_by_backend():
    import dataclasses

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    names = {f.name for f in dataclasses.fields(ForwardBatch)}
    assert {"forward_mode", "batch_size", "req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc",
            "extend_prefix_lens", "extend_seq_lens", "extend_prefix_lens_cpu", "extend_seq_lens_cpu",
            "spec_info", "out_cache_loc_is_physical"} <= names


# ---------------------------------------------------------------- behaviour
@pytest.fixture()
def registered():
    from sglang_ext.engine.attention import torch_sdpa as torch_backend

    torch_backend.register(apply_hooks=True)
    torch_backend.register(apply_hooks=True)
    return torch_backend


def test_register_is_idempotent(registered):
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    assert ATTENTION_BACKENDS["torch_sdpa"] is registered.create_torch_sdpa_backend
    assert ATTENTION_BACKEND_CHOICES.count("torch_sdpa") == 1
    ours = [h for _, h, _ in HookRegistry._hooks[registered.HOOK_DRAFT_BACKEND_FACTORY]
            if h is registered.around_create_backend]
    assert len(ours) == 1
    assert registered.HOOK_DRAFT_BACKEND_FACTORY in HookRegistry._patched
    assert DraftBackendFactory._create_backend is not inspect.unwrap(DraftBackendFactory._create_backend)


def test_cli_accepts_torch_sdpa(registered):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--attention-backend", "torch_sdpa",
                              "--prefill-attention-backend", "torch_sdpa", "--decode-attention-backend", "torch_sdpa"])
    assert (args.attention_backend, args.prefill_attention_backend, args.decode_attention_backend) == ("torch_sdpa",) * 3


def _stand_in_draft_runner(draft_backend):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    return SimpleNamespace(
        device="cpu",
        req_to_token_pool=ReqToTokenPool(size=2, max_context_len=16, device="cpu", enable_memory_saver=False),
        token_to_kv_pool=MHATokenToKVPool(size=32, page_size=1, dtype=torch.float32, head_num=1, head_dim=4,
                                          layer_num=1, device="cpu", enable_memory_saver=False),
        is_draft_worker=True,
        draft_attention_backend=draft_backend,
        model_config=SimpleNamespace(context_len=16, hf_config=SimpleNamespace(), hf_text_config=SimpleNamespace()),
    )


@pytest.fixture()
def factory_env(registered, monkeypatch):
    from sglang.srt.speculative import draft_utils

    # the factory reads the published server args; give it the pair a torch_sdpa launch would have
    monkeypatch.setattr(draft_utils, "attention_backends", lambda: ("torch_sdpa", "torch_sdpa"))
    monkeypatch.setattr(draft_utils, "get_spec", lambda: SimpleNamespace(speculative_attention_mode="prefill"))
    return draft_utils


def test_factory_builds_torch_sdpa_draft_backends(factory_env, registered):
    factory = factory_env.DraftBackendFactory(_stand_in_draft_runner(None), topk=2, speculative_num_steps=3)
    container = factory.create_decode_backend()
    assert isinstance(container, registered.TorchSDPAMultiStepDraftBackend)
    assert len(container.attn_backends) == 2 and (container.topk, container.speculative_num_steps) == (2, 3)
    assert container.decode_attention_backend_str == "torch_sdpa"
    assert all(c.prefill_attention_backend_str == "torch_sdpa" for c in container.attn_backends)
    extend = factory.create_draft_extend_backend()
    assert isinstance(extend, registered.TorchSDPABackend) and extend.verify_mask is None
    one_step = factory_env.DraftBackendFactory(_stand_in_draft_runner(None), topk=1, speculative_num_steps=1)
    assert one_step.create_decode_backend() is None  # upstream's steps <= 1 rule is kept


def test_factory_still_refuses_unknown_backends(factory_env):
    factory = factory_env.DraftBackendFactory(_stand_in_draft_runner("torch_native"), topk=1, speculative_num_steps=3)
    with pytest.raises(ValueError, match="EAGLE is not supported"):
        factory.create_decode_backend()

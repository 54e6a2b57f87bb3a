"""Drift guards for the SGLang internals the SpecExit glue hooks or relies on (``patches/specexit_*.md``,
``patches/model_architecture.md``): the targets exist with the expected signatures, and the source
still does what the hooks assume.

Budget: < 60 s (imports SGLang's scheduler and tokenizer-manager modules; no engine).
"""

from __future__ import annotations

import dataclasses
import inspect

from sglang_ext.engine.specexit import hooks as H


from drift_guard import param_names as _params  # noqa: E402
from drift_guard import resolve as _resolve  # noqa: E402


def test_every_hook_is_registered_by_the_plugin_and_documented():
    import os

    from sglang_ext.engine import plugin

    assert "register_specexit_hooks()" in inspect.getsource(plugin.register_hooks)
    root = os.path.join(os.path.dirname(__file__), "..", "..", "patches")
    index = open(os.path.join(root, "INDEX.md")).read()
    for target, doc in [(H.HOOK_TOKENIZED_OBJECT, "specexit_custom_params.md"),
                        (H.HOOK_OUTPUT_STREAMER, "specexit_output_streamer.md"),
                        (H.HOOK_META_INFO, "specexit_meta_info.md"),
                        (H.HOOK_INTERNAL_STATE, "specexit_internal_state.md"),
                        (H.HOOK_MODEL_ARCHITECTURE, "model_architecture.md")]:
        assert target in index and doc in index
        text = open(os.path.join(root, doc)).read()
        for part in ("**Target:**", "**Why:**", "**How:**", "**Upstream:**", "**Removal:**", "**Drift guard:**"):
            assert part in text, (doc, part)


def test_tokenized_object_target():
    fn = _resolve(H.HOOK_TOKENIZED_OBJECT)
    assert _params(fn)[:4] == ["self", "obj", "input_text", "input_ids"]
    src = inspect.getsource(fn)
    assert "sampling_params.verify(" in src and "sampling_params=sampling_params" in src
    from sglang.srt.entrypoints import http_server

    # a ValueError from the tokenizer manager becomes an HTTP error response (400 by default)
    assert "except ValueError" in inspect.getsource(http_server.serve_generate_request)


def test_output_streamer_targets():
    fn = _resolve(H.HOOK_OUTPUT_STREAMER)
    assert _params(fn) == ["self"]
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    assert "get_output_streamer_class()" in inspect.getsource(Scheduler.init_output_streamer)
    assert SchedulerOutputStreamer.has_additional_customized_info is False
    assert _params(SchedulerOutputStreamer.build_additional_customized_info) == ["self", "reqs"]
    assert _params(SchedulerOutputStreamer.is_request_level_customized_info_key) == ["self", "key"]
    src = inspect.getsource(SchedulerOutputStreamer._stream_output_generation)
    assert "self.build_additional_customized_info(" in src and "acc.output_reqs" in src
    # our subclass of the real class can be built like SGLang builds it (slots dataclass, kw-only)
    cls = H.streamer_class_with_specexit(SchedulerOutputStreamer)
    assert issubclass(cls, SchedulerOutputStreamer) and cls.has_additional_customized_info
    names = {f.name for f in dataclasses.fields(SchedulerOutputStreamer)}
    assert {"send_to_detokenizer", "rust_server"} <= names


def test_meta_info_target():
    fn = _resolve(H.HOOK_META_INFO)
    assert _params(fn) == ["self", "meta_info", "state", "customized_info", "index", "finish_reason"]
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    src = inspect.getsource(TokenizerManager._handle_batch_output)
    assert "self.update_request_meta_info(" in src and "customized_info = unwrap_from_pickle" in src


def test_internal_state_target():
    fn = _resolve(H.HOOK_INTERNAL_STATE)
    assert _params(fn) == ["self", "recv_req"]
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

    assert "internal_state" in GetInternalStateReqOutput.__annotations__  # a msgspec struct
    assert "draft_worker" in inspect.getsource(Scheduler.init_model_worker) or hasattr(Scheduler, "draft_worker")


def test_model_architecture_target():
    fn = _resolve(H.HOOK_MODEL_ARCHITECTURE)
    assert _params(fn) == ["model_config"]
    src = inspect.getsource(fn)
    assert "ModelRegistry.is_arch_supported" in src and "model_config.hf_config" in src
    assert "return model_cls, resolved_arch" in src  # the (class, architecture) pair the AROUND hook edits
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    from sglang_ext.engine.specexit import draft_models
    from sglang_ext.engine.specexit.checkpoint import (
        LEGACY_SPECEXIT_ARCHITECTURE,
        SPECEXIT_ARCHITECTURE,
        STANDARD_EAGLE3_ARCHITECTURES,
    )

    assert H.SPECEXIT_DRAFT_ARCHITECTURE == draft_models.ARCHITECTURE == LEGACY_SPECEXIT_ARCHITECTURE
    assert SPECEXIT_ARCHITECTURE == LlamaForCausalLMEagle3.__name__ in STANDARD_EAGLE3_ARCHITECTURES
    # the subclass relies on the parent's fc (nn.Linear, H rows) and its load_weights(name, tensor) loop
    assert "self.fc = torch.nn.Linear" in inspect.getsource(inspect.getmodule(LlamaForCausalLMEagle3).LlamaModel)
    assert _params(LlamaForCausalLMEagle3.load_weights) == ["self", "weights"]


def test_verify_result_fields():
    from sglang.srt.managers.utils import GenerationBatchResult

    names = {f.name for f in dataclasses.fields(GenerationBatchResult)}
    assert {"next_token_ids", "accept_lens", "new_seq_lens", "accept_index", "next_draft_input",
            "prepared_draft_extend_inputs", "speculative_num_draft_tokens", "logits_output"} <= names
    from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput

    assert "bonus_tokens" in {f.name for f in dataclasses.fields(EagleDraftInput)}
    assert {"draft_token", "draft_token_num"} <= {f.name for f in dataclasses.fields(EagleVerifyInput)}
    from sglang.srt.speculative import eagle_worker_common as common

    src = inspect.getsource(common.run_eagle_verify)
    # the fields the cut edits are the ones the commit produces, and the publish happens after verify
    for token in ("new_seq_lens=new_seq_lens", "accept_lens=accept_lens", "next_draft_input=next_draft_input",
                  "prepared_draft_extend_inputs=prepared_draft_inputs", "_finalize_accept_tree_path("):
        assert token in src, token
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    fbg = inspect.getsource(EAGLEWorkerV2.forward_batch_generation)
    assert fbg.index("self.verify(") < fbg.index("on_publish(batch_output.new_seq_lens)") < fbg.index(
        "_draft_extend_for_decode(")
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    lp = {f.name for f in dataclasses.fields(LogitsProcessorOutput)}
    assert {"hidden_states", "next_token_logits", "next_token_logprobs", "auxiliary_device_output"} <= lp


def test_auxiliary_output_protocol():
    from sglang.srt.managers import auxiliary_output as aux
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    assert _params(aux.append_auxiliary_output) == ["current", "output"]
    assert _params(aux.DeviceAuxiliaryOutput.copy_to_host) == ["self", "copy_tensor"]
    assert _params(aux.HostAuxiliaryOutput.consume) == ["self", "batch", "commits"]
    assert {f.name for f in dataclasses.fields(aux.CommittedTokens)} == {"output_index", "token_ids"}
    src = inspect.getsource(SchedulerBatchResultProcessor.process_batch_result_decode)
    # consumed after the tokens are committed and before the response is streamed
    assert src.index("req.output_ids.extend(") < src.index("self.consume_auxiliary_output(") < src.index(
        "self.output_streamer.stream_output(")
    from sglang.srt.managers.utils import GenerationBatchResult

    assert "copy_auxiliary_output_to_cpu" in inspect.getsource(GenerationBatchResult.copy_to_cpu)


def test_req_fields():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req, ReqKvInfo
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    assert "req_pool_idx" in {f.name for f in dataclasses.fields(ReqKvInfo)}
    init = inspect.getsource(Req.__init__)
    for attr in ("self.require_reasoning", "self.origin_input_ids", "self.output_ids", "self.sampling_params",
                 "self.kv = ReqKvInfo()"):
        assert attr in init, attr
    assert "self.to_finish" in inspect.getsource(Req.update_finish_state)
    assert _params(FINISH_ABORT.__init__) == ["self", "message", "status_code", "err_type"]
    assert "self.req_to_token = torch.zeros" in inspect.getsource(ReqToTokenPool.__init__)


def test_frontend_endpoint_target():
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    assert _params(RuntimeEndpoint._add_images) == ["self", "s", "data"]
    for method in (RuntimeEndpoint.generate, RuntimeEndpoint.generate_stream, RuntimeEndpoint._generate_http_request):
        src = inspect.getsource(method)
        assert "self._add_images(s, data)" in src
        # the body is posted after _add_images saw it
        assert src.index("self._add_images(s, data)") < src.index('"/generate"')
    assert '"sampling_params": {' in inspect.getsource(RuntimeEndpoint.generate)

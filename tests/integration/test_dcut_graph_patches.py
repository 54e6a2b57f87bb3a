"""Drift guards and CPU checks of the D-Cut tier verify graph runner (``patches/dcut_graph_runner.md``).

* Drift guards: the hooked ``ModelRunner._decode_cuda_graph_runner_cls`` and every
  ``DecodeCudaGraphRunner`` / registry / graph-backend internal the runner subclass overrides or
  calls (names, signatures, the source facts it relies on).
* The hook: which model runners get ``DCutVerifyGraphRunner`` (dcut on, target runner, flashinfer_dcut
  backend, plain ``DecodeCudaGraphRunner`` base, env switch), registration idempotent.
* The runner on CPU without CUDA graphs (instance built with ``object.__new__``): the capture keys
  and capture batch it hands to SGLang's ``capture_one_shape``; the replay path of a compacted
  EAGLE step through SGLang's real buffer registry (``build_decode_registry``), replay view
  (``_init_replay_attn_metadata_from_view``) and the ``flashinfer_dcut`` backend planning, down to the
  arguments of the graph wrapper's ``plan``; the eager fallback when no graph fits; uniform batches
  left to SGLang's ``can_run_graph``.

Budget: < 60 s (imports SGLang's model-executor modules on the loaded 2-core machine; no engine).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.engine.dcut import graphs as dg
from sglang_ext.engine.attention import flashinfer_dcut as fv


from drift_guard import param_names as _params  # noqa: E402
from drift_guard import resolve as _resolve  # noqa: E402


# ----------------------------------------------------------------------------- drift guards
def test_hook_target():
    fn = _resolve(dg.HOOK_DECODE_GRAPH_RUNNER_CLS)
    assert _params(fn) == ["self"]
    src = inspect.getsource(fn)
    assert "return DecodeCudaGraphRunner" in src and "UnoDecodeCudaGraphRunner" in src
    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup

    # the CUDA capture builds the class this method returns (CPU/NPU/XPU have their own runners)
    cap = inspect.getsource(cuda_graph_setup.capture_decode_graph)
    assert "model_runner._decode_cuda_graph_runner_cls" in cap and "GraphRunnerCls(model_runner)" in cap


def test_decode_graph_runner_internals():
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner as R

    assert _params(R.__init__)[:2] == ["self", "model_runner"]
    assert _params(R.capture_prepare) == ["self", "size", "stream_idx", "num_tokens"]
    assert _params(R.capture_one_shape) == ["self", "size", "forward", "stream_idx", "variant_label",
                                            "attention_variant"]
    assert _params(R._capture_one_stream) == ["self", "stream_idx"]
    assert _params(R._make_graph_key) == ["self", "size", "stream_idx", "variant_label", "attention_variant"]
    assert _params(R.can_run_graph) == ["self", "forward_batch"]
    assert _params(R.load_batch) == ["self", "forward_batch", "pp_proxy_tensors"]
    assert _params(R._init_replay_attn_metadata_from_view) == ["self", "forward_batch", "raw_bs", "bs", "num_tokens",
                                                               "glue_key", "attention_variant"]
    assert _params(R._validate_capture_hidden_mode) == ["self", "forward_batch"]
    assert _params(R._set_dp_real_num_tokens) == ["self", "raw_num_token"]
    one = inspect.getsource(R.capture_one_shape)
    # the pieces the tier capture steers: bs = size outside SGLang's ragged mode, our capture batch,
    # our key, SGLang's capture with the backend's metadata planned in capture mode
    assert "self._ragged_capture_slots(num_tokens) if self.ragged_verify_mode else size" in one
    assert "self.capture_prepare(" in one and "self._make_graph_key(" in one and "self.backend.capture_one(" in one
    assert "init_forward_metadata_out_graph(forward_batch, in_capture=True)" in one
    cap = inspect.getsource(R._capture)
    assert "self.backend.capture_session(self.stream)" in cap and "self._capture_one_stream(" in cap
    ex = inspect.getsource(R.execute)
    assert "self.load_batch(forward_batch, pp_proxy_tensors)" in ex
    assert "self.backend.replay(self._replay_graph_key, forward_batch)" in ex
    assert "next_token_logits[: self.raw_num_token]" in ex and "hidden_states[: self.raw_num_token]" in ex
    can = inspect.getsource(R.can_run_graph)
    # why a compacted step never replays a uniform graph (the interceptor sets num_tokens_per_req = N - 1)
    assert "spec_info.num_tokens_per_req != self.captured_req_width" in can
    view = inspect.getsource(R._init_replay_attn_metadata_from_view)
    assert "build_replay_fb_view(" in view and "attn_backend.init_forward_metadata_out_graph(fb_view)" in view
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as mod

    bv = inspect.getsource(mod.build_replay_fb_view)
    assert "spec_info=forward_batch.spec_info" in bv and "input_ids=buffers.input_ids[:num_tokens]" in bv
    from sglang.srt.model_executor.model_runner import ModelRunner

    fwd = inspect.getsource(ModelRunner._forward_raw)
    assert "self.decode_cuda_graph_runner.can_run_graph(forward_batch)" in fwd
    assert "self.decode_cuda_graph_runner.execute(" in fwd


def test_registry_padding_policies():
    """The padded tail of a replay: rows -> position 0 and sink slot 0, requests -> fill value, row 0."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import PaddingPolicy, build_decode_registry

    reg = build_decode_registry(device=torch.device("cpu"), max_bs=2, max_num_token=4, seq_len_fill_value=1,
                                cache_loc_dtype=torch.int64, share_pool=False)
    pol = {n: reg.get_slot(n).padding_policy for n in ("positions", "out_cache_loc", "req_pool_indices", "seq_lens")}
    assert pol == {"positions": PaddingPolicy.ZERO, "out_cache_loc": PaddingPolicy.ZERO,
                   "req_pool_indices": PaddingPolicy.ZERO, "seq_lens": PaddingPolicy.FILL_SENTINEL}
    assert _params(reg.fill_from)[0] == "forward_batch"
    assert {"raw_bs", "padded_bs", "raw_num_tokens", "padded_num_tokens", "pp_proxy_tensors"} <= set(
        _params(reg.fill_from))


def test_graph_backend_and_shape_key():
    from sglang.srt.model_executor.runner.shape_key import ShapeKey
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    assert [f for f in ShapeKey.__dataclass_fields__] == ["size", "stream_idx", "variant_label", "attention_variant"]
    # graphs and outputs are stored per key (any hashable ShapeKey), replayed by key
    cap = inspect.getsource(FullCudaGraphBackend.capture_one)
    assert "self._graphs[shape_key] = graph" in cap and "self._outputs[shape_key] = out" in cap
    assert "self._graphs[shape_key].replay()" in inspect.getsource(FullCudaGraphBackend.replay)
    uniform = ShapeKey(size=8)
    tier = ShapeKey(size=8, attention_variant=dg.TierGraphKey(8, 4, True).variant)
    assert uniform != tier and len({uniform, tier}) == 2


def test_eagle_verify_input_needs_a_mask_for_window_packing():
    """Why ``flashinfer_verify`` hands the uniform copy a never-short placeholder mask: SGLang's EAGLE
    packing reads ``custom_mask.numel()`` (drift guard: drop the placeholder when this stops failing)."""
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    src = inspect.getsource(EagleVerifyInput.generate_attn_arg_prefill)
    assert "self.custom_mask.numel() < mask_numel" in src
    spec = _eagle_spec(n=4, width=4, mask=None)
    with pytest.raises(AttributeError):
        spec.generate_attn_arg_prefill(req_pool_indices=torch.tensor([0]), paged_kernel_lens=torch.tensor([2]),
                                       paged_kernel_lens_sum=2, translator=_Translator(torch.ones(2, 10)), plan=None)


# ----------------------------------------------------------------------------- hook selection
def test_hook_registration_idempotent():
    from sglang.srt.plugins.hook_registry import HookRegistry

    dg.register_hooks()
    dg.register_hooks()
    hooks = [h for _, h, _ in HookRegistry._hooks.get(dg.HOOK_DECODE_GRAPH_RUNNER_CLS, ())]
    assert hooks.count(dg._around_decode_cuda_graph_runner_cls) == 1


def test_plugin_registers_the_hook_on_cuda_and_it_is_documented():
    import os

    from sglang_ext.engine import plugin

    src = inspect.getsource(plugin.register_hooks)
    cuda_block = src[src.index("if torch.cuda.is_available():"):]
    assert "register_dcut_graph_hooks()" in cuda_block  # only where the flashinfer_dcut backend can exist
    root = os.path.join(os.path.dirname(__file__), "..", "..", "patches")
    index = open(os.path.join(root, "INDEX.md")).read()
    assert dg.HOOK_DECODE_GRAPH_RUNNER_CLS in index and "dcut_graph_runner.md" in index
    text = open(os.path.join(root, "dcut_graph_runner.md")).read()
    for part in ("**Target:**", "**Why:**", "**How:**", "**Upstream:**", "**Removal:**", "**Drift guard:**"):
        assert part in text, part
    for test in ("test_hook_target", "test_decode_graph_runner_internals", "test_registry_padding_policies"):
        assert test in text and test in globals()


def _model_runner(*, dcut="auto", draft=False, speculative=True, backend=None):
    from sglang_ext.config import DCutConfig, ExtensionConfig, SpecExitConfig
    from sglang_ext.config import attach_extension_config

    sa = SimpleNamespace()
    attach_extension_config(sa, ExtensionConfig(specexit=SpecExitConfig(), dcut=DCutConfig(mode=dcut)))
    spec = SimpleNamespace(is_speculative=lambda: speculative, is_dflash_family=lambda: False)
    return SimpleNamespace(server_args=sa, is_draft_worker=draft, spec_algorithm=spec, attn_backend=backend)


def test_select_graph_runner_class(monkeypatch):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    be = object.__new__(fv.flashinfer_dcut_backend_class())
    runner_cls = dg.dcut_verify_graph_runner_class()
    assert issubclass(runner_cls, DecodeCudaGraphRunner) and dg.dcut_verify_graph_runner_class() is runner_cls
    for name in ("capture_prepare", "_capture_one_stream", "_make_graph_key", "can_run_graph", "load_batch"):
        assert name in vars(runner_cls), name
    base = DecodeCudaGraphRunner
    monkeypatch.delenv(dg.TIER_GRAPHS_ENV, raising=False)
    assert dg.select_graph_runner_class(base, _model_runner(backend=be)) is runner_cls
    assert dg.select_graph_runner_class(base, _model_runner(backend=be, dcut="off")) is base
    assert dg.select_graph_runner_class(base, _model_runner(backend=be, draft=True)) is base
    assert dg.select_graph_runner_class(base, _model_runner(backend=be, speculative=False)) is base
    assert dg.select_graph_runner_class(base, _model_runner(backend=object())) is base  # e.g. stock flashinfer
    uno = type("UnoLike", (DecodeCudaGraphRunner,), {})
    assert dg.select_graph_runner_class(uno, _model_runner(backend=be)) is uno
    monkeypatch.setenv(dg.TIER_GRAPHS_ENV, "0")
    assert dg.select_graph_runner_class(base, _model_runner(backend=be)) is base
    # through the AROUND hook's calling convention
    monkeypatch.delenv(dg.TIER_GRAPHS_ENV)
    assert dg._around_decode_cuda_graph_runner_cls(lambda self: base, _model_runner(backend=be)) is runner_cls


# ----------------------------------------------------------------------------- runner on CPU
class _Translator:
    """Stands in for SGLang's KV-index translator (its packing needs Triton): gathers ``req_to_token``."""

    def __init__(self, r2t):
        self.r2t = r2t

    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, **kw):
        for b in range(req_pool_indices.numel()):
            s, e = int(indptr[b]), int(indptr[b + 1])
            out[s:e] = self.r2t[int(req_pool_indices[b]), : e - s]
        return True


def _eagle_spec(n, width, mask, layout=None):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    spec = EagleVerifyInput(draft_token=torch.zeros(width, dtype=torch.long), custom_mask=mask,
                            positions=torch.zeros(width, dtype=torch.long), retrieve_index=None,
                            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
                            spec_steps=n - 1, topk=1, draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL,
                            seq_lens_sum=None, seq_lens_cpu=None)
    spec.ragged_verify_layout = layout
    return spec


class _Wrapper:
    def __init__(self):
        self.plans = []

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))


def _backend(r2t, wrapper, keys_asked):
    be = object.__new__(fv.flashinfer_dcut_backend_class())
    be.indices_updater_prefill = SimpleNamespace(attn_backend=SimpleNamespace(kv_index_translator=_Translator(r2t)),
                                                 num_qo_heads=8, num_kv_heads=2, head_dim=16,
                                                 q_data_type=torch.bfloat16, data_type=torch.bfloat16)
    be.num_wrappers = 1
    be.prefill_wrappers_verify = [wrapper]
    be._dcut_graph_buffers, be._dcut_graph_max_bs, be._dcut_max_context_len = None, MAX_BS, 16
    be.workspace_buffer = torch.zeros(8, dtype=torch.uint8)

    def dcut_wrappers(bs, num_tokens, use_custom_mask):  # the (bs, T) graph wrapper (FlashInfer on GPU)
        keys_asked.append((bs, num_tokens, use_custom_mask))
        return [wrapper]

    be._dcut_wrappers = dcut_wrappers
    return be


N, FILL, MAX_BS = 4, 1, 8


def _runner(be, table):
    from sglang.srt.model_executor.cuda_graph_buffer_registry import build_decode_registry
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    r = object.__new__(dg.dcut_verify_graph_runner_class())
    reg = build_decode_registry(device=torch.device("cpu"), max_bs=MAX_BS, max_num_token=MAX_BS * N,
                                seq_len_fill_value=FILL, cache_loc_dtype=torch.int64, share_pool=False)
    names = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens", "seq_lens_cpu")
    r.buffer_registry = reg
    r.buffers = SimpleNamespace(**{k: reg.get_slot(k).buffer for k in names}, encoder_lens=None,
                                mamba_track_indices=None, num_token_non_padded=None)
    for k in names:  # stale values of an earlier replay: the padded tail must be reset
        r.buffers.__dict__[k].fill_(7)
    r.model_runner = SimpleNamespace(lora_manager=None, hisparse_coordinator=None, is_draft_worker=False,
                                     spec_algorithm=SimpleNamespace(is_ngram=lambda: False),
                                     model=SimpleNamespace(forward="model.forward"))
    r.attn_backend = be
    r.backend = object.__new__(FullCudaGraphBackend)
    r.capture_forward_mode = ForwardMode.TARGET_VERIFY
    r.capture_hidden_mode = CaptureHiddenMode.FULL
    r.captured_req_width = N
    r.seq_len_fill_value = FILL
    r.deepep_adapter = SimpleNamespace(replay=lambda: None)
    r._metadata_glue = None
    r._early_verify_metadata = None
    for flag in ("enable_pdmux", "is_encoder_decoder", "require_mlp_tp_gather", "require_attn_tp_gather",
                 "require_mlp_sync", "ragged_verify_mode", "record_nolora_graph", "disable_padding",
                 "enable_two_batch_overlap"):
        setattr(r, flag, False)
    r.attention_graph_variants = None
    r.pp_size = 1
    r.max_bs = MAX_BS
    r.capture_bs = [1, 2, 4, 8]
    r.dcut_tiers = (0.25, 0.5, 0.75, 1.0)
    r.dcut_masked = True
    r.dcut_table = table
    r.dcut_unsupported = None
    r.dcut_graph_replays = r.dcut_eager_steps = 0
    r._dcut_capture_key = None
    return r


def _compact_batch(r2t, rp, prefix, keep, extra_pad_rows=1):
    """A compacted EAGLE verify batch as ``TargetForwardInterceptor`` hands it to the model runner."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    from sglang_ext.dcut import build_full_mask, compact_tree, retrive_from_parents
    from sglang_ext.engine.dcut.compact_verify import make_ragged_layout

    bs = keep.shape[0]
    parent = torch.tensor([[-1, 0, 0, 1]] * bs)
    nt, ns = retrive_from_parents(parent)
    width = int(keep.sum()) + extra_pad_rows
    tokens = torch.arange(100, 100 + bs * N)
    pos = (prefix.unsqueeze(1) + torch.arange(N)).reshape(-1)
    ct = compact_tree(keep, tokens, pos, nt, ns, num_tokens=width)
    mask = build_full_mask(ct.tree_block, ct.counts, prefix)[0]
    spec = _eagle_spec(N, width, mask, make_ragged_layout(ct.counts, ct.qo_indptr, width))
    spec.num_tokens_per_req = N - 1
    loc = torch.where(ct.kept_index >= 0, r2t[rp.repeat_interleave(N), pos][ct.kept_index.clamp(min=0)], 0)
    fb = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=ct.draft_token.clone(),
        positions=torch.where(ct.kept_index >= 0, ct.positions, 0), out_cache_loc=loc.to(torch.int64),
        req_pool_indices=rp.clone(), seq_lens=prefix.clone(), seq_lens_cpu=prefix.clone(),
        seq_lens_sum=int(prefix.sum()), max_seq_len_host=None, out_cache_loc_virtual=None, kv_loc_plan=None,
        kv_loc_cols=ct.kept_index, max_seq_len_override=None, spec_info=spec, lora_ids=None,
        can_run_decode_cuda_graph=True, replace_embeds=None, capture_hidden_mode=CaptureHiddenMode.FULL,
        mrope_positions=None, encoder_lens=None)
    return fb, ct, mask


def test_compacted_step_replays_a_padded_tier_graph():
    gen = torch.Generator().manual_seed(3)
    r2t = (torch.randperm(MAX_BS * 16, generator=gen) + 1).view(MAX_BS, 16)  # slot 0 = sink
    wrapper, asked = _Wrapper(), []
    be = _backend(r2t, wrapper, asked)
    table = dg.TierGraphTable(dg.tier_graph_keys([1, 2, 4, 8], N))
    r = _runner(be, table)
    rp, prefix = torch.tensor([5, 2, 7]), torch.tensor([3, 6, 2])
    keep = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)  # counts 3, 2, 1
    fb, ct, mask = _compact_batch(r2t, rp, prefix, keep)
    width, kept = int(fb.input_ids.shape[0]), int(keep.sum())
    assert width == 7
    live_spec, live_layout = fb.spec_info, fb.spec_info.ragged_verify_layout

    assert r.can_run_graph(fb) is True
    r.load_batch(fb)
    key = dg.TierGraphKey(8, 4, True)  # smallest T >= 7 with bs >= 3 (bs 4, tier 0.5)
    from sglang.srt.model_executor.runner.shape_key import ShapeKey

    assert r._replay_graph_key == ShapeKey(size=8, attention_variant=key.variant)
    assert (r.raw_bs, r.raw_num_token, r.bs) == (3, width, 4) and r.dcut_graph_replays == 1
    assert fb.spec_info is live_spec and live_spec.ragged_verify_layout is live_layout  # live batch untouched
    b = r.buffers
    assert torch.equal(b.input_ids[:width], fb.input_ids) and torch.equal(b.out_cache_loc[:width], fb.out_cache_loc)
    assert b.positions[width:8].tolist() == [0] and b.out_cache_loc[width:8].tolist() == [0]  # sink, position 0
    assert b.seq_lens[:4].tolist() == [3, 6, 2, FILL] and b.req_pool_indices[:4].tolist() == [5, 2, 7, 0]

    assert asked == [(4, 8, True)]  # the (bs, T) graph wrapper of the flashinfer_dcut backend
    (qo, kv_ip, kv_idx, last, hq, hkv, d, page), kw = wrapper.plans[-1]
    # zero-row request 3 (graph's bs 4); rows 6..7 form the plan's padding request (sink keys only)
    assert qo.tolist() == [0, 3, 5, 6, 6, 8]
    want_ip, want_idx = [0], []
    for bi, u_list in enumerate([[0, 1, 3], [0, 2], [0]]):
        p = int(prefix[bi])
        want_idx += r2t[int(rp[bi]), :p].tolist() + [int(r2t[int(rp[bi]), p + u]) for u in u_list]
        want_ip.append(len(want_idx))
    want_idx += r2t[0, :FILL].tolist()  # zero-row request: the fill-value prefix of request row 0
    want_ip.append(len(want_idx))
    want_idx += [fv.SINK_SLOT] * 3  # padding request: 2 rows over 3 sink keys
    want_ip.append(len(want_idx))
    assert kv_ip.tolist() == want_ip and kv_idx.tolist() == want_idx
    assert last.tolist() == [1] * 5 and (hq, hkv, d, page) == (8, 2, 16, fv.PAGE_SIZE)
    assert kw["causal"] is False and torch.equal(kw["custom_mask"][: mask.numel()], mask)  # live cells unchanged
    assert bool(kw["custom_mask"][mask.numel():].all())  # the padding request's cells (and spare ones)


def test_eager_fallback_and_uniform_batches_go_to_sglang():
    gen = torch.Generator().manual_seed(4)
    r2t = (torch.randperm(MAX_BS * 16, generator=gen) + 1).view(MAX_BS, 16)
    wrapper, asked = _Wrapper(), []
    table = dg.TierGraphTable(dg.tier_graph_keys([1, 2, 4], N))  # largest tier graph: (4, 12)
    r = _runner(_backend(r2t, wrapper, asked), table)
    rp, prefix = torch.tensor([1, 2, 3, 4]), torch.tensor([2, 2, 2, 2])
    keep = torch.ones(4, N, dtype=torch.bool)
    keep[0, 3] = False  # 15 kept rows + 1 pad > every tier graph
    fb, _, _ = _compact_batch(r2t, rp, prefix, keep)
    assert r.can_run_graph(fb) is False and r.dcut_eager_steps == 1
    keep = torch.ones(5, N, dtype=torch.bool)
    keep[:, 3] = False
    fb5, _, _ = _compact_batch(r2t, torch.arange(5), torch.full((5,), 2), keep)  # 5 requests > every graph's bs
    assert r.can_run_graph(fb5) is False and r.dcut_eager_steps == 2
    fb_mask_off, _, _ = _compact_batch(r2t, rp[:1], prefix[:1], torch.tensor([[1, 1, 0, 0]], dtype=torch.bool))
    fb_mask_off.spec_info.custom_mask = None  # a causal step, only tree-mask graphs captured
    assert r.can_run_graph(fb_mask_off) is False
    # a uniform verify batch (no layout) is SGLang's: replayable up to max_bs
    uni = SimpleNamespace(**{**fb.__dict__, "spec_info": _eagle_spec(N, 4 * N, None), "batch_size": 4})
    assert r.can_run_graph(uni) is True
    assert r.can_run_graph(SimpleNamespace(**{**uni.__dict__, "batch_size": MAX_BS + 1})) is False
    # without tier graphs a compacted step is rejected by SGLang's width check (eager, as before)
    r.dcut_table = dg.TierGraphTable()
    fb_small, _, _ = _compact_batch(r2t, rp[:1], prefix[:1], torch.tensor([[1, 1, 0, 0]], dtype=torch.bool))
    assert r.can_run_graph(fb_small) is False
    assert asked == [] and wrapper.plans == []


def test_capture_of_tier_graphs(monkeypatch):
    """``_capture_one_stream``: SGLang's graphs first, then every tier key largest first through
    ``capture_one_shape`` with the key active; ``capture_prepare`` gives SGLang's capture batch T rows,
    the capture layout and mask, which the flashinfer_dcut backend plans into the (bs, T) wrapper."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner.shape_key import ShapeKey

    r2t = torch.arange(1, MAX_BS * 16 + 1).view(MAX_BS, 16)
    wrapper, asked = _Wrapper(), []
    r = _runner(_backend(r2t, wrapper, asked), dg.TierGraphTable())
    CAPTURE_SEQ = 2  # noqa: N806 -- what SGLang's capture batch holds (its fill value; 2 here to tell them apart)
    events = []
    monkeypatch.setattr(DecodeCudaGraphRunner, "_capture_one_stream", lambda self, stream_idx=None: events.append(
        ("uniform", stream_idx)))

    def fake_sglang_capture_prepare(self, size, stream_idx=None, num_tokens=None):
        fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=size,
                             input_ids=torch.zeros(num_tokens, dtype=torch.long),
                             req_pool_indices=torch.zeros(size, dtype=torch.long),
                             seq_lens=torch.full((size,), CAPTURE_SEQ), seq_lens_sum=CAPTURE_SEQ * size,
                             kv_loc_plan=None,
                             kv_loc_cols=None, spec_info=_eagle_spec(N, num_tokens, torch.ones(1, dtype=torch.bool)))
        events.append(("prepare", size, num_tokens))
        return fb, "backend", None

    monkeypatch.setattr(DecodeCudaGraphRunner, "capture_prepare", fake_sglang_capture_prepare)

    def fake_capture_one_shape(self, size, forward, stream_idx=None, variant_label=None, attention_variant=None):
        key = self._dcut_capture_key
        assert key is not None and size == key.batch_size and forward == "model.forward"
        fb, _, _ = self.capture_prepare(size, stream_idx=stream_idx, num_tokens=size * N)  # SGLang passes bs * N
        assert self._make_graph_key(size, stream_idx, None, None) == ShapeKey(size=key.num_tokens,
                                                                              attention_variant=key.variant)
        self.attn_backend.init_forward_metadata_out_graph(fb, in_capture=True)
        events.append(("captured", key))

    monkeypatch.setattr(type(r), "capture_one_shape", fake_capture_one_shape)
    r._capture_one_stream(None)
    keys = dg.tier_graph_keys([1, 2, 4, 8], N)
    assert events[0] == ("uniform", None)
    assert [e[1] for e in events if e[0] == "captured"] == list(reversed(keys))
    assert [(e[1], e[2]) for e in events if e[0] == "prepare"] == [(k.batch_size, k.num_tokens) for k in reversed(keys)]
    assert r.dcut_table.keys == tuple(keys) and r._dcut_capture_key is None and r.dcut_unsupported is None
    assert asked == [(k.batch_size, k.num_tokens, True) for k in reversed(keys)]
    for (qo, kv_ip, kv_idx, *_), kw in wrapper.plans:  # each capture plan has exactly T rows, a valid mask
        t = int(qo[-1])
        assert t in {k.num_tokens for k in keys} and int(qo[-2]) == t  # the padding request has no rows
        cells = dg.capture_mask((qo[1:-1] - qo[:-2]).tolist(), CAPTURE_SEQ).numel()  # prefix = capture seq_lens
        assert kw["custom_mask"].numel() == cells + t * (t + 1) and bool(kw["custom_mask"].all())
    pool = r.attn_backend._dcut_graph_buffers  # reserved once, before the first tier capture, for every key
    assert pool is not None and all(
        pool.fits(fv.graph_buffer_sizes(k.batch_size, k.num_tokens, r.attn_backend._dcut_max_context_len)) for k in keys)
    assert r._make_graph_key(4) == ShapeKey(size=4)  # outside a tier capture: SGLang's key

    # an unsupported configuration captures SGLang's graphs only
    r2 = _runner(_backend(r2t, _Wrapper(), []), dg.TierGraphTable())
    r2.model_runner.lora_manager = object()
    events.clear()
    r2._capture_one_stream(None)
    assert events == [("uniform", None)] and len(r2.dcut_table) == 0 and r2.dcut_unsupported == "LoRA"


def test_tier_graph_stats_reach_the_live_state():
    """``internal_states[i].dcut.tier_graphs``: the runner's replay counts via the scheduler, None without it."""
    from sglang_ext.engine.dcut.hooks import tier_graph_stats

    gen = torch.Generator().manual_seed(5)
    r2t = (torch.randperm(MAX_BS * 16, generator=gen) + 1).view(MAX_BS, 16)
    r = _runner(_backend(r2t, _Wrapper(), []), dg.TierGraphTable(dg.tier_graph_keys([1, 2, 4, 8], N)))
    keep = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.bool)
    fb, _, _ = _compact_batch(r2t, torch.tensor([5, 2]), torch.tensor([3, 6]), keep)
    assert r.can_run_graph(fb) is True
    r.load_batch(fb)

    def scheduler(graph_runner):
        mr = SimpleNamespace(decode_cuda_graph_runner=graph_runner)
        return SimpleNamespace(draft_worker=SimpleNamespace(target_worker=SimpleNamespace(model_runner=mr)))

    stats = tier_graph_stats(scheduler(r))
    assert stats == {"tier_graphs": len(r.dcut_table), "unsupported": r.dcut_unsupported, "replays": 1,
                     "eager_steps": 0}
    assert stats["tier_graphs"] > 0
    assert tier_graph_stats(scheduler(None)) is None  # CPU / eager: no graph runner
    assert tier_graph_stats(SimpleNamespace()) is None  # not a speculative scheduler


def test_model_runner_keeps_the_decode_graph_runner():
    """Drift guard of ``tier_graph_stats``: SGLang stores the captured decode runner on the model runner."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    src = inspect.getsource(ModelRunner.init_decode_cuda_graph)
    assert "self.decode_cuda_graph_runner = capture.runner" in src

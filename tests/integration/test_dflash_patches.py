"""Drift guards for the SGLang internals the DFlash D-Cut worker and the ``flashinfer_dcut`` backend
rely on (``patches/dflash_worker_v2.md``, ``patches/flashinfer_dcut_backend.md``).

Budget: < 60 s (imports SGLang's DFlash worker and FlashInfer backend modules; no engine).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_dflash_worker_targets():
    import sglang.srt.speculative.dflash_worker_v2 as m

    W = m.DFlashWorkerV2
    assert _params(W.__init__) == ["self", "server_args", "gpu_id", "nccl_port", "target_worker"]
    assert _params(W.forward_batch_generation) == ["self", "batch", "on_publish", "grammar_barrier",
                                                   "pp_proxy_tensors"]
    assert _params(W.init_cuda_graphs) == ["self"] and _params(W._maybe_build_draft_sampler) == ["self"]
    assert _params(W._greedy_sample_from_vocab_parallel_head) == ["self", "hidden_states", "lm_head", "chunk_size"]
    assert _params(W._accept_block) == ["self", "candidates", "next_token_logits", "sampling_info", "draft_input",
                                        "prefix_lens", "bs", "target_predict"]
    src = inspect.getsource(W.forward_batch_generation)
    # the seams the subclass hooks, in this order: eager greedy head, target verify, accept
    i_head = src.index("self._greedy_sample_from_vocab_parallel_head(")
    i_verify = src.index("self.target_worker.forward_batch_generation(\n            batch=None,")
    i_accept = src.index("= self._accept_block(")
    assert i_head < i_verify < i_accept
    assert "is_verify=True" in src[i_verify:i_accept] and "forward_batch=verify_forward_batch" in src[i_verify:i_accept]
    assert "self._draft_sampler.out[" in src and "candidates = draft_tokens" in src
    # the strided verify batch is planned before the forward and the forward is asked to keep that
    # plan; the flag is mapped onto the ready mark, which the compacted forward drops to re-plan
    assert "verify_input.prepare_for_verify(" in src[:i_verify] and "skip_attn_backend_init=" in src[i_verify:i_accept]
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    assert "forward_batch.apply_deprecated_skip_attn_backend_init(skip_attn_backend_init)" in inspect.getsource(
        TpModelWorker.forward_batch_generation)
    assert "self.mark_forward_metadata_ready()" in inspect.getsource(ForwardBatch.apply_deprecated_skip_attn_backend_init)
    # commit and draft-KV materialization read only the committed prefix rows (pruned rows never read)
    assert "commit_lens=commit_lens" in src[i_accept:] and "cache_loc_2d=" in src[i_accept:]
    assert "record_stream" in src  # CPU blocker 4 of the module note (still there)
    init_src = inspect.getsource(W.init_cuda_graphs)
    assert "self._draft_sampler = self._maybe_build_draft_sampler()" in init_src
    assert "make_draft_sampler_capture_hook(self._draft_sampler)" in init_src
    assert hasattr(m, "SIMULATE_ACC_LEN")
    acc = inspect.getsource(W._accept_block)
    assert "compute_dflash_correct_drafts_and_bonus(" in acc and "_compute_dflash_accept_bonus_triton_unchecked(" in acc


def test_dflash_sampled_accept_target():
    """The sampled branch of ``_accept_block`` that a pruned sampled step caps (``clamp_to_kept_prefix``):
    its condition, the target-only chain speculative sampling it calls (point-mass draft: zero draft
    probabilities), the commit helper the cap re-runs, and the caller's recompute of ``new_seq_lens``."""
    import sglang.srt.speculative.dflash_utils as u
    import sglang.srt.speculative.dflash_worker_v2 as m

    acc = inspect.getsource(m.DFlashWorkerV2._accept_block)
    assert "not _is_all_greedy(sampling_info) and is_dflash_sampling_verify_available()" in acc
    assert "target_predict is None and" in acc and "compute_dflash_sampling_correct_drafts_and_bonus(" in acc
    assert callable(m.is_dflash_sampling_verify_available)
    spec = inspect.getsource(u.compute_dflash_sampling_correct_drafts_and_bonus)
    assert "draft_probs = torch.zeros_like(target_probs)" in spec
    assert "tree_speculative_sampling_target_only(" in spec
    assert _params(m._commit_accept) == ["candidates", "accept_len", "bonus_tokens"]
    out, commit = m._commit_accept(torch.tensor([[5, 6, 7, 8]]), torch.tensor([1]), torch.tensor([9]))
    assert out.tolist() == [[6, 9, 8, 0]] and commit.tolist() == [2]
    fwd = inspect.getsource(m.DFlashWorkerV2.forward_batch_generation)
    assert "if new_seq_lens is None:\n                new_seq_lens = prefix_lens + commit_lens" in fwd


def test_dflash_draft_sampler_target():
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

    assert _params(_DflashDraftSampler.__init__) == ["self", "weight", "block_size", "num_org", "org_vocab_start",
                                                     "max_bs", "tp_group"]
    s = _DflashDraftSampler(weight=torch.zeros(6, 2), block_size=3, num_org=5, org_vocab_start=0, max_bs=2)
    assert s.out.shape == (4,) and s.tp_size == 1 and s.num_org == 5 and s.block_size == 3
    src = inspect.getsource(_DflashDraftSampler.__init__)
    for name in ("local_max", "local_arg", "gathered_max", "gathered_ids", "best_rank", "selected_ids"):
        assert f"self.{name} = " in src


def test_dflash_verify_input_target():
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    names = [f.name for f in dataclasses.fields(DFlashVerifyInput)]
    for f in ("draft_token", "positions", "draft_token_num", "custom_mask", "num_tokens_per_req",
              "ragged_verify_layout", "kv_loc_plan", "kv_loc_cols"):
        assert f in names
    vi = DFlashVerifyInput(draft_token=torch.zeros(8, dtype=torch.long), positions=torch.arange(8), draft_token_num=4)
    assert vi.num_tokens_per_req == 4 and vi.custom_mask is None and vi.ragged_verify_layout is None
    gen = inspect.getsource(DFlashVerifyInput.generate_attn_arg_prefill)
    assert "layout.qo_indptr_device" in gen and "layout.verify_lens" in gen


def test_flashinfer_backend_targets():
    from sglang.srt.layers.attention import flashinfer_backend as fb
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    B = fb.FlashInferAttnBackend
    assert _params(B.__init__) == ["self", "model_runner", "skip_prefill", "kv_indptr_buf", "kv_last_page_len_buf",
                                   "init_new_workspace"]
    assert _params(B.init_forward_metadata) == ["self", "forward_batch"]
    assert _params(B.init_forward_metadata_out_graph) == ["self", "forward_batch", "in_capture"]
    assert [f.name for f in dataclasses.fields(fb.PrefillMetadata)][:3] == ["prefill_wrappers", "use_ragged",
                                                                             "extend_no_prefix"]
    init = inspect.getsource(B.__init__)
    for name in ("self.prefill_wrappers_verify", "self.workspace_buffer", "self.num_wrappers",
                 "self.prefill_backend", "self.indices_updater_prefill"):
        assert name in init
    upd = inspect.getsource(fb.FlashInferIndicesUpdaterPrefill.__init__)
    for name in ("self.num_qo_heads", "self.num_kv_heads", "self.head_dim", "self.data_type", "self.q_data_type",
                 "self.attn_backend"):
        assert name in upd
    # the stock graph path still refuses ragged verify (what the subclass replaces)
    assert "does not support ragged verify in cuda graph" in inspect.getsource(B.init_forward_metadata_out_graph)
    for cls in (EagleVerifyInput,):
        assert _params(cls.generate_attn_arg_prefill)[:6] == ["self", "req_pool_indices", "paged_kernel_lens",
                                                              "paged_kernel_lens_sum", "translator", "plan"]
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    assert _params(DFlashVerifyInput.generate_attn_arg_prefill)[:6] == [
        "self", "req_pool_indices", "paged_kernel_lens", "paged_kernel_lens_sum", "translator", "plan"]
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention import attention_registry

    assert callable(attention_registry.register_attention_backend) and callable(choices.add_attention_backend_choices)


def test_flashinfer_dcut_without_cuda_parses_but_refuses_to_build():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_ext.engine.attention import flashinfer_dcut as fv

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the backend may be buildable")
    assert fv.register() is False
    assert fv.BACKEND_NAME in ATTENTION_BACKEND_CHOICES and fv.BACKEND_NAME in ATTENTION_BACKENDS
    with pytest.raises(RuntimeError, match="--attention-backend flashinfer_dcut: needs a CUDA device"):
        ATTENTION_BACKENDS[fv.BACKEND_NAME](object())


def test_flashinfer_dcut_backend_plans_ragged_verify_from_the_batch():
    """The backend subclass builds on CPU; its ragged-verify planning (kept columns from
    ``kv_loc_cols``, chain prefix otherwise, compact mask passthrough) drives ``wrapper.plan``."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang_ext.dcut import build_full_mask, chain_keep_mask, chain_retrive, compact_tree
    from sglang_ext.engine.attention import flashinfer_dcut as fv
    from sglang_ext.engine.dcut.compact_verify import make_ragged_layout

    cls = fv.flashinfer_dcut_backend_class()
    assert issubclass(cls, FlashInferAttnBackend) and fv.flashinfer_dcut_backend_class() is cls
    assert "init_forward_metadata" in vars(cls) and "init_forward_metadata_out_graph" in vars(cls)

    bs, n = 3, 4
    r2t = (torch.arange(bs * 20, dtype=torch.int32) + 1).view(bs, 20)
    rp, p = torch.tensor([2, 0, 1]), torch.tensor([3, 5, 2])

    class WindowSpec(DFlashVerifyInput):  # SGLang's packing needs the Triton translator; same layout here
        def generate_attn_arg_prefill(self, *, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum,
                                      translator, plan, **kw):
            assert self.ragged_verify_layout is None and self.custom_mask is None  # the uniform copy
            ip, kv = fv.window_kv(r2t, req_pool_indices, paged_kernel_lens, self.draft_token_num)
            return kv, ip, None, None

    keep = chain_keep_mask(torch.tensor([1, 3, 0]), n)
    nt, ns = chain_retrive(bs, n)
    width = 8
    ct = compact_tree(keep, torch.arange(bs * n), torch.arange(bs * n), nt, ns, num_tokens=width)
    calls = []
    wrapper = SimpleNamespace(plan=lambda *a, **kw: calls.append((a, kw)))
    be = object.__new__(cls)
    be.indices_updater_prefill = SimpleNamespace(attn_backend=SimpleNamespace(kv_index_translator=None), num_qo_heads=8,
                                                 num_kv_heads=2, head_dim=16, q_data_type=torch.bfloat16,
                                                 data_type=torch.bfloat16)
    be.prefill_wrappers_verify, be.num_wrappers = [wrapper], 1
    for with_cols, tree_mask in ((False, False), (True, True)):
        spec = WindowSpec(draft_token=torch.zeros(width, dtype=torch.long), positions=torch.zeros(width, dtype=torch.long),
                          draft_token_num=n)
        spec.ragged_verify_layout = make_ragged_layout(ct.counts, ct.qo_indptr, width)
        mask = build_full_mask(ct.tree_block, ct.counts, p)[0] if tree_mask else None
        spec.custom_mask = mask
        fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec, batch_size=bs,
                             req_pool_indices=rp, seq_lens=p, seq_lens_sum=int(p.sum()), kv_loc_plan=None,
                             input_ids=torch.zeros(width, dtype=torch.long),
                             kv_loc_cols=ct.kept_index if with_cols else None)
        calls.clear()
        be.init_forward_metadata(fb)
        assert isinstance(be.forward_metadata, PrefillMetadata) and be.forward_metadata.prefill_wrappers == [wrapper]
        (qo, kv_ip, kv_idx, last, hq, hkv, d, page), kw = calls[0]
        wip, wkv = fv.window_kv(r2t, rp, p, n)
        want = fv.plan_verify(wip, wkv, p, ct.qo_indptr, fv.chain_kept_cols(ct.qo_indptr, width), mask, num_tokens=width)
        assert torch.equal(qo, want.qo_indptr) and torch.equal(kv_ip, want.kv_indptr)
        assert torch.equal(kv_idx, want.kv_indices) and (hq, hkv, d, page) == (8, 2, 16, fv.PAGE_SIZE)
        assert kw["causal"] is (not tree_mask) and (kw["custom_mask"] is None) is (not tree_mask)
        assert "packed_custom_mask" not in kw  # FlashInfer packs (byte offsets per request)
        if tree_mask:
            assert torch.equal(kw["custom_mask"], want.custom_mask)
        assert fb.spec_info is spec and spec.ragged_verify_layout is not None  # the batch is not modified

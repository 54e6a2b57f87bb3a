"""D-Cut for DFlash blocks on CPU tensors of SGLang's own DFlash pieces.

``DFlashWorkerV2`` cannot run on the CPU testbed (see the module docstring of
``sglang_ext.engine.dcut.dflash``), so the worker's D-Cut path is exercised piece by piece with
the real SGLang objects it touches: ``DFlashVerifyInput``, ``_DflashDraftSampler``,
``DFlashWorkerV2._accept_block`` (greedy torch path; its sampled branch with a stand-in for the
CUDA-only sampling kernel), ``RaggedVerifyLayout``, the project's compacted-forward interceptor, and
the torch attention backend's TARGET_VERIFY planner driving a one-layer attention target with a real
KV pool. The lossless check compares the pruned step with the unpruned step of the same target; the
sampled check is statistical (tolerance in ``test_sampled_accept_cut_is_exact_in_distribution``).

Budget: < 120 s (SGLang import ~30 s on the loaded 2-core machine; every case is small).
"""

from __future__ import annotations

import doctest
import math
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _DflashDraftSampler

import sglang_ext.engine.dcut.dflash as dw
from sglang_ext.config import DCutConfig
from sglang_ext.engine.attention.torch_sdpa import TorchSDPABackend
from sglang_ext.engine.attention.torch_sdpa_plan import run_plan
from sglang_ext.engine.dcut.dflash import (
    NO_TOKEN,
    ConfidenceDraftSampler,
    DFlashDCutRunner,
    DFlashPrune,
    DFlashStepState,
)
from sglang_ext.engine.dflash_worker import ExtDFlashWorker


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def _no_runtime_context(monkeypatch):
    """The exemption check reads one server flag from SGLang's runtime context (none in tests)."""
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_spec", lambda: SimpleNamespace(speculative_use_rejection_sampling=False))


class FakeRank0Group:
    """Rank 0 of a 2-rank TP group: ``all_gather_into_tensor`` appends rank 1's precomputed
    tensors, in call order."""

    world_size = 2

    def __init__(self, others):
        self.others = list(others)

    def all_gather_into_tensor(self, out, local):
        other = self.others.pop(0)
        out.copy_(torch.cat([local.reshape(-1), other.reshape(-1).to(local.dtype)]))


def _req(grammar=None):
    sp = SimpleNamespace(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
                         min_new_tokens=0)
    return SimpleNamespace(grammar=grammar, return_logprob=False, sampling_params=sp)


def _runner(n, mode, conf=None):
    worker = SimpleNamespace(speculative_num_draft_tokens=n, topk=1, selector=None, lilicorr=None, _is_domino=False,
                             target_worker=SimpleNamespace(), _draft_sampler=None)
    runner = DFlashDCutRunner(worker, DCutConfig(mode=mode))
    if conf is not None:
        runner.state = DFlashStepState(batch=None, eager_ran=True, eager_conf=conf.reshape(-1))
    return worker, runner


def _verify_input(bs, n, seq_lens, gen):
    tokens = torch.randint(1, 50, (bs * n,), generator=gen)
    pos = (seq_lens.unsqueeze(1) + torch.arange(n)).reshape(-1)
    return DFlashVerifyInput(draft_token=tokens, positions=pos, draft_token_num=n)


def _brute_keep(scores, budget):
    """Kept drafts per request: the ``budget`` best (score desc, slot asc) survival slots."""
    bs, k = scores.shape
    items = sorted(((-float(scores[b, j]), j, b) for b in range(bs) for j in range(k)))
    keep = [0] * bs
    for _, j, b in items[:budget]:
        keep[b] += 1
    return keep


# ----------------------------------------------------------------------------- docs
def test_doctests_pass():
    res = doctest.testmod(dw)
    assert res.attempted >= 8 and res.failed == 0


# ----------------------------------------------------------------------------- confidences
@pytest.mark.parametrize("org_start", [0, 7])
def test_confidence_sampler_tokens_match_sglang_sampler_tp1(org_start):
    gen = torch.Generator().manual_seed(0)
    bs, block, hid, vocab, num_org = 3, 5, 16, 50, 48
    w = torch.randn(vocab, hid, generator=gen)
    hs = torch.randn(bs * block, hid, generator=gen)
    ref = _DflashDraftSampler(weight=w, block_size=block, num_org=num_org, org_vocab_start=org_start, max_bs=4)
    ours = ConfidenceDraftSampler.like(ref)
    ref(hs)
    ours(hs)
    n = bs * (block - 1)
    assert torch.equal(ours.out[:n], ref.out[:n])
    rows = hs.view(bs, block, hid)[:, 1:].reshape(-1, hid)
    probs = torch.softmax(rows.double() @ w[:num_org].double().T, dim=-1)
    assert torch.equal(ours.out[:n] - org_start, probs.argmax(dim=-1))
    assert torch.allclose(ours.conf_out[:n].double(), probs.max(dim=-1).values, atol=1e-5)
    assert ours.conf_out.shape[0] == ref.out.shape[0]  # same capacity (max_bs * (block - 1))


def test_confidence_sampler_tp2_matches_full_vocabulary():
    gen = torch.Generator().manual_seed(1)
    bs, block, hid, shard = 2, 4, 8, 20
    w_full = torch.randn(2 * shard, hid, generator=gen)
    hs = torch.randn(bs * block, hid, generator=gen)
    rows = hs.view(bs, block, hid)[:, 1:].reshape(-1, hid)
    mx1, arg1, lse1 = dw.shard_stats(rows, w_full[shard:])  # what rank 1 contributes
    ref = _DflashDraftSampler(weight=w_full[:shard], block_size=block, num_org=shard, org_vocab_start=0, max_bs=2,
                              tp_group=FakeRank0Group([mx1, arg1 + shard]))
    ours = ConfidenceDraftSampler(weight=w_full[:shard], block_size=block, num_org=shard, org_vocab_start=0,
                                  max_bs=2, tp_group=FakeRank0Group([mx1, arg1 + shard, lse1]))
    ref(hs)
    ours(hs)
    n = rows.shape[0]
    probs = torch.softmax(rows.double() @ w_full.double().T, dim=-1)
    assert torch.equal(ref.out[:n], probs.argmax(dim=-1))
    assert torch.equal(ours.out[:n], ref.out[:n])
    assert torch.allclose(ours.conf_out[:n].double(), probs.max(dim=-1).values, atol=1e-5)


def test_head_confidences_tp2_and_padding_rows():
    gen = torch.Generator().manual_seed(2)
    hid = 8
    w0, w1 = torch.randn(12, hid, generator=gen), torch.randn(10, hid, generator=gen)
    h = torch.randn(5, hid, generator=gen)
    mx1, _, lse1 = dw.shard_stats(h, w1)
    # rank 0 holds 12 rows of which 10 are real vocabulary (2 padding rows must be ignored)
    conf = dw.head_confidences(h, w0, 10, FakeRank0Group([mx1.float(), lse1]), chunk_size=8)
    probs = torch.softmax(h.double() @ torch.cat([w0[:10], w1]).double().T, dim=-1)
    assert torch.allclose(conf.double(), probs.max(dim=-1).values, atol=1e-6)


# ----------------------------------------------------------------------------- accept
def _accept_worker(prune, block):
    w = object.__new__(ExtDFlashWorker)
    w._target_worker = None
    w._selector_sample = None
    w.block_size = block
    w._use_triton_accept_bonus = False
    w._tp_sync = SimpleNamespace(sync=lambda site, t: None)
    w.dcut = SimpleNamespace(state=SimpleNamespace(prune=prune))
    return w


def test_accept_block_stops_at_kept_prefix():
    block, vocab = 6, 30
    gen = torch.Generator().manual_seed(3)
    target = torch.randint(0, vocab, (4, block), generator=gen)  # target argmax per row
    true_len = [5, 3, 0, 4]  # drafts the target would accept
    cand = torch.randint(0, vocab, (4, block), generator=gen)
    for b, length in enumerate(true_len):
        for j in range(1, block):
            cand[b, j] = target[b, j - 1] if j <= length else (target[b, j - 1] + 1) % vocab
    logits = torch.nn.functional.one_hot(target.reshape(-1), vocab).float()
    keep = torch.tensor([2, 5, 5, 0])
    w = _accept_worker(DFlashPrune(keep_lens=keep, compact=None), block)
    prefix = torch.tensor([10, 20, 30, 40])
    acc, commit, bonus, out, _ = w._accept_block(candidates=cand.clone(), next_token_logits=logits,
                                                 sampling_info=None, draft_input=None, prefix_lens=prefix, bs=4)
    exp_acc = [min(t, k) for t, k in zip(true_len, keep.tolist())]
    assert acc.tolist() == exp_acc
    assert commit.tolist() == [a + 1 for a in exp_acc]
    assert bonus.tolist() == [int(target[b, a]) for b, a in enumerate(exp_acc)]
    for b, a in enumerate(exp_acc):
        row = out[b].tolist()
        assert row[:a] == cand[b, 1:a + 1].tolist() and row[a] == int(target[b, a])
        assert NO_TOKEN not in row  # restored past the commit
        assert row[a + 1:block - 1] == cand[b, a + 2:].tolist()
    # without a prune the stock acceptance runs (request 0 accepts all 5 of its drafts)
    w.dcut.state.prune = None
    acc_full, *_ = w._accept_block(candidates=cand.clone(), next_token_logits=logits, sampling_info=None,
                                   draft_input=None, prefix_lens=prefix, bs=4)
    assert acc_full.tolist() == true_len


# ----------------------------------------------------------------------------- planning
def test_plan_fixed_ratio_global_top_k_and_compaction():
    gen = torch.Generator().manual_seed(4)
    bs, n = 4, 8
    conf = torch.rand(bs, n - 1, generator=gen) * 0.6 + 0.4
    seq_lens = torch.tensor([5, 9, 3, 7])
    vi = _verify_input(bs, n, seq_lens, gen)
    worker, runner = _runner(n, 0.5, conf)
    batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=None, reqs=[_req() for _ in range(bs)],
                            return_logprob=False)
    decision, prune = runner.plan(worker, batch, vi)
    width = math.ceil(bs * n * 0.5)
    scores = torch.cumprod(conf.double(), dim=1)
    keep = _brute_keep(scores, width - bs)
    assert prune.keep_lens.tolist() == keep
    assert decision.padded_tokens == width and int(decision.verified_tokens) == bs + sum(keep)
    assert decision.pruned
    assert decision.tier == "0.5" and decision.mode == "ratio"
    ki = prune.compact.kept_index.tolist()
    exp = [b * n + j for b in range(bs) for j in range(keep[b] + 1)]
    assert ki == exp + [-1] * (width - len(exp))
    assert prune.compact.draft_token[: len(exp)].tolist() == vi.draft_token[exp].tolist()
    assert prune.compact.positions[: len(exp)].tolist() == vi.positions[exp].tolist()
    lay = prune.compact.layout
    assert lay.verify_lens.tolist() == [k + 1 for k in keep] and lay.graph_num_tokens == width
    assert lay.qo_indptr_device.tolist() == [0] + torch.cumsum(torch.tensor(keep) + 1, 0).tolist()
    assert prune.compact.custom_mask is None and prune.compact.total_nodes == bs * n


def test_plan_exemptions_sampling_and_uncaptured():
    gen = torch.Generator().manual_seed(5)
    bs, n = 3, 6
    conf = torch.full((bs, n - 1), 0.5)
    seq_lens = torch.tensor([4, 4, 4])
    vi = _verify_input(bs, n, seq_lens, gen)
    worker, runner = _runner(n, 0.25, conf)
    reqs = [_req(), _req(grammar=object()), _req()]
    batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=None, reqs=reqs, return_logprob=False)
    decision, prune = runner.plan(worker, batch, vi)
    assert prune.keep_lens[1].item() == n - 1  # grammar request keeps its whole block
    assert runner.metrics.exempt_requests["grammar"] == 1 and decision.exempt_requests == 1
    assert prune.keep_lens[0].item() < n - 1 and prune.keep_lens[2].item() < n - 1
    # width = tier width of the 2 prunable requests + the exempt block
    assert decision.padded_tokens == math.ceil(2 * n * 0.25) + n

    # sampled batches are pruned like greedy ones (no whole-step exemption): same confidences, same cut
    greedy_all = SimpleNamespace(seq_lens=seq_lens, sampling_info=None, reqs=[_req() for _ in range(bs)],
                                 return_logprob=False)
    _, greedy_prune = runner.plan(worker, greedy_all, vi)
    sampled = SimpleNamespace(seq_lens=seq_lens, sampling_info=SimpleNamespace(is_all_greedy=False),
                              reqs=[_req() for _ in range(bs)], return_logprob=False)
    decision, prune = runner.plan(worker, sampled, vi)
    assert prune is not None and decision.exempt_requests == 0
    assert prune.keep_lens.tolist() == greedy_prune.keep_lens.tolist() and int(prune.keep_lens.sum()) < bs * (n - 1)
    assert decision.verified_tokens < bs * n
    assert "sampling" not in runner.metrics.exempt_requests

    runner.state = DFlashStepState(batch=None, eager_ran=True, eager_conf=None)  # quantized head: no confidences
    greedy = SimpleNamespace(seq_lens=seq_lens, sampling_info=None, reqs=[_req() for _ in range(bs)],
                             return_logprob=False)
    decision, prune = runner.plan(worker, greedy, vi)
    assert prune is None and runner.metrics.uncaptured_steps == 1


def test_unsupported_drafters_disable_pruning():
    worker = SimpleNamespace(speculative_num_draft_tokens=8, topk=1, selector=object(), lilicorr=None,
                             _is_domino=False, target_worker=SimpleNamespace())
    runner = DFlashDCutRunner(worker, DCutConfig(mode="auto"))
    assert runner.unsupported == "DFlash selector drafts"
    worker.selector, worker._is_domino = None, True
    assert dw.dflash_unsupported_reason(worker) == "DFlash Domino drafts"


# ----------------------------------------------------------------------------- end to end
class ToyTarget:
    """A one-layer attention target over a real KV pool, attention by the torch backend's planner.

    ``forward_batch_generation(batch=None, forward_batch=fb, is_verify=True, ...)`` writes the
    rows' K/V at ``fb.out_cache_loc``, runs ``TorchSDPABackend.build_plan(fb)`` (uniform or
    ragged TARGET_VERIFY) and returns logits ``[rows, vocab]`` and hidden states.
    """

    def __init__(self, vocab=40, heads=2, hd=8, slots=256, max_reqs=4, ctx=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        d = heads * hd
        self.vocab, self.heads, self.hd = vocab, heads, hd
        self.emb = torch.randn(vocab, d, generator=g, dtype=torch.float64)
        self.pos = torch.randn(ctx, d, generator=g, dtype=torch.float64) * 0.5
        self.wq, self.wk, self.wv = (torch.randn(d, d, generator=g, dtype=torch.float64) / d ** 0.5 for _ in range(3))
        self.wo = torch.randn(d, vocab, generator=g, dtype=torch.float64)
        self.k_cache = torch.zeros(slots, heads, hd, dtype=torch.float64)
        self.v_cache = torch.zeros(slots, heads, hd, dtype=torch.float64)
        self.r2t = torch.arange(1, 1 + max_reqs * ctx, dtype=torch.int32).view(max_reqs, ctx)  # slot 0 = sink
        self.backend = object.__new__(TorchSDPABackend)
        self.backend.req_to_token_pool = SimpleNamespace(req_to_token=self.r2t)
        self.backend.device = torch.device("cpu")
        self.model_runner = SimpleNamespace(device="cpu")
        self.calls = []

    def _qkv(self, ids, pos):
        x = self.emb[ids] + self.pos[pos]
        sh = (-1, self.heads, self.hd)
        return (x @ self.wq).view(sh), (x @ self.wk).view(sh), (x @ self.wv).view(sh)

    def fill_prefix(self, rp, prefix_tokens):
        for r, toks in zip(rp.tolist(), prefix_tokens):
            p = len(toks)
            _, k, v = self._qkv(torch.tensor(toks), torch.arange(p))
            slots = self.r2t[r, :p].long()
            self.k_cache[slots], self.v_cache[slots] = k, v

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kwargs):
        fb = forward_batch
        q, k, v = self._qkv(fb.input_ids.long(), fb.positions.long())
        self.k_cache[fb.out_cache_loc.long()], self.v_cache[fb.out_cache_loc.long()] = k, v
        plan = self.backend.build_plan(fb)
        self.calls.append(SimpleNamespace(rows=int(fb.input_ids.shape[0]), q_lens=plan.q_lens,
                                          width=fb.spec_info.num_tokens_per_req, kwargs=dict(kwargs)))
        out = run_plan(plan, q, k, v, self.k_cache, self.v_cache, scaling=self.hd ** -0.5).reshape(q.shape[0], -1)
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=out @ self.wo, hidden_states=out),
                               can_run_cuda_graph=False)


def _verify_fb(target, rp, seq_lens, tokens, n):
    bs = rp.shape[0]
    pos = (seq_lens.unsqueeze(1) + torch.arange(n)).reshape(-1)
    loc = torch.stack([target.r2t[r, s: s + n] for r, s in zip(rp.tolist(), seq_lens.tolist())]).reshape(-1)
    vi = DFlashVerifyInput(draft_token=tokens.reshape(-1).clone(), positions=pos, draft_token_num=n)
    return SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=vi.draft_token,
                           positions=pos, spec_info=vi, out_cache_loc=loc.long(), req_pool_indices=rp,
                           seq_lens=seq_lens, seq_lens_cpu=seq_lens + n, kv_loc_plan=None)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_pruned_step_is_lossless_against_full_verify(ratio):
    gen = torch.Generator().manual_seed(10)
    bs, n, vocab = 4, 8, 40
    target = ToyTarget(vocab=vocab, max_reqs=bs)
    rp = torch.tensor([2, 0, 3, 1])
    seq_lens = torch.tensor([6, 11, 3, 8])
    target.fill_prefix(rp, [torch.randint(0, vocab, (int(p),), generator=gen).tolist() for p in seq_lens])
    true_len = [7, 2, 5, 0]  # drafts matching the target's greedy continuation
    tokens = torch.randint(0, vocab, (bs, n), generator=gen)
    for j in range(1, n):  # causal target: fix drafts left to right from the full forward
        logits = target.forward_batch_generation(forward_batch=_verify_fb(target, rp, seq_lens, tokens, n),
                                                 is_verify=True).logits_output.next_token_logits
        pred = logits.view(bs, n, vocab).argmax(-1)
        for b in range(bs):
            tokens[b, j] = pred[b, j - 1] if j <= true_len[b] else (pred[b, j - 1] + 1) % vocab
    full = target.forward_batch_generation(forward_batch=_verify_fb(target, rp, seq_lens, tokens, n), is_verify=True)
    full_logits = full.logits_output.next_token_logits
    full_pred = full_logits.view(bs, n, vocab).argmax(-1)

    conf = torch.rand(bs, n - 1, generator=gen) * 0.5 + 0.5
    worker = object.__new__(ExtDFlashWorker)
    worker._target_worker = target
    worker.speculative_num_draft_tokens = n
    worker.topk, worker.selector, worker.lilicorr, worker._is_domino, worker._draft_sampler = 1, None, None, False, None
    runner = DFlashDCutRunner(worker, DCutConfig(mode=ratio))
    worker.dcut = runner
    worker._selector_sample, worker.block_size, worker._use_triton_accept_bonus = None, n, False
    worker._tp_sync = SimpleNamespace(sync=lambda site, t: None)
    batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=None, reqs=[_req() for _ in range(bs)],
                            return_logprob=False, forward_mode=ForwardMode.DECODE)
    fb = _verify_fb(target, rp, seq_lens, tokens, n)
    n_calls = len(target.calls)
    with runner.step(worker, batch) as st:
        st.eager_ran, st.eager_conf = True, conf.reshape(-1)
        assert "forward_batch_generation" in vars(target)
        res = target.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True,
                                              skip_attn_backend_init=True)
        acc, commit, bonus, out, _ = worker._accept_block(
            candidates=tokens.clone(), next_token_logits=res.logits_output.next_token_logits, sampling_info=None,
            draft_input=None, prefix_lens=seq_lens, bs=bs)
    assert "forward_batch_generation" not in vars(target) and runner.state is None
    keep = st.prune.keep_lens.tolist()
    width = math.ceil(bs * n * ratio)
    # the target ran once, over the ragged kept rows padded to the tier width, graph-ineligible
    call = target.calls[n_calls]
    assert len(target.calls) == n_calls + 1 and call.rows == width
    assert list(call.q_lens) == [k + 1 for k in keep] and call.width == n + 1
    # SGLang's prepare_for_verify planned the strided batch and asks to keep that plan
    # (skip_attn_backend_init=True, mapped onto forward_metadata_ready): the compacted batch must
    # be planned again, so the flag does not reach the forward
    assert call.kwargs == {"skip_attn_backend_init": None}
    # the batch is restored: strided inputs, the uniform verify input
    assert fb.input_ids.shape[0] == bs * n and fb.spec_info.ragged_verify_layout is None
    assert fb.spec_info.num_tokens_per_req == n
    # kept rows equal the full forward; pruned rows are zero
    got = res.logits_output.next_token_logits.view(bs, n, vocab)
    ref = full_logits.view(bs, n, vocab)
    for b in range(bs):
        assert torch.allclose(got[b, : keep[b] + 1], ref[b, : keep[b] + 1], atol=1e-9)
        assert torch.count_nonzero(got[b, keep[b] + 1:]) == 0
    # greedy acceptance: the full run truncated at the kept prefix, bonus = target argmax there
    exp_acc = [min(t, k) for t, k in zip(true_len, keep)]
    assert acc.tolist() == exp_acc and commit.tolist() == [a + 1 for a in exp_acc]
    assert bonus.tolist() == [int(full_pred[b, a]) for b, a in enumerate(exp_acc)]
    for b, a in enumerate(exp_acc):
        assert out[b, :a].tolist() == tokens[b, 1:a + 1].tolist() and int(out[b, a]) == int(full_pred[b, a])
    assert any(k < t for k, t in zip(keep, true_len)) or ratio == 0.75  # the cut bit somewhere
    runner.finish_step(st, SimpleNamespace(accept_lens=commit))
    s = runner.metrics.summary()
    assert s["steps"] == 1 and s["verified_tokens"] == bs + sum(keep) and s["padded_tokens"] == width
    assert s["accepted_tokens"] == sum(exp_acc) + bs


def test_step_hook_restores_existing_instance_attribute():
    target = SimpleNamespace(forward_batch_generation=lambda **kw: "mine")
    worker = SimpleNamespace(target_worker=target, speculative_num_draft_tokens=4, topk=1, selector=None,
                             lilicorr=None, _is_domino=False)
    runner = DFlashDCutRunner(worker, DCutConfig(mode=0.5))
    own = target.forward_batch_generation
    with runner.step(worker, SimpleNamespace()):
        assert target.forward_batch_generation is not own
        assert target.forward_batch_generation(is_verify=False) == "mine"  # non-verify calls pass through
    assert target.forward_batch_generation is own


def test_draft_sampler_wrapped_only_for_plain_greedy_head(monkeypatch):
    w = torch.randn(10, 4)
    plain = _DflashDraftSampler(weight=w, block_size=3, num_org=10, org_vocab_start=0, max_bs=2)
    monkeypatch.setattr(DFlashWorkerV2, "_maybe_build_draft_sampler", lambda self: plain)
    worker = object.__new__(ExtDFlashWorker)
    worker._target_worker = None
    worker.dcut = SimpleNamespace(unsupported=None)
    wrapped = worker._maybe_build_draft_sampler()
    assert isinstance(wrapped, ConfidenceDraftSampler) and wrapped.out.shape == plain.out.shape
    worker.dcut = None
    assert worker._maybe_build_draft_sampler() is plain
    worker.dcut = SimpleNamespace(unsupported="DFlash selector drafts")
    assert worker._maybe_build_draft_sampler() is plain


def test_plugin_selects_dflash_worker_only_with_dcut():
    from sglang_ext.config import ExtensionConfig, SpecExitConfig
    from sglang_ext.config import attach_extension_config
    from sglang_ext.engine.plugin import select_worker_class

    sa = SimpleNamespace(speculative_algorithm="DFLASH")
    attach_extension_config(sa, ExtensionConfig(specexit=SpecExitConfig(), dcut=DCutConfig(mode="auto")))
    assert select_worker_class(DFlashWorkerV2, sa) is ExtDFlashWorker
    attach_extension_config(sa, ExtensionConfig(specexit=SpecExitConfig(), dcut=DCutConfig(mode="off")))
    assert select_worker_class(DFlashWorkerV2, sa) is DFlashWorkerV2


# ----------------------------------------------------------------------------- sampled accept
def _chain_speculative_sampling(*, candidates, next_token_logits, sampling_info, max_top_k=None,
                                uniform_top_k_value=None):
    """Test stand-in for SGLang's CUDA-only sampled DFlash accept (written from the algorithm):
    speculative sampling of a chain against a point-mass (greedy) draft. Draft ``j`` is accepted
    with probability ``p_{j-1}(x_j)``; at the first rejection the token is drawn from ``p`` without
    the rejected draft; after a full run it is drawn from the last row."""
    bs, n = candidates.shape  # candidates: [bs, n]; next_token_logits: [bs * n, vocab]
    p = torch.softmax(next_token_logits.double(), dim=-1).view(bs, n, -1)
    px = p[:, :-1].gather(2, candidates[:, 1:, None].long()).squeeze(2)  # [bs, n - 1]
    coins = torch.rand(bs, n - 1, dtype=torch.float64, generator=_SAMPLING_GEN)
    accept_len = torch.cumprod((coins < px).long(), dim=1).sum(dim=1)  # [bs]
    rows = torch.arange(bs)
    row = p[rows, accept_len].clone()  # [bs, vocab]
    rejected = accept_len < n - 1
    nxt = candidates[rows, (accept_len + 1).clamp(max=n - 1)].long()
    row[rows[rejected], nxt[rejected]] = 0.0
    bonus = torch.multinomial(row / row.sum(dim=1, keepdim=True), 1, generator=_SAMPLING_GEN).squeeze(1)
    return accept_len, bonus


_SAMPLING_GEN = torch.Generator()


def _sampled_run(monkeypatch, keep_values, trials, seed):
    """One sampled accept over ``len(keep_values) * trials`` requests sharing a target and draft chain.

    Returns (committed tokens [rows, n], commit_lens [rows], keep_lens [rows], drafts [n - 1],
    target rows [n, vocab])."""
    import sglang.srt.speculative.dflash_worker_v2 as v2

    monkeypatch.setattr(v2, "is_dflash_sampling_verify_available", lambda: True)
    monkeypatch.setattr(v2, "compute_dflash_sampling_correct_drafts_and_bonus", _chain_speculative_sampling)
    _SAMPLING_GEN.manual_seed(seed)
    n, vocab = 4, 5
    drafts = torch.tensor([2, 0, 3])  # x_1..x_3 (the greedy draft's chain)
    # target row t = p(. | anchor, x_1..x_t); each draft has target probability 0.6
    target = torch.tensor([[0.10, 0.10, 0.60, 0.15, 0.05],
                           [0.60, 0.20, 0.05, 0.10, 0.05],
                           [0.05, 0.15, 0.10, 0.60, 0.10],
                           [0.30, 0.25, 0.20, 0.15, 0.10]], dtype=torch.float64)  # [n, vocab]
    keep = torch.tensor(keep_values).repeat_interleave(trials)  # [rows]
    rows = keep.shape[0]
    cand = torch.cat([torch.full((rows, 1), 4), drafts.expand(rows, n - 1)], dim=1)  # [rows, n]
    logits = target.log().float().expand(rows, n, vocab).clone()  # [rows, n, vocab]
    pruned = torch.arange(n).unsqueeze(0) > keep.unsqueeze(1)  # rows the compacted verify left out
    logits[pruned] = 0.0  # scattered back as zeros
    w = _accept_worker(DFlashPrune(keep_lens=keep, compact=None), n)
    info = SimpleNamespace(is_all_greedy=False)
    acc, commit, bonus, out, new_lens = w._accept_block(
        candidates=cand, next_token_logits=logits.view(rows * n, vocab), sampling_info=info,
        draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None), prefix_lens=torch.zeros(rows),
        bs=rows)
    assert new_lens is None and commit.tolist() == (acc + 1).tolist()
    return out, commit, keep, drafts, target


def _worst_tv(out, commit, keep, drafts, target):
    """Largest total-variation distance, over (kept length k, position t <= k), between the empirical
    distribution of committed token t given committed tokens x_1..x_t and the target row t; with the
    smallest sample count behind it."""
    worst, fewest = 0.0, None
    for k in sorted(set(keep.tolist())):
        sel = keep == k
        o, c = out[sel], commit[sel]
        for t in range(k + 1):
            prefix_ok = (o[:, :t] == drafts[:t]).all(dim=1)
            assert bool((c[prefix_ok] > t).all())  # a committed draft prefix is always followed by a token
            tokens = o[prefix_ok, t]
            emp = torch.bincount(tokens, minlength=target.shape[1]).double() / tokens.numel()
            worst = max(worst, 0.5 * float((emp - target[t]).abs().sum()))
            fewest = tokens.numel() if fewest is None else min(fewest, tokens.numel())
    return worst, fewest


def test_sampled_accept_cut_is_exact_in_distribution(monkeypatch):
    """Sampled requests cut to ``k`` kept drafts commit target samples.

    Tiny chain (block 4, vocabulary 5, each draft with target probability 0.6), kept lengths
    k = 0..3, 20 000 requests each, seed 0. For every k and position t <= k the committed token t
    (given that tokens 1..t are the drafts) must follow target row t: total-variation distance
    <= 0.035 (each conditional has >= 4 000 samples, whose expected TV is ~0.012). Pruned rows carry
    zero logits as after the compacted verify. Control: capping the accept without the bonus fix
    (keeping the kernel's bonus from a later row) breaks the bound.
    """
    out, commit, keep, drafts, target = _sampled_run(monkeypatch, [0, 1, 2, 3], 20000, seed=0)
    # pruned: nothing past the kept prefix is committed, and the cut does bind
    assert bool((commit <= keep + 1).all())
    for k in (0, 1, 2):
        assert bool((commit[keep == k] == k + 1).any())
    worst, fewest = _worst_tv(out, commit, keep, drafts, target)
    assert fewest >= 4000, fewest
    assert worst <= 0.035, worst

    def naive_cap(candidates, accept_len, bonus, keep_lens):  # wrong: bonus drawn from a pruned row
        return torch.minimum(accept_len, keep_lens.to(accept_len.dtype)), bonus

    import sglang_ext.engine.dflash_worker as ext

    monkeypatch.setattr(ext, "clamp_to_kept_prefix", naive_cap)
    out, commit, keep, drafts, target = _sampled_run(monkeypatch, [0, 1, 2, 3], 20000, seed=0)
    worst_naive, _ = _worst_tv(out, commit, keep, drafts, target)
    assert worst_naive > 0.1, worst_naive


def test_sampled_batch_without_kernel_uses_poisoned_greedy_accept(monkeypatch):
    """Without the sampling kernel (CPU, NPU) SGLang accepts a sampled batch by target argmax; the
    pruned step then takes the poisoned-candidate path and stops at the kept prefix."""
    import sglang.srt.speculative.dflash_worker_v2 as v2

    monkeypatch.setattr(v2, "is_dflash_sampling_verify_available", lambda: False)
    block, vocab = 4, 10
    target = torch.tensor([[1, 2, 3, 4]])  # target argmax per row
    cand = torch.tensor([[7, 1, 2, 3]])  # the target would accept all 3 drafts
    logits = torch.nn.functional.one_hot(target.reshape(-1), vocab).float()
    w = _accept_worker(DFlashPrune(keep_lens=torch.tensor([1]), compact=None), block)
    acc, commit, bonus, out, _ = w._accept_block(
        candidates=cand, next_token_logits=logits, sampling_info=SimpleNamespace(is_all_greedy=False),
        draft_input=None, prefix_lens=torch.tensor([5]), bs=1)
    assert acc.tolist() == [1] and bonus.tolist() == [2] and out[0, :2].tolist() == [1, 2]
    assert not dw.uses_sampled_accept(SimpleNamespace(is_all_greedy=False), None)

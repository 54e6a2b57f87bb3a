"""The EAGLE D-Cut runner's verify glue on CPU tensors (no engine): one attention plan per
compacted step, no host read in the plan path beyond the auto tier choice, exempt requests costed
at the real forward width.

The verify is driven through ``DCutRunner.verify`` with a stand-in for SGLang's
``run_eagle_verify`` that does what it does before the target forward (``eagle_prepare_for_verify``:
SGLang's own ``DecodeCudaGraphRunner.can_run_graph``, then ``load_batch`` and the ready mark when a
uniform graph fits) on a real ``EagleVerifyInput``; the drift guard below pins those SGLang lines.
A GPU run would replay the graphs; here a plan is counted instead.

Budget: < 60 s (SGLang import on the loaded 2-core machine; every case is small).
"""

from __future__ import annotations

import inspect
import math
import sys
from types import SimpleNamespace as NS

import pytest
import torch

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative.eagle_info import EagleVerifyInput

import sglang_ext.dcut.planner as planner_mod
import sglang_ext.engine.dcut.runner as runner_mod
from sglang_ext.config import DCutConfig
from sglang_ext.dcut import CostTable, CostTableKey, chain_retrive
from sglang_ext.engine.dcut.runner import DCutRunner

KEY = CostTableKey(model="t", draft="d", device="cpu", tp=1, dtype="float32", draft_tokens=8, topk=1, num_steps=7,
                   attention_backend="torch_sdpa", context_len=64, sglang_version="0.5.23", sglang_ext_version="0")


@pytest.fixture(autouse=True)
def _no_runtime_context(monkeypatch):
    """The exemption check reads one server flag from SGLang's runtime context (none in tests)."""
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_spec", lambda: NS(speculative_use_rejection_sampling=False))


class UniformGraphs:
    """The state ``DecodeCudaGraphRunner.can_run_graph`` reads, of a runner that captured batch
    sizes <= 8 at width N (SGLang's method itself decides); ``load_batch`` counts plans."""

    can_run_graph = DecodeCudaGraphRunner.can_run_graph

    def __init__(self, n):
        self.ragged_verify_mode = False
        self.captured_req_width = n
        self.require_mlp_tp_gather = self.require_mlp_sync = self.enable_pdmux = self.disable_padding = False
        self.is_encoder_decoder = self.enable_two_batch_overlap = False
        self.max_bs = 8
        self.model_runner = NS(spec_algorithm=NS(is_ngram=lambda: False))
        self.loads = 0

    def _make_graph_key(self, *args, **kwargs):
        return None

    def _resolve_lora_variant(self, forward_batch):
        return None

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        self.loads += 1


class Target:
    """A target worker whose forward plans the batch unless it is marked ready (counted)."""

    def __init__(self, n, vocab=11):
        self.graphs = UniformGraphs(n)
        self.model_runner = NS(attn_backend=NS(supports_ragged_target_verify=True), kv_index_translator=None,
                               device="cpu", decode_cuda_graph_runner=self.graphs)
        self.vocab, self.plans, self.rows = vocab, 0, []

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kwargs):
        fb = forward_batch
        if not fb.forward_metadata_ready:
            self.plans += 1
        self.rows.append(int(fb.input_ids.shape[0]))
        logits = torch.nn.functional.one_hot(fb.input_ids.long() % self.vocab, self.vocab).float()
        return NS(logits_output=NS(next_token_logits=logits, hidden_states=None))


def _verify_input(bs, n):
    nt, ns = chain_retrive(bs, n)
    seq_lens = torch.arange(bs) + 5
    return EagleVerifyInput(
        draft_token=torch.arange(bs * n) % 11, custom_mask=None,
        positions=(seq_lens.unsqueeze(1) + torch.arange(n)).reshape(-1), retrieve_index=None,
        retrieve_next_token=nt, retrieve_next_sibling=ns, retrieve_cum_len=None, spec_steps=n - 1, topk=1,
        draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens), seq_lens


def _req(grammar=None):
    sp = NS(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, logit_bias=None, min_new_tokens=0)
    return NS(grammar=grammar, return_logprob=False, sampling_params=sp)


def _setup(bs, n, mode, survival, reqs=None):
    vi, seq_lens = _verify_input(bs, n)
    target = Target(n)
    cap = NS(scores_for_verify=lambda v, b: NS(valid=True, is_tree=False, draft_survival=survival))
    worker = NS(speculative_num_draft_tokens=n, topk=1, draft_capture=cap, target_worker=target)
    batch = NS(seq_lens=seq_lens, reqs=reqs or [_req() for _ in range(bs)], return_logprob=False,
               forward_mode=ForwardMode.DECODE, spec_info=vi)
    runner = DCutRunner(worker, DCutConfig(mode=mode))
    runner.compact = True  # the backend runs ragged verify batches (set by the first verify otherwise)
    return runner, worker, batch, target


def _stock_verify(target):
    """What ``run_eagle_verify`` does around the target forward (see the drift guard)."""

    def verify(batch, pp_proxy_tensors=None, grammar_barrier=None):
        vi = batch.spec_info
        fb = NS(forward_mode=ForwardMode.TARGET_VERIFY, spec_info=vi, replace_embeds=None,
                batch_size=len(batch.seq_lens), input_ids=vi.draft_token, positions=vi.positions,
                out_cache_loc=torch.arange(vi.draft_token.numel()) + 100, kv_loc_plan=None,
                forward_metadata_ready=False)
        graphs = target.model_runner.decode_cuda_graph_runner
        if graphs.can_run_graph(fb):
            graphs.load_batch(fb)
            fb.forward_metadata_ready = True
        out = target.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
        return NS(accept_lens=torch.ones(len(batch.seq_lens), dtype=torch.int64), logits_output=out.logits_output)

    return verify


def test_verify_preparation_targets():
    """Drift guard: SGLang's verify preparation plans a uniform graph when ``can_run_graph`` accepts
    the verify batch, whose spec info is the verify input, and refuses a width != N."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.speculative import eagle_utils

    src = inspect.getsource(eagle_utils.eagle_prepare_for_verify)
    assert "decode_cuda_graph_runner.can_run_graph(" in src and ".load_batch(" in src
    assert "verify_forward_batch.mark_forward_metadata_ready()" in src
    assert "spec_info=batch.spec_info" in inspect.getsource(ForwardBatch.init_new)
    graph = inspect.getsource(DecodeCudaGraphRunner.can_run_graph)
    assert "spec_info.num_tokens_per_req != self.captured_req_width" in graph


def test_one_attention_plan_per_compacted_step():
    bs, n = 4, 8
    survival = torch.full((bs, n - 1), 0.8).cumprod(dim=1)
    runner, worker, batch, target = _setup(bs, n, 0.5, survival)
    vi = batch.spec_info
    runner.verify(worker, batch, None, None, _stock_verify(target))
    # the compacted forward (16 rows) is the only one planned: no uniform graph was pre-planned
    assert target.rows == [math.ceil(bs * n * 0.5)]
    assert (target.graphs.loads, target.plans) == (0, 1)
    assert vi.num_tokens_per_req == n and "forward_batch_generation" not in vars(target)
    # a step verified in full still replays SGLang's uniform graph
    runner.set_override_ratio(1.0)
    runner.verify(worker, batch, None, None, _stock_verify(target))
    assert target.rows[-1] == bs * n and (target.graphs.loads, target.plans) == (1, 1)
    m = runner.metrics.summary()
    assert (m["steps"], m["pruned_steps"], m["verified_tokens"]) == (2, 1, 16 + bs * n)


def _count_host_reads(monkeypatch, files):
    """Count host reads of tensors (``item``, ``tolist``, ``int()``, ``float()``, ``bool()``)
    made directly by code in ``files``."""
    calls = []
    for name in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller in files:
                calls.append((_name, caller))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


@pytest.mark.parametrize("mode,reads", [(0.5, 0), ("auto", 1)])
def test_plan_path_reads_the_device_only_for_the_auto_tier(monkeypatch, mode, reads):
    bs, n = 4, 8
    survival = torch.full((bs, n - 1), 0.8).cumprod(dim=1)
    runner, worker, batch, target = _setup(bs, n, mode, survival)
    runner.cost_table = CostTable.build(KEY, [4], [[1.0, 1.5, 3.0, 4.0]], tiers=(0.25, 0.5, 0.75, 1.0),
                                        created="2026-01-01T00:00:00+00:00")
    files = {runner_mod.__file__, planner_mod.__file__}
    calls = _count_host_reads(monkeypatch, files)
    decision, prepared = runner._plan(worker, batch, batch.spec_info, bs, n)
    monkeypatch.undo()
    # auto: the one read of the per-tier sums (the tier must be known on the host); none else
    assert len(calls) == reads, calls
    assert all(c == ("tolist", planner_mod.__file__) for c in calls)
    assert prepared is not None and decision.pruned
    assert int(decision.verified_tokens) == int(prepared[0].layout.verify_lens.sum())


def test_exempt_request_costs_the_real_forward():
    """A grammar request (verified in full) widens the forward: the tier is costed at the whole
    batch's row of the table and the smallest batch tier that holds the wider forward."""
    bs, n, tiers = 4, 8, (0.25, 0.5, 0.75, 1.0)
    survival = torch.full((bs, n - 1), 0.9).cumprod(dim=1)
    reqs = [_req(), _req(grammar=object()), _req(), _req()]
    runner, worker, batch, target = _setup(bs, n, "auto", survival, reqs)
    # bs 3 (the scored requests alone): every tier costs the same; bs 4: the wide tiers are dear
    rows = {3: [1.0, 1.0, 1.0, 1.0], 4: [1.0, 1.2, 3.0, 3.2]}
    runner.cost_table = CostTable.build(KEY, [3, 4], [rows[3], rows[4]], tiers=tiers,
                                        created="2026-01-01T00:00:00+00:00")
    # independent argmax over the real step: 3 scored chains + the exempt chain (all 8 rows)
    s = survival[0].tolist()
    ranked = sorted(s * 3, reverse=True)
    full_widths = [8, 16, 24, 32]  # ceil(32 * rho)
    best = None
    for q, rho in enumerate(tiers):
        keep = math.ceil(3 * n * rho) - 3
        width = 3 + keep + n
        cost = rows[4][min(j for j in range(q, 4) if full_widths[j] >= width)]
        u = (bs + math.fsum(ranked[:keep]) + math.fsum(s)) / cost
        if best is None or u > best[0]:
            best = (u, q, width, cost)
    _, q, width, cost = best
    assert q == 0  # the scored-only view (bs 3 row, flat costs) would keep everything
    decision, prepared = runner._plan(worker, batch, batch.spec_info, bs, n)
    assert decision.tier == f"{tiers[q]:g}" and decision.padded_tokens == width and decision.predicted_ms == cost
    cv = prepared[0]
    assert cv.layout.verify_lens.tolist()[1] == n  # the grammar request keeps its whole chain
    assert decision.exempt_requests == 1 and runner.metrics.exempt_requests["grammar"] == 1

#!/usr/bin/env python3
"""GPU checks of the D-Cut verify path: FlashInfer pruned-tree verify, graphs per tier, cost curves.

Needs only torch (CUDA), flashinfer-python and this repository (no SGLang install)::

    bash tests/gpu/run_gpu_checks.sh                 # on one H200: ~8 min budget, results in bench/results/
    python tests/gpu/run_gpu_checks.py --dry-run --out DIR      # tiny shapes on CPU (what CI runs)

Parts (run in the order a, a2, b-dense, c, b-MoE; each skipped with its reason when the time budget
runs out; if FlashInfer cannot run, (b)/(c) fall back to the torch backend's SDPA, labelled so):

(a) **correctness** -- random pruned trees (EAGLE-style, custom mask) and prefix-cut chains
    (DFlash-style, causal) at every tier: FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper``
    planned by :mod:`sglang_ext.engine.attention.flashinfer_dcut` (ragged ``qo_indptr``, kept keys, packed
    mask) equals the torch backend's math (``torch_backend_plan.plan_target_verify`` +
    ``run_plan``) in bf16 within tolerance, eagerly and replayed from one CUDA graph per
    ``(bs, tier)`` at the tier's padded row count (padding lanes filled with garbage); greedy
    verification (``verify_tree_greedy_cpu``, the project's torch port of SGLang's kernel) on the
    vocabulary logits of both accepts exactly the same nodes (rows whose top-2 logit gap is below
    the numeric tolerance are reported and left out, never silently);
(a2) **padded replay** (``sglang_ext.engine.dcut.graphs``) -- steps of fewer requests than the
    graph replayed from the smallest fitting ``(bs, T)`` tier graph, padded as the D-Cut tier-graph
    runner does (zero-row padding requests, rows past the last request with garbage): real rows equal
    the torch backend's math in bf16 within tolerance;
(c) **planner overhead** per step at bs = 64 (chains N = 16 and trees N = 16): scores, tier choice,
    compaction, mask and FlashInfer planning, each timed;
(b) **verify-cost curves** of a Qwen3-8B-shaped dense stack with random weights (and a
    Qwen3-30B-A3B-shaped MoE stack when ``torch._grouped_mm`` works): one CUDA graph per
    ``(bs, tier)``, bs in {4, 8, 16, 32, 64} x tiers {0.25, 0.5, 0.75, 1.0}, N = 16, context 2048;
    written as cost-table JSON (``sglang_ext.dcut.cost_table`` schema; ``step_ms`` = verify
    forward replay + planning, the draft is not part of it: key ``draft = "none (verify only)"``)
    and a PNG.

Output: ``<out>/gpu_checks_summary.json`` (every number), ``<out>/cost_table_<stack>.json``,
``<out>/verify_cost_curves.png``. Exit status: 0 all run parts passed, 1 a check failed, 2 a part was
skipped (no FlashInfer, time budget). ``--dry-run`` uses :func:`paged_attention_reference` in place of
FlashInfer and runs the graph path eagerly on padded inputs (CPU has no CUDA graphs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from sglang_ext import __version__ as EXT_VERSION  # noqa: E402
from sglang_ext.dcut import (  # noqa: E402
    CostTable,
    CostTableKey,
    TreeTopology,
    build_full_mask,
    chain_keep_mask,
    chain_retrive,
    chain_survival,
    choose,
    compact_tree,
    retrive_from_parents,
    scatter_to_full,
    tree_survival,
)
from sglang_ext.dcut.tiers import DEFAULT_TIERS  # noqa: E402
from sglang_ext.engine.attention import flashinfer_dcut as fv  # noqa: E402
from sglang_ext.engine.attention import flashinfer_verify_plan as fvp  # noqa: E402
from sglang_ext.engine.cpu.spec_ops import verify_tree_greedy_cpu  # noqa: E402
from sglang_ext.engine.attention.torch_sdpa_modes import plan_target_verify  # noqa: E402
from sglang_ext.engine.attention.torch_sdpa_plan import run_plan  # noqa: E402

SGLANG_VERSION = "0.5.23"
WORKSPACE_BYTES = 512 * 1024 * 1024  # SGLang's FlashInfer workspace for Qwen models
BF16_ATOL = 2.5e-2  # outputs are convex combinations of N(0, 1) values; bf16 eps = 2^-8
EXIT_OK, EXIT_FAILED, EXIT_SKIPPED = 0, 1, 2
PARTS = ("a_correctness", "a2_padded_replay", "b_cost_curves_dense", "c_planner", "b_cost_curves_moe")
"""Keys of the summary's parts; each is always present (a result, or ``skipped`` with the reason)."""


# ----------------------------------------------------------------------------- configuration
@dataclass
class Config:
    device: str
    dry_run: bool
    heads_q: int
    heads_kv: int
    head_dim: int
    max_prefix: int
    vocab_check: int
    cases: int  # random cases per (bs, N, kind, tier) in (a)
    check_batch_sizes: Tuple[int, ...]
    check_draft_tokens: Tuple[int, ...]
    cost_batch_sizes: Tuple[int, ...]
    cost_draft_tokens: int
    context_len: int
    warmup: int
    iters: int
    planner_bs: int
    planner_iters: int
    dense: Dict[str, int]
    moe: Dict[str, int]
    tiers: Tuple[float, ...] = DEFAULT_TIERS


def make_config(dry_run: bool, quick: bool) -> Config:
    if dry_run:
        return Config(
            device="cpu", dry_run=True, heads_q=4, heads_kv=2, head_dim=16, max_prefix=24, vocab_check=64,
            cases=1, check_batch_sizes=(2, 4), check_draft_tokens=(4, 8), cost_batch_sizes=(2, 4),
            cost_draft_tokens=8, context_len=32, warmup=1, iters=2, planner_bs=8, planner_iters=3,
            dense=dict(layers=2, hidden=64, heads_q=4, heads_kv=2, head_dim=16, inter=128, vocab=256),
            moe=dict(layers=2, hidden=64, heads_q=4, heads_kv=2, head_dim=16, experts=8, topk=2, inter=32,
                     vocab=256),
        )
    return Config(
        device="cuda", dry_run=False, heads_q=32, heads_kv=8, head_dim=128, max_prefix=1024 if quick else 2048,
        vocab_check=512, cases=1 if quick else 2,
        check_batch_sizes=(4, 64) if quick else (4, 16, 64), check_draft_tokens=(16,) if quick else (8, 16),
        cost_batch_sizes=(4, 64) if quick else (4, 8, 16, 32, 64), cost_draft_tokens=16,
        context_len=512 if quick else 2048, warmup=3, iters=10, planner_bs=64, planner_iters=50,
        # Qwen3-8B: 36 layers, hidden 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936
        dense=dict(layers=4 if quick else 36, hidden=4096, heads_q=32, heads_kv=8, head_dim=128, inter=12288,
                   vocab=151936),
        # Qwen3-30B-A3B: 48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8 of 768
        moe=dict(layers=4 if quick else 48, hidden=2048, heads_q=32, heads_kv=4, head_dim=128, experts=128, topk=8,
                 inter=768, vocab=151936),
    )


# ----------------------------------------------------------------------------- attention implementations
class VerifyAttention:
    """Attention of one pruned verify, FlashInfer (GPU) or the reference math (dry run).

    ``graph(bs, T, mask)`` returns a :class:`GraphAttention` holding fixed buffers for one
    ``(bs, T)`` graph; ``eager(plan, q, caches)`` plans and runs without a graph.
    """

    def __init__(self, cfg: Config, mode: str = "flashinfer"):
        self.cfg = cfg
        self.mode = mode  # "flashinfer", "reference" (dry run) or "torch" (fallback: torch backend SDPA)
        self.use_flashinfer = mode == "flashinfer"
        self.workspace = None
        if self.use_flashinfer:
            self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=cfg.device)
            self._eager = {m: fv.make_prefill_wrapper(self.workspace) for m in (False, True)}

    def eager(self, plan: fv.VerifyPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              sm_scale: float) -> torch.Tensor:  # q: [num_tokens, Hq, D] -> [num_tokens, Hq, D]
        if not self.use_flashinfer:
            return fv.paged_attention_reference(q, k_cache, v_cache, plan, sm_scale)
        w = self._eager[not plan.causal]
        fv.plan_prefill_wrapper(w, plan, q.shape[1], k_cache.shape[1], q.shape[2], q.dtype, k_cache.dtype, sm_scale)
        # the whole forward width: the plan's padding request owns the rows past the kept ones
        return w.run(q, (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))

    def graph(self, bs: int, num_tokens: int, use_mask: bool) -> "GraphAttention":
        return GraphAttention(self, bs, num_tokens, use_mask)

    def torch_graph(self, r2t, rp, prefix, counts, sm_scale: float) -> "TorchGraphAttention":
        return TorchGraphAttention(r2t, rp, prefix, counts, sm_scale)


class GraphAttention:
    """One ``(bs, T)`` wrapper with fixed buffers; ``plan`` outside the graph, ``run`` inside it."""

    def __init__(self, attn: VerifyAttention, bs: int, num_tokens: int, use_mask: bool):
        self.attn, self.bs, self.num_tokens, self.use_mask = attn, bs, num_tokens, use_mask
        self.wrapper = None
        self.plan_: Optional[fv.VerifyPlan] = None
        if attn.use_flashinfer:
            sizes = fv.graph_buffer_sizes(bs, num_tokens, max(attn.cfg.context_len, attn.cfg.max_prefix) + 64)
            self.buffers = fv.WrapperBuffers.allocate(bs, sizes, use_mask, attn.cfg.device)
            self.wrapper = fv.make_prefill_wrapper(attn.workspace, self.buffers)

    def plan(self, plan: fv.VerifyPlan, hq: int, hkv: int, d: int, dtype, sm_scale: float) -> None:
        if plan.causal == self.use_mask:
            raise ValueError("a graph wrapper runs either the custom-mask or the causal kernel, not both")
        self.plan_, self.sm_scale = plan, sm_scale
        if self.wrapper is not None:
            fv.plan_prefill_wrapper(self.wrapper, plan, hq, hkv, d, dtype, dtype, sm_scale)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k=None, v=None) -> torch.Tensor:
        if self.wrapper is None:  # dry run: what the kernel computes (rows past the plan are zero)
            return fv.paged_attention_reference(q, k_cache, v_cache, self.plan_, self.sm_scale)
        return self.wrapper.run(q, (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))


class TorchGraphAttention:
    """Fallback for the cost curves when FlashInfer cannot run: the torch backend's padded SDPA
    (``plan_target_verify`` + ``run_plan``) with one fixed layout per ``(bs, T)`` graph (its index
    tensors are static, so the call is graph-capturable). Planning is not re-timed per step."""

    def __init__(self, r2t, rp, prefix, counts, sm_scale: float):
        self.plan_ = plan_target_verify(r2t, rp, prefix.tolist(), counts.tolist(), None)
        self.sm_scale = sm_scale
        self.num_tokens = int(counts.sum())

    def plan(self, *args, **kwargs) -> None:
        pass

    def run(self, q, k_cache, v_cache, k=None, v=None):
        return run_plan(self.plan_, q, k, v, k_cache, v_cache, scaling=self.sm_scale)


def capture_plan(bs: int, n: int, num_tokens: int, use_mask: bool, device) -> fv.VerifyPlan:
    """A valid plan with exactly ``num_tokens`` rows (prefix 1, chain columns) for graph capture."""
    counts = torch.tensor(fv.capture_counts(bs, n, num_tokens), device=device)
    qo = fv.ragged_qo_indptr(counts)
    p = torch.ones(bs, dtype=torch.int64, device=device)
    wip = fvp._exclusive(p + n).to(torch.int32)
    wkv = torch.ones(int(wip[-1]), dtype=torch.int32, device=device)  # slot 1: any valid slot
    mask = None
    if use_mask:
        blocks = torch.tril(torch.ones(bs, n, n, dtype=torch.bool, device=device))
        mask, _ = build_full_mask(blocks, counts, p)
    return fv.plan_verify(wip, wkv, p, qo, fv.chain_kept_cols(qo, num_tokens), mask, num_tokens=num_tokens)


class Graph:
    """A captured CUDA graph of ``fn`` (GPU) or ``fn`` itself (dry run: no graphs on CPU)."""

    def __init__(self, fn: Callable[[], Any], device: str, pool=None):
        self.fn = fn
        self.graph = None
        if device == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.out = fn()
        else:
            self.out = None

    def replay(self):
        if self.graph is None:
            self.out = self.fn()
        else:
            self.graph.replay()
        return self.out


def warm_jit(cfg: Config, attn: VerifyAttention) -> None:
    """Plan and run one tiny masked and one causal verify (eager and graph wrappers) so that FlashInfer
    JIT-compiles, once, the prefill and mask-packing modules every later part uses (same head
    configuration and dtypes as the checks)."""
    dev, dt = cfg.device, torch.bfloat16
    hq, hkv, d = cfg.heads_q, cfg.heads_kv, cfg.head_dim
    bs, n = 2, 4
    k_cache = torch.randn(bs * (n + 2) + 1, hkv, d, dtype=dt, device=dev)
    v_cache = torch.randn_like(k_cache)
    for use_mask in (True, False):
        plan = capture_plan(bs, n, bs * n - 1, use_mask, dev)
        q = torch.randn(plan.num_tokens, hq, d, dtype=dt, device=dev)
        attn.eager(plan, q, k_cache, v_cache, d ** -0.5)
        g = attn.graph(bs, plan.num_tokens, use_mask)
        g.plan(plan, hq, hkv, d, dt, d ** -0.5)
        g.run(q, k_cache, v_cache)
    _sync(dev)


# ----------------------------------------------------------------------------- (a) correctness
def random_parents(bs: int, n: int, gen: torch.Generator) -> torch.Tensor:  # [bs, n], node order topological
    u = torch.rand(bs, n, generator=gen)
    idx = torch.arange(n)
    parent = torch.floor(u * idx.clamp(min=1)).to(torch.int64)
    parent[:, 0] = -1
    return parent


@dataclass
class Case:
    bs: int
    n: int
    tree: bool
    ratio: float
    width: int
    ct: Any
    keep: torch.Tensor  # [bs, n] bool
    prefix: torch.Tensor  # [bs]
    mask: Optional[torch.Tensor]
    plan: fv.VerifyPlan
    ref_plan: Any
    q: torch.Tensor  # [width, Hq, D]
    k: torch.Tensor
    v: torch.Tensor
    rp: torch.Tensor
    parent: torch.Tensor


def make_case(cfg: Config, gen: torch.Generator, bs: int, n: int, tree: bool, ratio: float,
              r2t: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> Case:
    dev = cfg.device
    prefix = torch.randint(1, cfg.max_prefix, (bs,), generator=gen)
    rp = torch.randperm(r2t.shape[0], generator=gen)[:bs]
    if tree:
        parent = random_parents(bs, n, gen)
        topo = TreeTopology.from_parents(parent)
        nt, ns = retrive_from_parents(parent)
        plan = choose(tree_survival(torch.rand(bs, n, generator=gen), topo).scores, None, mode=ratio, topology=topo)
        keep = plan.keep_mask
    else:
        parent = (torch.arange(n) - 1).expand(bs, n).clone()
        nt, ns = chain_retrive(bs, n)
        plan = choose(chain_survival(torch.rand(bs, n - 1, generator=gen) * 0.5 + 0.5).scores, None, mode=ratio)
        keep = chain_keep_mask(plan.keep_lens, n)
    width = bs + plan.budget
    tokens = torch.randint(0, cfg.vocab_check, (bs * n,), generator=gen)
    pos = (prefix.unsqueeze(1) + torch.arange(n)).reshape(-1)
    ct = compact_tree(keep, tokens, pos, nt, ns, num_tokens=width)
    mask = build_full_mask(ct.tree_block, ct.counts, prefix)[0] if tree else None
    # KV: prefix rows random, kept rows write their window slots
    dt = torch.bfloat16
    hq, hkv, d = cfg.heads_q, cfg.heads_kv, cfg.head_dim
    q = torch.randn(width, hq, d, generator=gen).to(dev, dt)
    k = torch.randn(width, hkv, d, generator=gen).to(dev, dt)
    v = torch.randn(width, hkv, d, generator=gen).to(dev, dt)
    r2t_d = r2t.to(dev)  # prefix KV: the random cache contents (filled once per run)
    cols = fv.kept_cols_from_index(ct.kept_index, n)
    row_req = torch.where(ct.kept_index >= 0, torch.div(ct.kept_index, n, rounding_mode="floor"), 0)
    write = torch.where(cols >= 0, r2t[rp[row_req], prefix[row_req] + cols.clamp(min=0)], fv.SINK_SLOT).to(dev)
    k_cache[write.long()], v_cache[write.long()] = k, v
    wip, wkv = fv.window_kv(r2t_d, rp.to(dev), prefix.to(dev), n)
    qo = fv.ragged_qo_indptr(ct.counts).to(dev)
    vp = fv.plan_verify(wip, wkv, prefix.to(dev), qo, cols.to(dev), None if mask is None else mask.to(dev),
                        num_tokens=width)
    ref_plan = plan_target_verify(r2t_d, rp.to(dev), prefix.tolist(), ct.counts.tolist(),
                                  None if mask is None else mask.to(dev))
    return Case(bs, n, tree, ratio, width, ct, keep, prefix, mask, vp, ref_plan, q, k, v, rp, parent)


def greedy_accept(case: Case, logits: torch.Tensor, candidates: torch.Tensor) -> Tuple[list, list]:
    """SGLang-style greedy tree verification over the pruned links (torch port of the kernel)."""
    bs, n = case.bs, case.n
    total = logits.shape[0]
    full = scatter_to_full(logits.float().cpu(), case.ct.kept_index[:total].cpu(), bs * n)
    target = full.argmax(dim=-1).view(bs, n)
    depth = int(TreeTopology.from_parents(case.parent).depth.max()) + 1
    accept_index = torch.full((bs, depth), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    pred = torch.zeros(bs * n, dtype=torch.int32)
    verify_tree_greedy_cpu(predicts=pred, accept_index=accept_index, accept_token_num=num, candidates=candidates,
                           retrive_index=torch.arange(bs * n).view(bs, n), retrive_next_token=case.ct.cut_next_token,
                           retrive_next_sibling=case.ct.cut_next_sibling, target_predict=target)
    return accept_index.tolist(), num.tolist()


def near_tie_rows(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:  # [rows, V] x 2 -> [rows] bool
    """Rows whose argmax the numeric difference could flip: top-2 gap <= 2 * max |ref - other|."""
    top2 = ref.float().topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]) <= 2 * (ref.float() - other.float()).abs().amax(dim=-1)


def random_kv_pool(cfg: Config, batch_size: int, gen: torch.Generator, device_seed: int, hkv: int, d: int,
                   dt: torch.dtype, dev) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A request-to-token table over shuffled KV slots (slot 0 = sink, never assigned) and random
    K/V caches: ``r2t`` ``[batch_size, ctx]`` int32 on the host, ``k_cache``/``v_cache``
    ``[slots, hkv, d]`` on ``dev``."""
    ctx = cfg.max_prefix + max(cfg.check_draft_tokens) + 1
    r2t = (torch.randperm(batch_size * ctx, generator=gen) + 1).view(batch_size, ctx).to(torch.int32)
    slots = batch_size * ctx + 1
    dev_gen = torch.Generator(device=dev).manual_seed(device_seed)
    k_cache = torch.empty(slots, hkv, d, dtype=dt, device=dev).normal_(generator=dev_gen)
    v_cache = torch.empty(slots, hkv, d, dtype=dt, device=dev).normal_(generator=dev_gen)
    return r2t, k_cache, v_cache


def check_correctness(cfg: Config, attn: VerifyAttention, deadline: float, log) -> Dict[str, Any]:
    dev, dt = cfg.device, torch.bfloat16
    hq, hkv, d = cfg.heads_q, cfg.heads_kv, cfg.head_dim
    sm = d ** -0.5
    max_bs = max(cfg.check_batch_sizes)
    gen = torch.Generator().manual_seed(1234)
    r2t, k_cache, v_cache = random_kv_pool(cfg, max_bs, gen, 4321, hkv, d, dt, dev)
    w_vocab = torch.randn(hq * d, cfg.vocab_check, generator=gen).to(dev) * (8.0 / math.sqrt(hq * d))
    res: Dict[str, Any] = dict(cases=0, eager_max_err=0.0, graph_max_err=0.0, graph_replays=0, graphs=0,
                               accept_compared=0, accept_mismatch=0, near_tie_requests=0, failures=[])
    for n in cfg.check_draft_tokens:
        for bs in cfg.check_batch_sizes:
            for tree in (True, False):
                for q_i, ratio in enumerate(cfg.tiers):
                    if time.monotonic() > deadline:
                        res["skipped"] = "time budget"
                        return res
                    width = fv.tier_token_counts(bs, n, cfg.tiers)[q_i]
                    g_attn = attn.graph(bs, width, use_mask=tree)
                    q_static = torch.zeros(width, hq, d, dtype=dt, device=dev)
                    g_attn.plan(capture_plan(bs, n, width, tree, dev), hq, hkv, d, dt, sm)
                    graph = Graph(lambda: g_attn.run(q_static, k_cache, v_cache), dev)
                    res["graphs"] += 1
                    for _ in range(cfg.cases):
                        c = make_case(cfg, gen, bs, n, tree, ratio, r2t, k_cache, v_cache)
                        total = int(c.ct.counts.sum())
                        ref = run_plan(c.ref_plan, c.q, c.k, c.v, k_cache, v_cache, scaling=sm)
                        ref32 = run_plan(c.ref_plan, c.q.float(), c.k.float(), c.v.float(), k_cache.float(),
                                         v_cache.float(), scaling=sm)
                        got = attn.eager(c.plan, c.q, k_cache, v_cache, sm)
                        err = float((got[:total].float() - ref[:total].float()).abs().max())
                        err32 = float((got[:total].float() - ref32[:total]).abs().max())
                        res["eager_max_err"] = max(res["eager_max_err"], err)
                        res["eager_max_err_vs_fp32"] = max(res.get("eager_max_err_vs_fp32", 0.0), err32)
                        # graph replay at the tier's padded size, padding lanes full of garbage
                        g_attn.plan(c.plan, hq, hkv, d, dt, sm)
                        q_static.normal_()
                        q_static[:total] = c.q[:total]
                        out = graph.replay()
                        gerr = float((out[:total].float() - ref[:total].float()).abs().max())
                        res["graph_max_err"] = max(res["graph_max_err"], gerr)
                        res["graph_replays"] += 1
                        res["cases"] += 1
                        if max(err, gerr) > BF16_ATOL or not math.isfinite(max(err, gerr)):
                            res["failures"].append(dict(bs=bs, n=n, tree=tree, ratio=ratio, eager=err, graph=gerr))
                        # greedy verification on vocabulary logits: FlashInfer vs torch backend
                        lg_ref = ref[:total].float().reshape(total, -1) @ w_vocab
                        lg_fi = out[:total].float().reshape(total, -1) @ w_vocab
                        tie = near_tie_rows(lg_ref, lg_fi)
                        cand = torch.randint(0, cfg.vocab_check, (bs * n,), generator=gen)
                        kept = c.ct.kept_index[:total].cpu()
                        ref_pred = scatter_to_full(lg_ref.argmax(-1, keepdim=True).cpu(), kept, bs * n).view(bs, n)
                        for b in range(bs):  # most drafts follow the target (so paths get long)
                            for u in range(1, n):
                                if float(torch.rand(1, generator=gen)) < 0.8:
                                    cand[b * n + u] = ref_pred[b, int(c.parent[b, u])]
                        cand = cand.view(bs, n)
                        acc_ref, num_ref = greedy_accept(c, lg_ref, cand)
                        acc_fi, num_fi = greedy_accept(c, lg_fi, cand)
                        tie_full = scatter_to_full(tie.view(-1, 1).cpu().float(), kept, bs * n)
                        tie_req = tie_full.view(bs, n).bool().any(dim=1).tolist()
                        for b in range(bs):
                            if tie_req[b]:
                                res["near_tie_requests"] += 1
                                continue
                            res["accept_compared"] += 1
                            if acc_ref[b] != acc_fi[b] or num_ref[b] != num_fi[b]:
                                res["accept_mismatch"] += 1
                    log(f"(a) bs={bs} N={n} {'tree ' if tree else 'chain'} tier={ratio}: rows {width}, "
                        f"max err eager {res['eager_max_err']:.2e} graph {res['graph_max_err']:.2e}")
    res["passed"] = not res["failures"] and res["accept_mismatch"] == 0 and res["cases"] > 0
    return res



def check_padded_replay(cfg: Config, attn: VerifyAttention, deadline: float, log) -> Dict[str, Any]:
    """(a2) A compacted step replayed from a *larger* tier graph, as ``DCutVerifyGraphRunner`` does.

    Graphs are captured for the largest check batch size ``bs_g`` only (``dcut_graphs.tier_graph_keys``);
    steps of fewer requests pick theirs with ``TierGraphTable.lookup`` and are padded with
    ``pad_ragged_layout``: zero-row padding requests whose keys are the fill-value prefix (1) of request
    row 0 (what SGLang's registry puts in padded request slots), and rows past the last request filled
    with garbage. The real rows must equal the torch backend's attention; padding rows are not compared.
    """
    from sglang_ext.engine.dcut import graphs as dg  # pure part (no SGLang import)

    dev, dt = cfg.device, torch.bfloat16
    hq, hkv, d = cfg.heads_q, cfg.heads_kv, cfg.head_dim
    sm = d ** -0.5
    bs_g = max(cfg.check_batch_sizes)
    raw_sizes = sorted({max(1, bs_g // 2), bs_g - 1} - {bs_g}) or [bs_g]
    gen = torch.Generator().manual_seed(2468)
    r2t, k_cache, v_cache = random_kv_pool(cfg, bs_g, gen, 8642, hkv, d, dt, dev)
    res: Dict[str, Any] = dict(cases=0, graphs=0, max_err=0.0, padded_requests=0, padded_rows=0, no_graph=0,
                               failures=[])
    for n in cfg.check_draft_tokens:
        for tree in (True, False):
            table = dg.TierGraphTable(dg.tier_graph_keys([bs_g], n, cfg.tiers, masked=tree))
            graphs: Dict[Any, Tuple[GraphAttention, Graph, torch.Tensor]] = {}
            for raw_bs in raw_sizes:
                for ratio in cfg.tiers[:-1]:
                    if time.monotonic() > deadline:
                        res["skipped"] = "time budget"
                        return res
                    c = make_case(cfg, gen, raw_bs, n, tree, ratio, r2t, k_cache, v_cache)
                    key = table.lookup(raw_bs, c.width, tree)
                    if key is None:
                        res["no_graph"] += 1
                        continue
                    if key not in graphs:
                        g_attn = attn.graph(key.batch_size, key.num_tokens, use_mask=tree)
                        q_static = torch.zeros(key.num_tokens, hq, d, dtype=dt, device=dev)
                        g_attn.plan(capture_plan(key.batch_size, n, key.num_tokens, tree, dev), hq, hkv, d, dt, sm)
                        graphs[key] = (g_attn, Graph(lambda g=g_attn, q=q_static: g.run(q, k_cache, v_cache), dev),
                                       q_static)
                        res["graphs"] += 1
                    g_attn, graph, q_static = graphs[key]
                    total = int(c.ct.counts.sum())
                    lay = dg.pad_ragged_layout(c.ct.qo_indptr.to(dev), key.batch_size, key.num_tokens)
                    pad = key.batch_size - raw_bs
                    rp_pad = torch.cat([c.rp, torch.zeros(pad, dtype=c.rp.dtype)]).to(dev)
                    p_pad = torch.cat([c.prefix, torch.ones(pad, dtype=c.prefix.dtype)]).to(dev)
                    wip, wkv = fv.window_kv(r2t.to(dev), rp_pad, p_pad, n)
                    cols = fv.kept_cols_from_index(c.ct.kept_index, n).to(dev)
                    plan = fv.plan_verify(wip, wkv, p_pad, lay.qo_indptr, cols,
                                          None if c.mask is None else c.mask.to(dev), num_tokens=key.num_tokens)
                    g_attn.plan(plan, hq, hkv, d, dt, sm)
                    q_static.normal_()
                    q_static[:total] = c.q[:total]
                    out = graph.replay()
                    ref = run_plan(c.ref_plan, c.q, c.k, c.v, k_cache, v_cache, scaling=sm)
                    err = float((out[:total].float() - ref[:total].float()).abs().max())
                    res["max_err"] = max(res["max_err"], err)
                    res["cases"] += 1
                    res["padded_requests"] += pad
                    res["padded_rows"] += key.num_tokens - total
                    if err > BF16_ATOL or not math.isfinite(err):
                        res["failures"].append(dict(n=n, tree=tree, raw_bs=raw_bs, ratio=ratio, width=c.width,
                                                    graph=[key.batch_size, key.num_tokens], err=err))
            log(f"(a2) N={n} {'tree ' if tree else 'chain'}: {len(graphs)} graphs at bs {bs_g}, "
                f"max err {res['max_err']:.2e}")
    res["passed"] = not res["failures"] and res["cases"] > 0 and res["padded_requests"] > 0
    return res

# ----------------------------------------------------------------------------- model stacks for (b)
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [T, H, D], cos/sin [T, D/2]
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def probe_grouped_mm(device: str) -> Tuple[Optional[str], str]:
    """Which ``torch._grouped_mm`` weight layout works here ("row" / "col"), or None and why."""
    if device != "cuda" or not hasattr(torch, "_grouped_mm"):
        return None, "torch._grouped_mm unavailable (needs CUDA and a recent torch)"
    a = torch.randn(64, 64, device=device, dtype=torch.bfloat16)
    offs = torch.tensor([16, 48, 64], device=device, dtype=torch.int32)
    errors = []
    for layout in ("col", "row"):
        w = torch.randn(3, 32, 64, device=device, dtype=torch.bfloat16)  # [E, N, K]
        b = w.transpose(1, 2) if layout == "col" else w.transpose(1, 2).contiguous()  # [E, K, N]
        try:
            out = torch._grouped_mm(a, b, offs=offs)
            want = torch.cat([a[:16] @ b[0], a[16:48] @ b[1], a[48:] @ b[2]])
            if torch.allclose(out.float(), want.float(), atol=0.5, rtol=0.05):
                return layout, "ok"
            errors.append(f"{layout}: wrong result")
        except Exception as e:  # layout/arch constraints differ across torch versions
            errors.append(f"{layout}: {type(e).__name__}: {e}")
    return None, "; ".join(errors)


class Stack:
    """Random-weight decoder stack (dense or MoE) whose attention is the pruned verify path."""

    def __init__(self, spec: Dict[str, int], moe: bool, device: str, gen: torch.Generator,
                 grouped_layout: Optional[str] = None):
        dt = torch.bfloat16
        self.spec, self.moe, self.device = spec, moe, device
        h, hq, hkv, d = spec["hidden"], spec["heads_q"], spec["heads_kv"], spec["head_dim"]

        def rnd(*shape, scale=0.02):
            t = torch.empty(*shape, device=device, dtype=dt)
            return t.normal_(0.0, scale, generator=gen if device == "cpu" else None)

        self.embed = rnd(spec["vocab"], h)
        self.lm_head = rnd(spec["vocab"], h)
        self.final_norm = torch.ones(h, device=device, dtype=dt)
        self.layers = []
        for _ in range(spec["layers"]):
            lay = dict(norm1=torch.ones(h, device=device, dtype=dt), norm2=torch.ones(h, device=device, dtype=dt),
                       qkv=rnd((hq + 2 * hkv) * d, h), o=rnd(h, hq * d))
            if moe:
                e, i = spec["experts"], spec["inter"]
                lay["router"] = rnd(e, h)
                gu, dn = rnd(e, 2 * i, h), rnd(e, h, i)  # [E, N, K]
                if grouped_layout == "row":
                    gu, dn = gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous()
                else:
                    gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)  # [E, K, N] column-major views
                lay["gate_up"], lay["down"] = gu, dn
            else:
                lay["gate_up"], lay["down"] = rnd(2 * spec["inter"], h), rnd(h, spec["inter"])
            self.layers.append(lay)
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        self.inv_freq = inv

    def kv_caches(self, slots: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        s = self.spec
        shape = (slots, s["heads_kv"], s["head_dim"])
        ks = [torch.zeros(shape, device=self.device, dtype=torch.bfloat16) for _ in self.layers]
        vs = [torch.zeros(shape, device=self.device, dtype=torch.bfloat16) for _ in self.layers]
        return ks, vs

    def _mlp(self, lay, x):
        if not self.moe:
            gu = x @ lay["gate_up"].T
            g, u = gu.chunk(2, dim=-1)
            return (torch.nn.functional.silu(g) * u) @ lay["down"].T
        s = self.spec
        e, k = s["experts"], s["topk"]
        t = x.shape[0]
        probs = torch.softmax((x @ lay["router"].T).float(), dim=-1)
        w, idx = probs.topk(k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = torch.div(order, k, rounding_mode="floor")
        counts = torch.zeros(e, device=x.device, dtype=torch.int32).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        xs = x.index_select(0, tok)
        if self.device == "cuda":
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            gu = torch._grouped_mm(xs, lay["gate_up"], offs=offs)
            g, u = gu.chunk(2, dim=-1)
            y = torch._grouped_mm((torch.nn.functional.silu(g) * u).contiguous(), lay["down"], offs=offs)
        else:  # dry run: per-expert loop (no graphs on CPU)
            y = torch.zeros(xs.shape[0], x.shape[1], device=x.device, dtype=x.dtype)
            start = 0
            for ex, c in enumerate(counts.tolist()):
                if c:
                    gu = xs[start:start + c] @ lay["gate_up"][ex]
                    g, u = gu.chunk(2, dim=-1)
                    y[start:start + c] = (torch.nn.functional.silu(g) * u) @ lay["down"][ex]
                start += c
        y = y * w.reshape(-1).index_select(0, order).unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, tok, y)

    def forward(self, ids, positions, write_slots, attn: GraphAttention, ks, vs):  # ids/positions/write_slots: [T]
        s = self.spec
        hq, hkv, d = s["heads_q"], s["heads_kv"], s["head_dim"]
        freqs = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        cos, sin = freqs.cos(), freqs.sin()
        x = self.embed.index_select(0, ids)
        for li, lay in enumerate(self.layers):
            hres = rms_norm(x, lay["norm1"])
            qkv = hres @ lay["qkv"].T
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            q = rope(q.view(-1, hq, d), cos, sin)
            k = rope(k.view(-1, hkv, d), cos, sin)
            ks[li].index_copy_(0, write_slots, k)
            vs[li].index_copy_(0, write_slots, v.view(-1, hkv, d))
            o = attn.run(q.contiguous(), ks[li], vs[li], k, v.view(-1, hkv, d))
            x = x + o.reshape(o.shape[0], -1) @ lay["o"].T
            x = x + self._mlp(lay, rms_norm(x, lay["norm2"]))
        return rms_norm(x, self.final_norm) @ self.lm_head.T


def cost_curves(cfg: Config, attn: VerifyAttention, name: str, spec: Dict[str, int], moe: bool,
                deadline: float, log, grouped_layout: Optional[str] = None) -> Dict[str, Any]:
    dev = cfg.device
    n = cfg.cost_draft_tokens
    gen = torch.Generator(device="cpu").manual_seed(7)
    t0 = time.monotonic()
    stack = Stack(spec, moe, dev, gen, grouped_layout)
    max_bs = max(cfg.cost_batch_sizes)
    ctx = cfg.context_len + n + 1
    r2t = (torch.arange(max_bs * ctx, dtype=torch.int32) + 1).view(max_bs, ctx).to(dev)  # slot 0 = sink
    ks, vs = stack.kv_caches(max_bs * ctx + 1)
    for t in ks + vs:
        t.normal_()
    log(f"(b) {name}: weights + KV ready in {time.monotonic() - t0:.1f} s")
    hq, hkv, d = spec["heads_q"], spec["heads_kv"], spec["head_dim"]
    sm = d ** -0.5
    pool = torch.cuda.graph_pool_handle() if dev == "cuda" else None
    rows: List[List[float]] = []
    detail: List[Dict[str, Any]] = []
    done_bs: List[int] = []
    for bs in cfg.cost_batch_sizes:
        row = []
        for q_i, ratio in enumerate(cfg.tiers):
            if time.monotonic() > deadline:
                return dict(skipped="time budget", batch_sizes=done_bs, step_ms=rows, detail=detail)
            width = fv.tier_token_counts(bs, n, cfg.tiers)[q_i]
            counts = torch.tensor(fv.capture_counts(bs, n, width), device=dev)
            prefix = torch.full((bs,), cfg.context_len, dtype=torch.int64, device=dev)
            rp = torch.arange(bs, device=dev)
            qo = fv.ragged_qo_indptr(counts)

            def make_plan():
                wip, wkv = fv.window_kv(r2t, rp, prefix, n)
                return fv.plan_verify(wip, wkv, prefix, qo, fv.chain_kept_cols(qo, width), None, num_tokens=width)

            if attn.mode == "torch":
                g_attn = attn.torch_graph(r2t, rp, prefix, counts, sm)
            else:
                g_attn = attn.graph(bs, width, use_mask=False)
            g_attn.plan(make_plan(), hq, hkv, d, torch.bfloat16, sm)
            cols = fv.chain_kept_cols(qo, width)
            req = torch.searchsorted(qo[1:].to(torch.int64), torch.arange(width, device=dev), right=True)
            req = req.clamp(max=bs - 1)
            ids = torch.randint(0, spec["vocab"], (width,), device=dev)
            positions = (prefix.index_select(0, req) + cols.clamp(min=0)).to(torch.int64)
            write = torch.where(cols >= 0, r2t[rp.index_select(0, req), positions], fv.SINK_SLOT).to(torch.int64)
            graph = Graph(lambda: stack.forward(ids, positions, write, g_attn, ks, vs), dev, pool)
            for _ in range(cfg.warmup):
                g_attn.plan(make_plan(), hq, hkv, d, torch.bfloat16, sm)
                graph.replay()
            replay_ms, plan_ms = [], []
            for _ in range(cfg.iters):
                _sync(dev)
                a = time.perf_counter()
                if attn.mode != "torch":
                    g_attn.plan(make_plan(), hq, hkv, d, torch.bfloat16, sm)
                _sync(dev)
                b = time.perf_counter()
                graph.replay()
                _sync(dev)
                c = time.perf_counter()
                plan_ms.append((b - a) * 1e3)
                replay_ms.append((c - b) * 1e3)
            step = _mean(replay_ms) + _mean(plan_ms)
            row.append(step)
            detail.append(dict(bs=bs, tier=ratio, rows=width, replay_ms=_mean(replay_ms), plan_ms=_mean(plan_ms)))
            del graph
        rows.append(row)
        done_bs.append(bs)
        log(f"(b) {name} bs={bs}: " + ", ".join(f"{r:g}:{m:.2f} ms" for r, m in zip(cfg.tiers, row)))
    del stack, ks, vs
    if dev == "cuda":
        torch.cuda.empty_cache()
    return dict(batch_sizes=done_bs, step_ms=rows, detail=detail)


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def _mean(x: Sequence[float]) -> float:
    return sum(x) / max(len(x), 1)


def _median(x: Sequence[float]) -> float:
    s = sorted(x)
    return s[len(s) // 2] if s else float("nan")


# ----------------------------------------------------------------------------- (c) planner overhead
def planner_overhead(cfg: Config, attn: VerifyAttention, table: Optional[CostTable], log) -> Dict[str, Any]:
    dev = cfg.device
    bs, n = cfg.planner_bs, 16
    gen = torch.Generator().manual_seed(3)
    ctx = cfg.max_prefix + n + 1
    r2t = (torch.arange(bs * ctx, dtype=torch.int32) + 1).view(bs, ctx).to(dev)
    prefix = torch.randint(1, cfg.max_prefix, (bs,), generator=gen).to(dev)
    rp = torch.arange(bs, device=dev)
    hq, hkv, d = cfg.heads_q, cfg.heads_kv, cfg.head_dim
    if table is not None and table.lookup(bs) is None:
        table = None
    out: Dict[str, Any] = {"batch_size": bs, "num_draft_tokens": n, "cost_table": table is not None}
    for kind in ("chain", "tree"):
        stages: Dict[str, List[float]] = {}
        conf = torch.rand(bs, n - 1 if kind == "chain" else n, generator=gen).to(dev)
        parent = random_parents(bs, n, gen).to(dev)
        tokens = torch.randint(0, 1000, (bs * n,), device=dev)
        pos = (prefix.unsqueeze(1) + torch.arange(n, device=dev)).reshape(-1)
        g_attn = None
        for it in range(cfg.planner_iters + 5):
            marks = [("start", _now(dev))]
            if kind == "chain":
                scores = chain_survival(conf).scores
                marks.append(("scores", _now(dev)))
                plan = choose(scores, table, cfg.tiers, "auto" if table is not None else 0.5)
                keep = chain_keep_mask(plan.keep_lens, n)
                nt, ns = chain_retrive(bs, n, device=dev)
            else:
                topo = TreeTopology.from_parents(parent)
                scores = tree_survival(conf, topo).scores
                marks.append(("scores", _now(dev)))
                plan = choose(scores, table, cfg.tiers, "auto" if table is not None else 0.5, topology=topo)
                keep = plan.keep_mask
                nt, ns = retrive_from_parents(parent)
            marks.append(("choose", _now(dev)))
            width = bs + plan.budget
            ct = compact_tree(keep, tokens, pos, nt, ns, num_tokens=width)
            marks.append(("compact", _now(dev)))
            mask = build_full_mask(ct.tree_block, ct.counts, prefix)[0] if kind == "tree" else None
            marks.append(("mask", _now(dev)))
            wip, wkv = fv.window_kv(r2t, rp, prefix, n)
            qo = ct.qo_indptr
            cols = fv.kept_cols_from_index(ct.kept_index, n) if kind == "tree" else fv.chain_kept_cols(qo, width)
            vp = fv.plan_verify(wip, wkv, prefix, qo, cols, mask, num_tokens=width)
            marks.append(("verify_plan", _now(dev)))
            if attn.use_flashinfer:
                if g_attn is None or g_attn.num_tokens != width:
                    g_attn = attn.graph(bs, width, use_mask=kind == "tree")
                    g_attn.plan(capture_plan(bs, n, width, kind == "tree", dev), hq, hkv, d, torch.bfloat16,
                                d ** -0.5)
                g_attn.plan(vp, hq, hkv, d, torch.bfloat16, d ** -0.5)
            marks.append(("flashinfer_plan", _now(dev)))
            if it >= 5:
                for (_, a), (name, b) in zip(marks, marks[1:]):
                    stages.setdefault(name, []).append((b - a) * 1e3)
        med = {k: _median(v) for k, v in stages.items()}
        med["total"] = sum(med.values())
        out[kind] = med
        log(f"(c) planner bs={bs} N={n} {kind}: total {med['total']:.3f} ms (" +
            ", ".join(f"{k} {v:.3f}" for k, v in med.items() if k != "total") + ")")
    out["passed"] = True
    return out


def _now(dev: str) -> float:
    _sync(dev)
    return time.perf_counter()


# ----------------------------------------------------------------------------- output
def device_name(dev: str) -> str:
    if dev == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.machine()})"


def cost_table_for(cfg: Config, name: str, res: Dict[str, Any], backend: str) -> Optional[CostTable]:
    if not res.get("batch_sizes"):
        return None
    key = CostTableKey(model=name, draft="none (verify only)", device=device_name(cfg.device), tp=1, dtype="bfloat16",
                       draft_tokens=cfg.cost_draft_tokens, topk=1, num_steps=1, attention_backend=backend,
                       context_len=cfg.context_len, sglang_version=SGLANG_VERSION, sglang_ext_version=EXT_VERSION)
    return CostTable.build(key, res["batch_sizes"], res["step_ms"], tiers=cfg.tiers)


def write_png(path: str, curves: Dict[str, CostTable]) -> str:
    """PNG of ms vs batch size per tier (matplotlib when installed, else a plain raster plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
        for ax, (name, t) in zip(axes[0], curves.items()):
            for q, r in enumerate(t.tiers):
                ax.plot(t.batch_sizes, [row[q] for row in t.step_ms], marker="o", label=f"tier {r:g}")
            ax.set_title(f"{t.key.model}\n{t.key.device}, N={t.key.draft_tokens}, context {t.key.context_len}",
                         fontsize=9)
            ax.set_xlabel("batch size")
            ax.set_ylabel("verify step ms (replay + plan)")
            ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return "matplotlib"
    except ImportError:
        _raster_png(path, curves)
        return "raster (matplotlib not installed: no text; tiers blue/green/orange/red, one panel per stack)"


def _raster_png(path: str, curves: Dict[str, CostTable]) -> None:
    w_panel, h = 480, 320
    width = w_panel * max(len(curves), 1)
    img = [[(255, 255, 255)] * width for _ in range(h)]
    colors = [(31, 119, 180), (44, 160, 44), (255, 127, 14), (214, 39, 40), (148, 103, 189)]

    def line(x0, y0, x1, y1, c):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            x = round(x0 + (x1 - x0) * s / steps)
            y = round(y0 + (y1 - y0) * s / steps)
            for dx in (0, 1):
                if 0 <= x + dx < width and 0 <= y < h:
                    img[y][x + dx] = c

    for p_i, t in enumerate(curves.values()):
        x_off = p_i * w_panel
        line(x_off + 40, 20, x_off + 40, h - 30, (0, 0, 0))
        line(x_off + 40, h - 30, x_off + w_panel - 20, h - 30, (0, 0, 0))
        ymax = max(max(r) for r in t.step_ms) * 1.1
        xs = [math.log2(b) for b in t.batch_sizes]
        x_lo, x_hi = min(xs), max(max(xs), min(xs) + 1)
        for q in range(len(t.tiers)):
            pts = [(x_off + 40 + (x - x_lo) / (x_hi - x_lo) * (w_panel - 70),
                    h - 30 - row[q] / ymax * (h - 60)) for x, row in zip(xs, t.step_ms)]
            for (a, b), (c, d) in zip(pts, pts[1:]):
                line(round(a), round(b), round(c), round(d), colors[q % len(colors)])
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


# ----------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, reference math instead of FlashInfer")
    ap.add_argument("--quick", action="store_true", help="smaller GPU configuration (pytest gpu marker)")
    ap.add_argument("--out", default=None, help="output folder (default bench/results; a temp folder for --dry-run)")
    ap.add_argument("--time-budget", type=float, default=450.0, help="seconds; later parts are skipped past it")
    ap.add_argument("--skip-moe", action="store_true")
    ap.add_argument("--warm-jit", action="store_true",
                    help="compile FlashInfer's kernels (JIT) on tiny plans first; the time budget starts after it")
    ap.add_argument("--attention", choices=("auto", "flashinfer", "torch", "reference"), default="auto",
                    help="auto: flashinfer on GPU (torch SDPA for (b)/(c) if FlashInfer fails in (a)), "
                         "reference in --dry-run")
    args = ap.parse_args(argv)

    if not args.dry_run and not torch.cuda.is_available():
        print("run_gpu_checks: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return EXIT_SKIPPED
    cfg = make_config(args.dry_run, args.quick)
    out_dir = args.out or (tempfile.mkdtemp(prefix="gpu_checks_dry_") if args.dry_run
                           else os.path.join(REPO, "bench", "results"))
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.time_budget
    lines: List[str] = []

    def log(msg: str) -> None:
        line = f"[{time.monotonic() - start:6.1f} s] {msg}"
        lines.append(line)
        print(line, flush=True)

    summary: Dict[str, Any] = dict(
        device=device_name(cfg.device), torch=torch.__version__, dry_run=cfg.dry_run, quick=args.quick,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    status = EXIT_OK
    mode = args.attention if args.attention != "auto" else ("reference" if cfg.dry_run else "flashinfer")
    fi_ok, fi_why = (False, f"not used (attention {mode})") if mode != "flashinfer" else fv.flashinfer_available()
    summary["flashinfer"] = dict(available=fi_ok, detail=fi_why)
    if fi_ok:
        import flashinfer

        summary["flashinfer"]["version"] = getattr(flashinfer, "__version__", "?")
    log(f"device {summary['device']}, torch {torch.__version__}, flashinfer: {fi_why}")
    if mode == "flashinfer" and not fi_ok:
        summary["a_correctness"] = dict(skipped=f"flashinfer: {fi_why}")
        status = EXIT_SKIPPED
        mode = "torch"
        log(f"(a) skipped ({fi_why}); (b)/(c) use the torch backend's SDPA")
    attn = VerifyAttention(cfg, mode)
    summary["attention"] = mode
    if args.warm_jit and mode == "flashinfer":
        t0 = time.monotonic()
        try:
            warm_jit(cfg, attn)
            summary["jit_warmup"] = dict(seconds=time.monotonic() - t0, passed=True)
        except Exception as e:  # reported; part (a) records its own error if FlashInfer cannot run
            summary["jit_warmup"] = dict(seconds=time.monotonic() - t0, passed=False, error=f"{type(e).__name__}: {e}")
        log(f"FlashInfer JIT warm-up: {summary['jit_warmup']}")
        deadline = time.monotonic() + args.time_budget  # the budget counts from after the compile

    def run_part(key: str, fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        nonlocal status
        try:
            res = fn()
        except Exception as e:  # record and go on with the next part
            import traceback

            res = dict(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8), passed=False)
            log(f"{key}: ERROR {res['error']}")
        summary[key] = res
        if res.get("skipped"):
            status = max(status, EXIT_SKIPPED) if status != EXIT_FAILED else status
        elif not res.get("passed", True):
            status = EXIT_FAILED
        return res

    if mode != "torch":
        a_res = run_part("a_correctness", lambda: check_correctness(cfg, attn, deadline, log))
        run_part("a2_padded_replay", lambda: check_padded_replay(cfg, attn, deadline, log))  # [dcut/graphs]
        if a_res.get("error") and mode == "flashinfer":  # e.g. no JIT toolchain: keep the cost curves
            attn = VerifyAttention(cfg, "torch")
            summary["attention"] = "torch (FlashInfer failed in (a))"
            log("FlashInfer failed in (a); (b)/(c) use the torch backend's SDPA")
    else:  # every part is reported, run or not
        summary.setdefault("a_correctness", dict(skipped="--attention torch"))
        summary["a2_padded_replay"] = dict(skipped=f"needs FlashInfer or the reference ({summary['a_correctness']['skipped']})")
        status = max(status, EXIT_SKIPPED)
    tables: Dict[str, CostTable] = {}
    backend = {"flashinfer": "flashinfer_dcut", "torch": "torch_sdpa (graph, fixed layout)",
               "reference": "reference (dry run)"}[attn.mode]

    def dense():
        res = cost_curves(cfg, attn, "qwen3-8b-shaped-random", cfg.dense, False, deadline, log)
        t = cost_table_for(cfg, "qwen3-8b-shaped-random" if not args.quick else "qwen3-8b-shaped-random-4-layers",
                           res, backend)
        if t is not None:
            tables["dense"] = t
            path = os.path.join(out_dir, "cost_table_qwen3_8b_dense.json")
            t.save(path)
            res["cost_table"] = path
        res.setdefault("passed", t is not None)
        return res

    # (c) needs a table for the auto mode: planned after (b) dense when time allows, else ratio mode
    run_part("b_cost_curves_dense", dense)
    run_part("c_planner", lambda: planner_overhead(cfg, attn, tables.get("dense"), log))
    if args.skip_moe:
        summary["b_cost_curves_moe"] = dict(skipped="--skip-moe")
    else:
        layout, why = probe_grouped_mm(cfg.device) if not cfg.dry_run else ("loop", "dry run: per-expert loop")
        if layout is None:
            summary["b_cost_curves_moe"] = dict(skipped=f"MoE stack: {why}")
            log(f"(b) MoE stack skipped: {why}")
        else:
            def moe():
                res = cost_curves(cfg, attn, "qwen3-30b-a3b-shaped-random", cfg.moe, True, deadline, log, layout)
                t = cost_table_for(cfg, "qwen3-30b-a3b-shaped-random", res, backend)
                if t is not None:
                    tables["moe"] = t
                    path = os.path.join(out_dir, "cost_table_qwen3_30b_a3b_moe.json")
                    t.save(path)
                    res["cost_table"] = path
                res.setdefault("passed", t is not None)
                return res

            run_part("b_cost_curves_moe", moe)
    if tables:
        png = os.path.join(out_dir, "verify_cost_curves.png")
        summary["png"] = dict(path=png, renderer=write_png(png, tables))
    for part in PARTS:  # a part never reached is reported, not left out
        if part not in summary:
            summary[part] = dict(skipped="not reached")
            status = max(status, EXIT_SKIPPED) if status != EXIT_FAILED else status
    summary["elapsed_s"] = time.monotonic() - start
    summary["exit_status"] = status
    _write_summary(out_dir, summary, lines)
    log(f"done: exit status {status} ({ {0: 'all passed', 1: 'a check failed', 2: 'a part was skipped'}[status] }),"
        f" results in {out_dir}")
    return status


def _write_summary(out_dir: str, summary: Dict[str, Any], lines: List[str]) -> None:
    summary["log"] = lines
    with open(os.path.join(out_dir, "gpu_checks_summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=str)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())

"""The ``torch_sdpa`` backend against a dense per-request reference attention.

Real SGLang objects on CPU: ``ReqToTokenPool``, ``MHATokenToKVPool``, ``RadixAttention``,
``ForwardBatch``, ``EagleVerifyInput`` and ``RaggedVerifyLayout``; the model runner is a
stand-in carrying only what the backend reads (device, the two pools, ``is_draft_worker``,
``model_config.context_len``). The reference computes every output row in float64 straight
from its definition: the keys a row may see (prefix, plus ancestors-or-self from a parent
array for trees, earlier rows for causal extends, the branch's own earlier rows for draft
steps), never from the backend's masks or index maps.

Budget: < 30 s on the shared 2-core machine (one SGLang import, 30 tiny cases).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

NO_PARENT = -1
HQ, HKV, D = 4, 2, 8  # GQA 2:1
SCALE = 1.0 / math.sqrt(D)
MAX_REQS, CTX, SLOTS = 8, 96, 512
ATOL = 1e-5


@pytest.fixture(scope="module")
def sg():
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.eagle_utils import TreeMaskMode, per_step_draft_out_cache_loc
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    from sglang_ext.engine.attention import torch_sdpa as torch_backend

    return SimpleNamespace(**locals())


class Scenario:
    """Pools with random cached K/V: request ``b`` uses pool row ``rows[b]`` and distinct random slots."""

    def __init__(self, sg, gen: torch.Generator, is_draft: bool = False, layer_id: int = 1, logit_cap: float = 0.0):
        self.sg, self.gen = sg, gen
        self.r2t_pool = sg.ReqToTokenPool(size=MAX_REQS, max_context_len=CTX, device="cpu", enable_memory_saver=False)
        self.kv_pool = sg.MHATokenToKVPool(
            size=SLOTS, page_size=1, dtype=torch.float32, head_num=HKV, head_dim=D, layer_num=2,
            device="cpu", enable_memory_saver=False,
        )
        self.runner = SimpleNamespace(
            device="cpu", req_to_token_pool=self.r2t_pool, token_to_kv_pool=self.kv_pool,
            is_draft_worker=is_draft, model_config=SimpleNamespace(context_len=CTX),
        )
        self.layer = sg.RadixAttention(
            num_heads=HQ, head_dim=D, scaling=SCALE, num_kv_heads=HKV, layer_id=layer_id, logit_cap=logit_cap
        )
        self.free = torch.randperm(SLOTS, generator=gen)[: SLOTS - 8] + 1  # slot 0 is the pad sink
        self.next_free = 0
        k_buf = self.kv_pool.get_key_buffer(layer_id)
        v_buf = self.kv_pool.get_value_buffer(layer_id)
        k_buf.copy_(torch.randn(k_buf.shape, generator=gen))
        v_buf.copy_(torch.randn(v_buf.shape, generator=gen))

    def alloc(self, n: int) -> torch.Tensor:
        out = self.free[self.next_free : self.next_free + n]
        self.next_free += n
        assert out.numel() == n
        return out.to(torch.int64)

    def fill_row(self, row: int, start: int, n: int) -> torch.Tensor:
        slots = self.alloc(n)
        self.r2t_pool.req_to_token[row, start : start + n] = slots.to(torch.int32)
        return slots

    @property
    def k_cache(self):
        return self.kv_pool.get_key_buffer(self.layer.layer_id)

    @property
    def v_cache(self):
        return self.kv_pool.get_value_buffer(self.layer.layer_id)


def reference_rows(q, keys, values, visible, logit_cap=0.0):
    """Dense attention of query rows over explicit key lists, float64.

    q [n, HQ, D]; keys/values: per row a [L_r, HKV, D] tensor; visible: per row a bool list over L_r.
    """
    out = torch.zeros(q.shape[0], HQ, D, dtype=torch.float64)
    group = HQ // HKV
    for r in range(q.shape[0]):
        kk = keys[r].double()[torch.tensor(visible[r])]
        vv = values[r].double()[torch.tensor(visible[r])]
        for h in range(HQ):
            s = kk[:, h // group, :] @ q[r, h].double() * SCALE
            if logit_cap > 0:
                s = logit_cap * torch.tanh(s / logit_cap)
            out[r, h] = torch.softmax(s, 0) @ vv[:, h // group, :]
    return out


def random_parents(q: int, gen: torch.Generator) -> list:
    """A random tree of ``q`` nodes in topological order (node 0 is the root)."""
    return [NO_PARENT] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, q)]


def ancestors_or_self(parents: list, r: int) -> set:
    out = set()
    while r != NO_PARENT:
        out.add(r)
        r = parents[r]
    return out


def full_layout_mask(prefix_lens, trees, dtype=torch.bool, prefix_fill=True) -> torch.Tensor:
    """SGLang's FULL layout, written from the definition: rows of width p+q, ancestors-or-self."""
    cells = []
    for p, parents in zip(prefix_lens, trees):
        q = len(parents)
        for r in range(q):
            anc = ancestors_or_self(parents, r)
            cells += [prefix_fill] * p + [c in anc for c in range(q)]
    return torch.tensor(cells, dtype=torch.bool).to(dtype)


def qlen_layout_mask(trees) -> torch.Tensor:
    cells = []
    for parents in trees:
        q = len(parents)
        for r in range(q):
            anc = ancestors_or_self(parents, r)
            cells += [c in anc for c in range(q)]
    return torch.tensor(cells, dtype=torch.bool)


def make_verify_input(sg, custom_mask, q_lens, seq_lens, draft_token_num, layout=None):
    total = sum(q_lens)
    vi = sg.EagleVerifyInput(
        draft_token=torch.zeros(total, dtype=torch.long),
        custom_mask=custom_mask,
        positions=torch.zeros(total, dtype=torch.long),
        retrieve_index=torch.zeros(len(q_lens), draft_token_num, dtype=torch.long),
        retrieve_next_token=torch.zeros(len(q_lens), draft_token_num, dtype=torch.long),
        retrieve_next_sibling=torch.zeros(len(q_lens), draft_token_num, dtype=torch.long),
        retrieve_cum_len=None,
        spec_steps=draft_token_num - 1,
        topk=1,
        draft_token_num=draft_token_num,
        capture_hidden_mode=sg.CaptureHiddenMode.FULL,
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
    )
    if layout is not None:
        vi.ragged_verify_layout = layout
    return vi


def run_verify_case(sg, gen, seq_lens, trees, *, ragged, mask_kind="full", pad_lanes=0):
    """Build a TARGET_VERIFY batch, run the backend, and return (out, expected, scenario, extra)."""
    sc = Scenario(sg, gen)
    bs = len(seq_lens)
    q_lens = [len(t) for t in trees]
    rows = torch.randperm(MAX_REQS, generator=gen)[:bs]
    prefix_slots = [sc.fill_row(int(rows[b]), 0, seq_lens[b]) for b in range(bs)]
    # draft window slots: R[row, s : s + q] (compacted or not does not matter to the backend)
    win_slots = [sc.fill_row(int(rows[b]), seq_lens[b], q_lens[b]) for b in range(bs)]
    total = sum(q_lens)
    out_cache_loc = torch.cat(win_slots + [torch.zeros(pad_lanes, dtype=torch.int64)])
    n_rows = total + pad_lanes
    q = torch.randn(n_rows, HQ * D, generator=gen)
    k = torch.randn(n_rows, HKV, D, generator=gen)
    v = torch.randn(n_rows, HKV, D, generator=gen)
    if mask_kind == "full":
        mask = full_layout_mask(seq_lens, trees, prefix_fill=False)  # prefix cells ignored by the backend
    elif mask_kind == "full_uint8":
        mask = full_layout_mask(seq_lens, trees, dtype=torch.uint8)
    elif mask_kind == "qlen":
        mask = qlen_layout_mask(trees)
    else:
        mask = None
    layout = None
    if ragged:
        layout = sg.RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=q_lens, device="cpu", grid=[n_rows])
    n_draft = max(q_lens)
    spec = make_verify_input(sg, mask, q_lens, seq_lens, n_draft, layout)
    fb = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=torch.zeros(n_rows, dtype=torch.long),
        req_pool_indices=rows.to(torch.int64), seq_lens=torch.tensor(seq_lens), out_cache_loc=out_cache_loc,
        seq_lens_sum=sum(seq_lens), seq_lens_cpu=torch.tensor(seq_lens), spec_info=spec,
    )
    cached_k = [sc.k_cache[s].clone() for s in prefix_slots]
    cached_v = [sc.v_cache[s].clone() for s in prefix_slots]
    backend = sg.torch_backend.TorchSDPABackend(sc.runner)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, sc.layer, fb)

    keys, values, visible = [], [], []
    qo = 0
    for b in range(bs):
        p, parents = seq_lens[b], trees[b]
        kk = torch.cat([cached_k[b], k[qo : qo + len(parents)]])
        vv = torch.cat([cached_v[b], v[qo : qo + len(parents)]])
        for r in range(len(parents)):
            anc = ancestors_or_self(parents, r) if mask is not None else set(range(r + 1))
            keys.append(kk)
            values.append(vv)
            visible.append([True] * p + [c in anc for c in range(len(parents))])
        qo += len(parents)
    expected = reference_rows(q[:total].view(total, HQ, D), keys, values, visible)
    return out, expected, sc, SimpleNamespace(k=k, v=v, out_cache_loc=out_cache_loc, total=total)


@pytest.mark.parametrize("seed", range(8))
def test_target_verify_random_ragged_trees(sg, seed):
    gen = torch.Generator().manual_seed(1000 + seed)
    bs = int(torch.randint(1, 5, (1,), generator=gen))
    seq_lens = [int(x) for x in torch.randint(1, 20, (bs,), generator=gen)]
    trees = [random_parents(int(torch.randint(1, 9, (1,), generator=gen)), gen) for _ in range(bs)]
    pad = int(torch.randint(0, 3, (1,), generator=gen))
    out, expected, sc, x = run_verify_case(sg, gen, seq_lens, trees, ragged=True, pad_lanes=pad)
    total = x.total
    assert out.shape == (total + pad, HQ * D)
    torch.testing.assert_close(out[:total].double().view(total, HQ, D), expected, atol=ATOL, rtol=0)
    assert torch.all(out[total:] == 0), "pad lanes of a ragged bucket must get zero output"
    # write-first: every verify row's K/V is in the pool at its out_cache_loc slot
    torch.testing.assert_close(sc.k_cache[x.out_cache_loc[:total]], x.k[:total])
    torch.testing.assert_close(sc.v_cache[x.out_cache_loc[:total]], x.v[:total])


def test_target_verify_ragged_worked_example(sg):
    """The module docstring's batch after pruning request 1 to nodes {0, 1}: q_lens [3, 2]."""
    gen = torch.Generator().manual_seed(7)
    out, expected, _, x = run_verify_case(sg, gen, [3, 2], [[NO_PARENT, 0, 1], [NO_PARENT, 0]], ragged=True)
    assert x.total == 5
    torch.testing.assert_close(out.double().view(5, HQ, D), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mask_kind", ["full", "full_uint8", "qlen", "none"])
def test_target_verify_uniform_layouts(sg, mask_kind):
    gen = torch.Generator().manual_seed(11)
    n = 6
    trees = [list(range(-1, n - 1)), random_parents(n, gen), random_parents(n, gen)]  # a chain and two trees
    if mask_kind == "none":
        trees = [list(range(-1, n - 1))] * 3  # without a mask only chains are meaningful
    out, expected, _, x = run_verify_case(sg, gen, [5, 12, 1], trees, ragged=False, mask_kind=mask_kind)
    torch.testing.assert_close(out.double().view(x.total, HQ, D), expected, atol=ATOL, rtol=0)


def test_target_verify_tree_differs_from_causal(sg):
    """Guard for the reference: a branching tree must not give the causal (chain) answer."""
    gen = torch.Generator().manual_seed(3)
    trees = [[NO_PARENT, 0, 0, 1]]
    out, expected, _, x = run_verify_case(sg, gen, [4], trees, ragged=False)
    gen = torch.Generator().manual_seed(3)
    out_chain, _, _, _ = run_verify_case(sg, gen, [4], [[NO_PARENT, 0, 1, 2]], ragged=False)
    torch.testing.assert_close(out.double().view(4, HQ, D), expected, atol=ATOL, rtol=0)
    assert torch.allclose(out[:2], out_chain[:2], atol=ATOL)  # rows 0, 1 see the same keys
    assert not torch.allclose(out[2:], out_chain[2:], atol=1e-3)


def run_extend_case(sg, gen, prefix_lens, extend_lens, mode_name="EXTEND", save_kv_cache=True, logit_cap=0.0):
    sc = Scenario(sg, gen, logit_cap=logit_cap)
    bs = len(prefix_lens)
    rows = torch.randperm(MAX_REQS, generator=gen)[:bs]
    prefix_slots = [sc.fill_row(int(rows[b]), 0, prefix_lens[b]) for b in range(bs)]
    new_slots = [sc.fill_row(int(rows[b]), prefix_lens[b], extend_lens[b]) for b in range(bs)]
    total = sum(extend_lens)
    q = torch.randn(total, HQ * D, generator=gen)
    k = torch.randn(total, HKV, D, generator=gen)
    v = torch.randn(total, HKV, D, generator=gen)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    fb = sg.ForwardBatch(
        forward_mode=getattr(sg.ForwardMode, mode_name), batch_size=bs, input_ids=torch.zeros(total, dtype=torch.long),
        req_pool_indices=rows.to(torch.int64), seq_lens=torch.tensor(seq_lens), out_cache_loc=torch.cat(new_slots),
        seq_lens_sum=sum(seq_lens), seq_lens_cpu=torch.tensor(seq_lens),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32), extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32),
        extend_prefix_lens_cpu=list(prefix_lens), extend_seq_lens_cpu=list(extend_lens),
    )
    cached_k = [sc.k_cache[s].clone() for s in prefix_slots]
    cached_v = [sc.v_cache[s].clone() for s in prefix_slots]
    before = sc.k_cache.clone()
    backend = sg.torch_backend.TorchSDPABackend(sc.runner)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, sc.layer, fb, save_kv_cache=save_kv_cache)
    keys, values, visible = [], [], []
    qo = 0
    for b in range(bs):
        p, e = prefix_lens[b], extend_lens[b]
        kk = torch.cat([cached_k[b], k[qo : qo + e]])
        vv = torch.cat([cached_v[b], v[qo : qo + e]])
        for r in range(e):
            keys.append(kk)
            values.append(vv)
            visible.append([c <= p + r for c in range(p + e)])
        qo += e
    expected = reference_rows(q.view(total, HQ, D), keys, values, visible, logit_cap=logit_cap)
    return out, expected, sc, SimpleNamespace(before=before, new_slots=torch.cat(new_slots), k=k)


@pytest.mark.parametrize("seed", range(4))
def test_extend_random(sg, seed):
    gen = torch.Generator().manual_seed(2000 + seed)
    bs = int(torch.randint(1, 5, (1,), generator=gen))
    prefix = [int(x) for x in torch.randint(0, 15, (bs,), generator=gen)]
    ext = [int(x) for x in torch.randint(1, 12, (bs,), generator=gen)]
    out, expected, sc, x = run_extend_case(sg, gen, prefix, ext)
    torch.testing.assert_close(out.double().view(-1, HQ, D), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(sc.k_cache[x.new_slots], x.k)


def test_draft_extend_v2(sg):
    """DRAFT_EXTEND_V2: prefix = committed s, N rows per request, causal."""
    gen = torch.Generator().manual_seed(5)
    out, expected, _, _ = run_extend_case(sg, gen, [7, 3, 11], [4, 4, 4], mode_name="DRAFT_EXTEND_V2")
    torch.testing.assert_close(out.double().view(-1, HQ, D), expected, atol=ATOL, rtol=0)


def test_extend_without_saving_kv(sg):
    gen = torch.Generator().manual_seed(6)
    out, expected, sc, x = run_extend_case(sg, gen, [5, 0], [3, 4], save_kv_cache=False)
    torch.testing.assert_close(out.double().view(-1, HQ, D), expected, atol=ATOL, rtol=0)
    assert torch.equal(sc.k_cache, x.before), "save_kv_cache=False must leave the pool untouched"


def test_extend_logit_cap(sg):
    gen = torch.Generator().manual_seed(8)
    out, expected, _, _ = run_extend_case(sg, gen, [4, 2], [3, 5], logit_cap=0.5)
    torch.testing.assert_close(out.double().view(-1, HQ, D), expected, atol=ATOL, rtol=0)


def test_decode(sg):
    gen = torch.Generator().manual_seed(9)
    sc = Scenario(sg, gen)
    seq_lens = [1, 9, 30]
    rows = torch.tensor([3, 0, 6])
    slots = [sc.fill_row(int(r), 0, s) for r, s in zip(rows, seq_lens)]
    cached_k = [sc.k_cache[s[:-1]].clone() for s in slots]
    cached_v = [sc.v_cache[s[:-1]].clone() for s in slots]
    q = torch.randn(3, HQ * D, generator=gen)
    k = torch.randn(3, HKV, D, generator=gen)
    v = torch.randn(3, HKV, D, generator=gen)
    fb = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.DECODE, batch_size=3, input_ids=torch.zeros(3, dtype=torch.long),
        req_pool_indices=rows, seq_lens=torch.tensor(seq_lens), out_cache_loc=torch.stack([s[-1] for s in slots]),
        seq_lens_sum=sum(seq_lens), seq_lens_cpu=torch.tensor(seq_lens),
    )
    backend = sg.torch_backend.TorchSDPABackend(sc.runner)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, sc.layer, fb)
    keys = [torch.cat([cached_k[b], k[b : b + 1]]) for b in range(3)]
    values = [torch.cat([cached_v[b], v[b : b + 1]]) for b in range(3)]
    expected = reference_rows(q.view(3, HQ, D), keys, values, [[True] * s for s in seq_lens])
    torch.testing.assert_close(out.double().view(3, HQ, D), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(sc.k_cache[fb.out_cache_loc], k)


@pytest.mark.parametrize("topk,steps", [(1, 3), (1, 7), (2, 2), (2, 3), (3, 4)])
def test_multistep_draft_decode(sg, topk, steps):
    """Each draft step of the container: row (b, t) sees the committed prefix, branch t's own rows
    of the earlier steps (SGLang's upstream draft layout), and itself."""
    gen = torch.Generator().manual_seed(100 * topk + steps)
    sc = Scenario(sg, gen, is_draft=True)
    seq_lens = [4, 1, 13]
    bs = len(seq_lens)
    rows = torch.tensor([5, 2, 7])
    prefix_slots = [sc.fill_row(int(r), 0, s) for r, s in zip(rows, seq_lens)]
    # upstream assigns topk * steps draft slots right after s in req_to_token, branch-major
    draft_slots = [sc.fill_row(int(r), s, topk * steps) for r, s in zip(rows, seq_lens)]
    out_cache_loc = torch.cat(draft_slots)  # [bs * topk * steps], (b, t, step) order
    per_step = sg.per_step_draft_out_cache_loc(out_cache_loc, bs, topk, steps)
    cached_k = [sc.k_cache[s].clone() for s in prefix_slots]
    cached_v = [sc.v_cache[s].clone() for s in prefix_slots]

    container = sg.torch_backend.TorchSDPAMultiStepDraftBackend(sc.runner, topk, steps)
    assert len(container.attn_backends) == steps - 1
    fb = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(bs * topk, dtype=torch.long),
        req_pool_indices=rows, seq_lens=torch.tensor(seq_lens), out_cache_loc=out_cache_loc,
        seq_lens_sum=sum(seq_lens), seq_lens_cpu=torch.tensor(seq_lens),
    )
    container.init_forward_metadata(fb)
    history_k = {}  # (b, t) -> list of earlier rows' k
    history_v = {}
    for step, child in enumerate(container.attn_backends):
        fb.out_cache_loc = per_step[step]
        n = bs * topk
        q = torch.randn(n, HQ * D, generator=gen)
        k = torch.randn(n, HKV, D, generator=gen)
        v = torch.randn(n, HKV, D, generator=gen)
        out = child.forward(q, k, v, sc.layer, fb)
        keys, values = [], []
        for r in range(n):
            b, t = divmod(r, topk)
            hk = history_k.setdefault((b, t), [])
            hv = history_v.setdefault((b, t), [])
            hk.append(k[r : r + 1])
            hv.append(v[r : r + 1])
            keys.append(torch.cat([cached_k[b]] + hk))
            values.append(torch.cat([cached_v[b]] + hv))
        visible = [[True] * kk.shape[0] for kk in keys]
        expected = reference_rows(q.view(n, HQ, D), keys, values, visible)
        torch.testing.assert_close(out.double().view(n, HQ, D), expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(sc.k_cache[per_step[step]], k)


def test_idle_and_empty_batches(sg):
    gen = torch.Generator().manual_seed(1)
    sc = Scenario(sg, gen)
    fb = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.IDLE, batch_size=0, input_ids=torch.zeros(0, dtype=torch.long),
        req_pool_indices=torch.zeros(0, dtype=torch.int64), seq_lens=torch.zeros(0, dtype=torch.int64),
        out_cache_loc=torch.zeros(0, dtype=torch.int64), seq_lens_sum=0,
    )
    backend = sg.torch_backend.TorchSDPABackend(sc.runner)
    backend.init_forward_metadata(fb)
    assert backend.forward_metadata.num_groups == 0
    container = sg.torch_backend.TorchSDPAMultiStepDraftBackend(sc.runner, 2, 3)
    container.init_forward_metadata(fb)
    assert all(c.forward_metadata.num_groups == 0 for c in container.attn_backends)
    out = backend.forward(torch.zeros(0, HQ * D), torch.zeros(0, HKV, D), torch.zeros(0, HKV, D), sc.layer, fb)
    assert out.shape == (0, HQ * D)


def test_verify_mask_full_on_target_none_on_draft(sg):
    gen = torch.Generator().manual_seed(2)
    target = sg.torch_backend.TorchSDPABackend(Scenario(sg, gen).runner)
    draft = sg.torch_backend.TorchSDPABackend(Scenario(sg, gen, is_draft=True).runner)
    vm = target.verify_mask
    assert vm is not None and vm.mode == sg.TreeMaskMode.FULL_MASK
    assert not vm.fits(1), "max_bs 0: SGLang must allocate an exactly sized FULL mask each step"
    assert draft.verify_mask is None
    assert target.max_context_len == CTX
    assert target.get_cuda_graph_seq_len_fill_value() == 1
    target.update_verify_buffers_to_fill_after_draft(None, None)  # no-op, must not raise


def test_unsupported_layers_raise(sg):
    gen = torch.Generator().manual_seed(4)
    sc = Scenario(sg, gen)
    sw = sg.RadixAttention(num_heads=HQ, head_dim=D, scaling=SCALE, num_kv_heads=HKV, layer_id=0, sliding_window_size=4)
    fb = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.DECODE, batch_size=1, input_ids=torch.zeros(1, dtype=torch.long),
        req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([1]), out_cache_loc=torch.tensor([1]),
        seq_lens_sum=1, seq_lens_cpu=torch.tensor([1]),
    )
    backend = sg.torch_backend.TorchSDPABackend(sc.runner)
    backend.init_forward_metadata(fb)
    with pytest.raises(NotImplementedError, match="sliding"):
        backend.forward(torch.zeros(1, HQ * D), torch.zeros(1, HKV, D), torch.zeros(1, HKV, D), sw, fb)
    with pytest.raises(NotImplementedError, match="sinks"):
        backend.forward(torch.zeros(1, HQ * D), torch.zeros(1, HKV, D), torch.zeros(1, HKV, D), sc.layer, fb,
                        sinks=torch.zeros(HQ))

"""Kernel tier: the project's plain-torch ``sgl_kernel.*_cpu`` speculative ops
(``sglang_ext.engine.cpu.spec_ops``) against SGLang 0.5.23's Triton siblings run by the Triton
interpreter, on small random inputs (24 cases per op, outputs pre-filled with random values so
that cells an op must leave alone are checked too), plus call-site tests that run SGLang's own
``*_func`` dispatchers down their CPU branch into our ops (argument order and keywords exactly
as SGLang passes them) and a drift guard on the names SGLang imports from ``sgl_kernel``.

The Triton kernels are interpreted: ``TRITON_INTERPRET=1`` is set while the sibling modules are
imported (restored afterwards, so later tests and spawned engines are unaffected), and a kernel
that an earlier import in the same process already compiled for a GPU is re-wrapped as an
``InterpretedFunction``.

Import workaround: when nothing has installed the torchvision/sgl_kernel stand-ins (running this
file outside the project's ``tests/conftest.py``), a tiny local finder serves throw-away
``torchvision`` and ``sgl_kernel`` modules for the duration of the sibling imports only.

Budget: < 60 s on 2 cores (about 10 s of it importing SGLang).
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import types

import pytest
import torch

from sglang_ext.engine.cpu import spec_ops
from sglang_ext.engine.cpu.spec_ops import (
    CPU_OPS,
    NO_NODE,
    REJECTED_SLOT,
    SPECULATIVE_OPS,
    TREE_MASK_FULL,
    TREE_MASK_QLEN_ONLY,
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

NUM_CASES = 24
SEEDS = list(range(NUM_CASES))


# ----------------------------------------------------------------------------- importing the siblings
class _Anything:
    """Throw-away stand-in object: any attribute is another one; calling it fails."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: test-local import stub")


class _AnythingModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{self.__name__}.{attr}")


class _LocalStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchvision*`` (lazy placeholders) and ``sgl_kernel``/``sgl_kernel.speculative``
    (our ops only) while the Triton siblings are imported."""

    def __init__(self, toplevels):
        self.toplevels = set(toplevels)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.toplevels:
            return None
        if fullname.startswith("sgl_kernel") and fullname not in ("sgl_kernel", "sgl_kernel.speculative"):
            return None  # e.g. sgl_kernel.scalar_type: SGLang falls back when it is missing
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        if spec.name.startswith("torchvision"):
            return _AnythingModule(spec.name)
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        if module.__name__ == "torchvision":
            module.__version__ = "0.0.0"
        elif module.__name__ == "sgl_kernel":
            module.__dict__.update(CPU_OPS)
        elif module.__name__ == "sgl_kernel.speculative":
            module.__dict__.update(SPECULATIVE_OPS)


@contextlib.contextmanager
def _sibling_import_window():
    missing = [name for name in ("torchvision", "sgl_kernel") if importlib.util.find_spec(name) is None]
    finder = _LocalStubFinder(missing) if missing else None
    old_interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if old_interpret is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old_interpret
        if finder is not None:
            sys.meta_path.remove(finder)
            for name in list(sys.modules):
                if name.split(".")[0] in finder.toplevels:
                    del sys.modules[name]


with _sibling_import_window():
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    import sglang.kernels.ops.kvcache.cache_move as cache_move_mod
    import sglang.kernels.ops.speculative.cache_locs as cache_locs_mod
    import sglang.kernels.ops.speculative.eagle as eagle_mod
    import sglang.kernels.ops.speculative.multi_layer_eagle as mle_mod
    import sglang.kernels.ops.speculative.reconstruct_tree as reconstruct_mod
    import sglang.kernels.ops.speculative.spec_tree as spec_tree_mod
    import sglang.srt.mem_cache.allocation as allocation_mod


def _interpreted(kernel):
    """The kernel as an interpreted function (re-wrapped if it was compiled for a device)."""
    if isinstance(kernel, InterpretedFunction):
        return kernel
    return InterpretedFunction(kernel.fn)


def _pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _randint(gen, low, high, shape=(), dtype=torch.int64):
    return torch.randint(low, high, shape, generator=gen, dtype=dtype)


def _pick(gen, n: int) -> int:
    return int(torch.randint(0, n, (1,), generator=gen))


def _assert_same(ours: torch.Tensor, ref: torch.Tensor, what: str):
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != {ref.dtype}"
    assert torch.equal(ours, ref), f"{what} differs:\nours={ours}\nref ={ref}"


# ----------------------------------------------------------------------------- random inputs
def _slot_table_case(gen):
    """Random req->token table, requests and column ranges (page_size 1)."""
    max_reqs = 2 + _pick(gen, 6)
    pool_len = 8 + _pick(gen, 33)
    bs = 1 + _pick(gen, max_reqs)
    table = _randint(gen, 0, 5000, (max_reqs, pool_len), torch.int32)
    req_pool_indices = torch.randperm(max_reqs, generator=gen)[:bs]
    start = _randint(gen, 0, pool_len // 2 + 1, (bs,))
    lengths = torch.stack(
        [_randint(gen, 0, pool_len - int(s) + 1, ()) for s in start]
    )  # may be 0
    end = start + lengths
    if _pick(gen, 2):
        start, end = start.to(torch.int32), end.to(torch.int32)
    return table, req_pool_indices, start, end, int(lengths.sum())


def _eagle_tree(gen, bs, topk, depth, num_nodes, malformed):
    """(parent_list, selected_index) as organize_draft_results produces them: score indices
    0..topk-1 for step 0, topk + topk^2 (i-1) + [0, topk^2) for step i >= 1."""
    width_scores = topk + (depth - 1) * topk * topk
    scores = torch.rand(bs, topk, generator=gen)
    all_scores = [scores]
    parents = [torch.arange(-1, topk).expand(bs, -1)]
    for step in range(1, depth):
        expanded = scores.unsqueeze(2) * torch.rand(bs, topk, topk, generator=gen)
        top = expanded.flatten(1).topk(topk, dim=1)
        all_scores.append(expanded.flatten(1))
        parents.append(top.indices + topk * topk * (step - 1) + topk)
        scores = top.values
    if malformed:  # any distinct score indices and parent slots: missing parents, cycles
        selected = torch.stack(
            [torch.randperm(width_scores, generator=gen)[: num_nodes - 1] for _ in range(bs)]
        )
        parents = [torch.randint(0, width_scores, p.shape, generator=gen) for p in parents]
    else:
        selected = torch.cat(all_scores, dim=1).topk(num_nodes - 1, dim=1).indices
    selected = selected.sort(dim=1).values
    parent_list = torch.cat(parents[:-1], dim=1) if depth > 1 else torch.empty(bs, 0, dtype=torch.long)
    return parent_list.contiguous(), selected.contiguous()


def _random_parents(gen, n):
    """parent[0] = -1; parent[i] < i (chains favoured half of the time)."""
    chainy = _pick(gen, 2) == 0
    parent = [-1]
    for i in range(1, n):
        parent.append(i - 1 if chainy and _pick(gen, 4) else _pick(gen, i))
    return parent


def _links(gen, parent, shuffle):
    """First-child / next-sibling lists of a parent array (children ascending or shuffled)."""
    n = len(parent)
    next_token, next_sibling = [NO_NODE] * n, [NO_NODE] * n
    for p in range(n):
        kids = [i for i in range(1, n) if parent[i] == p]
        if shuffle and len(kids) > 1:
            kids = [kids[j] for j in torch.randperm(len(kids), generator=gen).tolist()]
        if kids:
            next_token[p] = kids[0]
            for a, b in zip(kids, kids[1:]):
                next_sibling[a] = b
    return next_token, next_sibling


def _ancestor_mask(parent):
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


# ----------------------------------------------------------------------------- per-op comparisons
@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool_matches_triton(seed):
    gen = torch.Generator().manual_seed(seed)
    table, rpi, start, end, total = _slot_table_case(gen)
    out_cache_loc = _randint(gen, 0, 10_000, (total + _pick(gen, 3),))
    ref, ours = table.clone(), table.clone()
    _interpreted(allocation_mod.assign_req_to_token_pool)[(rpi.numel(),)](
        rpi, ref, start, end, out_cache_loc, ref.shape[1], _pow2(rpi.numel())
    )
    assign_req_to_token_pool_cpu(rpi, ours, start, end, out_cache_loc, ours.shape[1])
    _assert_same(ours, ref, "req_to_token")
    if total:
        assert not torch.equal(ours, table), "case wrote nothing: generator too weak"


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_extend_cache_locs_matches_triton(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    table, rpi, start, end, total = _slot_table_case(gen)
    prefill = _randint(gen, -50, -1, (total + _pick(gen, 4),))
    ref, ours = prefill.clone(), prefill.clone()
    _interpreted(cache_locs_mod.assign_extend_cache_locs)[(rpi.numel(),)](
        rpi, table, start, end, ref, table.shape[1], _pow2(rpi.numel())
    )
    assign_extend_cache_locs_cpu(rpi, table, start, end, ours, table.shape[1])
    _assert_same(ours, ref, "out_cache_loc")


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_draft_cache_locs_contiguous_matches_triton(seed):
    gen = torch.Generator().manual_seed(200 + seed)
    topk, num_steps = 1 + _pick(gen, 4), 1 + _pick(gen, 5)
    width = topk * num_steps
    max_reqs, pool_len = 2 + _pick(gen, 5), width + 4 + _pick(gen, 20)
    bs = 1 + _pick(gen, max_reqs)
    table = _randint(gen, 0, 5000, (max_reqs, pool_len), torch.int32)
    rpi = torch.randperm(max_reqs, generator=gen)[:bs]
    seq_lens = _randint(gen, 0, pool_len - width + 1, (bs,))
    prefill = _randint(gen, -50, -1, (bs * width + _pick(gen, 3),))
    ref, ours = prefill.clone(), prefill.clone()
    _interpreted(cache_locs_mod.assign_draft_cache_locs_contiguous)[(bs,)](
        rpi, table, seq_lens, ref, pool_len, topk, num_steps
    )
    assign_draft_cache_locs_contiguous_cpu(rpi, table, seq_lens, ours, pool_len, topk, num_steps)
    _assert_same(ours, ref, "out_cache_loc")


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_bonus_tokens_matches_triton(seed):
    gen = torch.Generator().manual_seed(300 + seed)
    bs, stride = 1 + _pick(gen, 8), 1 + _pick(gen, 6)
    token_dtype = (torch.int32, torch.int64)[_pick(gen, 2)]
    accept_tokens = _randint(gen, 0, 1000, (bs, stride), token_dtype)
    accept_lens = _randint(gen, 1, stride + 1, (bs,), torch.int32)
    prefill = _randint(gen, -9, 0, (bs,), torch.int32)
    ref, ours = prefill.clone(), prefill.clone()
    _interpreted(eagle_mod.fill_bonus_tokens)[(bs,)](accept_tokens, accept_lens, ref, stride)
    fill_bonus_tokens_cpu(accept_tokens, accept_lens, ours, stride)
    _assert_same(ours, ref, "bonus_tokens")


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_accept_out_cache_loc_matches_triton(seed):
    gen = torch.Generator().manual_seed(400 + seed)
    bs, steps, n = 1 + _pick(gen, 6), 1 + _pick(gen, 5), 6 + _pick(gen, 6)
    accept_index = torch.full((bs, steps), REJECTED_SLOT, dtype=torch.int32)
    for b in range(bs):
        k = 1 + _pick(gen, steps)
        nodes = torch.randperm(n, generator=gen)[:k].sort().values + b * n
        accept_index[b, :k] = nodes.to(torch.int32)
    if seed % 4 == 3:  # rejected slots anywhere, not only at the tail
        accept_index[torch.rand(bs, steps, generator=gen) < 0.3] = REJECTED_SLOT
    if seed % 8 == 5:  # other negatives: counted as slots by the sibling, never read
        accept_index[torch.rand(bs, steps, generator=gen) < 0.3] = -2
    out_cache_loc = _randint(gen, 0, 10_000, (bs * n,))
    size = bs * steps
    prefill = _randint(gen, -50, -1, (size,))
    ref, ours = prefill.clone(), prefill.clone()
    _interpreted(eagle_mod.fill_accept_out_cache_loc)[(size,)](
        accept_index, out_cache_loc, ref, _pow2(size)
    )
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours)
    _assert_same(ours, ref, "accept_out_cache_loc")


@pytest.mark.parametrize("seed", SEEDS)
def test_copy_all_layer_kv_cache_matches_triton(seed):
    gen = torch.Generator().manual_seed(500 + seed)
    num_rows = 8 + _pick(gen, 24)
    dtypes = (torch.float32, torch.bfloat16, torch.int8, torch.float16)
    buffers = []
    for _ in range(1 + _pick(gen, 4)):
        shape = (num_rows, 1 + _pick(gen, 3), 1 + _pick(gen, 8))
        buffers.append((torch.randn(shape, generator=gen) * 50).to(dtypes[_pick(gen, 4)]))
    num_locs = 1 + _pick(gen, min(8, num_rows))
    tgt = torch.randperm(num_rows, generator=gen)[:num_locs]  # distinct targets
    src = _randint(gen, 0, num_rows, (num_locs,))  # may overlap targets
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    tile = 16
    byte_tiles = -(-int(strides.max()) // tile)

    ref = [b.clone() for b in buffers]
    ref_ptrs = torch.tensor([b.data_ptr() for b in ref], dtype=torch.uint64)
    _interpreted(cache_move_mod.copy_all_layer_kv_cache_tiled)[(len(ref), byte_tiles)](
        ref_ptrs, strides, tgt, src, num_locs, _pow2(num_locs), BYTES_PER_TILE=tile
    )
    ours = [b.clone() for b in buffers]
    ours_ptrs = torch.tensor([b.data_ptr() for b in ours], dtype=torch.uint64)
    copy_all_layer_kv_cache_cpu(ours_ptrs, strides, tgt, src)
    for i, (o, r) in enumerate(zip(ours, ref)):
        _assert_same(o.view(torch.uint8), r.view(torch.uint8), f"buffer {i}")


def _tree_case(gen, seed):
    bs = 1 + _pick(gen, 3)
    topk = 1 + _pick(gen, 3)
    depth = 1 + _pick(gen, 4)
    max_nodes = topk + (depth - 1) * topk * topk + 1
    num_nodes = 2 + _pick(gen, min(max_nodes, 12) - 1)
    malformed = seed % 5 == 4
    parent_list, selected = _eagle_tree(gen, bs, topk, depth, num_nodes, malformed)
    seq_lens = _randint(gen, 0, 7, (bs,))
    mode = (TREE_MASK_FULL, TREE_MASK_QLEN_ONLY)[seed % 2]
    return bs, topk, depth, num_nodes, parent_list, selected, seq_lens, mode


def _tree_buffers(gen, bs, n, seq_lens, mode, random_prefill):
    if mode == TREE_MASK_FULL:
        mask_len = int(seq_lens.sum()) * n + n * n * bs
    else:
        mask_len = n * n * bs
    tree_mask = torch.rand(mask_len + 3, generator=gen) < 0.5
    positions = _randint(gen, -9, 0, (bs * n,))
    if random_prefill:
        retrieve = _randint(gen, -3, n, (3, bs, n))
    else:  # what build_tree_kernel_efficient allocates
        retrieve = torch.full((3, bs, n), NO_NODE, dtype=torch.long)
    return tree_mask, positions, retrieve


@pytest.mark.parametrize("seed", SEEDS)
def test_build_tree_kernel_efficient_matches_triton(seed):
    gen = torch.Generator().manual_seed(600 + seed)
    bs, topk, depth, n, parent_list, selected, seq_lens, mode = _tree_case(gen, seed)
    mask, positions, retrieve = _tree_buffers(gen, bs, n, seq_lens, mode, seed % 3 == 2)
    ref = [mask.clone(), positions.clone(), retrieve.clone()]
    ours = [mask.clone(), positions.clone(), retrieve.clone()]
    spec_tree_mod.sgl_build_tree_kernel_triton(
        parent_list, selected, seq_lens, ref[0], ref[1], *ref[2],
        topk, depth, n, spec_tree_mod.TreeMaskMode(mode),
    )
    build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, ours[0], ours[1], *ours[2], topk, depth, n, mode
    )
    for what, o, r in zip(("tree_mask", "positions", "retrieve"), ours, ref):
        _assert_same(o, r, what)


def test_build_tree_rejects_bitpacked_mask():
    with pytest.raises(NotImplementedError):
        build_tree_kernel_efficient_cpu(
            torch.tensor([[-1, 0]]), torch.tensor([[0, 1]]), torch.tensor([3]),
            torch.zeros(3, dtype=torch.uint8), torch.empty(3, dtype=torch.long),
            *torch.full((3, 1, 3), NO_NODE), 1, 2, 3, 2,
        )


def _verify_case(gen, seed):
    bs = 1 + _pick(gen, 4)
    n = 1 + _pick(gen, 10)
    vocab = 2 + _pick(gen, 3)  # tiny vocab: many matches, duplicate sibling tokens
    next_token = torch.empty(bs, n, dtype=torch.long)
    next_sibling = torch.empty(bs, n, dtype=torch.long)
    max_depth = 0
    for b in range(bs):
        parent = _random_parents(gen, n)
        nt, ns = _links(gen, parent, shuffle=seed % 3 == 0)
        next_token[b], next_sibling[b] = torch.tensor(nt), torch.tensor(ns)
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[parent[i]] + 1
        max_depth = max(max_depth, max(depth))
    retrieve_index = (torch.arange(bs).unsqueeze(1) * n + torch.arange(n)).contiguous()
    candidates = _randint(gen, 0, vocab, (bs, n))
    target_predict = _randint(gen, 0, vocab, (bs, n))
    num_spec_step = 1 + _pick(gen, max_depth + 2)
    return retrieve_index, next_token, next_sibling, candidates, target_predict, num_spec_step


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_tree_greedy_matches_triton(seed):
    gen = torch.Generator().manual_seed(700 + seed)
    ri, nt, ns, cand, target, steps = _verify_case(gen, seed)
    bs, n = cand.shape
    predicts = _randint(gen, -9, 0, (bs * n,), torch.int32)
    accept_index = torch.full((bs, steps), REJECTED_SLOT, dtype=torch.int32)
    accept_num = _randint(gen, -9, 0, (bs,), torch.int32)
    ref = [predicts.clone(), accept_index.clone(), accept_num.clone()]
    ours = [predicts.clone(), accept_index.clone(), accept_num.clone()]
    spec_tree_mod.verify_tree_greedy_triton(
        predicts=ref[0], accept_index=ref[1], accept_token_num=ref[2], candidates=cand,
        retrieve_index=ri, retrieve_next_token=nt, retrieve_next_sibling=ns,
        target_predict=target,
    )
    verify_tree_greedy_cpu(
        predicts=ours[0], accept_index=ours[1], accept_token_num=ours[2], candidates=cand,
        retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
        target_predict=target,
    )
    for what, o, r in zip(("predicts", "accept_index", "accept_token_num"), ours, ref):
        _assert_same(o, r, what)


@pytest.mark.parametrize("seed", SEEDS)
def test_reconstruct_indices_from_tree_mask_matches_triton(seed):
    gen = torch.Generator().manual_seed(800 + seed)
    bs, n = 1 + _pick(gen, 4), 1 + _pick(gen, 12)
    if seed % 4 == 3:  # arbitrary masks: the contract is defined for any bool matrix
        masks = torch.rand(bs, n, n, generator=gen) < 0.4
    else:
        masks = torch.stack([_ancestor_mask(_random_parents(gen, n)) for _ in range(bs)])
    tree_mask = masks.reshape(-1).contiguous()
    seq_lens = _randint(gen, 0, 50, (bs,))
    prefill = [_randint(gen, -9, 0, (bs * n,))] + [_randint(gen, -9, 0, (bs, n)) for _ in range(3)]
    ref = [t.clone() for t in prefill]
    ours = [t.clone() for t in prefill]
    reconstruct_mod.reconstruct_indices_from_tree_mask_triton(tree_mask, seq_lens, *ref, bs, n)
    reconstruct_indices_from_tree_mask(tree_mask, seq_lens, *ours, bs, n)
    for what, o, r in zip(("positions", "retrieve_index", "next_token", "next_sibling"), ours, ref):
        _assert_same(o, r, what)


@pytest.mark.parametrize("seed", SEEDS)
def test_rotate_input_ids_matches_triton(seed):
    gen = torch.Generator().manual_seed(900 + seed)
    bs = 1 + _pick(gen, 4)
    lengths = _randint(gen, 0, 7, (bs,))
    start = torch.cumsum(lengths, 0) - lengths + _randint(gen, 0, 2, (bs,)).cumsum(0)  # gaps
    total = int((start + lengths).max()) + 2
    ids = _randint(gen, 0, 1000, (total,))
    topk_index = _randint(gen, 1000, 2000, (bs, 1) if seed % 2 else (bs,))
    select_index = None
    if seed % 3 == 0:
        select_index = start + (torch.rand(bs, generator=gen) * lengths).long()
    ref, ours = ids.clone(), ids.clone()
    _interpreted(mle_mod.rotate_input_ids_kernel)[(bs,)](
        ref, start, lengths, topk_index, select_index,
        BLOCK_SIZE=4096 if select_index is not None else 8,
    )
    rotate_input_ids_cpu(ours, start, lengths, topk_index, select_index)
    _assert_same(ours, ref, "input_ids")


# ----------------------------------------------------------------------------- SGLang call sites
@pytest.fixture
def cpu_dispatch(monkeypatch):
    """Send SGLang's ``*_func`` dispatchers down their CPU branch into our ops."""
    for mod in (cache_move_mod, cache_locs_mod, eagle_mod, mle_mod, spec_tree_mod, allocation_mod):
        monkeypatch.setattr(mod, "_is_cpu", True)
    for mod in (cache_locs_mod, spec_tree_mod):
        for flag in ("_is_cuda", "_is_hip", "_is_musa", "_is_npu", "_is_xpu"):
            if hasattr(mod, flag):
                monkeypatch.setattr(mod, flag, False)
    monkeypatch.setattr(cache_locs_mod, "_get_oot_speculative_cache_locs_fn", lambda: None)
    for mod in (cache_move_mod, cache_locs_mod, eagle_mod, mle_mod, allocation_mod):
        for name in _sgl_kernel_imports(mod):
            monkeypatch.setattr(mod, name, CPU_OPS[name], raising=False)
    monkeypatch.setattr(
        spec_tree_mod, "sgl_build_tree_kernel_efficient_cpu", build_tree_kernel_efficient_cpu,
        raising=False,
    )
    monkeypatch.setattr(spec_tree_mod, "sgl_verify_tree_greedy_cpu", verify_tree_greedy_cpu, raising=False)
    monkeypatch.setattr(reconstruct_mod, "_is_xpu", False)
    monkeypatch.setattr(
        reconstruct_mod, "reconstruct_indices_from_tree_mask", reconstruct_indices_from_tree_mask
    )


def _sgl_kernel_imports(module) -> set:
    """``*_cpu`` names a module imports from ``sgl_kernel`` (read from its source)."""
    with open(module.__file__) as f:
        source = f.read()
    names = set()
    for block in re.findall(r"from sgl_kernel(?:\.speculative)? import\s*(\([^)]*\)|[^\n]*)", source):
        for item in block.strip("()").split(","):
            words = item.split()
            if words and words[0].endswith("_cpu"):
                names.add(words[0])  # the imported name, not its "as" alias
    return names


_SIBLING_MODULES = (cache_move_mod, cache_locs_mod, eagle_mod, mle_mod, spec_tree_mod, allocation_mod)
_NAMES_IMPORTED = {m.__name__: _sgl_kernel_imports(m) for m in _SIBLING_MODULES}


def test_every_cpu_op_sglang_imports_on_the_spec_path_is_provided():
    imported = set().union(*_NAMES_IMPORTED.values())
    expected = {
        "assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu",
        "copy_all_layer_kv_cache_cpu", "assign_draft_cache_locs_contiguous_cpu",
        "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
        "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu", "rotate_input_ids_cpu",
    }
    assert imported == expected, f"SGLang's sgl_kernel imports changed: {sorted(imported ^ expected)}"
    assert expected <= set(CPU_OPS)
    assert all(name.endswith("_cpu") for name in CPU_OPS)
    assert "reconstruct_indices_from_tree_mask" in SPECULATIVE_OPS
    assert "from sgl_kernel.speculative import reconstruct_indices_from_tree_mask" in open(
        reconstruct_mod.__file__
    ).read()


@pytest.mark.parametrize("seed", range(4))
def test_cache_loc_call_sites(cpu_dispatch, seed):
    gen = torch.Generator().manual_seed(1000 + seed)
    table, rpi, start, _, _ = _slot_table_case(gen)
    bs, pool_len = rpi.numel(), table.shape[1]
    n = 1 + _pick(gen, 4)
    start = start.clamp(max=pool_len - n).to(torch.int64)
    # Verify window: assign_extend_cache_locs_uniform_func -> assign_extend_cache_locs_cpu.
    got = cache_locs_mod.assign_extend_cache_locs_uniform_func(
        req_pool_indices=rpi, req_to_token=table, start_offset=start, batch_size=bs,
        draft_token_num=n, device="cpu",
    )
    ref = torch.empty(bs * n, dtype=torch.int64)
    _interpreted(cache_locs_mod.assign_extend_cache_locs)[(bs,)](
        rpi, table, start, start + n, ref, pool_len, _pow2(bs)
    )
    _assert_same(got, ref, "verify out_cache_loc")
    # Draft slots: assign_draft_cache_locs_contiguous_func.
    got = torch.empty(bs * n, dtype=torch.int64)
    cache_locs_mod.assign_draft_cache_locs_contiguous_func(rpi, table, start, got, 1, n)
    _assert_same(got, ref, "draft out_cache_loc")
    # Front of each verify window: fill_front_out_cache_loc_func.
    num_front = _randint(gen, 1, n + 1, (bs,))
    got = torch.zeros(bs * n, dtype=torch.int64)
    cache_locs_mod.fill_front_out_cache_loc_func(num_front, ref, got)
    expect = torch.zeros(bs * n, dtype=torch.int64)
    expect[: int(num_front.sum())] = torch.cat([ref.view(bs, n)[b, : int(k)] for b, k in enumerate(num_front)])
    _assert_same(got, expect, "front out_cache_loc")
    # Slot allocation: assign_req_to_token_pool_func.
    new_locs = _randint(gen, 0, 9999, (bs * n,))
    ours, theirs = table.clone(), table.clone()
    allocation_mod.assign_req_to_token_pool_func(rpi, ours, start, start + n, new_locs, bs)
    _interpreted(allocation_mod.assign_req_to_token_pool)[(bs,)](
        rpi, theirs, start, start + n, new_locs, pool_len, _pow2(bs)
    )
    _assert_same(ours, theirs, "req_to_token")


@pytest.mark.parametrize("seed", range(4))
def test_tree_call_sites(cpu_dispatch, seed):
    gen = torch.Generator().manual_seed(1100 + seed)
    bs, topk, depth, n, parent_list, selected, seq_lens, mode = _tree_case(gen, 2 * seed)
    mask, positions, retrieve = _tree_buffers(gen, bs, n, seq_lens, mode, False)
    ours = [mask.clone(), positions.clone(), retrieve.clone()]
    ref = [mask.clone(), positions.clone(), retrieve.clone()]
    spec_tree_mod.build_tree_kernel_efficient_func(
        parent_list, selected, seq_lens, ours[0], ours[1], *ours[2], topk, depth, n,
        spec_tree_mod.TreeMaskMode(mode),
    )
    spec_tree_mod.sgl_build_tree_kernel_triton(
        parent_list, selected, seq_lens, ref[0], ref[1], *ref[2], topk, depth, n,
        spec_tree_mod.TreeMaskMode(mode),
    )
    for what, o, r in zip(("tree_mask", "positions", "retrieve"), ours, ref):
        _assert_same(o, r, what)
    # Greedy verify of that tree, through verify_tree_greedy_func (keyword call site).
    ri, nt, ns = ours[2]
    cand = _randint(gen, 0, 3, (bs, n))
    target = _randint(gen, 0, 3, (bs, n))
    outs = []
    for fn in (spec_tree_mod.verify_tree_greedy_func, spec_tree_mod.verify_tree_greedy_triton):
        buffers = dict(
            predicts=torch.zeros(bs * n, dtype=torch.int32),
            accept_index=torch.full((bs, depth + 1), REJECTED_SLOT, dtype=torch.int32),
            accept_token_num=torch.empty(bs, dtype=torch.int32),
        )
        fn(**buffers, candidates=cand, retrieve_index=ri, retrieve_next_token=nt,
           retrieve_next_sibling=ns, target_predict=target)
        outs.append(buffers)
    for key in outs[0]:
        _assert_same(outs[0][key], outs[1][key], key)
    # KV compaction of the accepted path: fill_accept_out_cache_loc_func + move_kv_cache copy.
    accept_index = outs[0]["accept_index"]
    out_cache_loc = _randint(gen, 0, 64, (bs * n,))
    size = accept_index.numel()
    got, expect = torch.zeros(size, dtype=torch.int64), torch.zeros(size, dtype=torch.int64)
    eagle_mod.fill_accept_out_cache_loc_func(accept_index, out_cache_loc, got, size)
    _interpreted(eagle_mod.fill_accept_out_cache_loc)[(size,)](
        accept_index, out_cache_loc, expect, _pow2(size)
    )
    _assert_same(got, expect, "accept_out_cache_loc")
    accept_tokens = outs[0]["predicts"][accept_index.clamp(min=0).long()]
    accept_lens = outs[0]["accept_token_num"] + 1
    got, expect = torch.empty(bs, dtype=torch.int32), torch.empty(bs, dtype=torch.int32)
    eagle_mod.fill_bonus_tokens_func(accept_tokens, accept_lens, got, accept_index.shape[1], bs)
    _interpreted(eagle_mod.fill_bonus_tokens)[(bs,)](accept_tokens, accept_lens, expect, accept_index.shape[1])
    _assert_same(got, expect, "bonus_tokens")


def test_kv_move_reconstruct_and_rotate_call_sites(cpu_dispatch):
    gen = torch.Generator().manual_seed(1200)
    # copy_all_layer_kv_cache_func slices the locations to num_locs before calling the op.
    k = [torch.randn(16, 2, 4, generator=gen) for _ in range(3)]
    before = [t.clone() for t in k]
    ptrs = torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in k])
    tgt = torch.tensor([1, 2, 3, 0, 0, 0, 0, 0])
    src = torch.tensor([9, 8, 7, 0, 0, 0, 0, 0])
    cache_move_mod.copy_all_layer_kv_cache_func(ptrs, strides, tgt, src, 3, 4, {})
    for t, b in zip(k, before):
        b[tgt[:3]] = b[src[:3]]
        _assert_same(t, b, "kv buffer")
    # NGRAM metadata.
    masks = torch.stack([_ancestor_mask(_random_parents(gen, 5)) for _ in range(2)]).reshape(-1)
    seq_lens = torch.tensor([3, 9])
    ours = [torch.empty(10, dtype=torch.long)] + [torch.empty(2, 5, dtype=torch.long) for _ in range(3)]
    ref = [t.clone() for t in ours]
    reconstruct_mod.reconstruct_indices_from_tree_mask_func(masks, seq_lens, *ours, 2, 5)
    reconstruct_mod.reconstruct_indices_from_tree_mask_triton(masks, seq_lens, *ref, 2, 5)
    for o, r in zip(ours, ref):
        _assert_same(o, r, "ngram metadata")
    # rotate_input_ids (multi-layer EAGLE).
    ids = torch.arange(10)
    ref_ids = ids.clone()
    args = (torch.tensor([0, 4]), torch.tensor([4, 3]), torch.tensor([100, 200]))
    assert mle_mod.rotate_input_ids(ids, *args) is ids
    _interpreted(mle_mod.rotate_input_ids_kernel)[(2,)](ref_ids, *args, None, BLOCK_SIZE=8)
    _assert_same(ids, ref_ids, "input_ids")


# ----------------------------------------------------------------------------- documentation
def test_docstring_examples():
    result = doctest.testmod(spec_ops, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 9 and result.failed == 0


def test_empty_batch_is_a_no_op():
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    empty = torch.empty(0, dtype=torch.int64)
    assign_req_to_token_pool_cpu(empty, table, empty, empty, empty, 4)
    out = torch.full((2,), -1)
    assign_extend_cache_locs_cpu(empty, table, empty, empty, out, 4)
    fill_accept_out_cache_loc_cpu(torch.empty(0, 3, dtype=torch.int32), empty, out)
    assert table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and out.tolist() == [-1, -1]

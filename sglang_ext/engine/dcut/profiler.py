"""Launch-time D-Cut cost profiling inside the scheduler, the JSON cache, and publication.

:func:`obtain_cost_table` is called by :meth:`DCutRunner.init_after_graphs` at the end of the
worker's ``init_cuda_graphs`` (target and draft graphs are ready). In order:

1. ``--dcut-cost-table PATH``: load that file, no profiling (a key that differs from this
   server is reported as a warning; tiers must equal ``--dcut-tiers``);
2. the cache ``<cache dir>/dcut-<hash of the key>.json`` when it exists (a corrupt file gives a
   warning and the fixed fallback ratio 0.75, never a crash);
3. otherwise profile, then write the cache atomically.

The key (``sglang_ext.dcut.CostTableKey``): target and draft model, device name, TP size,
dtype, draft tokens, topk, steps, attention backend, profiling context length, and the
SGLang / sglang_ext versions. The cache directory is ``--dcut-cache-dir`` or
``$XDG_CACHE_HOME/sglang_ext/dcut`` (``~/.cache/sglang_ext/dcut``).

What is timed (docs/algorithms.md#d-cut-cost-profiling): a *full speculative decode step* of the real worker
(``draft`` + pruned ``verify`` at a fixed tier + draft extend), for every profiled batch size
and tier, with ``--dcut-profile-warmup`` warm-up steps per tier, then ``--dcut-profile-steps``
timed steps per tier taken round-robin over the tiers (the order reversed every other round), so
the drift of a shared host hits every tier alike; the cost is the median of a tier's timed steps.
The batch is made of synthetic requests (random token ids, ``context_len`` tokens each) built
as SGLang's own ``sglang.benchmark.one_batch`` builds them: ``Req`` objects, a
``ScheduleBatch`` over the server's pools with an allocation-only tree cache, one prefill
through the worker, then decode steps. Lengths are not advanced between the timed steps, so
every step drafts and verifies the same window (steady shapes, no KV growth). All KV slots and
request rows are returned at the end; the allocator's free size is checked.

Every TP rank profiles; the table is the element-wise max over ranks, then rank 0's table is
broadcast (a cache or file is read by rank 0 and broadcast too), so all ranks hold the same
table. The table is attached to the target ``model_runner.model_config`` and its
``hf_config`` as ``dcut_cost_table`` (the JSON dict, or None for the fallback) and
``dcut_cost_table_info``, which the ``get_init_info`` hook shows in ``/server_info``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from array import array
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from sglang_ext.dcut import CostTable, CostTableError, CostTableKey

logger = logging.getLogger(__name__)

__all__ = [
    "obtain_cost_table",
    "publish_cost_table",
    "cost_table_key",
    "cache_path",
    "default_cache_dir",
    "profile_batch_sizes",
    "profile_context_len",
    "CPU_PROFILE_BATCH_SIZES",
    "GPU_PROFILE_CONTEXT_LEN",
    "CPU_PROFILE_CONTEXT_LEN",
    "MODEL_CONFIG_ATTR",
    "MODEL_CONFIG_INFO_ATTR",
]

CPU_PROFILE_BATCH_SIZES = (1, 4, 8, 16, 32, 64)
GPU_PROFILE_CONTEXT_LEN = 2048
CPU_PROFILE_CONTEXT_LEN = 64
MODEL_CONFIG_ATTR = "dcut_cost_table"
MODEL_CONFIG_INFO_ATTR = "dcut_cost_table_info"
_KV_HEADROOM = 0.9  # share of the free KV pool the profiling batch may take


# ----------------------------------------------------------------------------- key and cache
def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/sglang_ext/dcut`` (``~/.cache/sglang_ext/dcut`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang_ext", "dcut")


def cache_path(key: CostTableKey, cache_dir: Optional[str] = None) -> str:
    """Cache file of a key: ``<dir>/dcut-<sha256(key)[:16]>.json``.

    Examples
    --------
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> os.path.basename(cache_path(k, "/x"))
    'dcut-70dc43d9f09565ee.json'
    """
    digest = hashlib.sha256(json.dumps(key.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir or default_cache_dir(), f"dcut-{digest}.json")


def _device_name(device: Any) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    import platform

    return f"{dev.type}:{platform.machine()}:{os.cpu_count()}cpus"


def cost_table_key(worker: Any, context_len: int) -> CostTableKey:
    """The cache key of this server (see the module docstring)."""
    import importlib.metadata

    from sglang.srt.runtime_context import get_parallel

    sa = worker.server_args
    runner = worker.target_worker.model_runner
    backend = getattr(runner, "attention_backend_str", None) or getattr(sa, "attention_backend", None) or "auto"
    try:
        ext_version = importlib.metadata.version("sglang_ext")
    except importlib.metadata.PackageNotFoundError:
        from sglang_ext.version import __version__ as ext_version
    return CostTableKey(
        model=str(sa.model_path),
        draft=str(sa.speculative_draft_model_path),
        device=_device_name(runner.device),
        tp=int(get_parallel().tp_size),
        dtype=str(runner.model_config.dtype).replace("torch.", ""),
        draft_tokens=int(worker.speculative_num_draft_tokens),
        topk=int(worker.topk),
        num_steps=int(worker.speculative_num_steps),
        attention_backend=str(backend),
        context_len=int(context_len),
        sglang_version=importlib.metadata.version("sglang"),
        sglang_ext_version=str(ext_version),
    )


# ----------------------------------------------------------------------------- profiling plan
def _is_cpu_device(worker: Any) -> bool:
    return torch.device(worker.target_worker.model_runner.device).type == "cpu"


def profile_batch_sizes(cfg: Any, worker: Any) -> Tuple[int, ...]:
    """Batch sizes to profile: ``--dcut-profile-batch-sizes``, else (GPU) the decode graph
    capture sizes up to the max running requests plus that maximum, (CPU) 1, 4, 8, 16, 32, 64
    capped at the maximum, plus the maximum.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> profile_batch_sizes(NS(profile_batch_sizes=(2, 5)), None)
    (2, 5)
    """
    if cfg.profile_batch_sizes:
        return tuple(int(b) for b in cfg.profile_batch_sizes)
    max_bs = int(worker.target_worker.model_runner.req_to_token_pool.size)
    try:
        from sglang.srt.runtime_context import get_schedule

        mrr = get_schedule().max_running_requests
        if mrr:
            max_bs = min(max_bs, int(mrr))
    except Exception:
        pass
    if _is_cpu_device(worker):
        base = [b for b in CPU_PROFILE_BATCH_SIZES if b < max_bs]
    else:
        from sglang.srt.runtime_context import get_exec

        base = [int(b) for b in (get_exec().graph.cuda_graph_bs_decode or []) if int(b) < max_bs]
    return tuple(sorted(set(base + [max_bs])))


def profile_context_len(cfg: Any, worker: Any, max_bs: int) -> int:
    """Context length of the profiling requests: ``--dcut-profile-context-len``, else
    ``min(2048, context_len)`` on GPU and 64 on CPU, capped so that ``max_bs`` requests
    (context + decode reserve) fit in 90 % of the free KV pool."""
    runner = worker.target_worker.model_runner
    model_ctx = int(runner.model_config.context_len)
    n = int(worker.speculative_num_draft_tokens)
    reserve = 2 * max(int(worker.speculative_num_steps) * int(worker.topk), n) + n + 2
    if cfg.profile_context_len is not None:
        want = int(cfg.profile_context_len)
    else:
        want = CPU_PROFILE_CONTEXT_LEN if _is_cpu_device(worker) else GPU_PROFILE_CONTEXT_LEN
    want = min(want, model_ctx - reserve)
    free = int(runner.token_to_kv_pool_allocator.available_size())
    fit = int(free * _KV_HEADROOM) // max(1, max_bs) - reserve
    return max(1, min(want, fit))


# ----------------------------------------------------------------------------- profiling run
class _TreeCacheStub:
    """Allocation-only tree cache (as in ``sglang.benchmark.one_batch``): no prefix sharing."""

    def __init__(self, page_size: int, device: Any, allocator: Any, req_to_token_pool: Any):
        self.page_size = page_size
        self.device = device
        self.token_to_kv_pool_allocator = allocator
        self.req_to_token_pool = req_to_token_pool

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def evict(self, params: Any) -> None:
        pass

    def maybe_hand_to_session(self, req: Any) -> None:
        pass

    def is_chunk_cache(self) -> bool:
        return True


def _synthetic_reqs(bs: int, context_len: int, vocab_size: int, seed: int) -> List[Any]:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, max(2, vocab_size - 1), (bs, context_len), generator=gen)
    reqs = []
    for i in range(bs):
        sp = SamplingParams(temperature=0, max_new_tokens=1 << 20, ignore_eos=True)
        req = Req(rid=f"dcut-profile-{seed}-{i}", origin_input_text="",
                  origin_input_ids=array("q", ids[i].tolist()), sampling_params=sp)
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = len(req.origin_input_ids)
        reqs.append(req)
    return reqs


def _robust_cost(times_ms: Sequence[float]) -> float:
    """Median of the timed steps (the mean of the two middle ones for an even count): stalls of a
    shared host must not pick the tier.

    Examples
    --------
    >>> _robust_cost([10.0, 12.0, 500.0]), _robust_cost([10.0, 12.0]), _robust_cost([9.0, 30.0, 11.0, 10.0])
    (12.0, 11.0, 10.5)
    """
    t = sorted(times_ms)
    mid = len(t) // 2
    return t[mid] if len(t) % 2 else (t[mid - 1] + t[mid]) / 2


def interleaved_order(num_tiers: int, steps: int) -> List[int]:
    """Tier indices of the timed steps: round-robin, the order reversed every other round.

    Examples
    --------
    >>> interleaved_order(3, 3)
    [0, 1, 2, 2, 1, 0, 0, 1, 2]
    """
    order: List[int] = []
    for i in range(steps):
        r = list(range(num_tiers))
        order += r if i % 2 == 0 else r[::-1]
    return order


def _sync(device: Any) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _release(reqs: Sequence[Any], req_to_token_pool: Any, allocator: Any) -> None:
    """Return every KV slot and request row the synthetic requests hold."""
    for req in reqs:
        kv = getattr(req, "kv", None)
        idx = getattr(kv, "req_pool_idx", None) if kv is not None else None
        if idx is None:
            idx = getattr(req, "req_pool_idx", None)
        if idx is None:
            continue
        n = int(getattr(kv, "kv_allocated_len", 0) or 0)
        if n > 0:
            slots = req_to_token_pool.req_to_token[idx, :n].to(torch.int64)
            allocator.free(slots[slots > 0])
        req_to_token_pool.free(req)
        if kv is not None and hasattr(kv, "mark_kv_released"):
            try:
                kv.mark_kv_released()
            except Exception:
                pass


def _profile_one_batch_size(worker: Any, runner: Any, bs: int, context_len: int, tiers: Sequence[float],
                            warmup: int, steps: int, seed: int) -> List[float]:
    """Mean full-step ms for every tier at batch size ``bs``."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    target = worker.target_worker.model_runner
    r2t = target.req_to_token_pool
    allocator = target.token_to_kv_pool_allocator
    tree_cache = _TreeCacheStub(allocator.page_size, target.device, allocator, r2t)
    reqs = _synthetic_reqs(bs, context_len, int(target.model_config.vocab_size), seed)
    batch = ScheduleBatch.init_new(
        reqs=reqs,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=allocator,
        tree_cache=tree_cache,
        model_config=target.model_config,
        enable_overlap=False,
        spec_algorithm=target.spec_algorithm,
    )
    costs: List[float] = []
    try:
        batch.prepare_for_extend()
        if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
            batch.prefill_input_ids_cpu = None
        res = worker.forward_batch_generation(batch)
        batch.spec_info = res.next_draft_input

        def step(ratio: float) -> float:
            runner.forced_ratio = float(ratio)
            batch.prepare_for_decode()
            _sync(target.device)
            t0 = time.perf_counter()
            res = worker.forward_batch_generation(batch)
            _sync(target.device)
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            batch.spec_info = res.next_draft_input
            batch.input_ids = None
            return elapsed_ms

        for ratio in tiers:
            for _ in range(warmup):
                step(ratio)
        times: List[List[float]] = [[] for _ in tiers]
        for q in interleaved_order(len(tiers), steps):
            times[q].append(step(tiers[q]))
        costs = [_robust_cost(t) for t in times]
    finally:
        runner.forced_ratio = None
        _release(reqs, r2t, allocator)
    return costs


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="cfg", leave=True)
    except ImportError:  # pragma: no cover - tqdm ships with sglang
        return None


def profile_cost_table(runner: Any, worker: Any, key: CostTableKey,
                       batch_sizes: Sequence[int]) -> CostTable:
    """Time full speculative steps for every (batch size, tier) on this rank (see the module docstring)."""
    cfg = runner.cfg
    tiers = tuple(runner.tiers)
    allocator = worker.target_worker.model_runner.token_to_kv_pool_allocator
    free_before = int(allocator.available_size())
    bar = _progress(len(batch_sizes) * len(tiers), "D-Cut cost profiling")
    rows: List[List[float]] = []
    t0 = time.perf_counter()
    metrics_before = runner.metrics
    try:
        with torch.no_grad():
            for i, bs in enumerate(batch_sizes):
                row = _profile_one_batch_size(worker, runner, bs, key.context_len, tiers,
                                              int(cfg.profile_warmup), int(cfg.profile_steps), seed=i)
                rows.append(row)
                if bar is not None:
                    bar.update(len(tiers))
                    bar.set_postfix(bs=bs, ms=",".join(f"{c:.1f}" for c in row))
    finally:
        if bar is not None:
            bar.close()
        runner.metrics = metrics_before.__class__(tiers=metrics_before.tiers)  # profiling steps are not traffic
    free_after = int(allocator.available_size())
    if free_after != free_before:
        raise RuntimeError(f"profiling leaked KV slots (free {free_before} -> {free_after})")
    logger.info("D-Cut: profiled %d batch sizes x %d tiers in %.1f s", len(batch_sizes), len(tiers),
                time.perf_counter() - t0)
    return CostTable.build(key, batch_sizes, rows, tiers=tiers)


# ----------------------------------------------------------------------------- TP agreement
def _tp_group() -> Any:
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().tp_group
    return group if int(getattr(group, "world_size", 1)) > 1 else None


def max_over_ranks(step_ms: List[List[float]], group: Any) -> List[List[float]]:
    """Element-wise max of the per-rank cost rows (host lists), for every rank.

    Examples
    --------
    >>> max_over_ranks([[1.0, 2.0]], None)
    [[1.0, 2.0]]
    """
    if group is None:
        return step_ms
    t = torch.tensor(step_ms, dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group.cpu_group)
    return t.tolist()


def _broadcast_from_rank0(obj: Any, group: Any) -> Any:
    return obj if group is None else group.broadcast_object(obj, src=0)


# ----------------------------------------------------------------------------- entry points
def _check_tiers(table: CostTable, tiers: Sequence[float], where: str) -> None:
    if tuple(float(t) for t in table.tiers) != tuple(float(t) for t in tiers):
        raise CostTableError(f"{where}: tiers {list(table.tiers)} differ from --dcut-tiers {list(tiers)}")


def obtain_cost_table(runner: Any, worker: Any) -> Tuple[Optional[CostTable], Dict[str, Any]]:
    """The cost table for this server and where it came from (see the module docstring).

    Returns ``(None, info)`` with a logged warning on any failure (the planner then uses the
    fixed fallback ratio). Fixed-ratio mode needs no table and returns ``(None, {"source":
    "not needed"})``.
    """
    cfg = runner.cfg
    if not cfg.auto:
        return None, {"source": "not needed", "mode": str(cfg.mode)}
    if runner.unsupported is not None:
        return None, {"source": "not needed", "unsupported": runner.unsupported}
    group = _tp_group()
    rank0 = group is None or group.rank_in_group == 0

    if cfg.cost_table:
        def load_file():
            try:
                table = CostTable.load(cfg.cost_table)
                _check_tiers(table, runner.tiers, cfg.cost_table)
            except CostTableError as e:
                return None, str(e)
            return table.to_dict(), None

        data, err = _broadcast_from_rank0(load_file() if rank0 else None, group)
        if err is not None:
            logger.warning("D-Cut: --dcut-cost-table unusable (%s); fallback ratio 0.75", err)
            return None, {"source": "fallback", "path": cfg.cost_table, "error": err}
        table = CostTable.from_dict(data)
        logger.info("D-Cut: cost table from --dcut-cost-table %s", cfg.cost_table)
        return table, {"source": "file", "path": cfg.cost_table}

    batch_sizes = profile_batch_sizes(cfg, worker)
    context_len = profile_context_len(cfg, worker, max(batch_sizes))
    key = cost_table_key(worker, context_len)
    path = cache_path(key, cfg.cache_dir)

    if os.path.exists(path):
        def load_cache():
            try:
                table = CostTable.load(path, expected_key=key)
                _check_tiers(table, runner.tiers, path)
            except CostTableError as e:
                return None, str(e)
            return table.to_dict(), None

        data, err = _broadcast_from_rank0(load_cache() if rank0 else None, group)
        if err is not None:
            logger.warning("D-Cut: cost table cache is corrupt (%s); fallback ratio 0.75 (delete the file to "
                           "re-profile)", err)
            return None, {"source": "fallback", "path": path, "error": err}
        logger.info("D-Cut: cost table reused from cache %s", path)
        return CostTable.from_dict(data), {"source": "cache", "path": path}

    t0 = time.perf_counter()
    try:
        table = profile_cost_table(runner, worker, key, batch_sizes)
        rows = max_over_ranks([list(r) for r in table.step_ms], group)
        data = _broadcast_from_rank0(CostTable.build(key, batch_sizes, rows, tiers=runner.tiers).to_dict(), group)
        table = CostTable.from_dict(data)
    except Exception as e:
        logger.warning("D-Cut: cost profiling failed (%s: %s); fallback ratio 0.75", type(e).__name__, e)
        return None, {"source": "fallback", "error": f"profiling failed: {type(e).__name__}: {e}"}
    info: Dict[str, Any] = {"source": "profiled", "path": path, "profile_s": round(time.perf_counter() - t0, 2)}
    if rank0:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            table.save(path)
        except OSError as e:
            logger.warning("D-Cut: cannot write the cost table cache %s (%s)", path, e)
            info["error"] = f"cache not written: {e}"
    return table, info


def publish_cost_table(worker: Any, table: Optional[CostTable], info: Dict[str, Any]) -> None:
    """Attach the table (JSON dict or None) and its provenance to the target model config and
    its ``hf_config`` (``dcut_cost_table``, ``dcut_cost_table_info``)."""
    mc = worker.target_worker.model_runner.model_config
    data = None if table is None else table.to_dict()
    for obj in (mc, getattr(mc, "hf_config", None)):
        if obj is None:
            continue
        setattr(obj, MODEL_CONFIG_ATTR, data)
        setattr(obj, MODEL_CONFIG_INFO_ATTR, dict(info))

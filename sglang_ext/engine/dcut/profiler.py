"""Launch-time D-Cut cost profiling inside the scheduler, the JSON cache, and publication.

:func:`obtain_cost_table` is called by :meth:`DCutRunner.init_after_graphs` at the end of the
worker's ``init_cuda_graphs`` (target and draft graphs are ready). In order:

1. ``--dcut-cost-table PATH``: load that file, no profiling (one warning naming every key field
   that differs from this server, e.g. ``tp: file 1 != server 2``; tiers must equal ``--dcut-tiers``);
2. the cache ``<cache dir>/dcut-<hash>.json`` when it exists (a corrupt file gives a warning and
   the fixed fallback ratio 0.75, never a crash);
3. otherwise profile, then write the cache atomically.

The key (``sglang_ext.dcut.CostTableKey``): target and draft model, device name, TP size,
dtype, draft tokens, topk, steps, attention backend, profiling context length, and the
SGLang / sglang_ext versions. The cache file name hashes the key *and* the tiers and profiled
batch sizes (``sglang_ext.dcut.cache_identity``): a changed ``--dcut-tiers`` or
``--max-running-requests`` profiles anew instead of failing on the old file. The cache directory is
``--dcut-cache-dir`` or ``$XDG_CACHE_HOME/sglang_ext/dcut`` (``~/.cache/sglang_ext/dcut``).

**Bounded memory** (:func:`plan_profile`). The profiling context is ``--dcut-profile-context-len``,
else ``min(2048, context length)`` on GPU and 64 on CPU, lowered (not below
``MIN_AUTO_CONTEXT_LEN``) so that the largest batch fits in 90 % of the free KV pool. A batch size
whose requests do not fit (``bs x (context + decode reserve)`` KV slots, or ``bs`` request rows) is
not run: a warning names it and its row is copied from the nearest measured batch size
(``cost_table_info["filled"]``); with no batch size left the launch falls back with a warning. The
prefill of a profiled batch runs in groups of at most the server's prefill token budget
(``--chunked-prefill-size``, else ``--max-prefill-tokens``), merged into one decode batch as the
scheduler merges new requests into its running batch, so no forward is wider than the server's own.
The plan is logged before the first batch is timed, and one line per batch size as it finishes,
with the time left (``sglang_ext.dcut.profile_eta``: the largest batch size runs first, then the
smallest, then the rest, so the remaining rows' times are interpolated between measured ones).

What is timed (docs/algorithms.md#d-cut-cost-profiling): a *full speculative decode step* of the real worker
(``draft`` + pruned ``verify`` at a fixed tier + draft extend), for every profiled batch size
and tier, and with ``--dcut-draft-off auto`` the *draft-off step* too (the worker's zero-step round:
a one-token verify per request + its draft extend; the table's ``off_ms``, one more column of the
same round-robin; the cache file name then hashes that, so an older table is not reused), with ``--dcut-profile-warmup`` warm-up steps per tier, then ``--dcut-profile-steps``
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
from sglang_ext.dcut.cost_table import cache_identity, fill_from_nearest
from sglang_ext.dcut.profile_eta import RowTime, profile_order, remaining_seconds

logger = logging.getLogger(__name__)

__all__ = [
    "obtain_cost_table",
    "publish_cost_table",
    "cost_table_key",
    "cache_path",
    "default_cache_dir",
    "profile_batch_sizes",
    "profile_context_len",
    "plan_profile",
    "ProfilePlan",
    "CPU_PROFILE_BATCH_SIZES",
    "GPU_PROFILE_CONTEXT_LEN",
    "CPU_PROFILE_CONTEXT_LEN",
    "MODEL_CONFIG_ATTR",
    "MODEL_CONFIG_INFO_ATTR",
]

CPU_PROFILE_BATCH_SIZES = (1, 4, 8, 16, 32, 64)
GPU_PROFILE_CONTEXT_LEN = 2048
CPU_PROFILE_CONTEXT_LEN = 64
#: Lowest default profiling context when the KV pool is small for the largest batch (larger batch
#: sizes that do not fit at this context are skipped and filled instead).
MIN_AUTO_CONTEXT_LEN = 256
#: Prefill tokens per profiling forward when the server has no chunked-prefill / max-prefill budget.
DEFAULT_PREFILL_TOKENS = 8192
MODEL_CONFIG_ATTR = "dcut_cost_table"
MODEL_CONFIG_INFO_ATTR = "dcut_cost_table_info"
_KV_HEADROOM = 0.9  # share of the free KV pool the profiling batch may take


# ----------------------------------------------------------------------------- key and cache
def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/sglang_ext/dcut`` (``~/.cache/sglang_ext/dcut`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang_ext", "dcut")


def cache_path(key: CostTableKey, tiers: Sequence[float], batch_sizes: Sequence[int],
               cache_dir: Optional[str] = None, draft_off: bool = False) -> str:
    """Cache file of a profiling setup: ``<dir>/dcut-<sha256(key, tiers, batch sizes)[:16]>.json``.

    Examples
    --------
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> a = cache_path(k, (0.25, 0.5, 0.75, 1.0), (1, 4), "/x")
    >>> a.startswith("/x/dcut-"), a == cache_path(k, (0.5, 1.0), (1, 4), "/x"), a == cache_path(k, (0.25, 0.5, 0.75, 1.0), (1, 8), "/x")
    (True, False, False)
    """
    ident = json.dumps(cache_identity(key, tiers, batch_sizes, draft_off=draft_off), sort_keys=True)
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
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


def _decode_reserve(worker: Any) -> int:
    """KV slots a profiled request needs beyond its context (draft tree + verify window)."""
    n = int(worker.speculative_num_draft_tokens)
    return 2 * max(int(worker.speculative_num_steps) * int(worker.topk), n) + n + 2


def profile_context_len(cfg: Any, worker: Any, max_bs: int) -> int:
    """Context length of the profiling requests: ``--dcut-profile-context-len`` (only capped by the
    model's context), else ``min(2048, context_len)`` on GPU and 64 on CPU, lowered so that
    ``max_bs`` requests (context + decode reserve) fit in 90 % of the free KV pool, but not below
    ``min(that, MIN_AUTO_CONTEXT_LEN)`` (:func:`plan_profile` then skips the batch sizes that do not fit)."""
    runner = worker.target_worker.model_runner
    model_ctx = int(runner.model_config.context_len)
    reserve = _decode_reserve(worker)
    if cfg.profile_context_len is not None:
        return max(1, min(int(cfg.profile_context_len), model_ctx - reserve))
    want = CPU_PROFILE_CONTEXT_LEN if _is_cpu_device(worker) else GPU_PROFILE_CONTEXT_LEN
    want = min(want, model_ctx - reserve)
    free = int(runner.token_to_kv_pool_allocator.available_size())
    fit = int(free * _KV_HEADROOM) // max(1, max_bs) - reserve
    return max(1, min(want, max(fit, MIN_AUTO_CONTEXT_LEN)))


@dataclass(frozen=True)
class ProfilePlan:
    """What the profiler runs (see the module docstring, "Bounded memory").

    Attributes
    ----------
    batch_sizes : tuple of int
        Every batch size of the table.
    measured : tuple of int
        The batch sizes that fit and are timed (in the order they are run: largest first).
    skipped : dict
        ``{bs: reason}`` of the batch sizes that do not fit (their rows are filled).
    context_len : int
        Context tokens per profiling request.
    prefill_tokens : int
        Most prefill tokens per profiling forward.
    """

    batch_sizes: Tuple[int, ...]
    measured: Tuple[int, ...]
    skipped: Dict[int, str]
    context_len: int
    prefill_tokens: int

    @property
    def group_size(self) -> int:
        """Requests per prefill forward."""
        return max(1, self.prefill_tokens // max(1, self.context_len))


def plan_profile(batch_sizes: Sequence[int], context_len: int, reserve: int, kv_free: int, req_rows: int,
                 prefill_tokens: int) -> ProfilePlan:
    """Which batch sizes fit: ``bs * (context_len + reserve) <= 90 % of kv_free`` and ``bs <= req_rows``.

    Examples
    --------
    >>> p = plan_profile([1, 4, 64], context_len=64, reserve=14, kv_free=4096, req_rows=65, prefill_tokens=256)
    >>> p.measured, sorted(p.skipped), p.group_size
    ((4, 1), [64], 4)
    """
    budget = int(kv_free * _KV_HEADROOM)
    skipped: Dict[int, str] = {}
    for bs in batch_sizes:
        need = int(bs) * (int(context_len) + int(reserve))
        if int(bs) > int(req_rows):
            skipped[int(bs)] = f"{bs} requests exceed the {req_rows} free request rows"
        elif need > budget:
            skipped[int(bs)] = (f"{bs} x ({context_len} context + {reserve} decode) = {need} KV slots exceed "
                                f"90 % of the {kv_free} free")
    measured = tuple(sorted((int(b) for b in batch_sizes if int(b) not in skipped), reverse=True))
    return ProfilePlan(tuple(int(b) for b in batch_sizes), measured, skipped, int(context_len), int(prefill_tokens))


def _prefill_token_budget() -> int:
    """The server's most prefill tokens per forward (``--chunked-prefill-size``, else ``--max-prefill-tokens``)."""
    try:
        from sglang.srt.runtime_context import get_schedule

        sched = get_schedule()
        for value in (getattr(sched, "chunked_prefill_size", None), getattr(sched, "max_prefill_tokens", None)):
            if value is not None and int(value) > 0:
                return int(value)
    except Exception:
        pass
    return DEFAULT_PREFILL_TOKENS


def make_plan(cfg: Any, worker: Any, batch_sizes: Sequence[int], context_len: int) -> ProfilePlan:
    """:func:`plan_profile` with this server's free KV slots, request rows and prefill budget."""
    target = worker.target_worker.model_runner
    r2t = target.req_to_token_pool
    rows = int(r2t.available_size()) if hasattr(r2t, "available_size") else int(r2t.size)
    return plan_profile(batch_sizes, context_len, _decode_reserve(worker),
                        int(target.token_to_kv_pool_allocator.available_size()), rows, _prefill_token_budget())


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


def _prefill_in_groups(worker: Any, reqs: Sequence[Any], group_size: int, tree_cache: Any) -> Any:
    """Prefill ``reqs`` through the worker ``group_size`` requests per forward and merge the groups
    into one decode-ready ``ScheduleBatch`` (``merge_batch``, as the scheduler merges a new prefill
    batch into its running batch)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    target = worker.target_worker.model_runner
    batch = None
    for start in range(0, len(reqs), group_size):
        part = ScheduleBatch.init_new(
            reqs=list(reqs[start:start + group_size]),
            req_to_token_pool=target.req_to_token_pool,
            token_to_kv_pool_allocator=target.token_to_kv_pool_allocator,
            tree_cache=tree_cache,
            model_config=target.model_config,
            enable_overlap=False,
            spec_algorithm=target.spec_algorithm,
        )
        part.prepare_for_extend()
        if part.input_ids is None and getattr(part, "prefill_input_ids_cpu", None) is not None:
            part.input_ids = part.prefill_input_ids_cpu.to(part.device, non_blocking=True)
            part.prefill_input_ids_cpu = None
        res = worker.forward_batch_generation(part)
        part.spec_info = res.next_draft_input
        if batch is None:
            batch = part
        else:
            batch.merge_batch(part)
    return batch


DRAFT_OFF_COLUMN = None
"""A profiled column that is the draft-off step (no drafting) instead of a tier ratio."""


def _profile_one_batch_size(worker: Any, runner: Any, bs: int, context_len: int,
                            tiers: Sequence[Optional[float]], warmup: int, steps: int, seed: int,
                            group_size: Optional[int] = None) -> List[float]:
    """Median full-step ms for every column at batch size ``bs``: a tier ratio, or
    :data:`DRAFT_OFF_COLUMN` for the draft-off step, timed in the same round-robin (prefill in
    groups of ``group_size`` requests)."""
    target = worker.target_worker.model_runner
    r2t = target.req_to_token_pool
    allocator = target.token_to_kv_pool_allocator
    tree_cache = _TreeCacheStub(allocator.page_size, target.device, allocator, r2t)
    reqs = _synthetic_reqs(bs, context_len, int(target.model_config.vocab_size), seed)
    costs: List[float] = []
    try:
        batch = _prefill_in_groups(worker, reqs, max(1, int(group_size or bs)), tree_cache)

        def step(ratio: Optional[float]) -> float:
            runner.forced_draft_off = ratio is DRAFT_OFF_COLUMN
            runner.forced_ratio = 1.0 if ratio is DRAFT_OFF_COLUMN else float(ratio)
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
        runner.forced_draft_off = None
        _release(reqs, r2t, allocator)
    return costs


def profile_cost_table(runner: Any, worker: Any, key: CostTableKey, plan: ProfilePlan) -> CostTable:
    """Time full speculative steps for every measured (batch size, tier) on this rank, largest batch
    size first, and fill the skipped batch sizes (see the module docstring)."""
    cfg = runner.cfg
    tiers = tuple(runner.tiers)
    draft_off = bool(getattr(cfg, "may_draft_off", False))
    columns = tiers + ((DRAFT_OFF_COLUMN,) if draft_off else ())
    warmup, steps = int(cfg.profile_warmup), int(cfg.profile_steps)
    if not plan.measured:
        raise RuntimeError(f"no profiled batch size fits this server ({'; '.join(plan.skipped.values())})")
    allocator = worker.target_worker.model_runner.token_to_kv_pool_allocator
    free_before = int(allocator.available_size())
    logger.info("D-Cut: profiling the cost table: batch sizes %s x tiers %s, %d warm-up + %d timed steps each, "
                "context %d, prefill groups of %d requests%s", list(profile_order(plan.measured)), list(tiers), warmup, steps,
                plan.context_len, plan.group_size, ", and the draft-off step" if draft_off else "")
    for bs, reason in plan.skipped.items():
        logger.warning("D-Cut: profiling skips batch size %d (%s); its costs are copied from the nearest measured "
                       "batch size", bs, reason)

    order = profile_order(plan.measured)
    measured: Dict[int, List[float]] = {}
    rows_timed: Dict[int, RowTime] = {}
    t0 = time.perf_counter()
    metrics_before = runner.metrics
    try:
        with torch.no_grad():
            for k, bs in enumerate(order):
                t_row = time.perf_counter()
                row = _profile_one_batch_size(worker, runner, bs, plan.context_len, columns, warmup, steps,
                                              seed=plan.measured.index(bs), group_size=plan.group_size)
                measured[bs] = row
                wall_s = time.perf_counter() - t_row
                rows_timed[bs] = RowTime.split(wall_s, row, warmup + steps)
                # one line per row: what the demo's progress bar reads (the ETA: sglang_ext.dcut.profile_eta)
                logger.info("D-Cut: cost profiling %d/%d batch sizes done (batch size %d in %.1f s), about %.0f s "
                            "left", k + 1, len(order), bs, wall_s,
                            remaining_seconds(rows_timed, order[k + 1:], first=order[0]))
    finally:
        runner.metrics = metrics_before.__class__(tiers=metrics_before.tiers)  # profiling steps are not traffic
    free_after = int(allocator.available_size())
    if free_after != free_before:
        raise RuntimeError(f"profiling leaked KV slots (free {free_before} -> {free_after})")
    logger.info("D-Cut: profiled %d batch sizes x %d tiers in %.1f s", len(plan.measured), len(tiers),
                time.perf_counter() - t0)
    rows, _ = fill_from_nearest(plan.batch_sizes, measured)
    return CostTable.build(key, plan.batch_sizes, [r[:len(tiers)] for r in rows], tiers=tiers,
                           off_ms=[r[-1] for r in rows] if draft_off else None)


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


def _check_batch_sizes(table: CostTable, batch_sizes: Sequence[int], where: str) -> None:
    if tuple(table.batch_sizes) != tuple(int(b) for b in batch_sizes):
        raise CostTableError(f"{where}: batch sizes {list(table.batch_sizes)} differ from the profiled "
                             f"{list(batch_sizes)}")


def _server_key_for_file(runner: Any, worker: Any) -> CostTableKey:
    """This server's key as profiling would compute it (for ``--dcut-cost-table`` warnings)."""
    batch_sizes = profile_batch_sizes(runner.cfg, worker)
    return cost_table_key(worker, profile_context_len(runner.cfg, worker, max(batch_sizes)))


def key_warning(file_key: CostTableKey, server_key: Optional[CostTableKey], path: str) -> Optional[str]:
    """The ``--dcut-cost-table`` warning: every key field that differs from the server (None when equal).

    Examples
    --------
    >>> import dataclasses
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> print(key_warning(k, dataclasses.replace(k, tp=2), "t.json"))
    D-Cut: --dcut-cost-table t.json was profiled for another setup (tp: file 1 != server 2); its costs are used as they are
    >>> key_warning(k, k, "t.json") is None
    True
    """
    if server_key is None:
        return None
    diff = file_key.differences(server_key)
    if not diff:
        return None
    return (f"D-Cut: --dcut-cost-table {path} was profiled for another setup ({'; '.join(diff)}); "
            "its costs are used as they are")


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
        info: Dict[str, Any] = {"source": "file", "path": cfg.cost_table}
        try:
            server_key = _server_key_for_file(runner, worker)
        except Exception as e:  # the key needs the runtime context; the table is still usable
            server_key = None
            logger.warning("D-Cut: cannot compare the key of --dcut-cost-table %s with this server (%s: %s)",
                           cfg.cost_table, type(e).__name__, e)
            info["key_check"] = f"not checked: {type(e).__name__}: {e}"
        warning = key_warning(table.key, server_key, cfg.cost_table)
        if warning is not None:
            if rank0:
                logger.warning(warning)
            info["key_mismatch"] = table.key.mismatches(server_key)
        logger.info("D-Cut: cost table from --dcut-cost-table %s", cfg.cost_table)
        return table, info

    batch_sizes = profile_batch_sizes(cfg, worker)
    context_len = profile_context_len(cfg, worker, max(batch_sizes))
    key = cost_table_key(worker, context_len)
    measure_off = bool(getattr(cfg, "may_draft_off", False))  # the draft-off step is timed too (hashed)
    path = cache_path(key, runner.tiers, batch_sizes, cfg.cache_dir, draft_off=measure_off)

    if os.path.exists(path):
        def load_cache():
            try:
                table = CostTable.load(path, expected_key=key)
                _check_tiers(table, runner.tiers, path)
                _check_batch_sizes(table, batch_sizes, path)
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
    plan = None
    try:
        plan = make_plan(cfg, worker, batch_sizes, context_len)
        table = profile_cost_table(runner, worker, key, plan)
        off = None if table.off_ms is None else list(table.off_ms)
        rows = max_over_ranks([list(r) + ([off[i]] if off is not None else []) for i, r in enumerate(table.step_ms)],
                              group)
        ntiers = len(runner.tiers)
        data = _broadcast_from_rank0(CostTable.build(key, batch_sizes, [r[:ntiers] for r in rows], tiers=runner.tiers,
                                                     off_ms=None if off is None else [r[ntiers] for r in rows]
                                                     ).to_dict(), group)
        table = CostTable.from_dict(data)
    except Exception as e:
        logger.warning("D-Cut: cost profiling failed (%s: %s); fallback ratio 0.75", type(e).__name__, e)
        return None, {"source": "fallback", "error": f"profiling failed: {type(e).__name__}: {e}"}
    info = {"source": "profiled", "path": path, "profile_s": round(time.perf_counter() - t0, 2)}
    if plan.skipped:
        _, filled = fill_from_nearest(plan.batch_sizes, {b: [1.0] for b in plan.measured})
        info["filled"] = {str(b): src for b, src in filled.items()}
        info["skipped"] = {str(b): reason for b, reason in plan.skipped.items()}
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

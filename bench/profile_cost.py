"""What does one speculative step cost per (batch size, verify tier) on this machine?

Runs only the launch-time D-Cut profiler (``sglang_ext.engine.dcut.profiler``, the same code a
``--dcut auto`` server runs in its scheduler) and prints the cost table it produced, with the
ratio of every tier's step cost to full verification, then saves a PNG plot.

Three sources, one report:

* default: launch an in-process ``sglang.Engine`` (CPU testbed when there is no CUDA device)
  with ``--dcut auto`` and a fresh cost-table cache directory, so the scheduler profiles; the
  table is read back from the server's info (the copy stored on the target model config), the
  engine is shut down, nothing is generated. Models: ``--target``/``--draft``, else the demo's
  models (the committed trained testbed models, or tiny random ones built under ``.cache/``);
* ``--url URL``: the table of a running server, from its ``/server_info`` (no profiling);
* ``--table FILE``: a cost-table JSON (e.g. a cache file, or one profiled on a GPU).

Run from the repository root (on a shared CPU machine with ``OMP_NUM_THREADS=1``)::

    OMP_NUM_THREADS=1 python bench/profile_cost.py --out bench/out/profile_cost.png
    python bench/profile_cost.py --url http://127.0.0.1:30000
    python bench/profile_cost.py --table ~/.cache/sglang_ext/dcut/dcut-<hash>.json

The ratio columns are ``step_ms[tier] / step_ms[1.0]``: the fraction of a full-verify step a
pruned step costs. D-Cut ``auto`` picks, per step, the tier that maximises expected accepted
tokens per millisecond, so tiers whose ratio is close to 1.0 buy little and the planner will
mostly not use them (docs/algorithms.md#d-cut-cost-profiling).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_OUT = os.path.join("bench", "out", "profile_cost.png")


def _parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", default=None, help="read the table of a running server (/server_info)")
    src.add_argument("--table", default=None, metavar="FILE", help="read a cost-table JSON file")
    p.add_argument("--target", default=None, help="target model (default: the demo's models)")
    p.add_argument("--draft", default=None, help="EAGLE3 draft model (default: the demo's models)")
    p.add_argument("--num-steps", type=int, default=3, help="--speculative-num-steps")
    p.add_argument("--topk", type=int, default=1, help="--speculative-eagle-topk")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="--speculative-num-draft-tokens")
    p.add_argument("--tiers", default=None, help="--dcut-tiers (default: the server's 0.25,0.5,0.75,1.0)")
    p.add_argument("--batch-sizes", default=None, help="--dcut-profile-batch-sizes (default: the profiler's)")
    p.add_argument("--profile-steps", type=int, default=None, help="--dcut-profile-steps (default 5)")
    p.add_argument("--profile-warmup", type=int, default=None, help="--dcut-profile-warmup (default 3)")
    p.add_argument("--context-len", type=int, default=None, help="--dcut-profile-context-len (default: auto)")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool size on the CPU testbed")
    p.add_argument("--attention-backend", default=None, help="default: torch_sdpa on CPU, SGLang's choice on GPU")
    p.add_argument("--cache-dir", default=None,
                   help="--dcut-cache-dir; default: a fresh temporary directory, so the profiler runs")
    p.add_argument("--log-level", default="warning", help="the engine's log level (info shows the profiler's lines)")
    p.add_argument("--out", default=DEFAULT_OUT, help="PNG path ('' for no plot)")
    p.add_argument("--json", default=None, help="also write the table and its provenance here")
    from sglang_ext.testbed.evaluate import refuse_config

    refuse_config(p, "it launches its engine with its own flags (--num-steps, --tiers, --batch-sizes, ...); "
                     "pass those, or start a server with `python -m sglang.launch_server --config FILE` and "
                     "read its table with --url")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- sources
def _activate_cpu_testbed() -> bool:
    """Without CUDA: the CPU testbed's stand-ins, before anything imports SGLang. Returns on_gpu."""
    import torch

    if torch.cuda.is_available():
        return True
    from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

    os.environ.update(cpu_testbed_env())
    install()
    return False


def _engine_kwargs(args: argparse.Namespace, on_gpu: bool, cache_dir: str) -> Dict[str, Any]:
    kw: Dict[str, Any] = dict(
        speculative_algorithm="EAGLE3", speculative_num_steps=args.num_steps, speculative_eagle_topk=args.topk,
        speculative_num_draft_tokens=args.num_draft_tokens, max_running_requests=args.max_running_requests,
        dcut="auto", dcut_cache_dir=cache_dir, skip_server_warmup=True, random_seed=0, log_level=args.log_level)
    if not on_gpu:
        kw.update(device="cpu", sampling_backend="pytorch", disable_cuda_graph=True, dtype="float32",
                  mem_fraction_static=0.5, max_total_tokens=args.max_total_tokens, chunked_prefill_size=-1,
                  attention_backend=args.attention_backend or "torch_sdpa")
    elif args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    for flag, value in (("dcut_tiers", args.tiers), ("dcut_profile_batch_sizes", args.batch_sizes),
                        ("dcut_profile_steps", args.profile_steps), ("dcut_profile_warmup", args.profile_warmup),
                        ("dcut_profile_context_len", args.context_len)):
        if value is not None:
            kw[flag] = value
    return kw


def _profile_with_engine(args: argparse.Namespace) -> Dict[str, Any]:
    """Launch an engine with ``--dcut auto`` so its scheduler profiles; return its ``dcut`` info."""
    on_gpu = _activate_cpu_testbed()
    import sglang

    import sglang_ext
    from sglang_ext.engine.dcut.client import dcut_info

    target, draft = args.target, args.draft
    if target is None or draft is None:
        from sglang_ext import demo

        models = demo.pick_models()
        target, draft = models.target, models.draft
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="dcut-profile-")
    kw = _engine_kwargs(args, on_gpu, cache_dir)
    sglang_ext.load()
    print(f"[profile_cost] launching: target={target} draft={draft} "
          f"(steps {args.num_steps}, topk {args.topk}, {args.num_draft_tokens} draft tokens; cache {cache_dir})",
          flush=True)
    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=target, speculative_draft_model_path=draft, **kw)
    launch_s = time.perf_counter() - t0
    try:
        info = dcut_info(engine)
    finally:
        engine.shutdown()
    info = dict(info)
    info["launch_s"] = launch_s
    return info


def _info_from_url(url: str) -> Dict[str, Any]:
    from sglang_ext.engine.dcut.client import dcut_info

    try:
        return dict(dcut_info(url))
    except KeyError:
        raise SystemExit(f"{url}: /server_info has no 'dcut' entry (the server runs without --dcut)") from None


def _info_from_file(path: str) -> Dict[str, Any]:
    from sglang_ext.dcut import CostTable, CostTableError

    try:
        table = CostTable.load(path)
    except CostTableError as e:
        raise SystemExit(str(e)) from None
    return {"cost_table": table.to_dict(), "cost_table_info": {"source": "file", "path": path}}


# ----------------------------------------------------------------------------- report
def tier_ratios(step_ms: Sequence[Sequence[float]]) -> List[List[float]]:
    """Each row divided by its last (full-verify) entry.

    Examples
    --------
    >>> tier_ratios([[1.0, 2.0, 4.0], [3.0, 3.0, 6.0]])
    [[0.25, 0.5, 1.0], [0.5, 0.5, 1.0]]
    """
    return [[c / row[-1] for c in row] for row in step_ms]


def format_table(table: Dict[str, Any]) -> str:
    """The cost table as text: step ms per (batch size, tier), then each tier / full.

    Examples
    --------
    >>> t = {"tiers": [0.5, 1.0], "batch_sizes": [1, 8], "step_ms": [[2.0, 4.0], [3.0, 12.0]]}
    >>> print(format_table(t))
       bs | ms@0.5   ms@1 | 0.5/full
        1 |   2.00   4.00 |    0.500
        8 |   3.00  12.00 |    0.250
    """
    tiers = [float(t) for t in table["tiers"]]
    ratios = tier_ratios(table["step_ms"])
    names = [f"{t:g}" for t in tiers]
    ms_w = max(6, max(len("ms@" + n) for n in names))
    head = f"{'bs':>5} | " + " ".join(f"{'ms@' + n:>{ms_w}}" for n in names)
    rat_names = [f"{n}/full" for n in names[:-1]]
    rat_w = max([8] + [len(n) for n in rat_names])
    if rat_names:
        head += " | " + " ".join(f"{n:>{rat_w}}" for n in rat_names)
    lines = [head]
    for bs, row, rat in zip(table["batch_sizes"], table["step_ms"], ratios):
        line = f"{bs:>5} | " + " ".join(f"{c:>{ms_w}.2f}" for c in row)
        if rat_names:
            line += " | " + " ".join(f"{r:>{rat_w}.3f}" for r in rat[:-1])
        lines.append(line)
    return "\n".join(lines)


def describe(info: Dict[str, Any]) -> str:
    """Provenance lines: where the table came from and what it was profiled for.

    Examples
    --------
    >>> print(describe({"cost_table_info": {"source": "fallback", "error": "profiling failed"},
    ...                 "cost_table": None}))
    source: fallback
    error: profiling failed
    """
    src = info.get("cost_table_info") or {}
    lines = [f"source: {src.get('source')}" + (f" ({src['path']})" if src.get("path") else "")]
    if src.get("error"):
        lines.append(f"error: {src['error']}")
    table = info.get("cost_table")
    if table:
        k = table["key"]
        lines.append(f"model: {k['model']}  draft: {k['draft']}")
        lines.append(f"device: {k['device']}  tp: {k['tp']}  dtype: {k['dtype']}  attention: {k['attention_backend']}")
        lines.append(f"draft tokens: {k['draft_tokens']}  topk: {k['topk']}  steps: {k['num_steps']}  "
                     f"profiling context: {k['context_len']} tokens  sglang {k['sglang_version']}  "
                     f"sglang_ext {k['sglang_ext_version']}  created {table['created']}")
    if info.get("launch_s") is not None:
        lines.append(f"engine launch incl. profiling: {info['launch_s']:.1f} s")
    return "\n".join(lines)


def _plot(table: Dict[str, Any], path: str, title: str = "") -> None:
    """Two panels: step ms per tier vs batch size, and tier / full ratio vs batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bss = list(table["batch_sizes"])
    tiers = [float(t) for t in table["tiers"]]
    rows = table["step_ms"]
    ratios = tier_ratios(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, t in enumerate(tiers):
        ax1.plot(bss, [r[q] for r in rows], marker="o", label=f"tier {t:g}", linewidth=2.2 if t == 1.0 else 1.3)
        if t != 1.0:
            ax2.plot(bss, [r[q] for r in ratios], marker="o", label=f"{t:g} / full")
            ax2.axhline(t, color=ax2.lines[-1].get_color(), linestyle=":", linewidth=0.8)
    for ax in (ax1, ax2):
        if len(bss) > 1 and bss[-1] / bss[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(bss, [str(b) for b in bss])
        ax.set_xlabel("batch size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("full speculative step (ms)")
    ax1.set_title("profiled step cost per tier")
    ax2.set_ylabel("step cost / full-verify step cost")
    ax2.set_title("tier cost ratio (dotted: the tier's token share)")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _title(table: Dict[str, Any]) -> str:
    k = table["key"]
    return (f"D-Cut cost table: {os.path.basename(str(k['model']).rstrip('/'))} + "
            f"{os.path.basename(str(k['draft']).rstrip('/'))}, {k['device']}, {k['dtype']}, "
            f"N={k['draft_tokens']} topk={k['topk']} steps={k['num_steps']}, ctx {k['context_len']}")


def _report(info: Dict[str, Any], out_png: Optional[str]) -> int:
    print("\n" + describe(info))
    table = info.get("cost_table")
    if not table:
        print("no cost table (the server uses the fixed fallback ratio 0.75)")
        return 1
    print("\n" + format_table(table))
    if out_png:
        _plot(table, out_png, _title(table))
        print(f"\nplot: {out_png}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    if args.url:
        info = _info_from_url(args.url.rstrip("/"))
    elif args.table:
        info = _info_from_file(args.table)
    else:
        info = _profile_with_engine(args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({k: info.get(k) for k in ("cost_table", "cost_table_info", "launch_s")}, f, indent=2)
    return _report(info, args.out or None)


if __name__ == "__main__":
    sys.exit(main())

"""How long does the D-Cut planner take per decode step on CPU?

Times the pure planner (``sglang_ext.dcut``) on synthetic inputs, median of many calls:

* chains: bs = 64, N = 16 (15 draft slots), confidences -> survival -> ``choose`` (auto, with
  a cost table), and separately the chain compaction into ragged verify inputs;
* trees: bs = 64, N = 60 nodes (random trees with up to 8 children per node), SGLang links ->
  topology -> path-product survival -> ``choose`` (auto), and separately the tree compaction
  plus the FULL_MASK build.

Target (issue 4): well under 1 ms per step for the planner on CPU. Prints one line per timed
operation and saves a bar chart of the median and minimum times with the 1 ms target line (PNG,
``--out``). Run:

    OMP_NUM_THREADS=1 python bench/dcut_planner_speed.py [--calls 300] [--threads 1]
        [--out bench/out/dcut_planner_speed.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import List, Tuple

import torch

from sglang_ext.dcut import (
    CostTable,
    CostTableKey,
    TreeTopology,
    chain_keep_mask,
    chain_retrive,
    chain_survival,
    choose,
    compact_tree,
    build_full_mask,
    retrive_from_parents,
    tree_survival,
)


DEFAULT_OUT = os.path.join("bench", "out", "dcut_planner_speed.png")
TARGET_US = 1000.0
"""Issue 4's target for the planner: well under 1 ms per decode step."""


@dataclass(frozen=True)
class Timing:
    """Median and minimum wall time per call, in microseconds; prints as a fixed-width string."""

    median_us: float
    min_us: float

    def __str__(self) -> str:
        return f"median {self.median_us:8.1f} us  min {self.min_us:8.1f} us"


def _time_us(fn, calls: int, warmup: int = 20) -> Timing:
    """Median and minimum wall time per call, in microseconds.

    The minimum is the better estimate of the uncontended cost on a shared machine.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing(statistics.median(samples) * 1e6, min(samples) * 1e6)


def _plot(rows: List[Tuple[str, Timing]], title: str, path: str) -> None:
    """Horizontal bars of the median and minimum time per call, with the 1 ms target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, _ in rows][::-1]
    med = [t.median_us / 1000.0 for _, t in rows][::-1]
    mins = [t.min_us / 1000.0 for _, t in rows][::-1]
    y = list(range(len(rows)))
    h = 0.38
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(rows) + 1.6))
    ax.barh([v + h / 2 for v in y], med, height=h, color="tab:blue", label="median")
    ax.barh([v - h / 2 for v in y], mins, height=h, color="tab:cyan", label="minimum")
    for v, m, n in zip(y, med, mins):
        ax.annotate(f"{m:.2f}", (m, v + h / 2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.annotate(f"{n:.2f}", (n, v - h / 2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.axvline(TARGET_US / 1000.0, color="tab:red", linestyle="--", linewidth=1.2, label="1 ms target")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("wall time per call (ms)")
    ax.set_xlim(0, max(med + mins + [TARGET_US / 1000.0]) * 1.15)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(n: int, topk: int, steps: int) -> CostTable:
    key = CostTableKey("bench-target", "bench-draft", "cpu", 1, "float32", n, topk, steps,
                       "torch_sdpa", 2048, "0.5.23", "0.1.0")
    bss = [1, 2, 4, 8, 16, 32, 64]
    # Dense-model-like shape: cost grows with the verify width.
    rows = [[2.0 + 0.02 * bs * n * r for r in (0.25, 0.5, 0.75, 1.0)] for bs in bss]
    return CostTable.build(key, bss, rows)


def _random_parents(bs: int, n: int, max_children: int, g: torch.Generator) -> torch.Tensor:
    parents = torch.full((bs, n), -1, dtype=torch.int64)
    for b in range(bs):
        counts = [0] * n
        for v in range(1, n):
            while True:
                u = int(torch.randint(0, v, (1,), generator=g))
                if counts[u] < max_children:
                    break
            counts[u] += 1
            parents[b, v] = u
    return parents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", "--png", dest="out", default=DEFAULT_OUT, help="PNG path ('' for no plot)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)

    # ---- chains: bs = 64, N = 16 -----------------------------------------------------------
    bs, n = 64, 16
    conf = torch.rand(bs, n - 1, generator=g) ** 0.3
    table = _table(n, 1, n - 1)
    nt, ns = chain_retrive(bs, n)
    tokens = torch.randint(0, 1000, (bs * n,), generator=g)
    seq_lens = torch.randint(100, 2000, (bs,), generator=g)
    positions = (seq_lens.unsqueeze(1) + torch.arange(n)).reshape(-1)

    def chain_plan():
        return choose(chain_survival(conf).scores, table)

    plan = chain_plan()

    def chain_compact():
        keep = chain_keep_mask(plan.keep_lens, n)
        return compact_tree(keep, tokens, positions, nt, ns, num_tokens=plan.verify_width)

    t_chain = _time_us(chain_plan, args.calls)
    t_chain_fixed = _time_us(lambda: choose(chain_survival(conf).scores, None, mode=0.5), args.calls)
    t_chain_compact = _time_us(chain_compact, args.calls)

    # ---- trees: bs = 64, N = 60 ------------------------------------------------------------
    tn = 60
    parents = _random_parents(bs, tn, 8, g)
    tnt, tns = retrive_from_parents(parents)
    tconf = torch.rand(bs, tn, generator=g) ** 0.5
    ttable = _table(tn, 8, 6)
    topo0 = TreeTopology.from_retrive(tnt, tns)
    ttokens = torch.randint(0, 1000, (bs * tn,), generator=g)
    tpos = (seq_lens.unsqueeze(1) + topo0.depth).reshape(-1)

    def tree_plan():
        topo = TreeTopology.from_retrive(tnt, tns)
        return choose(tree_survival(tconf, topo).scores, ttable, topology=topo)

    tplan = tree_plan()

    def tree_compact():
        c = compact_tree(tplan.keep_mask, ttokens, tpos, tnt, tns, num_tokens=tplan.verify_width)
        return build_full_mask(c.tree_block, c.counts, seq_lens)

    t_tree = _time_us(tree_plan, args.calls)
    t_tree_compact = _time_us(tree_compact, args.calls)

    header = f"D-Cut planner on CPU, torch {torch.__version__}, {args.threads} thread(s), median of {args.calls} calls"
    print(header)
    print(f"  chains bs={bs} N={n}:  planner: survival + choose(auto)       {t_chain}  "
          f"(tier {plan.tier_index}, keep {plan.budget}/{bs * (n - 1)})")
    print(f"  chains bs={bs} N={n}:  planner: survival + choose(ratio 0.5)  {t_chain_fixed}")
    print(f"  chains bs={bs} N={n}:  compaction to ragged verify inputs     {t_chain_compact}")
    print(f"  trees  bs={bs} N={tn}:  planner: topology + survival + choose  {t_tree}  "
          f"(tier {tplan.tier_index}, keep {tplan.budget}/{bs * (tn - 1)})")
    print(f"  trees  bs={bs} N={tn}:  compaction + FULL_MASK (seq ~1k)       {t_tree_compact}")
    if args.out:
        rows = [(f"chains bs={bs} N={n}: survival + choose(auto)", t_chain),
                (f"chains bs={bs} N={n}: survival + choose(ratio 0.5)", t_chain_fixed),
                (f"chains bs={bs} N={n}: compaction", t_chain_compact),
                (f"trees bs={bs} N={tn}: topology + survival + choose", t_tree),
                (f"trees bs={bs} N={tn}: compaction + FULL_MASK", t_tree_compact)]
        _plot(rows, header, args.out)
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()

"""Where the CPU verify cliff is, and what the row-blocked packed GEMM does to it, per model.

For each model directory given (HF config of a Llama/Qwen2-style decoder: hidden size,
intermediate size, heads, KV heads, vocabulary, layers), times one forward's linear layers --
QKV, output, gate+up, down per layer, times the layers, plus the LM head -- at 1, 2, 3, 4, 6, 8,
12 and 16 input rows, with fp32 ``F.linear`` (what SGLang runs) and with
``sglang_ext.engine.cpu.packed_gemm.blocked_linear`` in blocks of P rows for each ``--rows`` P.
Random weights of the model's shapes (no checkpoint is read: the timing depends only on the
shapes), one set per layer as in the model, run in a forward's order, so the weights stream from
memory as in a serving engine; the median of ``--reps`` such sweeps is kept. Memory: the model's
fp32 weights plus one packed copy (about 2.2x the weights). Printed: ms per forward
and the ratio to one row of ``F.linear`` (a verify of k rows "at decode's price" is a ratio near 1).

Run (2 threads, as the engines of bench/dcut_throughput.py with OMP_NUM_THREADS=2)::

    TARGET=$(python -m sglang_ext.models fetch qwen2.5-coder-1.5b-instruct | tail -n 1)
    DRAFT=$(python -m sglang_ext.models fetch qwen2.5-coder-0.5b-instruct | tail -n 1)
    SMOL=$(python -m sglang_ext.models fetch smollm2-135m-instruct | tail -n 1)
    python bench/cpu_packed_gemm.py --models "$TARGET,$DRAFT,$SMOL" --threads 2 \\
        --json bench/results/cpu_packed_gemm_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ROW_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)


def linear_shapes(cfg: dict) -> Dict[str, tuple]:
    """``{name: (out_features, in_features, per_forward)}`` of a decoder's linear layers.

    >>> s = linear_shapes({"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
    ...                    "num_key_value_heads": 1, "vocab_size": 100, "num_hidden_layers": 3})
    >>> s["qkv"], s["gate_up"], s["lm_head"]
    ((16, 8, 3), (32, 8, 3), (100, 8, 1))
    """
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim") or h // heads
    n = cfg["num_hidden_layers"]
    return {"qkv": ((heads + 2 * kv) * d, h, n), "o": (h, heads * d, n), "gate_up": (2 * inter, h, n),
            "down": (h, inter, n), "lm_head": (cfg["vocab_size"], h, 1)}


def _median_ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def measure(cfg: dict, rows_list: List[int], reps: int) -> dict:
    """``{"F.linear": {m: ms}, "packed<P>": {m: ms}}`` of one forward's linear layers.

    Every layer gets weights of its own (as in the model: a forward streams all of them from
    memory, nothing stays in the caches), and one timed call runs them in a forward's order."""
    import torch
    import torch.nn.functional as F

    from sglang_ext.engine.cpu.packed_gemm import blocked_linear, pack_weight

    g = torch.Generator().manual_seed(0)
    shapes = linear_shapes(cfg)
    layers = cfg["num_hidden_layers"]
    # per layer, in a forward's order: (name, weight); the LM head last
    order = [(name, layer) for layer in range(layers) for name in ("qkv", "o", "gate_up", "down")] + [("lm_head", 0)]
    weights = {(name, i): torch.randn(shapes[name][0], shapes[name][1], generator=g) * 0.02 for name, i in order}
    xs = {name: torch.randn(max(ROW_COUNTS), n_in, generator=g) for name, (_, n_in, _) in shapes.items()}
    out: Dict[str, Dict[int, float]] = {"F.linear": {}}

    def sweep(fn, m):
        for key in order:
            fn(xs[key[0]][:m], key)

    with torch.no_grad():
        for m in ROW_COUNTS:
            out["F.linear"][m] = _median_ms(lambda: sweep(lambda x, k: F.linear(x, weights[k]), m), reps)
        for p in rows_list:
            packed = {k: pack_weight(w, p) for k, w in weights.items()}
            out[f"packed{p}"] = {m: _median_ms(lambda: sweep(lambda x, k: blocked_linear(x, packed[k]), m), reps)
                                 for m in ROW_COUNTS}
            packed = None  # free this P's copies before the next
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", required=True, help="model directories, comma-separated")
    p.add_argument("--rows", default="4,8", help="P of the packed variants, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",") if r.strip()]
    result = {"threads": args.threads, "reps": args.reps, "row_counts": list(ROW_COUNTS), "models": {}}
    for path in [m for m in args.models.split(",") if m.strip()]:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        name = os.path.basename(os.path.normpath(path))
        res = measure(cfg, rows_list, args.reps)
        result["models"][name] = res
        one = res["F.linear"][1]
        print(f"\n{name}: linear layers + LM head per forward, ms (ratio to 1 row of F.linear), {args.threads} threads")
        print(f"{'rows':<10}" + "".join(f"{m:>14}" for m in ROW_COUNTS))
        for variant, row in res.items():
            print(f"{variant:<10}" + "".join(f"{row[m]:>8.1f} ({row[m] / one:.2f})" for m in ROW_COUNTS), flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the CPU verify cliff is, and what the row-blocked packed GEMM does to it, per model.

For each model directory given (HF config of a Llama/Qwen2-style decoder: hidden size,
intermediate size, heads, KV heads, vocabulary, layers), times one forward's linear layers --
QKV, output, gate+up, down per layer, times the layers, plus the LM head -- at 1, 2, 3, 4, 6, 8,
12 and 16 input rows, with fp32 ``F.linear`` (what SGLang runs) and with
``sglang_ext.engine.cpu.packed_gemm.blocked_linear`` in blocks of P rows for each ``--rows`` P.
Random weights of the model's shapes (no checkpoint is read: the timing depends only on the
shapes); each shape's weights are allocated once and the median of ``--reps`` calls is kept, so
the weights stream from memory as in a forward (larger than the caches). Printed: ms per forward
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
    """``{"F.linear": {m: ms}, "packed<P>": {m: ms}}`` per forward (sum over the shapes)."""
    import torch
    import torch.nn.functional as F

    from sglang_ext.engine.cpu.packed_gemm import blocked_linear, pack_weight

    out: Dict[str, Dict[int, float]] = {"F.linear": {m: 0.0 for m in ROW_COUNTS}}
    out.update({f"packed{p}": {m: 0.0 for m in ROW_COUNTS} for p in rows_list})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, (n_out, n_in, count) in linear_shapes(cfg).items():
            w = torch.randn(n_out, n_in, generator=g) * 0.02
            x = torch.randn(max(ROW_COUNTS), n_in, generator=g)
            for m in ROW_COUNTS:
                out["F.linear"][m] += count * _median_ms(lambda: F.linear(x[:m], w), reps)
            for p in rows_list:
                pw = pack_weight(w, p)
                for m in ROW_COUNTS:
                    out[f"packed{p}"][m] += count * _median_ms(lambda: blocked_linear(x[:m], pw), reps)
                pw = None  # free the packed copy before the next one
            w = pw = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", required=True, help="model directories, comma-separated")
    p.add_argument("--rows", default="4,8", help="P of the packed variants, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
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

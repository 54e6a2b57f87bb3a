"""Does D-Cut raise EAGLE3 decode throughput, and does ``--dcut auto`` pick a good tier?

In one process, for batch sizes 1, 4, 16, 32, 64 (all requests submitted together, greedy,
``--max-new-tokens`` each), measures output tokens/s of:

* ``no-spec``: the target alone (one engine without speculation);
* ``full``: EAGLE3 with full verification (D-Cut ratio 1.0, the ``--dcut off`` behaviour);
* ``r0.25`` / ``r0.5`` / ``r0.75``: each fixed tier;
* ``auto``: the tier chosen per step from the launch-time cost table.

The five EAGLE3 modes run on one ``--dcut auto`` engine, switched at runtime with
``/set_internal_state`` ``dcut_force_ratio`` (so they share weights, profile and warm-up); every
mode's output is checked token for token against the full-verify output (lossless). It prints a
table of tok/s with the ratios ``auto / full`` and ``auto / best fixed tier``, D-Cut's keep ratio
and tier histogram for ``auto``, and saves a PNG plot (and optionally JSON).

Models: ``--target`` / ``--draft`` (e.g. the trained thinking models); by default the tiny
testbed models are built under ``--models-dir`` (random target + EAGLE3 draft fitted to it).
Prompts come from the distribution the tiny draft was fitted on. On the CPU testbed use
``OMP_NUM_THREADS=1`` on a shared machine. Run::

    OMP_NUM_THREADS=1 python bench/dcut_throughput.py --num-steps 15 --num-draft-tokens 16 \\
        --batch-sizes 1,4,16,32,64 --max-new-tokens 64 --out bench/dcut_throughput.png

``--what-if FILE``: instead of running engines, replay a saved ``--json`` result and print
what ``auto`` would gain with a different cost model (each tier's cost scaled by
``--what-if-verify-scale`` on the verify share); a quick planning aid, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, List

MODES = ("full", "r0.25", "r0.5", "r0.75", "auto")
MODE_RATIO = {"full": 1.0, "r0.25": 0.25, "r0.5": 0.5, "r0.75": 0.75, "auto": 0.0}


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="target model dir (default: tiny testbed target)")
    p.add_argument("--draft", default=None, help="EAGLE3 draft dir (default: tiny testbed draft)")
    p.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "sglang_ext_tiny_models"),
                   help="where the tiny models are built when --target/--draft are not given")
    p.add_argument("--num-steps", type=int, default=15)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=16)
    p.add_argument("--batch-sizes", default="1,4,16,32,64")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="timed repetitions per (mode, bs); the best is kept")
    p.add_argument("--attention-backend", default="torch_sdpa")
    p.add_argument("--cache-dir", default=None, help="--dcut-cache-dir (default: sglang_ext's)")
    p.add_argument("--out", default=os.path.join("bench", "dcut_throughput.png"))
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--skip-no-spec", action="store_true")
    p.add_argument("--what-if", default=None, metavar="FILE", help="replay a --json result (no engines)")
    p.add_argument("--what-if-verify-scale", type=float, default=2.0)
    return p.parse_args(argv)


def _prompts(target: str, n: int, prompt_len: int) -> List[List[int]]:
    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, n, prompt_len, seed=0).tolist()


def _activate_cpu_testbed() -> None:
    """Without CUDA: the CPU testbed's stand-ins, before anything imports SGLang."""
    import torch

    if not torch.cuda.is_available():
        from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

        os.environ.update(cpu_testbed_env())
        install()


def _engine(target: str, args, **kw):
    import sglang

    import sglang_ext

    sglang_ext.load()
    max_bs = max(args.bs_list)
    per_req = args.prompt_len + args.max_new_tokens + 4 * args.num_draft_tokens + 8
    base = dict(device="cpu", sampling_backend="pytorch", disable_cuda_graph=True, dtype="float32",
                mem_fraction_static=0.5, max_total_tokens=max(4096, 2 * max_bs * per_req), chunked_prefill_size=-1,
                skip_server_warmup=True, random_seed=0, log_level="warning", max_running_requests=max_bs,
                attention_backend=args.attention_backend)
    try:
        import torch

        if torch.cuda.is_available():
            base.update(device="cuda", disable_cuda_graph=False, sampling_backend=None, dtype="auto")
            base = {k: v for k, v in base.items() if v is not None}
    except ImportError:
        pass
    base.update(kw)
    return sglang.Engine(model_path=target, **base)


def _run(engine, prompts, max_new_tokens) -> tuple:
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return tokens / dt, [o["output_ids"] for o in outs]


def _measure(engine, prompts_all, bs_list, args, set_mode=None) -> Dict[int, dict]:
    out = {}
    for bs in bs_list:
        prompts = prompts_all[:bs]
        _run(engine, prompts, min(8, args.max_new_tokens))  # warm-up at this batch size
        best, ids = 0.0, None
        for _ in range(args.repeats):
            tps, ids = _run(engine, prompts, args.max_new_tokens)
            best = max(best, tps)
        out[bs] = {"tok_s": best, "ids": ids}
    return out


def run_bench(args) -> dict:
    _activate_cpu_testbed()
    from sglang_ext.engine.dcut_client import dcut_info, dcut_states, set_force_ratio

    args.bs_list = [int(b) for b in args.batch_sizes.split(",")]
    target, draft = args.target, args.draft
    if target is None or draft is None:
        from sglang_ext.testbed.tiny import build_tiny_models

        if not os.path.exists(os.path.join(args.models_dir, "draft", "config.json")):
            print(f"building the tiny testbed models in {args.models_dir} ...", flush=True)
        models = build_tiny_models(args.models_dir, seed=0, fit_steps=400)
        target, draft = models.target, models.draft
    prompts = _prompts(target, max(args.bs_list), args.prompt_len)
    results: Dict[str, Dict[int, dict]] = {}

    if not args.skip_no_spec:
        eng = _engine(target, args)
        try:
            results["no-spec"] = _measure(eng, prompts, args.bs_list, args)
        finally:
            eng.shutdown()

    extra = {} if args.cache_dir is None else {"dcut_cache_dir": args.cache_dir}
    t0 = time.perf_counter()
    eng = _engine(target, args, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                  speculative_num_steps=args.num_steps, speculative_eagle_topk=args.topk,
                  speculative_num_draft_tokens=args.num_draft_tokens, dcut="auto", **extra)
    startup = time.perf_counter() - t0
    dcut_stats = {}
    try:
        info = dcut_info(eng)
        for mode in MODES:
            assert set_force_ratio(eng, MODE_RATIO[mode]), f"server refused dcut_force_ratio for {mode}"
            before = dcut_states(eng)[0]["metrics"]
            results[mode] = _measure(eng, prompts, args.bs_list, args)
            after = dcut_states(eng)[0]["metrics"]
            dcut_stats[mode] = _delta(before, after)
    finally:
        eng.shutdown()

    lossless = {m: all(results[m][bs]["ids"] == results["full"][bs]["ids"] for bs in args.bs_list)
                for m in MODES}
    return {
        "settings": {k: v for k, v in vars(args).items() if k not in ("what_if",)},
        "target": target, "draft": draft, "startup_s": startup,
        "cost_table": info.get("cost_table"), "cost_table_info": info.get("cost_table_info"),
        "tok_s": {m: {bs: r["tok_s"] for bs, r in res.items()} for m, res in results.items()},
        "dcut": dcut_stats, "lossless_vs_full": lossless,
    }


def _delta(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in ("steps", "pruned_steps", "verified_tokens", "full_tokens",
                                          "accepted_tokens")}
    d["keep_ratio"] = d["verified_tokens"] / d["full_tokens"] if d["full_tokens"] else None
    hist = {k: v - before["tier_histogram"].get(k, 0) for k, v in after["tier_histogram"].items()}
    d["tier_histogram"] = {k: v for k, v in hist.items() if v}
    return d


def report(res: dict, out_png: str = None) -> None:
    tok = res["tok_s"]
    bs_list = sorted({int(b) for m in tok.values() for b in m})
    modes = [m for m in ("no-spec",) + MODES if m in tok]
    print("\noutput tokens/s (higher is better)")
    print("mode      " + "".join(f"{'bs=' + str(b):>10}" for b in bs_list))
    for m in modes:
        print(f"{m:<10}" + "".join(f"{tok[m][_k(tok[m], b)]:>10.1f}" for b in bs_list))
    print("\nratios")
    fixed = [m for m in ("r0.25", "r0.5", "r0.75") if m in tok]
    rows = [("auto/full", lambda b: tok["auto"][_k(tok["auto"], b)] / tok["full"][_k(tok["full"], b)]),
            ("auto/best", lambda b: tok["auto"][_k(tok["auto"], b)] / max(tok[m][_k(tok[m], b)] for m in fixed))]
    if "no-spec" in tok:
        rows.append(("auto/nospec", lambda b: tok["auto"][_k(tok["auto"], b)] / tok["no-spec"][_k(tok["no-spec"], b)]))
        rows.append(("full/nospec", lambda b: tok["full"][_k(tok["full"], b)] / tok["no-spec"][_k(tok["no-spec"], b)]))
    for name, fn in rows:
        print(f"{name:<12}" + "".join(f"{fn(b):>10.2f}" for b in bs_list))
    if res.get("dcut"):
        a = res["dcut"].get("auto", {})
        print(f"\nauto: keep ratio {a.get('keep_ratio')}, tiers {a.get('tier_histogram')}")
    if res.get("lossless_vs_full"):
        print(f"lossless vs full verify (token for token): {res['lossless_vs_full']}")
    if res.get("cost_table_info"):
        print(f"cost table: {res['cost_table_info']}")
    if out_png:
        _plot(res, bs_list, modes, out_png)
        print(f"plot: {out_png}")


def _k(d: dict, b: int):
    return b if b in d else str(b)


def _plot(res, bs_list, modes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tok = res["tok_s"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in modes:
        ax.plot(bs_list, [tok[m][_k(tok[m], b)] for b in bs_list], marker="o", label=m,
                linewidth=2.5 if m == "auto" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs_list, [str(b) for b in bs_list])
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s")
    s = res.get("settings", {})
    ax.set_title(f"D-Cut: EAGLE3 steps {s.get('num_steps')}, topk {s.get('topk')}, "
                 f"{s.get('num_draft_tokens')} draft tokens")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def what_if(res: dict, verify_scale: float) -> None:
    """Re-plan ``auto`` on the saved cost table with the verify share scaled (no engines)."""
    table = res.get("cost_table")
    if not table:
        print("no cost table in the result; nothing to replay")
        return
    tiers = table["tiers"]
    print(f"what-if: tier costs with the (cost - cost at tier {tiers[0]}) part scaled by {verify_scale}")
    for bs, row in zip(table["batch_sizes"], table["step_ms"]):
        base = row[0]
        scaled = [base + (c - base) * verify_scale for c in row]
        print(f"  bs={bs:>3}: " + ", ".join(f"{t:g}:{c:.1f}ms" for t, c in zip(tiers, scaled)))


def main(argv=None):
    args = _parse_args(argv)
    if args.what_if:
        with open(args.what_if) as f:
            res = json.load(f)
        report(res, None)
        what_if(res, args.what_if_verify_scale)
        return
    res = run_bench(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    report(res, args.out)


if __name__ == "__main__":
    sys.exit(main())

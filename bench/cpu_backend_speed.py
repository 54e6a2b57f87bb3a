"""How much faster is the ``torch_sdpa`` backend than interpreted Triton for EAGLE3 on CPU?

Runs real SGLang (CPU testbed) twice on the same tiny target + EAGLE3 draft and the same prompts,
once with ``--attention-backend torch_sdpa`` and once with ``triton`` under
``TRITON_INTERPRET=1`` (the scheduler process inherits it), and prints decode throughput
(completion tokens per second of wall time, engine start-up and one warm-up request excluded),
the ratio, the mean accept lengths, and whether both runs produced identical tokens, and saves a
bar chart of the two throughputs (PNG, ``--out``). Both engines run in this one invocation, so the
ratio is measured under the same machine load.

Goal (issue 3): ratio >= 10x. Run, from the repository root:

    OMP_NUM_THREADS=1 python bench/cpu_backend_speed.py [--prompts 4] [--tokens 16]
        [--topk 1 --steps 3 --draft-tokens 4] [--fit-steps 400] [--models DIR]
        [--out bench/out/cpu_backend_speed.png]

Interpreted Triton is slow: the defaults take a few minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS

DEFAULT_OUT = os.path.join("bench", "out", "cpu_backend_speed.png")
GOAL_RATIO = 10.0


def _prompts(target_dir: str, num: int, seed: int = 0) -> list:
    """``num`` prompts from the distribution the tiny draft is fitted on (4 ordinary token ids)."""
    import json

    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(target_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, num, 4, seed=seed).tolist()


def _run(models, backend: str, prompts: list, tokens: int, spec: dict) -> dict:
    """Start an engine, warm it up, time one batched greedy generation; returns the stats."""
    import sglang

    previous = os.environ.get("TRITON_INTERPRET")
    if backend == "triton":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        engine = sglang.Engine(model_path=models.target, attention_backend=backend,
                               max_running_requests=len(prompts), **spec, **CPU_ENGINE_KWARGS)
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    params = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}
    try:
        engine.generate(input_ids=[prompts[0]], sampling_params=dict(params, max_new_tokens=4))
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=[list(p) for p in prompts], sampling_params=params)
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    verify = sum(o["meta_info"].get("spec_verify_ct", 0) or 0 for o in outs)
    return {
        "backend": backend,
        "wall_s": wall,
        "tokens_per_s": completion / wall,
        "accept": completion / verify if verify else float("nan"),
        "ids": [o["output_ids"] for o in outs],
    }


def _plot(results: list, ratio: float, title: str, path: str) -> None:
    """Bar chart of decode tokens/s per backend (log scale), annotated with the wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["backend"] + ("\n(interpreted)" if r["backend"] == "triton" else "") for r in results]
    tps = [r["tokens_per_s"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    bars = ax.bar(names, tps, color=["tab:blue", "tab:gray"])
    for bar, r in zip(bars, results):
        ax.annotate(f"{r['tokens_per_s']:.1f} tok/s\n{r['wall_s']:.2f} s", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.axhline(tps[1] * GOAL_RATIO, color="tab:red", linestyle="--", linewidth=1,
               label=f"goal: {GOAL_RATIO:g}x interpreted triton")
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(tps) / 4, top=max(tps + [tps[1] * GOAL_RATIO]) * 4)
    ax.set_ylabel("decode throughput (completion tokens / s)")
    ax.set_title(f"torch_sdpa / interpreted triton: {ratio:.1f}x", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--fit-steps", type=int, default=400, help="draft fit steps (0: random draft)")
    ap.add_argument("--models", default=None, help="tiny model directory (built there if missing)")
    ap.add_argument("--out", "--png", dest="out", default=DEFAULT_OUT, help="PNG path ('' for no plot)")
    from sglang_ext.testbed.evaluate import refuse_config

    refuse_config(ap, "it launches its engines with the CPU testbed's fixed settings and its own flags "
                      "(--steps, --topk, --draft-tokens, ...)")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()

    from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

    os.environ.update(cpu_testbed_env())
    install()
    import sglang_ext
    from sglang_ext.testbed.tiny import build_tiny_models

    sglang_ext.load()
    out_dir = args.models or os.path.join(tempfile.gettempdir(), f"sglang_ext_tiny_fit{args.fit_steps}")
    models = build_tiny_models(out_dir, seed=0, fit_steps=args.fit_steps)
    prompts = _prompts(models.target, args.prompts)
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=models.draft,
                speculative_eagle_topk=args.topk, speculative_num_steps=args.steps,
                speculative_num_draft_tokens=args.draft_tokens)

    results = [_run(models, b, prompts, args.tokens, spec) for b in ("torch_sdpa", "triton")]
    setting = (f"EAGLE3 topk={args.topk} steps={args.steps} draft_tokens={args.draft_tokens}, "
               f"{args.prompts} prompts x {args.tokens} tokens, threads={torch.get_num_threads()}")
    print(setting)
    print(f"{'backend':<22}{'wall s':>10}{'tokens/s':>12}{'accept len':>12}")
    for r in results:
        name = r["backend"] + (" (interpreted)" if r["backend"] == "triton" else "")
        print(f"{name:<22}{r['wall_s']:>10.2f}{r['tokens_per_s']:>12.2f}{r['accept']:>12.2f}")
    ratio = results[0]["tokens_per_s"] / results[1]["tokens_per_s"]
    print(f"speed-up torch_sdpa / interpreted triton: {ratio:.1f}x (goal >= {GOAL_RATIO:g}x)")
    print(f"identical tokens: {results[0]['ids'] == results[1]['ids']}")
    if args.out:
        _plot(results, ratio, "CPU testbed, tiny models: " + setting, args.out)
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()

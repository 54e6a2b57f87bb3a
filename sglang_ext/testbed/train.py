"""Train the testbed models: target, then EAGLE3 draft, then SpecExit rows, then check.

    python -m sglang_ext.testbed.train --out runs/full --seed 0            # full run (1 thread)
    python -m sglang_ext.testbed.train --out runs/quick --seed 0 --quick   # throwaway model (< 3 min)
    python -m sglang_ext.testbed.train --estimate-time [--threads T]      # time of the full run

Every stage checkpoints into ``--out`` and is skipped when already complete, so
re-running the same command after an interruption resumes where it stopped.
``--export DIR`` copies the final ``target/`` and ``draft/`` directories to ``DIR``
(the committed weights live in ``sglang_ext/testbed/models/``).

``--threads`` (default 1) sets torch's intra-op threads. The committed weights were
produced with one thread; float reductions split over another number of threads
can round differently, so reproducing them bit for bit needs ``--threads 1``.
``--estimate-time`` times a few steps of every stage in the configuration of the run
(full, or ``--quick``) and prints the projected time (:mod:`sglang_ext.testbed.timing`);
it writes nothing into ``--out`` or the committed models.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Optional, Sequence

import torch

from sglang_ext.testbed.stages import STAGES, stage_config
from sglang_ext.testbed.train_target import train_target

def run(out_dir: str, seed: int, quick: bool = False, stages: Sequence[str] = STAGES,
        export: Optional[str] = None, progress: bool = True, threads: int = 1) -> dict:
    """Run (or resume) ``stages`` into ``out_dir``; returns the report (also ``report.json``).

    ``threads``: torch intra-op threads (the committed weights used 1; see module docstring).
    """
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    os.makedirs(out_dir, exist_ok=True)
    report = {"seed": seed, "quick": quick}
    if "target" in stages:
        rec = train_target(out_dir, seed, stage_config("shape", quick),
                           stage_config("target", quick), progress)
        report["target"] = {"final_loss": rec["losses"][-1], "eval": rec["evals"][-1]}
    if "traces" in stages:
        from sglang_ext.testbed.traces import build_traces

        report["traces"] = build_traces(out_dir, seed, stage_config("traces", quick), progress)
    if "draft" in stages:
        from sglang_ext.testbed.train_draft import train_draft

        rec = train_draft(out_dir, seed, stage_config("draft", quick), progress)
        report["draft"] = {"final_loss": rec["losses"][-1]}
    if "signals" in stages:
        from sglang_ext.testbed.train_signals import train_signals

        report["signals"] = train_signals(out_dir, seed, stage_config("signals", quick), progress)
    if "check" in stages:
        from sglang_ext.testbed.check import check_models

        report["check"] = check_models(out_dir, progress=progress)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    if export:
        for name in ("target", "draft"):
            dst = os.path.join(export, name)
            if os.path.exists(dst):
                shutil.rmtree(dst)
            shutil.copytree(os.path.join(out_dir, name), dst)
    return report


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="Train the testbed target, EAGLE3 draft and SpecExit rows.")
    ap.add_argument("--out", help="run directory (checkpoints, final models); required unless --estimate-time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny throwaway models (< 3 min)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"subset of {','.join(STAGES)}")
    ap.add_argument("--export", default=None, help="copy final target/ and draft/ here")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1; the committed weights were trained with 1, "
                         "and other counts can change float reductions, hence the weights, slightly)")
    ap.add_argument("--estimate-time", action="store_true",
                    help="do not train: time a few steps of every stage of this configuration and "
                         "print the projected time of the whole run (writes nothing)")
    ap.add_argument("--timed-steps", type=int, default=3,
                    help="with --estimate-time: timed units per stage (after one untimed warm-up)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.estimate_time:
        from sglang_ext.testbed.timing import estimate, format_table

        est = estimate(seed=args.seed, quick=args.quick, threads=args.threads,
                       timed_steps=args.timed_steps, progress=not args.no_progress)
        print(format_table(est))
        return
    if not args.out:
        ap.error("--out is required (unless --estimate-time)")
    stages = [s for s in args.stages.split(",") if s]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"unknown stage(s) {bad}; choose from {STAGES}")
    report = run(args.out, args.seed, args.quick, stages, args.export, not args.no_progress, args.threads)
    print(json.dumps({k: v for k, v in report.items() if k != "traces"}, indent=2))


if __name__ == "__main__":
    main()

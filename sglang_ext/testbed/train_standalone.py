"""A standalone draft for the testbed: a small language model of the target's family (``STANDALONE``).

SGLang's ``--speculative-algorithm STANDALONE`` drafts with an ordinary language model that shares
the target's tokenizer and vocabulary (Qwen3-0.6B for Qwen3-32B). The testbed's is the target's own
recipe (``train_target.py``: the same generated traces, phases and tokenizer) at a much smaller
shape, :data:`STANDALONE_SHAPE` -- 2 layers of hidden 96 against the target's 8 of 192, about 1/13
of its parameters -- without the target's auxiliary signal loss (that trains EAGLE3 features the
standalone draft does not have). Deterministic in ``seed``; resumable like the target.

Run (about 5 min on 2 cores)::

    python -m sglang_ext.testbed.train_standalone --out runs/standalone \\
        --export sglang_ext/testbed/models/standalone_draft
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Optional, Sequence

import torch

from sglang_ext.testbed.modeling import ModelShape
from sglang_ext.testbed.train_target import TargetTrainConfig, train_target

#: The standalone draft's shape (the target's is ``ModelShape()``: hidden 192, 8 layers, 3 heads).
STANDALONE_SHAPE = ModelShape(hidden_size=96, num_layers=2, num_heads=2, intermediate_size=256,
                              draft_intermediate_size=256)
#: The target's recipe without the auxiliary signal head (EAGLE3 features), fewer monitoring problems.
STANDALONE_CONFIG = TargetTrainConfig(aux_signal_weight=0.0, eval_problems=16)
#: Seed of the standalone draft (the target's run uses 0; another seed, another initialisation).
STANDALONE_SEED = 1


def train_standalone_draft(out_dir: str, seed: int = STANDALONE_SEED, progress: bool = True) -> str:
    """Train (or resume, or skip when done) the standalone draft; returns its HF directory."""
    train_target(out_dir, seed, STANDALONE_SHAPE, STANDALONE_CONFIG, progress)
    return os.path.join(out_dir, "target")


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sglang_ext.testbed.train_standalone", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="run directory (checkpoints, the final model)")
    ap.add_argument("--seed", type=int, default=STANDALONE_SEED)
    ap.add_argument("--export", default=None, help="copy the final model directory here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    final = train_standalone_draft(args.out, args.seed, progress=not args.no_progress)
    if args.export:
        if os.path.exists(args.export):
            shutil.rmtree(args.export)
        shutil.copytree(final, args.export)
        final = args.export
    print(final)


if __name__ == "__main__":
    main()

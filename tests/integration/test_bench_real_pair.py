"""The bench scripts on a pair of the project's recipe (no engine): which prompts they serve.

* ``bench/dcut_throughput.py --target T --draft D``: a draft with the recipe's ``split.json`` is
  measured on its held-out prompts (never trained on) through the target's chat template,
  repeated to fill the largest batch; a draft without one keeps the former choice.
* ``bench/real_model_cost.py --shapes``: unknown shapes stop with one line naming the choices.

Budget: < 10 s CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types

import bench_script
from transformers import AutoTokenizer

from sglang_ext.recipe import data as data_mod

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.path.join(ROOT, "sglang_ext", "testbed", "models", "target")
DRAFT = os.path.join(ROOT, "sglang_ext", "testbed", "models", "draft")


def test_recipe_draft_brings_its_heldout_prompts(tmp_path):
    bench = bench_script.load("dcut_throughput")
    draft = str(tmp_path / "draft")
    shutil.copytree(DRAFT, draft)
    held = [data_mod.Prompt(f"gsm:{i}", "gsm", f"Compute: {i} + {2 * i}") for i in range(3)]
    train = [data_mod.Prompt("gsm:9", "gsm", "Compute: 9 + 9")]
    data_mod.save_split({"train": train, "heldout": held}, os.path.join(draft, "split.json"))
    args = types.SimpleNamespace(target=TARGET, draft=draft, models=None)
    assert bench._resolve_models(args) == (TARGET, draft, "heldout")
    got = bench._prompts(TARGET, "heldout", 7, args)
    tok = AutoTokenizer.from_pretrained(TARGET)
    want = [tok(tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                        tokenize=False), add_special_tokens=False)["input_ids"] for p in held]
    assert got == [want[i % 3] for i in range(7)]
    assert tok.decode(got[1]).count("Compute: 1 + 2") == 1 and "9 + 9" not in tok.decode(sum(got, []))
    # the testbed draft (no split.json) keeps the testbed's problems
    args2 = types.SimpleNamespace(target=TARGET, draft=DRAFT, models=None)
    assert bench._resolve_models(args2)[2] == "problems"


def test_standalone_pair_gets_the_shipped_heldout_split(tmp_path):
    """--algorithm STANDALONE with a real target and a draft LM without a recipe split: the shipped
    SmolLM2 draft's 24 held-out prompts; the testbed target (word-level tokenizer) keeps its problems."""
    from sglang_ext.models.registry import SMOLLM2_EAGLE3

    bench = bench_script.load("dcut_throughput")
    real = tmp_path / "target"
    real.mkdir()
    (real / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    draft = str(tmp_path / "draft")
    os.mkdir(draft)
    args = types.SimpleNamespace(target=str(real), draft=draft, models=None, algorithm="STANDALONE", split=None)
    assert bench._resolve_models(args) == (str(real), draft, "heldout")
    assert args.split == os.path.join(SMOLLM2_EAGLE3.directory, "split.json") and os.path.isfile(args.split)
    testbed = types.SimpleNamespace(target=TARGET, draft=os.path.join(os.path.dirname(DRAFT), "standalone_draft"),
                                    models=None, algorithm="STANDALONE", split=None)
    assert bench._resolve_models(testbed)[2] == "problems" and testbed.split is None
    eagle = types.SimpleNamespace(target=str(real), draft=draft, models=None, algorithm="EAGLE3", split=None)
    assert bench._resolve_models(eagle)[2] == "corpus"  # no chat template: the tiny-model corpus, as before


def test_real_model_cost_refuses_unknown_shapes():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "real_model_cost.py"), "--shapes", "chain4,tree99"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "--shapes: unknown ['tree99']" in p.stderr and "chain8" in p.stderr
    assert "Traceback" not in p.stderr

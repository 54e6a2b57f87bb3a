"""``--speculative-algorithm STANDALONE`` with the plugin: a small LM of the target's family drafts.

Trained testbed target (3.64 M parameters) and its standalone draft
(``sglang_ext/testbed/models/standalone_draft``: the target's recipe at 2 layers of hidden 96,
``python -m sglang_ext.testbed.train_standalone``), a 3-step chain (4 verify tokens) and a tree (topk
2, 3 steps, 6 verify tokens), greedy, ``ignore_eos``, 8 held-out problems at once. One engine per
shape serves every check:

* lossless: with SpecExit off for the request (per-request ``custom_params``), ``--dcut auto``,
  every forced tier (0.25 / 0.5 / 0.75 / full) and draft-off steps forced on every other step give
  exactly HF transformers' greedy continuation of the target alone (no speculation);
* D-Cut pruned (its scores are the draft model's own token probabilities) and the draft accepted
  more than one token per step;
* SpecExit with the training-free signal (``--specexit-signal-source draft-confidence``): requests
  exit early, each output equal to the SpecExit-off one up to a paragraph boundary followed by the
  forced ``</think>``;
* bad combinations are refused at launch with one line, before any model is loaded: SpecExit's
  ``head`` signal source (a language-model draft has no signal rows), a draft whose tokenizer maps a
  token to another id.

Budget: ~3 min (two engine starts with a one-row profile; HF reference of 8 prompts).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from engine_utils import hf_greedy, make_engine
from trained_models import MODELS, requires_trained_models
from trained_models import held_out_prompts as _prompts

pytestmark = requires_trained_models

SA_DRAFT = os.path.join(MODELS, "standalone_draft")
TARGET = os.path.join(MODELS, "target")
BS = 8
MAX_NEW = 96
STOP = 4  # "</think>"
PARAGRAPH = "\n\n"
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
OFF = {"specexit_enable": False}


@pytest.fixture(scope="module")
def prompts():
    return _prompts(BS)


@pytest.fixture(scope="module")
def reference(prompts):
    return hf_greedy(TARGET, prompts, MAX_NEW)


@pytest.fixture(scope="module", params=[(1, 3, 4), (2, 3, 6)], ids=["chain", "tree-topk2"])
def engine(request, tmp_path_factory):
    if not os.path.isdir(SA_DRAFT):
        pytest.skip(f"no standalone draft in {SA_DRAFT}")
    topk, steps, n = request.param
    eng = make_engine(TARGET, attention_backend="torch_sdpa", speculative_algorithm="STANDALONE",
                      speculative_draft_model_path=SA_DRAFT, speculative_num_steps=steps, speculative_eagle_topk=topk,
                      speculative_num_draft_tokens=n, max_running_requests=BS, dcut="auto",
                      dcut_cache_dir=str(tmp_path_factory.mktemp("dcut_cache")), dcut_profile_batch_sizes=str(BS),
                      specexit=True, specexit_signal_source="draft-confidence",
                      specexit_step_split_tokens=json.dumps([PARAGRAPH]), specexit_confidence_threshold=0.9)
    try:
        yield eng
    finally:
        eng.shutdown()


def _state(eng):
    states = eng.get_server_info()["internal_states"]
    assert len(states) == 1
    return states[0]


def _gen(eng, prompts, custom):
    return eng.generate(input_ids=[list(p) for p in prompts],
                        sampling_params=[dict(GREEDY, custom_params=custom) for _ in prompts])


def test_standalone_is_lossless_under_every_tier(engine, prompts, reference):
    from sglang_ext.engine.dcut.client import set_force_draft_off, set_force_ratio

    tiers = {}
    try:
        for ratio in (0.0, 0.25, 0.5, 0.75, 1.0):  # 0.0: the configured auto
            assert set_force_ratio(engine, ratio)
            before = _state(engine)["dcut"]["metrics"]
            outs = _gen(engine, prompts, OFF)
            got = [o["output_ids"] for o in outs]
            bad = [i for i, (g, r) in enumerate(zip(got, reference)) if g != r]
            assert not bad, f"STANDALONE at ratio {ratio}: {len(bad)} of {BS} outputs differ from the target alone"
            after = _state(engine)["dcut"]["metrics"]
            tiers[ratio] = {"pruned": after["pruned_steps"] - before["pruned_steps"],
                            "steps": after["steps"] - before["steps"]}
            accept = sum(o["meta_info"]["completion_tokens"] for o in outs) / max(
                1, sum(o["meta_info"]["spec_verify_ct"] for o in outs))
            tiers[ratio]["accept"] = round(accept, 2)
        # draft-off steps (every other step without drafting; the draft extend runs in them)
        assert set_force_draft_off(engine, 2)
        before = _state(engine)["dcut"]["metrics"]
        got = [o["output_ids"] for o in _gen(engine, prompts, OFF)]
        after = _state(engine)["dcut"]["metrics"]
        assert got == reference, "STANDALONE with draft-off steps differs from the target alone"
        tiers["draft_off_steps"] = after["draft_off_steps"] - before["draft_off_steps"]
    finally:
        set_force_ratio(engine, 0.0)
        set_force_draft_off(engine, 0)
    print(f"STANDALONE per ratio: {tiers}")
    assert tiers["draft_off_steps"] > 0, tiers
    assert tiers[0.25]["pruned"] > 0 and tiers[1.0]["pruned"] == 0, tiers
    assert tiers[1.0]["accept"] > 1.5, tiers  # the small draft agrees with the target often


def test_standalone_specexit_draft_confidence_exits(engine, prompts):
    outs = _gen(engine, prompts + prompts, None)
    on, off = outs[:BS], _gen(engine, prompts, OFF)
    exited = 0
    for o, b in zip(on, off):
        ids, ref, meta = o["output_ids"], b["output_ids"], o["meta_info"]
        if not meta["specexit_exited"]:
            assert ids == ref
            continue
        exited += 1
        k = ids.index(STOP)
        assert ids[:k] == ref[:k] and ref[k] != STOP, "the exit is not a cut of the SpecExit-off output"
        assert meta["specexit_exit_reason"] == "signals"
    assert exited >= 1, "no request exited: SpecExit's draft-confidence signal never fired"
    info = _state(engine)["specexit"]
    assert info["method"] == "confidence" and info["exits_by_reason"]["signals"] >= exited


def test_standalone_refuses_the_head_signal_source():
    from sglang_ext.config import ConfigError
    from sglang_ext.engine.plugin import build_checked_config

    with pytest.raises(ConfigError) as e:
        build_checked_config({"specexit": True, "model_path": TARGET, "speculative_draft_model_path": SA_DRAFT},
                             "STANDALONE")
    msg = str(e.value)
    assert msg.startswith("--specexit-signal-source head:") and "draft-confidence" in msg and "\n" not in msg
    cfg = build_checked_config({"specexit": True, "specexit_signal_source": "draft-confidence", "dcut": "auto",
                                "model_path": TARGET, "speculative_draft_model_path": SA_DRAFT}, "STANDALONE")
    assert cfg.specexit.enabled and cfg.dcut.enabled


def test_standalone_refuses_a_draft_with_another_tokenizer(tmp_path):
    """Two tokens swap ids in the draft's tokenizer: refused at launch, naming the first of them."""
    from sglang_ext.config import ConfigError
    from sglang_ext.engine.plugin import build_checked_config

    if not os.path.isdir(SA_DRAFT):
        pytest.skip(f"no standalone draft in {SA_DRAFT}")
    bad = tmp_path / "draft"
    shutil.copytree(SA_DRAFT, bad)
    with open(bad / "tokenizer.json") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    a, b = "Step", " Step"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    with open(bad / "tokenizer.json", "w") as f:
        json.dump(tj, f)
    with pytest.raises(ConfigError) as e:
        build_checked_config({"dcut": "auto", "model_path": TARGET, "speculative_draft_model_path": str(bad)},
                             "STANDALONE")
    msg = str(e.value)
    assert msg.startswith("--speculative-draft-model-path: 2 of ") and "have other ids" in msg and "\n" not in msg
    assert build_checked_config({"dcut": "auto", "model_path": TARGET, "speculative_draft_model_path": SA_DRAFT},
                                "STANDALONE").dcut.enabled

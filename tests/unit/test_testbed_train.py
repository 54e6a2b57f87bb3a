"""Tests of the testbed training code in ``--quick`` mode (tiny throwaway models).

Runs the whole pipeline once (target, traces + labels, draft, signal rows, check) and
checks that the losses fall, that the checkpoints have the layouts SGLang loads, that
a finished run is skipped on re-run, and that an interrupted stage resumes to the
same weights as an uninterrupted one.  Also the time-estimate mode (``--estimate-time``) on
the quick configuration, ``--threads``, and the doctests of the refactored step functions.

Budget: < 3 min (the quick pipeline dominates; the quick time estimate adds < 30 s).
"""

import doctest
import hashlib
import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from sglang_ext.testbed import timing, train, train_target
from sglang_ext.testbed.modeling import QUICK_SHAPE, aux_layer_ids


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("quick"))
    report = train.run(out, seed=0, quick=True, progress=False)
    return out, report


def _mean(xs):
    return sum(xs) / len(xs)


def test_target_loss_decreases_and_config(quick_run):
    out, _ = quick_run
    rec = json.load(open(os.path.join(out, "target_record.json")))
    losses = rec["losses"]
    tc = train.stage_config("target", True)
    assert len(losses) == tc.steps + tc.arith_steps + tc.drill_steps
    phase1, phase2 = losses[: tc.steps], losses[tc.steps: tc.steps + tc.arith_steps]
    assert _mean(phase1[-5:]) < 0.6 * _mean(phase1[:5])
    assert _mean(phase2[-3:]) < _mean(phase2[:3])  # LM + auxiliary signal loss
    cfg = json.load(open(os.path.join(out, "target", "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == QUICK_SHAPE.num_layers >= 6
    assert cfg["hidden_size"] == QUICK_SHAPE.hidden_size and cfg["vocab_size"] == 256
    assert cfg["tie_word_embeddings"] is False
    sd = load_file(os.path.join(out, "target", "model.safetensors"))
    assert sd["model.embed_tokens.weight"].shape == (256, QUICK_SHAPE.hidden_size)
    assert sd["lm_head.weight"].shape == (256, QUICK_SHAPE.hidden_size)
    assert f"model.layers.{QUICK_SHAPE.num_layers - 1}.mlp.down_proj.weight" in sd
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert os.path.exists(os.path.join(out, "target", f)), f


def test_draft_loss_decreases_and_checkpoint_layout(quick_run):
    out, _ = quick_run
    rec = json.load(open(os.path.join(out, "draft_record.json")))
    assert _mean(rec["losses"][-4:]) < _mean(rec["losses"][:4])
    assert all(len(a) == 3 for a in rec["accs"])  # three TTT steps
    H = QUICK_SHAPE.hidden_size
    sd = load_file(os.path.join(out, "draft", "model.safetensors"))
    assert sd["fc.weight"].shape == (H + 3, 3 * H)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (H, 2 * H)
    assert sd["midlayer.mlp.down_proj.weight"].shape == (H, QUICK_SHAPE.draft_intermediate_size)
    assert sd["lm_head.weight"].shape == (256, H)
    assert sd["d2t"].shape == (256,) and sd["t2d"].shape == (256,)
    # signal rows were fitted (non-zero); token rows equal the draft stage's
    tokens = torch.load(os.path.join(out, "draft_tokens.pt"), weights_only=False)
    assert torch.equal(sd["fc.weight"][:H], tokens["sglang_state_dict"]["fc.weight"][:H])
    assert sd["fc.weight"][H:].abs().sum() > 0
    cfg = json.load(open(os.path.join(out, "draft", "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]  # SGLang's own name (the trainers' format)
    assert cfg["specexit_method"] == "confidence_progress_remain"
    assert cfg["draft_vocab_size"] == 256 and cfg["num_hidden_layers"] == 1
    ids = [i + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    assert ids == aux_layer_ids(QUICK_SHAPE.num_layers)


def test_report_and_checks(quick_run):
    out, report = quick_run
    chk = report["check"]
    assert chk["n"] == train.stage_config("traces", True).num_heldout
    assert 1.0 <= chk["accept_length"] <= 4.0
    assert 0.0 <= chk["progress_mae"] <= 1.0
    assert set(chk["pass"]) == {"accuracy", "mean_rechecks", "accept_length", "confidence_auc",
                                "progress_mae", "remain_within_30pct"}
    assert json.load(open(os.path.join(out, "report.json")))["check"] == chk


def test_finished_run_is_skipped(quick_run, monkeypatch):
    out, report = quick_run

    def boom(*a, **k):
        raise AssertionError("a finished stage was re-run")

    monkeypatch.setattr(train_target, "build_target", boom)
    again = train.run(out, seed=0, quick=True, stages=("target", "draft", "signals"), progress=False)
    assert again["target"] == report["target"]


def test_result_token_weights_mark_equation_results():
    from sglang_ext.testbed.common import encode_example
    from sglang_ext.testbed.task import parse_question
    from sglang_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    ex = encode_example(tok, parse_question("Compute: 7 + 4 - 9"), 0)
    _, labels, _ = train_target.collate([ex])
    w = train_target.result_token_weights(labels, tok.convert_tokens_to_ids(" ="),
                                          tok.convert_tokens_to_ids("."), 5.0)
    heavy = tok.decode([t for t, x in zip(labels[0].tolist(), w[0].tolist()) if x == 5.0])
    assert heavy == " 11 2"  # the results "11" and "2" of the two steps, nothing else
    assert (w[0][: ex.prompt_len] == 0).all()


def test_drill_batches_cut_after_the_result_paragraph():
    from sglang_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    ids, labels, lengths = train_target.drill_batch_for_step(tok, 0, 0, 16, (0.2, 0.3, 0.5), 0.25)
    close = tok.convert_tokens_to_ids("</think>")
    cut = 0
    for r in range(16):
        text = tok.decode(ids[r, : lengths[r]].tolist())
        if close in ids[r].tolist():
            continue
        cut += 1
        assert text.endswith(".\n\n") and text.split("\n\n")[-2].startswith("So the result is")
    assert 6 <= cut <= 16


def test_interrupted_target_resumes_to_identical_weights(tmp_path, monkeypatch):
    cfg = train_target.TargetTrainConfig(steps=5, batch_size=2, lr=3e-3, warmup=2, ckpt_every=2,
                                         eval_every=0, eval_problems=1, arith_steps=4, arith_warmup=1,
                                         drill_steps=2, drill_warmup=1, drill_batch_size=2)
    monkeypatch.setattr(train_target, "evaluate_target", lambda *a, **k: {"accuracy": 0.0})
    ref_dir, cut_dir = str(tmp_path / "ref"), str(tmp_path / "cut")
    train_target.train_target(ref_dir, 0, QUICK_SHAPE, cfg, progress=False)

    real_batch, real_arith = train_target.batch_for_step, train_target.arith_batch_for_step

    def interrupted(tok, seed, step, bs):  # phase 1, between checkpoints
        if step == 3:
            raise KeyboardInterrupt
        return real_batch(tok, seed, step, bs)

    def interrupted_arith(tok, seed, step, bs, weights):  # phase 2, between checkpoints
        if step == 3:
            raise KeyboardInterrupt
        return real_arith(tok, seed, step, bs, weights)

    monkeypatch.setattr(train_target, "batch_for_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_target.train_target(cut_dir, 0, QUICK_SHAPE, cfg, progress=False)
    monkeypatch.setattr(train_target, "batch_for_step", real_batch)
    monkeypatch.setattr(train_target, "arith_batch_for_step", interrupted_arith)
    with pytest.raises(KeyboardInterrupt):
        train_target.train_target(cut_dir, 0, QUICK_SHAPE, cfg, progress=False)
    assert not os.path.exists(os.path.join(cut_dir, "target"))
    monkeypatch.setattr(train_target, "arith_batch_for_step", real_arith)
    train_target.train_target(cut_dir, 0, QUICK_SHAPE, cfg, progress=False)
    rec = json.load(open(os.path.join(cut_dir, "target_record.json")))
    assert len(rec["losses"]) == 11
    a = load_file(os.path.join(ref_dir, "target", "model.safetensors"))
    b = load_file(os.path.join(cut_dir, "target", "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- time estimate

#: Stage rows of the estimate and their unit counts in the quick configuration, derived by
#: hand from ``train.stage_config(..., quick=True)``: target 40/10/6 steps (checkpoint every
#: 20: saves at 20, 40 | 10 | 6), no periodic eval (eval_every 0) so one final eval, traces
#: 8 train + 4 held-out problems, draft 20 steps (checkpoint every 10: 2 saves), signal fit
#: 30 iterations on 8 labelled traces, check on 4 held-out traces.
QUICK_COUNTS = {
    "target phase 1": 40, "target phase 2": 10, "target phase 3": 6, "target evals": 1,
    "greedy traces": 12, "draft features": 8, "draft": 20, "signal features": 8,
    "check": 4, "checkpoint saves": 2 + 1 + 1 + 2,
}


def _models_digest():
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(timing.MODELS_DIR)):
        for f in sorted(files):
            with open(os.path.join(root, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def quick_estimate():
    before = _models_digest()
    est = timing.estimate(seed=0, quick=True, threads=1, timed_steps=1, progress=False)
    assert _models_digest() == before, "the estimate wrote into the committed models"
    return est


def test_estimate_counts_units_of_the_quick_run(quick_estimate):
    rows = {r.stage: r for r in quick_estimate.rows}
    for stage, count in QUICK_COUNTS.items():
        assert rows[stage].count == count, stage
    fit = [r for r in quick_estimate.rows if r.stage.startswith("signal fit")]
    assert len(fit) == 1 and fit[0].count == 30 and fit[0].unit == "iter"
    labels = rows["forced-exit labels"]
    # reference traces with 1 re-check: >= 3 paragraph boundaries + the empty think span
    assert labels.count >= (8 + 4) * 4 and labels.timed >= 4


def test_estimate_projections_are_count_times_seconds(quick_estimate):
    est = quick_estimate
    assert est.threads == 1 and est.quick
    total = 0.0
    for r in est.rows:
        assert r.timed >= 1 and r.cpu_s >= 0 and r.wall_s > 0, r
        assert r.idle_min(1) == pytest.approx(r.count * r.cpu_s / 60)
        assert r.wall_min() == pytest.approx(r.count * r.wall_s / 60)
        total += r.count * r.cpu_s / 60
    for stage in ("target phase 1", "target phase 2", "target phase 3", "draft", "target evals"):
        assert next(r for r in est.rows if r.stage == stage).cpu_s > 0, stage
    assert est.total_idle_min() == pytest.approx(total) and total > 0
    assert est.total_wall_min() > 0


def test_estimate_cli_prints_every_stage_and_writes_nothing(quick_estimate, tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_estimate(**kw):
        seen.update(kw)
        return quick_estimate

    monkeypatch.setattr(timing, "estimate", fake_estimate)
    out = tmp_path / "run"
    train.main(["--estimate-time", "--quick", "--timed-steps", "1", "--no-progress", "--out", str(out)])
    assert seen == {"seed": 0, "quick": True, "threads": 1, "timed_steps": 1, "progress": False}
    assert not out.exists()
    text = capsys.readouterr().out
    lines = text.splitlines()
    printed = {}
    for line in lines:
        m = re.match(r"^(.+?)\s+(step|eval|problem|prompt|trace|iter|save)\s+(\d+)\s+(\d+)\s+"
                     r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
        if m:
            printed[m.group(1).strip()] = [float(x) for x in m.groups()[2:]]
    assert set(QUICK_COUNTS) | {"forced-exit labels"} <= set(printed), sorted(printed)
    assert len(printed) == len(quick_estimate.rows)
    for name, (count, timed, cpu, main, wall, idle_min, wall_min) in printed.items():
        assert idle_min == pytest.approx(count * cpu / 60, abs=0.006, rel=0.02), name
    total = [line for line in lines if line.startswith("total")]
    assert len(total) == 1
    idle_total, wall_total = (float(x) for x in total[0].split()[1:3])
    assert idle_total == pytest.approx(sum(v[5] for v in printed.values()), abs=0.01 * len(printed))
    assert idle_total > 0 and wall_total > 0
    assert "load average before" in text and "1 thread(s)" in text


def test_threads_option(tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "x"), "--threads", "0"])
    with pytest.raises(SystemExit):  # --out is required without --estimate-time
        train.main(["--quick"])
    calls = []
    monkeypatch.setattr(train.torch, "set_num_threads", calls.append)
    train.run(str(tmp_path / "none"), seed=0, quick=True, stages=(), progress=False, threads=2)
    train.run(str(tmp_path / "none"), seed=0, quick=True, stages=(), progress=False)
    assert calls == [2, 1]


def test_doctests_of_step_functions():
    for mod in (train_target, timing):
        res = doctest.testmod(mod)
        assert res.failed == 0 and res.attempted > 0, mod.__name__

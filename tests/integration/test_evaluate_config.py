"""``--config FILE`` on the project's CLIs that take server flags.

* ``python -m sglang_ext.testbed.evaluate --config configs/specexit_testbed_tuned.yaml`` applies the
  preset (draft shape, SpecExit settings, server sizes) through SGLang's own reader, and a flag on
  the command line wins over the file; checked on the resolved arguments and on the ``ServerArgs``
  and extension config they build (no engine run);
* the bench scripts, which set the server flags themselves, refuse ``--config`` with one line.

Budget: < 30 s (SGLang's parser built in-process; four bench parsers).
"""

from __future__ import annotations

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUNED = os.path.join(REPO, "configs", "specexit_testbed_tuned.yaml")


@pytest.fixture(scope="module")
def evaluate():
    import sglang_ext
    from sglang_ext.testbed import evaluate as ev

    sglang_ext.load()
    return ev


def test_evaluate_without_config_uses_sglang_defaults(evaluate):
    args, _ = evaluate.parse_args(["--problems", "p.jsonl"])
    assert args.speculative_algorithm is None and args.speculative_num_steps is None
    assert not args.specexit and args.specexit_smoothing in (None, "ewma")


def test_evaluate_applies_the_preset(evaluate):
    from sglang.srt.server_args import ServerArgs

    from sglang_ext.config import get_extension_config

    args, argv = evaluate.parse_args(["--problems", "p.jsonl", "--config", TUNED])
    assert "--config" not in argv
    # the preset's draft shape (not SGLang's automatic one) and server sizes
    assert args.speculative_algorithm == "EAGLE3"
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    assert args.max_running_requests == 64 and args.reasoning_parser == "qwen3-thinking"
    assert args.speculative_draft_model_path == evaluate.DEFAULT_DRAFT  # the file names none: the committed draft
    se = get_extension_config(ServerArgs.from_cli_args(args)).specexit
    assert se.enabled and se.method == "confidence_progress_remain"
    assert (se.smoothing, se.window) == ("paragraph_mean", 10)
    # the thresholds are re-tuned from time to time: compare with the file as YAML reads it
    import yaml

    with open(TUNED) as f:
        preset = yaml.safe_load(f)
    assert (se.confidence_threshold, se.progress_threshold, se.remain_threshold) == (
        float(preset["specexit-confidence-threshold"]),
        float(preset["specexit-progress-threshold"]),
        float(preset["specexit-remain-threshold"]),
    )
    assert 0.0 < se.progress_threshold < 1.0 and 0.0 < se.confidence_threshold < 1.0


@pytest.mark.parametrize("form", ["split", "equals"])
def test_evaluate_command_line_wins_over_the_file(evaluate, form):
    from sglang.srt.server_args import ServerArgs

    from sglang_ext.config import get_extension_config

    config = ["--config", TUNED] if form == "split" else [f"--config={TUNED}"]
    args, _ = evaluate.parse_args(["--specexit-window", "4", "--problems", "p.jsonl", *config,
                                   "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3"])
    assert (args.speculative_num_steps, args.speculative_num_draft_tokens) == (2, 3)
    se = get_extension_config(ServerArgs.from_cli_args(args)).specexit
    assert se.window == 4 and se.smoothing == "paragraph_mean"  # the override, and the file for the rest


def test_evaluate_bad_config_file_is_one_error(evaluate, tmp_path, capsys):
    bad = tmp_path / "preset.txt"
    bad.write_text("specexit: true\n")
    with pytest.raises(SystemExit) as e:
        evaluate.parse_args(["--problems", "p.jsonl", "--config", str(bad)])
    assert e.value.code == 2
    assert "--config" in capsys.readouterr().err


BENCH_PARSERS = {
    "dcut_throughput": lambda mod, argv: mod._parse_args(argv),
    "profile_cost": lambda mod, argv: mod._parse_args(argv),
    "specexit_eval": lambda mod, argv: mod.build_parser().parse_args(argv),
    "cpu_backend_speed": lambda mod, argv: mod.parse_args(argv),
}


@pytest.mark.parametrize("script", sorted(BENCH_PARSERS))
def test_bench_scripts_refuse_config(script, capsys):
    from bench_script import load

    mod = load(script)
    assert BENCH_PARSERS[script](mod, []) is not None  # the control: parses without --config
    with pytest.raises(SystemExit) as e:
        BENCH_PARSERS[script](mod, ["--config", TUNED])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--config" in err and "not supported" in err, err

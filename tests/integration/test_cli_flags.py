"""Extension flags on SGLang's stock launcher: --help, parsing into configs, bad values.

Budget: < 60 s (four launcher subprocesses of ~5 s each; the rest in-process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXPECTED_FLAGS = [
    "--specexit", "--specexit-method", "--specexit-smoothing", "--specexit-ewma-alpha", "--specexit-window",
    "--specexit-confidence-threshold", "--specexit-progress-threshold", "--specexit-remain-threshold",
    "--specexit-min-think-tokens", "--specexit-max-think-tokens", "--specexit-max-think-grace",
    "--specexit-stop-think-token", "--specexit-step-split-tokens", "--specexit-signal-source",
    "--dcut", "--dcut-tiers", "--dcut-cost-table", "--dcut-cache-dir", "--dcut-profile-steps",
    "--dcut-profile-warmup", "--dcut-profile-context-len", "--dcut-profile-batch-sizes",
]

BASE = ["--model-path", "unused-model"]
EAGLE3 = BASE + ["--speculative-algorithm", "EAGLE3"]

# (argv, flag that the one-line error must name)
INVALID = [
    (EAGLE3 + ["--specexit", "--specexit-method", "confidence_foo"], "--specexit-method"),
    (EAGLE3 + ["--specexit", "--specexit-method", "progress_progress"], "--specexit-method"),
    (EAGLE3 + ["--specexit", "--specexit-method", ""], "--specexit-method"),
    (EAGLE3 + ["--specexit", "--specexit-smoothing", "median"], "--specexit-smoothing"),
    (EAGLE3 + ["--specexit", "--specexit-ewma-alpha", "0"], "--specexit-ewma-alpha"),
    (EAGLE3 + ["--specexit", "--specexit-ewma-alpha", "1.5"], "--specexit-ewma-alpha"),
    (EAGLE3 + ["--specexit", "--specexit-confidence-threshold", "1.2"], "--specexit-confidence-threshold"),
    (EAGLE3 + ["--specexit", "--specexit-progress-threshold", "-0.1"], "--specexit-progress-threshold"),
    (EAGLE3 + ["--specexit", "--specexit-remain-threshold", "0"], "--specexit-remain-threshold"),
    (EAGLE3 + ["--specexit", "--specexit-window", "0"], "--specexit-window"),
    (EAGLE3 + ["--specexit", "--specexit-smoothing", "momentum", "--specexit-window", "1"], "--specexit-window"),
    (EAGLE3 + ["--specexit", "--specexit-min-think-tokens", "-3"], "--specexit-min-think-tokens"),
    (EAGLE3 + ["--specexit", "--specexit-max-think-tokens", "0"], "--specexit-max-think-tokens"),
    (EAGLE3 + ["--specexit", "--specexit-max-think-tokens", "many"], "--specexit-max-think-tokens"),
    (EAGLE3 + ["--specexit", "--specexit-step-split-tokens", "not json"], "--specexit-step-split-tokens"),
    (EAGLE3 + ["--specexit", "--specexit-step-split-tokens", "[]"], "--specexit-step-split-tokens"),
    (EAGLE3 + ["--specexit", "--specexit-signal-source", "logits"], "--specexit-signal-source"),
    (EAGLE3 + ["--specexit", "--specexit-signal-source", "draft-confidence", "--specexit-method", "progress"],
     "--specexit-signal-source"),
    (EAGLE3 + ["--specexit", "--specexit-signal-source", "draft-confidence", "--specexit-method",
               "confidence_remain"], "--specexit-signal-source"),
    (BASE + ["--specexit"], "--specexit"),
    (BASE + ["--speculative-algorithm", "NGRAM", "--specexit"], "--specexit"),
    (EAGLE3 + ["--dcut", "sometimes"], "--dcut"),
    (EAGLE3 + ["--dcut", "0"], "--dcut"),
    (EAGLE3 + ["--dcut", "1.5"], "--dcut"),
    (BASE + ["--dcut", "auto"], "--dcut"),
    (BASE + ["--speculative-algorithm", "NGRAM", "--dcut", "auto"], "--dcut"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-tiers", "0.5,0.25,1.0"], "--dcut-tiers"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-tiers", "0.25,0.5,0.75"], "--dcut-tiers"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-tiers", "0,0.5,1.0"], "--dcut-tiers"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-tiers", "0.5,0.5,1.0"], "--dcut-tiers"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-tiers", "a,b"], "--dcut-tiers"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-cost-table", "/nonexistent/table.json"], "--dcut-cost-table"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-profile-steps", "0"], "--dcut-profile-steps"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-profile-warmup", "-1"], "--dcut-profile-warmup"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-profile-batch-sizes", "8,4"], "--dcut-profile-batch-sizes"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-profile-batch-sizes", "0,4"], "--dcut-profile-batch-sizes"),
    (EAGLE3 + ["--dcut", "auto", "--dcut-profile-context-len", "0"], "--dcut-profile-context-len"),
    (EAGLE3 + ["--specexit", "--disaggregation-mode", "decode"], "--specexit"),
    (EAGLE3 + ["--dcut", "auto", "--disaggregation-mode", "prefill"], "--dcut"),
]


@pytest.fixture(scope="module")
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def _launcher(argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


def test_help_lists_every_extension_flag():
    res = _launcher(["--help"])
    assert res.returncode == 0, res.stderr[-2000:]
    for flag in EXPECTED_FLAGS:
        assert f"{flag} " in res.stdout or f"{flag}\n" in res.stdout, f"{flag} missing from --help"
    assert "sglang_ext SpecExit" in res.stdout and "sglang_ext D-Cut" in res.stdout


# one real launcher process in CI (~20 s each); every entry of INVALID is checked in-process below
@pytest.mark.parametrize("argv,flag", [INVALID[0], pytest.param(*INVALID[22], marks=pytest.mark.slow),
                                       pytest.param(*INVALID[26], marks=pytest.mark.slow)])
def test_launcher_rejects_bad_flag_with_one_line(argv, flag):
    res = _launcher(argv)
    assert res.returncode != 0
    err_lines = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(err_lines) == 1, res.stderr[-3000:]
    assert err_lines[0].startswith("sglang serve: error: " + flag + ":"), err_lines


def test_sglang_serve_takes_the_extension_flags():
    """SGLang's recommended entry point, ``sglang serve``, loads the plugin before parsing (its ``--help``
    is printed before plugins load, so that lists SGLang's flags only): a bad extension flag gets the same
    one line as with ``python -m sglang.launch_server``."""
    target = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_ext", "testbed", "models", "target")
    sglang_cli = os.path.join(os.path.dirname(sys.executable), "sglang")
    argv = ["serve", "--model-path", target, "--speculative-algorithm", "EAGLE3", "--specexit",
            "--specexit-window", "0"]
    res = subprocess.run([sglang_cli, *argv], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert res.returncode == 2, res.stderr[-3000:]
    err_lines = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert err_lines == ["sglang serve: error: --specexit-window: must be an integer in 1..256, got 0"], err_lines


@pytest.mark.parametrize("argv,flag", INVALID, ids=[f"{i}:{f}" for i, (_, f) in enumerate(INVALID)])
def test_bad_flags_fail_in_parsing(plugins_loaded, capsys, argv, flag):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit) as exc:
        prepare_server_args(list(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"sglang serve: error: {flag}:"), err[0]


def test_valid_flags_reach_server_args(plugins_loaded, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    table = tmp_path / "t.json"
    table.write_text("{}")
    sa = prepare_server_args(EAGLE3 + [
        "--specexit", "--specexit-method", "remain_confidence", "--specexit-smoothing", "paragraph_mean",
        "--specexit-window", "4", "--specexit-max-think-tokens", "300", "--specexit-step-split-tokens",
        json.dumps(["\n\n", ".\n\n"]), "--dcut", "0.5", "--dcut-tiers", "0.5,1.0", "--dcut-cost-table", str(table),
        "--dcut-profile-batch-sizes", "1,8"])
    se, dc = sa._specexit, sa._dcut
    assert se.enabled and se.method == "confidence_remain" and se.smoothing == "paragraph_mean"
    assert se.window == 4 and se.max_think_tokens == 300 and se.step_split_tokens == ("\n\n", ".\n\n")
    assert dc.mode == 0.5 and dc.fixed_ratio == 0.5 and dc.tiers == (0.5, 1.0)
    assert dc.cost_table == str(table) and dc.profile_batch_sizes == (1, 8)
    # frozen dataclasses
    with pytest.raises(Exception):
        se.window = 3


def test_draft_confidence_source_without_a_method_gets_the_confidence_method(plugins_loaded):
    """An unset --specexit-method follows --specexit-signal-source (draft-confidence has confidence only)."""
    from sglang.srt.server_args import prepare_server_args

    se = prepare_server_args(EAGLE3 + ["--specexit", "--specexit-signal-source", "draft-confidence"])._specexit
    assert se.enabled and se.signal_source == "draft-confidence" and se.method == "confidence"
    assert prepare_server_args(EAGLE3 + ["--specexit"])._specexit.method == "confidence_progress_remain"


def test_defaults_when_flags_absent(plugins_loaded):
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(EAGLE3)
    assert sa._specexit.enabled is False and sa._dcut.enabled is False
    assert sa._specexit.confidence_threshold == 0.8 and sa._specexit.progress_threshold == 0.3
    assert sa._specexit.remain_threshold == 200 and sa._specexit.ewma_alpha == 0.1
    assert sa._dcut.tiers == (0.25, 0.5, 0.75, 1.0) and sa._dcut.profile_steps == 5


def test_yaml_config_preset(plugins_loaded, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    cfg = tmp_path / "preset.yaml"
    cfg.write_text("model-path: unused-model\nspeculative-algorithm: EAGLE3\nspecexit: true\n"
                   "specexit-smoothing: mean\ndcut: auto\ndcut-tiers: 0.5,1.0\n")
    sa = prepare_server_args(["--config", str(cfg)])
    assert sa._specexit.enabled and sa._specexit.smoothing == "mean"
    assert sa._dcut.auto and sa._dcut.tiers == (0.5, 1.0)


def test_configs_survive_pickling_to_schedulers(plugins_loaded):
    import pickle

    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(EAGLE3 + ["--specexit", "--dcut", "auto"])
    sa2 = pickle.loads(pickle.dumps(sa))
    assert sa2._specexit == sa._specexit and sa2._dcut == sa._dcut and sa2._dcut.auto

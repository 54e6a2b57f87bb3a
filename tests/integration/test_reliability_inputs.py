"""Reliability: bad launcher flags, YAML presets and Engine keywords each fail with one clear error naming the field.

The tables live in ``reliability_cases.py``; the per-request ``custom_params`` table is sent to a
launched server in ``test_reliability_server.py``. Together with ``test_cli_flags.INVALID`` and
the preset test in ``test_presets.py`` they make the suite's bad-input count (>= 50, checked here).

Also here: the YAML spellings SGLang's ``--config`` reader alone would turn into arguments the
extension flags do not understand, which the preset hook (``patches/config_merger.md``) handles --
a YAML list for a list-valued flag (``dcut-tiers``, ``dcut-profile-batch-sizes``, ``specexit-method``,
``specexit-step-split-tokens``) means its comma string / '_'-joined method / JSON list, a boolean
word for the ``specexit`` switch is read as a boolean, YAML 1.1 ``off`` means off -- with the drift
guard of that hook. The refused spellings are in ``BAD_YAML``.

Budget: < 60 s (in-process argument parsing, ~20 s measured; ``sglang.Engine`` is refused before it
starts anything).
"""

from __future__ import annotations

import pytest

from reliability_cases import (BAD_CUSTOM_PARAMS, BAD_ENGINE_KWARGS, BAD_FLAGS, BAD_YAML, BAD_YAML_KEYS,
                               total_bad_inputs)


@pytest.fixture(scope="module")
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def _parse_error(capsys, argv):
    """The stderr lines of a refused ``prepare_server_args(argv)`` (asserts it exits with code 2)."""
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit) as exc:
        prepare_server_args(list(argv))
    assert exc.value.code == 2
    return [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.strip()]


def test_bad_input_count_meets_the_bar():
    from test_cli_flags import INVALID

    flags = [tuple(argv) for argv, _ in INVALID] + [tuple(argv) for argv, _ in BAD_FLAGS]
    assert len(set(flags)) == len(flags), "a launcher case is duplicated between test_cli_flags and BAD_FLAGS"
    yaml_bodies = [body for body, _ in BAD_YAML + BAD_YAML_KEYS]
    assert len(set(yaml_bodies)) == len(yaml_bodies)
    params = [repr(sorted(p.items())) for p, _ in BAD_CUSTOM_PARAMS]
    assert len(set(params)) == len(params)
    total = len(INVALID) + 1 + total_bad_inputs()  # + test_presets' invalid preset
    assert total >= 50, total
    assert total_bad_inputs() >= 50  # this suite alone, without the cases it reuses


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[f"{i}:{f}" for i, (_, f) in enumerate(BAD_FLAGS)])
def test_bad_flag_one_line_error(plugins_loaded, capsys, argv, flag):
    err = _parse_error(capsys, argv)
    assert len(err) == 1, err
    assert err[0].startswith(f"sglang serve: error: {flag}: "), err[0]


@pytest.mark.parametrize("body,flag", BAD_YAML, ids=[f"{i}:{f}" for i, (_, f) in enumerate(BAD_YAML)])
def test_bad_yaml_preset_one_line_error(plugins_loaded, capsys, tmp_path, body, flag):
    preset = tmp_path / "preset.yaml"
    preset.write_text(body)
    err = _parse_error(capsys, ["--config", str(preset)])
    assert len(err) == 1, err
    assert err[0].startswith(f"sglang serve: error: {flag}: "), err[0]


@pytest.mark.parametrize("body,key", BAD_YAML_KEYS, ids=[k for _, k in BAD_YAML_KEYS])
def test_misspelt_yaml_key_is_named(plugins_loaded, capsys, tmp_path, body, key):
    preset = tmp_path / "preset.yaml"
    preset.write_text(body)
    err = _parse_error(capsys, ["--config", str(preset)])
    assert err[-1].startswith("sglang serve: error: unrecognized arguments: ") and key in err[-1], err[-1]


@pytest.mark.parametrize("kwargs,flag", BAD_ENGINE_KWARGS,
                         ids=[f"{i}:{f}" for i, (_, f) in enumerate(BAD_ENGINE_KWARGS)])
def test_bad_engine_keyword_is_refused_before_launch(kwargs, flag):
    import sglang

    import sglang_ext
    from sglang_ext.config import ConfigError

    sglang_ext.load()
    with pytest.raises(ConfigError) as exc:
        sglang.Engine(model_path="unused-model", speculative_algorithm="EAGLE3", **kwargs)
    assert str(exc.value).startswith(f"{flag}: "), str(exc.value)


def test_custom_params_table_is_rejected_by_the_validator():
    """The same table the server test sends over HTTP, through the validation hook itself."""
    from sglang_ext.config import SpecExitConfig
    from sglang_ext.engine.specexit.hooks import validate_custom_params

    cfg = SpecExitConfig(enabled=True, method="confidence", signal_source="draft-confidence")
    for params, field in BAD_CUSTOM_PARAMS:
        with pytest.raises(ValueError) as exc:
            validate_custom_params(cfg, params)
        assert field in str(exc.value), (params, str(exc.value))
        assert str(exc.value).startswith("invalid SpecExit option "), str(exc.value)


# ----------------------------------------------------------------------------- YAML spellings that are accepted
_HEAD = "model-path: unused-model\nspeculative-algorithm: EAGLE3\n"


def _prepare(tmp_path, body):
    from sglang.srt.server_args import prepare_server_args

    preset = tmp_path / "preset.yaml"
    preset.write_text(body)
    return prepare_server_args(["--config", str(preset)])


@pytest.mark.parametrize("body,expected", [
    (_HEAD + "dcut: auto\ndcut-tiers: [0.5, 1.0]\n", {"tiers": (0.5, 1.0)}),
    (_HEAD + "dcut: auto\ndcut-tiers:\n  - 0.25\n  - 0.75\n  - 1\n", {"tiers": (0.25, 0.75, 1.0)}),
    (_HEAD + "dcut: auto\ndcut-profile-batch-sizes: [1, 8, 64]\n", {"profile_batch_sizes": (1, 8, 64)}),
    (_HEAD + "specexit: true\nspecexit-method: [remain, confidence]\n", {"method": "confidence_remain"}),
    (_HEAD + "specexit: true\nspecexit-step-split-tokens: [\"\\n\\n\", \".\\n\\n\"]\n",
     {"step_split_tokens": ("\n\n", ".\n\n")}),
], ids=["tiers-flow", "tiers-block", "batch-sizes", "method", "step-split-tokens"])
def test_yaml_list_for_a_list_valued_flag(plugins_loaded, tmp_path, body, expected):
    """A YAML list means what the comma string (the '_'-joined method, the JSON list) means."""
    sa = _prepare(tmp_path, body)
    for name, value in expected.items():
        cfg = sa._dcut if hasattr(sa._dcut, name) else sa._specexit
        assert getattr(cfg, name) == value, (name, getattr(cfg, name))


def test_yaml_list_and_command_line_string_agree(plugins_loaded, tmp_path):
    """The same values through the YAML list and through the command line give the same configs."""
    from sglang.srt.server_args import prepare_server_args

    sa = _prepare(tmp_path, _HEAD + "dcut: auto\ndcut-tiers: [0.5, 0.75, 1.0]\ndcut-profile-batch-sizes: [2, 4]\n")
    cli = prepare_server_args(["--model-path", "unused-model", "--speculative-algorithm", "EAGLE3", "--dcut", "auto",
                               "--dcut-tiers", "0.5,0.75,1.0", "--dcut-profile-batch-sizes", "2,4"])
    assert sa._dcut == cli._dcut and sa._dcut.tiers == (0.5, 0.75, 1.0)


@pytest.mark.parametrize("value,enabled", [("true", True), ("'on'", True), ("'yes'", True), ("1", True),
                                           ("false", False), ("off", False), ("'no'", False), ("0", False)])
def test_yaml_switch_takes_booleans_and_boolean_words(plugins_loaded, tmp_path, value, enabled):
    sa = _prepare(tmp_path, _HEAD + f"specexit: {value}\n")
    assert sa._specexit.enabled is enabled


@pytest.mark.parametrize("body", [_HEAD + "dcut: off\n", _HEAD + "specexit: true\nspecexit-max-think-tokens: off\n"],
                         ids=["dcut", "specexit-max-think-tokens"])
def test_yaml_off_means_off(plugins_loaded, tmp_path, body):
    sa = _prepare(tmp_path, body)
    assert sa._dcut.mode == "off" and sa._specexit.max_think_tokens is None


def test_other_keys_reach_sglang_unchanged(plugins_loaded, tmp_path):
    """The preset hook leaves SGLang's own keys (lists included) to SGLang's reader."""
    sa = _prepare(tmp_path, _HEAD + "specexit: true\ngc-threshold: [700, 10, 10]\nskip-server-warmup: true\n")
    assert list(sa.gc_threshold) == [700, 10, 10] and sa.skip_server_warmup is True and sa._specexit.enabled


# ----------------------------------------------------------------------------- drift guard (patches/config_merger.md)
def test_config_merger_target():
    """``ConfigArgumentMerger._convert_config_to_args(self, config)`` turns the whole YAML mapping into argv;
    it still spreads a list over several argv items and writes non-booleans as ``--key value`` (the reason for
    the hook), and ``prepare_server_args`` still builds the merger from its parser before ``parse_args``."""
    import inspect

    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    from sglang_ext.engine.plugin import HOOK_CONFIG_TO_ARGS

    assert HOOK_CONFIG_TO_ARGS == ("sglang.srt.utils.server_args_config_parser.ConfigArgumentMerger"
                                   "._convert_config_to_args")
    fn = inspect.unwrap(ConfigArgumentMerger._convert_config_to_args)
    assert list(inspect.signature(fn).parameters) == ["self", "config"]
    assert "self._convert_config_to_args(config_data)" in inspect.getsource(ConfigArgumentMerger.merge_config_with_args)
    assert "self.parser = parser" in inspect.getsource(ConfigArgumentMerger.__init__)
    import argparse

    stock = ConfigArgumentMerger(argparse.ArgumentParser())
    assert fn(stock, {"x": [1, 2], "y": "text"}) == ["--x", "1", "2", "--y", "text"]
    src = inspect.getsource(prepare_server_args)
    assert "ConfigArgumentMerger(parser)" in src and src.index("merge_config_with_args") < src.index("parse_args(")

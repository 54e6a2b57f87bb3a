"""Every preset under configs/ parses through SGLang's own --config path into valid extension configs.

Budget: < 30 s (in-process argument parsing, no model loads).
"""

import glob
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


@pytest.fixture(scope="module")
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def test_presets_exist():
    names = {os.path.basename(p) for p in PRESETS}
    assert {"cpu_demo.yaml", "qwen3_4b_thinking_specexit.yaml", "qwen3_8b_dflash_b16_dcut.yaml",
            "qwen3_4b_thinking_specexit_dcut.yaml", "specexit_testbed_tuned.yaml"} <= names


@pytest.mark.parametrize("path", PRESETS, ids=[os.path.basename(p) for p in PRESETS])
def test_preset_parses_and_validates(plugins_loaded, path):
    from sglang.srt.server_args import prepare_server_args

    with open(path) as f:
        raw = yaml.safe_load(f)
    argv = ["--config", path]
    if "model-path" not in raw:  # CPU presets get their models from the demo / command line
        argv += ["--model-path", "unused-model", "--speculative-draft-model-path", "unused-draft"]
    sa = prepare_server_args(argv)
    se, dc = sa._specexit, sa._dcut
    assert se.enabled == bool(raw.get("specexit", False))
    expected_dcut = raw.get("dcut", "off")
    assert dc.mode == (expected_dcut if isinstance(expected_dcut, str) else float(expected_dcut))
    assert se.enabled or dc.enabled, "a preset should switch on at least one feature"
    for key, value in raw.items():
        if key.startswith("specexit-") and key != "specexit-step-split-tokens":
            got = getattr(se, key[len("specexit-"):].replace("-", "_"))
            assert got == value or got == float(value), (key, got, value)
    if dc.enabled and "model-path" in raw:  # GPU D-Cut presets verify pruned trees with FLOPs saved
        assert sa.attention_backend == "flashinfer_dcut"


def test_invalid_preset_value_names_the_flag(plugins_loaded, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    bad = tmp_path / "bad.yaml"
    bad.write_text("model-path: m\nspeculative-algorithm: EAGLE3\nspecexit: true\nspecexit-window: 0\n")
    with pytest.raises(SystemExit):
        prepare_server_args(["--config", str(bad)])
    assert capsys.readouterr().err.strip().startswith("sglang serve: error: --specexit-window:")

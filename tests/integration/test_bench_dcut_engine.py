"""``bench/dcut_throughput.py`` end to end on engines: the EAGLE3 tree with 16 draft tokens (SGLang's
documented 3 steps / topk 4 / 16 tokens example), every mode, trained testbed models.

The acceptance run of D-Cut (bs 1-64, ``bench/README.md``) uses this shape; here one small batch
(bs 4, 16 new tokens, one repeat, launch-time profile of bs 1 and 4 only) checks that the command
runs, that every mode's output equals full verification token for token, that the fixed tiers
really verify fewer tokens (tier 0.25: at most ceil(bs * 16 * 0.25) per step), and that the report
and the PNG are written. Throughput figures are printed, never asserted (noisy host).

Budget: ~30 s (one engine start, profile of bs 1 and 4, 5 modes x 2 short runs; 24 s measured).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINED = os.path.join(ROOT, "sglang_ext", "testbed", "models")
MODES = ("full", "r0.25", "r0.5", "r0.75", "auto")
BS = 4
N = 16


@pytest.fixture(scope="module")
def tree16_run(tmp_path_factory):
    if not all(os.path.isfile(os.path.join(TRAINED, d, "config.json")) for d in ("target", "draft")):
        pytest.skip("trained testbed models are not in this checkout")
    tmp = tmp_path_factory.mktemp("bench_tree16")
    png, js = tmp / "tree16.png", tmp / "tree16.json"
    args = ["--num-steps", "3", "--topk", "4", "--num-draft-tokens", str(N), "--batch-sizes", str(BS),
            "--repeats", "1", "--max-new-tokens", "16", "--max-running-requests", str(BS), "--skip-no-spec",
            "--cache-dir", str(tmp / "cache"), "--out", str(png), "--json", str(js)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join("bench", "dcut_throughput.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(js) as f:
        res = json.load(f)
    return proc.stdout, res, png


def test_every_mode_is_lossless_and_measured(tree16_run):
    out, res, _ = tree16_run
    assert res["settings"]["topk"] == 4 and res["settings"]["num_steps"] == 3
    assert res["lossless_vs_full"] == {m: True for m in MODES}, res["lossless_vs_full"]
    for m in MODES:
        assert res["tok_s"][m][str(BS)] > 0, (m, res["tok_s"][m])
    assert re.search(r"^auto/full\s+[\d.]+$", out, re.M), out
    assert "paired ratios" in out and "lossless vs full verify" in out


def test_fixed_tiers_verify_fewer_tokens(tree16_run):
    _, res, _ = tree16_run
    stats = {m: res["dcut"][m][str(BS)] for m in MODES}
    full = stats["full"]
    assert full["steps"] > 0 and full["verified_tokens"] == full["full_tokens"], full
    for m, ratio in (("r0.25", 0.25), ("r0.5", 0.5), ("r0.75", 0.75)):
        st = stats[m]
        assert st["steps"] > 0 and st["pruned_steps"] > 0, (m, st)
        # a step of b requests verifies at most ceil(b * N * ratio) tokens (bonus slots included)
        assert st["verified_tokens"] <= math.ceil(BS * N * ratio) * st["steps"], (m, st)
        assert st["verified_tokens"] < st["full_tokens"], (m, st)
    assert sum(stats["auto"]["tier_histogram"].values()) == stats["auto"]["steps"]


def test_profile_and_plot_are_written(tree16_run):
    _, res, png = tree16_run
    assert res["cost_table_info"]["source"] == "profiled", res["cost_table_info"]
    assert res["cost_table"]["batch_sizes"][-1] == BS and res["cost_table"]["key"]["topk"] == 4
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

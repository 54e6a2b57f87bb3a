"""bench/specexit_eval.py runs end to end on a few held-out problems and writes its table, JSON and PNGs.

One subprocess run of the script as a user runs it (``--n 4 --repeats 1 --sweep 1 --budgets 16,64``:
the three variants, then the 7 methods x 4 smoothers on one problem, then the fixed budgets 16 and 64,
all on one engine with the committed trained testbed models), checked against the raw per-request
outcomes it saved (every budget's think spans within the budget, SpecExit's points against the
budget curve interpolated here, SGLang's ``max_thinking_tokens`` n/a on CPU with its reason), and
``--replot`` of its JSON; plus the argument checks that refuse to start (no engine).

Budget: < 2 min (one engine launch and ~45 short requests on a shared 2-core machine; the
argument checks take a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "specexit_eval.py")
PRESET = os.path.join(ROOT, "configs", "specexit_testbed_tuned.yaml")
MODELS = os.path.join(ROOT, "sglang_ext", "testbed", "models")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 4


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # set for the kernel tests of this session; a user's run has none
    return env


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _preset_request_options():
    """The preset's per-request SpecExit keys, read here from the YAML (not through the script)."""
    with open(PRESET) as f:
        raw = yaml.safe_load(f)
    server_only = {"specexit", "specexit-stop-think-token", "specexit-step-split-tokens", "specexit-signal-source"}
    return {k.replace("-", "_"): v for k, v in raw.items() if k.startswith("specexit-") and k not in server_only}


def test_tuned_preset_options_are_valid_custom_params():
    from sglang_ext.specexit.overrides import parse_overrides

    options = _preset_request_options()
    assert options, "the tuned preset sets no per-request SpecExit option"
    given = parse_overrides(options).given()
    assert set(given) == {k[len("specexit_"):] for k in options}


def test_missing_preset_is_an_error_naming_the_flag(tmp_path):
    missing = tmp_path / "no_such_preset.yaml"
    res = _run("--n", "1", "--tuned", str(missing), "--out", str(tmp_path / "x.json"), timeout=120)
    assert res.returncode != 0
    assert "--tuned" in res.stderr and "no_such_preset.yaml" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_sweep_larger_than_n_is_refused(tmp_path):
    res = _run("--n", "2", "--sweep", "3", "--out", str(tmp_path / "x.json"), timeout=120)
    assert res.returncode != 0 and "--sweep" in res.stderr


@pytest.mark.skipif(not os.path.isdir(os.path.join(MODELS, "draft")), reason="trained testbed models not found")
def test_script_end_to_end_small(tmp_path):
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    res = _run("--n", str(N), "--repeats", "1", "--sweep", "1", "--budgets", "16,64", "--out", str(out),
               "--png", str(png))
    assert res.returncode == 0, res.stderr[-4000:]
    # printed table: one row per variant, the oracle ratio and the verdict
    lines = res.stdout.splitlines()
    for name in ("baseline", "reference", "tuned"):
        assert any(line.startswith(name + " ") for line in lines), res.stdout
    assert any(line.startswith("oracle ratio") for line in lines)
    assert any(line.startswith("tuned preset") and "acceptance" in line for line in lines)
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "eval_sweep.png").read_bytes()[:8] == PNG_MAGIC

    record = json.loads(out.read_text())
    assert record["n"] == N
    assert record["tuned_custom_params"] == _preset_request_options()
    outcomes = record["outcomes"]
    base = outcomes["baseline"]
    ids = [o["id"] for o in base]
    assert len(ids) == N and len(set(ids)) == N
    assert not any(o["exited"] for o in base)
    assert all(o["correct"] for o in base), "the trained target solves these held-out problems"
    for name in ("reference", "tuned"):
        runs = outcomes[name]
        assert [o["id"] for o in runs] == ids
        assert any(o["exited"] for o in runs)
        for o, b in zip(runs, base):
            if o["exited"]:
                assert o["think_tokens"] < b["think_tokens"] and o["output_tokens"] < b["output_tokens"]
            else:
                assert o["output_tokens"] == b["output_tokens"]
        # ratios recomputed from the raw outcomes
        ratio = sum(o["output_tokens"] for o in runs) / sum(o["output_tokens"] for o in base)
        assert record[name]["tokens_ratio"] == pytest.approx(ratio)
        drop = 100.0 * (sum(o["correct"] for o in base) - sum(o["correct"] for o in runs)) / N
        assert record[name]["accuracy_drop_points"] == pytest.approx(drop)
        assert record[name]["latency_ratio"] > 0
    assert record["tuned"]["acceptance"]["met"] == (record["tuned"]["tokens_ratio"] <= 0.6
                                                    and record["tuned"]["accuracy_drop_points"] <= 1.0)
    assert 0.0 < record["oracle_ratio"] < 1.0

    sweep = record["sweep"]
    pairs = {(r["method"], r["smoothing"]) for r in sweep["rows"]}
    assert len(sweep["rows"]) == 28 and len(pairs) == 28
    assert {m for m, _ in pairs} == {"confidence", "progress", "remain", "confidence_progress", "confidence_remain",
                                     "progress_remain", "confidence_progress_remain"}
    assert {s for _, s in pairs} == {"ewma", "momentum", "mean", "paragraph_mean"}
    for row in sweep["rows"]:
        part = record["sweep_outcomes"][f"{row['method']}/{row['smoothing']}"]
        assert [o["id"] for o in part] == ids[:1]
        assert row["mean_output_tokens"] == part[0]["output_tokens"]
    assert any(r["exited_rate"] > 0 for r in sweep["rows"])
    assert sweep["baseline"]["exited_rate"] == 0

    # fixed budgets: SpecExit's guard as a plain budget stops thinking at exactly the budget
    entry = record["budgets"]["budget"]
    assert entry["status"] == "measured" and [r["budget"] for r in entry["rows"]] == [16, 64]
    for row in entry["rows"]:
        part = record["budget_outcomes"][f"budget/{row['budget']}"]
        assert [o["id"] for o in part] == ids
        assert all(o["think_tokens"] <= row["budget"] for o in part), part
        assert any(o["think_tokens"] == row["budget"] for o in part)  # the budget cut, not a natural end
        assert row["mean_output_tokens"] == pytest.approx(sum(o["output_tokens"] for o in part) / N)
        assert row["accuracy"] == pytest.approx(sum(o["correct"] for o in part) / N)
    # SGLang's max_thinking_tokens cannot run on the CPU testbed (its XGrammar bitmask apply is GPU-only)
    import torch

    if not torch.cuda.is_available():
        sgl = record["budgets"]["sglang_budget"]
        assert sgl["status"] == "n/a" and "Unsupported device: cpu" in sgl["reason"]
        assert "sglang_budget  n/a: SGLang's max_thinking_tokens needs --enable-strict-thinking" in res.stdout
    # SpecExit's points against the budget curve (budgets, then the baseline), interpolated here
    curve = sorted([(r["mean_output_tokens"], r["accuracy"]) for r in entry["rows"]]
                   + [(record["baseline"]["mean_output_tokens"], record["baseline"]["accuracy"])])
    for name in ("reference", "tuned"):
        x, y = record[name]["mean_output_tokens"], record[name]["accuracy"]
        seg = [(a, b) for a, b in zip(curve, curve[1:]) if a[0] <= x <= b[0]]
        line = next(ln for ln in lines if ln.startswith(f"{name}: accuracy "))
        if not seg:
            assert "outside the budget curve's token range" in line, line
            continue
        (x0, y0), (x1, y1) = seg[0]
        at = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y0
        assert f"budget curve {at:.3f} at equal tokens" in line and f"({y - at:+.3f})" in line, (line, at)
    assert (tmp_path / "eval_curves.png").read_bytes()[:8] == PNG_MAGIC

    # --replot: the same tables from the saved file, plots redrawn, no engine
    again = _run("--replot", str(out), "--png", str(tmp_path / "again.png"), timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    tables = lambda text: [ln for ln in text.splitlines() if not ln.startswith(("plot:", "json:"))]  # noqa: E731
    assert tables(again.stdout) == tables(res.stdout)
    assert (tmp_path / "again_sweep.png").read_bytes()[:8] == PNG_MAGIC

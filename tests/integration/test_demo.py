"""The README's main job (``scripts/demo.sh`` -> ``python -m sglang_ext.demo``) end to end.

A fresh run (empty D-Cut cache) serves the held-out problems with plain decoding, launches the CPU
server with EAGLE3 + SpecExit + D-Cut (its cost profile shown as a progress bar), answers the
question through the OpenAI-compatible API, prints the side-by-side report, is left running and is
then stopped with Ctrl-C (SIGINT, as a terminal sends it). Checked: at most 60 lines, the report's
rows and its ``SpecExit:`` / ``D-Cut:`` lines with figures that agree with the run (EAGLE3 equal to
plain decoding token for token, SpecExit exits and fewer thinking tokens at the same answers), no
traceback, ERROR, warning or crash report in the demo's output or its servers' logs, and SGLang's
clean shutdown. The slow tier runs ``--real`` (the real pair, fetched into the cache).

Budget: < 4 min (two server start-ups, 8 problems in three modes).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sglang_ext import demo

#: Lines a clean run never prints (SGLang's watchdog says "crashed" / "SIGQUIT" when a scheduler
#: dies before the launcher; a traceback, ERROR or warning means something failed or is noise).
FORBIDDEN = ("Traceback", "ERROR", "crashed", "SIGQUIT")
MAX_LINES = 60


def _run_demo(tmp_path, *extra, until="Server running at", timeout_s=900):
    log_dir = tmp_path / "logs"
    result = tmp_path / "result.json"
    # a fresh D-Cut cache (the profile runs); the real pair still comes from the user's model cache
    from sglang_ext.models import default_cache_dir

    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "xdg"),
               SGLANG_EXT_MODELS_DIR=default_cache_dir())
    proc = subprocess.Popen([sys.executable, "-m", "sglang_ext.demo", "--log-dir", str(log_dir), "--result-json",
                             str(result), "--keep-running", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=demo.REPO_ROOT, env=env,
                            # Ctrl-C in a terminal: SIGINT at its default disposition, which a test run
                            # started in the background (shell `&`: SIGINT ignored, inherited) lacks
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.time() + timeout_s
    try:
        for line in proc.stdout:  # until the demo says the server is left running
            lines.append(line)
            if line.startswith(until) or time.time() > deadline:
                break
        assert any(ln.startswith(until) for ln in lines), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    assert proc.returncode == 130 and "interrupted; server stopped" in output, output[-3000:]
    logs = {name: (log_dir / name).read_text() for name in ("plain.log", "spec.log")}
    return output, json.loads(result.read_text()), logs


def _check_clean(output, logs):
    assert len(output.splitlines()) <= MAX_LINES, output
    for name, text in (("demo output", output), *logs.items()):
        bad = [ln for ln in text.splitlines() if any(w in ln for w in FORBIDDEN)]
        assert not bad, f"{name}: {bad[:10]}"
    assert not [ln for ln in output.splitlines() if "Warning" in ln or "WARNING" in ln], output
    # the servers drained and exited on their own (SIGTERM to the launcher only), SGLang's clean shutdown
    for name, text in logs.items():
        assert "Gracefully exiting" in text, (name, text[-3000:])


def _report(output):
    lines = output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("mode "))
    rows = {ln[:27].strip(): ln[27:].split() for ln in lines[head + 1:head + 4]}
    assert list(rows) == ["plain decoding", "EAGLE3", "EAGLE3 + SpecExit + D-Cut"], lines[head:head + 4]
    summary = {ln.split(":")[0]: ln for ln in lines if ln.startswith(("SpecExit:", "D-Cut:", "Overall:"))}
    assert set(summary) == {"SpecExit", "D-Cut", "Overall"}, lines
    return rows, summary


def test_demo_reports_what_the_features_did_and_stops_cleanly_on_ctrl_c(tmp_path):
    output, result, logs = _run_demo(tmp_path)
    _check_clean(output, logs)
    assert "D-Cut cost profiling [" in output  # a fresh cache: the one-time profile, as a progress bar
    assert "6/6 batch sizes" in output
    rows, summary = _report(output)
    modes = result["modes"]
    plain, eagle, full = (modes[k] for k in ("plain decoding", "EAGLE3", "EAGLE3 + SpecExit + D-Cut"))
    n = len(demo.testbed_plan(demo.DEFAULT_QUESTION, demo.DEMO_CONFIG).questions)
    # greedy EAGLE3 at full verification decodes what plain decoding decodes
    assert result["identical_eagle3_plain"] == n and plain["output_tokens"] == eagle["output_tokens"]
    assert eagle["tiers"] == {"full": sum(eagle["tiers"].values())} and eagle["exits"] == 0
    assert sum(full["tiers"].values()) > 0 and "full" in eagle["tiers"]
    # the table prints the run's figures
    assert rows["plain decoding"][1] == str(plain["output_tokens"])
    assert rows["EAGLE3 + SpecExit + D-Cut"][1] == str(full["output_tokens"])
    if demo.pick_models().trained:
        # the trained tiny thinking model answers the demo question (7 + 4 - 2) and the problems
        assert "The answer is 9." in (result["answer"]["answer"] or ""), result["answer"]
        assert plain["correct"] == eagle["correct"] == full["correct"] == n
        assert full["exits"] >= n // 2 and full["think_tokens"] < eagle["think_tokens"]
        skipped = eagle["think_tokens"] - full["think_tokens"]
        assert summary["SpecExit"].startswith(f"SpecExit: ended thinking early on {full['exits']} of {n} requests, "
                                              f"{skipped} thinking tokens skipped")
    assert f"identical to plain decoding on {n}/{n} requests" in summary["D-Cut"]


@pytest.mark.slow
def test_demo_real_pair(tmp_path):
    output, result, logs = _run_demo(tmp_path, "--real", timeout_s=1500)
    _check_clean(output, logs)
    rows, summary = _report(output)
    n = len(demo.REAL_QUESTIONS)
    # not a thinking model: SpecExit says why it is inactive; D-Cut and EAGLE3 decode what plain decoding does
    assert result["specexit_inactive"] and summary["SpecExit"].startswith("SpecExit: inactive: ")
    assert result["identical_eagle3_plain"] == n
    assert summary["D-Cut"].endswith(f"with D-Cut on {n}/{n}")
    assert "Paris" in (result["answer"]["answer"] or "")

"""The small bench scripts run from the repository root, print their table and write their PNG.

``bench/dcut_planner_speed.py`` (pure torch) in CI with a few calls; ``bench/cpu_backend_speed.py``
(two engines, one with interpreted Triton) in the slow tier with one short prompt. The other bench
scripts have their own tests (``test_bench_specexit_eval.py``, ``test_bench_dcut_*.py``,
``test_dcut_profiling.py``).

Budget: < 20 s CI; slow tier < 4 min.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(script, args, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join("bench", script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_planner_speed_prints_every_row_and_writes_its_png(tmp_path):
    png = tmp_path / "planner.png"
    out = _run("dcut_planner_speed.py", ["--calls", "3", "--out", str(png)], timeout=120)
    rows = re.findall(r"^\s+(chains|trees)\s+bs=64 N=(\d+):.*median\s+([\d.]+) us\s+min\s+([\d.]+) us", out, re.M)
    assert [(kind, n) for kind, n, _, _ in rows] == [("chains", "16")] * 3 + [("trees", "60")] * 2, out
    assert all(float(med) > 0 and float(mn) > 0 and float(mn) <= float(med) for _, _, med, mn in rows)
    assert _is_png(png)


@pytest.mark.slow
def test_cpu_backend_speed_prints_the_ratio_and_writes_its_png(tmp_path):
    png = tmp_path / "backend.png"
    out = _run("cpu_backend_speed.py", ["--prompts", "1", "--tokens", "4", "--out", str(png)], timeout=600)
    ratio = re.search(r"speed-up torch_sdpa / interpreted triton: ([\d.]+)x", out)
    assert ratio and float(ratio.group(1)) > 0, out
    assert _is_png(png)

"""The example programs run against the CPU demo server (SpecExit + D-Cut on): an SGLang frontend
program (``sgl.function``) and an OpenAI client setting per-request SpecExit options.

Budget: < 4 min (one server start-up, a handful of requests).
"""

import json
import os
import subprocess
import sys

import pytest

from sglang_ext import demo

EXAMPLES = os.path.join(demo.REPO_ROOT, "examples")


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("demo_server") / "server.log")
    with demo.running_server(demo.pick_models(), log_path=log, timeout_s=420) as (url, _proc):
        yield url


def _run(script, url):
    res = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--url", url], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]


def test_frontend_program(demo_server):
    rows = _run("frontend_program.py", demo_server)
    assert len(rows) == 2
    assert all(r["completion_tokens"] and r["completion_tokens"] > 0 for r in rows)
    assert all(isinstance(r["completion"], str) and r["completion"] for r in rows)


def test_openai_custom_params(demo_server):
    rows = {r["variant"]: r for r in _run("openai_custom_params.py", demo_server)}
    assert rows["server defaults"]["ok"] and rows["SpecExit off for this request"]["ok"]
    assert rows["eager exit (low thresholds, mean smoother)"]["ok"]
    bad = rows["invalid option"]
    assert not bad["ok"] and bad["status"] == 400 and "specexit_window" in bad["error"]

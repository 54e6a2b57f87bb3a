"""The README's main job (``scripts/demo.sh`` -> ``python -m sglang_ext.demo``) end to end: a launched
CPU server with EAGLE3 + SpecExit + D-Cut answers through the OpenAI-compatible API; then Ctrl-C
(SIGINT, as a terminal sends it) stops it. The whole output (the demo's and the server's) has no
traceback, no ERROR line and no crash / SIGQUIT report of SGLang's subprocess watchdog.

Budget: < 4 min (one server start-up, one request).
"""

import json
import os
import signal
import subprocess
import sys
import time

from sglang_ext import demo

#: Lines a clean first run never prints (SGLang's watchdog says "crashed" / "SIGQUIT" when a scheduler
#: dies before the launcher; a traceback or ERROR means something failed).
FORBIDDEN = ("Traceback", "ERROR", "crashed", "SIGQUIT")


def test_demo_answers_and_stops_cleanly_on_ctrl_c(tmp_path):
    log = tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "sglang_ext.demo", "--log", str(log), "--timeout", "420",
                             "--keep-running"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=demo.REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            # Ctrl-C in a terminal: SIGINT at its default disposition, which a test run
                            # started in the background (shell `&`: SIGINT ignored, inherited) lacks
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.time() + 600
    try:
        for line in proc.stdout:  # until the demo says the server is left running
            lines.append(line)
            if line.startswith("[demo] server running at") or time.time() > deadline:
                break
        assert any(ln.startswith("[demo] server running at") for ln in lines), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    server_log = log.read_text() if log.exists() else ""
    assert proc.returncode == 130 and "[demo] interrupted; server stopped" in output, output[-3000:]
    results = [ln for ln in output.splitlines() if ln.startswith("[demo] RESULT ")]
    assert len(results) == 1, output[-2000:]
    out = json.loads(results[0][len("[demo] RESULT "):])
    assert out["completion_tokens"] > 0 and out["finish_reason"] in ("stop", "length")
    assert (out["reasoning"] or "") + (out["answer"] or "") != ""
    if demo.pick_models().trained:
        # the trained tiny thinking model answers the demo question (7 + 4 - 2)
        assert "The answer is 9." in (out["answer"] or ""), out
    # the server drained and exited on its own (SIGTERM to the launcher only), SGLang's clean shutdown
    assert "Gracefully exiting" in server_log, server_log[-3000:]
    for name, text in (("demo output", output), ("server log", server_log)):
        bad = [ln for ln in text.splitlines() if any(w in ln for w in FORBIDDEN)]
        assert not bad, f"{name}: {bad[:10]}"

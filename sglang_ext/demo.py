"""The README's main job: a CPU SGLang server with EAGLE3 + SpecExit + D-Cut answering a real request.

``python -m sglang_ext.demo [--keep-running] [--question "Compute: 7 + 4 - 2"]``

1. picks the models: the committed trained tiny thinking models (``sglang_ext/testbed/models``)
   when present, otherwise tiny random models built on the spot (``.cache/`` of the checkout);
2. launches ``python -m sglang.launch_server --config configs/cpu_demo.yaml ...`` in the CPU
   testbed environment (stand-ins on ``PYTHONPATH``, ``SGLANG_USE_CPU_ENGINE=1``);
3. asks one question through the OpenAI-compatible chat API and prints the reasoning, the answer
   and the token usage, then the extension's state from ``/server_info``;
4. stops the server (unless ``--keep-running``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(REPO_ROOT, "configs", "cpu_demo.yaml")
TRAINED_MODELS = os.path.join(REPO_ROOT, "sglang_ext", "testbed", "models")
TINY_CACHE = os.path.join(REPO_ROOT, ".cache", "tiny_models")
DEFAULT_QUESTION = "Compute: 7 + 4 - 2"
#: Seconds a server gets to drain and exit after SIGTERM (SGLang checks for it every 5 s).
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DemoModels:
    target: str
    draft: str
    trained: bool


def pick_models() -> DemoModels:
    target = os.path.join(TRAINED_MODELS, "target")
    draft = os.path.join(TRAINED_MODELS, "draft")
    if os.path.isfile(os.path.join(target, "config.json")) and os.path.isfile(os.path.join(draft, "config.json")):
        return DemoModels(target, draft, trained=True)
    from sglang_ext.testbed.tiny import build_tiny_models

    if not os.path.exists(os.path.join(TINY_CACHE, "DONE")):
        print("[demo] trained models not found; building tiny random models (about a minute) ...", flush=True)
    m = build_tiny_models(TINY_CACHE, seed=0, fit_steps=400)
    return DemoModels(m.target, m.draft, trained=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(models: DemoModels, port: int, extra: Optional[List[str]] = None,
                   config: str = DEMO_CONFIG, launcher: Optional[List[str]] = None) -> List[str]:
    """The server's command line; ``launcher`` replaces ``python -m sglang.launch_server`` (tests)."""
    launcher = list(launcher or [sys.executable, "-m", "sglang.launch_server"])
    cmd = launcher + ["--config", config, "--model-path", models.target,
                      "--speculative-draft-model-path", models.draft, "--host", "127.0.0.1", "--port", str(port)]
    if not models.trained:
        # the random tiny draft has no SpecExit rows: use the training-free signal
        cmd += ["--specexit-signal-source", "draft-confidence", "--specexit-method", "confidence"]
    return cmd + list(extra or [])


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import requests

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before becoming healthy")
        try:
            if requests.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"server not healthy after {timeout_s:.0f} s")


def ask(base_url: str, model: str, question: str, max_tokens: int = 512) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key="none")
    resp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                          temperature=0.0, max_tokens=max_tokens)
    msg = resp.choices[0].message
    return {"reasoning": getattr(msg, "reasoning_content", None), "answer": msg.content,
            "finish_reason": resp.choices[0].finish_reason,
            "completion_tokens": resp.usage.completion_tokens if resp.usage else None}


def extension_info(base_url: str) -> dict:
    import requests

    info = requests.get(base_url + "/server_info", timeout=10).json()
    keep = ("speculative_algorithm", "specexit", "dcut")
    return {k: v for k, v in info.items() if k.startswith("sglang_ext") or k in keep}


@contextlib.contextmanager
def running_server(models: DemoModels, extra: Optional[List[str]] = None, config: str = DEMO_CONFIG,
                   log_path: Optional[str] = None, timeout_s: float = 600.0, env: Optional[Dict[str, str]] = None,
                   launcher: Optional[List[str]] = None):
    """Launch the demo server in the CPU testbed environment; yields its base URL; stops it on exit.

    ``env`` adds environment variables of the server process (over the CPU testbed environment);
    ``launcher`` replaces ``python -m sglang.launch_server`` in the command line."""
    from sglang_ext.engine.cpu.standins import cpu_testbed_env

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = server_command(models, port, extra, config=config, launcher=launcher)
    print("[demo] launching:", " ".join(cmd), flush=True)
    proc_env = cpu_testbed_env()
    proc_env.update(env or {})
    log = open(log_path, "w") if log_path else None
    proc = subprocess.Popen(cmd, env=proc_env, stdout=log, stderr=subprocess.STDOUT if log else None,
                            start_new_session=True)
    try:
        wait_healthy(base_url, proc, timeout_s)
        yield base_url, proc
    finally:
        stop_server(proc)
        if log:
            log.close()


def stop_server(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a launched server the way SGLang shuts down cleanly.

    SIGTERM goes to the launcher process only: its tokenizer manager drains the running requests,
    stops its subprocess watchdog, asks the schedulers to exit (``ShutdownReq``) and then ends its
    process tree. Signalling the whole process group instead kills the scheduler first, which the
    watchdog reports as a crash ("Subprocess scheduler_0 ... crashed", SIGQUIT). Only a server that
    has not exited after ``timeout_s`` (or a second Ctrl-C) gets SIGKILL, to its whole group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            print(f"[demo] server did not stop within {timeout_s:.0f} s of SIGTERM; killing it", flush=True)
            _kill_group(proc.pid)
            proc.wait()
    _kill_group(proc.pid)  # anything of the server's session still alive


def _kill_group(pgid: int) -> None:
    if pgid <= 1:  # never signal init / every process (a fake or unstarted Popen)
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--question", default=DEFAULT_QUESTION)
    ap.add_argument("--config", default=DEMO_CONFIG, help="server preset (SGLang --config YAML)")
    ap.add_argument("--keep-running", action="store_true", help="leave the server up after the answer")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server to start")
    ap.add_argument("--log", default=None, help="file for the server's log (default: inherit the terminal)")
    args, extra = ap.parse_known_args(argv)

    models = pick_models()
    try:
        return _serve_and_ask(models, args, extra)
    except KeyboardInterrupt:  # Ctrl-C: running_server has already stopped the server cleanly
        print("\n[demo] interrupted; server stopped", flush=True)
        return 130


def _serve_and_ask(models: DemoModels, args: argparse.Namespace, extra: List[str]) -> int:
    with running_server(models, extra, args.config, args.log, args.timeout) as (base_url, proc):
        t0 = time.time()
        out = ask(base_url, models.target, args.question)
        out["latency_s"] = round(time.time() - t0, 3)
        reasoning = out["reasoning"] or ""
        shown = reasoning if len(reasoning) <= 600 else reasoning[:600] + f"... ({len(reasoning)} chars)"
        print("\n[demo] question:", args.question)
        print("[demo] reasoning:", json.dumps(shown))
        print("[demo] answer:", json.dumps(out["answer"]))
        print("[demo] completion tokens:", out["completion_tokens"], "finish:", out["finish_reason"],
              "latency_s:", out["latency_s"])
        print("[demo] server:", json.dumps(extension_info(base_url)))
        print("[demo] RESULT " + json.dumps(out), flush=True)
        if args.keep_running:
            print(f"[demo] server running at {base_url} (Ctrl-C to stop)", flush=True)
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

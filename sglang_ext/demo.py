"""The README's main job: a CPU SGLang server with EAGLE3 + SpecExit + D-Cut, and what they did.

``python -m sglang_ext.demo [--real] [--verbose] [--keep-running] [--question "Compute: 7 + 4 - 2"]``

1. picks the models: the committed trained tiny thinking models (``sglang_ext/testbed/models``;
   tiny random models built on the spot when they are missing), or with ``--real`` the real pair
   the project ships (SmolLM2-135M-Instruct and its EAGLE3 draft, fetched into the cache once);
2. serves a few questions with plain decoding (a server without speculation), to compare with;
3. launches ``sglang serve --config configs/cpu_demo.yaml ...`` (EAGLE3 + SpecExit + ``--dcut
   auto``) in the CPU testbed environment, with a progress bar for D-Cut's one-time cost profile;
4. asks the question through the OpenAI-compatible chat API and prints the answer;
5. runs the same questions as EAGLE3 alone (SpecExit off per request, D-Cut at full verification)
   and with both features, and prints the three side by side (``sglang_ext.demo_report``);
6. stops the server (unless ``--keep-running``).

The servers' logs go to files whose paths are printed (``--verbose`` also shows them live); a
server that fails to start has its log's tail printed.
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
from typing import Dict, List, Optional, Tuple

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
    return cmd + _signal_args(models) + list(extra or [])


def _signal_args(models: DemoModels) -> List[str]:
    """The random tiny draft has no SpecExit rows: it drives SpecExit with the training-free signal."""
    return [] if models.trained else ["--specexit-signal-source", "draft-confidence", "--specexit-method", "confidence"]


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


# ----------------------------------------------------------------------------- the demo's story
LOG_DIR = os.path.join(REPO_ROOT, ".cache", "demo")
#: Held-out testbed problems answered in each mode of the report.
REPORT_QUESTIONS = 8
REAL_QUESTIONS = ("What is the capital of France?", "Give three tips for staying healthy.",
                  "Explain what a prime number is in two sentences.", "Write a short poem about the sea.")
REAL_TARGET, REAL_DRAFT = "smollm2-135m-instruct", "smollm2-135m-instruct-eagle3"
#: Preset keys a plain-decoding server drops (``--speculative-*``, the extension's own).
SPEC_KEY_PREFIXES = ("speculative-", "specexit", "dcut")


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which (and the server log's tail when it is one)."""


@dataclass(frozen=True)
class Question:
    prompt_ids: Tuple[int, ...]
    answer: Optional[str]  # the expected answer (testbed problems); None for open questions


@dataclass
class DemoPlan:
    """What the demo serves and asks."""

    label: str
    models: DemoModels
    config: str  # the EAGLE3 + SpecExit + D-Cut preset
    overrides: Dict[str, object]  # preset keys replaced (None: dropped) for both servers
    questions: List[Question]
    chat_question: str
    max_new_tokens: int
    tokenizer: object
    think_close_id: Optional[int]


def testbed_plan(question: str, config: str) -> DemoPlan:
    import random

    from transformers import AutoTokenizer

    from sglang_ext.testbed import task

    models = pick_models()
    tok = AutoTokenizer.from_pretrained(models.target)
    problems = task.generate_problems(REPORT_QUESTIONS, random.Random("sglang_ext-demo"), "demo-")
    questions = [Question(tuple(tok.encode(task.prompt_text(p.question), add_special_tokens=False)), str(p.answer))
                 for p in problems]
    label = ("the trained testbed models (a 3.6 M-parameter thinking target and its EAGLE3 draft with SpecExit rows)"
             if models.trained else "tiny random models (the trained testbed models are missing)")
    return DemoPlan(label, models, config, {}, questions, question, 512, tok,
                    tok.convert_tokens_to_ids(task.THINK_CLOSE))


def real_plan(question: Optional[str], config: str) -> DemoPlan:
    from transformers import AutoTokenizer

    from sglang_ext import models as registry

    print("Fetching the real pair (first run: download and conversion, about a minute; then cached) ...", flush=True)
    bars = sys.stderr.isatty()  # tqdm bars only where they redraw in place
    target, draft = registry.fetch(REAL_TARGET, progress=bars), registry.fetch(REAL_DRAFT, progress=bars)
    tok = AutoTokenizer.from_pretrained(target)
    questions = [Question(tuple(tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                                   add_generation_prompt=True),
                                           add_special_tokens=False)), None) for q in REAL_QUESTIONS]
    # not a thinking model: no reasoning parser, and SpecExit starts inactive (the server says why); the
    # draft has no SpecExit rows, so its signal is the draft's confidence. Four questions at once: the
    # cost profile covers batch sizes 1 and 4 only.
    overrides = {"reasoning-parser": None, "specexit-signal-source": "draft-confidence",
                 "specexit-method": "confidence", "max-running-requests": 4, "dcut-profile-batch-sizes": "1,4"}
    return DemoPlan("SmolLM2-135M-Instruct and the project's EAGLE3 draft for it (the real pair it ships)",
                    DemoModels(target, draft, trained=True), config, overrides, questions,
                    question or REAL_QUESTIONS[0], 64, tok, None)


def write_config(base: str, path: str, overrides: Dict[str, object], plain: bool) -> str:
    """``base`` with ``overrides`` applied (None drops a key) and, for ``plain``, speculation removed."""
    import yaml

    with open(base) as f:
        cfg = yaml.safe_load(f) or {}
    for key, value in overrides.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    if plain:
        cfg = {k: v for k, v in cfg.items() if not k.startswith(SPEC_KEY_PREFIXES)}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def sglang_launcher() -> List[str]:
    """``sglang serve`` of this interpreter's environment (``python -m sglang.launch_server`` without it)."""
    script = os.path.join(os.path.dirname(sys.executable), "sglang")
    return [script, "serve"] if os.access(script, os.X_OK) else [sys.executable, "-m", "sglang.launch_server"]


def demo_command(plan: DemoPlan, config: str, launcher: List[str], plain: bool) -> List[str]:
    """A server of the demo (``DemoServer`` adds host and port); ``plain``: without the draft."""
    cmd = launcher + ["--config", config, "--model-path", plan.models.target]
    if not plain:
        cmd += ["--speculative-draft-model-path", plan.models.draft] + _signal_args(plan.models)
    return cmd


def _short(path: str) -> str:
    rel = os.path.relpath(path, os.getcwd())
    return path if rel.startswith("..") else rel


class DemoServer:
    """One launched SGLang server: its output goes to a log file (and the terminal with ``verbose``);
    the D-Cut profiling lines feed a progress bar while it starts."""

    def __init__(self, cmd: List[str], log_path: str, verbose: bool):
        import collections
        import threading

        from sglang_ext.demo_report import ProfileProgress
        from sglang_ext.engine.cpu.standins import cpu_testbed_env

        self.log_path = log_path
        self.progress = ProfileProgress()
        self.tail = collections.deque(maxlen=30)
        self.cache_hit = False
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self._log = open(log_path, "w")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(self.port)], env=cpu_testbed_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     start_new_session=True)
        self._verbose = verbose
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self.tail.append(line.rstrip("\n"))
            self.progress.feed(line)
            self.cache_hit = self.cache_hit or "D-Cut: cost table reused from cache" in line
            if self._verbose:
                print("    | " + line.rstrip("\n"), flush=True)

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answers; a progress bar for the D-Cut profile meanwhile."""
        import requests

        from sglang_ext.demo_report import progress_bar

        t0 = time.time()
        tty = sys.stdout.isatty() and not self._verbose
        shown, profile_t0 = None, None
        while True:
            if self.proc.poll() is not None:
                self._fail(f"the server exited with code {self.proc.returncode} while starting")
            if time.time() - t0 > timeout_s:
                self._fail(f"the server did not start within {timeout_s:.0f} s")
            p = self.progress
            if p.started:
                profile_t0 = profile_t0 or time.time()
                state = (p.done, p.total)
                if tty or state != shown:
                    bar = progress_bar(p.done, p.total, p.left_s, time.time() - profile_t0)
                    print("\r" + bar if tty else bar, end="" if tty else "\n", flush=True)
                    shown = state
            try:
                if requests.get(self.base_url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(1.0)
        if tty and shown is not None:
            print(flush=True)
        return time.time() - t0

    def _fail(self, why: str) -> None:
        self.stop()
        tail = "\n".join("    | " + ln for ln in list(self.tail)[-20:])
        raise DemoError(f"{why}; the end of its log ({_short(self.log_path)}):\n{tail}")

    def stop(self) -> None:
        stop_server(self.proc)
        self._reader.join(timeout=10)
        self._log.close()


def generate_all(base_url: str, plan: DemoPlan, custom_params: Optional[dict] = None):
    """Every question of the plan at once (greedy), through ``POST /generate``; (outcomes, wall s)."""
    import concurrent.futures

    import requests

    from sglang_ext.demo_report import RequestOutcome
    from sglang_ext.testbed import task
    from sglang_ext.testbed.evaluate import think_tokens

    requests.post(base_url + "/flush_cache", timeout=60)  # no prefix-cache hits from the previous mode

    def one(q: Question) -> RequestOutcome:
        sampling = {"temperature": 0.0, "max_new_tokens": plan.max_new_tokens}
        if custom_params:
            sampling["custom_params"] = custom_params
        resp = requests.post(base_url + "/generate", json={"input_ids": list(q.prompt_ids), "sampling_params": sampling},
                             timeout=600)
        if resp.status_code != 200:
            raise DemoError(f"/generate answered HTTP {resp.status_code}: {resp.text[:300]}")
        out = resp.json()
        meta, ids = out["meta_info"], tuple(out.get("output_ids") or ())
        think = None if plan.think_close_id is None else think_tokens(ids, plan.think_close_id)
        correct = None if q.answer is None else task.parse_answer(out["text"]) == q.answer
        return RequestOutcome(ids, int(meta["completion_tokens"]), think, correct, bool(meta.get("specexit_exited")),
                              meta.get("spec_accept_length"))

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(plan.questions)) as pool:
        outcomes = list(pool.map(one, plan.questions))
    return outcomes, time.time() - t0


def tier_histogram(base_url: str) -> Dict[str, int]:
    from sglang_ext.engine.dcut.client import dcut_states

    states = dcut_states(base_url)
    return dict(states[0]["metrics"]["tier_histogram"]) if states else {}


def specexit_inactive_reason(base_url: str) -> Optional[str]:
    from sglang_ext.engine.dcut.client import server_info

    for state in server_info(base_url).get("internal_states") or []:
        se = state.get("specexit")
        if se is not None and se.get("active") is False:
            return str(se.get("inactive_reason") or "inactive")
    return None


def chat(base_url: str, plan: DemoPlan) -> Tuple[List[str], dict]:
    t0 = time.time()
    out = ask(base_url, plan.models.target, plan.chat_question, max_tokens=plan.max_new_tokens)
    out["latency_s"] = round(time.time() - t0, 3)
    lines = [f"Question: {plan.chat_question}"]
    reasoning = (out["reasoning"] or "").strip()
    if reasoning:
        first = reasoning.split("\n")[0]
        lines.append(f"Thinking: {first[:70]}{' ...' if len(first) > 70 or len(reasoning) > len(first) else ''}")
    answer = (out["answer"] or "").strip().replace("\n", " ")
    lines.append(f"Answer: {answer[:300]}{' ...' if len(answer) > 300 else ''}   "
                 f"({out['completion_tokens']} tokens, {out['latency_s']:.1f} s)")
    return lines, out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--question", default=None, help=f"the question to ask (default: {DEFAULT_QUESTION!r})")
    ap.add_argument("--real", action="store_true", help="the real pair the project ships (SmolLM2-135M-Instruct "
                                                        "and its EAGLE3 draft) instead of the testbed models")
    ap.add_argument("--config", default=DEMO_CONFIG, help="server preset (SGLang --config YAML)")
    ap.add_argument("--keep-running", action="store_true", help="leave the server up after the report")
    ap.add_argument("--verbose", action="store_true", help="show the servers' logs live")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a server gets to start")
    ap.add_argument("--log-dir", default=LOG_DIR, help="where the servers' logs go")
    ap.add_argument("--result-json", default=None, help="also write the answer and the report here (tests)")
    args, extra = ap.parse_known_args(argv)
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C: the servers have been stopped cleanly on the way out
        print("\ninterrupted; server stopped", flush=True)
        return 130
    except DemoError as e:
        print(f"demo failed: {e}", file=sys.stderr, flush=True)
        return 1


def _run(args: argparse.Namespace) -> int:
    import sglang

    from sglang_ext import demo_report as rep

    plan = real_plan(args.question, args.config) if args.real else testbed_plan(args.question or DEFAULT_QUESTION,
                                                                                   args.config)
    print(f"sglang_ext demo: SGLang {sglang.__version__} on CPU with {plan.label}", flush=True)
    print(f"Server logs: {_short(args.log_dir)}/ (plain.log, spec.log); --verbose shows them live", flush=True)
    launcher = sglang_launcher()
    modes = []

    plain_cfg = write_config(plan.config, os.path.join(args.log_dir, "plain.yaml"), plan.overrides, plain=True)
    cmd = demo_command(plan, plain_cfg, launcher, plain=True)
    print(f"\n[1/2] plain decoding, to compare with: {' '.join(_short(c) for c in cmd)}", flush=True)
    server = DemoServer(cmd, os.path.join(args.log_dir, "plain.log"), args.verbose)
    try:
        ready = server.wait_ready(args.timeout)
        generate_all(server.base_url, plan)  # warm-up: the first requests of a server pay one-time costs
        outcomes, wall = generate_all(server.base_url, plan)
        modes.append(rep.ModeReport(rep.PLAIN, outcomes, wall))
        print(f"      ready in {ready:.0f} s; {len(outcomes)} questions answered in {wall:.1f} s", flush=True)
    finally:
        server.stop()

    spec_cfg = plan.config if not plan.overrides else write_config(plan.config, os.path.join(args.log_dir, "spec.yaml"),
                                                                   plan.overrides, plain=False)
    cmd = demo_command(plan, spec_cfg, launcher, plain=False)
    print(f"\n[2/2] EAGLE3 + SpecExit + D-Cut: {' '.join(_short(c) for c in cmd)}", flush=True)
    server = DemoServer(cmd, os.path.join(args.log_dir, "spec.log"), args.verbose)
    try:
        ready = server.wait_ready(args.timeout)
        how = ("the D-Cut cost table came from the cache" if server.cache_hit else
               "the D-Cut cost table is profiled once per setup and cached" if server.progress.started else "")
        print(f"      ready in {ready:.0f} s{'; ' + how if how else ''}\n", flush=True)
        lines, answer = chat(server.base_url, plan)
        print("\n".join(lines), flush=True)
        from sglang_ext.engine.dcut.client import set_force_ratio

        set_force_ratio(server.base_url, 1.0)  # EAGLE3 alone: full verification ...
        before = tier_histogram(server.base_url)
        outcomes, wall = generate_all(server.base_url, plan, {"specexit_enable": False})  # ... and no SpecExit
        modes.append(rep.ModeReport(rep.EAGLE3, outcomes, wall, rep.tier_delta(before, tier_histogram(server.base_url))))
        set_force_ratio(server.base_url, 0.0)  # back to --dcut auto
        before = tier_histogram(server.base_url)
        outcomes, wall = generate_all(server.base_url, plan)
        modes.append(rep.ModeReport(rep.FULL, outcomes, wall, rep.tier_delta(before, tier_histogram(server.base_url))))
        inactive = specexit_inactive_reason(server.base_url)
        what = "held-out testbed problems" if plan.questions[0].answer is not None else "questions"
        print(f"\nSide by side on {len(plan.questions)} {what} (greedy, all at once; answers checked where known):")
        print("\n".join(rep.format_table(modes, specexit_active=inactive is None)))
        print("\n".join(rep.summary_lines(*modes, specexit_inactive=inactive)), flush=True)
        if args.result_json:
            with open(args.result_json, "w") as f:
                json.dump({"answer": answer, "modes": {m.name: {"output_tokens": m.output_tokens,
                                                                 "think_tokens": m.think_tokens, "correct": m.correct,
                                                                 "exits": m.exits, "wall_s": m.wall_s,
                                                                 "tiers": m.tiers} for m in modes},
                           "identical_eagle3_plain": rep.identical(modes[0], modes[1]),
                           "specexit_inactive": inactive}, f)
        if args.keep_running:
            print(f"\nServer running at {server.base_url} (OpenAI API at {server.base_url}/v1; Ctrl-C to stop)",
                  flush=True)
            server.proc.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SpecExit on held-out testbed problems: baseline vs reference defaults vs a tuned preset, side by side.

    python bench/specexit_eval.py                          # 200 problems, committed testbed models
    python bench/specexit_eval.py --n 50 --tuned configs/specexit_testbed_tuned.yaml --out eval.json
    python bench/specexit_eval.py --n 200 --sweep 50       # + all 7 methods x 4 smoothers on 50 problems
    python bench/specexit_eval.py --url http://127.0.0.1:30000 --n 50   # a running server, no engine here

One in-process ``sglang.Engine`` (EAGLE3 chain, 3 steps / 4 verify tokens, ``--specexit`` with the
reference defaults of docs/algorithms.md#specexit-defaults as server flags) serves three variants of the same
problems, one after the other (after a short warm-up, each from an empty prefix cache, ``--repeats`` passes in
the order A B C C B A so that the drift of a shared machine cancels out of the latency ratios), each
with all its requests in flight together (``--concurrency``):

* ``baseline``: EAGLE3 with SpecExit off for the request (``custom_params`` ``specexit_enable: false``);
* ``reference``: the server defaults (EWMA alpha 0.1, confidence > 0.8, progress > 0.3, remain < 200);
* ``tuned``: the ``specexit-*`` options of a preset YAML (``--tuned``, default
  ``configs/specexit_testbed_tuned.yaml``; the same keys as the launcher's ``--config`` files),
  sent per request as ``custom_params``. A missing preset file is an error.

``--sweep N`` then runs, on the same engine and the first ``N`` problems, every method combination
(7 subsets of confidence, progress, remain) x every smoother (4), each with the other options at
the server's reference defaults, next to a SpecExit-off baseline of the same problems, all in
flight together (per-request ``custom_params``); it prints a table of tokens ratio, accuracy and
exit rate per combination (latencies of a mixed batch are not comparable, so none are printed).

Problems come from ``sglang_ext.testbed.task`` with the RNG ``Random("specexit-eval-<seed>")``,
a stream the training pipeline never uses (it draws from ``sglang_ext-traces-*`` and
``sglang_ext-heldout-*``). Decoding is greedy; the prompt opens the think block.

Printed: a table with, per variant, ``accuracy``, mean output and think tokens, exit rate,
``before_answer`` (the share of requests that exited before the baseline had written its answer
paragraph), mean latency and wall time; for SpecExit variants also the tokens ratio (mean output
tokens / baseline), the accuracy drop (baseline - variant, in points) and the latency ratio
(baseline mean latency / variant mean latency, > 1 is faster); the oracle ratio (the baseline's
output tokens had thinking stopped right after the answer paragraph ``So the result is ...``, over
the baseline's) and the tuned preset's acceptance verdict (tokens ratio <= 0.6 and accuracy drop
<= 1 point, issue 7). ``--out`` (JSON: the summary and every outcome) and ``--png`` (bars of output
tokens, think tokens and latency per variant with the oracle line; with ``--sweep`` also
``<png>_sweep.png``) are written.

``--url http://host:port`` launches no engine: the same variants (and ``--sweep``) go to a running
SGLang server with the extension and ``--specexit`` as concurrent greedy ``POST /generate`` requests
(``input_ids``, the same per-request ``custom_params``), with ``/flush_cache`` before every pass;
only the request backend differs (:class:`EngineBackend` / :class:`HttpBackend`), the scoring
(:func:`score_output`, from ``meta_info``), summary, tables and plots are shared. A server whose
``/server_info`` has no SpecExit section ends the run with exit code 2. ``reference`` is then the
server's own SpecExit settings; the prompts' tokenizer is ``--target`` or the server's ``tokenizer_path``.

Fixed-budget peers (``--budgets``, default 16,32,48,64,96,128 tokens; ``''`` = none): after the
variants (and the sweep), every problem at every budget, all in flight together (accuracy and tokens
only), with SpecExit's max-think guard as a plain budget: the signal exit off (method ``confidence``,
threshold 1.0) and ``specexit_max_think_tokens = B`` with ``specexit_max_think_grace = 0`` sent per
request, so thinking stops at exactly ``B`` tokens unless it ends before. SGLang's own
``max_thinking_tokens`` request field (``--sglang-budgets``, default the same budgets) needs
``--enable-strict-thinking`` (else SGLang refuses the request), which makes every request carry the
XGrammar reasoner grammar; SGLang's XGrammar backend applies its token bitmask on cuda/xpu/musa/npu
only, so on the CPU testbed it is printed ``n/a`` with that reason (a tiny run dies in
``XGrammarGrammar.apply_vocab_mask`` with "Unsupported device: cpu"); with CUDA it runs on a second
engine launched with ``--enable-strict-thinking --reasoning-parser qwen3-thinking``, and with
``--url`` it is sent to the server as is (a refusal is recorded as ``n/a``). Printed: the curves,
accuracy against mean output tokens (the budgets, then the baseline as the no-budget end; SpecExit's
reference and tuned points), each budget's largest think span and share within the budget, and per
SpecExit point the budget curve's accuracy at the same mean tokens (linear between its points) and
the best budget point spending no more tokens; plotted in ``<png>_curves.png``.

``--replot JSON`` prints the tables of a saved ``--out`` file and redraws its plots (no engine).

Budget: about 5 min for 200 problems x 3 variants x 2 repeats plus ``--sweep 50`` on 2 shared CPU
cores (testbed models; measured 4.5 min at load average 5-7), most of it the engine launch and the
six passes; the six default budgets add about 1.5 min at 200 problems (20 problems, one repeat, the
budgets included: 52 s measured at load average 5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

#: The issue's acceptance bounds for the tuned preset.
MAX_TOKENS_RATIO = 0.6
MAX_ACCURACY_DROP_POINTS = 1.0
DEFAULT_TUNED = os.path.join(REPO, "configs", "specexit_testbed_tuned.yaml")
DEFAULT_OUT = os.path.join(REPO, "bench", "out", "specexit_eval.json")
DEFAULT_PNG = os.path.join(REPO, "bench", "out", "specexit_eval.png")
VARIANTS = ("baseline", "reference", "tuned")
#: New tokens per warm-up request (enough for the tuned preset to exit).
WARMUP_TOKENS = 64
#: How long a prefix-cache flush may wait for the scheduler to become idle.
FLUSH_TIMEOUT_S = 60.0
#: ``custom_params`` that switch SpecExit off for one request.
OFF = {"specexit_enable": False}
#: Default thinking budgets (tokens) of the fixed-budget peers; the testbed's think spans are ~150
#: tokens with the answer paragraph at ~30.
DEFAULT_BUDGETS = "16,32,48,64,96,128"
#: Names of the fixed-budget peers: the project's max-think guard as a plain budget, SGLang's
#: ``max_thinking_tokens`` request field.
BUDGET_KINDS = ("budget", "sglang_budget")


def budget_custom_params(budget: int) -> Dict[str, object]:
    """``custom_params`` of a plain thinking budget through SpecExit's max-think guard: the signal
    exit disabled (method ``confidence`` with threshold 1.0: an exit needs confidence > 1, never
    true) and ``specexit_max_think_tokens = budget`` with no grace, so thinking is cut exactly at
    ``budget`` tokens (the guard's forced exit) unless it ends before.

    Examples
    --------
    >>> budget_custom_params(64)["specexit_max_think_tokens"], budget_custom_params(64)["specexit_max_think_grace"]
    (64, 0)
    """
    return {"specexit_method": "confidence", "specexit_confidence_threshold": 1.0,
            "specexit_max_think_tokens": int(budget), "specexit_max_think_grace": 0}


def parse_budgets(text: str) -> List[int]:
    """``"16,32"`` -> ``[16, 32]`` (empty: no budget peers); raises SystemExit naming ``--budgets``.

    Examples
    --------
    >>> parse_budgets("32, 16"), parse_budgets("")
    ([16, 32], [])
    """
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--budgets: expected comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in out):
        raise SystemExit(f"--budgets: every budget must be >= 1, got {out}")
    return out


@dataclass
class Outcome:
    """One problem under one variant."""

    id: str
    answer: str
    predicted: Optional[str]
    correct: bool
    output_tokens: int
    think_tokens: int
    exited: bool
    exit_reason: Optional[str]
    oracle_think_tokens: Optional[int]
    latency_s: float


def held_out_problems(n: int, seed: int) -> List[dict]:
    """``n`` task problems from the evaluation RNG stream (never used in training).

    Examples
    --------
    >>> [p["id"] for p in held_out_problems(2, 7)]
    ['e7-0', 'e7-1']
    """
    from sglang_ext.testbed import task

    return [p.to_json() for p in task.generate_problems(n, random.Random(f"specexit-eval-{seed}"), f"e{seed}-")]


def training_problems(n: int, seed: int) -> List[dict]:
    """``n`` task problems of the training stream (the problems whose traces trained the committed
    testbed models' signal rows with ``--seed 0``): the split to tune SpecExit presets on.

    Examples
    --------
    >>> [p["id"] for p in training_problems(2, 0)]
    ['train-0', 'train-1']
    """
    from sglang_ext.testbed import task

    return [p.to_json() for p in task.generate_problems(n, random.Random(f"sglang_ext-traces-{seed}"), "train-")]


#: ``--split``: problem set -> (generator, default seed).
SPLITS = {"eval": (held_out_problems, 2026), "train": (training_problems, 0)}


def tune_grid() -> List[Tuple[str, Dict[str, object]]]:
    """The ``--tune`` candidates: smoother x window (alpha for EWMA) x confidence x progress thresholds.

    ``progress`` ``None`` tests confidence and remain only (method ``confidence_remain``); remain
    stays at the reference threshold (200 tokens, above every testbed think span).

    Examples
    --------
    >>> grid = tune_grid()
    >>> len(grid), grid[0][0]
    (96, 'paragraph_mean W5 c>0.7')
    """
    smoothers = [("paragraph_mean W5", {"specexit_smoothing": "paragraph_mean", "specexit_window": 5}),
                 ("paragraph_mean W10", {"specexit_smoothing": "paragraph_mean", "specexit_window": 10}),
                 ("mean W5", {"specexit_smoothing": "mean", "specexit_window": 5}),
                 ("mean W10", {"specexit_smoothing": "mean", "specexit_window": 10}),
                 ("momentum W5", {"specexit_smoothing": "momentum", "specexit_window": 5}),
                 ("momentum W10", {"specexit_smoothing": "momentum", "specexit_window": 10}),
                 ("ewma a0.3", {"specexit_smoothing": "ewma", "specexit_ewma_alpha": 0.3}),
                 ("ewma a0.5", {"specexit_smoothing": "ewma", "specexit_ewma_alpha": 0.5})]
    grid = []
    for name, smoothing in smoothers:
        for confidence in (0.7, 0.8, 0.9):
            for progress in (None, 0.1, 0.2, 0.3):
                params = dict(smoothing, specexit_confidence_threshold=confidence, specexit_remain_threshold=200)
                label = f"{name} c>{confidence}"
                if progress is None:
                    params["specexit_method"] = "confidence_remain"
                else:
                    params.update(specexit_method="confidence_progress_remain", specexit_progress_threshold=progress)
                    label += f" p>{progress}"
                grid.append((label, params))
    return grid


def pick_tuned(rows: Sequence[Mapping[str, object]], baseline: Mapping[str, object]) -> Optional[Mapping[str, object]]:
    """The candidate with the fewest mean output tokens among those that keep the baseline's
    accuracy and never exit before the baseline's answer paragraph (None if none does).

    Ties (candidates that exit at the same tokens) go to the most demanding test, which has the
    most margin on problems it was not tuned on: the highest confidence threshold, then the
    highest progress threshold (none lowest), then the widest window, then the label.

    Examples
    --------
    >>> rows = [{"label": "a", "accuracy": 1.0, "mean_output_tokens": 50.0, "before_answer_rate": 0.0,
    ...          "custom_params": {"specexit_confidence_threshold": 0.7}},
    ...         {"label": "b", "accuracy": 0.9, "mean_output_tokens": 30.0, "before_answer_rate": 0.0,
    ...          "custom_params": {}},
    ...         {"label": "c", "accuracy": 1.0, "mean_output_tokens": 40.0, "before_answer_rate": 0.1,
    ...          "custom_params": {}},
    ...         {"label": "d", "accuracy": 1.0, "mean_output_tokens": 50.0, "before_answer_rate": 0.0,
    ...          "custom_params": {"specexit_confidence_threshold": 0.9}}]
    >>> pick_tuned(rows, {"accuracy": 1.0})["label"]
    'd'
    """
    ok = [r for r in rows if r["accuracy"] >= baseline["accuracy"] and not r.get("before_answer_rate")]
    if not ok:
        return None
    fewest = min(r["mean_output_tokens"] for r in ok)

    def margin(r):
        params = r.get("custom_params") or {}
        progress = params.get("specexit_progress_threshold") if "progress" in str(params.get("specexit_method")) else None
        return (-float(params.get("specexit_confidence_threshold", 0.0)), -(-1.0 if progress is None else progress),
                -int(params.get("specexit_window", 0)), r["label"])

    return min((r for r in ok if r["mean_output_tokens"] <= fewest + 1e-9), key=margin)


def preset_custom_params(path: str) -> Dict[str, object]:
    """Per-request ``custom_params`` of the ``specexit-*`` options in a launcher preset YAML.

    Keys that are not per-request options (``specexit``, ``specexit-stop-think-token``, ...) and
    non-SpecExit keys are ignored. A missing file raises ``FileNotFoundError``.

    Examples
    --------
    >>> preset_custom_params(DEFAULT_TUNED)["specexit_smoothing"] in ("ewma", "momentum", "mean", "paragraph_mean")
    True
    """
    from sglang_ext.specexit.overrides import OPTION_FIELDS

    import yaml

    with open(path) as f:
        preset = yaml.safe_load(f) or {}
    out = {}
    for key, value in preset.items():
        name = str(key).replace("-", "_")
        if name.startswith("specexit_") and name[len("specexit_"):] in OPTION_FIELDS:
            out[name] = value
    return out


def sweep_combinations() -> List[Tuple[str, str]]:
    """Every (method, smoother) pair: 7 method subsets x 4 smoothers.

    Examples
    --------
    >>> combos = sweep_combinations()
    >>> len(combos), combos[0], combos[-1]
    (28, ('confidence', 'ewma'), ('confidence_progress_remain', 'paragraph_mean'))
    """
    from sglang_ext.specexit.defaults import SMOOTHING_NAMES
    from sglang_ext.specexit.signals import ALL_METHODS

    return [(m.name, s) for m in ALL_METHODS for s in SMOOTHING_NAMES]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="problems")
    ap.add_argument("--split", choices=sorted(SPLITS), default="eval",
                    help="eval: held-out problems (RNG 'specexit-eval-<seed>', never trained on); train: the "
                         "training stream ('sglang_ext-traces-<seed>'), the split to tune presets on")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed of the split (default: eval 2026, train 0)")
    ap.add_argument("--url", default=None, metavar="http://HOST:PORT",
                    help="no engine: send the requests to this running SGLang server (launched with the extension "
                         "and --specexit); exit code 2 if it has no SpecExit")
    ap.add_argument("--target", default=None,
                    help="target model (default: the committed testbed target); with --url only its tokenizer is "
                         "used (default: the server's tokenizer_path from /server_info)")
    ap.add_argument("--draft", default=None, help="EAGLE3 draft (default: the committed testbed draft; not with --url)")
    ap.add_argument("--tuned", default=DEFAULT_TUNED,
                    help=f"preset YAML of the tuned variant (default {os.path.relpath(DEFAULT_TUNED, REPO)})")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2,
                    help="passes per variant, in the order A B C C B A ... (latencies and walls are averaged; "
                         "tokens and accuracy come from the first pass, greedy decoding repeats them)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--sweep", type=int, default=0, metavar="N",
                    help="also run all 7 methods x 4 smoothers on the first N problems (0: no sweep)")
    ap.add_argument("--tune", type=int, default=0, metavar="N",
                    help="also run the tune_grid() candidates (smoother, window, thresholds) on the first N problems "
                         "and print the one with the fewest tokens at the baseline's accuracy (use with --split "
                         "train; 0: no tuning)")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS, metavar="B1,B2,...",
                    help="fixed thinking budgets (tokens) of the budget peers: SpecExit's max-think guard as a plain "
                         "budget (signal exit off, no grace), all problems of every budget in flight together "
                         "('' = none)")
    ap.add_argument("--sglang-budgets", default=None, metavar="B1,B2,...",
                    help="also SGLang's own max_thinking_tokens request field at these budgets (default: --budgets; "
                         "'' = none). It needs --enable-strict-thinking and a reasoning parser, so these requests go "
                         "to a second engine launched with them (with --url: to the server as is)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSON file with the summary and every outcome")
    ap.add_argument("--png", default=DEFAULT_PNG, help="plot file (the sweep's plot is <png>_sweep.png)")
    ap.add_argument("--replot", default=None, metavar="JSON",
                    help="no engine: print the tables of a saved --out file and write its plots to --png")
    from sglang_ext.testbed.evaluate import refuse_config

    refuse_config(ap, "the tuned variant's preset is --tuned FILE (its specexit-* options, sent per request); "
                      "to measure a server launched with `python -m sglang.launch_server --config FILE` use --url")
    return ap


def score_output(problem: Mapping[str, str], out: Mapping[str, object], latency_s: float, tok) -> Outcome:
    """One ``/generate`` result (``text``, ``output_ids``, ``meta_info``) of one problem, scored.

    The same for an in-process engine and a server URL: the answer parsed from the text, the
    output tokens from ``meta_info["completion_tokens"]``, the think tokens counted up to
    ``</think>`` in the output ids (re-tokenized text when the result has none) and the SpecExit
    fields the extension publishes in ``meta_info`` (``specexit_exited``, ``specexit_exit_reason``).

    Examples
    --------
    >>> class Tok:  # ids = characters; "|" closes the think block
    ...     def convert_tokens_to_ids(self, t): return ord("|")
    ...     def encode(self, text, add_special_tokens=False): return [ord(c) for c in text]
    ...     def decode(self, ids): return "".join(map(chr, ids))
    >>> out = {"text": "ab|The answer is 3.", "meta_info": {"completion_tokens": 18, "specexit_exited": True}}
    >>> o = score_output({"id": "p", "answer": "3"}, out, 0.5, Tok())
    >>> o.correct, o.output_tokens, o.think_tokens, o.exited
    (True, 18, 2, True)
    """
    from sglang_ext.testbed import task
    from sglang_ext.testbed.evaluate import oracle_think_tokens, think_tokens

    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)
    meta = out["meta_info"]
    text = out["text"]
    out_ids = out.get("output_ids") or tok.encode(text, add_special_tokens=False)
    predicted = task.parse_answer(text)
    return Outcome(id=problem["id"], answer=problem["answer"], predicted=predicted,
                   correct=predicted == problem["answer"], output_tokens=int(meta["completion_tokens"]),
                   think_tokens=think_tokens(out_ids, close_id), exited=bool(meta.get("specexit_exited")),
                   exit_reason=meta.get("specexit_exit_reason"),
                   oracle_think_tokens=oracle_think_tokens(tok, text), latency_s=latency_s)


class EngineBackend:
    """Requests to an in-process ``sglang.Engine`` (launched here, stopped by :meth:`close`)."""

    label = "one engine"

    def __init__(self, engine):
        self.engine = engine
        #: The engine's own event loop (its tokenizer manager runs there).
        self.loop = getattr(engine, "loop", None) or asyncio.get_event_loop()

    async def generate(self, input_ids: List[int], sampling: Mapping[str, object],
                       extra: Optional[Mapping[str, object]] = None) -> dict:
        """One request; ``extra``: top-level ``GenerateReqInput`` fields (e.g. ``max_thinking_tokens``)."""
        if not extra:
            return await self.engine.async_generate(input_ids=input_ids, sampling_params=dict(sampling))
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(input_ids=list(input_ids), sampling_params=dict(sampling), **dict(extra))
        out = None
        async for out in self.engine.tokenizer_manager.generate_request(obj, None):
            pass
        return out

    def flush(self, loop) -> Tuple[bool, str]:
        """Empty the prefix cache once the scheduler is idle (SGLang defers the flush up to the timeout)."""
        result = loop.run_until_complete(self.engine.tokenizer_manager.flush_cache(timeout_s=FLUSH_TIMEOUT_S))
        return bool(result.success), str(result.message)

    def server_info(self) -> dict:
        return self.engine.get_server_info()

    def close(self, loop) -> None:
        self.engine.shutdown()


class HttpBackend:
    """Requests to a running SGLang server: ``POST /generate``, ``/flush_cache``, ``GET /server_info``."""

    label = "server"

    def __init__(self, url: str, timeout_s: float = 3600.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = None
        self.loop = asyncio.new_event_loop()

    async def generate(self, input_ids: List[int], sampling: Mapping[str, object],
                       extra: Optional[Mapping[str, object]] = None) -> dict:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        body = {"input_ids": list(input_ids), "sampling_params": dict(sampling), **dict(extra or {})}
        async with self._session.post(self.url + "/generate", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.url}/generate: HTTP {resp.status}: {(await resp.text())[:500]}")
            return await resp.json(content_type=None)

    def flush(self, loop) -> Tuple[bool, str]:
        import requests

        resp = requests.post(self.url + "/flush_cache", params={"timeout": FLUSH_TIMEOUT_S},
                             timeout=FLUSH_TIMEOUT_S + 30)
        return resp.status_code == 200, resp.text.strip()

    def server_info(self) -> dict:
        import requests

        resp = requests.get(self.url + "/server_info", timeout=60)
        resp.raise_for_status()
        return resp.json()

    def close(self, loop) -> None:
        if self._session is not None:
            loop.run_until_complete(self._session.close())
            self._session = None
        self.loop.close()


def specexit_state(info: Mapping[str, object]) -> Optional[dict]:
    """The SpecExit section of a ``/server_info`` answer (None: the server runs without SpecExit).

    Examples
    --------
    >>> specexit_state({"internal_states": [{"specexit": {"enabled": True}}]})
    {'enabled': True}
    >>> specexit_state({"internal_states": [{}]}) is None
    True
    """
    for state in info.get("internal_states") or []:
        if isinstance(state, dict) and isinstance(state.get("specexit"), dict):
            return state["specexit"]
    return None


async def _run_requests(backend, tok, problems, prompts, params: Sequence[Optional[Mapping[str, object]]],
                        max_new_tokens, concurrency,
                        extras: Optional[Sequence[Optional[Mapping[str, object]]]] = None) -> List[Outcome]:
    """Every problem with its own ``custom_params`` (``None``: the server's settings), all in flight;
    ``extras``: per request, top-level request fields (SGLang's ``max_thinking_tokens``)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(problem, ids, custom, extra):
        sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
        if custom:
            sampling["custom_params"] = dict(custom)
        async with sem:
            t0 = time.perf_counter()
            out = await (backend.generate(ids, sampling, extra) if extra else backend.generate(ids, sampling))
            dt = time.perf_counter() - t0
        return score_output(problem, out, dt, tok)

    extras = list(extras) if extras is not None else [None] * len(problems)
    return list(await asyncio.gather(*(one(p, ids, c, e) for p, ids, c, e in zip(problems, prompts, params, extras))))


def before_answer_rate(outcomes: Sequence[Outcome], baseline: Optional[Sequence[Outcome]]) -> Optional[float]:
    """Share of requests that exited before the baseline had written its answer paragraph.

    Examples
    --------
    >>> base = [Outcome("a", "1", "1", True, 100, 80, False, None, 20, 1.0)]
    >>> before_answer_rate([Outcome("a", "1", "2", False, 30, 12, True, "signals", None, 0.5)], base)
    1.0
    """
    if not baseline or not outcomes:
        return None
    early = sum(o.exited and b.oracle_think_tokens is not None and o.think_tokens < b.oracle_think_tokens
                for o, b in zip(outcomes, baseline))
    return early / len(outcomes)


def summarize(outcomes: Sequence[Outcome], wall_s: float) -> Dict[str, object]:
    """Aggregate one variant.

    Examples
    --------
    >>> o = Outcome("a", "1", "1", True, 10, 6, True, "signals", 4, 0.5)
    >>> summarize([o], 1.0)["exited_rate"]
    1.0
    """
    n = len(outcomes)
    return {
        "n": n,
        "accuracy": sum(o.correct for o in outcomes) / n,
        "mean_output_tokens": sum(o.output_tokens for o in outcomes) / n,
        "mean_think_tokens": sum(o.think_tokens for o in outcomes) / n,
        "exited_rate": sum(o.exited for o in outcomes) / n,
        "mean_latency_s": sum(o.latency_s for o in outcomes) / n,
        "wall_s": wall_s,
    }


def oracle_ratio(baseline: Sequence[Outcome]) -> Optional[float]:
    """Output tokens had thinking stopped right after the answer paragraph, over the baseline's.

    Requests whose think span has no answer paragraph keep their baseline length.

    Examples
    --------
    >>> oracle_ratio([Outcome("a", "1", "1", True, 100, 80, False, None, 20, 1.0)])
    0.4
    """
    total = sum(o.output_tokens for o in baseline)
    if total == 0:
        return None
    cut = sum(o.output_tokens - (o.think_tokens - o.oracle_think_tokens) if o.oracle_think_tokens is not None
              and o.oracle_think_tokens <= o.think_tokens else o.output_tokens for o in baseline)
    return cut / total


def compare(summary: Dict[str, Dict[str, object]], names: Sequence[str] = VARIANTS[1:]) -> None:
    """Add ratios against ``summary["baseline"]`` to every SpecExit variant (in place) and the tuned verdict.

    Examples
    --------
    >>> s = {"baseline": {"mean_output_tokens": 100.0, "accuracy": 1.0, "mean_latency_s": 2.0, "wall_s": 4.0},
    ...      "tuned": {"mean_output_tokens": 50.0, "accuracy": 1.0, "mean_latency_s": 1.0, "wall_s": 2.0}}
    >>> compare(s); s["tuned"]["tokens_ratio"], s["tuned"]["acceptance"]["met"]
    (0.5, True)
    """
    base = summary.get("baseline")
    if base is None:
        return
    for name in names:
        s = summary.get(name)
        if not isinstance(s, dict):
            continue
        s["tokens_ratio"] = s["mean_output_tokens"] / base["mean_output_tokens"]
        s["accuracy_drop_points"] = 100.0 * (base["accuracy"] - s["accuracy"])
        if "mean_latency_s" in s:
            s["latency_ratio"] = base["mean_latency_s"] / s["mean_latency_s"] if s["mean_latency_s"] else None
            s["wall_ratio"] = base["wall_s"] / s["wall_s"] if s["wall_s"] else None
    tuned = summary.get("tuned")
    if isinstance(tuned, dict) and "tokens_ratio" in tuned:
        ok_tokens = tuned["tokens_ratio"] <= MAX_TOKENS_RATIO
        ok_acc = tuned["accuracy_drop_points"] <= MAX_ACCURACY_DROP_POINTS
        tuned["acceptance"] = {"tokens_ratio_ok": ok_tokens, "accuracy_drop_ok": ok_acc, "met": ok_tokens and ok_acc}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(summary: Mapping[str, object], variants: Sequence[str]) -> str:
    """The printed comparison table (one row per variant), the oracle ratio and the verdict."""
    head = (f"{'variant':<10} {'accuracy':>8} {'out tok':>8} {'think tok':>9} {'exited':>6} {'<answer':>7} "
            f"{'lat s':>6} {'wall s':>6} | {'tok ratio':>9} {'acc drop':>8} {'lat ratio':>9} {'wall ratio':>10}")
    lines = [head, "-" * len(head)]
    for name in variants:
        s = summary[name]
        lines.append(
            f"{name:<10} {s['accuracy']:>8.3f} {s['mean_output_tokens']:>8.1f} {s['mean_think_tokens']:>9.1f} "
            f"{s['exited_rate']:>6.2f} {_fmt(s.get('before_answer_rate'), '.2f'):>7} {s['mean_latency_s']:>6.2f} "
            f"{s['wall_s']:>6.2f} | {_fmt(s.get('tokens_ratio'), '.3f'):>9} "
            f"{_fmt(s.get('accuracy_drop_points'), '+.1f'):>8} {_fmt(s.get('latency_ratio'), '.2f'):>9} "
            f"{_fmt(s.get('wall_ratio'), '.2f'):>10}")
    lines.append("tok ratio = variant/baseline output tokens; acc drop in points (baseline - variant); "
                 "lat/wall ratio = baseline/variant (> 1: faster); <answer = exited before the baseline's answer "
                 "paragraph")
    if summary.get("oracle_ratio") is not None:
        lines.append(f"oracle ratio (thinking stopped right after the answer paragraph): {summary['oracle_ratio']:.3f}")
    tuned = summary.get("tuned")
    if isinstance(tuned, dict) and "acceptance" in tuned:
        acc = tuned["acceptance"]
        lines.append(f"tuned preset {summary.get('tuned_custom_params')}: tokens ratio {tuned['tokens_ratio']:.3f} "
                     f"(<= {MAX_TOKENS_RATIO}: {'yes' if acc['tokens_ratio_ok'] else 'NO'}), accuracy drop "
                     f"{tuned['accuracy_drop_points']:+.1f} points (<= {MAX_ACCURACY_DROP_POINTS:g}: "
                     f"{'yes' if acc['accuracy_drop_ok'] else 'NO'}) -> acceptance "
                     f"{'MET' if acc['met'] else 'NOT MET'}")
    return "\n".join(lines)


def format_sweep(sweep: Mapping[str, object]) -> str:
    """The printed table of the method x smoother sweep."""
    base = sweep["baseline"]
    head = (f"{'method':<28} {'smoother':<15} {'accuracy':>8} {'acc drop':>8} {'out tok':>8} {'tok ratio':>9} "
            f"{'think tok':>9} {'exited':>6} {'<answer':>7}")
    lines = [f"sweep on {sweep['n']} problems, other options at the server defaults "
             f"(EWMA alpha 0.1, W 10, confidence > 0.8, progress > 0.3, remain < 200)", head, "-" * len(head),
             f"{'(SpecExit off)':<28} {'-':<15} {base['accuracy']:>8.3f} {'-':>8} {base['mean_output_tokens']:>8.1f} "
             f"{'1.000':>9} {base['mean_think_tokens']:>9.1f} {base['exited_rate']:>6.2f} {'-':>7}"]
    for row in sweep["rows"]:
        lines.append(f"{row['method']:<28} {row['smoothing']:<15} {row['accuracy']:>8.3f} "
                     f"{row['accuracy_drop_points']:>+8.1f} {row['mean_output_tokens']:>8.1f} "
                     f"{row['tokens_ratio']:>9.3f} {row['mean_think_tokens']:>9.1f} {row['exited_rate']:>6.2f} "
                     f"{_fmt(row.get('before_answer_rate'), '.2f'):>7}")
    return "\n".join(lines)


def _plot(summary: Mapping[str, object], variants: Sequence[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("mean_output_tokens", "output tokens / request"), ("mean_think_tokens", "think tokens / request"),
              ("mean_latency_s", "latency s / request")]
    colors = {"baseline": "tab:gray", "reference": "tab:blue", "tuned": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(11, 4))
    for ax, (key, label) in zip(axes, panels):
        values = [summary[v][key] for v in variants]
        bars = ax.bar(variants, values, color=[colors.get(v, "tab:orange") for v in variants])
        for bar, v in zip(bars, variants):
            s = summary[v]
            note = f"{bar.get_height():.1f}" if key != "mean_latency_s" else f"{bar.get_height():.2f}"
            if v != "baseline" and key == "mean_output_tokens" and "tokens_ratio" in s:
                note += f"\n{s['tokens_ratio']:.2f}x, acc {s['accuracy']:.3f}"
            elif v != "baseline" and key == "mean_latency_s" and s.get("latency_ratio"):
                note += f"\n{s['latency_ratio']:.2f}x faster"
            elif v == "baseline" and key == "mean_output_tokens":
                note += f"\nacc {s['accuracy']:.3f}"
            ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8)
        if key == "mean_output_tokens" and summary.get("oracle_ratio") is not None and "baseline" in summary:
            oracle = summary["oracle_ratio"] * summary["baseline"]["mean_output_tokens"]
            ax.axhline(oracle, color="tab:red", linestyle="--", linewidth=1.2, label=f"oracle exit ({oracle:.1f})")
            ax.legend(fontsize=8, loc="lower left")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(0, max(values) * 1.3 if values and max(values) > 0 else 1)
        ax.grid(True, axis="y", alpha=0.3)
    where = f"server {summary['url']}" if summary.get("url") else "EAGLE3 chain 3/4, one engine"
    fig.suptitle(f"SpecExit on {summary['n']} held-out testbed problems (seed {summary['seed']}), {where}",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_sweep(sweep: Mapping[str, object], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sweep["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    smoothers = list(dict.fromkeys(r["smoothing"] for r in rows))
    cell = {(r["method"], r["smoothing"]): r for r in rows}
    grid = [[cell[(m, s)]["tokens_ratio"] for s in smoothers] for m in methods]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    im = ax.imshow(grid, cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto")
    for i, m in enumerate(methods):
        for j, s in enumerate(smoothers):
            r = cell[(m, s)]
            ax.text(j, i, f"{r['tokens_ratio']:.2f}\nacc {r['accuracy']:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if r["tokens_ratio"] < 0.35 else "white")
    ax.set_xticks(range(len(smoothers)), smoothers)
    ax.set_yticks(range(len(methods)), methods)
    fig.colorbar(im, ax=ax, label="output tokens / baseline")
    ax.set_title(f"SpecExit sweep, {sweep['n']} problems: tokens ratio and accuracy "
                 f"(baseline acc {sweep['baseline']['accuracy']:.2f})", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_png_path(png: str) -> str:
    """Where the sweep's plot goes next to the main plot.

    Examples
    --------
    >>> sweep_png_path("out/eval.png")
    'out/eval_sweep.png'
    """
    stem, ext = os.path.splitext(png)
    return f"{stem}_sweep{ext or '.png'}"


def _flush(backend, loop) -> bool:
    """Empty the prefix cache once the scheduler is idle; warn when it could not be flushed."""
    ok, message = backend.flush(loop)
    if not ok:
        print(f"[specexit_eval] warning: prefix cache not flushed ({message})", file=sys.stderr, flush=True)
    return ok


def _run_combos(loop, backend, tok, problems, prompts, combos: Sequence[Tuple[str, Mapping[str, object]]],
                max_new_tokens, concurrency) -> Tuple[dict, dict]:
    """Every ``(label, custom_params)`` combination and a SpecExit-off baseline on the same problems,
    all in flight together (SpecExit's per-token decisions do not depend on the batch)."""
    params: List[Optional[dict]] = [OFF] * len(problems)
    for _, custom in combos:
        params += [dict(custom)] * len(problems)
    n = len(problems)
    _flush(backend, loop)
    t0 = time.perf_counter()
    run = loop.run_until_complete(_run_requests(backend, tok, problems * (1 + len(combos)),
                                                prompts * (1 + len(combos)), params, max_new_tokens, concurrency))
    wall = time.perf_counter() - t0
    base = run[:n]
    result = {"n": n, "wall_s": wall, "baseline": summarize(base, wall), "rows": []}
    outcomes = {"baseline": base}
    for i, (label, custom) in enumerate(combos):
        part = run[(i + 1) * n:(i + 2) * n]
        row = {"label": label, "custom_params": dict(custom), **summarize(part, wall)}
        for key in ("mean_latency_s", "wall_s"):
            row.pop(key)
        row["before_answer_rate"] = before_answer_rate(part, base)
        result["rows"].append(row)
        outcomes[label] = part
    by_name = {"baseline": result["baseline"], **{str(i): r for i, r in enumerate(result["rows"])}}
    compare(by_name, [str(i) for i in range(len(combos))])
    return result, outcomes


def _run_sweep(loop, backend, tok, problems, prompts, max_new_tokens, concurrency) -> Tuple[dict, dict]:
    combos = [(f"{method}/{smoothing}", {"specexit_method": method, "specexit_smoothing": smoothing})
              for method, smoothing in sweep_combinations()]
    sweep, outcomes = _run_combos(loop, backend, tok, problems, prompts, combos, max_new_tokens, concurrency)
    for row in sweep["rows"]:
        row["method"], row["smoothing"] = row["custom_params"]["specexit_method"], row["custom_params"]["specexit_smoothing"]
    return sweep, outcomes


def format_tune(tune: Mapping[str, object]) -> str:
    """The printed table of a ``--tune`` run and its pick."""
    base = tune["baseline"]
    lines = [f"tuning on {tune['n']} {tune['split']} problems (seed {tune['seed']}): baseline accuracy "
             f"{base['accuracy']:.3f}, {base['mean_output_tokens']:.1f} output tokens",
             f"{'candidate':<34} {'accuracy':>8} {'tok ratio':>9} {'<answer':>7}"]
    for row in sorted(tune["rows"], key=lambda r: r["mean_output_tokens"]):
        lines.append(f"{row['label']:<34} {row['accuracy']:8.3f} "
                     f"{row['mean_output_tokens'] / base['mean_output_tokens']:9.3f} {row['before_answer_rate'] or 0:7.2f}")
    pick = tune.get("pick")
    lines.append("pick: " + (f"{pick['label']} {json.dumps(pick['custom_params'])}" if pick else
                             "none keeps the baseline's accuracy"))
    return "\n".join(lines)


#: Why SGLang's ``max_thinking_tokens`` cannot run on the CPU testbed (checked in SGLang 0.5.23's source
#: and with a tiny run): the field needs ``--enable-strict-thinking``, which gives every request the
#: reasoner grammar of the XGrammar backend, whose token-bitmask apply supports cuda/xpu/musa/npu only.
SGLANG_BUDGET_CPU_REASON = (
    "SGLang's max_thinking_tokens needs --enable-strict-thinking (else the request is refused), which applies the "
    "XGrammar token bitmask to every request; SGLang's XGrammar backend applies it on cuda/xpu/musa/npu only "
    "(RuntimeError 'Unsupported device: cpu' in XGrammarGrammar.apply_vocab_mask, the scheduler dies), so it "
    "cannot run on the CPU testbed")


def _run_budgets(loop, backend, tok, problems, prompts, budgets: Sequence[int], kind: str, max_new_tokens,
                 concurrency) -> Tuple[List[dict], Dict[str, List[Outcome]]]:
    """Every problem at every budget, all in flight together (accuracy and tokens only: the
    latencies of a mixed batch are not comparable). ``kind`` ``budget``: SpecExit's max-think guard
    as a plain budget (:func:`budget_custom_params`); ``sglang_budget``: SGLang's
    ``max_thinking_tokens`` request field, SpecExit off for the request."""
    n = len(problems)
    params: List[Optional[dict]] = []
    extras: List[Optional[dict]] = []
    for b in budgets:
        if kind == "budget":
            params += [budget_custom_params(b)] * n
            extras += [None] * n
        else:
            params += [OFF] * n
            extras += [{"max_thinking_tokens": int(b)}] * n
    _flush(backend, loop)
    t0 = time.perf_counter()
    run = loop.run_until_complete(_run_requests(backend, tok, problems * len(budgets), prompts * len(budgets),
                                                params, max_new_tokens, concurrency, extras=extras))
    wall = time.perf_counter() - t0
    rows, outcomes = [], {}
    for i, b in enumerate(budgets):
        part = run[i * n:(i + 1) * n]
        row = {"budget": int(b), **summarize(part, wall)}
        for key in ("mean_latency_s", "wall_s"):
            row.pop(key)
        row["max_think_tokens"] = max(o.think_tokens for o in part)
        row["within_budget_rate"] = sum(o.think_tokens <= b for o in part) / n
        rows.append(row)
        outcomes[f"{kind}/{b}"] = part
    return rows, outcomes


def curve_points(summary: Mapping[str, object]) -> Dict[str, List[Tuple[float, float, str]]]:
    """The curves of accuracy against mean output tokens: ``{curve: [(tokens, accuracy, label)]}``
    sorted by tokens. ``specexit``: the reference defaults and the tuned preset; ``budget`` /
    ``sglang_budget``: each fixed budget, then the baseline (no budget) as the curve's last point.

    Examples
    --------
    >>> s = {"baseline": {"mean_output_tokens": 100.0, "accuracy": 1.0},
    ...      "tuned": {"mean_output_tokens": 40.0, "accuracy": 1.0},
    ...      "budgets": {"budget": {"status": "measured", "rows": [
    ...          {"budget": 16, "mean_output_tokens": 30.0, "accuracy": 0.5}]}}}
    >>> curve_points(s)["budget"], curve_points(s)["specexit"]
    ([(30.0, 0.5, '16'), (100.0, 1.0, 'none')], [(40.0, 1.0, 'tuned')])
    """
    out: Dict[str, List[Tuple[float, float, str]]] = {}
    spec = [(summary[v]["mean_output_tokens"], summary[v]["accuracy"], v) for v in ("reference", "tuned")
            if isinstance(summary.get(v), dict)]
    if spec:
        out["specexit"] = sorted(spec)
    base = summary.get("baseline")
    for kind, entry in (summary.get("budgets") or {}).items():
        if entry.get("status") != "measured":
            continue
        pts = [(r["mean_output_tokens"], r["accuracy"], str(r["budget"])) for r in entry["rows"]]
        if isinstance(base, dict):
            pts.append((base["mean_output_tokens"], base["accuracy"], "none"))
        out[kind] = sorted(pts)
    return out


def accuracy_at(points: Sequence[Tuple[float, float, str]], tokens: float) -> Optional[float]:
    """Accuracy of a budget curve at ``tokens`` mean output tokens: linear between its points;
    None outside the curve's token range (not extrapolated).

    Examples
    --------
    >>> accuracy_at([(20.0, 0.2, "16"), (60.0, 0.6, "48"), (100.0, 1.0, "none")], 40.0)
    0.4
    >>> accuracy_at([(20.0, 0.2, "16")], 10.0) is None
    True
    """
    pts = sorted(points)
    for (x0, y0, _), (x1, y1, _) in zip(pts, pts[1:]):
        if x0 <= tokens <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    if len(pts) == 1 and pts[0][0] == tokens:
        return pts[0][1]
    return None


def format_curves(summary: Mapping[str, object]) -> str:
    """The printed curves (accuracy vs mean output tokens) and, per SpecExit point, the fixed-budget
    curve's accuracy at the same mean tokens."""
    curves = curve_points(summary)
    lines = ["accuracy vs mean output tokens (budget = SpecExit's max-think guard as a plain budget, signal exit "
             "off, no grace; sglang_budget = SGLang's max_thinking_tokens; 'none' = the baseline, no budget)",
             f"{'curve':<14} {'point':<10} {'accuracy':>8} {'out tok':>8} {'think tok':>9} {'max think':>9} "
             f"{'<= budget':>9}"]
    rows = {kind: {str(r["budget"]): r for r in entry.get("rows", [])}
            for kind, entry in (summary.get("budgets") or {}).items()}
    for kind, pts in curves.items():
        for tokens, acc, label in pts:
            r = rows.get(kind, {}).get(label) or (summary.get(label) if kind == "specexit" else summary.get("baseline"))
            lines.append(f"{kind:<14} {label:<10} {acc:>8.3f} {tokens:>8.1f} {r['mean_think_tokens']:>9.1f} "
                         f"{_fmt(r.get('max_think_tokens'), 'd'):>9} {_fmt(r.get('within_budget_rate'), '.2f'):>9}")
    for kind, entry in (summary.get("budgets") or {}).items():
        if entry.get("status") != "measured":
            lines.append(f"{kind:<14} n/a: {entry.get('reason')}")
    for tokens, acc, label in curves.get("specexit", []):
        for kind in BUDGET_KINDS:
            if kind not in curves:
                continue
            at = accuracy_at(curves[kind], tokens)
            verdict = ("outside the budget curve's token range" if at is None else
                       f"{kind} curve {at:.3f} at equal tokens -> SpecExit "
                       f"{'above' if acc > at else 'equal' if acc == at else 'below'} ({acc - at:+.3f})")
            cheaper = [p for p in curves[kind] if p[0] <= tokens]
            if cheaper:  # the best budget point that spends no more tokens
                t, a, name = max(cheaper, key=lambda p: (p[1], -p[0]))
                verdict += f"; best {kind} with <= these tokens: {name} ({a:.3f} at {t:.1f})"
            lines.append(f"{label}: accuracy {acc:.3f} at {tokens:.1f} tokens; {verdict}")
    return "\n".join(lines)


def _plot_curves(summary: Mapping[str, object], path: str) -> None:
    """One plot: accuracy against mean output tokens, a line per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"specexit": dict(color="tab:green", marker="*", markersize=12, linestyle="none"),
             "budget": dict(color="tab:blue", marker="o"), "sglang_budget": dict(color="tab:orange", marker="s")}
    label = {"specexit": "SpecExit (reference, tuned)", "budget": "fixed budget (SpecExit max-think guard)",
             "sglang_budget": "fixed budget (SGLang max_thinking_tokens)"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, pts in curve_points(summary).items():
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, label=label.get(kind, kind), **style.get(kind, {}))
        for x, y, name in pts:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlabel("mean output tokens per request")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"SpecExit vs fixed thinking budgets, {summary['n']} held-out problems (seed {summary['seed']})",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_png_path(png: str) -> str:
    """Where the curves' plot goes next to the main plot.

    Examples
    --------
    >>> curves_png_path("out/eval.png")
    'out/eval_curves.png'
    """
    stem, ext = os.path.splitext(png)
    return f"{stem}_curves{ext or '.png'}"


def _sglang_budgets_on_engine(kwargs: dict, tok, problems, prompts, budgets, args) -> Tuple[dict, dict]:
    """SGLang's ``max_thinking_tokens`` on a second engine launched with ``--enable-strict-thinking``
    and the testbed's reasoning parser (after the main engine is down). Without CUDA: n/a with
    :data:`SGLANG_BUDGET_CPU_REASON` (no engine launched)."""
    import torch

    if not torch.cuda.is_available():
        print(f"[specexit_eval] SGLang max_thinking_tokens: n/a ({SGLANG_BUDGET_CPU_REASON})", file=sys.stderr,
              flush=True)
        return {"status": "n/a", "reason": SGLANG_BUDGET_CPU_REASON}, {}
    import sglang

    backend = EngineBackend(sglang.Engine(**kwargs, enable_strict_thinking=True, reasoning_parser="qwen3-thinking"))
    try:
        rows, part = _run_budgets(backend.loop, backend, tok, problems, prompts, budgets, "sglang_budget",
                                  args.max_new_tokens, args.concurrency)
    finally:
        backend.close(backend.loop)
    return {"status": "measured", "rows": rows}, part


def report(summary: Mapping[str, object], variants: Sequence[str], png: Optional[str]) -> None:
    """Print the tables of a finished run and write its plots (``png`` None: no plots)."""
    print(format_table(summary, variants))
    if png:
        _plot(summary, variants, png)
        print(f"plot: {os.path.relpath(png, REPO)}")
    sweep = summary.get("sweep")
    if sweep:
        print()
        print(format_sweep(sweep))
        if png:
            _plot_sweep(sweep, sweep_png_path(png))
            print(f"plot: {os.path.relpath(sweep_png_path(png), REPO)}")
    if summary.get("tune"):
        print()
        print(format_tune(summary["tune"]))
    if summary.get("budgets"):
        print()
        print(format_curves(summary))
        if png and curve_points(summary):
            _plot_curves(summary, curves_png_path(png))
            print(f"plot: {os.path.relpath(curves_png_path(png), REPO)}")


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    from sglang_ext.testbed.evaluate import CPU_DEFAULTS, _prepare_environment

    args = build_parser().parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        report(saved, [v for v in VARIANTS if isinstance(saved.get(v), dict)], args.png)
        return saved
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if "tuned" in variants and not os.path.isfile(args.tuned):
        raise SystemExit(f"--tuned: preset file not found: {args.tuned}")
    tuned = preset_custom_params(args.tuned) if "tuned" in variants else None
    if args.sweep < 0 or args.sweep > args.n:
        raise SystemExit(f"--sweep: must be in 0..--n ({args.n}), got {args.sweep}")
    if args.tune < 0 or args.tune > args.n:
        raise SystemExit(f"--tune: must be in 0..--n ({args.n}), got {args.tune}")
    budgets = parse_budgets(args.budgets)
    sglang_budgets = budgets if args.sglang_budgets is None else parse_budgets(args.sglang_budgets)
    budget_summary: Dict[str, dict] = {}
    budget_outcomes: Dict[str, List[Outcome]] = {}
    if args.url:
        backend = HttpBackend(args.url)
        try:
            info = backend.server_info()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the server ends the run here
            print(f"[specexit_eval] error: --url {args.url}: /server_info failed: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        if specexit_state(info) is None:
            print(f"[specexit_eval] error: --url {args.url}: the server has no SpecExit (no 'specexit' section in "
                  "/server_info internal_states); launch it with the extension and --specexit", file=sys.stderr,
                  flush=True)
            raise SystemExit(2)
        tokenizer_path = args.target or info.get("tokenizer_path") or info.get("model_path")
    else:
        from sglang_ext.testbed.evaluate import DEFAULT_DRAFT, DEFAULT_TARGET

        _prepare_environment()
        tokenizer_path = args.target or DEFAULT_TARGET
    from transformers import AutoTokenizer

    from sglang_ext.testbed import task

    make_problems, default_seed = SPLITS[args.split]
    if args.seed is None:
        args.seed = default_seed
    problems = make_problems(args.n, args.seed)
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    prompts = [tok.encode(task.prompt_text(p["question"], True), add_special_tokens=False) for p in problems]
    custom = {"baseline": OFF, "reference": None, "tuned": tuned}
    tuned_shown = os.path.relpath(args.tuned, REPO) if tuned is not None else None
    print(f"[specexit_eval] {len(problems)} problems (seed {args.seed}), variants {variants}, repeats {args.repeats}, "
          f"tuned {tuned_shown} {tuned}; " + (f"server {args.url}" if args.url else "launching the engine"),
          file=sys.stderr, flush=True)
    if not args.url:
        import sglang
        import torch

        import sglang_ext

        sglang_ext.load()
        kwargs = dict(model_path=tokenizer_path, speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=args.draft or DEFAULT_DRAFT, speculative_num_steps=3,
                      speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                      max_running_requests=max(args.concurrency, 1), specexit=True, log_level="warning")
        if not torch.cuda.is_available():
            kwargs.update({k: v for k, v in CPU_DEFAULTS.items() if k not in kwargs})
        backend = EngineBackend(sglang.Engine(**kwargs))
    outcomes: Dict[str, List[Outcome]] = {}
    summary: Dict[str, object] = {"n": len(problems), "seed": args.seed, "split": args.split, "url": args.url,
                                  "tuned_preset": tuned_shown, "tuned_custom_params": tuned}
    sweep = None
    flushed: List[bool] = []
    loop = backend.loop
    try:
        # warm-up at the full batch width, SpecExit off and on (first-call costs, allocations), then every
        # variant starts from an empty prefix cache
        w = min(len(problems), args.concurrency)
        warm = [OFF if i % 2 == 0 else (tuned or None) for i in range(w)]
        loop.run_until_complete(_run_requests(backend, tok, problems[:w], prompts[:w], warm, WARMUP_TOKENS,
                                              args.concurrency))
        # order A B C (C B A ...): drift of the shared machine's speed cancels out of the ratios
        order = []
        for r in range(args.repeats):
            order += variants if r % 2 == 0 else variants[::-1]
        timings: Dict[str, List[Tuple[float, float]]] = {name: [] for name in variants}
        for name in order:
            flushed.append(_flush(backend, loop))
            t0 = time.perf_counter()
            run = loop.run_until_complete(_run_requests(backend, tok, problems, prompts,
                                                        [custom[name]] * len(problems), args.max_new_tokens,
                                                        args.concurrency))
            wall = time.perf_counter() - t0
            outcomes.setdefault(name, run)
            timings[name].append((sum(o.latency_s for o in run) / len(run), wall))
            s = summarize(run, wall)
            print(f"[specexit_eval] pass {name}: accuracy {s['accuracy']:.3f}, output tokens "
                  f"{s['mean_output_tokens']:.1f}, mean latency {s['mean_latency_s']:.2f} s, wall {wall:.1f} s",
                  file=sys.stderr, flush=True)
        for name in variants:
            summary[name] = summarize(outcomes[name], sum(w for _, w in timings[name]) / len(timings[name]))
            summary[name]["mean_latency_s"] = sum(lat for lat, _ in timings[name]) / len(timings[name])
            summary[name]["repeats"] = len(timings[name])
            summary[name]["passes"] = [{"mean_latency_s": lat, "wall_s": w} for lat, w in timings[name]]
            summary[name]["before_answer_rate"] = before_answer_rate(outcomes[name], outcomes.get("baseline"))
        if args.sweep:
            print(f"[specexit_eval] sweep: {len(sweep_combinations())} combinations + baseline on {args.sweep} "
                  "problems",
                  file=sys.stderr, flush=True)
            sweep, sweep_outcomes = _run_sweep(loop, backend, tok, problems[:args.sweep], prompts[:args.sweep],
                                               args.max_new_tokens, args.concurrency)
        if args.tune:
            print(f"[specexit_eval] tuning: {len(tune_grid())} candidates + baseline on {args.tune} problems",
                  file=sys.stderr, flush=True)
            tune, _ = _run_combos(loop, backend, tok, problems[:args.tune], prompts[:args.tune], tune_grid(),
                                  args.max_new_tokens, args.concurrency)
            tune.update(split=args.split, seed=args.seed, pick=pick_tuned(tune["rows"], tune["baseline"]))
            summary["tune"] = tune
        if budgets:
            print(f"[specexit_eval] fixed budgets {budgets} (SpecExit's max-think guard, signal exit off) on "
                  f"{len(problems)} problems", file=sys.stderr, flush=True)
            rows, part = _run_budgets(loop, backend, tok, problems, prompts, budgets, "budget", args.max_new_tokens,
                                      args.concurrency)
            budget_summary["budget"] = {"status": "measured", "rows": rows}
            budget_outcomes.update(part)
        if sglang_budgets and args.url:
            try:
                rows, part = _run_budgets(loop, backend, tok, problems, prompts, sglang_budgets, "sglang_budget",
                                          args.max_new_tokens, args.concurrency)
                budget_summary["sglang_budget"] = {"status": "measured", "rows": rows}
                budget_outcomes.update(part)
            except Exception as exc:  # noqa: BLE001 - e.g. a server without --enable-strict-thinking refuses it
                budget_summary["sglang_budget"] = {"status": "n/a", "reason": f"the server refused it: {exc}"[:500]}
        summary["cache_flushed_before_every_pass"] = all(flushed)
        summary["server_info"] = specexit_state(backend.server_info())
    finally:
        backend.close(loop)
    if sglang_budgets and not args.url:
        budget_summary["sglang_budget"], part = _sglang_budgets_on_engine(kwargs, tok, problems, prompts,
                                                                           sglang_budgets, args)
        budget_outcomes.update(part)
    if budget_summary:
        summary["budgets"] = budget_summary
    compare(summary)
    if "baseline" in outcomes:
        summary["oracle_ratio"] = oracle_ratio(outcomes["baseline"])
    if sweep is not None:
        summary["sweep"] = sweep
    report(summary, variants, args.png)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        record = {**summary, "outcomes": {k: [asdict(o) for o in v] for k, v in outcomes.items()}}
        if sweep is not None:
            record["sweep_outcomes"] = {k: [asdict(o) for o in v] for k, v in sweep_outcomes.items()}
        if budget_outcomes:
            record["budget_outcomes"] = {k: [asdict(o) for o in v] for k, v in budget_outcomes.items()}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"json: {os.path.relpath(args.out, REPO)}")
    return summary


if __name__ == "__main__":
    main()

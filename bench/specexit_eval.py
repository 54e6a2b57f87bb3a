"""SpecExit on held-out testbed problems: baseline vs reference defaults vs a tuned preset, side by side.

    python bench/specexit_eval.py                          # 200 problems, committed testbed models
    python bench/specexit_eval.py --n 50 --tuned configs/specexit_testbed_tuned.yaml --out eval.json

One in-process ``sglang.Engine`` (EAGLE3 chain, 3 steps / 4 verify tokens, ``--specexit`` with the
reference defaults of ALGORITHMS.md A.4-A.6 as server flags) serves three variants of the same
problems, one after the other (after a short warm-up, each from an empty prefix cache, ``--repeats`` passes in
the order A B C C B A so that the drift of a shared machine cancels out of the latency ratios), each
with all its requests in flight together (``--concurrency``):

* ``baseline``: EAGLE3 with SpecExit off for the request (``custom_params`` ``specexit_enable: false``);
* ``reference``: the server defaults (EWMA alpha 0.1, confidence > 0.8, progress > 0.3, remain < 200);
* ``tuned``: the ``specexit-*`` options of a preset YAML (``--tuned``, the same keys as the
  launcher's ``--config`` files), sent per request as ``custom_params``.

Problems come from ``sglang_ext.testbed.task`` with the RNG ``Random("specexit-eval-<seed>")``,
a stream the training pipeline never uses (it draws from ``sglang_ext-traces-*`` and
``sglang_ext-heldout-*``). Decoding is greedy; the prompt opens the think block.

Printed (one JSON object): per variant ``accuracy``, ``mean_output_tokens``, ``mean_think_tokens``,
``exited_rate``, ``mean_latency_s``, ``wall_s``; for SpecExit variants also ``tokens_ratio``
(mean output tokens / baseline), ``accuracy_drop_points`` (baseline - variant, in points) and
``latency_ratio`` (baseline mean latency / variant mean latency, > 1 is faster); ``oracle_ratio``:
the baseline's output tokens had thinking stopped right after the answer paragraph
(``So the result is ...``), over the baseline's; and ``acceptance`` for the tuned preset
(tokens ratio <= 0.6 and accuracy drop <= 1 point, issue 7).

Budget: about 15-30 min for 200 problems x 3 variants on 2 shared CPU cores (testbed models).
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
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

#: The issue's acceptance bounds for the tuned preset.
MAX_TOKENS_RATIO = 0.6
MAX_ACCURACY_DROP_POINTS = 1.0
DEFAULT_TUNED = os.path.join(REPO, "configs", "specexit_testbed_tuned.yaml")
#: A built-in tuned preset, used when ``--tuned`` is not given and the preset file does not exist.
FALLBACK_TUNED = {"specexit_smoothing": "paragraph_mean", "specexit_window": 10}
VARIANTS = ("baseline", "reference", "tuned")


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


def preset_custom_params(path: Optional[str]) -> Dict[str, object]:
    """Per-request ``custom_params`` of the ``specexit-*`` options in a launcher preset YAML.

    Keys that are not per-request options (``specexit``, ``specexit-stop-think-token``, ...) and
    non-SpecExit keys are ignored.

    Examples
    --------
    >>> preset_custom_params(None) == FALLBACK_TUNED
    True
    """
    from sglang_ext.specexit.overrides import OPTION_FIELDS

    if path is None:
        return dict(FALLBACK_TUNED)
    import yaml

    with open(path) as f:
        preset = yaml.safe_load(f) or {}
    out = {}
    for key, value in preset.items():
        name = str(key).replace("-", "_")
        if name.startswith("specexit_") and name[len("specexit_"):] in OPTION_FIELDS:
            out[name] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    from sglang_ext.testbed.evaluate import DEFAULT_DRAFT, DEFAULT_TARGET

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="held-out problems")
    ap.add_argument("--seed", type=int, default=2026, help="evaluation RNG seed")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--tuned", default=None, help=f"preset YAML (default {os.path.relpath(DEFAULT_TUNED, REPO)} "
                                                  f"if present, else {FALLBACK_TUNED})")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2,
                    help="passes per variant, in the order A B C C B A ... (latencies and walls are averaged; "
                         "tokens and accuracy come from the first pass, greedy decoding repeats them)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--out", default=None, help="JSON file with the summary and every outcome")
    return ap


async def _run_variant(engine, tok, problems, prompts, custom_params, max_new_tokens, concurrency) -> List[Outcome]:
    from sglang_ext.testbed import task
    from sglang_ext.testbed.evaluate import oracle_think_tokens, think_tokens

    sem = asyncio.Semaphore(concurrency)
    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    if custom_params:
        params["custom_params"] = dict(custom_params)

    async def one(problem, ids):
        async with sem:
            t0 = time.perf_counter()
            out = await engine.async_generate(input_ids=ids, sampling_params=params)
            dt = time.perf_counter() - t0
        meta = out["meta_info"]
        text = out["text"]
        out_ids = out.get("output_ids") or tok.encode(text, add_special_tokens=False)
        predicted = task.parse_answer(text)
        return Outcome(id=problem["id"], answer=problem["answer"], predicted=predicted,
                       correct=predicted == problem["answer"], output_tokens=int(meta["completion_tokens"]),
                       think_tokens=think_tokens(out_ids, close_id), exited=bool(meta.get("specexit_exited")),
                       exit_reason=meta.get("specexit_exit_reason"),
                       oracle_think_tokens=oracle_think_tokens(tok, text), latency_s=dt)

    return list(await asyncio.gather(*(one(p, ids) for p, ids in zip(problems, prompts))))


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


def compare(summary: Dict[str, Dict[str, object]]) -> None:
    """Add ratios to every SpecExit variant (in place) and the tuned preset's acceptance verdict."""
    base = summary.get("baseline")
    if base is None:
        return
    for name in VARIANTS[1:]:
        s = summary.get(name)
        if not isinstance(s, dict):
            continue
        s["tokens_ratio"] = s["mean_output_tokens"] / base["mean_output_tokens"]
        s["accuracy_drop_points"] = 100.0 * (base["accuracy"] - s["accuracy"])
        s["latency_ratio"] = base["mean_latency_s"] / s["mean_latency_s"] if s["mean_latency_s"] else None
        s["wall_ratio"] = base["wall_s"] / s["wall_s"] if s["wall_s"] else None
    tuned = summary.get("tuned")
    if isinstance(tuned, dict):
        tuned["acceptance"] = {
            "tokens_ratio_ok": tuned["tokens_ratio"] <= MAX_TOKENS_RATIO,
            "accuracy_drop_ok": tuned["accuracy_drop_points"] <= MAX_ACCURACY_DROP_POINTS,
        }


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    from sglang_ext.testbed.evaluate import CPU_DEFAULTS, _prepare_environment

    args = build_parser().parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    tuned_path = args.tuned if args.tuned is not None else (DEFAULT_TUNED if os.path.exists(DEFAULT_TUNED) else None)
    tuned = preset_custom_params(tuned_path)
    _prepare_environment()
    import sglang
    import torch
    from transformers import AutoTokenizer

    import sglang_ext
    from sglang_ext.testbed import task

    sglang_ext.load()
    problems = held_out_problems(args.n, args.seed)
    tok = AutoTokenizer.from_pretrained(args.target)
    prompts = [tok.encode(task.prompt_text(p["question"], True), add_special_tokens=False) for p in problems]
    kwargs = dict(model_path=args.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=args.draft,
                  speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                  max_running_requests=max(args.concurrency, 1), specexit=True, log_level="warning")
    if not torch.cuda.is_available():
        kwargs.update({k: v for k, v in CPU_DEFAULTS.items() if k not in kwargs})
    custom = {"baseline": {"specexit_enable": False}, "reference": None, "tuned": tuned}
    engine = sglang.Engine(**kwargs)
    outcomes: Dict[str, List[Outcome]] = {}
    summary: Dict[str, object] = {"n": len(problems), "seed": args.seed, "tuned_preset": tuned_path,
                                  "tuned_custom_params": tuned}
    try:
        loop = asyncio.get_event_loop()
        # warm-up (first-call costs), then every variant starts from an empty prefix cache
        loop.run_until_complete(_run_variant(engine, tok, problems[:8], prompts[:8], custom["baseline"], 16,
                                             args.concurrency))
        # order A B C (C B A ...): drift of the shared machine's speed cancels out of the ratios
        order = []
        for r in range(args.repeats):
            order += variants if r % 2 == 0 else variants[::-1]
        timings: Dict[str, List[Tuple[float, float]]] = {name: [] for name in variants}
        for name in order:
            engine.flush_cache()
            t0 = time.perf_counter()
            run = loop.run_until_complete(_run_variant(engine, tok, problems, prompts, custom[name],
                                                       args.max_new_tokens, args.concurrency))
            wall = time.perf_counter() - t0
            outcomes.setdefault(name, run)
            timings[name].append((sum(o.latency_s for o in run) / len(run), wall))
            print(json.dumps({name: summarize(run, wall)}), file=sys.stderr)
        for name in variants:
            summary[name] = summarize(outcomes[name], sum(w for _, w in timings[name]) / len(timings[name]))
            summary[name]["mean_latency_s"] = sum(lat for lat, _ in timings[name]) / len(timings[name])
            summary[name]["repeats"] = len(timings[name])
        summary["server_info"] = engine.get_server_info()["internal_states"][0].get("specexit")
    finally:
        engine.shutdown()
    compare(summary)
    if "baseline" in outcomes:
        summary["oracle_ratio"] = oracle_ratio(outcomes["baseline"])
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "outcomes": {k: [asdict(o) for o in v] for k, v in outcomes.items()}}, f,
                      indent=1)
    return summary


if __name__ == "__main__":
    main()

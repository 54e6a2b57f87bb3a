"""What does SpecExit's per-token exit rule cost per decode step?

Two measurements, printed side by side:

* **state** (pure torch, always): ``SpecExitState.step`` -- one observation per committed token,
  the smoothers and the exit test run token by token over the ``a + 1`` columns of the longest
  run -- against the per-step rule it replaced (one observation per step, the mean over the
  run's rows, one test per step; rebuilt here from the same primitives: ``mean`` of the rows,
  ``SmootherState.push`` once, ``signal_test`` once, ``decide_exit`` with one result per request).
  Random thinking runs with boundaries, bs 1 / 16 / 64, run widths 4 (a 3-step chain), 8 and 16;
  median of ``--calls`` calls each.
* **engine** (``--engine``): decode throughput of the trained testbed models (EAGLE3 chain,
  3 steps / 4 tokens, 64 requests in flight, 128 new tokens, EOS ignored) with ``--specexit``
  against the same engine launched without it. Every SpecExit request runs the whole per-token
  path (signals of every committed token, the state step) but never exits (confidence threshold
  1.0), so both engines emit the same tokens and the wall-time ratio is the cost of a SpecExit
  step. Passes alternate A B B A ... (``--repeats``), so the drift of a shared host cancels out.
  ``--signal-sources head,draft-confidence`` repeats the comparison (two fresh engines each, one
  source after the other: a third idle engine would share the host) with the training-free signal
  (``--specexit-signal-source draft-confidence``): its values come from every draft-extend row, the
  state runs lagged and steps are cut short before boundaries (``truncated_steps`` is printed),
  so its ratio includes the extra steps those cuts cost.

Run:

    OMP_NUM_THREADS=1 python bench/specexit_step_cost.py [--calls 200] [--engine [--no-state]] [--repeats 3]
        [--signal-sources head[,draft-confidence]] [--json bench/out/specexit_step_cost.json]

``--engine --no-state`` runs only the engine comparison, e.g. with a checkout of an earlier version
of the package first on ``PYTHONPATH`` (the engine part uses nothing this version added).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

import torch

from sglang_ext.specexit.criterion import PAD_TOKEN, decide_exit, signal_test
from sglang_ext.specexit.overrides import SpecExitOptions
from sglang_ext.specexit.state import SpecExitState

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUNDARY, STOP = 7, 9
NEVER = {"specexit_confidence_threshold": 1.0}


def _inputs(bs: int, width: int, gen: torch.Generator):
    """Random runs: ``a`` uniform in 0..width-1, 10 % boundaries, signals in their ranges."""
    a = torch.randint(0, width, (bs,), generator=gen)
    tokens = torch.randint(10, 30, (bs, width), generator=gen)
    tokens[torch.rand(bs, width, generator=gen) < 0.1] = BOUNDARY
    columns = torch.arange(width)[None, :]
    accepted = torch.where(columns[:, 1:] <= a[:, None], tokens[:, 1:], torch.full_like(tokens[:, 1:], PAD_TOKEN))
    obs = torch.stack([0.5 + 0.5 * torch.rand(bs, width, generator=gen), torch.rand(bs, width, generator=gen),
                       torch.exp(2.0 + 5.0 * torch.rand(bs, width, generator=gen))], dim=2)
    return tokens[:, 0], accepted, tokens[:, 0], obs  # root, accepted, bonus (an ordinary token), observations


def per_step_rule(state: SpecExitState, slots, roots, accepted, bonus, obs):
    """The replaced rule's work per step: the run's mean pushed once, one test, one decision."""
    from sglang_ext.specexit.criterion import step_run

    run, valid = step_run(roots, accepted)
    mean = torch.where(valid[:, :, None], obs, torch.zeros_like(obs)).sum(1) / valid.sum(1, keepdim=True)
    values, defined = state.smoother.scores(slots)
    passes = signal_test(values, defined, state.active_signals[slots], state.thresholds[slots])
    d = decide_exit(state.thinking[slots], roots, accepted, bonus, state.think_tokens[slots], passes,
                    state.min_think_tokens[slots], state.max_think_tokens[slots], state.max_think_grace[slots],
                    state.boundary_ids, state.stop_think_id)
    state.smoother.paragraph_cut(slots, d.first_boundary >= 0)
    state.smoother.push(slots, mean, d.still_thinking)
    return d


def _time(fn: Callable[[], object], calls: int) -> float:
    """Median microseconds per call (after 10 warm-up calls)."""
    for _ in range(10):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def bench_state(calls: int) -> List[Dict[str, float]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    options = SpecExitOptions(smoothing="paragraph_mean", window=10, confidence_threshold=1.0)
    for width in (4, 8, 16):
        for bs in (1, 16, 64):
            slots = torch.arange(bs)
            roots, accepted, bonus, obs = _inputs(bs, width, gen)
            timed = {}
            for name, fn in (("per_token", lambda st: st.step(slots, roots, accepted, bonus, obs)),
                             ("per_step", lambda st: per_step_rule(st, slots, roots, accepted, bonus, obs))):
                state = SpecExitState.allocate(bs, [BOUNDARY], STOP)
                state.reset(list(range(bs)), [options] * bs, think_tokens=1)
                timed[name] = _time(lambda: fn(state), calls)
            rows.append({"width": width, "bs": bs, **{f"{k}_us": v for k, v in timed.items()},
                         "ratio": timed["per_token"] / timed["per_step"]})
            print(f"state  width {width:2d}  bs {bs:2d}  per-token {timed['per_token']:7.1f} us  "
                  f"per-step {timed['per_step']:7.1f} us  ratio {rows[-1]['ratio']:.2f}", flush=True)
    return rows


SOURCE_FLAGS = {"head": {}, "draft-confidence": {"specexit_signal_source": "draft-confidence",
                                                  "specexit_method": "confidence"}}


def bench_engine(repeats: int, bs: int = 64, max_new: int = 128,
                 sources: Sequence[str] = ("head",)) -> Dict[str, object]:
    """One paired comparison per signal source (keys suffixed with the source after the first)."""
    result: Dict[str, object] = {}
    for source in sources:
        part = _bench_engine_pair(repeats, bs, max_new, source)
        key = "" if source == "head" else "_" + source.replace("-", "_")
        result.update({k if k in ("bs", "max_new_tokens") else k + key: v for k, v in part.items()})
    return result


def _bench_engine_pair(repeats: int, bs: int, max_new: int, source: str) -> Dict[str, object]:
    from sglang_ext.testbed.evaluate import _prepare_environment

    _prepare_environment()  # the CPU testbed's import stand-ins (no-op with CUDA)
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    from engine_utils import make_engine
    from trained_models import MODELS, held_out_prompts

    prompts = held_out_prompts(bs)
    params = {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}
    common = dict(attention_backend="torch_sdpa", speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=os.path.join(MODELS, "draft"), speculative_num_steps=3,
                  speculative_eagle_topk=1, speculative_num_draft_tokens=4, max_total_tokens=65536,
                  max_running_requests=bs, log_level="warning")
    names = ["specexit" if source == "head" else f"specexit {source}"]
    engines = {names[0]: make_engine(os.path.join(MODELS, "target"), specexit=True, **SOURCE_FLAGS[source], **common),
               "plain": make_engine(os.path.join(MODELS, "target"), **common)}
    walls: Dict[str, List[float]] = {name: [] for name in engines}
    outputs: Dict[str, List[List[int]]] = {}
    truncated: Dict[str, int] = {}
    try:
        for name, eng in engines.items():  # warm-up
            eng.generate(input_ids=prompts, sampling_params=dict(params, max_new_tokens=8, custom_params=None))
        order = []
        for r in range(repeats):
            order += names + ["plain"] if r % 2 == 0 else ["plain"] + names[::-1]
        for name in order:
            custom = None if name == "plain" else NEVER
            t0 = time.perf_counter()
            outs = engines[name].generate(input_ids=prompts, sampling_params=dict(params, custom_params=custom))
            walls[name].append(time.perf_counter() - t0)
            outputs.setdefault(name, [o["output_ids"] for o in outs])
            print(f"engine {name:26s} {walls[name][-1]:6.2f} s", flush=True)
        for name in names:
            info = engines[name].get_server_info()["internal_states"][0]["specexit"]
            if "truncated_steps" in info:
                truncated[name] = int(info["truncated_steps"])
    finally:
        for eng in engines.values():
            eng.shutdown()
    name = names[0]
    same = outputs[name] == outputs["plain"]
    paired = [s / p for s, p in zip(walls[name], walls["plain"])]
    result: Dict[str, object] = {"bs": bs, "max_new_tokens": max_new, "walls_s": walls, "paired_ratios": paired,
                                 "median_ratio": statistics.median(paired), "identical_outputs": same}
    extra = ""
    if name in truncated:
        result["truncated_steps"] = truncated[name]
        extra = f"; truncated steps {truncated[name]}"
    print(f"engine bs {bs}: {name} step / plain EAGLE3 step (wall, paired) {statistics.median(paired):.3f} "
          f"({', '.join(f'{x:.3f}' for x in paired)}); outputs identical: {same}{extra}", flush=True)
    return result


def main() -> Dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--engine", action="store_true", help="also the engine comparison (two engine launches)")
    ap.add_argument("--no-state", action="store_true", help="skip the pure state timing")
    ap.add_argument("--repeats", type=int, default=3, help="engine passes per variant, alternating")
    ap.add_argument("--signal-sources", default="head",
                    help="comma-separated SpecExit signal sources of the engine comparison (head, draft-confidence)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result: Dict[str, object] = {} if args.no_state else {"state": bench_state(args.calls)}
    if args.engine:
        sources = [s.strip() for s in args.signal_sources.split(",") if s.strip()]
        unknown = [s for s in sources if s not in SOURCE_FLAGS]
        if unknown or not sources:
            ap.error(f"--signal-sources: unknown {unknown or sources}; choose from {', '.join(SOURCE_FLAGS)}")
        result["engine"] = bench_engine(args.repeats, sources=sources)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()

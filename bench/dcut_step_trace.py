"""Where the time of `--dcut auto`'s steps goes: a summary of D-Cut step traces.

A server (or a bench engine) started with ``SGLANG_EXT_DCUT_STEP_TRACE=<prefix>`` appends one JSON
line per timed decode step to ``<prefix>.<pid>.jsonl`` (``sglang_ext.engine.dcut.metrics.StepTrace``):
batch size, tier (or ``draft_off``), the cost-table column its time corrects, the predicted and the
measured wall time (from the step's start to the next step's start), whether the step was forced,
and the deferred draft extend's cumulative counters. This script reads such files and prints, per
batch size and tier, the measured time of

* *steady* steps (the same choice as the step before and after),
* the first step of a choice after a switch, and the last one before a switch,
* steps that ran a catch-up draft extend (their ``caught_up_rows`` grew),

plus the number of switches and the run lengths, so what a switch costs and where that cost is
charged can be read off. Example::

    SGLANG_EXT_DCUT_STEP_TRACE=bench/out/trace OMP_NUM_THREADS=1 python bench/dcut_throughput.py \\
        --num-steps 3 --topk 4 --num-draft-tokens 16 --batch-sizes 64 --repeats 1 --modes auto
    python bench/dcut_step_trace.py bench/out/trace.*.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


def read_trace(paths: Iterable[str], include_forced: bool = False) -> List[List[dict]]:
    """One list of step lines per file (forced steps dropped unless asked for)."""
    out = []
    for path in paths:
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        out.append([x for x in lines if include_forced or not x.get("forced")])
    return out


def classify(steps: Sequence[dict]) -> List[Tuple[dict, str]]:
    """Each step with its kind: ``catch_up`` (its caught-up rows grew), ``first`` (its tier differs
    from the step before), ``last`` (from the step after), ``steady`` otherwise.

    >>> s = [{"tier": "0.25", "bs": 4}, {"tier": "0.25", "bs": 4}, {"tier": "draft_off", "bs": 4},
    ...      {"tier": "draft_off", "bs": 4, "caught_up_rows": 8}, {"tier": "0.25", "bs": 4}]
    >>> [k for _, k in classify(s)]
    ['steady', 'last', 'first', 'catch_up', 'first']
    """
    out = []
    rows_before = 0
    for i, s in enumerate(steps):
        rows = int(s.get("caught_up_rows") or 0)
        prev = steps[i - 1] if i > 0 else None
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if rows > rows_before:
            kind = "catch_up"
        elif prev is not None and (prev["tier"], prev["bs"]) != (s["tier"], s["bs"]):
            kind = "first"
        elif nxt is not None and (nxt["tier"], nxt["bs"]) != (s["tier"], s["bs"]):
            kind = "last"
        else:
            kind = "steady"
        rows_before = max(rows_before, rows)
        out.append((s, kind))
    return out


def runs(steps: Sequence[dict]) -> List[Tuple[str, int]]:
    """Consecutive runs of one tier: ``[(tier, length), ...]``.

    >>> runs([{"tier": "a"}, {"tier": "a"}, {"tier": "b"}])
    [('a', 2), ('b', 1)]
    """
    out: List[Tuple[str, int]] = []
    for s in steps:
        if out and out[-1][0] == s["tier"]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s["tier"], 1))
    return out


def _med(xs: List[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def summarize(steps: Sequence[dict]) -> Dict[Tuple[int, str], Dict[str, object]]:
    """Per (batch size, tier): steps and median measured / predicted ms per kind."""
    cells: Dict[Tuple[int, str], Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for s, kind in classify(steps):
        c = cells[(int(s["bs"]), str(s["tier"]))]
        c[kind].append(float(s["ms"]))
        c["all"].append(float(s["ms"]))
        if s.get("predicted_ms") is not None:
            c["predicted"].append(float(s["predicted_ms"]))
    return {k: {kind: (len(v), _med(v)) for kind, v in c.items()} for k, c in cells.items()}


def format_summary(steps: Sequence[dict]) -> List[str]:
    lines = [f"{'bs':>4} {'tier':>10} {'steps':>6} {'all ms':>8} {'steady':>14} {'first':>14} {'last':>14} "
             f"{'catch-up':>14} {'predicted':>10}"]

    def cell(c, kind):
        n, m = c.get(kind, (0, None))
        return f"{'-':>14}" if not n else f"{m:>8.1f} ({n:>3})"

    for (bs, tier), c in sorted(summarize(steps).items()):
        n, m = c["all"]
        pred = c.get("predicted", (0, None))[1]
        lines.append(f"{bs:>4} {tier:>10} {n:>6} {m:>8.1f} {cell(c, 'steady')} {cell(c, 'first')} {cell(c, 'last')} "
                     f"{cell(c, 'catch_up')} {'-' if pred is None else format(pred, '10.1f'):>10}")
    rs = runs(steps)
    switches = max(0, len(rs) - 1)
    by_tier: Dict[str, List[int]] = defaultdict(list)
    for t, n in rs:
        by_tier[t].append(n)
    lines.append(f"switches {switches}; run lengths: " + ", ".join(
        f"{t} median {statistics.median(v):.0f} (max {max(v)}, {len(v)} runs)" for t, v in sorted(by_tier.items())))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="<prefix>.<pid>.jsonl files")
    ap.add_argument("--include-forced", action="store_true", help="also the steps of fixed or forced modes")
    args = ap.parse_args(argv)
    for path, steps in zip(args.traces, read_trace(args.traces, args.include_forced)):
        print(f"== {path}: {len(steps)} steps")
        if steps:
            print("\n".join(format_summary(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

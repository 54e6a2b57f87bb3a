"""What the demo prints: the side-by-side report and the profiling progress bar (pure: stdlib only).

``sglang_ext.demo`` runs the same greedy requests in three modes (plain decoding, EAGLE3, EAGLE3 +
SpecExit + D-Cut) and hands each request's outcome here; this module sums them per mode, formats
the table and the ``SpecExit:`` / ``D-Cut:`` summary lines, and parses the server's D-Cut profiling
log lines into a progress bar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: Row labels of the three modes, in the order they are printed.
PLAIN, EAGLE3, FULL = "plain decoding", "EAGLE3", "EAGLE3 + SpecExit + D-Cut"


@dataclass(frozen=True)
class RequestOutcome:
    """One request of one mode.

    ``think_tokens`` is None where the model does not think (no ``</think>`` token);
    ``correct`` is None where the question has no known answer; ``accept_length`` is SGLang's
    ``spec_accept_length`` (None without speculation)."""

    output_ids: Tuple[int, ...]
    output_tokens: int
    think_tokens: Optional[int]
    correct: Optional[bool]
    exited: bool
    accept_length: Optional[float]


@dataclass
class ModeReport:
    """The requests of one mode, summed; ``tiers``: D-Cut steps per tier during the mode's run."""

    name: str
    outcomes: List[RequestOutcome]
    wall_s: float
    tiers: Dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def output_tokens(self) -> int:
        return sum(o.output_tokens for o in self.outcomes)

    @property
    def think_tokens(self) -> Optional[int]:
        if any(o.think_tokens is None for o in self.outcomes):
            return None
        return sum(o.think_tokens for o in self.outcomes)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def accept_length(self) -> Optional[float]:
        """Tokens per verify step over the mode's requests, weighted by their output tokens."""
        pairs = [(o.accept_length, o.output_tokens) for o in self.outcomes if o.accept_length]
        if not pairs:
            return None
        steps = sum(t / a for a, t in pairs)
        return sum(t for _, t in pairs) / steps if steps else None

    @property
    def correct(self) -> Optional[int]:
        if any(o.correct is None for o in self.outcomes):
            return None
        return sum(bool(o.correct) for o in self.outcomes)

    @property
    def exits(self) -> int:
        return sum(o.exited for o in self.outcomes)


def tier_delta(before: Mapping[str, int], after: Mapping[str, int]) -> Dict[str, int]:
    """Steps per tier between two ``tier_histogram`` readings (tiers with no new step dropped).

    >>> tier_delta({"full": 3, "0.25": 1}, {"full": 3, "0.25": 9, "draft_off": 2})
    {'0.25': 8, 'draft_off': 2}
    """
    return {k: int(after[k]) - int(before.get(k, 0)) for k in after if int(after[k]) - int(before.get(k, 0)) > 0}


def _tier_key(name: str) -> Tuple[int, float, str]:
    try:
        return (0, float(name), name)
    except ValueError:
        return (1, 0.0, name)


def format_tiers(tiers: Mapping[str, int]) -> str:
    """``'0.25 x60, full x2, draft_off x3'`` (numeric tiers first, ascending); ``'-'`` when empty.

    >>> format_tiers({"full": 2, "draft_off": 3, "0.25": 60})
    '0.25 x60, draft_off x3, full x2'
    >>> format_tiers({})
    '-'
    """
    if not tiers:
        return "-"
    return ", ".join(f"{k} x{tiers[k]}" for k in sorted(tiers, key=_tier_key))


def _opt(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(modes: Sequence[ModeReport], specexit_active: bool = True) -> List[str]:
    """The side-by-side table, one row per mode (exits only in the SpecExit row, and only where
    SpecExit watched the requests)."""
    head = (f"{'mode':<27}{'answers':>8}{'out tok':>9}{'think tok':>10}{'wall s':>8}{'tok/s':>8}"
            f"{'accept':>8}  {'exits':>5}  D-Cut tiers (steps)")
    lines = [head]
    for m in modes:
        answers = "-" if m.correct is None else f"{m.correct}/{m.n}"
        exits = str(m.exits) if m.name == FULL and specexit_active else "-"
        lines.append(f"{m.name:<27}{answers:>8}{m.output_tokens:>9}{_opt(m.think_tokens, 'd'):>10}"
                     f"{m.wall_s:>8.1f}{m.tok_s:>8.1f}{_opt(m.accept_length, '.2f'):>8}  {exits:>5}  "
                     f"{format_tiers(m.tiers)}")
    return lines


def identical(a: ModeReport, b: ModeReport) -> int:
    """How many requests produced the same token ids in both modes."""
    return sum(x.output_ids == y.output_ids for x, y in zip(a.outcomes, b.outcomes))


def summary_lines(plain: ModeReport, eagle: ModeReport, full: ModeReport,
                  specexit_inactive: Optional[str] = None) -> List[str]:
    """The ``SpecExit:``, ``D-Cut:`` and ``Overall:`` lines.

    ``specexit_inactive``: the server's reason when SpecExit watches no request (a model that
    does not think)."""
    out = []
    if specexit_inactive is not None:
        out.append(f"SpecExit: inactive: {specexit_inactive}")
    else:
        skipped = None if eagle.think_tokens is None or full.think_tokens is None else eagle.think_tokens - full.think_tokens
        share = f" ({skipped / eagle.think_tokens:.0%} of the thinking)" if skipped and eagle.think_tokens else ""
        answers = "" if full.correct is None else (f"; answers correct {full.correct}/{full.n} "
                                                   f"(without SpecExit {eagle.correct}/{eagle.n})")
        out.append(f"SpecExit: ended thinking early on {full.exits} of {full.n} requests, "
                   f"{_opt(skipped, 'd')} thinking tokens skipped{share}{answers}")
    steps = sum(full.tiers.values())
    drafted = {k: v for k, v in full.tiers.items() if k != "draft_off"}
    off = full.tiers.get("draft_off", 0)
    same = identical(plain, eagle)
    dcut = f"D-Cut: {steps} verify steps, tiers {format_tiers(drafted)}"
    if off:
        dcut += f", {off} steps with drafting switched off"
    dcut += f"; EAGLE3 output identical to plain decoding on {same}/{plain.n} requests"
    if specexit_inactive is not None:
        dcut += f", with D-Cut on {identical(plain, full)}/{plain.n}"
    out.append(dcut)
    speed = [f"{m.name} {plain.wall_s / m.wall_s:.2f}x" for m in (eagle, full) if m.wall_s > 0]
    out.append("Overall: wall time against plain decoding: " + ", ".join(speed))
    return out


# ----------------------------------------------------------------------------- profiling progress
_PLAN = re.compile(r"D-Cut: profiling the cost table: batch sizes \[([\d, ]*)\]")
_ROW = re.compile(r"D-Cut: cost profiling (\d+)/(\d+) batch sizes done \(batch size (\d+) in ([\d.]+) s\), "
                  r"about (\d+) s left")


@dataclass
class ProfileProgress:
    """What the server's log has said about the D-Cut profile so far."""

    total: Optional[int] = None
    done: int = 0
    left_s: Optional[float] = None

    def feed(self, line: str) -> bool:
        """Read one log line; True when it changed the progress.

        >>> p = ProfileProgress()
        >>> p.feed("... D-Cut: profiling the cost table: batch sizes [64, 1, 32], 3 warm-up ..."), p.total
        (True, 3)
        >>> p.feed("D-Cut: cost profiling 1/3 batch sizes done (batch size 64 in 4.0 s), about 5 s left")
        True
        >>> (p.done, p.left_s), p.feed("unrelated")
        ((1, 5.0), False)
        """
        m = _PLAN.search(line)
        if m:
            self.total = len([x for x in m.group(1).split(",") if x.strip()])
            return True
        m = _ROW.search(line)
        if m:
            self.done, self.total, self.left_s = int(m.group(1)), int(m.group(2)), float(m.group(5))
            return True
        return False

    @property
    def started(self) -> bool:
        return self.total is not None


def progress_bar(done: int, total: int, left_s: Optional[float], elapsed_s: float, width: int = 24) -> str:
    """One progress line.

    >>> progress_bar(2, 6, 12.0, 8.0, width=12)
    'D-Cut cost profiling [####--------] 2/6 batch sizes, 8 s so far, about 12 s left'
    >>> progress_bar(0, 6, None, 1.0, width=12)
    'D-Cut cost profiling [------------] 0/6 batch sizes, 1 s so far'
    """
    fill = int(round(width * done / total)) if total else 0
    eta = "" if left_s is None else f", about {left_s:.0f} s left"
    return (f"D-Cut cost profiling [{'#' * fill}{'-' * (width - fill)}] {done}/{total} batch sizes, "
            f"{elapsed_s:.0f} s so far{eta}")

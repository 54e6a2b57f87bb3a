"""D-Cut's per-step record and its running totals (SGLang glue: read by the runner, shown in
``/server_info``, the log and ``/metrics``).

:class:`StepDecision` is what one verify step did; :class:`DCutMetrics` sums the steps (bonus-inclusive
like the planner: a step verifies ``verified_tokens`` target rows, roots included and padding
excluded, out of ``bs * N``; its ``accepted_tokens`` is ``sum(accept_lens)``; the acceptance rate of
kept drafts is ``(accepted_tokens - bs) / (verified_tokens - bs)``) and keeps the step clock
(:class:`OpenStep`) whose intervals are the measured step times. :class:`StepTiming` is the opt-in
per-step time split (``SGLANG_EXT_DCUT_TIMING=1``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from sglang_ext.dcut import DRAFT_OFF_TIER, MODE_OFF

EXEMPT_REASONS = ("grammar", "logprobs", "penalties", "rejection_sampling")
"""Why a request keeps its full tree (counted per request in the metrics)."""
FULL_TIER = "full"
"""Histogram key of steps verified at full width (no pruning)."""
TIMING_ENV = "SGLANG_EXT_DCUT_TIMING"
"""Environment variable: ``1`` turns on the per-step time split (:class:`StepTiming`, diagnostics
for benches; on GPU each timed section synchronizes the device, so it slows the server down)."""
_MAX_STEP_GAP_S = 5.0  # step intervals longer than this are idle time, not a step
STEP_TRACE_ENV = "SGLANG_EXT_DCUT_STEP_TRACE"
"""Environment variable: a path prefix; each scheduler process then appends one JSON line per timed
decode step to ``<prefix>.<pid>.jsonl`` (:class:`StepTrace`; diagnostics, ``bench/dcut_step_trace.py``
reads them)."""


class StepTrace:
    """One JSON line per decode step the step clock closed: what the step ran (batch size, tier or
    draft-off, the cost-table column its time corrects, None when not comparable), the predicted and
    the measured wall time (ms, from this step's start to the next one's), and the cumulative counters
    ``context()`` returns at that moment (the deferred draft extend's catch-ups, set by the worker).
    Opened from :data:`STEP_TRACE_ENV`; None when it is unset."""

    def __init__(self, prefix: str):
        self.path = f"{prefix}.{os.getpid()}.jsonl"
        self._file = open(self.path, "a", buffering=1)
        self.context = None  # Callable[[], dict] or None
        self.steps = 0

    @classmethod
    def from_env(cls) -> Optional["StepTrace"]:
        prefix = os.environ.get(STEP_TRACE_ENV, "")
        return cls(prefix) if prefix else None

    def write(self, decision: "StepDecision", ms: float) -> None:
        self.steps += 1
        line = {"step": self.steps, "bs": decision.batch_size, "tier": decision.tier,
                "column": decision.cost_column, "ms": round(ms, 3),
                "predicted_ms": None if decision.predicted_ms is None else round(decision.predicted_ms, 3)}
        if self.context is not None:
            line.update(self.context())
        self._file.write(json.dumps(line) + "\n")


@dataclass
class StepDecision:
    """What one verify step did (host values; see the module docstring for conventions)."""

    batch_size: int
    num_draft_tokens: int
    tier: str  # tier ratio as text ("0.5"), FULL_TIER, or "fallback:<ratio>" (DCutPlan.tier_label)
    mode: str
    # kept rows incl. roots (padding excluded): bs * N when not pruned; for a pruned step a 0-d
    # int64 device tensor, read only when the metrics are summarized (no host sync per step)
    verified_tokens: Union[int, torch.Tensor]
    padded_tokens: int  # rows of the target forward (tier width)
    exempt_requests: int
    predicted_ms: Optional[float] = None
    pruned: bool = False  # some draft node of the step was left out of the verification
    # cost-table column the step's wall time is attributed to for --dcut-online-costs: the auto
    # tier index or OFF_COLUMN (draft-off); None = not comparable with the table (fixed or forced
    # ratio, profiling, exempt requests, uncaptured drafts)
    cost_column: Optional[int] = None

    @classmethod
    def full(cls, batch_size: int, num_draft_tokens: int, exempt_requests: int = 0) -> "StepDecision":
        """A step verified in full (no pruning)."""
        rows = batch_size * num_draft_tokens
        return cls(batch_size, num_draft_tokens, FULL_TIER, MODE_OFF, rows, rows, exempt_requests)

    @classmethod
    def draft_off(cls, batch_size: int, predicted_ms: Optional[float] = None,
                  cost_column: Optional[int] = None) -> "StepDecision":
        """A draft-off step: no drafting, one verified token (the root) per request."""
        return cls(batch_size, 1, DRAFT_OFF_TIER, DRAFT_OFF_TIER, batch_size, batch_size, 0, predicted_ms,
                   cost_column=cost_column)


STEP_PARTS = ("draft", "plan", "target_forward", "verify_rest", "draft_extend", "other")
"""Parts of a decode step in :class:`StepTiming` (``verify_rest``: verify minus the target
forward -- sampling, commit, D-Cut compaction; ``other``: the rest of the verify-to-verify
interval -- scheduler, batch bookkeeping)."""


@dataclass
class StepTiming:
    """Wall time per part of a decode step, summed over timed steps (opt-in, :data:`TIMING_ENV`).

    :class:`DCutRunner` wraps the draft worker's ``draft`` / ``_draft_extend_for_decode`` and the
    target worker's verify forward (instance attributes) and times its own planner and verify; a
    step is the interval between two verify calls (idle gaps > 5 s are skipped). Also keeps the
    histogram of accept lengths (bonus included, 1..N) over the requests of every step.

    Examples
    --------
    >>> t = StepTiming(num_draft_tokens=4)
    >>> t.add("draft", 0.002); t.add("target_forward", 0.003); t.end_step(0.006, [4, 2])
    >>> s = t.summary()
    >>> s["steps"], round(s["ms_per_step"]["other"], 3), s["accept_length_histogram"]
    (1, 1.0, [0, 0, 1, 0, 1])
    """

    num_draft_tokens: int = 0  # histogram length N + 1 (grows with the accept lengths seen)
    steps: int = 0
    step_s: float = 0.0
    part_s: Dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in STEP_PARTS})
    _pending: Dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in STEP_PARTS})
    accept_hist: List[int] = field(default_factory=list)
    survival_sum: List[float] = field(default_factory=list)  # per draft position, sum over requests
    survival_rows: int = 0

    def add_survival(self, draft_survival: torch.Tensor) -> None:  # [batch_size, N - 1]
        """Add the planner's predicted chain survival of each draft position (calibration check)."""
        col = draft_survival.detach().float().sum(dim=0).tolist()
        if len(self.survival_sum) < len(col):
            self.survival_sum = self.survival_sum + [0.0] * (len(col) - len(self.survival_sum))
        for i, v in enumerate(col):
            self.survival_sum[i] += v
        self.survival_rows += int(draft_survival.shape[0])

    def add(self, part: str, seconds: float) -> None:
        """Add ``seconds`` to ``part`` of the step in progress."""
        self._pending[part] += seconds

    def end_step(self, interval_s: Optional[float], accept_lens: Any = None) -> None:
        """Close a step: ``interval_s`` since the previous verify (None: not timed, parts dropped)."""
        if interval_s is not None:
            parts = dict(self._pending)
            parts["other"] = max(0.0, interval_s - sum(v for k, v in parts.items() if k != "other"))
            for k, v in parts.items():
                self.part_s[k] += v
            self.step_s += interval_s
            self.steps += 1
        self._pending = {p: 0.0 for p in STEP_PARTS}
        if accept_lens is not None:
            lens = [max(int(a), 0) for a in (accept_lens.tolist() if hasattr(accept_lens, "tolist") else accept_lens)]
            size = max([self.num_draft_tokens] + lens) + 1
            if len(self.accept_hist) < size:
                self.accept_hist = self.accept_hist + [0] * (size - len(self.accept_hist))
            for a in lens:
                self.accept_hist[a] += 1

    def summary(self) -> Dict[str, Any]:
        """JSON-able totals: ``steps``, ``step_ms`` (mean interval), ``ms_per_step`` per part,
        ``accept_length_histogram`` (index = accept length incl. bonus), and the planner's
        predicted survival per draft position summed over ``predicted_survival_rows`` requests
        (chains only; position k's mean compares with P(accept length >= k + 1))."""
        k = max(self.steps, 1)
        return {
            "steps": self.steps,
            "step_ms": self.step_s * 1e3 / k,
            "ms_per_step": {p: v * 1e3 / k for p, v in self.part_s.items()},
            "accept_length_histogram": list(self.accept_hist),
            "predicted_survival_sum": list(self.survival_sum),
            "predicted_survival_rows": self.survival_rows,
        }


@dataclass
class DCutMetrics:
    """Running D-Cut statistics of one worker (host counters + device accumulators)."""

    tiers: Tuple[float, ...]
    steps: int = 0
    pruned_steps: int = 0
    full_tokens: int = 0  # sum of bs * N
    verified_tokens: int = 0  # sum of kept rows (bonus-inclusive)
    padded_tokens: int = 0  # sum of target-forward rows
    requests: int = 0  # sum of bs
    tier_histogram: Dict[str, int] = field(default_factory=dict)
    draft_off_steps: int = 0  # steps run without drafting (also in tier_histogram as DRAFT_OFF_TIER)
    exempt_requests: Dict[str, int] = field(default_factory=lambda: {r: 0 for r in EXEMPT_REASONS})
    uncaptured_steps: int = 0
    predicted_ms_sum: float = 0.0
    measured_ms_sum: float = 0.0
    timed_steps: int = 0
    _accepted: Optional[torch.Tensor] = None  # device scalar, sum of accept_lens
    _accepted_host: int = 0
    _verified: Optional[torch.Tensor] = None  # device scalar, kept rows of pruned steps not yet folded
    _open: Optional["OpenStep"] = None  # the decode step in progress (DCutRunner.begin_step)
    _last_time: Optional[float] = None  # end of the previous verify (StepTiming only)
    timing: Optional[StepTiming] = None  # created when TIMING_ENV is on
    trace: Optional[StepTrace] = None  # created when STEP_TRACE_ENV is set

    def __post_init__(self) -> None:
        if self.timing is None and os.environ.get(TIMING_ENV, "0") not in ("", "0"):
            self.timing = StepTiming()
        if self.trace is None:
            self.trace = StepTrace.from_env()

    def start_step(self, now: float, decode: bool) -> Optional[Tuple[StepDecision, float]]:
        """The step clock: called at the start of every forward of the worker (``now`` from
        ``time.perf_counter()``, no device sync), ``decode`` False for prefill / extend / idle.

        Closes the decode step in progress: when this forward is the next decode step, the step
        was recorded (:meth:`record`) and the interval is shorter than an idle gap (5 s), returns
        ``(its decision, interval in ms)`` and adds it to the predicted / measured step times;
        otherwise (a prefill or anything else in between, an idle gap) the interval is dropped.
        A decode forward opens the next step.
        """
        prev, self._open = self._open, None
        out = None
        if decode and prev is not None and prev.decision is not None and 0.0 <= now - prev.started < _MAX_STEP_GAP_S:
            ms = (now - prev.started) * 1e3
            if prev.decision.predicted_ms is not None:
                self.measured_ms_sum += ms
                self.predicted_ms_sum += prev.decision.predicted_ms
                self.timed_steps += 1
            out = (prev.decision, ms)
            if self.trace is not None:
                self.trace.write(prev.decision, ms)
        if decode:
            self._open = OpenStep(now)
        return out

    def record(self, d: StepDecision, accept_lens: Optional[torch.Tensor]) -> None:  # accept_lens: [batch_size]
        if self.timing is not None:
            now = time.perf_counter()
            self.timing.num_draft_tokens = max(self.timing.num_draft_tokens, d.num_draft_tokens)
            gap = None if self._last_time is None else now - self._last_time
            self.timing.end_step(gap if gap is not None and gap < _MAX_STEP_GAP_S else None, accept_lens)
            self._last_time = now
        if self._open is not None:  # the step clock's step in progress is this one (the first verify counts)
            if self._open.decision is None:
                self._open.decision = d
            else:  # two verifies in one forward: not a comparable step
                self._open = None
        self.steps += 1
        self.requests += d.batch_size
        self.full_tokens += d.batch_size * d.num_draft_tokens
        if isinstance(d.verified_tokens, torch.Tensor):
            v = d.verified_tokens.detach().to(torch.int64)
            self._verified = v if self._verified is None else self._verified + v
        else:
            self.verified_tokens += int(d.verified_tokens)
        self.padded_tokens += d.padded_tokens
        if d.pruned:
            self.pruned_steps += 1
        if d.tier == DRAFT_OFF_TIER:
            self.draft_off_steps += 1
        self.tier_histogram[d.tier] = self.tier_histogram.get(d.tier, 0) + 1
        if accept_lens is not None:
            s = accept_lens.detach().sum().to(torch.int64)
            self._accepted = s if self._accepted is None else self._accepted + s

    def accepted_tokens(self) -> int:
        """Sum of ``accept_lens`` over recorded steps (one host sync, folded into a host int)."""
        if self._accepted is not None:
            self._accepted_host += int(self._accepted.item())
            self._accepted = None
        return self._accepted_host

    def _fold_verified(self) -> None:
        """Add the device-side kept-row count of pruned steps to ``verified_tokens`` (one host sync)."""
        if self._verified is not None:
            self.verified_tokens += int(self._verified.item())
            self._verified = None

    def summary(self) -> Dict[str, Any]:
        """JSON-able snapshot (``/server_info`` ``internal_states[i]["dcut"]["metrics"]``)."""
        accepted = self.accepted_tokens()
        self._fold_verified()
        kept_drafts = self.verified_tokens - self.requests
        return {
            "steps": self.steps,
            "pruned_steps": self.pruned_steps,
            "keep_ratio": (self.verified_tokens / self.full_tokens) if self.full_tokens else None,
            "verified_tokens": self.verified_tokens,
            "padded_tokens": self.padded_tokens,
            "full_tokens": self.full_tokens,
            "accepted_tokens": accepted,
            "accepted_per_verified": (accepted / self.verified_tokens) if self.verified_tokens else None,
            "draft_accept_rate": ((accepted - self.requests) / kept_drafts) if kept_drafts > 0 else None,
            "mean_accept_length": (accepted / self.requests) if self.requests else None,
            "tier_histogram": dict(sorted(self.tier_histogram.items())),
            "draft_off_steps": self.draft_off_steps,
            "exempt_requests": dict(self.exempt_requests),
            "uncaptured_steps": self.uncaptured_steps,
            "predicted_step_ms": (self.predicted_ms_sum / self.timed_steps) if self.timed_steps else None,
            "measured_step_ms": (self.measured_ms_sum / self.timed_steps) if self.timed_steps else None,
            "step_timing": None if self.timing is None else self.timing.summary(),
        }

    def log_line(self) -> str:
        s = self.summary()

        def f(x, fmt="{:.3f}"):
            return "n/a" if x is None else fmt.format(x)

        hist = ", ".join(f"{k}:{v}" for k, v in s["tier_histogram"].items())
        return (f"D-Cut: steps {s['steps']}, keep ratio {f(s['keep_ratio'])}, verified {s['verified_tokens']} / "
                f"accepted {s['accepted_tokens']} tokens (draft accept rate {f(s['draft_accept_rate'])}), "
                f"tiers [{hist}], draft-off steps {s['draft_off_steps']}, step ms predicted {f(s['predicted_step_ms'], '{:.2f}')} / measured "
                f"{f(s['measured_step_ms'], '{:.2f}')}, exempt {s['exempt_requests']}")


@dataclass
class OpenStep:
    """A decode step in progress on the step clock (:meth:`DCutMetrics.start_step`)."""

    started: float  # time.perf_counter() at the start of the step's forward
    decision: Optional[StepDecision] = None  # set by DCutMetrics.record


@dataclass
class PendingObservation:
    """What :meth:`DCutRunner.choose_step` kept, waiting for the step's accept lengths."""

    scores: torch.Tensor  # [num_candidates, slots] raw survival of the draft slots
    kept: torch.Tensor  # [num_candidates, slots] bool
    cand: Optional[torch.Tensor]  # [num_candidates] batch rows; None = every row

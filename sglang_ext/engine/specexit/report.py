"""SpecExit observability: per-request reports, server counters, the exit log line.

The worker computes, per verify step and request row, a small float32 record (the *step
row*, :data:`ROW_FIELDS`) on the device and hands it to SGLang's auxiliary-output channel
(``logits_output.auxiliary_device_output``): the scheduler copies it to the host together
with the step's tokens and calls :meth:`SpecExitHostOutput.consume` right after the tokens
are committed to the requests and before responses are streamed. That is where the
per-request :class:`SpecExitRequestReport` and the server-wide :class:`SpecExitStats` are
updated, so observability adds no host synchronisation to the forward pass.

Per-request ``meta_info`` fields (:data:`META_KEYS`; filled by the output-streamer hook in
``specexit_hooks.py``):

* ``specexit_active``: SpecExit watched this request's thinking phase;
* ``specexit_exited``: thinking was ended early by SpecExit;
* ``specexit_exit_reason``: ``"signals"``, ``"max_think_tokens"`` or None;
* ``specexit_think_tokens``: generated tokens before ``</think>`` (so far, while thinking);
* ``specexit_skipped_tokens_estimate``: the smoothed ``remain`` signal at the exit (None
  when the method does not use ``remain``).

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from sglang_ext.specexit.criterion import ExitReason

logger = logging.getLogger("sglang_ext.specexit")

#: Columns of the per-step device record of each request row.
ROW_FIELDS = ("reason", "natural_end", "remain_score", "keep_drafts", "num_accepted")
ROW_REASON, ROW_NATURAL_END, ROW_REMAIN, ROW_KEEP, ROW_ACCEPTED = range(len(ROW_FIELDS))

#: Names of exit reasons in reports, logs and /server_info.
REASON_NAMES = {int(ExitReason.SIGNALS): "signals", int(ExitReason.MAX_THINK): "max_think_tokens"}

#: Attribute of SGLang's ``Req`` that holds its :class:`SpecExitRequestReport`.
REPORT_ATTR = "specexit_report"

#: Per-request ``meta_info`` keys added by the extension.
META_KEYS = (
    "specexit_active",
    "specexit_exited",
    "specexit_exit_reason",
    "specexit_think_tokens",
    "specexit_skipped_tokens_estimate",
)

#: Seconds between two INFO lines about exits (the others are counted into the next line).
LOG_INTERVAL_S = 10.0


@dataclass
class SpecExitRequestReport:
    """What SpecExit did to one request (kept on SGLang's ``Req``).

    Examples
    --------
    >>> r = SpecExitRequestReport(active=True)
    >>> r.meta_values()
    [True, False, None, None, None]
    """

    active: bool
    exited: bool = False
    reason: Optional[str] = None
    think_tokens: Optional[int] = None
    skipped_tokens_estimate: Optional[float] = None
    natural_end: bool = False
    finalized: bool = False

    def meta_values(self) -> List[object]:
        """Values of :data:`META_KEYS`, in order."""
        return [self.active, self.exited, self.reason, self.think_tokens, self.skipped_tokens_estimate]


@dataclass
class SpecExitStats:
    """Server-wide counters (one scheduler process), reported in ``/server_info``.

    Examples
    --------
    >>> s = SpecExitStats()
    >>> r = SpecExitRequestReport(active=True, exited=True, reason="signals", think_tokens=30)
    >>> s.record_exit(r); s.record_finished(r)
    >>> s.as_dict()["exits_by_reason"], s.as_dict()["mean_think_tokens"]
    ({'signals': 1, 'max_think_tokens': 0}, 30.0)
    """

    exits_by_reason: Dict[str, int] = field(default_factory=lambda: {n: 0 for n in REASON_NAMES.values()})
    natural_ends: int = 0
    unfinished_thinking: int = 0
    finished_thinking_requests: int = 0
    total_think_tokens: int = 0
    total_skipped_tokens_estimate: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_exit(self, report: SpecExitRequestReport) -> None:
        """Count an early exit when it becomes visible."""
        with self.lock:
            self.exits_by_reason[report.reason] = self.exits_by_reason.get(report.reason, 0) + 1
            if report.skipped_tokens_estimate is not None:
                self.total_skipped_tokens_estimate += report.skipped_tokens_estimate

    def record_finished(self, report: SpecExitRequestReport) -> None:
        """Account a finished request that SpecExit watched (think length, natural end)."""
        if not report.active or report.finalized:
            return
        report.finalized = True
        with self.lock:
            self.finished_thinking_requests += 1
            self.natural_ends += int(report.natural_end)
            self.unfinished_thinking += int(not report.exited and not report.natural_end)
            self.total_think_tokens += int(report.think_tokens or 0)

    def as_dict(self) -> Dict[str, object]:
        """The ``/server_info`` payload (plain JSON types)."""
        with self.lock:
            n = self.finished_thinking_requests
            return {
                "exits_by_reason": dict(self.exits_by_reason),
                "exits_total": sum(self.exits_by_reason.values()),
                "natural_ends": self.natural_ends,
                "unfinished_thinking": self.unfinished_thinking,
                "finished_thinking_requests": n,
                "mean_think_tokens": (self.total_think_tokens / n) if n else None,
                "skipped_tokens_estimate_total": self.total_skipped_tokens_estimate,
            }


class ExitLog:
    """Rate-limited INFO line about early exits (at most one per ``interval_s``).

    Examples
    --------
    >>> log = ExitLog(interval_s=3600.0, clock=lambda: 0.0)
    >>> log.note("r1", "signals", 40, 12.0), log.note("r2", "signals", 50, None)
    (True, False)
    """

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.last: Optional[float] = None
        self.suppressed = 0

    def note(self, rid: str, reason: str, think_tokens: Optional[int], skipped: Optional[float]) -> bool:
        """Log this exit now if the interval has passed; returns whether a line was written."""
        now = self.clock()
        if self.last is not None and now - self.last < self.interval_s:
            self.suppressed += 1
            return False
        extra = f"; {self.suppressed} more exits since the last line" if self.suppressed else ""
        shown = "n/a" if skipped is None else f"{skipped:.0f}"
        logger.info("SpecExit: request %s ended thinking early after %s tokens (reason %s, ~%s tokens skipped)%s",
                    rid, think_tokens, reason, shown, extra)
        self.last = now
        self.suppressed = 0
        return True


def first_index(ids: Sequence[int], token: int) -> Optional[int]:
    """Index of the first ``token`` in ``ids`` (None when absent).

    Examples
    --------
    >>> first_index([5, 4, 4], 4), first_index([5], 4)
    (1, None)
    """
    for i, t in enumerate(ids):
        if t == token:
            return i
    return None


@dataclass(frozen=True)
class SpecExitDeviceOutput:
    """The step rows on the device (SGLang ``DeviceAuxiliaryOutput`` protocol).

    Attributes
    ----------
    rows : torch.Tensor
        ``[batch_size, len(ROW_FIELDS)]`` float32, a fresh tensor (never a graph buffer).
    sink : SpecExitSink
        Where the host side goes.
    """

    rows: torch.Tensor  # [batch_size, len(ROW_FIELDS)]
    sink: "SpecExitSink"

    def copy_to_host(self, copy_tensor) -> "SpecExitHostOutput":
        return SpecExitHostOutput(copy_tensor(self.rows), self.sink)


@dataclass(frozen=True)
class SpecExitHostOutput:
    """The step rows on the host (SGLang ``HostAuxiliaryOutput`` protocol)."""

    rows: torch.Tensor  # [batch_size, len(ROW_FIELDS)]
    sink: "SpecExitSink"

    def consume(self, batch, commits) -> None:
        self.sink.consume(batch.reqs, self.rows.tolist(), commits)


class SpecExitSink:
    """Host-side consumer of step rows: updates reports, counters and the log.

    Parameters
    ----------
    stop_think_id : int
        The stop-think token id (to locate ``</think>`` in committed tokens).
    stats : SpecExitStats
        Counters to update.
    log : ExitLog
        The rate-limited log line.
    """

    def __init__(self, stop_think_id: int, stats: SpecExitStats, log: Optional[ExitLog] = None) -> None:
        self.stop_think_id = stop_think_id
        self.stats = stats
        self.log = log if log is not None else ExitLog()

    def consume(self, reqs: Sequence, rows: Sequence[Sequence[float]], commits: Sequence) -> None:
        """Apply one step's rows to the requests of the batch (aligned with ``reqs``).

        ``commits[i]`` is SGLang's ``CommittedTokens`` (``output_index``, ``token_ids``) of
        the tokens request ``i`` made visible this step, or None.
        """
        for req, row, commit in zip(reqs, rows, commits):
            report = getattr(req, REPORT_ATTR, None)
            if report is None or not report.active:
                continue
            if commit is not None and report.think_tokens is None:
                at = first_index(commit.token_ids, self.stop_think_id)
                if at is not None:
                    report.think_tokens = commit.output_index + at
                    reason = int(row[ROW_REASON])
                    if reason in REASON_NAMES and not report.exited:
                        report.exited = True
                        report.reason = REASON_NAMES[reason]
                        remain = row[ROW_REMAIN]
                        report.skipped_tokens_estimate = None if math.isnan(remain) else float(remain)
                        self.stats.record_exit(report)
                        self.log.note(req.rid, report.reason, report.think_tokens, report.skipped_tokens_estimate)
                    elif not report.exited:
                        report.natural_end = True
            if req.finished():
                self.finalize(req, report)

    def finalize(self, req, report: SpecExitRequestReport) -> None:
        """Close a finished request's report (think length when thinking never closed)."""
        if report.finalized:
            return
        if report.think_tokens is None:
            visible = req.output_ids if req.finished_len is None else req.output_ids[: req.finished_len]
            at = first_index(visible, self.stop_think_id)
            report.think_tokens = len(visible) if at is None else at
            report.natural_end = at is not None and not report.exited
        self.stats.record_finished(report)

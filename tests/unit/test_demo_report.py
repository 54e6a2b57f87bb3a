"""The demo's report (``sglang_ext.demo_report``): sums per mode, the table, the summary lines and
the profiling progress parsed from the server's log lines. Pure, no SGLang.

Budget: < 1 s.
"""

import doctest

import pytest

from sglang_ext import demo_report as rep
from sglang_ext.demo_report import FULL, EAGLE3, PLAIN, ModeReport, RequestOutcome


def _out(ids, think=None, correct=None, exited=False, accept=None):
    return RequestOutcome(tuple(ids), len(ids), think, correct, exited, accept)


def _modes():
    plain = ModeReport(PLAIN, [_out(range(10), 8, True), _out(range(20), 18, True)], wall_s=3.0)
    eagle = ModeReport(EAGLE3, [_out(range(10), 8, True, accept=2.0), _out(range(20), 18, True, accept=4.0)],
                       wall_s=1.5, tiers={"full": 9})
    full = ModeReport(FULL, [_out(range(4), 2, True, True, 2.0), _out([7] * 12, 10, False, True, 4.0)],
                      wall_s=0.5, tiers={"0.25": 5, "full": 1, "draft_off": 2})
    return plain, eagle, full


def test_doctests():
    assert doctest.testmod(rep).failed == 0


def test_sums_per_mode():
    plain, eagle, full = _modes()
    assert (plain.output_tokens, plain.think_tokens, plain.correct, plain.n) == (30, 26, 2, 2)
    assert plain.accept_length is None and plain.tok_s == pytest.approx(10.0)
    # tokens per verify step over both requests: 30 tokens in 10 / 2 + 20 / 4 = 10 steps
    assert eagle.accept_length == pytest.approx(3.0)
    assert (full.exits, full.correct) == (2, 1)
    thinking_unknown = ModeReport(PLAIN, [_out([1, 2], None)], wall_s=1.0)
    assert thinking_unknown.think_tokens is None and thinking_unknown.correct is None


def test_table_rows():
    lines = rep.format_table(_modes())
    assert lines[0].split()[:3] == ["mode", "answers", "out"] and len(lines) == 4
    assert lines[1].startswith(PLAIN) and "2/2" in lines[1] and lines[1].rstrip().endswith("-")
    full = lines[3]
    assert full.startswith(FULL) and "1/2" in full and "0.25 x5, draft_off x2, full x1" in full
    assert full.split()[-7] == "2"  # exits, only in the SpecExit row
    inactive = rep.format_table(_modes(), specexit_active=False)[3]
    assert inactive.split()[-7] == "-"


def test_summary_lines():
    plain, eagle, full = _modes()
    se, dc, overall = rep.summary_lines(plain, eagle, full)
    assert se.startswith("SpecExit: ended thinking early on 2 of 2 requests, 14 thinking tokens skipped (54% ")
    assert "answers correct 1/2 (without SpecExit 2/2)" in se
    assert dc.startswith("D-Cut: 8 verify steps, tiers 0.25 x5, full x1, 2 steps with drafting switched off")
    assert dc.endswith("identical to plain decoding on 2/2 requests")
    assert overall == "Overall: wall time against plain decoding: EAGLE3 2.00x, EAGLE3 + SpecExit + D-Cut 6.00x"
    se, dc, _ = rep.summary_lines(plain, eagle, full, specexit_inactive="no single '</think>' token")
    assert se == "SpecExit: inactive: no single '</think>' token"
    assert dc.endswith("with D-Cut on 0/2")  # the second request differs from plain decoding


def test_progress_from_the_profilers_log_lines():
    p = rep.ProfileProgress()
    assert not p.started
    log = ["[t] D-Cut: profiling the cost table: batch sizes [64, 1, 32, 16, 8, 4] x tiers [0.25, 1.0], ...",
           "[t] D-Cut: cost profiling 1/6 batch sizes done (batch size 64 in 6.8 s), about 5 s left",
           "[t] Load weight end.",
           "[t] D-Cut: cost profiling 2/6 batch sizes done (batch size 1 in 0.7 s), about 4 s left"]
    changed = [p.feed(line) for line in log]
    assert changed == [True, True, False, True]
    assert (p.total, p.done, p.left_s) == (6, 2, 4.0)
    bar = rep.progress_bar(p.done, p.total, p.left_s, 7.5, width=6)
    assert bar == "D-Cut cost profiling [##----] 2/6 batch sizes, 8 s so far, about 4 s left"

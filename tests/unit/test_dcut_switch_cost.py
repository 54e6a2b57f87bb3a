"""The switching cost of draft-off steps (pure): the catch-up fit and the draft-off choice charged with it.

A synthetic server at bs 64 (a drafted step 100 ms for 1.3 tokens per request, a draft-off step 70 ms
for 1): by its table draft-off wins by 10 %. Each off step defers one draft-extend row per request,
and the catch-up before the next drafted step costs ``fixed + per_row * rows``. Where that catch-up
is dear (30 ms + 0.25 ms per row: ~16 ms per off step) drafting is really the better choice; where it
is cheap, draft-off still is. The policy is run step by step with the catch-up fit from the catch-ups
it causes (``catch_up``) and without it (the behaviour before), and the realised tokens per ms
compared. Expected values are computed from the scenario's numbers, not by the code under test.
Budget: < 3 s.
"""

import math
import random

import pytest

from sglang_ext.dcut import CostTable, CostTableKey, DraftOffParams, DraftOffState, draft_off_decision
from sglang_ext.dcut.switch_cost import CatchUpCost

KEY = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
BS, DRAFT_MS, OFF_MS, GAIN = 64, 100.0, 70.0, 0.3


def test_fit_recovers_fixed_and_per_row_from_noisy_catch_ups():
    rng = random.Random(0)
    c = CatchUpCost()
    for _ in range(60):
        rows = rng.choice([64, 128, 256, 512])
        assert c.observe(rows, (18.0 + 0.1 * rows) * rng.uniform(0.95, 1.05))
    fixed, per_row = c.estimate()
    assert fixed == pytest.approx(18.0, rel=0.25) and per_row == pytest.approx(0.1, rel=0.1)
    assert c.per_off_step_ms(64, 8) == pytest.approx(per_row * 64 + fixed / 8)


def test_fit_clips_and_ignores_what_is_not_a_catch_up():
    c = CatchUpCost()
    assert not c.observe(0, 10.0) and not c.observe(64, math.inf) and not c.observe(64, 1e9)
    assert c.estimate() is None and c.per_off_step_ms(64, 8) == 0.0
    c.observe(64, -5.0)  # faster than a draft-off step: no cost, never negative
    assert c.estimate() == (0.0, 0.0)
    d = CatchUpCost()
    for rows, ms in ((64, 20.0), (256, 5.0)):  # falling with the rows: a constant, per_row clipped
        d.observe(rows, ms)
    fixed, per_row = d.estimate()
    assert per_row == 0.0 and fixed == pytest.approx((0.9 * 20.0 + 5.0) / 1.9)  # weighted mean (forget 0.9)


def _simulate(fixed_ms, per_row_ms, charge, steps=800):
    """Tokens per ms and switches of the policy on the synthetic server."""
    table = CostTable.build(KEY, [BS], [[DRAFT_MS]], tiers=(1.0,), off_ms=[OFF_MS], created="2026-01-01T00:00:00+00:00")
    params = DraftOffParams()
    state = DraftOffState(gains=(GAIN,), dwell=params.min_dwell)
    fit = CatchUpCost()
    pending = ms = tokens = 0.0
    switches, was_off = 0, False
    for _ in range(steps):
        d = draft_off_decision(state, BS, table, params, off_observed=True,
                               catch_up=fit.estimate() if charge else None)
        state = d.state
        if d.off:
            ms += OFF_MS
            tokens += BS
            pending += BS
        else:
            if pending:  # the catch-up extend before the drafted step
                extra = fixed_ms + per_row_ms * pending
                ms += extra
                fit.observe(int(pending), extra)
                pending = 0
            ms += DRAFT_MS
            tokens += BS * (1 + GAIN)
        switches += d.off != was_off
        was_off = d.off
    return tokens / ms, switches


def test_a_dear_catch_up_keeps_drafting_on():
    drafting = BS * (1 + GAIN) / DRAFT_MS  # 0.832 tokens/ms, what always drafting gets
    charged, charged_switches = _simulate(30.0, 0.25, charge=True)
    blind, _ = _simulate(30.0, 0.25, charge=False)
    # per off step 70 + 0.25 * 64 = 86 ms (+ 30 ms per catch-up): 0.74 tokens/ms at best
    assert blind < 0.92 * drafting, blind
    assert charged > 0.97 * drafting and charged > 1.05 * blind, (charged, blind)
    assert charged_switches <= 4, charged_switches  # one short off run until the first catch-up is measured


def test_a_cheap_catch_up_still_switches_drafting_off():
    off = BS / OFF_MS  # 0.914 tokens/ms without any catch-up
    charged, _ = _simulate(2.0, 0.01, charge=True)
    blind, _ = _simulate(2.0, 0.01, charge=False)
    # per off step 70.64 ms plus 2 ms per catch-up: off stays the better choice, charged or not
    assert charged > 0.97 * blind and charged > 0.95 * off, (charged, blind)

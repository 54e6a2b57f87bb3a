"""SpecExit exit criterion: boundaries, strict thresholds, guards, stop token, NaN signals.

Pure: no sglang import. Every expected value is worked out by hand from the token diagram
in ``criterion.py`` / docs/algorithms.md#specexit-step-procedure (n_j = think_tokens + j is the thinking length
through r_j).
Budget: < 5 s.
"""

import pytest
import torch

from sglang_ext.specexit.criterion import (
    NO_BOUNDARY,
    NO_MAX_THINK,
    PAD_TOKEN,
    ExitReason,
    decide_exit,
    pad_ragged,
    signal_test,
    single_token_ids,
    split_emitted_run,
    stop_think_token_id,
)
from sglang_ext.specexit.signals import ALL_METHODS, Signal

BOUNDARY = (7, 8)  # "\n\n" and ".\n\n" in this toy vocabulary
STOP = 9
T = 10  # an ordinary thinking token
NAN = float("nan")


def decide_one(
    root,
    accepted,
    bonus,
    passes=True,
    thinking=True,
    think_tokens=100,
    min_think=0,
    max_think=NO_MAX_THINK,
    grace=64,
    width=5,
):
    """decide_exit for a single request; returns plain Python values."""
    row = list(accepted) + [PAD_TOKEN] * (width - len(accepted))
    d = decide_exit(
        thinking=torch.tensor([thinking]),
        root_ids=torch.tensor([root]),
        accepted_ids=torch.tensor([row]),
        bonus_ids=torch.tensor([bonus]),
        think_tokens=torch.tensor([think_tokens]),
        signals_pass=torch.tensor([passes]),
        min_think_tokens=torch.tensor([min_think]),
        max_think_tokens=torch.tensor([max_think]),
        max_think_grace=torch.tensor([grace]),
        boundary_ids=torch.tensor(BOUNDARY),
        stop_think_id=STOP,
    )
    return {
        "exit": bool(d.exit[0]),
        "keep": int(d.keep_drafts[0]),
        "reason": ExitReason(int(d.reason[0])),
        "natural": bool(d.natural_end[0]),
        "first": int(d.first_boundary[0]),
        "a": int(d.num_accepted[0]),
        "emitted": int(d.emitted_len[0]),
        "still": bool(d.still_thinking[0]),
    }


# --- boundary position ---------------------------------------------------------------------


def test_boundary_is_the_root():
    # R = (7, T, T); j* = 0: keep no draft, emit only stop (L' = 1).
    d = decide_one(7, [T, T], T)
    assert (d["exit"], d["keep"], d["emitted"], d["reason"], d["first"]) == (True, 0, 1, ExitReason.SIGNALS, 0)
    assert not d["still"]


def test_boundary_in_the_middle():
    # R = (T, T, 8, T); j* = 2: keep r_1, r_2 (the boundary), drop r_3.
    d = decide_one(T, [T, 8, T], T)
    assert (d["exit"], d["keep"], d["emitted"], d["first"], d["a"]) == (True, 2, 3, 2, 3)


def test_boundary_is_the_last_accepted_draft():
    # j* = a = 3: a pure bonus override, no length change (emitted stays a + 1 = 4).
    d = decide_one(T, [T, T, 7], T)
    assert (d["exit"], d["keep"], d["emitted"], d["first"]) == (True, 3, 4, 3)


def test_first_of_several_boundaries_is_used():
    d = decide_one(T, [8, T, 7], T)
    assert (d["keep"], d["first"]) == (1, 1)


def test_no_boundary_keeps_everything():
    d = decide_one(T, [T, T], T)
    assert (d["exit"], d["keep"], d["emitted"], d["reason"], d["first"]) == (False, 2, 3, ExitReason.NONE, NO_BOUNDARY)
    assert d["still"]


def test_a_boundary_bonus_is_not_a_candidate():
    d = decide_one(T, [T], 7)
    assert (d["exit"], d["first"]) == (False, NO_BOUNDARY)


def test_no_accepted_draft_only_the_root_is_examined():
    d = decide_one(T, [], T)
    assert (d["exit"], d["keep"], d["a"], d["emitted"]) == (False, 0, 0, 1)
    d = decide_one(8, [], T)
    assert (d["exit"], d["keep"], d["emitted"]) == (True, 0, 1)


def test_failing_signals_do_not_exit_but_the_boundary_is_reported():
    d = decide_one(T, [7, T], T, passes=False)
    assert (d["exit"], d["keep"], d["first"], d["reason"]) == (False, 2, 1, ExitReason.NONE)


def test_not_thinking_is_never_touched():
    d = decide_one(7, [7, STOP], STOP, thinking=False)
    assert (d["exit"], d["natural"], d["first"], d["keep"], d["still"]) == (False, False, NO_BOUNDARY, 2, False)


# --- stop token ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "root, accepted, bonus",
    [
        (T, [T, STOP, 7], T),  # accepted, a boundary after it (answer text)
        (T, [STOP], T),  # accepted as the only draft
        (T, [T, T], STOP),  # as the bonus
        (STOP, [7], T),  # as the root (e.g. the prefill token)
    ],
)
def test_stop_token_among_the_step_tokens_is_a_natural_end(root, accepted, bonus):
    d = decide_one(root, accepted, bonus)
    assert d["natural"] and not d["exit"] and not d["still"]
    assert d["keep"] == len(accepted) and d["reason"] == ExitReason.NONE and d["first"] == NO_BOUNDARY


@pytest.mark.parametrize(
    "root, accepted, bonus, keep",
    [
        (T, [7, STOP, T], T, 1),  # a boundary before an accepted stop token
        (T, [T, 7], STOP, 2),  # the last accepted draft is a boundary, the bonus is the stop token
        (8, [STOP], T, 0),  # the root is a boundary
    ],
)
def test_a_boundary_before_the_stop_token_is_examined_and_can_exit(root, accepted, bonus, keep):
    # Per token: whether the stop token arrives in the same step as the boundary or later must
    # not matter, so the boundary is examined first and an exit there wins.
    d = decide_one(root, accepted, bonus)
    assert d["exit"] and d["keep"] == keep and d["reason"] == ExitReason.SIGNALS
    assert not d["natural"] and not d["still"] and d["first"] == keep
    failing = decide_one(root, accepted, bonus, passes=False)
    assert failing["natural"] and not failing["exit"] and failing["keep"] == len(accepted)


def test_max_think_never_forces_at_or_after_the_stop_token():
    # n_j = 100 + j >= M + G everywhere: the root is forced; with the stop token as the root nothing is
    assert decide_one(T, [T, STOP], T, max_think=1, grace=0)["keep"] == 0
    d = decide_one(STOP, [T, T], T, max_think=1, grace=0)
    assert d["natural"] and not d["exit"]


def test_signals_pass_per_position():
    # Boundaries at j = 1 and j = 3; the test passes only at j = 3.
    row = [7, T, 8, PAD_TOKEN]
    d = decide_exit(
        thinking=torch.tensor([True]),
        root_ids=torch.tensor([T]),
        accepted_ids=torch.tensor([row]),
        bonus_ids=torch.tensor([T]),
        think_tokens=torch.tensor([10]),
        signals_pass=torch.tensor([[True, False, True, True, True]]),
        min_think_tokens=torch.tensor([0]),
        max_think_tokens=torch.tensor([NO_MAX_THINK]),
        max_think_grace=torch.tensor([0]),
        boundary_ids=torch.tensor(BOUNDARY),
        stop_think_id=STOP,
    )
    assert d.exit.tolist() == [True] and d.keep_drafts.tolist() == [3] and d.first_boundary.tolist() == [1]


def test_pad_entries_never_match_stop_or_boundary():
    # PAD = -1 is not a token; an id equal to nothing in B.
    d = decide_one(T, [T], T, width=4)
    assert (d["natural"], d["exit"], d["a"]) == (False, False, 1)


# --- min / max think guards ----------------------------------------------------------------


def test_min_think_skips_an_early_boundary_and_exits_at_a_later_one():
    # think_tokens 10: n_j = 10 + j. Boundaries at j = 1 (n = 11) and j = 3 (n = 13).
    d = decide_one(T, [7, T, 8], T, think_tokens=10, min_think=12)
    assert (d["exit"], d["keep"], d["first"]) == (True, 3, 1)


def test_min_think_exactly_reached_allows_the_exit():
    d = decide_one(T, [7], T, think_tokens=10, min_think=11)  # n_1 = 11 >= 11
    assert (d["exit"], d["keep"]) == (True, 1)
    d = decide_one(T, [7], T, think_tokens=10, min_think=12)  # n_1 = 11 < 12
    assert not d["exit"]


def test_max_think_forces_an_exit_at_a_boundary_without_signal_test():
    # M = 12: the boundary at j = 1 (n = 11) is before M, the one at j = 3 (n = 13) after.
    d = decide_one(T, [7, T, 8, T], T, passes=False, think_tokens=10, max_think=12, grace=64)
    assert (d["exit"], d["keep"], d["reason"], d["first"]) == (True, 3, ExitReason.MAX_THINK, 1)


def test_max_think_boundary_exactly_at_m():
    d = decide_one(T, [T, 7], T, passes=False, think_tokens=10, max_think=12)  # n_2 = 12
    assert (d["exit"], d["keep"], d["reason"]) == (True, 2, ExitReason.MAX_THINK)


def test_max_think_grace_end_without_boundary():
    # M = 11, G = 2: no boundary; the window ends at n = 13 -> j = 3.
    d = decide_one(T, [T, T, T, T], T, passes=False, think_tokens=10, max_think=11, grace=2)
    assert (d["exit"], d["keep"], d["emitted"], d["reason"]) == (True, 3, 4, ExitReason.MAX_THINK)


def test_max_think_grace_window_not_yet_over():
    d = decide_one(T, [T, T], T, passes=False, think_tokens=10, max_think=11, grace=5)  # n <= 12 < 16
    assert not d["exit"]


def test_max_think_zero_grace_cuts_at_m():
    d = decide_one(T, [T, T, T], T, passes=False, think_tokens=10, max_think=12, grace=0)
    assert (d["exit"], d["keep"]) == (True, 2)


def test_max_think_already_exceeded_cuts_at_the_root():
    d = decide_one(T, [T], T, passes=False, think_tokens=500, max_think=100, grace=64)
    assert (d["exit"], d["keep"], d["emitted"], d["reason"]) == (True, 0, 1, ExitReason.MAX_THINK)


def test_signal_reason_wins_when_both_fire_at_the_same_position():
    d = decide_one(T, [7], T, passes=True, think_tokens=10, max_think=5)
    assert d["reason"] == ExitReason.SIGNALS


def test_signals_exit_before_the_max_think_point():
    # Signal boundary at j = 1 comes before the forced one.
    d = decide_one(T, [7, T, T], T, passes=True, think_tokens=10, max_think=12, grace=0)
    assert (d["keep"], d["reason"]) == (1, ExitReason.SIGNALS)


def test_max_think_ignores_min_think():
    d = decide_one(T, [7], T, passes=True, think_tokens=10, min_think=50, max_think=11)
    assert (d["exit"], d["keep"], d["reason"]) == (True, 1, ExitReason.MAX_THINK)


def test_max_think_off_never_forces():
    d = decide_one(T, [T, T, T], T, passes=False, think_tokens=10_000, max_think=NO_MAX_THINK, grace=0)
    assert not d["exit"]


# --- a batch is the sum of its rows ----------------------------------------------------------


def test_a_mixed_batch_equals_each_request_alone():
    cases = [
        dict(root=7, accepted=[T, T], bonus=T),
        dict(root=T, accepted=[T, 8, T], bonus=T),
        dict(root=T, accepted=[T, STOP], bonus=T),
        dict(root=T, accepted=[T, T], bonus=T, passes=False, think_tokens=10, max_think=11, grace=1),
        dict(root=T, accepted=[], bonus=7),
        dict(root=T, accepted=[7, T], bonus=T, thinking=False),
        dict(root=T, accepted=[7, T, 8], bonus=T, think_tokens=10, min_think=12),
    ]
    width = 5
    full = {k: [] for k in ("root", "accepted", "bonus", "passes", "thinking", "think", "min", "max", "grace")}
    for c in cases:
        full["root"].append(c["root"])
        full["accepted"].append(c["accepted"] + [PAD_TOKEN] * (width - len(c["accepted"])))
        full["bonus"].append(c["bonus"])
        full["passes"].append(c.get("passes", True))
        full["thinking"].append(c.get("thinking", True))
        full["think"].append(c.get("think_tokens", 100))
        full["min"].append(c.get("min_think", 0))
        full["max"].append(c.get("max_think", NO_MAX_THINK))
        full["grace"].append(c.get("grace", 64))
    d = decide_exit(
        thinking=torch.tensor(full["thinking"]),
        root_ids=torch.tensor(full["root"], dtype=torch.int32),
        accepted_ids=torch.tensor(full["accepted"], dtype=torch.int32),
        bonus_ids=torch.tensor(full["bonus"], dtype=torch.int32),
        think_tokens=torch.tensor(full["think"]),
        signals_pass=torch.tensor(full["passes"]),
        min_think_tokens=torch.tensor(full["min"]),
        max_think_tokens=torch.tensor(full["max"]),
        max_think_grace=torch.tensor(full["grace"]),
        boundary_ids=torch.tensor(BOUNDARY),
        stop_think_id=STOP,
    )
    for i, c in enumerate(cases):
        alone = decide_one(**c, width=width)
        assert bool(d.exit[i]) == alone["exit"], i
        assert int(d.keep_drafts[i]) == alone["keep"], i
        assert int(d.reason[i]) == alone["reason"], i
        assert bool(d.natural_end[i]) == alone["natural"], i
        assert int(d.first_boundary[i]) == alone["first"], i
    # Spot-check the hand-computed values of the batch.
    assert d.exit.tolist() == [True, True, False, True, False, False, True]
    assert d.keep_drafts.tolist() == [0, 2, 2, 2, 0, 2, 3]  # row 3: grace ends at n = 12, j = 2


# --- thresholds ------------------------------------------------------------------------------

ALL = torch.ones(1, 3, dtype=torch.bool)
THRESHOLDS = torch.tensor([[0.8, 0.3, 200.0]])


@pytest.mark.parametrize(
    "scores, expected",
    [
        ([0.8, 0.5, 100.0], False),  # confidence exactly at its threshold
        ([0.9, 0.3, 100.0], False),  # progress exactly at its threshold
        ([0.9, 0.5, 200.0], False),  # remain exactly at its threshold
        ([0.8000001, 0.3000001, 199.99998], True),  # just past every limit (float32)
        ([0.9, 0.5, 0.0], True),  # remain 0 passes (only "no value" fails)
        ([NAN, 0.5, 100.0], False),
        ([0.9, NAN, 100.0], False),
        ([0.9, 0.5, NAN], False),
    ],
)
def test_thresholds_are_strict_and_nan_fails(scores, expected):
    out = signal_test(torch.tensor([scores]), ALL, ALL, THRESHOLDS)
    assert out.tolist() == [expected]


def test_undefined_scores_fail_even_with_a_passing_value():
    defined = torch.tensor([[True, False, True]])
    assert signal_test(torch.tensor([[0.9, 0.5, 100.0]]), defined, ALL, THRESHOLDS).tolist() == [False]
    # ... unless the method does not use that signal.
    active = torch.tensor([[True, False, True]])
    assert signal_test(torch.tensor([[0.9, NAN, 100.0]]), defined, active, THRESHOLDS).tolist() == [True]


def test_no_enabled_signal_never_passes():
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert signal_test(torch.tensor([[0.9, 0.5, 1.0]]), ALL, none, THRESHOLDS).tolist() == [False]


@pytest.mark.parametrize("method", ALL_METHODS, ids=lambda m: m.name)
def test_every_method_tests_exactly_its_signals(method):
    active = torch.tensor([method.active_columns])
    # Each row fails exactly one signal: confidence, progress, remain; the last row passes all.
    scores = torch.tensor(
        [[0.5, 0.9, 10.0], [0.9, 0.1, 10.0], [0.9, 0.9, 500.0], [0.9, 0.9, 10.0]]
    )
    out = signal_test(scores, torch.ones(4, 3, dtype=torch.bool), active.expand(4, 3), THRESHOLDS.expand(4, 3))
    expected = [
        not method.uses(Signal.CONFIDENCE),
        not method.uses(Signal.PROGRESS),
        not method.uses(Signal.REMAIN),
        True,
    ]
    assert out.tolist() == expected


# --- engine layout helpers -------------------------------------------------------------------


def test_split_emitted_run_on_the_verify_edit_map_example():
    # bs = 2, N = 4: next_token_ids [11,12,13,99 | 21,22,77,0], accept_lens [4, 3].
    accepted, bonus = split_emitted_run(torch.tensor([11, 12, 13, 99, 21, 22, 77, 0], dtype=torch.int32),
                                        torch.tensor([4, 3], dtype=torch.int32), 4)
    assert accepted.tolist() == [[11, 12, 13], [21, 22, PAD_TOKEN]]
    assert bonus.tolist() == [99, 77]
    accepted, bonus = split_emitted_run(torch.tensor([5, 0, 0]), torch.tensor([1]), 3)
    assert accepted.tolist() == [[PAD_TOKEN, PAD_TOKEN]] and bonus.tolist() == [5]


def test_pad_ragged():
    out = pad_ragged(torch.tensor([4, 7, 8, 9]), torch.tensor([0, 3, 3, 4]), width=3)
    assert out.tolist() == [[4, 7, 8], [-1, -1, -1], [9, -1, -1]]
    assert pad_ragged(torch.tensor([], dtype=torch.int64), torch.tensor([0, 0]), width=2).tolist() == [[-1, -1]]


def test_single_token_ids_keeps_single_tokens_and_dedupes():
    vocab = {"\n\n": [7], "\n\n\n": [7], ".\n\n": [8], " \n\n": [1, 7]}
    ids, dropped = single_token_ids(vocab.__getitem__, ["\n\n", "\n\n\n", ".\n\n", " \n\n"])
    assert ids == (7, 8) and dropped == (" \n\n",)


def test_stop_think_token_must_be_one_token():
    assert stop_think_token_id(lambda s: [STOP], "</think>") == STOP
    with pytest.raises(ValueError, match="encodes to 3 tokens"):
        stop_think_token_id(lambda s: [1, 2, 3], "</think>")


def test_emitted_len_and_cut_reproduce_the_verify_edit_map_example():
    # Request 0: root 100, E = (11, 12, 13, 99) with 11 a boundary -> L' = 2, emits (11, STOP).
    accepted, bonus = split_emitted_run(torch.tensor([11, 12, 13, 99, 21, 22, 77, 0]), torch.tensor([4, 3]), 4)
    d = decide_exit(
        thinking=torch.tensor([True, True]),
        root_ids=torch.tensor([100, 200]),
        accepted_ids=accepted,
        bonus_ids=bonus,
        think_tokens=torch.tensor([50, 50]),
        signals_pass=torch.tensor([True, True]),
        min_think_tokens=torch.tensor([0, 0]),
        max_think_tokens=torch.tensor([NO_MAX_THINK, NO_MAX_THINK]),
        max_think_grace=torch.tensor([0, 0]),
        boundary_ids=torch.tensor([11]),
        stop_think_id=151668,
    )
    assert d.emitted_len.tolist() == [2, 3]
    assert d.keep_drafts.tolist() == [1, 2]
    assert d.exit.tolist() == [True, False]


def test_one_token_verify_without_drafts():
    """A draft-off step (N = 1): no accepted drafts, the root alone can be the exit boundary."""
    accepted, bonus = split_emitted_run(torch.tensor([21, 22, 151668]), torch.tensor([1, 1, 1]), 1)
    assert accepted.shape == (3, 0) and bonus.tolist() == [21, 22, 151668]
    d = decide_exit(
        thinking=torch.tensor([True, True, True]),
        root_ids=torch.tensor([11, 12, 13]),  # request 0 sits on the boundary token 11
        accepted_ids=accepted,
        bonus_ids=bonus,
        think_tokens=torch.tensor([50, 50, 50]),
        signals_pass=torch.tensor([True, True, True]),
        min_think_tokens=torch.tensor([0, 0, 0]),
        max_think_tokens=torch.tensor([NO_MAX_THINK, NO_MAX_THINK, NO_MAX_THINK]),
        max_think_grace=torch.tensor([0, 0, 0]),
        boundary_ids=torch.tensor([11]),
        stop_think_id=151668,
    )
    # request 0 exits at the root (keeps 0 drafts, its bonus becomes the stop token); request 1 has
    # no boundary; request 2's bonus is the stop token itself: a natural end
    assert d.exit.tolist() == [True, False, False]
    assert d.keep_drafts.tolist() == [0, 0, 0]
    assert d.natural_end.tolist() == [False, False, True]
    assert d.emitted_len.tolist() == [1, 1, 1]

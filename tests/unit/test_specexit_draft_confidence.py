"""Training-free ``draft-confidence`` signal source: definition by hand, NaN rule, use in the state.

Pure: no sglang import. Expected values are hand-computed from the definition in
``draft_confidence.py`` (each committed token observed with the draft's one-step confidence at its
position, known at the decision for r_0 and r_1 only: the lagged state).
Budget: < 3 s.
"""

import math

import pytest
import torch

from sglang_ext.specexit.criterion import PAD_TOKEN
from sglang_ext.specexit.draft_confidence import (
    check_signal_source,
    draft_confidence_signals,
    max_softmax,
)
from sglang_ext.specexit.overrides import SpecExitOptions
from sglang_ext.specexit.signals import ALL_METHODS
from sglang_ext.specexit.state import SpecExitState


def test_max_softmax_by_hand():
    # softmax([ln 1, ln 3]) = [0.25, 0.75]; uniform over 4 -> 0.25
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0]], dtype=torch.float64)
    assert max_softmax(logits).tolist() == pytest.approx([0.75, 0.75], rel=1e-15)
    assert max_softmax(torch.zeros(1, 4)).tolist() == [0.25]


def test_max_softmax_is_stable_for_large_logits_and_low_precision():
    out = max_softmax(torch.tensor([[1000.0, 0.0], [-1000.0, -1000.0]]))
    assert out[0].item() == 1.0 and out[1].item() == 0.5
    half = max_softmax(torch.tensor([[0.0, math.log(3.0)]], dtype=torch.bfloat16))
    assert half.dtype == torch.float32 and abs(half.item() - 0.75) < 1e-2


def test_known_columns_carry_the_values_and_the_rest_is_nan():
    values = torch.tensor([[0.5, 0.25], [0.9, float("nan")]])
    out = draft_confidence_signals(values, width=4)  # [2, 4, NUM_SIGNALS]
    assert out.shape == (2, 4, 3)
    assert out[0, :2, 0].tolist() == [0.5, 0.25] and out[1, 0, 0].item() == pytest.approx(0.9)
    assert torch.isnan(out[1, 1, 0]) and torch.isnan(out[:, 2:]).all()  # r_2.. not known yet
    assert torch.isnan(out[:, :, 1:]).all()  # progress and remain have no value from this source
    narrow = draft_confidence_signals(values, width=1)  # a draft-off step: the root only
    assert narrow.shape == (2, 1, 3) and narrow[:, 0, 0].tolist() == pytest.approx([0.5, 0.9])


def test_draft_confidence_drives_a_lagged_exit_by_hand():
    # Method "confidence", EWMA alpha 0.5, threshold 0.8, boundary 7. Token values by position:
    # p:    0    1    2    3    4    5    6
    # tok: 10   10   10   10    7   10   10
    # q:  nan  1.0  0.6  0.9  1.0  ...
    # Step 1 (root p0, r_1 p1, r_2 p2, bonus p3): known p0 (none), p1 -> e = 1.0; p2 owed.
    # Step 2 (root p3, r_1 = 7 at p4): owed p2 (0.6) -> 0.8, p3 (0.9) -> 0.85, p4 (1.0) -> 0.925 > 0.8
    # at the boundary: exit keeping r_1.
    state = SpecExitState.allocate(1, [7], 9, max_window=16, dtype=torch.float64)
    state.reset([0], [SpecExitOptions(method="confidence", ewma_alpha=0.5)], think_tokens=1)
    slot = torch.tensor([0])
    q = [float("nan"), 1.0, 0.6, 0.9, 1.0]

    def step(root_pos, accepted, bonus):
        row = torch.tensor([accepted + [PAD_TOKEN] * (3 - len(accepted))])
        cut, keep = state.truncation(slot, torch.tensor([10]), row, torch.tensor([bonus]), 2)
        assert not cut.any()
        known = draft_confidence_signals(torch.tensor([q[root_pos : root_pos + 2]], dtype=torch.float64), 4)
        owed_pos = state.backlog_positions(slot, torch.tensor([root_pos]))
        owed = torch.full((1, owed_pos.shape[1], 3), float("nan"), dtype=torch.float64)
        for c, p in enumerate(owed_pos[0].tolist()):
            if p >= 0:
                owed[0, c, 0] = q[p]
        return state.step(slot, torch.tensor([10]), row, torch.tensor([bonus]), known, known_columns=2,
                          backlog_observations=owed)

    d = step(0, [10, 10], 10)
    assert not d.exit.any() and state.scores(slot)[0][0, 0].item() == 1.0
    assert state.backlog_positions(slot, torch.tensor([3])).tolist() == [[2, -1]]
    d = step(3, [7], 10)
    assert d.exit.tolist() == [True] and d.keep_drafts.tolist() == [1]
    assert state.scores(slot)[0][0, 0].item() == pytest.approx(0.925)


def test_signal_source_check():
    for method in ALL_METHODS:
        check_signal_source("head", method)  # the head serves every method
        if method.name == "confidence":
            check_signal_source("draft-confidence", method)
        else:
            with pytest.raises(ValueError, match="provides confidence only"):
                check_signal_source("draft-confidence", method)
    with pytest.raises(ValueError, match="unknown signal source 'probe'"):
        check_signal_source("probe", ALL_METHODS[0])

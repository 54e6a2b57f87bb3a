"""Training-free ``draft-confidence`` signal source: definition by hand, NaN rule, use in the state.

Pure: no sglang import. Expected values are hand-computed from the definition in
``draft_confidence.py`` (mean draft probability over the accepted drafts; none -> no value).
Budget: < 3 s.
"""

import math

import pytest
import torch

from sglang_ext.specexit.criterion import PAD_TOKEN
from sglang_ext.specexit.draft_confidence import (
    check_signal_source,
    draft_confidence_observation,
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


def test_observation_is_the_mean_over_accepted_drafts_only():
    probs = torch.tensor([[0.5, 0.25, 1.0, 0.125], [0.9, 0.9, 0.9, 0.9], [1.0, 0.5, 0.5, 0.5]])
    out = draft_confidence_observation(probs, torch.tensor([2, 0, 4]))
    assert out[0].item() == 0.375  # (0.5 + 0.25) / 2; 1.0 and 0.125 were not accepted
    assert math.isnan(out[1].item())  # no accepted draft: no observation
    assert out[2].item() == 0.625


def test_ignored_entries_may_hold_anything():
    probs = torch.tensor([[0.5, float("nan"), float("inf")]])
    assert draft_confidence_observation(probs, torch.tensor([1])).tolist() == [0.5]


def test_signals_fill_only_the_confidence_column():
    out = draft_confidence_signals(torch.tensor([[0.5, 1.0], [0.2, 0.2]]), torch.tensor([2, 0]))
    assert out[0, 0].item() == 0.75
    assert math.isnan(out[1, 0].item())
    assert torch.isnan(out[:, 1:]).all()


def test_draft_confidence_drives_an_exit_and_skips_steps_without_accepted_drafts():
    # Method "confidence" (the only one this source serves), EWMA alpha 0.5, threshold 0.8.
    state = SpecExitState.allocate(1, [7], 9, max_window=16, dtype=torch.float64)
    state.reset([0], [SpecExitOptions(method="confidence", ewma_alpha=0.5)], think_tokens=1)
    slot = torch.tensor([0])

    def step(accepted, probs):
        row = accepted + [PAD_TOKEN] * (3 - len(accepted))
        obs = draft_confidence_signals(torch.tensor([probs], dtype=torch.float64), torch.tensor([len(accepted)]))
        return state.step(slot, torch.tensor([10]), torch.tensor([row]), torch.tensor([10]), obs)

    step([10, 10], [1.0, 0.8, 0.3])  # x = 0.9 -> e = 0.9
    step([], [0.1, 0.1, 0.1])  # no accepted draft: nothing pushed, e stays 0.9
    assert state.scores(slot)[0][0, 0].item() == 0.9
    d = step([10, 7], [0.5, 0.5, 0.5])  # test uses e = 0.9 > 0.8 -> exit at the boundary r_2
    assert d.exit.tolist() == [True] and d.keep_drafts.tolist() == [2]


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

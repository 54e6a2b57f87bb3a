"""Training-free ``draft-confidence`` signal source: definition by hand, NaN rule, use in the state.

Pure: no sglang import. Expected values are hand-computed from the definition in
``draft_confidence.py`` (each accepted draft observed with its draft probability, the root
with none).
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


def test_each_accepted_draft_is_observed_with_its_probability_and_the_root_with_none():
    probs = torch.tensor([[0.5, 0.25, 1.0], [0.9, 0.8, 0.7]])
    out = draft_confidence_signals(probs, width=4)  # [2, 4, NUM_SIGNALS]
    assert out.shape == (2, 4, 3)
    assert torch.isnan(out[:, 0]).all()  # r_0: the draft did not propose it
    assert out[0, 1:, 0].tolist() == [0.5, 0.25, 1.0] and out[1, 1:, 0].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert torch.isnan(out[:, :, 1:]).all()  # progress and remain have no value from this source
    narrow = draft_confidence_signals(probs, width=2)  # a draft-off width or a shallow tree
    assert narrow[:, 1, 0].tolist() == pytest.approx([0.5, 0.9])


def test_draft_confidence_drives_an_exit_per_token_and_skips_roots():
    # Method "confidence" (the only one this source serves), EWMA alpha 0.5, threshold 0.8.
    state = SpecExitState.allocate(1, [7], 9, max_window=16, dtype=torch.float64)
    state.reset([0], [SpecExitOptions(method="confidence", ewma_alpha=0.5)], think_tokens=1)
    slot = torch.tensor([0])

    def step(accepted, probs):
        row = accepted + [PAD_TOKEN] * (3 - len(accepted))
        obs = draft_confidence_signals(torch.tensor([probs], dtype=torch.float64), width=4)
        return state.step(slot, torch.tensor([10]), torch.tensor([row]), torch.tensor([10]), obs)

    step([10, 10], [1.0, 0.8, 0.3])  # pushes 1.0 then 0.8 (0.3 not accepted): e = 1.0, 0.9
    assert state.scores(slot)[0][0, 0].item() == 0.9
    step([], [0.1, 0.1, 0.1])  # no accepted draft: nothing pushed, e stays 0.9
    assert state.scores(slot)[0][0, 0].item() == 0.9
    d = step([10, 7], [0.5, 1.0, 0.5])  # e = 0.7 after r_1, 0.85 at the boundary r_2 -> exit there
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

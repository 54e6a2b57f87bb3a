"""SpecExit smoothers: hand-computed sequences, warm-up, paragraph cuts, batched == scalar.

Pure: no sglang import. Expected sequences are computed by hand from the formulas of
docs/algorithms.md#specexit-smoothing (dyadic inputs, so they are exact in float); the random check compares
the batched state with an independent scalar reference written below.
Budget: < 5 s.
"""

import math
import random

import pytest
import torch

from sglang_ext.specexit.smoothing import SmootherState, SmoothingKind

NAN = float("nan")
K = SmoothingKind


def run_sequence(kind, xs, alpha=0.1, window=10, cut_before=()):
    """Push xs one by one into a fresh 1-slot, 1-signal smoother; return scores after each."""
    state = SmootherState.allocate(2, 1, max_window=16, dtype=torch.float64)
    state.reset([1], kind=[kind], alpha=[alpha], window=[window])
    out = []
    for t, x in enumerate(xs):
        if t in cut_before:
            state.paragraph_cut([1])
        state.push([1], torch.tensor([[x]], dtype=torch.float64))
        value, defined = state.scores([1])
        out.append(value.item() if defined.item() else None)
        assert math.isnan(value.item()) == (not defined.item())
    return out


def test_ewma_hand_sequence_with_alpha_half():
    # e1 = 1; e2 = .5*0 + .5*1 = .5; e3 = .5*.5 + .5*.5 = .5; e4 = .5*1 + .5*.5 = .75
    assert run_sequence(K.EWMA, [1.0, 0.0, 0.5, 1.0], alpha=0.5) == [1.0, 0.5, 0.5, 0.75]


def test_ewma_default_alpha_and_first_value():
    # alpha 0.1: e1 = 1, e2 = 0.9, e3 = 0.81
    out = run_sequence(K.EWMA, [1.0, 0.0, 0.0], alpha=0.1)
    assert out == pytest.approx([1.0, 0.9, 0.81], rel=1e-15)


def test_ewma_alpha_one_is_the_last_value():
    assert run_sequence(K.EWMA, [3.0, 5.0, 2.0], alpha=1.0) == [3.0, 5.0, 2.0]


def test_mean_hand_sequence_window_three():
    # means of [1], [1,2], [1,2,3], [2,3,4], [3,4,8]
    assert run_sequence(K.MEAN, [1.0, 2.0, 3.0, 4.0, 8.0], window=3) == [1.0, 1.5, 2.0, 3.0, 5.0]


def test_mean_window_one_is_the_last_value():
    assert run_sequence(K.MEAN, [4.0, 1.0, 2.0], window=1) == [4.0, 1.0, 2.0]


def test_momentum_hand_sequence_window_three_with_warm_up():
    # undefined while t < 3; then x_t + (x_t - x_{t-2}) / 2:
    # t=3: 4 + (4-1)/2 = 5.5; t=4: 7 + (7-2)/2 = 9.5; t=5: 7 + (7-4)/2 = 8.5
    assert run_sequence(K.MOMENTUM, [1.0, 2.0, 4.0, 7.0, 7.0], window=3) == [None, None, 5.5, 9.5, 8.5]


def test_momentum_default_window_ten_warms_up_for_ten_steps():
    xs = [float(t) for t in range(1, 12)]  # 1..11
    out = run_sequence(K.MOMENTUM, xs, window=10)
    assert out[:9] == [None] * 9
    # t=10: 10 + (10 - 1) / 9 = 11; t=11: 11 + (11 - 2) / 9 = 12
    assert out[9:] == [11.0, 12.0]


def test_momentum_window_two_and_one():
    assert run_sequence(K.MOMENTUM, [1.0, 3.0, 2.0], window=2) == [None, 5.0, 1.0]
    assert run_sequence(K.MOMENTUM, [1.0, 3.0], window=1) == [1.0, 3.0]


def test_paragraph_mean_hand_sequence_with_cuts():
    # push 1, 3; cut -> [3]; push 5 -> [3,5] = 4; push 7 -> [3,5,7] = 5; push 9 -> [5,7,9] = 7
    out = run_sequence(K.PARAGRAPH_MEAN, [1.0, 3.0, 5.0, 7.0, 9.0], window=3, cut_before={2})
    assert out == [1.0, 2.0, 4.0, 5.0, 7.0]


def test_paragraph_mean_two_cuts_in_a_row_and_cut_of_an_empty_history():
    # cut before any push: stays undefined until the first push.
    # push 2 -> 2; cut, push 6 -> [2,6] = 4; cut, push 10 -> [6,10] = 8
    out = run_sequence(K.PARAGRAPH_MEAN, [2.0, 6.0, 10.0], window=4, cut_before={0, 1, 2})
    assert out == [2.0, 4.0, 8.0]
    state = SmootherState.allocate(1, 1, max_window=4)
    state.reset([0], kind=[K.PARAGRAPH_MEAN], alpha=[0.1], window=[4])
    state.paragraph_cut([0])
    assert state.scores([0])[1].tolist() == [[False]]


@pytest.mark.parametrize("kind", [K.EWMA, K.MEAN, K.MOMENTUM])
def test_paragraph_cuts_do_not_touch_other_kinds(kind):
    xs = [1.0, 3.0, 5.0, 7.0]
    assert run_sequence(kind, xs, alpha=0.5, window=3, cut_before={2, 3}) == run_sequence(
        kind, xs, alpha=0.5, window=3
    )


def test_non_finite_observations_are_skipped_per_signal():
    state = SmootherState.allocate(1, 2, max_window=4, dtype=torch.float64)
    state.reset([0], kind=[K.MEAN], alpha=[0.1], window=[4])
    for row in ([1.0, NAN], [NAN, 4.0], [3.0, math.inf], [-math.inf, 8.0]):
        state.push([0], torch.tensor([row], dtype=torch.float64))
    values, defined = state.scores([0])
    # signal 0 saw 1, 3 -> 2; signal 1 saw 4, 8 -> 6
    assert values.tolist() == [[2.0, 6.0]] and defined.tolist() == [[True, True]]


def test_push_mask_and_reset_erase_a_slot():
    state = SmootherState.allocate(3, 1, max_window=4, dtype=torch.float64)
    state.reset([0, 2], kind=[K.EWMA, K.EWMA], alpha=[0.5, 0.5], window=[4, 4])
    state.push([0, 2], torch.tensor([[2.0], [4.0]], dtype=torch.float64), mask=torch.tensor([True, False]))
    values, defined = state.scores([0, 2])
    assert defined.tolist() == [[True], [False]] and values[0, 0].item() == 2.0
    # A new request takes slot 0: nothing of the old one survives.
    state.reset([0], kind=[K.MEAN], alpha=[0.5], window=[2])
    assert state.scores([0])[1].tolist() == [[False]]
    state.push([0], torch.tensor([[6.0]], dtype=torch.float64))
    assert state.scores([0])[0].tolist() == [[6.0]]


def test_reset_validates_its_arguments():
    state = SmootherState.allocate(2, 1, max_window=4)
    with pytest.raises(ValueError, match="window"):
        state.reset([0], kind=[K.MEAN], alpha=[0.1], window=[5])
    with pytest.raises(ValueError, match="window"):
        state.reset([0], kind=[K.MEAN], alpha=[0.1], window=[0])
    with pytest.raises(ValueError, match="alpha"):
        state.reset([0], kind=[K.EWMA], alpha=[0.0], window=[2])
    with pytest.raises(ValueError, match="slot"):
        state.reset([2], kind=[K.EWMA], alpha=[0.5], window=[2])
    with pytest.raises(ValueError, match="kind"):
        state.reset([0], kind=[7], alpha=[0.5], window=[2])
    with pytest.raises(ValueError, match="same length"):
        state.reset([0, 1], kind=[K.EWMA], alpha=[0.5], window=[2])


def test_parse_names_and_reject_unknown():
    assert [SmoothingKind.parse(n) for n in ("ewma", "momentum", "mean", "paragraph_mean")] == list(SmoothingKind)
    with pytest.raises(ValueError, match="unknown smoothing 'median'"):
        SmoothingKind.parse("median")


# --- random: batched state vs an independent scalar reference --------------------------


class ScalarPredictor:
    """One signal, one request: the A.4 definitions written the plain way."""

    def __init__(self, kind, alpha, window):
        self.kind, self.alpha, self.window = kind, alpha, window
        self.history = []
        self.ewma = None

    def push(self, x):
        if not math.isfinite(x):
            return
        self.history.append(x)
        self.ewma = x if self.ewma is None else self.alpha * x + (1 - self.alpha) * self.ewma

    def cut(self):
        if self.kind == K.PARAGRAPH_MEAN:
            self.history = self.history[-1:]

    def score(self):
        if self.kind == K.EWMA:
            return self.ewma
        if self.kind == K.MOMENTUM:
            if len(self.history) < self.window:
                return None
            if self.window == 1:
                return self.history[-1]
            last, first = self.history[-1], self.history[-self.window]
            return last + (last - first) / (self.window - 1)
        recent = self.history[-self.window :]
        return sum(recent) / len(recent) if recent else None


def test_batched_smoothers_equal_the_scalar_reference_on_300_random_runs():
    rng = random.Random(1234)
    num_runs, num_signals, steps = 300, 2, 30
    state = SmootherState.allocate(num_runs, num_signals, max_window=8, dtype=torch.float64)
    configs = [(K(rng.randrange(4)), rng.uniform(0.05, 1.0), rng.randint(1, 8)) for _ in range(num_runs)]
    state.reset(
        list(range(num_runs)),
        kind=[c[0] for c in configs],
        alpha=[c[1] for c in configs],
        window=[c[2] for c in configs],
    )
    reference = [[ScalarPredictor(*c) for _ in range(num_signals)] for c in configs]
    for _ in range(steps):
        slots = rng.sample(range(num_runs), rng.randint(1, num_runs))
        obs = [[NAN if rng.random() < 0.05 else rng.uniform(-1, 1) for _ in range(num_signals)] for _ in slots]
        push = [rng.random() < 0.9 for _ in slots]
        cut = [rng.random() < 0.2 for _ in slots]
        index = torch.tensor(slots)
        state.paragraph_cut(index, torch.tensor(cut))
        state.push(index, torch.tensor(obs, dtype=torch.float64), torch.tensor(push))
        for slot, row, p, c in zip(slots, obs, push, cut):
            for predictor, x in zip(reference[slot], row):
                if c:
                    predictor.cut()
                if p:
                    predictor.push(x)
        values, defined = state.scores(list(range(num_runs)))
        for slot in range(num_runs):
            for s in range(num_signals):
                expected = reference[slot][s].score()
                assert bool(defined[slot, s]) == (expected is not None), (slot, s, configs[slot])
                if expected is not None:
                    assert values[slot, s].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_run_tokens_equals_the_token_loop_bit_for_bit(dtype):
    # SpecExitState.step runs a step's tokens through SlotView.run_tokens (every column at once); it
    # must give exactly the numbers of pushing, scoring and cutting one token at a time.
    gen = torch.Generator().manual_seed(5)
    slots, num_signals, width = 40, 3, 6
    for trial in range(30):
        state = SmootherState.allocate(slots, num_signals, max_window=16, dtype=dtype)
        kinds = torch.randint(0, 4, (slots,), generator=gen)
        windows = torch.randint(1, 9, (slots,), generator=gen)
        windows = torch.where(kinds == int(SmoothingKind.MOMENTUM), windows.clamp(min=2), windows)
        alphas = 0.05 + 0.95 * torch.rand(slots, generator=gen, dtype=torch.float64)
        state.reset(list(range(slots)), kind=kinds.tolist(), alpha=alphas.tolist(), window=windows.tolist())
        index = torch.arange(slots)
        for _ in range(trial % 5):  # some history first (the loop's own pushes and cuts)
            state.push(index, torch.rand(slots, num_signals, generator=gen, dtype=dtype),
                       torch.rand(slots, generator=gen) < 0.8)
            state.paragraph_cut(index, torch.rand(slots, generator=gen) < 0.3)
        x = torch.rand(slots, width, num_signals, generator=gen, dtype=dtype) * 3
        x[torch.rand(slots, width, num_signals, generator=gen) < 0.1] = float("nan")
        examined = torch.rand(slots, width, generator=gen) < 0.85
        cut = torch.rand(slots, width, generator=gen) < 0.25

        loop = state.view(index)
        expected_values, expected_defined = [], []
        for j in range(width):
            loop.push(x[:, j], examined[:, j])
            v, d = loop.scores()
            expected_values.append(v)
            expected_defined.append(d)
            loop.paragraph_cut(cut[:, j])
        fast = state.view(index)
        values, defined = fast.run_tokens(x, examined, cut)
        expected_values = torch.stack(expected_values, dim=1)
        assert torch.equal(defined, torch.stack(expected_defined, dim=1))
        assert torch.equal(torch.isnan(values), torch.isnan(expected_values))
        assert torch.equal(values.nan_to_num(), expected_values.nan_to_num()), trial
        assert torch.equal(fast.history, loop.history) and torch.equal(fast.length, loop.length)
        assert torch.equal(fast.ewma, loop.ewma)

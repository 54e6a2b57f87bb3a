"""SpecExit signals: method grammar, checkpoint rows, decoding, segment means, per-token columns.

Pure: no sglang import. Expected values are hand-computed (docs/algorithms.md#specexit-signals).
Budget: < 5 s.
"""

import itertools
import math

import pytest
import torch

from sglang_ext.specexit.signals import (
    ALL_METHODS,
    FULL_METHOD,
    NUM_SIGNALS,
    Signal,
    SpecExitMethod,
    SpecExitMethodError,
    decode_signals,
    mean_over_segments,
    parse_method,
    strided_token_columns,
)

NAN = float("nan")

# The A.3 table: canonical name -> (k, rows of a 3-row checkpoint).
METHOD_TABLE = {
    "confidence": (1, (0,)),
    "progress": (1, (1,)),
    "remain": (1, (2,)),
    "confidence_progress": (2, (0, 1)),
    "confidence_remain": (2, (0, 2)),
    "progress_remain": (2, (1, 2)),
    "confidence_progress_remain": (3, (0, 1, 2)),
}


@pytest.mark.parametrize("canonical", sorted(METHOD_TABLE))
def test_every_order_of_every_method_parses_to_the_canonical_one(canonical):
    k, rows = METHOD_TABLE[canonical]
    words = canonical.split("_")
    for order in itertools.permutations(words):
        method = parse_method("_".join(order))
        assert method.name == canonical
        assert method.k == k
        assert method.checkpoint_rows(3) == rows
        assert method.active_columns == tuple(i in rows for i in range(3))


def test_all_methods_lists_the_seven_methods_once():
    assert sorted(m.name for m in ALL_METHODS) == sorted(METHOD_TABLE)
    assert FULL_METHOD.name == "confidence_progress_remain"
    assert NUM_SIGNALS == 3
    assert [s.label for s in Signal] == ["confidence", "progress", "remain"]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("confidence_foo", "unknown signal 'foo'"),
        ("Confidence", "unknown signal 'Confidence'"),
        ("confidence_confidence", "signal 'confidence' appears twice"),
        ("remain_progress_remain", "signal 'remain' appears twice"),
        ("", "empty method"),
        ("confidence_", "an empty name"),
        ("_remain", "an empty name"),
        ("confidence-progress", "unknown signal 'confidence-progress'"),
    ],
)
def test_bad_method_strings_are_rejected_naming_the_word(text, fragment):
    with pytest.raises(SpecExitMethodError) as info:
        parse_method(text)
    assert fragment in str(info.value)


def test_non_string_method_is_rejected():
    with pytest.raises(SpecExitMethodError, match="must be a string"):
        parse_method(3)


def test_method_dataclass_rejects_unsorted_or_empty_signals():
    with pytest.raises(SpecExitMethodError):
        SpecExitMethod(())
    with pytest.raises(SpecExitMethodError):
        SpecExitMethod((Signal.REMAIN, Signal.CONFIDENCE))
    with pytest.raises(SpecExitMethodError):
        SpecExitMethod((Signal.REMAIN, Signal.REMAIN))


def test_checkpoint_rows_of_smaller_checkpoints():
    cr = parse_method("confidence_remain")
    # A 2-row checkpoint trained for confidence_remain: rows 0, 1.
    assert cr.checkpoint_rows(2) == (0, 1)
    assert parse_method("remain").checkpoint_rows(2, cr) == (1,)
    assert parse_method("confidence").checkpoint_rows(2, cr) == (0,)
    assert parse_method("progress").checkpoint_rows(1) == (0,)
    assert parse_method("progress").checkpoint_rows(2, parse_method("progress_remain")) == (0,)


def test_checkpoint_rows_errors():
    with pytest.raises(SpecExitMethodError, match="lacks"):
        parse_method("progress").checkpoint_rows(2, parse_method("confidence_remain"))
    with pytest.raises(SpecExitMethodError, match="needs 3 signal rows but the checkpoint has 2"):
        FULL_METHOD.checkpoint_rows(2)
    with pytest.raises(SpecExitMethodError, match="expected 1..3"):
        parse_method("remain").checkpoint_rows(4)
    with pytest.raises(SpecExitMethodError, match="expected 1..3"):
        parse_method("remain").checkpoint_rows(0)
    with pytest.raises(SpecExitMethodError, match="has 2 rows but the checkpoint has 1"):
        parse_method("remain").checkpoint_rows(1, parse_method("confidence_remain"))


def test_decode_full_method_by_hand():
    # sigmoid(0) = 0.5, sigmoid(ln 3) = 0.75, exp(ln 200) = 200, exp(0) = 1.
    raw = torch.tensor([[0.0, math.log(3.0), math.log(200.0)], [math.log(3.0), 0.0, 0.0]], dtype=torch.float64)
    out = decode_signals(raw, FULL_METHOD)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.75, 200.0], [0.75, 0.5, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("method", ALL_METHODS, ids=lambda m: m.name)
def test_decode_puts_each_signal_in_its_fixed_column_and_nan_elsewhere(method):
    # Row i holds ln 3 for every used signal: confidence/progress -> 0.75, remain -> 3.
    raw = torch.full((2, method.k), math.log(3.0))
    out = decode_signals(raw, method)
    expected = {Signal.CONFIDENCE: 0.75, Signal.PROGRESS: 0.75, Signal.REMAIN: 3.0}
    for signal in Signal:
        column = out[:, int(signal)]
        if method.uses(signal):
            torch.testing.assert_close(column, torch.full((2,), expected[signal]))
        else:
            assert torch.isnan(column).all()


def test_decode_bfloat16_is_computed_in_float32_and_shape_is_checked():
    out = decode_signals(torch.zeros(1, 1, dtype=torch.bfloat16), parse_method("remain"))
    assert out.dtype == torch.float32 and out[0, 2].item() == 1.0
    with pytest.raises(ValueError, match=r"\[num_tokens, 2\]"):
        decode_signals(torch.zeros(3, 3), parse_method("confidence_progress"))


def test_selected_checkpoint_rows_decode_like_a_direct_head():
    # A 3-row checkpoint's raw output; the method progress_remain selects rows 1 and 2.
    raw3 = torch.tensor([[5.0, 0.0, math.log(10.0)]])
    rows = parse_method("progress_remain").checkpoint_rows(3)
    out = decode_signals(raw3[:, list(rows)], parse_method("progress_remain"))
    assert math.isnan(out[0, 0].item())
    assert out[0, 1].item() == 0.5
    assert out[0, 2].item() == pytest.approx(10.0)


def test_mean_over_segments_by_hand():
    values = torch.tensor([[1.0, 10.0], [3.0, 20.0], [5.0, 30.0], [7.0, 40.0]])
    # Request 0: rows 0..2; request 1: nothing; request 2: row 3.
    out = mean_over_segments(values, torch.tensor([0, 3, 3, 4]))
    assert out[0].tolist() == [3.0, 20.0]
    assert all(math.isnan(v) for v in out[1].tolist())
    assert out[2].tolist() == [7.0, 40.0]


def test_mean_over_segments_nan_inside_a_segment_and_rows_past_the_end():
    values = torch.tensor([[1.0], [NAN], [4.0], [100.0]])
    out = mean_over_segments(values, torch.tensor([0, 2, 3]))  # row 3 is past indptr[-1]
    assert math.isnan(out[0, 0].item())
    assert out[1, 0].item() == 4.0


def test_mean_over_segments_matches_a_loop_on_random_ragged_input():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(0, 5, (6,), generator=g)
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        values = torch.rand((int(indptr[-1]), 3), generator=g, dtype=torch.float64)
        out = mean_over_segments(values, indptr)
        for b in range(6):
            rows = values[int(indptr[b]) : int(indptr[b + 1])].tolist()
            for c in range(3):
                if not rows:
                    assert math.isnan(out[b, c].item())
                else:
                    assert out[b, c].item() == pytest.approx(sum(r[c] for r in rows) / len(rows), rel=1e-12)


def test_strided_token_columns_gives_one_column_per_committed_token():
    # Verify-window layout, N = 3, two requests: column j is the row of r_j of each request.
    values = torch.tensor([[2.0, 20.0], [4.0, 40.0], [NAN, NAN], [1.0, 10.0], [2.0, 20.0], [6.0, 60.0]])
    out = strided_token_columns(values, batch_size=2, stride=3, width=2)
    assert out.shape == (2, 2, 2)
    assert out[0].tolist() == [[2.0, 20.0], [4.0, 40.0]] and out[1].tolist() == [[1.0, 10.0], [2.0, 20.0]]
    # rows beyond batch_size * stride (a padded graph replay) are ignored
    full = torch.arange(12.0).view(6, 2)
    padded = torch.cat([full, torch.full((3, 2), 99.0)])
    assert torch.equal(strided_token_columns(padded, 2, 3, 3), full.view(2, 3, 2))
    with pytest.raises(ValueError, match="width must be in 1..3"):
        strided_token_columns(values, 2, 3, 4)

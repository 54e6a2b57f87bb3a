"""SpecExit defaults and per-request overrides (``custom_params``): parsing, errors, merging.

Pure: no sglang import. Expected defaults are typed from the issue 2 flag list and
docs/algorithms.md#specexit-defaults, not read from the code.
Budget: < 3 s.
"""

import math

import pytest

from sglang_ext.specexit import defaults
from sglang_ext.specexit.overrides import (
    OPTION_FIELDS,
    UNSET,
    SpecExitOptionError,
    SpecExitOptions,
    SpecExitOverrides,
    options_for_request,
    parse_overrides,
    resolve_options,
)
from sglang_ext.specexit.signals import parse_method
from sglang_ext.specexit.smoothing import SmoothingKind


def test_server_defaults_match_the_spec():
    o = SpecExitOptions()
    assert o.enable is True
    assert o.method.name == "confidence_progress_remain"
    assert o.smoothing == SmoothingKind.EWMA
    assert (o.ewma_alpha, o.window) == (0.1, 10)
    assert o.thresholds == (0.8, 0.3, 200.0)
    assert (o.min_think_tokens, o.max_think_tokens, o.max_think_grace) == (0, None, 64)
    assert defaults.DEFAULT_STOP_THINK_TOKEN == "</think>"
    assert defaults.DEFAULT_STEP_SPLIT_STRINGS == ("\n\n", "\n\n\n", ".\n\n", ".\n\n\n", " \n\n", " \n\n\n")
    assert defaults.DEFAULT_SIGNAL_SOURCE == "head"
    assert defaults.SIGNAL_SOURCES == ("head", "draft-confidence")


def test_parse_every_field():
    params = {
        "specexit_enable": False,
        "specexit_method": "remain_confidence",
        "specexit_smoothing": "paragraph_mean",
        "specexit_ewma_alpha": 1,
        "specexit_window": 4,
        "specexit_confidence_threshold": 0.95,
        "specexit_progress_threshold": 0,
        "specexit_remain_threshold": 50,
        "specexit_min_think_tokens": 16,
        "specexit_max_think_tokens": 2048,
        "specexit_max_think_grace": 0,
        "thinking_budget": 100,  # another feature's key: ignored
    }
    o = parse_overrides(params)
    assert o.given() == {
        "enable": False,
        "method": parse_method("confidence_remain"),
        "smoothing": SmoothingKind.PARAGRAPH_MEAN,
        "ewma_alpha": 1.0,
        "window": 4,
        "confidence_threshold": 0.95,
        "progress_threshold": 0.0,
        "remain_threshold": 50.0,
        "min_think_tokens": 16,
        "max_think_tokens": 2048,
        "max_think_grace": 0,
    }
    assert set(o.given()) == set(OPTION_FIELDS)


def test_nothing_sent_is_empty():
    assert parse_overrides(None).given() == {}
    assert parse_overrides({}).given() == {}
    assert parse_overrides({"other": [1, 2]}) == SpecExitOverrides()
    assert SpecExitOverrides().window is UNSET


@pytest.mark.parametrize("value", ["off", None])
def test_max_think_can_be_switched_off(value):
    o = parse_overrides({"specexit_max_think_tokens": value})
    assert o.given() == {"max_think_tokens": None}
    server = SpecExitOptions(max_think_tokens=100)
    assert resolve_options(server, o).max_think_tokens is None


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("specexit_enable", "yes", "must be true or false, got str"),
        ("specexit_enable", 1, "must be true or false, got int"),
        ("specexit_method", "confidence_foo", "unknown signal 'foo'"),
        ("specexit_method", "remain_remain", "appears twice"),
        ("specexit_method", 3, "must be a method string"),
        ("specexit_smoothing", "median", "unknown smoothing 'median'"),
        ("specexit_smoothing", None, "must be a smoothing name, got null"),
        ("specexit_ewma_alpha", 0, "must be in (0, 1], got 0.0"),
        ("specexit_ewma_alpha", 1.5, "must be in (0, 1]"),
        ("specexit_ewma_alpha", "0.5", "must be a number, got str"),
        ("specexit_ewma_alpha", True, "must be a number, got bool"),
        ("specexit_window", 0, "must be an integer in 1..256, got 0"),
        ("specexit_window", 257, "must be an integer in 1..256"),
        ("specexit_window", 4.0, "must be an integer, got float"),
        ("specexit_confidence_threshold", 1.2, "must be in [0, 1]"),
        ("specexit_confidence_threshold", math.nan, "must be finite"),
        ("specexit_progress_threshold", -0.1, "must be in [0, 1]"),
        ("specexit_remain_threshold", 0, "must be > 0"),
        ("specexit_remain_threshold", math.inf, "must be finite"),
        ("specexit_min_think_tokens", -1, "must be an integer >= 0"),
        ("specexit_max_think_tokens", 0, "must be an integer >= 1"),
        ("specexit_max_think_tokens", "never", "must be an integer >= 1 or 'off'"),
        ("specexit_max_think_grace", -5, "must be an integer >= 0"),
        ("specexit_max_think_grace", [64], "must be an integer, got list"),
        ("specexit_treshold", 0.5, "unknown SpecExit option"),
    ],
)
def test_bad_values_name_the_key(key, value, fragment):
    with pytest.raises(SpecExitOptionError) as info:
        parse_overrides({key: value})
    message = str(info.value)
    assert message.startswith(f"custom_params[{key!r}]: ")
    assert fragment in message
    assert info.value.field == key[len("specexit_"):]


def test_non_mapping_custom_params_is_an_error():
    with pytest.raises(SpecExitOptionError, match=r"^custom_params: must be an object"):
        parse_overrides([("specexit_window", 3)])


def test_prefix_can_be_empty_then_every_key_must_be_an_option():
    assert parse_overrides({"window": 3}, prefix="").given() == {"window": 3}
    with pytest.raises(SpecExitOptionError, match=r"custom_params\['thinking_budget'\]: unknown"):
        parse_overrides({"thinking_budget": 3}, prefix="")


def test_merge_keeps_server_values_that_were_not_overridden():
    server = SpecExitOptions(confidence_threshold=0.7, window=5, max_think_tokens=1000)
    merged = resolve_options(server, parse_overrides({"specexit_window": 3, "specexit_min_think_tokens": 8}))
    assert (merged.window, merged.min_think_tokens) == (3, 8)
    assert (merged.confidence_threshold, merged.max_think_tokens, merged.smoothing) == (0.7, 1000, SmoothingKind.EWMA)
    assert resolve_options(server, SpecExitOverrides()) == server


def test_request_method_must_be_served():
    server = SpecExitOptions(method="confidence_progress")
    assert resolve_options(server, parse_overrides({"specexit_method": "confidence"})).method.name == "confidence"
    with pytest.raises(SpecExitOptionError, match="asks for remain, which this server does not compute"):
        resolve_options(server, parse_overrides({"specexit_method": "progress_remain"}))
    # A 3-row head serves more than the server's default method.
    full = parse_method("confidence_progress_remain")
    merged = resolve_options(server, parse_overrides({"specexit_method": "remain"}), served_method=full)
    assert merged.method.name == "remain"


def test_max_think_below_min_think_is_an_error_naming_max_think():
    server = SpecExitOptions(min_think_tokens=100)
    with pytest.raises(SpecExitOptionError, match=r"^max_think_tokens: must be >= min_think_tokens \(100\), got 50"):
        resolve_options(server, parse_overrides({"specexit_max_think_tokens": 50}))


def test_options_constructor_validates_and_canonicalises():
    o = SpecExitOptions(method="progress_confidence", smoothing="mean")
    assert o.method.name == "confidence_progress" and o.smoothing == SmoothingKind.MEAN
    with pytest.raises(SpecExitOptionError, match=r"^ewma_alpha: "):
        SpecExitOptions(ewma_alpha=0.0)
    with pytest.raises(SpecExitOptionError, match=r"^method: "):
        SpecExitOptions(method="foo")


def test_options_for_request_end_to_end():
    o = options_for_request(SpecExitOptions(), {"specexit_confidence_threshold": 0.9, "specexit_enable": False})
    assert (o.confidence_threshold, o.enable, o.progress_threshold) == (0.9, False, 0.3)
    with pytest.raises(SpecExitOptionError, match=r"custom_params\['specexit_window'\]"):
        options_for_request(SpecExitOptions(), {"specexit_window": -1})

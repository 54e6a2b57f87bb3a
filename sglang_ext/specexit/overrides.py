"""Per-request SpecExit options: typed, validated, parsed from ``custom_params``.

A client tunes SpecExit per request through SGLang's ``sampling_params.custom_params``, a
one-level JSON object of scalars. The keys SpecExit reads carry the ``specexit_`` prefix
(``defaults.OVERRIDE_PREFIX``) so they cannot collide with other users of ``custom_params``
(e.g. custom logit processors); keys without the prefix are ignored, unknown keys with it
are an error.

=============================  =========================================================
key                            value
=============================  =========================================================
``specexit_enable``            bool; false leaves the request untouched
``specexit_method``            ``_``-joined subset of confidence, progress, remain that
                               the server computes
``specexit_smoothing``         ``ewma`` | ``momentum`` | ``mean`` | ``paragraph_mean``
``specexit_ewma_alpha``        number in (0, 1]
``specexit_window``            integer in 1..MAX_WINDOW
``specexit_confidence_threshold``  number in [0, 1]; exit needs confidence > it
``specexit_progress_threshold``    number in [0, 1]; exit needs progress > it
``specexit_remain_threshold``  finite number > 0; exit needs remain < it (tokens)
``specexit_min_think_tokens``  integer >= 0
``specexit_max_think_tokens``  integer >= 1, or ``"off"`` / null to disable the guard
``specexit_max_think_grace``   integer >= 0
=============================  =========================================================

Example request body fragment::

    "sampling_params": {"custom_params": {"specexit_confidence_threshold": 0.9,
                                          "specexit_max_think_tokens": 4096}}

Every error is a :class:`SpecExitOptionError` whose message starts with the offending key.

Imports: torch (through the sibling modules) and stdlib only (no sglang).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Union

from sglang_ext.specexit import defaults as D
from sglang_ext.specexit.signals import SpecExitMethod, SpecExitMethodError, parse_method
from sglang_ext.specexit.smoothing import SmoothingKind


class SpecExitOptionError(ValueError):
    """An invalid SpecExit option; ``field`` is the option name (without prefix)."""

    def __init__(self, field: str, message: str, shown_as: Optional[str] = None) -> None:
        self.field = field
        super().__init__(f"{shown_as or field}: {message}")


# --- field validators: raw value -> canonical value, or ValueError(message) ---------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_type_name(value)} {value!r}")
    return value


def _as_real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {_type_name(value)} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {value!r}")
    return float(value)


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, got {_type_name(value)} {value!r}")
    return int(value)


def _real_in(low: float, high: float, low_open: bool = False) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        x = _as_real(value)
        if x < low or x > high or (low_open and x == low):
            left = "(" if low_open else "["
            raise ValueError(f"must be in {left}{low:g}, {high:g}], got {x!r}")
        return x

    return check


def _positive_real(value: Any) -> float:
    x = _as_real(value)
    if x <= 0:
        raise ValueError(f"must be > 0, got {x!r}")
    return x


def _int_in(low: int, high: Optional[int] = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        n = _as_int(value)
        if n < low or (high is not None and n > high):
            shown = f"in {low}..{high}" if high is not None else f">= {low}"
            raise ValueError(f"must be an integer {shown}, got {n}")
        return n

    return check


def _method(value: Any) -> SpecExitMethod:
    if isinstance(value, SpecExitMethod):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be a method string, got {_type_name(value)} {value!r}")
    try:
        return parse_method(value)
    except SpecExitMethodError as error:
        raise ValueError(str(error)) from None


def _smoothing(value: Any) -> SmoothingKind:
    if isinstance(value, SmoothingKind):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be a smoothing name, got {_type_name(value)} {value!r}")
    return SmoothingKind.parse(value)


def _max_think(value: Any) -> Optional[int]:
    if value is None or value == D.OFF_VALUE:
        return None
    if isinstance(value, str):
        raise ValueError(f"must be an integer >= 1 or {D.OFF_VALUE!r}, got {value!r}")
    return _int_in(1)(value)


_VALIDATORS: Dict[str, Callable[[Any], Any]] = {
    "enable": _as_bool,
    "method": _method,
    "smoothing": _smoothing,
    "ewma_alpha": _real_in(0.0, 1.0, low_open=True),
    "window": _int_in(1, D.MAX_WINDOW),
    "confidence_threshold": _real_in(0.0, 1.0),
    "progress_threshold": _real_in(0.0, 1.0),
    "remain_threshold": _positive_real,
    "min_think_tokens": _int_in(0),
    "max_think_tokens": _max_think,
    "max_think_grace": _int_in(0),
}

#: Option names a request may set (without the ``specexit_`` prefix).
OPTION_FIELDS = tuple(_VALIDATORS)


def _validated(field: str, value: Any, shown_as: Optional[str] = None) -> Any:
    try:
        return _VALIDATORS[field](value)
    except ValueError as error:
        raise SpecExitOptionError(field, str(error), shown_as) from None


@dataclass(frozen=True)
class SpecExitOptions:
    """Resolved SpecExit options of one request; the default instance is the server default.

    Validated on construction (:class:`SpecExitOptionError` names the field). Strings are
    accepted for ``method`` and ``smoothing`` and canonicalised.

    Examples
    --------
    >>> o = SpecExitOptions()
    >>> o.method.name, o.smoothing.label, o.thresholds
    ('confidence_progress_remain', 'ewma', (0.8, 0.3, 200.0))
    >>> SpecExitOptions(window=0)
    Traceback (most recent call last):
    ...
    sglang_ext.specexit.overrides.SpecExitOptionError: window: must be an integer in 1..256, got 0
    """

    enable: bool = True
    method: SpecExitMethod = dataclasses.field(default_factory=lambda: parse_method(D.DEFAULT_METHOD))
    smoothing: SmoothingKind = SmoothingKind.parse(D.DEFAULT_SMOOTHING)
    ewma_alpha: float = D.DEFAULT_EWMA_ALPHA
    window: int = D.DEFAULT_WINDOW
    confidence_threshold: float = D.DEFAULT_CONFIDENCE_THRESHOLD
    progress_threshold: float = D.DEFAULT_PROGRESS_THRESHOLD
    remain_threshold: float = D.DEFAULT_REMAIN_THRESHOLD
    min_think_tokens: int = D.DEFAULT_MIN_THINK_TOKENS
    max_think_tokens: Optional[int] = D.DEFAULT_MAX_THINK_TOKENS
    max_think_grace: int = D.DEFAULT_MAX_THINK_GRACE

    def __post_init__(self) -> None:
        for field in OPTION_FIELDS:
            object.__setattr__(self, field, _validated(field, getattr(self, field)))
        if self.max_think_tokens is not None and self.max_think_tokens < self.min_think_tokens:
            raise SpecExitOptionError(
                "max_think_tokens",
                f"must be >= min_think_tokens ({self.min_think_tokens}), got {self.max_think_tokens}",
            )

    @property
    def thresholds(self) -> tuple:
        """(confidence, progress, remain) thresholds, in the fixed signal columns."""
        return (self.confidence_threshold, self.progress_threshold, self.remain_threshold)


class _Unset(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


#: Marks an override field the request did not send.
UNSET = _Unset.UNSET


@dataclass(frozen=True)
class SpecExitOverrides:
    """The options one request sent; ``UNSET`` where it sent nothing.

    ``max_think_tokens=None`` means the request switched that guard off.

    Examples
    --------
    >>> o = parse_overrides({"specexit_window": 4, "temperature_hint": 3})
    >>> o.window, o.method, o.given()
    (4, UNSET, {'window': 4})
    """

    enable: Union[bool, _Unset] = UNSET
    method: Union[SpecExitMethod, _Unset] = UNSET
    smoothing: Union[SmoothingKind, _Unset] = UNSET
    ewma_alpha: Union[float, _Unset] = UNSET
    window: Union[int, _Unset] = UNSET
    confidence_threshold: Union[float, _Unset] = UNSET
    progress_threshold: Union[float, _Unset] = UNSET
    remain_threshold: Union[float, _Unset] = UNSET
    min_think_tokens: Union[int, _Unset] = UNSET
    max_think_tokens: Union[int, None, _Unset] = UNSET
    max_think_grace: Union[int, _Unset] = UNSET

    def given(self) -> Dict[str, Any]:
        """The fields the request set, by option name."""
        return {f: getattr(self, f) for f in OPTION_FIELDS if getattr(self, f) is not UNSET}


def parse_overrides(
    params: Optional[Mapping[str, Any]], prefix: str = D.OVERRIDE_PREFIX
) -> SpecExitOverrides:
    """Parse the SpecExit keys of a request's ``custom_params``.

    Parameters
    ----------
    params : mapping or None
        The one-level ``custom_params`` dict (None: nothing sent).
    prefix : str
        Key prefix of SpecExit options. With ``""`` every key must be an option name.

    Returns
    -------
    SpecExitOverrides

    Raises
    ------
    SpecExitOptionError
        Naming the key, e.g. ``custom_params['specexit_window']: must be an integer ...``.

    Examples
    --------
    >>> parse_overrides({"specexit_smoothing": "mean", "specexit_max_think_tokens": "off"}).given()
    {'smoothing': <SmoothingKind.MEAN: 2>, 'max_think_tokens': None}
    >>> parse_overrides({"specexit_alpha": 0.5})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sglang_ext.specexit.overrides.SpecExitOptionError: custom_params['specexit_alpha']: unknown SpecExit option; ...
    """
    if params is None:
        return SpecExitOverrides()
    if not isinstance(params, Mapping):
        raise SpecExitOptionError(
            "custom_params", f"must be an object of scalars, got {_type_name(params)}"
        )
    values: Dict[str, Any] = {}
    for key, value in params.items():
        if not isinstance(key, str) or not key.startswith(prefix):
            continue
        shown = f"custom_params[{key!r}]"
        field = key[len(prefix):]
        if field not in _VALIDATORS:
            expected = ", ".join(prefix + f for f in OPTION_FIELDS)
            raise SpecExitOptionError(field, f"unknown SpecExit option; expected one of {expected}", shown)
        values[field] = _validated(field, value, shown)
    return SpecExitOverrides(**values)


def resolve_options(
    server: SpecExitOptions,
    overrides: SpecExitOverrides,
    served_method: Optional[SpecExitMethod] = None,
) -> SpecExitOptions:
    """Merge a request's overrides over the server defaults.

    Parameters
    ----------
    server : SpecExitOptions
        Server-level options (from the launcher flags).
    overrides : SpecExitOverrides
        What the request sent.
    served_method : SpecExitMethod, optional
        The signals the server computes (default ``server.method``). A request method
        outside it is an error: those signal rows are never decoded.

    Returns
    -------
    SpecExitOptions

    Raises
    ------
    SpecExitOptionError
        For an unserved method or an inconsistent combination (e.g. max < min think).

    Examples
    --------
    >>> server = SpecExitOptions(method="confidence_progress")
    >>> resolve_options(server, parse_overrides({"specexit_method": "progress"})).method.name
    'progress'
    >>> resolve_options(server, parse_overrides({"specexit_method": "remain"}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sglang_ext.specexit.overrides.SpecExitOptionError: method: asks for remain, which this server does not compute ...
    """
    served = served_method if served_method is not None else server.method
    merged = dataclasses.replace(server, **overrides.given())
    if not merged.method.is_subset_of(served):
        missing = [n for n in merged.method.names if n not in served.names]
        raise SpecExitOptionError(
            "method",
            f"asks for {', '.join(missing)}, which this server does not compute "
            f"(served method: {served.name})",
        )
    return merged


def options_for_request(
    server: SpecExitOptions,
    custom_params: Optional[Mapping[str, Any]],
    served_method: Optional[SpecExitMethod] = None,
    prefix: str = D.OVERRIDE_PREFIX,
) -> SpecExitOptions:
    """Parse a request's ``custom_params`` and merge them over the server defaults.

    Examples
    --------
    >>> options_for_request(SpecExitOptions(), {"specexit_enable": False}).enable
    False
    >>> options_for_request(SpecExitOptions(), None) == SpecExitOptions()
    True
    """
    return resolve_options(server, parse_overrides(custom_params, prefix), served_method)

"""Extension configuration: :class:`SpecExitConfig` and :class:`DCutConfig`.

This module is the single table of the extension's launcher flags. Every dataclass field
carries its flag name, help text and parser in its ``metadata``; the CLI (``--specexit*``,
``--dcut*`` on ``python -m sglang.launch_server``), ``sglang.Engine(...)`` keyword arguments,
``--config`` YAML presets and the README flag table are all generated from it.

Pure module (no SGLang import). SpecExit defaults, the method grammar and the option ranges
come from :mod:`sglang_ext.specexit` (``defaults``, ``signals``, ``overrides``) so that flags and
per-request ``custom_params`` share one definition; the ``--dcut`` mode names and their parser come
from the planner's mode table (``sglang_ext.dcut.planner.TIER_POLICIES``, ``parse_mode``).

Values are validated in ``__post_init__``; errors are :class:`ConfigError` whose message
starts with the offending flag, e.g. ``--dcut-tiers: tiers must be strictly increasing``.
Checks that need the tokenizer (stop-think token, step-split strings) run when the worker
starts (:func:`resolve_token_ids` is called there): strings the user gave must be usable, the
default ones that are not (a non-thinking model) leave SpecExit inactive with a warning.
An unset ``--specexit-method`` follows ``--specexit-signal-source`` (:data:`DEFAULT_METHOD_BY_SOURCE`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_ext.dcut.planner import MODE_AUTO, MODE_OFF, TIER_POLICIES, DCutMode, parse_mode
from sglang_ext.specexit import defaults as D

__all__ = [
    "ConfigError",
    "SpecExitConfig",
    "DCutConfig",
    "ExtensionConfig",
    "FlagSpec",
    "iter_flags",
    "configs_from_mapping",
    "preset_values",
    "check_against_server",
    "resolve_token_ids",
    "get_extension_config",
    "attach_extension_config",
    "EAGLE_FAMILY",
    "STANDALONE",
    "SPECEXIT_ALGORITHMS",
    "DCUT_ALGORITHMS",
]

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")
"""Speculative algorithms served by ``EAGLEWorkerV2`` (SpecExit and D-Cut)."""
STANDALONE = "STANDALONE"
"""A small language model of the target's family drafts (``StandaloneWorkerV2``, a subclass of
``EAGLEWorkerV2``): D-Cut, and SpecExit with the draft-confidence signal (the draft has no signal rows)."""
SPECEXIT_ALGORITHMS = EAGLE_FAMILY + (STANDALONE,)
"""Speculative algorithms SpecExit can run with."""
DCUT_ALGORITHMS = EAGLE_FAMILY + (STANDALONE, "DFLASH")
"""Speculative algorithms D-Cut can prune."""

SMOOTHING_CHOICES = D.SMOOTHING_NAMES
SIGNAL_SOURCE_CHOICES = D.SIGNAL_SOURCES
DEFAULT_METHOD_BY_SOURCE: Dict[str, str] = {"head": D.DEFAULT_METHOD, "draft-confidence": "confidence"}
"""``--specexit-method`` when unset, per ``--specexit-signal-source`` (draft-confidence has confidence only)."""
DEFAULTED_BY_SOURCE_OR_TOKENIZER: Tuple[str, ...] = ("method", "stop_think_token", "step_split_tokens")
"""SpecExitConfig fields whose default (None) is resolved later: ``method`` from the signal source, the
token strings with the served tokenizer (an unset stop-think string that is not one token makes SpecExit
inactive instead of refusing the launch, see :func:`resolve_token_ids`)."""
DEFAULT_STEP_SPLIT_STRINGS: Tuple[str, ...] = D.DEFAULT_STEP_SPLIT_STRINGS
DEFAULT_DCUT_TIERS: Tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
DCUT_OFF = MODE_OFF
DCUT_AUTO = MODE_AUTO
DCUT_CALIBRATION_POWER = "power"
DCUT_CALIBRATION_OFF = "off"
DCUT_CALIBRATION_CHOICES: Tuple[str, ...] = (DCUT_CALIBRATION_POWER, DCUT_CALIBRATION_OFF)
DRAFT_EXTEND_ACCEPTED = "accepted"
DRAFT_EXTEND_WINDOW = "window"
DRAFT_EXTEND_CHOICES: Tuple[str, ...] = (DRAFT_EXTEND_ACCEPTED, DRAFT_EXTEND_WINDOW)
DRAFT_OFF_AUTO = "auto"
DRAFT_OFF_NEVER = "never"
DRAFT_OFF_CHOICES: Tuple[str, ...] = (DRAFT_OFF_AUTO, DRAFT_OFF_NEVER)
DRAFT_OFF_EXTEND_DEFER = "defer"
DRAFT_OFF_EXTEND_ALWAYS = "always"
DRAFT_OFF_EXTEND_CHOICES: Tuple[str, ...] = (DRAFT_OFF_EXTEND_DEFER, DRAFT_OFF_EXTEND_ALWAYS)
ONLINE_COSTS_ON = "on"
ONLINE_COSTS_OFF = "off"
ONLINE_COSTS_CHOICES: Tuple[str, ...] = (ONLINE_COSTS_ON, ONLINE_COSTS_OFF)


class ConfigError(ValueError):
    """Invalid extension setting. The message starts with the flag (or request field) name."""


# ----------------------------------------------------------------------------- parsers
def _parse_bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    s = str(text).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


# YAML 1.1 reads a bare ``off`` as false, and SGLang's --config reader passes it on as "false".
_OFF_WORDS = ("", "off", "none", "false")


def _parse_optional_int(text: Any) -> Optional[int]:
    if text is None or text is False:
        return None
    if isinstance(text, str) and text.strip().lower() in _OFF_WORDS:
        return None
    if isinstance(text, bool) or (isinstance(text, float) and not float(text).is_integer()):
        raise ValueError(f"expected an integer or 'off', got {text!r}")
    return int(text)


def _parse_int(text: Any) -> int:
    if isinstance(text, bool) or (isinstance(text, float) and not float(text).is_integer()):
        raise ValueError(f"expected an integer, got {text!r}")
    return int(text)


def _parse_float(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError(f"expected a number, got {text!r}")
    return float(text)


def _parse_float_list(text: Any) -> Tuple[float, ...]:
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [t for t in str(text).replace(" ", "").split(",") if t != ""]
    if not items:
        raise ValueError("expected a comma-separated list of numbers")
    return tuple(_parse_float(t) for t in items)


def _parse_int_list(text: Any) -> Optional[Tuple[int, ...]]:
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [t for t in str(text).replace(" ", "").split(",") if t != ""]
    if not items:
        raise ValueError("expected a comma-separated list of integers")
    return tuple(_parse_int(t) for t in items)


def _parse_string_list(text: Any) -> Tuple[str, ...]:
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"expected a JSON list of strings, e.g. '[\"\\n\\n\"]' ({e.msg})") from None
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError("expected a JSON list of strings")
    return tuple(items)


def _parse_dcut_mode(text: Any) -> DCutMode:
    """``--dcut``: a mode name of the planner's mode table (``TIER_POLICIES``) or a ratio in (0, 1]."""
    if text is False or (isinstance(text, str) and text.strip().lower() == "false"):
        return DCUT_OFF  # YAML 1.1 reads a bare ``off`` as false
    return parse_mode(text)


def _parse_str(text: Any) -> str:
    return str(text)


def _parse_on_off(text: Any) -> str:
    """``on`` / ``off`` from any boolean spelling (YAML 1.1 reads a bare ``off`` as false, which
    SGLang's ``--config`` reader passes on as ``"false"``); other text is returned for the check."""
    try:
        return ONLINE_COSTS_ON if _parse_bool(text) else ONLINE_COSTS_OFF
    except ValueError:
        return str(text)


def _parse_method(text: Any) -> str:
    # a list of signal names (Engine keyword, YAML list) is the '_'-joined combination
    if isinstance(text, (list, tuple)):
        return "_".join(str(t) for t in text)
    return str(text)


def _parse_optional_str(text: Any) -> Optional[str]:
    if text is None or str(text) == "":
        return None
    return str(text)


# ----------------------------------------------------------------------------- flag metadata
@dataclass(frozen=True)
class FlagSpec:
    """How one config field appears on the command line."""

    flag: str
    help: str
    parse: Callable[[Any], Any]
    metavar: Optional[str] = None
    choices: Optional[Tuple[str, ...]] = None
    store_true: bool = False
    show_default: Optional[str] = None
    list_join: Optional[str] = None
    """How a YAML list in a ``--config`` preset becomes the flag's one command-line value:
    ``","`` or ``"_"`` joins the items, ``"json"`` writes a JSON list; None: no list accepted."""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _f(default, flag, help, parse, *, default_factory=None, **kw):
    meta = {"flag": FlagSpec(flag=flag, help=help, parse=parse, **kw)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def iter_flags(cls) -> List[Tuple[str, FlagSpec, Any]]:
    """``(field_name, FlagSpec, default)`` for every flag of a config dataclass, in order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("flag")
        if spec is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append((f.name, spec, default))
    return out


def _check(cond: bool, flag: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{flag}: {msg}")


# ----------------------------------------------------------------------------- SpecExit
@dataclass(frozen=True)
class SpecExitConfig:
    """Server-wide SpecExit settings (docs/algorithms.md#specexit). Per-request overrides come from
    ``custom_params`` and are validated by :mod:`sglang_ext.specexit.overrides`; :meth:`options`
    gives the server defaults in that module's form."""

    enabled: bool = _f(False, "--specexit", "Enable SpecExit: end the <think> phase early when the "
                       "draft's smoothed signals say the answer is ready.", _parse_bool, store_true=True)
    method: str = _f(None, "--specexit-method",
                     "Signals used by the exit test: any '_'-joined combination of confidence, progress, "
                     "remain (order-insensitive). Unset, it follows --specexit-signal-source: "
                     f"{D.DEFAULT_METHOD} with head, confidence with draft-confidence.", _parse_method,
                     metavar="METHOD", list_join="_",
                     show_default=f"{D.DEFAULT_METHOD} (head), confidence (draft-confidence)")
    smoothing: str = _f(D.DEFAULT_SMOOTHING, "--specexit-smoothing",
                        "Smoother applied to each signal, one observation per thinking token.",
                        _parse_str, choices=SMOOTHING_CHOICES)
    ewma_alpha: float = _f(D.DEFAULT_EWMA_ALPHA, "--specexit-ewma-alpha",
                           "EWMA weight of the newest observation (one per thinking token), in (0, 1].",
                           _parse_float)
    window: int = _f(D.DEFAULT_WINDOW, "--specexit-window", "Window W, in thinking tokens, of the "
                     f"momentum/mean/paragraph_mean smoothers (1..{D.MAX_WINDOW}; momentum needs W >= 2).",
                     _parse_int)
    confidence_threshold: float = _f(D.DEFAULT_CONFIDENCE_THRESHOLD, "--specexit-confidence-threshold",
                                     "Exit needs smoothed confidence > this, in [0, 1].", _parse_float)
    progress_threshold: float = _f(D.DEFAULT_PROGRESS_THRESHOLD, "--specexit-progress-threshold",
                                   "Exit needs smoothed progress > this, in [0, 1].", _parse_float)
    remain_threshold: float = _f(D.DEFAULT_REMAIN_THRESHOLD, "--specexit-remain-threshold",
                                 "Exit needs smoothed remaining think tokens < this (> 0).", _parse_float)
    min_think_tokens: int = _f(D.DEFAULT_MIN_THINK_TOKENS, "--specexit-min-think-tokens",
                               "No signal-driven exit before this many thinking tokens.", _parse_int)
    max_think_tokens: Optional[int] = _f(D.DEFAULT_MAX_THINK_TOKENS, "--specexit-max-think-tokens",
                                         "Force the exit at the next paragraph boundary once thinking reaches "
                                         "this many tokens ('off' = no limit).", _parse_optional_int,
                                         metavar="N|off", show_default="off")
    max_think_grace: int = _f(D.DEFAULT_MAX_THINK_GRACE, "--specexit-max-think-grace",
                              "After --specexit-max-think-tokens, exit without a boundary once this many more "
                              "tokens pass.", _parse_int)
    stop_think_token: str = _f(None, "--specexit-stop-think-token",
                               "Token forced to end thinking; must encode to exactly one token id. Unset, and "
                               f"{D.DEFAULT_STOP_THINK_TOKEN} is not one token of the served tokenizer (a "
                               "non-thinking model), SpecExit stays inactive with a warning.", _parse_str,
                               show_default=D.DEFAULT_STOP_THINK_TOKEN)
    step_split_tokens: Tuple[str, ...] = _f(None, "--specexit-step-split-tokens",
                                            "JSON list of paragraph-boundary strings; those that encode to one "
                                            "token form the boundary set.", _parse_string_list,
                                            metavar="JSON", show_default=json.dumps(list(DEFAULT_STEP_SPLIT_STRINGS)),
                                            list_join="json")
    signal_source: str = _f(D.DEFAULT_SIGNAL_SOURCE, "--specexit-signal-source",
                            "Where the signals come from: the SpecExit rows of the draft's fc ('head') or the "
                            "draft's own token probabilities ('draft-confidence', confidence only, works with any EAGLE3 "
                            "draft or a STANDALONE draft model; the default --specexit-method is then confidence).",
                            _parse_str, choices=SIGNAL_SOURCE_CHOICES)
    explicit: Tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    """Names of the fields among :data:`DEFAULTED_BY_SOURCE_OR_TOKENIZER` that the user set (the others
    were None and got their default in ``__post_init__``)."""

    def __post_init__(self):
        from sglang_ext.specexit.draft_confidence import check_signal_source

        object.__setattr__(self, "explicit", tuple(n for n in DEFAULTED_BY_SOURCE_OR_TOKENIZER
                                                   if getattr(self, n) is not None))
        if self.method is None:
            object.__setattr__(self, "method", DEFAULT_METHOD_BY_SOURCE.get(self.signal_source, D.DEFAULT_METHOD))
        if self.stop_think_token is None:
            object.__setattr__(self, "stop_think_token", D.DEFAULT_STOP_THINK_TOKEN)
        if self.step_split_tokens is None:
            object.__setattr__(self, "step_split_tokens", DEFAULT_STEP_SPLIT_STRINGS)
        opts = self.options()  # validates every option shared with custom_params
        object.__setattr__(self, "method", opts.method.name)
        _check(not (self.smoothing == "momentum" and self.window < 2), "--specexit-window",
               "momentum smoothing needs a window >= 2")
        _check(self.stop_think_token != "", "--specexit-stop-think-token", "must not be empty")
        _check(len(self.step_split_tokens) > 0 and all(self.step_split_tokens), "--specexit-step-split-tokens",
               "must be a non-empty list of non-empty strings")
        object.__setattr__(self, "step_split_tokens", tuple(self.step_split_tokens))
        try:
            check_signal_source(self.signal_source, opts.method)
        except ValueError as e:
            raise ConfigError(f"--specexit-signal-source: {e} (given with --specexit-method)") from None

    def options(self):
        """The server defaults as :class:`sglang_ext.specexit.overrides.SpecExitOptions`."""
        from sglang_ext.specexit.overrides import SpecExitOptionError, SpecExitOptions

        try:
            return SpecExitOptions(enable=True, method=self.method, smoothing=self.smoothing,
                                   ewma_alpha=self.ewma_alpha, window=self.window,
                                   confidence_threshold=self.confidence_threshold,
                                   progress_threshold=self.progress_threshold,
                                   remain_threshold=self.remain_threshold, min_think_tokens=self.min_think_tokens,
                                   max_think_tokens=self.max_think_tokens, max_think_grace=self.max_think_grace)
        except SpecExitOptionError as e:
            reason = str(e)[len(e.field) + 2:] if str(e).startswith(e.field + ": ") else str(e)
            raise ConfigError(f"--specexit-{e.field.replace('_', '-')}: {reason}") from None

    @property
    def signals(self) -> Tuple[str, ...]:
        """Active signals in the fixed order confidence, progress, remain."""
        return tuple(self.options().method.names)


# ----------------------------------------------------------------------------- D-Cut
@dataclass(frozen=True)
class DCutConfig:
    """Server-wide D-Cut settings (docs/algorithms.md#d-cut).

    Ratios follow the bonus-inclusive convention: tier ratio rho keeps ceil(bs * N * rho)
    target-verify tokens (the bs root/bonus slots included).
    """

    mode: DCutMode = _f(DCUT_OFF, "--dcut", "D-Cut pruning of verified draft tokens: 'off', 'auto' (tier chosen "
                        "per step from the cost table; with --speculative-adaptive on a chain: the draft depth "
                        "among SGLang's adaptive step counts) or a fixed ratio in (0, 1] of the verify tokens.",
                        _parse_dcut_mode, metavar="|".join(TIER_POLICIES) + "|RATIO")
    """A mode name of ``sglang_ext.dcut.TIER_POLICIES`` (``"off"``, ``"auto"``) or a fixed ratio in
    (0, 1] as a float (``sglang_ext.dcut.DCutMode``)."""
    tiers: Tuple[float, ...] = _f(None, "--dcut-tiers", "Verify-size tiers as fractions of the full verify width, "
                                  "strictly increasing in (0, 1] and ending at 1.0.", _parse_float_list,
                                  default_factory=lambda: DEFAULT_DCUT_TIERS, metavar="R1,R2,...",
                                  show_default="0.25,0.5,0.75,1.0", list_join=",")
    calibration: str = _f(DCUT_CALIBRATION_POWER, "--dcut-calibration", "Online calibration of the draft's "
                          "survival scores for auto's tier choice: 'power' fits s -> s^tau to the accepted "
                          "drafts of the kept slots (the kept set at a budget is unchanged, so output is too); "
                          "'off' uses the raw scores.", _parse_str, choices=DCUT_CALIBRATION_CHOICES)
    draft_extend: str = _f(DRAFT_EXTEND_ACCEPTED, "--dcut-draft-extend", "Rows the draft model re-reads after "
                           "each verify when its draft extend runs eagerly (CPU; the project's EAGLE worker, also "
                           "with --dcut off): 'accepted' runs only each request's accepted tokens (the only rows "
                           "SGLang uses; same output, less work), 'window' SGLang's full verify window.",
                           _parse_str, choices=DRAFT_EXTEND_CHOICES)
    draft_off: str = _f(DRAFT_OFF_AUTO, "--dcut-draft-off", "Whether --dcut auto may switch drafting off for "
                        "whole steps (a plain one-token verify per request, the draft model kept up to date): "
                        "'auto' when the cost table says a draft-off step commits more tokens per ms than every "
                        "tier, with a minimum dwell; 'never' keeps drafting. Fixed ratios never switch it off.",
                        _parse_str, choices=DRAFT_OFF_CHOICES)
    draft_off_extend: str = _f(DRAFT_OFF_EXTEND_DEFER, "--dcut-draft-off-extend", "The draft model's extend in "
                               "draft-off steps: 'defer' skips it and keeps what it would read (the tokens, and an "
                               "EAGLE draft's target hidden states), then catches the draft up in one extend in the draft-off "
                               "step before drafting resumes; 'always' runs SGLang's one-row extend every "
                               "draft-off step.", _parse_str, choices=DRAFT_OFF_EXTEND_CHOICES)
    online_costs: str = _f(ONLINE_COSTS_ON, "--dcut-online-costs", "Correct --dcut auto's cost table online from "
                           "the wall time of the decode steps the server runs (no device sync): one factor per "
                           "(profiled batch size, tier or draft-off step), used for the tier and draft-off choice "
                           "and shown in /server_info; 'off' keeps the launch-time costs.", _parse_on_off,
                           choices=ONLINE_COSTS_CHOICES)
    cost_table: Optional[str] = _f(None, "--dcut-cost-table", "Load this cost-table JSON instead of profiling at "
                                   "launch.", _parse_optional_str, metavar="PATH")
    cache_dir: Optional[str] = _f(None, "--dcut-cache-dir", "Directory of the profiled cost-table cache (default: "
                                  "$XDG_CACHE_HOME/sglang_ext/dcut).", _parse_optional_str, metavar="DIR")
    profile_steps: int = _f(5, "--dcut-profile-steps", "Timed speculative steps per (batch size, tier) when "
                            "profiling.", _parse_int)
    profile_warmup: int = _f(3, "--dcut-profile-warmup", "Warm-up steps per (batch size, tier) when profiling.",
                             _parse_int)
    profile_context_len: Optional[int] = _f(None, "--dcut-profile-context-len", "Context length of the profiling "
                                            "batches (default 2048 on GPU; on CPU capped so that batch x context "
                                            "fits the KV pool).", _parse_optional_int, metavar="N",
                                            show_default="auto")
    profile_batch_sizes: Optional[Tuple[int, ...]] = _f(None, "--dcut-profile-batch-sizes", "Batch sizes to "
                                                        "profile (default: decode graph-capture sizes up to "
                                                        "--max-running-requests; on CPU 1,4,8,16,32,64, capped).",
                                                        _parse_int_list, metavar="B1,B2,...", show_default="auto",
                                                        list_join=",")

    def __post_init__(self):
        try:
            object.__setattr__(self, "mode", parse_mode(self.mode))
        except ValueError as e:
            raise ConfigError(f"--dcut: {e}") from None
        _check(self.calibration in DCUT_CALIBRATION_CHOICES, "--dcut-calibration",
               f"expected one of {', '.join(DCUT_CALIBRATION_CHOICES)}, got {self.calibration!r}")
        _check(self.draft_extend in DRAFT_EXTEND_CHOICES, "--dcut-draft-extend",
               f"expected one of {', '.join(DRAFT_EXTEND_CHOICES)}, got {self.draft_extend!r}")
        _check(self.draft_off in DRAFT_OFF_CHOICES, "--dcut-draft-off",
               f"expected one of {', '.join(DRAFT_OFF_CHOICES)}, got {self.draft_off!r}")
        _check(self.draft_off_extend in DRAFT_OFF_EXTEND_CHOICES, "--dcut-draft-off-extend",
               f"expected one of {', '.join(DRAFT_OFF_EXTEND_CHOICES)}, got {self.draft_off_extend!r}")
        _check(self.online_costs in ONLINE_COSTS_CHOICES, "--dcut-online-costs",
               f"expected one of {', '.join(ONLINE_COSTS_CHOICES)}, got {self.online_costs!r}")
        t = tuple(float(x) for x in self.tiers)
        object.__setattr__(self, "tiers", t)
        _check(len(t) >= 1, "--dcut-tiers", "needs at least one tier")
        _check(all(0.0 < x <= 1.0 for x in t), "--dcut-tiers", f"every tier must be in (0, 1], got {list(t)}")
        _check(all(a < b for a, b in zip(t, t[1:])), "--dcut-tiers", f"tiers must be strictly increasing, got {list(t)}")
        _check(t[-1] == 1.0, "--dcut-tiers", f"the last tier must be 1.0 (full verify), got {t[-1]}")
        if self.cost_table is not None:
            _check(os.path.isfile(self.cost_table), "--dcut-cost-table", f"file not found: {self.cost_table}")
        _check(self.profile_steps >= 1, "--dcut-profile-steps", f"must be >= 1, got {self.profile_steps}")
        _check(self.profile_warmup >= 0, "--dcut-profile-warmup", f"must be >= 0, got {self.profile_warmup}")
        _check(self.profile_context_len is None or self.profile_context_len >= 1, "--dcut-profile-context-len",
               f"must be >= 1, got {self.profile_context_len}")
        if self.profile_batch_sizes is not None:
            b = tuple(self.profile_batch_sizes)
            _check(len(b) > 0 and all(x >= 1 for x in b), "--dcut-profile-batch-sizes",
                   f"batch sizes must be >= 1, got {list(b)}")
            _check(all(x < y for x, y in zip(b, b[1:])), "--dcut-profile-batch-sizes",
                   f"batch sizes must be strictly increasing, got {list(b)}")
            object.__setattr__(self, "profile_batch_sizes", b)

    @property
    def enabled(self) -> bool:
        return self.mode != DCUT_OFF

    @property
    def auto(self) -> bool:
        return self.mode == DCUT_AUTO

    @property
    def may_draft_off(self) -> bool:
        """Whether auto may choose draft-off steps (``--dcut auto --dcut-draft-off auto``)."""
        return self.auto and self.draft_off == DRAFT_OFF_AUTO

    @property
    def corrects_costs(self) -> bool:
        """Whether auto corrects its cost table online (``--dcut auto --dcut-online-costs on``)."""
        return self.auto and self.online_costs == ONLINE_COSTS_ON

    @property
    def fixed_ratio(self) -> Optional[float]:
        """The user's fixed ratio, or None for off/auto."""
        return self.mode if isinstance(self.mode, float) else None

    def fixed_ratio_fraction(self) -> Optional[Fraction]:
        """Exact rational form of the fixed ratio (see ``sglang_ext.dcut.tiers``)."""
        return None if self.fixed_ratio is None else Fraction(str(self.fixed_ratio))


# ----------------------------------------------------------------------------- both
@dataclass(frozen=True)
class ExtensionConfig:
    """Both feature configs, as attached to ``ServerArgs`` (``_specexit``, ``_dcut``)."""

    specexit: SpecExitConfig = field(default_factory=SpecExitConfig)
    dcut: DCutConfig = field(default_factory=DCutConfig)

    @property
    def enabled(self) -> bool:
        return self.specexit.enabled or self.dcut.enabled


def _all_flag_fields():
    for cls, key in ((SpecExitConfig, "specexit"), (DCutConfig, "dcut")):
        for name, spec, default in iter_flags(cls):
            yield cls, key, name, spec, default


EXTENSION_DESTS = tuple(spec.dest for _, _, _, spec, _ in _all_flag_fields())
"""argparse ``dest`` names / ``Engine`` keyword names of every extension flag."""


def configs_from_mapping(values: Mapping[str, Any], *, present_only: bool = True) -> ExtensionConfig:
    """Build both configs from a mapping keyed by flag dest (``specexit_method``, ``dcut`` ...).

    Used for the argparse namespace (as ``vars(args)``), ``Engine(**kwargs)`` and tests. Values may be
    strings (CLI/YAML) or already-typed Python values. Keys that are absent or None keep the default.

    Examples
    --------
    >>> cfg = configs_from_mapping({"specexit": True, "dcut": "auto", "dcut_tiers": "0.5,1.0"})
    >>> cfg.specexit.enabled, cfg.dcut.mode, cfg.dcut.tiers
    (True, 'auto', (0.5, 1.0))
    """
    kwargs: Dict[str, Dict[str, Any]] = {"specexit": {}, "dcut": {}}
    for _cls, key, name, spec, _default in _all_flag_fields():
        if spec.dest not in values:
            continue
        raw = values[spec.dest]
        if raw is None:
            continue
        try:
            val = spec.parse(raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{spec.flag}: {e}") from None
        if spec.choices is not None and val not in spec.choices:
            raise ConfigError(f"{spec.flag}: invalid choice {val!r} (choose from {', '.join(spec.choices)})")
        kwargs[key][name] = val
    return ExtensionConfig(specexit=SpecExitConfig(**kwargs["specexit"]), dcut=DCutConfig(**kwargs["dcut"]))


def _join_list(how: str, items: Sequence[Any]) -> str:
    if how == "json":
        return json.dumps(list(items))
    return how.join(str(x) for x in items)


def _preset_value(spec: FlagSpec, value: Any) -> Any:
    if spec.store_true:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)):
            try:
                return _parse_bool(value)
            except ValueError:
                pass
        raise ConfigError(f"{spec.flag}: expected true or false, got {value!r}")
    if isinstance(value, (list, tuple)):
        if spec.list_join is None:
            raise ConfigError(f"{spec.flag}: expected a single value, got a list {list(value)!r}")
        return _join_list(spec.list_join, value)
    return value


def preset_values(config: Mapping[Any, Any]) -> Dict[Any, Any]:
    """The extension entries of a parsed ``--config`` YAML mapping, in the form SGLang's reader turns
    into one command-line value each; other keys are returned unchanged.

    SGLang's reader writes a YAML list as several command-line items and any non-boolean value of a
    switch as a stray argument. Here a list for ``--dcut-tiers``/``--dcut-profile-batch-sizes``
    becomes the comma string, for ``--specexit-method`` the ``_``-joined combination and for
    ``--specexit-step-split-tokens`` the JSON list (then parsed and validated like the command-line
    string); a switch (``specexit``) takes a boolean or a boolean word (``"on"``, ``"yes"``, ``1``);
    anything else is a :class:`ConfigError` naming the flag.

    Examples
    --------
    >>> preset_values({"dcut-tiers": [0.5, 1.0], "specexit": "on", "port": 30000})
    {'dcut-tiers': '0.5,1.0', 'specexit': True, 'port': 30000}
    >>> preset_values({"specexit": "yes-please"})
    Traceback (most recent call last):
    ...
    sglang_ext.config.ConfigError: --specexit: expected true or false, got 'yes-please'
    """
    specs = {spec.dest: spec for _cls, _key, _name, spec, _default in _all_flag_fields()}
    out: Dict[Any, Any] = {}
    for key, value in config.items():
        spec = specs.get(key.replace("-", "_")) if isinstance(key, str) else None
        out[key] = value if spec is None else _preset_value(spec, value)
    return out


#: ``--disaggregation-mode`` values that mean "no prefill/decode disaggregation" (SGLang's default is "null").
NO_DISAGGREGATION = (None, "", "null")


def check_against_server(cfg: ExtensionConfig, speculative_algorithm: Optional[str],
                         disaggregation_mode: Optional[str] = None) -> None:
    """Cross-checks with SGLang's own flags that need no model or tokenizer.

    Prefill/decode disaggregation is refused for both features: on a decode server SpecExit never
    sees a request's prefill (it would treat every request as non-thinking), and D-Cut has not been
    tested with a transferred KV cache.

    Examples
    --------
    >>> check_against_server(configs_from_mapping({"dcut": "auto"}), None)
    Traceback (most recent call last):
    ...
    sglang_ext.config.ConfigError: --dcut: D-Cut prunes speculative decoding; add --speculative-algorithm (EAGLE, EAGLE3, NEXTN, STANDALONE or DFLASH)
    """
    algo = (speculative_algorithm or "").upper() or None
    if cfg.dcut.enabled:
        if algo is None or algo == "NONE":
            raise ConfigError("--dcut: D-Cut prunes speculative decoding; add --speculative-algorithm "
                              f"({', '.join(DCUT_ALGORITHMS[:-1])} or {DCUT_ALGORITHMS[-1]})")
        if algo not in DCUT_ALGORITHMS:
            raise ConfigError(f"--dcut: not supported with --speculative-algorithm {algo}; "
                              f"supported: {', '.join(DCUT_ALGORITHMS)}")
    if cfg.specexit.enabled:
        if algo not in SPECEXIT_ALGORITHMS:
            raise ConfigError("--specexit: needs a draft (--speculative-algorithm EAGLE3, EAGLE, NEXTN or "
                              f"STANDALONE), got {algo or 'no speculative decoding'}")
        if algo == STANDALONE and cfg.specexit.signal_source == "head":
            raise ConfigError("--specexit-signal-source head: a STANDALONE draft is a plain language model without "
                              "SpecExit signal rows; add --specexit-signal-source draft-confidence")
    if disaggregation_mode not in NO_DISAGGREGATION:
        for flag, on in (("--specexit", cfg.specexit.enabled), ("--dcut", cfg.dcut.enabled)):
            if on:
                raise ConfigError(f"{flag}: not supported with --disaggregation-mode {disaggregation_mode} "
                                  "(SpecExit must see each request's prefill on the same server; D-Cut is untested "
                                  "with prefill/decode disaggregation)")


@dataclass(frozen=True)
class ResolvedTokens:
    """Token ids SpecExit needs, resolved with the served tokenizer at worker start.

    ``inactive_reason`` is None when SpecExit can run; otherwise it says why SpecExit watches no
    request on this model (``stop_think_id`` is then :data:`NO_STOP_THINK_ID` and
    ``step_split_ids`` is empty)."""

    stop_think_id: int
    step_split_ids: Tuple[int, ...]
    dropped_step_split: Tuple[str, ...]
    inactive_reason: Optional[str] = None

    @property
    def active(self) -> bool:
        return self.inactive_reason is None


NO_STOP_THINK_ID = -1
"""``ResolvedTokens.stop_think_id`` of an inactive SpecExit (no token id is negative)."""


def resolve_token_ids(cfg: SpecExitConfig, encode: Callable[[str], Sequence[int]]) -> ResolvedTokens:
    """Resolve the stop-think token and the boundary set with the tokenizer's ``encode``
    (without special-token additions).

    A stop-think string that is not one token, or a boundary list of which no string is one
    token, is a :class:`ConfigError` naming the flag when the user gave that flag. With the
    default strings it means a model without a thinking span (e.g. ``</think>`` splits into
    several tokens): SpecExit is then inactive on this model (``inactive_reason`` says why) and
    the server runs as without ``--specexit``.

    Examples
    --------
    >>> vocab = {"</think>": 7, "\\n\\n": 3}
    >>> enc = lambda s: [vocab[s]] if s in vocab else [1, 2]
    >>> r = resolve_token_ids(SpecExitConfig(enabled=True), enc)
    >>> r.stop_think_id, r.step_split_ids, r.active
    (7, (3,), True)
    >>> resolve_token_ids(SpecExitConfig(enabled=True), lambda s: [1, 2]).inactive_reason
    "the tokenizer has no single '</think>' token (it encodes to 2 tokens); SpecExit is inactive on this model (no thinking span to end)"
    """
    stop = list(encode(cfg.stop_think_token))
    if len(stop) != 1:
        if "stop_think_token" in cfg.explicit:
            raise ConfigError(f"--specexit-stop-think-token: {cfg.stop_think_token!r} must encode to exactly one "
                              f"token with this tokenizer, got {len(stop)} tokens {stop}")
        return ResolvedTokens(NO_STOP_THINK_ID, (), (), inactive_reason=(
            f"the tokenizer has no single {cfg.stop_think_token!r} token (it encodes to {len(stop)} tokens); "
            "SpecExit is inactive on this model (no thinking span to end)"))
    ids: List[int] = []
    dropped: List[str] = []
    for s in cfg.step_split_tokens:
        enc = list(encode(s))
        if len(enc) == 1:
            if enc[0] not in ids:
                ids.append(enc[0])
        else:
            dropped.append(s)
    if not ids:
        if "step_split_tokens" in cfg.explicit:
            raise ConfigError("--specexit-step-split-tokens: none of "
                              f"{json.dumps(list(cfg.step_split_tokens))} encodes to a single token with this "
                              "tokenizer, so SpecExit could never find a paragraph boundary")
        return ResolvedTokens(NO_STOP_THINK_ID, (), tuple(dropped), inactive_reason=(
            "none of the default --specexit-step-split-tokens encodes to a single token with this tokenizer; "
            "SpecExit is inactive on this model (no paragraph boundary to exit at)"))
    return ResolvedTokens(stop_think_id=int(stop[0]), step_split_ids=tuple(ids), dropped_step_split=tuple(dropped))


# ----------------------------------------------------------------------------- configs on ServerArgs
#: ``ServerArgs`` attributes that carry the configs to every SGLang process (pickled with it).
SPECEXIT_ATTR = "_specexit"
DCUT_ATTR = "_dcut"


def get_extension_config(server_args: Any) -> ExtensionConfig:
    """The configs attached to a ``ServerArgs`` (defaults when none are attached)."""
    se = getattr(server_args, SPECEXIT_ATTR, None)
    dc = getattr(server_args, DCUT_ATTR, None)
    return ExtensionConfig(specexit=se if se is not None else SpecExitConfig(),
                           dcut=dc if dc is not None else DCutConfig())


def attach_extension_config(server_args: Any, cfg: ExtensionConfig) -> None:
    """Store the configs as underscore attributes; they are pickled to every scheduler process."""
    setattr(server_args, SPECEXIT_ATTR, cfg.specexit)
    setattr(server_args, DCUT_ATTR, cfg.dcut)

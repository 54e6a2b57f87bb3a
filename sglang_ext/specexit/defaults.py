"""Server-level defaults of SpecExit, defined once.

Every default that a launcher flag, a preset or a per-request override falls back to lives
here, so that the config module, the overrides parser and the docs cannot disagree. This
module imports only the standard library (the config module may import it cheaply).

The values are the effective reference values (docs/algorithms.md#specexit-defaults) plus the
project guards (docs/algorithms.md#specexit-guards), which are off by default.

Examples
--------
>>> DEFAULT_METHOD, DEFAULT_SMOOTHING, DEFAULT_EWMA_ALPHA, DEFAULT_WINDOW
('confidence_progress_remain', 'ewma', 0.1, 10)
>>> DEFAULT_MAX_THINK_TOKENS is None  # the max-think guard is off
True
>>> DEFAULT_STEP_SPLIT_STRINGS[0] == "\\n\\n"
True
"""

from __future__ import annotations

from typing import Optional, Tuple

# --- signal method (A.3) ------------------------------------------------------------------

#: The three signal names, in the fixed row order of a SpecExit checkpoint.
SIGNAL_NAMES: Tuple[str, ...] = ("confidence", "progress", "remain")

#: Separator of the method grammar: ``name ("_" name)*``.
METHOD_SEPARATOR = "_"

#: Default method: all three signals.
DEFAULT_METHOD = "confidence_progress_remain"

# --- smoothing (A.4) ----------------------------------------------------------------------

#: Accepted smoother names (no fallback: anything else is an error).
SMOOTHING_NAMES: Tuple[str, ...] = ("ewma", "momentum", "mean", "paragraph_mean")

DEFAULT_SMOOTHING = "ewma"

#: EWMA weight of the newest observation (the reference overrides its class default 0.2).
DEFAULT_EWMA_ALPHA = 0.1

#: Window W of ``momentum``, ``mean`` and ``paragraph_mean`` (reference value in effect).
DEFAULT_WINDOW = 10

#: Largest window a server or a request may ask for. It sizes the per-slot history buffer
#: (``max_slots x MAX_WINDOW x 3`` scores), so it is a hard cap, not a default.
MAX_WINDOW = 256

# --- thresholds (A.5) ---------------------------------------------------------------------

#: Exit needs smoothed confidence > this.
DEFAULT_CONFIDENCE_THRESHOLD = 0.8

#: Exit needs smoothed progress > this.
DEFAULT_PROGRESS_THRESHOLD = 0.3

#: Exit needs smoothed remain (tokens) < this.
DEFAULT_REMAIN_THRESHOLD = 200.0

# --- guards (A.9, project rule; both off by default) --------------------------------------

#: No signal exit while the thinking length through the boundary token is below this.
DEFAULT_MIN_THINK_TOKENS = 0

#: Force an exit once thinking reaches this many tokens; ``None`` means off.
DEFAULT_MAX_THINK_TOKENS: Optional[int] = None

#: After ``max_think_tokens``, wait at most this many tokens for a paragraph boundary.
DEFAULT_MAX_THINK_GRACE = 64

# --- tokens (A.6) -------------------------------------------------------------------------

#: The text whose single token ends the thinking phase.
DEFAULT_STOP_THINK_TOKEN = "</think>"

#: Paragraph-break strings of the reference; only those that encode to one token are used.
DEFAULT_STEP_SPLIT_STRINGS: Tuple[str, ...] = (
    "\n\n",
    "\n\n\n",
    ".\n\n",
    ".\n\n\n",
    " \n\n",
    " \n\n\n",
)

# --- signal source (issue 2 flag list) ----------------------------------------------------

#: ``head``: the SpecExit rows of the EAGLE3 ``fc``; ``draft-confidence``: the draft's own
#: token probabilities (confidence only, see ``draft_confidence.py``).
SIGNAL_SOURCES: Tuple[str, ...] = ("head", "draft-confidence")

DEFAULT_SIGNAL_SOURCE = "head"

# --- per-request overrides ----------------------------------------------------------------

#: Keys of SGLang's ``sampling_params.custom_params`` that SpecExit reads start with this
#: prefix (``specexit_confidence_threshold``, ...). Other keys belong to other features and
#: are ignored.
OVERRIDE_PREFIX = "specexit_"

#: The value a client sends for ``max_think_tokens`` to switch that guard off.
OFF_VALUE = "off"

"""SpecExit signals: method grammar, checkpoint rows, decoding, per-step mean (pure torch).

docs/algorithms.md#specexit-signals. A *method* is an ``_``-joined set of signal names taken from
``confidence``, ``progress`` and ``remain``; the signal rows always follow that fixed order,
whatever the order in the string. Raw rows ``z`` decode as ``sigmoid(z)`` (confidence,
progress) and ``exp(z)`` (remain, in tokens). The per-step observation of a request is the
mean of the decoded signals over the positions that step commits: the root ``r_0`` plus the
accepted drafts ``r_1..r_a`` (``a + 1`` positions, the bonus excluded).

Decoded signals are always laid out in ``NUM_SIGNALS`` fixed columns (``Signal`` values);
a signal that the method does not use holds NaN. This lets one batch mix requests whose
per-request method subsets differ.

Glossary of shape names: ``num_tokens`` rows of the verify window that carry raw signal rows,
``num_positions`` committed positions of all requests together, ``batch_size`` requests,
``k`` signal rows of a checkpoint or a method.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from sglang_ext.specexit.defaults import METHOD_SEPARATOR, SIGNAL_NAMES


class Signal(enum.IntEnum):
    """One SpecExit signal; the value is its fixed column (and its row in a 3-row checkpoint)."""

    CONFIDENCE = 0
    PROGRESS = 1
    REMAIN = 2

    @property
    def label(self) -> str:
        """The name used in method strings (``"confidence"``, ...)."""
        return SIGNAL_NAMES[int(self)]


#: Number of fixed signal columns (confidence, progress, remain).
NUM_SIGNALS = len(Signal)


class SpecExitMethodError(ValueError):
    """A method string, or a method/checkpoint combination, is invalid."""


@dataclass(frozen=True)
class SpecExitMethod:
    """A parsed, canonical SpecExit method.

    Attributes
    ----------
    signals : tuple of Signal
        The chosen signals in the fixed order confidence, progress, remain (non-empty,
        strictly increasing). ``signals[i]`` is decoded from row ``i`` of a checkpoint
        trained for exactly this method.

    Examples
    --------
    >>> m = parse_method("remain_confidence")
    >>> m.name, m.k, m.names
    ('confidence_remain', 2, ('confidence', 'remain'))
    >>> m.active_columns
    (True, False, True)
    """

    signals: Tuple[Signal, ...]

    def __post_init__(self) -> None:
        if not self.signals:
            raise SpecExitMethodError("a SpecExit method needs at least one signal")
        values = [int(s) for s in self.signals]
        if values != sorted(set(values)):
            raise SpecExitMethodError(
                f"signals must be unique and in the order {', '.join(SIGNAL_NAMES)}; got {values}"
            )
        object.__setattr__(self, "signals", tuple(Signal(v) for v in values))

    @property
    def k(self) -> int:
        """Number of signal rows this method needs."""
        return len(self.signals)

    @property
    def names(self) -> Tuple[str, ...]:
        """Signal names in row order."""
        return tuple(s.label for s in self.signals)

    @property
    def name(self) -> str:
        """Canonical method string (fixed order)."""
        return METHOD_SEPARATOR.join(self.names)

    @property
    def active_columns(self) -> Tuple[bool, ...]:
        """For each fixed column (``Signal`` value): does this method use it?"""
        return tuple(s in self.signals for s in Signal)

    def uses(self, signal: Signal) -> bool:
        """Whether ``signal`` is part of this method.

        Examples
        --------
        >>> parse_method("progress").uses(Signal.CONFIDENCE)
        False
        """
        return signal in self.signals

    def is_subset_of(self, other: "SpecExitMethod") -> bool:
        """Whether every signal of this method is also in ``other``.

        Examples
        --------
        >>> parse_method("remain").is_subset_of(parse_method("confidence_remain"))
        True
        """
        return set(self.signals) <= set(other.signals)

    def checkpoint_rows(
        self, checkpoint_k: int, checkpoint_method: Optional["SpecExitMethod"] = None
    ) -> Tuple[int, ...]:
        """Rows of a ``checkpoint_k``-row signal head to read, in this method's order.

        Project rule (docs/algorithms.md#specexit-signals): a checkpoint with 3 rows holds confidence,
        progress, remain and serves every method by row selection. A checkpoint with fewer
        rows holds exactly the rows of the method it was trained for: ``checkpoint_method``
        when given, otherwise this method (so ``checkpoint_k`` must equal ``self.k``).

        Parameters
        ----------
        checkpoint_k : int
            Signal rows of the checkpoint (``fc.out_features - hidden_size``), 1..3.
        checkpoint_method : SpecExitMethod, optional
            The method the checkpoint was trained for, if known.

        Returns
        -------
        tuple of int
            ``rows[i]`` is the checkpoint row of ``self.signals[i]``.

        Raises
        ------
        SpecExitMethodError
            If the checkpoint lacks a row this method needs, or ``checkpoint_k`` is
            inconsistent.

        Examples
        --------
        >>> parse_method("progress_remain").checkpoint_rows(3)
        (1, 2)
        >>> parse_method("remain").checkpoint_rows(2, parse_method("confidence_remain"))
        (1,)
        """
        if not 1 <= checkpoint_k <= NUM_SIGNALS:
            raise SpecExitMethodError(
                f"the checkpoint has {checkpoint_k} signal rows; expected 1..{NUM_SIGNALS}"
            )
        if checkpoint_method is None:
            if checkpoint_k == NUM_SIGNALS:
                checkpoint_method = FULL_METHOD
            elif checkpoint_k == self.k:
                checkpoint_method = self
            else:
                raise SpecExitMethodError(
                    f"method '{self.name}' needs {self.k} signal rows but the checkpoint has "
                    f"{checkpoint_k} (only a 3-row checkpoint serves any method subset)"
                )
        elif checkpoint_method.k != checkpoint_k:
            raise SpecExitMethodError(
                f"checkpoint method '{checkpoint_method.name}' has {checkpoint_method.k} rows "
                f"but the checkpoint has {checkpoint_k}"
            )
        missing = [s.label for s in self.signals if s not in checkpoint_method.signals]
        if missing:
            raise SpecExitMethodError(
                f"method '{self.name}' asks for signal row(s) {', '.join(missing)} that the "
                f"checkpoint (trained for '{checkpoint_method.name}') lacks"
            )
        return tuple(checkpoint_method.signals.index(s) for s in self.signals)


def parse_method(text: str) -> SpecExitMethod:
    """Parse a method string of the grammar ``name ("_" name)*``.

    Order-insensitive; unknown, empty or repeated names are rejected.

    Parameters
    ----------
    text : str
        E.g. ``"confidence_progress_remain"`` or ``"remain_confidence"``.

    Returns
    -------
    SpecExitMethod

    Raises
    ------
    SpecExitMethodError
        With a message naming the bad word.

    Examples
    --------
    >>> parse_method("progress_confidence").name
    'confidence_progress'
    >>> parse_method("confidence_confidence")
    Traceback (most recent call last):
    ...
    sglang_ext.specexit.signals.SpecExitMethodError: signal 'confidence' appears twice in method 'confidence_confidence'
    """
    if not isinstance(text, str):
        raise SpecExitMethodError(f"a method must be a string, got {type(text).__name__}")
    expected = f"expected an '{METHOD_SEPARATOR}'-joined combination of {', '.join(SIGNAL_NAMES)}"
    if not text:
        raise SpecExitMethodError(f"empty method; {expected}")
    seen = []
    for word in text.split(METHOD_SEPARATOR):
        if word not in SIGNAL_NAMES:
            shown = "an empty name" if word == "" else f"unknown signal '{word}'"
            raise SpecExitMethodError(f"{shown} in method '{text}'; {expected}")
        signal = Signal(SIGNAL_NAMES.index(word))
        if signal in seen:
            raise SpecExitMethodError(f"signal '{word}' appears twice in method '{text}'")
        seen.append(signal)
    return SpecExitMethod(tuple(sorted(seen)))


#: The method with all three signals (the layout of a 3-row checkpoint).
FULL_METHOD = SpecExitMethod(tuple(Signal))

#: All 7 methods, fewest signals first.
ALL_METHODS: Tuple[SpecExitMethod, ...] = tuple(
    SpecExitMethod(tuple(s for s in Signal if mask >> int(s) & 1))
    for mask in sorted(range(1, 2**NUM_SIGNALS), key=lambda m: (bin(m).count("1"), m))
)


def decode_signals(
    raw: torch.Tensor,  # [num_tokens, method.k]
    method: SpecExitMethod,
) -> torch.Tensor:  # [num_tokens, NUM_SIGNALS]
    """Decode raw signal rows into the fixed signal columns.

    ``confidence = sigmoid(z)``, ``progress = sigmoid(z)``, ``remain = exp(z)`` (tokens).
    Columns of signals the method does not use are NaN. Computed in at least float32.

    Parameters
    ----------
    raw : torch.Tensor
        ``[num_tokens, method.k]``: raw rows in method order (select them from a checkpoint
        with :meth:`SpecExitMethod.checkpoint_rows` first).
    method : SpecExitMethod
        The method whose signals ``raw`` holds.

    Returns
    -------
    torch.Tensor
        ``[num_tokens, NUM_SIGNALS]`` decoded signals, NaN where unused.

    Examples
    --------
    >>> z = torch.tensor([[0.0, 0.0]])
    >>> decode_signals(z, parse_method("confidence_remain")).tolist()
    [[0.5, nan, 1.0]]
    """
    if raw.dim() != 2 or raw.shape[1] != method.k:
        raise ValueError(
            f"raw signal rows must be [num_tokens, {method.k}] for method '{method.name}', "
            f"got {list(raw.shape)}"
        )
    dtype = torch.promote_types(raw.dtype, torch.float32)
    raw = raw.to(dtype)
    out = torch.full((raw.shape[0], NUM_SIGNALS), float("nan"), dtype=dtype, device=raw.device)
    for row, signal in enumerate(method.signals):
        z = raw[:, row]
        out[:, int(signal)] = torch.exp(z) if signal == Signal.REMAIN else torch.sigmoid(z)
    return out


def mean_over_segments(
    values: torch.Tensor,  # [num_positions, num_signals]
    indptr: torch.Tensor,  # [batch_size + 1], exclusive offsets, indptr[0] == 0
) -> torch.Tensor:  # [batch_size, num_signals]
    """Per-request mean of ragged per-position values.

    Request ``b`` owns rows ``indptr[b] : indptr[b + 1]`` of ``values`` (for SpecExit: the
    root and the accepted drafts of this step, bonus excluded). No host synchronisation.
    A request with an empty segment gets NaN ("no observation"); a NaN inside a segment
    makes that request's mean NaN. Rows at or past ``indptr[-1]`` are ignored.

    Parameters
    ----------
    values : torch.Tensor
        ``[num_positions, num_signals]`` floating values.
    indptr : torch.Tensor
        ``[batch_size + 1]`` integer exclusive offsets with a leading 0.

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_signals]`` means.

    Examples
    --------
    Request 0 owns rows 0..1, request 1 owns row 2, request 2 owns nothing:

    >>> v = torch.tensor([[1.0], [3.0], [5.0]])
    >>> mean_over_segments(v, torch.tensor([0, 2, 3, 3])).tolist()
    [[2.0], [5.0], [nan]]
    """
    indptr = indptr.to(device=values.device, dtype=torch.int64)
    batch_size = indptr.numel() - 1
    positions = torch.arange(values.shape[0], device=values.device)
    # Row p belongs to the b with indptr[b] <= p < indptr[b+1]; rows past the end go to a sink.
    segment = torch.searchsorted(indptr[1:], positions, right=True)  # [num_positions]
    sums = torch.zeros(
        (batch_size + 1, values.shape[1]), dtype=values.dtype, device=values.device
    ).index_add_(0, segment, values)[:batch_size]
    counts = (indptr[1:] - indptr[:-1]).to(values.dtype)  # [batch_size]
    return sums / counts[:, None]


def strided_token_columns(
    values: torch.Tensor,  # [batch_size * stride, num_signals]
    batch_size: int,
    stride: int,
    width: int,
) -> torch.Tensor:  # [batch_size, width, num_signals]
    """The first ``width`` rows of each request's strided verify window, one column per token.

    This is the verify-window layout of SGLang: request ``b`` owns rows
    ``b * stride .. b * stride + stride - 1`` and its committed positions (root + accepted
    drafts, front-compacted for trees) are its first ``accept_lens[b]`` rows. Column ``j`` of
    the result is the row of ``r_j``; columns past a request's ``a`` hold whatever the window
    held there (``SpecExitState.step`` ignores them).

    Parameters
    ----------
    values : torch.Tensor
        ``[batch_size * stride, num_signals]`` per-row values.
    batch_size, stride : int
        Requests and rows per request (``speculative_num_draft_tokens``).
    width : int
        Columns to keep, ``1 <= width <= stride`` (the longest possible run ``r_0..r_a``).

    Returns
    -------
    torch.Tensor
        ``[batch_size, width, num_signals]`` (a view when possible).

    Examples
    --------
    >>> v = torch.tensor([[1.0], [3.0], [5.0], [4.0], [8.0], [9.0]])
    >>> strided_token_columns(v, batch_size=2, stride=3, width=2)[:, :, 0].tolist()
    [[1.0, 3.0], [4.0, 8.0]]
    """
    if not 1 <= width <= stride:
        raise ValueError(f"width must be in 1..{stride}, got {width}")
    return values[: batch_size * stride].view(batch_size, stride, values.shape[1])[:, :width]

"""SpecExit EAGLE3 draft checkpoints: write one, and read its signal head without loading it.

A SpecExit draft (docs/algorithms.md#specexit-signals, AngelSlim layout) is an EAGLE3 draft whose ``fc.weight``
is ``[H + k, num_aux * H_target]``: the ``H`` token rows of the stock checkpoint followed by
``k`` signal rows (order confidence, progress, remain, restricted to the trained method).
:func:`add_signal_rows` builds one from a stock checkpoint directory (``config.json`` +
``model.safetensors``) and the ``[k, num_aux * H_target]`` rows, e.g. rows fitted as a linear
probe elsewhere, or constant rows for engine tests (all-zero rows decode to confidence 0.5,
progress 0.5, remain 1 token at every position).

**Trainer format.** EAGLE3 trainers save such a draft under the standard architecture name
(``"architectures": ["LlamaForCausalLMEagle3"]``) with no extension field in ``config.json``.
:func:`inspect_draft` reads the ``fc`` shape from the safetensors header (or the index of a
sharded checkpoint; a ``.bin`` checkpoint is memory-mapped), so the loader can pick the SpecExit
draft class before any weight is read. :func:`head_rows` is the launch check: which rows of the
head serve ``--specexit-method``, or one line naming the flag (or the ``config.json`` field) when
the head cannot serve it.

This module writes the standard name (``SPECEXIT_ARCHITECTURE``) plus ``specexit_num_signals = k``
and ``specexit_method`` (the trained method, so a 1- or 2-row head is unambiguous). Drafts saved
under the former name ``LlamaForCausalLMEagle3SpecExit`` (``LEGACY_SPECEXIT_ARCHITECTURE``) still load.

Imports: torch, safetensors and stdlib only (no sglang).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from sglang_ext.config import ConfigError
from sglang_ext.specexit.signals import FULL_METHOD, NUM_SIGNALS, SpecExitMethodError, parse_method

#: ``architectures`` entry this module writes: SGLang's own EAGLE3 (Llama) draft name.
SPECEXIT_ARCHITECTURE = "LlamaForCausalLMEagle3"
#: Architectures whose ``fc`` rows are inspected (the SpecExit class subclasses SGLang's class of this name).
STANDARD_EAGLE3_ARCHITECTURES: Tuple[str, ...] = ("LlamaForCausalLMEagle3",)
#: Former ``architectures`` entry of the project's SpecExit drafts (still registered and loaded).
LEGACY_SPECEXIT_ARCHITECTURE = "LlamaForCausalLMEagle3SpecExit"
WEIGHTS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: ``config.json`` fields recording the head (optional; written by :func:`add_signal_rows`).
NUM_SIGNALS_FIELD = "specexit_num_signals"
METHOD_FIELD = "specexit_method"
#: ``--specexit-signal-source`` value that reads the head.
HEAD_SIGNAL_SOURCE = "head"
#: Value of ``DraftHead.fc_rows`` when the checkpoint's ``fc`` shape could not be read.
FC_ROWS_UNKNOWN = -1


class SpecExitCheckpointError(ConfigError):
    """The draft's SpecExit head cannot serve the launch flags; the message names the flag or field."""


@dataclass(frozen=True)
class DraftHead:
    """What a draft checkpoint holds for SpecExit, read from ``config.json`` and the weight headers.

    Attributes
    ----------
    path : str
        The checkpoint directory.
    architecture : str or None
        ``config.json`` ``architectures[0]``.
    hidden_size : int
        Token rows of ``fc`` (``config.json`` ``hidden_size``).
    fc_rows : int
        Rows of ``fc.weight`` in the weights (``FC_ROWS_UNKNOWN`` when unreadable).
    recorded_method : str or None
        ``config.json`` ``specexit_method`` when recorded.
    """

    path: str
    architecture: Optional[str]
    hidden_size: int
    fc_rows: int
    recorded_method: Optional[str]

    @property
    def known(self) -> bool:
        """Whether the ``fc`` shape was read."""
        return self.fc_rows != FC_ROWS_UNKNOWN

    @property
    def num_signals(self) -> int:
        """SpecExit rows of ``fc`` (``fc_rows - hidden_size``; 0 for a plain draft or an unknown shape)."""
        return max(0, self.fc_rows - self.hidden_size) if self.known else 0


def _is_fc_weight_name(name: str) -> bool:
    return name.split(".")[-2:] == ["fc", "weight"]


def _fc_shape_from_safetensors(files) -> Optional[Tuple[int, ...]]:
    from safetensors import safe_open

    for path in files:
        with safe_open(path, framework="pt") as f:  # reads the header only
            for name in f.keys():
                if _is_fc_weight_name(name):
                    return tuple(f.get_slice(name).get_shape())
    return None


def read_fc_shape(model_dir: str) -> Optional[Tuple[int, ...]]:
    """Shape of the checkpoint's ``fc.weight`` without loading the weights (None when not found).

    Reads the safetensors headers (through ``model.safetensors.index.json`` for a sharded
    checkpoint); a ``*.bin`` checkpoint is memory-mapped, not read.
    """
    index = os.path.join(model_dir, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_dir, v) for k, v in weight_map.items() if _is_fc_weight_name(k)})
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        return _fc_shape_from_safetensors(files)
    for path in sorted(glob.glob(os.path.join(model_dir, "*.bin"))):
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        for name, w in state.items():
            if _is_fc_weight_name(name):
                return tuple(w.shape)
    return None


def inspect_draft(model_dir: str) -> DraftHead:
    """:class:`DraftHead` of a local draft checkpoint directory.

    Raises
    ------
    OSError, ValueError
        When ``config.json`` cannot be read (the caller decides whether that matters).
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    shape = read_fc_shape(model_dir)
    return DraftHead(
        path=model_dir,
        architecture=(config.get("architectures") or [None])[0],
        hidden_size=int(config["hidden_size"]),
        fc_rows=int(shape[0]) if shape is not None and len(shape) == 2 else FC_ROWS_UNKNOWN,
        recorded_method=config.get(METHOD_FIELD) or None,
    )


def head_rows(num_signals: int, recorded_method: Optional[str], method: str,
              where: str = "the draft") -> Tuple[int, ...]:
    """The launch check of ``--specexit-signal-source head``: the head rows serving ``method``.

    Rules: the head's method is ``recorded_method`` (``config.json`` ``specexit_method``) when
    recorded, and must have ``num_signals`` rows; an unrecorded 3-row head holds confidence,
    progress, remain in that order (and serves any subset); an unrecorded 1- or 2-row head is
    refused (which signals it holds is unknown). ``method`` must be a subset of the head's method.

    Parameters
    ----------
    num_signals : int
        SpecExit rows of the draft's ``fc`` (``fc`` rows minus ``hidden_size``).
    recorded_method : str or None
        The draft's ``config.json`` ``specexit_method``.
    method : str
        ``--specexit-method``.
    where : str
        How the messages name the draft (e.g. its path).

    Returns
    -------
    tuple of int
        ``rows[i]`` is the head row of the ``i``-th signal of ``method``.

    Raises
    ------
    SpecExitCheckpointError
        One line starting with the flag (``--specexit-signal-source``, ``--specexit-method``).

    Examples
    --------
    >>> head_rows(3, None, "progress_remain")
    (1, 2)
    >>> head_rows(2, "confidence_remain", "remain")
    (1,)
    >>> head_rows(1, None, "confidence")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sglang_ext.engine.specexit.checkpoint.SpecExitCheckpointError: --specexit-method: the draft's fc has 1 SpecExit signal row but its config.json records no specexit_method, ...
    """
    if num_signals <= 0:
        raise SpecExitCheckpointError(
            f"--specexit-signal-source head: {where} has no SpecExit signal rows (its fc has hidden_size rows); "
            "use --specexit-signal-source draft-confidence (confidence from the draft's own token probabilities, "
            "any EAGLE3 draft) or a draft whose fc has hidden_size + k rows")
    try:
        served = parse_method(method)
    except SpecExitMethodError as e:
        raise SpecExitCheckpointError(f"--specexit-method: {e}") from None
    rows = "row" if num_signals == 1 else "rows"
    if num_signals > NUM_SIGNALS:
        raise SpecExitCheckpointError(
            f"--specexit-signal-source head: {where}'s fc has {num_signals} rows beyond hidden_size; a SpecExit "
            f"head has 1..{NUM_SIGNALS} (check hidden_size in its config.json)")
    if recorded_method is not None:
        try:
            trained = parse_method(recorded_method)
        except SpecExitMethodError as e:
            raise SpecExitCheckpointError(f"--specexit-method: {where}'s config.json field {METHOD_FIELD}: {e}") from None
        if trained.k != num_signals:
            raise SpecExitCheckpointError(
                f"--specexit-method: {where}'s config.json records {METHOD_FIELD} '{trained.name}' "
                f"({trained.k} signals) but its fc has {num_signals} SpecExit signal {rows}")
    elif num_signals == NUM_SIGNALS:
        trained = FULL_METHOD
    else:
        raise SpecExitCheckpointError(
            f"--specexit-method: {where}'s fc has {num_signals} SpecExit signal {rows} but its config.json records "
            f"no {METHOD_FIELD}, so which signals they hold is unknown; add \"{METHOD_FIELD}\": \"<signals the "
            f"rows hold, e.g. confidence>\" to its config.json (a 3-row head needs none)")
    missing = [sig.label for sig in served.signals if sig not in trained.signals]
    if missing:
        raise SpecExitCheckpointError(
            f"--specexit-method: '{served.name}' asks for signal row(s) {', '.join(missing)} that {where} "
            f"(trained for '{trained.name}') lacks")
    return tuple(trained.signals.index(sig) for sig in served.signals)


def _fc_key(state) -> str:
    keys = [k for k in state if k.split(".")[-2:] == ["fc", "weight"]]
    if len(keys) != 1:
        raise ValueError(f"expected exactly one fc.weight in the checkpoint, found {keys}")
    return keys[0]


def add_signal_rows(
    src_dir: str,
    out_dir: str,
    rows: torch.Tensor,  # [k, num_aux * target_hidden_size]
    method: str = "confidence_progress_remain",
    hidden_size: Optional[int] = None,
) -> str:
    """Copy a stock EAGLE3 draft from ``src_dir`` to ``out_dir`` with SpecExit rows appended.

    Parameters
    ----------
    src_dir : str
        Stock EAGLE3 checkpoint (``config.json``, ``model.safetensors``; other files copied).
    out_dir : str
        Destination directory (created).
    rows : torch.Tensor
        ``[k, num_aux * target_hidden_size]`` raw signal rows in method order.
    method : str
        The signals the rows hold (``k`` must match).
    hidden_size : int, optional
        Token rows of ``fc`` (default ``config.json`` ``hidden_size``); extra rows already in
        the source are replaced.

    Returns
    -------
    str
        ``out_dir``.

    Examples
    --------
    >>> add_signal_rows("draft", "draft_specexit", torch.zeros(3, 192))  # doctest: +SKIP
    'draft_specexit'
    """
    from safetensors.torch import load_file, save_file

    parsed = parse_method(method)
    if rows.dim() != 2 or rows.shape[0] != parsed.k:
        raise ValueError(f"method '{parsed.name}' needs {parsed.k} rows, got shape {list(rows.shape)}")
    with open(os.path.join(src_dir, "config.json")) as f:
        config = json.load(f)
    state = load_file(os.path.join(src_dir, WEIGHTS_FILE))
    key = _fc_key(state)
    fc = state[key]
    hidden = int(hidden_size if hidden_size is not None else config["hidden_size"])
    if rows.shape[1] != fc.shape[1]:
        raise ValueError(f"signal rows have {rows.shape[1]} inputs, fc has {fc.shape[1]}")
    state[key] = torch.cat([fc[:hidden], rows.to(fc.dtype)], dim=0).contiguous()
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(src_dir):
        if name not in ("config.json", WEIGHTS_FILE) and os.path.isfile(os.path.join(src_dir, name)):
            shutil.copy(os.path.join(src_dir, name), os.path.join(out_dir, name))
    config["architectures"] = [SPECEXIT_ARCHITECTURE]
    config[NUM_SIGNALS_FIELD] = parsed.k
    config[METHOD_FIELD] = parsed.name
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, WEIGHTS_FILE))
    return out_dir

"""Write a SpecExit EAGLE3 draft checkpoint: a stock EAGLE3 checkpoint plus signal rows in ``fc``.

A SpecExit draft (docs/algorithms.md#specexit-signals, AngelSlim layout) is an EAGLE3 draft whose ``fc.weight``
is ``[H + k, num_aux * H_target]``: the ``H`` token rows of the stock checkpoint followed by
``k`` signal rows (order confidence, progress, remain, restricted to the trained method).
:func:`add_signal_rows` builds one from a stock checkpoint directory (``config.json`` +
``model.safetensors``) and the ``[k, num_aux * H_target]`` rows, e.g. rows fitted as a linear
probe elsewhere, or constant rows for engine tests (all-zero rows decode to confidence 0.5,
progress 0.5, remain 1 token at every position).

The draft's ``config.json`` gets ``architectures = ["LlamaForCausalLMEagle3SpecExit"]``
(registered by the plugin), ``specexit_num_signals = k`` and ``specexit_method``.

Imports: torch, safetensors and stdlib only (no sglang).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch

from sglang_ext.specexit.signals import parse_method

#: ``architectures`` entry of a SpecExit draft (``sglang_ext.engine.specexit.draft_models.ARCHITECTURE``).
SPECEXIT_ARCHITECTURE = "LlamaForCausalLMEagle3SpecExit"
WEIGHTS_FILE = "model.safetensors"


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
    config["specexit_num_signals"] = parsed.k
    config["specexit_method"] = parsed.name
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, WEIGHTS_FILE))
    return out_dir

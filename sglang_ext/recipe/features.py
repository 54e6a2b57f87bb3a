"""Recipe stage (b): the target's auxiliary hidden states, the input of the EAGLE3 draft.

SGLang 0.5.23's ``LlamaForCausalLM.set_eagle3_layers_to_capture`` (no layer ids given)
captures the hidden states *entering* decoder layers ``2, L // 2, L - 3``; with layer ids
from the draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` it captures the inputs
of ``id + 1``.  The input of decoder layer ``i`` is ``hidden_states[i]`` of a transformers
forward with ``output_hidden_states=True`` (index 0 = the embeddings), so the features of
position ``p`` are ``cat(hidden_states[2][p], hidden_states[L//2][p], hidden_states[L-3][p])``
(``tests/integration/test_recipe_eagle3.py`` guards the rule against the installed SGLang).

The forward stops at the last tapped layer (later layers and the LM head are not needed), unless
the final normed hidden state is asked for too (``with_final``: the LM head's input, from which
the recipe's ``--soft-targets`` computes the target's distribution over the draft vocabulary).
No SGLang import.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang_ext.testbed.modeling import aux_layer_ids


def draft_layer_ids(num_layers: int) -> List[int]:
    """SGLang's default ``eagle_aux_hidden_state_layer_ids`` (SGLang adds 1 to each: the
    captured state is the *output* of decoder layer ``id``).

    Examples
    --------
    >>> draft_layer_ids(30)
    [1, 14, 26]
    """
    return [i - 1 for i in aux_layer_ids(num_layers)]


def check_layer_ids(layer_ids: Optional[Sequence[int]], num_layers: int) -> List[int]:
    """The draft's ``eagle_aux_hidden_state_layer_ids``: ``layer_ids`` checked, or SGLang's
    default.  Three distinct ascending ids in ``[0, num_layers - 2]``: SGLang captures the input
    of decoder layer ``id + 1``, so the last layer's own output (the final state) is never
    capturable.

    Examples
    --------
    >>> check_layer_ids(None, 30), check_layer_ids([1, 14, 28], 30)
    ([1, 14, 26], [1, 14, 28])
    >>> check_layer_ids([1, 14, 29], 30)
    Traceback (most recent call last):
    ValueError: aux layer ids [1, 14, 29]: need 3 distinct ascending ids in [0, 28] (SGLang captures the output of layer id, the input of layer id + 1, of a 30-layer target)
    """
    if layer_ids is None:
        return draft_layer_ids(num_layers)
    ids = [int(i) for i in layer_ids]
    if len(ids) != 3 or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > num_layers - 2:
        raise ValueError(f"aux layer ids {ids}: need 3 distinct ascending ids in [0, {num_layers - 2}] "
                         f"(SGLang captures the output of layer id, the input of layer id + 1, of a "
                         f"{num_layers}-layer target)")
    return ids


@torch.no_grad()
def capture(target, input_ids: torch.Tensor, with_final: bool = False,
            layer_ids: Optional[Sequence[int]] = None):
    """EAGLE3 features of right-padded sequences.

    Parameters
    ----------
    target : transformers ``LlamaForCausalLM`` (any model whose ``.model`` has ``.layers``)
    input_ids : torch.Tensor
        ``# [batch_size, seq_len]``
    with_final : bool
        Also return the target's final normed hidden state (its LM head's input), the source
        of the soft training targets (``--soft-targets``); runs every layer.
    layer_ids : list of int, optional
        The draft's ``eagle_aux_hidden_state_layer_ids`` (:func:`check_layer_ids`; default
        SGLang's): the state of ``id`` is ``hidden_states[id + 1]``.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``# [batch_size, seq_len, 3 * hidden_size]`` (the target's dtype); with ``with_final``
        also ``# [batch_size, seq_len, hidden_size]``.
    """
    ids = [i + 1 for i in check_layer_ids(layer_ids, target.config.num_hidden_layers)]
    taps, out = _layer_inputs(target.model, input_ids, ids, run_all=with_final)
    feats = torch.cat(taps, dim=-1)
    return (feats, out.last_hidden_state) if with_final else feats


class _TapsDone(Exception):
    """Raised by the last tap's hook: the later layers are not needed."""


def _layer_inputs(body, input_ids: torch.Tensor, layers: Sequence[int], run_all: bool):
    """The hidden states entering decoder layers ``layers`` (``# [batch_size, seq_len, H]`` each),
    read by forward pre-hooks; without ``run_all`` the forward stops at the last of them.

    Hooks, not ``output_hidden_states`` on a model with its layer list cut short: transformers
    records hidden states with hooks installed at the first forward, so a cut list there leaves
    later full forwards short of entries.  Returns ``(taps, output)``; ``output`` is None when
    the forward stopped early."""
    got = {}
    last = max(layers)

    def hook_of(i):
        def hook(module, args, kwargs):
            got[i] = args[0] if args else kwargs["hidden_states"]
            if i == last and not run_all:
                raise _TapsDone

        return hook

    handles = [body.layers[i].register_forward_pre_hook(hook_of(i), with_kwargs=True) for i in set(layers)]
    out = None
    try:
        out = body(input_ids=input_ids, use_cache=False)
    except _TapsDone:
        pass
    finally:
        for h in handles:
            h.remove()
    return [got[i] for i in layers], out


@torch.no_grad()
def capture_all(target, sequences: Sequence[Sequence[int]], batch_tokens: int = 4096,
                progress: bool = True, dtype: torch.dtype = torch.float16, with_final: bool = False,
                layer_ids: Optional[Sequence[int]] = None):
    """Features of every sequence, ``# [len_i, 3 * hidden_size]`` each, stored in ``dtype``;
    with ``with_final`` also the final normed hidden states ``# [len_i, hidden_size]`` (a
    second list).  ``layer_ids``: as :func:`capture`.

    Sequences are grouped by length into batches of about ``batch_tokens`` padded tokens.
    """
    from tqdm import tqdm

    target.eval()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    chunks: List[List[int]] = []
    cur: List[int] = []
    for i in order:
        if cur and (len(cur) + 1) * len(sequences[i]) > batch_tokens:
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    out: List[torch.Tensor] = [None] * len(sequences)  # type: ignore[list-item]
    finals: List[torch.Tensor] = [None] * len(sequences)  # type: ignore[list-item]
    bar = tqdm(total=sum(len(s) for s in sequences), desc="features", unit="tok", disable=not progress)
    for chunk in chunks:
        S = max(len(sequences[i]) for i in chunk)
        ids = torch.zeros(len(chunk), S, dtype=torch.long)
        for r, i in enumerate(chunk):
            ids[r, : len(sequences[i])] = torch.tensor(sequences[i])
        got = capture(target, ids, with_final=with_final, layer_ids=layer_ids)
        feats, final = got if with_final else (got, None)
        for r, i in enumerate(chunk):
            out[i] = feats[r, : len(sequences[i])].to(dtype).clone()
            if final is not None:
                finals[i] = final[r, : len(sequences[i])].to(dtype).clone()
        bar.update(sum(len(sequences[i]) for i in chunk))
    bar.close()
    return (out, finals) if with_final else out

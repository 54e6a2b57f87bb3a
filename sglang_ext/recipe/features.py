"""Recipe stage (b): the target's auxiliary hidden states, the input of the EAGLE3 draft.

SGLang 0.5.23's ``LlamaForCausalLM.set_eagle3_layers_to_capture`` (no layer ids given)
captures the hidden states *entering* decoder layers ``2, L // 2, L - 3``; with layer ids
from the draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` it captures the inputs
of ``id + 1``.  The input of decoder layer ``i`` is ``hidden_states[i]`` of a transformers
forward with ``output_hidden_states=True`` (index 0 = the embeddings), so the features of
position ``p`` are ``cat(hidden_states[2][p], hidden_states[L//2][p], hidden_states[L-3][p])``
(``tests/unit/test_recipe_eagle3.py`` guards the rule against the installed SGLang).

The forward stops after layer ``L - 3`` (later layers and the LM head are not needed), unless
the final normed hidden state is asked for too (``with_final``: the LM head's input, from which
the recipe's ``--soft-targets`` computes the target's distribution over the draft vocabulary).
No SGLang import.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from sglang_ext.testbed.modeling import aux_layer_ids


def draft_layer_ids(num_layers: int) -> List[int]:
    """``eagle_aux_hidden_state_layer_ids`` of the draft config (SGLang adds 1 to each).

    Examples
    --------
    >>> draft_layer_ids(30)
    [1, 14, 26]
    """
    return [i - 1 for i in aux_layer_ids(num_layers)]


@torch.no_grad()
def capture(target, input_ids: torch.Tensor, with_final: bool = False):
    """EAGLE3 features of right-padded sequences.

    Parameters
    ----------
    target : transformers ``LlamaForCausalLM`` (any model whose ``.model`` has ``.layers``)
    input_ids : torch.Tensor
        ``# [batch_size, seq_len]``
    with_final : bool
        Also return the target's final normed hidden state (its LM head's input), the source
        of the soft training targets (``--soft-targets``); runs every layer.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``# [batch_size, seq_len, 3 * hidden_size]`` (the target's dtype); with ``with_final``
        also ``# [batch_size, seq_len, hidden_size]``.
    """
    ids = aux_layer_ids(target.config.num_hidden_layers)
    body = target.model
    if with_final:
        out = body(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        return torch.cat([out.hidden_states[i] for i in ids], dim=-1), out.last_hidden_state
    layers = body.layers
    # hidden_states[i] is the input of layer i; keep one layer past the last tap, so that the
    # tapped entry is never the final (normed) one.
    body.layers = layers[: max(ids) + 1]
    try:
        out = body(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    finally:
        body.layers = layers
    hs = out.hidden_states
    return torch.cat([hs[i] for i in ids], dim=-1)


@torch.no_grad()
def capture_all(target, sequences: Sequence[Sequence[int]], batch_tokens: int = 4096,
                progress: bool = True, dtype: torch.dtype = torch.float16, with_final: bool = False):
    """Features of every sequence, ``# [len_i, 3 * hidden_size]`` each, stored in ``dtype``;
    with ``with_final`` also the final normed hidden states ``# [len_i, hidden_size]`` (a
    second list).

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
        got = capture(target, ids, with_final=with_final)
        feats, final = got if with_final else (got, None)
        for r, i in enumerate(chunk):
            out[i] = feats[r, : len(sequences[i])].to(dtype).clone()
            if final is not None:
                finals[i] = final[r, : len(sequences[i])].to(dtype).clone()
        bar.update(sum(len(sequences[i]) for i in chunk))
    bar.close()
    return (out, finals) if with_final else out

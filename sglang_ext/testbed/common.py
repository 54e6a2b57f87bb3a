"""Shared helpers of the testbed training code: encoding, batching, greedy decoding, checkpoints.

No SGLang import.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from sglang_ext.testbed import task
from sglang_ext.testbed.modeling import IGNORE_INDEX

EOS_IDS = (2, 0)  # <|im_end|>, <|endoftext|>
PAD_ID = 0


@dataclass
class Example:
    """One tokenized sequence: ``ids[:prompt_len]`` is the prompt."""

    ids: List[int]
    prompt_len: int


def encode_prompt(tok, question: str, thinking: bool = True) -> List[int]:
    return tok.encode(task.prompt_text(question, thinking), add_special_tokens=False)


def encode_example(tok, problem: task.Problem, n_rechecks: int, thinking: bool = True) -> Example:
    """Prompt + reference completion of ``problem``.

    Examples
    --------
    >>> from sglang_ext.testbed.tokenizer import build_tokenizer
    >>> ex = encode_example(build_tokenizer(), task.parse_question("Compute: 1 + 2"), 0)
    >>> ex.ids[ex.prompt_len - 2:ex.prompt_len], ex.ids[-1]
    ([3, 102], 2)
    """
    prompt = encode_prompt(tok, problem.question, thinking)
    comp = tok.encode(task.completion_text(problem, n_rechecks, thinking), add_special_tokens=False)
    return Example(prompt + comp, len(prompt))


def collate(examples: Sequence[Example]):
    """Right-pad examples.

    Returns
    -------
    input_ids : torch.Tensor
        ``# [batch_size, seq_len]`` padded with ``PAD_ID``.
    labels : torch.Tensor
        ``# [batch_size, seq_len]`` the ids on completion tokens, ``IGNORE_INDEX``
        on prompt and padding (HF convention: label at p is predicted at p - 1).
    lengths : torch.Tensor
        ``# [batch_size]``
    """
    S = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), S), PAD_ID, dtype=torch.long)
    labels = torch.full((len(examples), S), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        labels[i, e.prompt_len : len(e.ids)] = torch.tensor(e.ids[e.prompt_len :])
    lengths = torch.tensor([len(e.ids) for e in examples])
    return ids, labels, lengths


@torch.no_grad()
def greedy_generate(model, prompts: Sequence[List[int]], max_new_tokens: int,
                    batch_size: int = 64, progress: bool = False) -> List[List[int]]:
    """Greedy continuation of each prompt with a HF causal LM (left-padded batches).

    Returns the generated ids of each prompt, up to and including the first
    end-of-sequence id (``EOS_IDS``), or ``max_new_tokens`` ids.
    """
    from tqdm import tqdm

    model.eval()
    out: List[List[int]] = [None] * len(prompts)  # type: ignore[list-item]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in tqdm(chunks, desc="greedy", disable=not progress, leave=False):
        L = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), L), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for r, i in enumerate(chunk):
            p = prompts[i]
            ids[r, L - len(p) :] = torch.tensor(p)
            mask[r, L - len(p) :] = 1
        seqs = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=list(EOS_IDS), pad_token_id=PAD_ID, num_beams=1,
        )
        for r, i in enumerate(chunk):
            gen = seqs[r, L:].tolist()
            cut = [k for k, t in enumerate(gen) if t in EOS_IDS]
            out[i] = gen[: cut[0] + 1] if cut else gen
    return out


def shift_step_labels(labels: torch.Tensor, num_steps: int, fill: int = IGNORE_INDEX) -> List[torch.Tensor]:
    """Labels of each training-time-test chain step: step ``k`` at index ``p`` is scored on
    ``labels[p + 2 + k]`` (``fill`` past the end).

    Parameters
    ----------
    labels : torch.Tensor
        ``# [batch_size, seq_len]`` int64, ``fill`` where not scored.

    Returns
    -------
    list of torch.Tensor
        ``num_steps`` tensors ``# [batch_size, seq_len - 1]``.

    Examples
    --------
    >>> [t.tolist() for t in shift_step_labels(torch.tensor([[1, 2, 3, 4]]), 2, fill=-1)]
    [[[3, 4, -1]], [[4, -1, -1]]]
    """
    B, S = labels.shape
    out = []
    for k in range(num_steps):
        t = torch.full((B, S - 1), fill, dtype=torch.long)
        shift = 2 + k
        if S - shift > 0:
            t[:, : S - shift] = labels[:, shift:]
        out.append(t)
    return out


def lr_at(step: int, total: int, base: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``floor * base``.

    Examples
    --------
    >>> lr_at(0, 100, 1.0, 10), lr_at(100, 100, 1.0, 10)
    (0.1, 0.1)
    """
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def save_atomic(obj, path: str) -> None:
    """``torch.save`` to ``path`` via a temporary file, so an interrupted save leaves the old one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_if_exists(path: str) -> Optional[dict]:
    if os.path.exists(path):
        return torch.load(path, map_location="cpu", weights_only=False)
    return None

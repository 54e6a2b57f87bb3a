"""Recipe stage (a): the target's own greedy answers, generated through SGLang in batches.

The draft learns what the target actually writes, so its training sequences are
``chat_template(prompt) + the target's greedy answer`` (up to and including the first
end-of-sequence token, or ``max_new_tokens`` tokens).  On a machine without CUDA the CPU
testbed is activated (stand-ins + ``torch_sdpa`` backend, as in ``sglang_ext.engine.cpu``).

Written to ``<out>/sequences.json``: one record per prompt (``id``, ``split``, ``ids``,
``prompt_len``, ``finished``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

from sglang_ext.recipe.data import Prompt


@dataclass
class Sequence_:
    """A training / held-out sequence: ``ids[:prompt_len]`` is the templated prompt."""

    id: str
    split: str
    ids: List[int]
    prompt_len: int
    finished: bool  # ended with an end-of-sequence token (else cut at max_new_tokens)


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> List[List[int]]:
    """Chat-templated prompt ids (the tokenizer's own template, generation prompt added)."""
    out = []
    for p in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": p.text}],
                                             add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def eos_ids(target_dir: str) -> List[int]:
    """End-of-sequence ids of the target (config.json and generation_config.json)."""
    ids: List[int] = []
    for fname in ("config.json", "generation_config.json"):
        path = os.path.join(target_dir, fname)
        if os.path.exists(path):
            with open(path) as f:
                v = json.load(f).get("eos_token_id")
            for i in (v if isinstance(v, list) else [v]):
                if i is not None and i not in ids:
                    ids.append(int(i))
    return ids


def prepare_cpu_testbed() -> bool:
    """Activate the CPU testbed (no CUDA): env for SGLang's processes + in-process stand-ins."""
    import torch

    if torch.cuda.is_available():
        return False
    from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

    os.environ.update(cpu_testbed_env())
    install()
    return True


def sglang_greedy(target_dir: str, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                  batch_size: int = 64, progress: bool = True, engine_kwargs: Optional[Dict] = None,
                  log=print) -> List[List[int]]:
    """Greedy answers (stopping at the target's EOS) of each prompt, through ``sglang.Engine``.

    The caller's ``__main__`` must be import-safe (SGLang spawns processes).
    """
    from tqdm import tqdm

    cpu = prepare_cpu_testbed()
    import sglang

    import sglang_ext

    sglang_ext.load()
    kwargs: Dict = {}
    if cpu:
        from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS

        kwargs.update(CPU_ENGINE_KWARGS)
    longest = max(len(p) for p in prompt_ids) + max_new_tokens
    kwargs.update(max_running_requests=batch_size,
                  max_total_tokens=max(kwargs.get("max_total_tokens", 0), batch_size * longest + 64))
    kwargs.update(engine_kwargs or {})
    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=target_dir, **kwargs)
    log(f"[generate] engine up in {time.perf_counter() - t0:.1f} s")
    out: List[List[int]] = []
    try:
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        res: Dict[int, List[int]] = {}
        chunks = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        bar = tqdm(total=len(order), desc="generate", unit="seq", disable=not progress)
        for chunk in chunks:
            outs = engine.generate(input_ids=[list(prompt_ids[i]) for i in chunk],
                                   sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens})
            for i, o in zip(chunk, outs):
                res[i] = list(o["output_ids"])
            bar.update(len(chunk))
        bar.close()
        out = [res[i] for i in range(len(prompt_ids))]
    finally:
        engine.shutdown()
    return out


def build_sequences(prompts: Dict[str, List[Prompt]], prompt_ids: Dict[str, List[List[int]]],
                    answers: Dict[str, List[List[int]]], eos: Sequence[int],
                    max_new_tokens: int) -> List[Sequence_]:
    """Join prompts and answers; an answer is cut after its first EOS id.

    An answer shorter than ``max_new_tokens`` without an EOS id stopped at one that the
    engine left out of its output ids: ``eos[0]`` is appended.
    """
    seqs = []
    for split_name in ("train", "heldout"):
        for p, ids, ans in zip(prompts[split_name], prompt_ids[split_name], answers[split_name]):
            cut = next((k for k, t in enumerate(ans) if t in eos), None)
            if cut is not None:
                ans, finished = ans[: cut + 1], True
            elif len(ans) < max_new_tokens:
                ans, finished = list(ans) + [eos[0]], True
            else:
                finished = False
            seqs.append(Sequence_(p.id, split_name, list(ids) + list(ans), len(ids), finished))
    return seqs


def save_sequences(seqs: List[Sequence_], path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([asdict(s) for s in seqs], f)
    os.replace(tmp, path)


def load_sequences(path: str) -> List[Sequence_]:
    with open(path) as f:
        return [Sequence_(**r) for r in json.load(f)]

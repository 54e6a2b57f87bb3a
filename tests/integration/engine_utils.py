"""Helpers shared by the engine integration tests: CPU engine settings and the HF reference."""

from __future__ import annotations

import os
from typing import Dict, List, Sequence

import torch

from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS  # settings for the CPU testbed


def make_engine(model_path: str, **overrides):
    """An ``sglang.Engine`` on the CPU testbed (extension kwargs such as ``dcut=`` are accepted)."""
    import sglang

    import sglang_ext

    sglang_ext.load()
    kwargs = dict(CPU_ENGINE_KWARGS)
    kwargs.update(overrides)
    return sglang.Engine(model_path=model_path, **kwargs)


def hf_greedy(model_path: str, prompts_ids: Sequence[Sequence[int]], max_new_tokens: int) -> List[List[int]]:
    """Greedy continuation ids from HF transformers ``generate`` (fp32, one prompt at a time)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([list(ids)], dtype=torch.long)
            y = model.generate(x, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                               pad_token_id=0, attention_mask=torch.ones_like(x))
            outs.append(y[0, x.shape[1]:].tolist())
    return outs


def engine_generate(engine, prompts_ids: Sequence[Sequence[int]], max_new_tokens: int) -> List[dict]:
    """Greedy generation, EOS ignored; returns SGLang's output dicts (``output_ids``, ``meta_info``)."""
    return engine.generate(input_ids=[list(p) for p in prompts_ids],
                           sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                            "ignore_eos": True})


def engine_greedy(engine, prompts_ids: Sequence[Sequence[int]], max_new_tokens: int) -> List[List[int]]:
    return [o["output_ids"] for o in engine_generate(engine, prompts_ids, max_new_tokens)]


def mean_accept_length(outputs: Sequence[dict]) -> float:
    """Emitted tokens per verify step over a set of outputs (SGLang convention: bonus included)."""
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    steps = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)
    return tokens / steps if steps else 0.0

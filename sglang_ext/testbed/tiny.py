"""Tiny random test models, built at test time (no downloads).

* a Llama target (``LlamaForCausalLM``, HF format, fp32) with the project tokenizer
  (:mod:`sglang_ext.testbed.tokenizer`: Qwen3-style chat template, ``<think>``/``</think>``);
* an EAGLE3 draft in SGLang's stock ``LlamaForCausalLMEagle3`` checkpoint format (the
  testbed's :class:`~sglang_ext.testbed.modeling.Eagle3Draft` without SpecExit rows), random
  or briefly fitted to the target's own greedy continuations (:func:`fit_draft_to_target`) so
  that speculative runs actually accept drafts.

Everything is deterministic given the seed. Used by the integration tests (issue 2) and as
the quickest possible engine smoke models; the trained thinking models live in
``sglang_ext/testbed/models/``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

TINY_TARGET_LAYERS = 8  # EAGLE3 captures layers 2, L//2, L-3: distinct only for L >= 7
TINY_HIDDEN = 64
TINY_HEADS = 4
TINY_KV_HEADS = 2
TINY_INTERMEDIATE = 128
TINY_MAX_POSITIONS = 2048


@dataclass(frozen=True)
class TinyModels:
    """Paths of a built tiny model set."""

    target: str
    draft: str


def _llama_config_dict(vocab_size: int, eos_ids, pad_id: int, *, layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": TINY_HIDDEN,
        "intermediate_size": TINY_INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": TINY_HEADS,
        "num_key_value_heads": TINY_KV_HEADS,
        "head_dim": TINY_HIDDEN // TINY_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": TINY_MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": eos_ids,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def build_tiny_target(out_dir: str, seed: int = 0) -> str:
    """Write a random tiny Llama target with the project tokenizer to ``out_dir``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sglang_ext.testbed.tokenizer import IM_END, PAD_TOKEN, build_tokenizer

    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer()
    eos = [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(PAD_TOKEN)]
    cfg = LlamaConfig(**_llama_config_dict(len(tok), eos, tok.convert_tokens_to_ids(PAD_TOKEN),
                                           layers=TINY_TARGET_LAYERS))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger logits than the default init, so greedy choices are well separated
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


def _tiny_draft_config(target):
    from sglang_ext.testbed.modeling import DraftConfig

    tc = target.config
    rp = getattr(tc, "rope_parameters", None) or {}
    return DraftConfig(tc.hidden_size, tc.num_attention_heads, tc.intermediate_size, tc.vocab_size,
                       tc.num_hidden_layers, tc.max_position_embeddings, float(rp.get("rope_theta", 10000.0)),
                       tc.rms_norm_eps, num_signals=0)


def stock_eagle3_config(dcfg) -> dict:
    """Draft ``config.json`` for SGLang's stock ``LlamaForCausalLMEagle3`` (no SpecExit rows)."""
    cfg = dcfg.hf_config()
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    cfg.pop("specexit_method", None)
    cfg["specexit_num_signals"] = 0
    return cfg


def save_draft(out_dir: str, cfg: dict, state: dict) -> str:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def build_tiny_models(out_dir: str, seed: int = 0, fit_steps: int = 0) -> TinyModels:
    """Build (or reuse, when already complete) the tiny target + EAGLE3 draft under ``out_dir``.

    ``fit_steps`` > 0 fits the draft to the target's own greedy continuations for that many
    optimizer steps (:func:`fit_draft_to_target`); 0 leaves it random (initialised from the
    target's LM head).
    """
    from transformers import AutoModelForCausalLM

    from sglang_ext.testbed.modeling import Eagle3Draft

    target_dir = os.path.join(out_dir, "target")
    draft_dir = os.path.join(out_dir, "draft")
    done = os.path.join(out_dir, "DONE")
    if os.path.exists(done):
        return TinyModels(target=target_dir, draft=draft_dir)
    build_tiny_target(target_dir, seed=seed)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    dcfg = _tiny_draft_config(target)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        draft = Eagle3Draft(dcfg, target.get_input_embeddings().weight)
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.lm_head.weight)
    if fit_steps > 0:
        fit_draft_to_target(target, draft, steps=fit_steps, seed=seed)
    save_draft(draft_dir, stock_eagle3_config(dcfg), draft.sglang_state_dict())
    with open(done, "w") as f:
        f.write("ok\n")
    return TinyModels(target=target_dir, draft=draft_dir)


def corpus_prompts(vocab_size: int, num_prompts: int, prompt_len: int, seed: int) -> torch.Tensor:
    """The random prompts (non-special token ids) the tiny draft is fitted on.

    Returns ``# [num_prompts, prompt_len]`` token ids; the first ``n`` rows for a given seed are
    the same whatever ``num_prompts``.
    """
    from sglang_ext.testbed.tokenizer import build_tokenizer

    first_regular = len(build_tokenizer().all_special_ids) + 2  # skip special and think tokens
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(first_regular, vocab_size, (prompt_len,), generator=g) for _ in range(num_prompts)]
    return torch.stack(rows)


def greedy_corpus(target, num_prompts: int, prompt_len: int, gen_len: int, seed: int) -> torch.Tensor:
    """:func:`corpus_prompts` and the target's greedy continuations.

    Returns ``# [num_prompts, prompt_len + gen_len]`` token ids.
    """
    prompts = corpus_prompts(target.config.vocab_size, num_prompts, prompt_len, seed)
    with torch.no_grad():
        out = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=gen_len,
                              min_new_tokens=gen_len, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out


def fit_draft_to_target(target, draft, steps: int, seed: int = 0, num_prompts: int = 64, prompt_len: int = 4,
                        gen_len: int = 40, batch_size: int = 16, lr: float = 3e-3, ttt_steps: int = 3) -> list:
    """Briefly fit an EAGLE3 draft to the target's own greedy continuations (training-time test
    over ``ttt_steps`` chain steps), so that speculative test runs accept drafts. Returns the losses."""
    import torch.nn.functional as F

    from sglang_ext.testbed.modeling import IGNORE_INDEX, capture_features
    from sglang_ext.testbed.train_draft import ttt_labels

    seqs = greedy_corpus(target, num_prompts, prompt_len, gen_len, seed)
    labels = seqs.clone()
    labels[:, :prompt_len] = IGNORE_INDEX
    with torch.no_grad():
        _, feats = capture_features(target, seqs)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 7)
    losses = []
    draft.train()
    for _ in range(steps):
        idx = torch.randint(0, seqs.shape[0], (batch_size,), generator=g)
        logits = draft.ttt_forward(seqs[idx], feats[idx], ttt_steps)
        loss = sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tg.reshape(-1), ignore_index=IGNORE_INDEX)
                   for lg, tg in zip(logits, ttt_labels(seqs[idx], labels[idx], ttt_steps))) / ttt_steps
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    draft.eval()
    return losses

"""Tiny random test models, built at test time (no downloads).

* a Llama target (``LlamaForCausalLM``, HF format, fp32) with the project tokenizer
  (:mod:`sglang_ext.testbed.tokenizer`: Qwen3-style chat template, ``<think>``/``</think>``);
* an EAGLE3 draft in SGLang's ``LlamaForCausalLMEagle3`` checkpoint format, random or
  briefly fitted to the target's own greedy continuations (:func:`fit_draft_to_target`) so
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


def eagle3_draft_config(target_dir: str) -> dict:
    """Config of a one-layer EAGLE3 draft for ``target_dir`` (SGLang ``LlamaForCausalLMEagle3``)."""
    with open(os.path.join(target_dir, "config.json")) as f:
        t = json.load(f)
    cfg = {k: t[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
                             "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id")}
    cfg["rope_parameters"] = t.get("rope_parameters") or {"rope_theta": t.get("rope_theta", 10000.0),
                                                          "rope_type": "default"}
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "draft_vocab_size": t["vocab_size"],
        "target_hidden_size": t["hidden_size"],
        "torch_dtype": "float32",
    })
    return cfg


def random_eagle3_draft_state(cfg: dict, target_state: dict, seed: int = 0) -> dict:
    """Random EAGLE3 draft weights (checkpoint names as SGLang loads them); embeddings copied
    from the target."""
    g = torch.Generator().manual_seed(seed)
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    Ht = cfg["target_hidden_size"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    return {
        "fc.weight": w(H, 3 * Ht),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": w(nh * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(nkv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(nkv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, nh * hd),
        "midlayer.mlp.gate_proj.weight": w(I, H),
        "midlayer.mlp.up_proj.weight": w(I, H),
        "midlayer.mlp.down_proj.weight": w(H, I),
        "norm.weight": torch.ones(H),
        "lm_head.weight": w(cfg["draft_vocab_size"], H),
        "embed_tokens.weight": target_state["model.embed_tokens.weight"].clone(),
        "d2t": torch.zeros(cfg["draft_vocab_size"], dtype=torch.long),
    }


def save_draft(out_dir: str, cfg: dict, state: dict) -> str:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def build_tiny_models(out_dir: str, seed: int = 0, fit_draft: Optional[dict] = None) -> TinyModels:
    """Build (or reuse, when already complete) the tiny target + EAGLE3 draft under ``out_dir``.

    ``fit_draft``: keyword arguments for :func:`fit_draft_to_target`, or None for a random draft.
    """
    from safetensors.torch import load_file

    target_dir = os.path.join(out_dir, "target")
    draft_dir = os.path.join(out_dir, "draft")
    done = os.path.join(out_dir, "DONE")
    if os.path.exists(done):
        return TinyModels(target=target_dir, draft=draft_dir)
    build_tiny_target(target_dir, seed=seed)
    cfg = eagle3_draft_config(target_dir)
    target_state = load_file(os.path.join(target_dir, "model.safetensors"))
    state = random_eagle3_draft_state(cfg, target_state, seed=seed + 1)
    if fit_draft is not None:
        state = fit_draft_to_target(target_dir, cfg, state, **fit_draft)
    save_draft(draft_dir, cfg, state)
    with open(done, "w") as f:
        f.write("ok\n")
    return TinyModels(target=target_dir, draft=draft_dir)


def fit_draft_to_target(target_dir: str, cfg: dict, state: dict, **kwargs) -> dict:
    """Briefly fit the EAGLE3 draft to the target's own greedy continuations (see
    :mod:`sglang_ext.testbed.train_draft`)."""
    from sglang_ext.testbed.train_draft import fit_eagle3_draft_quick

    return fit_eagle3_draft_quick(target_dir, cfg, state, **kwargs)

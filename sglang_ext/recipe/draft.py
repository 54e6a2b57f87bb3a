"""Recipe stages (c) and (e): the one-layer EAGLE3 draft for a Llama-family target, its reduced
draft vocabulary and its checkpoint in the standard EAGLE3 format.

What SGLang 0.5.23 runs (``sglang/srt/models/llama_eagle3.py``, ``LlamaForCausalLMEagle3``):

* ``fc_norm`` (config ``fc_norm: true``): one RMSNorm per tapped layer, applied to its
  ``H``-wide chunk of the target features before ``fc`` -- real targets carry activation
  outliers (SmolLM2: |x| up to ~2.5e4 in a few channels), which a plain ``fc`` turns into a
  residual stream the draft cannot use;
* ``fc``: ``[H, 3H]``, applied to the (normalized) target features
  (:mod:`sglang_ext.recipe.features`);
* ``midlayer`` (one decoder layer, checkpoint prefix ``midlayer.``): ``residual = h``;
  ``x = cat(input_layernorm(embed(token)), hidden_norm(h))``; q/k/v projections from
  ``2H`` (grouped-query heads as the target's); ``residual += o_proj(attn)``;
  ``g = mlp(post_attention_layernorm(residual)) + residual``; ``logits = lm_head(norm(g))``;
  a chain step ``k >= 1`` feeds ``g`` (pre-norm) back as ``h`` without ``fc``;
* embeddings: the target's (``set_embed``), not saved;
* ``lm_head``: ``[draft_vocab_size, H]`` over the reduced draft vocabulary; ``d2t``
  (``int64 [draft_vocab_size]``) holds ``target_id - draft_id`` (SGLang:
  ``hot_token_id = d2t + arange``); ``t2d`` (``bool [vocab_size]``) marks the target ids in
  the draft vocabulary (SGLang skips it; kept for the trainers' format).

No SGLang import.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ext.recipe.features import check_layer_ids, draft_layer_ids
from sglang_ext.testbed.modeling import (
    RMSNorm,
    eagle3_checkpoint_weights,
    eagle3_layer_output,
    eagle3_parameter_name,
    eagle3_qkv,
    ttt_chain_attention,
)

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
#: ``t2d``-mapped label of a token outside the draft vocabulary (ignored by the loss).
NOT_IN_DRAFT_VOCAB = -100


@dataclass(frozen=True)
class DraftSpec:
    """Shape of the draft (mostly copied from the target's config)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_num_layers: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    eos_token_id: Optional[object] = None
    bos_token_id: Optional[int] = None
    fc_norm: bool = True
    #: ``eagle_aux_hidden_state_layer_ids`` (None: SGLang's default, :func:`draft_layer_ids`)
    aux_layer_ids: Optional[Tuple[int, ...]] = None

    @property
    def layer_ids(self) -> List[int]:
        """The tapped layers as the config writes them (SGLang captures the output of each)."""
        return list(self.aux_layer_ids) if self.aux_layer_ids else draft_layer_ids(self.target_num_layers)

    @classmethod
    def from_target_config(cls, tc, draft_vocab_size: int, fc_norm: bool = True,
                           aux_layer_ids: Optional[Sequence[int]] = None) -> "DraftSpec":
        """From a transformers Llama config; refuses RoPE scaling it does not model."""
        rp = getattr(tc, "rope_parameters", None) or {}
        rope_type = rp.get("rope_type", "default") if isinstance(rp, dict) else "default"
        scaling = getattr(tc, "rope_scaling", None)
        if rope_type != "default" or (scaling and scaling.get("rope_type", "default") != "default"):
            raise ValueError(f"target rope_type {rope_type!r}: the recipe's draft models only "
                             "default RoPE")
        theta = float(rp.get("rope_theta", getattr(tc, "rope_theta", 10000.0)))
        nh = tc.num_attention_heads
        return cls(
            hidden_size=tc.hidden_size, num_heads=nh,
            num_kv_heads=getattr(tc, "num_key_value_heads", None) or nh,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // nh,
            intermediate_size=tc.intermediate_size, vocab_size=tc.vocab_size,
            draft_vocab_size=min(draft_vocab_size, tc.vocab_size),
            target_num_layers=tc.num_hidden_layers,
            max_position_embeddings=tc.max_position_embeddings, rope_theta=theta,
            rms_norm_eps=tc.rms_norm_eps, eos_token_id=getattr(tc, "eos_token_id", None),
            bos_token_id=getattr(tc, "bos_token_id", None), fc_norm=fc_norm,
            aux_layer_ids=tuple(check_layer_ids(aux_layer_ids, tc.num_hidden_layers)) if aux_layer_ids else None)

    def hf_config(self) -> Dict:
        """``config.json`` in the standard EAGLE3 (Llama) draft layout."""
        return {
            "architectures": [DRAFT_ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "dtype": "float32",
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": self.layer_ids,
                "use_aux_hidden_state": True,
            },
            "target_num_hidden_layers": self.target_num_layers,
            "fc_norm": self.fc_norm,
        }


def select_draft_vocab(sequences: Sequence[Sequence[int]], vocab_size: int, size: int,
                       always: Sequence[int] = ()) -> torch.Tensor:
    """Target ids of the draft vocabulary, ascending: ``always`` (e.g. EOS), then the most
    frequent ids of ``sequences``, then the lowest remaining ids (BPE order) to fill ``size``.

    Returns ``# [size]`` int64.

    Examples
    --------
    >>> select_draft_vocab([[5, 5, 7], [7, 7, 9]], vocab_size=10, size=4, always=[2]).tolist()
    [2, 5, 7, 9]
    """
    size = min(size, vocab_size)
    chosen: List[int] = []
    seen = set()
    for t in list(always) + [t for t, _ in Counter(t for s in sequences for t in s).most_common()]:
        if t not in seen and 0 <= t < vocab_size:
            chosen.append(t)
            seen.add(t)
        if len(chosen) == size:
            break
    t = 0
    while len(chosen) < size:
        if t not in seen:
            chosen.append(t)
            seen.add(t)
        t += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


def vocab_maps(draft_ids: torch.Tensor, vocab_size: int):
    """``(d2t, t2d, target_to_draft)`` for draft ids ``# [draft_vocab_size]`` (ascending).

    ``d2t`` ``# [draft_vocab_size]`` int64 ``target - draft``; ``t2d`` ``# [vocab_size]``
    bool; ``target_to_draft`` ``# [vocab_size]`` int64 draft id or ``NOT_IN_DRAFT_VOCAB``.
    """
    n = draft_ids.shape[0]
    d2t = draft_ids - torch.arange(n)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    target_to_draft = torch.full((vocab_size,), NOT_IN_DRAFT_VOCAB, dtype=torch.long)
    target_to_draft[draft_ids] = torch.arange(n)
    return d2t, t2d, target_to_draft


class Eagle3DraftModel(nn.Module):
    """The draft of :class:`DraftSpec` (``embed_weight`` ``# [vocab_size, H]`` frozen, not saved)."""

    def __init__(self, spec: DraftSpec, embed_weight: torch.Tensor, draft_ids: torch.Tensor):
        super().__init__()
        H, nh, nkv, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.spec = spec
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.clone(), persistent=False)  # [draft_vocab]
        self.fc_norm = nn.ModuleList([RMSNorm(H, spec.rms_norm_eps) for _ in range(3)]) if spec.fc_norm else None
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, spec.rms_norm_eps)
        self.input_layernorm = RMSNorm(H, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, spec.rms_norm_eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.gate_proj = nn.Linear(H, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, H, bias=False)
        self.norm = RMSNorm(H, spec.rms_norm_eps)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)

    #: ``norm`` starts at this fraction of the target's final norm: a softer start (SmolLM2:
    #: initial loss ~8.7 instead of ~16 with the full-scale, very peaked target head).
    NORM_INIT_SCALE = 0.25

    @torch.no_grad()
    def init_from_target(self, target) -> None:
        """``lm_head`` rows = the target's LM-head rows of the draft vocabulary; ``norm`` = the
        target's final norm, scaled by ``NORM_INIT_SCALE`` (the draft's output should look like
        the target's last hidden state)."""
        head = target.get_output_embeddings().weight  # [vocab_size, H]
        self.lm_head.weight.copy_(head[self.draft_ids])
        self.norm.weight.copy_(target.model.norm.weight * self.NORM_INIT_SCALE)

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """``# [..., 3H]`` target features -> ``# [..., H]`` (``fc_norm`` per chunk, then ``fc``)."""
        x = features.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            x = torch.cat([nrm(c) for nrm, c in zip(self.fc_norm, x.chunk(3, dim=-1))], dim=-1)
        return self.fc(x)

    def _qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """tokens ``# [B, S]``, hidden ``# [B, S, H]``, positions ``# [B, S]`` -> q, k, v
        ``# [B, heads, S, head_dim]`` (k, v expanded to the query heads)."""
        sp = self.spec
        return eagle3_qkv(self, tokens, hidden, positions, sp.num_heads, sp.num_kv_heads, sp.head_dim,
                          sp.rope_theta)

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn ``# [B, heads, S, head_dim]``, residual ``# [B, S, H]`` -> g ``# [B, S, H]``."""
        return eagle3_layer_output(self, attn, residual)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``# [..., H]`` -> draft-vocabulary logits ``# [..., draft_vocab_size]``."""
        return self.lm_head(self.norm(g))

    def ttt_hidden(self, input_ids: torch.Tensor, features: torch.Tensor, num_steps: int) -> List[torch.Tensor]:
        """Training-time-test forward: the draft's ``g`` of each chain step.

        Index ``p`` of step 0 holds (``input_ids[p + 1]``, ``fc(features[p])``) at position
        ``p`` (causal); step ``k >= 1`` holds (``input_ids[p + 1 + k]``, ``g`` of step
        ``k - 1`` at ``p``) at position ``p + k`` and attends to step-0 entries ``0..p`` and
        its own chain entries of steps ``1..k`` -- SGLang's ``k``-th chain draft step
        (teacher-forced tokens matter only while every earlier draft was right).

        Parameters
        ----------
        input_ids : torch.Tensor
            ``# [batch_size, seq_len]``
        features : torch.Tensor
            ``# [batch_size, seq_len, 3 * hidden_size]``

        Returns
        -------
        list of torch.Tensor
            ``num_steps`` tensors ``# [batch_size, seq_len - 1, hidden_size]``; step ``k`` at
            index ``p`` predicts ``input_ids[p + 2 + k]``.
        """
        B, S = input_ids.shape
        n = S - 1
        toks_all = torch.cat([input_ids, input_ids.new_zeros(B, num_steps)], dim=1)
        pos0 = torch.arange(n, device=input_ids.device).unsqueeze(0).expand(B, n)
        hidden = self.project_features(features[:, :n])
        q0, k0, v0 = self._qkv(toks_all[:, 1 : n + 1], hidden, pos0)
        g = self._finish(F.scaled_dot_product_attention(q0, k0, v0, is_causal=True), hidden)
        out = [g]
        scale = 1.0 / math.sqrt(self.spec.head_dim)
        causal = torch.ones(n, n, dtype=torch.bool, device=input_ids.device).tril()
        chain_k: List[torch.Tensor] = []
        chain_v: List[torch.Tensor] = []
        for step in range(1, num_steps):
            qk, kk, vk = self._qkv(toks_all[:, 1 + step : n + 1 + step], g, pos0 + step)
            chain_k.append(kk)
            chain_v.append(vk)
            g = self._finish(ttt_chain_attention(qk, k0, v0, chain_k, chain_v, causal, scale), g)
            out.append(g)
        return out

    # -- checkpoint (stage e)
    def state_dict_eagle3(self, dtype: torch.dtype = torch.float32) -> Dict[str, torch.Tensor]:
        """Weights under the standard EAGLE3 checkpoint names (``midlayer.*``, ``fc``, ``d2t``, ``t2d``)."""
        sd = eagle3_checkpoint_weights(self)
        if self.fc_norm is not None:
            sd.update({f"fc_norm.{i}.weight": nrm.weight for i, nrm in enumerate(self.fc_norm)})
        sd = {k: v.detach().to(dtype).contiguous().clone() for k, v in sd.items()}
        d2t, t2d, _ = vocab_maps(self.draft_ids.cpu(), self.spec.vocab_size)
        sd["d2t"] = d2t
        sd["t2d"] = t2d
        return sd

    def save(self, out_dir: str, dtype: torch.dtype = torch.float32, extra: Optional[Dict] = None) -> None:
        """``config.json`` + ``model.safetensors`` (SGLang casts the weights to its dtype)."""
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        save_file(self.state_dict_eagle3(dtype), os.path.join(out_dir, "model.safetensors"))
        cfg = self.spec.hf_config()
        cfg["dtype"] = {torch.float32: "float32", torch.float16: "float16",
                        torch.bfloat16: "bfloat16"}[dtype]
        cfg.update(extra or {})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")


def load_draft(draft_dir: str, embed_weight: torch.Tensor) -> Eagle3DraftModel:
    """Load a draft written by :meth:`Eagle3DraftModel.save` (weights as fp32)."""
    from safetensors.torch import load_file

    with open(os.path.join(draft_dir, "config.json")) as f:
        hf = json.load(f)
    spec = DraftSpec(
        hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
        intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        draft_vocab_size=hf["draft_vocab_size"], target_num_layers=hf["target_num_hidden_layers"],
        max_position_embeddings=hf["max_position_embeddings"], rope_theta=hf["rope_theta"],
        rms_norm_eps=hf["rms_norm_eps"], eos_token_id=hf.get("eos_token_id"),
        bos_token_id=hf.get("bos_token_id"), fc_norm=bool(hf.get("fc_norm", False)),
        aux_layer_ids=tuple((hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ()) or None)
    sd = load_file(os.path.join(draft_dir, "model.safetensors"))
    draft_ids = sd["d2t"] + torch.arange(sd["d2t"].shape[0])
    draft = Eagle3DraftModel(spec, embed_weight, draft_ids)
    params = dict(draft.named_parameters())
    with torch.no_grad():
        for name, w in sd.items():
            if name in ("d2t", "t2d"):
                continue
            params[eagle3_parameter_name(name)].copy_(w.float())
    return draft


def spec_dict(spec: DraftSpec) -> Dict:
    return asdict(spec)

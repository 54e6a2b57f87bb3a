"""Plain-torch models of the testbed: the target's config and feature capture, the EAGLE3 draft.

No SGLang import.  The target is a ``transformers.LlamaForCausalLM``; the draft is
:class:`Eagle3Draft`, a plain-torch module that computes exactly what SGLang's
``LlamaForCausalLMEagle3`` (``sglang/srt/models/llama_eagle3.py``) computes at
inference, so that what is trained here is what SGLang drafts with.

EAGLE3 as SGLang runs it (facts read from SGLang 0.5.23):

* The target captures the hidden states *entering* decoder layers
  ``2, L // 2, L - 3`` (``LlamaForCausalLM.set_eagle3_layers_to_capture``), i.e.
  ``output_hidden_states[i]`` of HF for those ``i``, concatenated in that order:
  ``features[p]`` of width ``3 * H``.
* The draft's KV cache holds one entry per position ``p``: the pair
  (token ``x[p + 1]``, hidden ``fc(features[p])``) at RoPE position ``p``; its
  output at ``p`` predicts ``x[p + 2]``.  Each draft decode step ``k >= 1`` of a
  chain adds the pair (its own previous token, its own previous hidden ``g``)
  at position ``p + k``; ``g`` is the *pre-norm* residual sum of the draft layer
  (``norm_output`` false); ``fc`` is skipped because ``g`` is already ``H`` wide.
* Draft layer (``midlayer``): ``residual = h``; ``a = attn(cat[input_layernorm(e),
  hidden_norm(h)])`` with q/k/v projections from ``2H``; ``residual += a``;
  ``m = mlp(post_attention_layernorm(residual))``; ``g = m + residual``;
  ``logits = lm_head(norm(g))``.
* Embeddings are the target's (``set_embed``); ``lm_head`` is the draft's own
  (``draft_vocab_size`` set in the config).  ``d2t`` (draft id -> target id
  offsets) is stored as zeros: the draft vocabulary is the full vocabulary.

SpecExit rows: ``fc`` has ``H + k`` output rows; rows ``H..H+k-1`` are the signal
rows (order confidence, progress, remain), applied to target features only.

Shape glossary: ``batch_size`` sequences, ``seq_len`` positions, ``hidden_size``
(H) of target and draft (equal, as SGLang requires for the shared embedding).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ext.testbed import tokenizer as tok_mod

SPECEXIT_METHOD = "confidence_progress_remain"
SPECEXIT_SIGNALS = ("confidence", "progress", "remain")
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"  # SGLang's EAGLE3 name; the SpecExit class is chosen from the fc shape
#: Token id meaning "no label" in label tensors (ignored by the losses).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelShape:
    """Sizes of the target (the draft reuses ``hidden_size``/heads)."""

    hidden_size: int = 192
    num_layers: int = 8
    num_heads: int = 3
    intermediate_size: int = 512
    draft_intermediate_size: int = 512
    vocab_size: int = tok_mod.MODEL_VOCAB_SIZE
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


QUICK_SHAPE = ModelShape(hidden_size=64, num_layers=8, num_heads=2, intermediate_size=128,
                         draft_intermediate_size=128)


def aux_layer_ids(num_layers: int) -> List[int]:
    """Decoder layers whose *input* hidden states SGLang's EAGLE3 captures.

    Examples
    --------
    SGLang captures each listed layer once, so the three must be distinct: ``L >= 7``.

    >>> aux_layer_ids(8)
    [2, 4, 5]
    """
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) != 3:
        raise ValueError(f"EAGLE3 needs >= 7 target layers (capture layers {ids} collide)")
    return ids


def target_config(shape: ModelShape):
    """HF ``LlamaConfig`` of the target (loadable by SGLang's ``LlamaForCausalLM``)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=[2, 0],  # <|im_end|>, <|endoftext|>
        pad_token_id=0,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = "float32"
    return cfg


def build_target(shape: ModelShape, seed: int):
    """A freshly initialised target ``LlamaForCausalLM`` (init seeded by ``seed``)."""
    from transformers import LlamaForCausalLM

    cfg = target_config(shape)
    cfg._attn_implementation = "sdpa"
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model


def capture_features(target, input_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced target forward returning logits and EAGLE3 features.

    Parameters
    ----------
    target : transformers.LlamaForCausalLM
    input_ids : torch.Tensor
        ``# [batch_size, seq_len]`` right-padded token ids.

    Returns
    -------
    logits : torch.Tensor
        ``# [batch_size, seq_len, vocab_size]``
    features : torch.Tensor
        ``# [batch_size, seq_len, 3 * hidden_size]`` hidden states entering layers
        ``aux_layer_ids(L)``, concatenated in that order.
    """
    out = target(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    ids = aux_layer_ids(target.config.num_hidden_layers)
    feats = torch.cat([out.hidden_states[i] for i in ids], dim=-1)
    return out.logits, feats


# ----------------------------------------------------------------------------- draft


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., size]
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """Neox-style (HF ``rotate_half``) RoPE tables for ``positions`` ``# [...]``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = positions.float().unsqueeze(-1) * inv  # [..., head_dim // 2]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``# [batch_size, heads, seq_len, head_dim]``, cos/sin ``# [batch_size, seq_len, head_dim]``."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def eagle3_qkv(draft: nn.Module, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
               num_heads: int, num_kv_heads: int, head_dim: int, rope_theta: float):
    """Query, key and value of a one-layer EAGLE3 draft (the testbed's or the recipe's: same
    attribute names): ``cat(input_layernorm(embed(tokens)), hidden_norm(hidden))``, projected,
    RoPE on q and k, k and v expanded to the query heads.

    tokens ``# [B, S]``, hidden ``# [B, S, H]``, positions ``# [B, S]`` -> q, k, v
    ``# [B, num_heads, S, head_dim]``.
    """
    B, S = tokens.shape
    e = draft.input_layernorm(F.embedding(tokens, draft.embed_weight))
    x = torch.cat([e, draft.hidden_norm(hidden)], dim=-1)
    q = draft.q_proj(x).view(B, S, num_heads, head_dim).transpose(1, 2)
    k = draft.k_proj(x).view(B, S, num_kv_heads, head_dim).transpose(1, 2)
    v = draft.v_proj(x).view(B, S, num_kv_heads, head_dim).transpose(1, 2)
    cos, sin = rope_cos_sin(positions, head_dim, rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = num_heads // num_kv_heads
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return q, k, v


def eagle3_layer_output(draft: nn.Module, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The rest of the EAGLE3 draft layer after attention: ``residual += o_proj(attn)``, then
    ``mlp(post_attention_layernorm(residual)) + residual``.

    attn ``# [B, heads, S, head_dim]``, residual ``# [B, S, H]`` -> g ``# [B, S, H]`` (pre-norm).
    """
    B, _, S, _ = attn.shape
    residual = residual + draft.o_proj(attn.transpose(1, 2).reshape(B, S, -1))
    h = draft.post_attention_layernorm(residual)
    return draft.down_proj(F.silu(draft.gate_proj(h)) * draft.up_proj(h)) + residual


def ttt_chain_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                        chain_k: List[torch.Tensor], chain_v: List[torch.Tensor],
                        causal: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of a training-time-test chain step ``k >= 1`` (shared by the testbed's and
    the recipe's EAGLE3 drafts): index ``p`` attends to the step-0 entries ``0..p`` and to its
    own chain entries of steps ``1..k`` (at ``p``).

    Parameters
    ----------
    q : torch.Tensor
        ``# [batch_size, heads, n, head_dim]`` queries of this step.
    k0, v0 : torch.Tensor
        ``# [batch_size, heads, n, head_dim]`` keys / values of step 0.
    chain_k, chain_v : list of torch.Tensor
        ``k`` tensors ``# [batch_size, heads, n, head_dim]``: steps ``1..k`` (this one last).
    causal : torch.Tensor
        ``# [n, n]`` bool, lower-triangular.
    scale : float
        ``1 / sqrt(head_dim)``.

    Returns
    -------
    torch.Tensor
        ``# [batch_size, heads, n, head_dim]``
    """
    n = k0.shape[-2]
    s0 = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [B, h, n, n]
    s0 = s0.masked_fill(~causal, torch.finfo(q.dtype).min)
    sd = torch.stack([(q * kj).sum(-1) for kj in chain_k], dim=-1) * scale  # [B, h, n, step]
    p = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
    out = torch.matmul(p[..., :n], v0)
    for j, vj in enumerate(chain_v):
        out = out + p[..., n + j].unsqueeze(-1) * vj
    return out


#: Prefix of the decoder layer's weights in SGLang's EAGLE3 checkpoints.
EAGLE3_LAYER_PREFIX = "midlayer."


def eagle3_checkpoint_weights(draft: nn.Module) -> Dict[str, torch.Tensor]:
    """The parameters of a one-layer EAGLE3 draft (the testbed's :class:`Eagle3Draft` or the
    recipe's ``Eagle3DraftModel``: same attribute names) under SGLang's EAGLE3 checkpoint names
    (``midlayer.*``, ``fc``, ``norm``, ``lm_head``); not detached, no ``d2t`` / ``t2d``."""
    m = EAGLE3_LAYER_PREFIX
    return {
        "fc.weight": draft.fc.weight,
        m + "hidden_norm.weight": draft.hidden_norm.weight,
        m + "input_layernorm.weight": draft.input_layernorm.weight,
        m + "post_attention_layernorm.weight": draft.post_attention_layernorm.weight,
        m + "self_attn.q_proj.weight": draft.q_proj.weight,
        m + "self_attn.k_proj.weight": draft.k_proj.weight,
        m + "self_attn.v_proj.weight": draft.v_proj.weight,
        m + "self_attn.o_proj.weight": draft.o_proj.weight,
        m + "mlp.gate_proj.weight": draft.gate_proj.weight,
        m + "mlp.up_proj.weight": draft.up_proj.weight,
        m + "mlp.down_proj.weight": draft.down_proj.weight,
        "norm.weight": draft.norm.weight,
        "lm_head.weight": draft.lm_head.weight,
    }


def eagle3_parameter_name(checkpoint_name: str) -> str:
    """Inverse of :func:`eagle3_checkpoint_weights`' naming: ``midlayer.self_attn.q_proj.weight``
    -> ``q_proj.weight``."""
    return (checkpoint_name.replace(EAGLE3_LAYER_PREFIX, "").replace("self_attn.", "")
            .replace("mlp.", ""))


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    target_num_layers: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    num_signals: int = len(SPECEXIT_SIGNALS)

    @classmethod
    def from_shape(cls, shape: ModelShape) -> "DraftConfig":
        return cls(shape.hidden_size, shape.num_heads, shape.draft_intermediate_size,
                   shape.vocab_size, shape.num_layers, shape.max_position_embeddings,
                   shape.rope_theta, shape.rms_norm_eps)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def hf_config(self) -> Dict:
        """``config.json`` of the draft in SGLang's EAGLE3 (Llama) layout."""
        return {
            "architectures": [DRAFT_ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": None,
            "eos_token_id": [2, 0],
            "pad_token_id": 0,
            "dtype": "float32",
            # SGLang adds 1 to these ids: capture the inputs of layers 2, L//2, L-3.
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux_layer_ids(self.target_num_layers)],
                "use_aux_hidden_state": True,
            },
            "specexit_method": SPECEXIT_METHOD,
            "specexit_num_signals": self.num_signals,
            "target_num_hidden_layers": self.target_num_layers,
        }


class Eagle3Draft(nn.Module):
    """EAGLE3 draft (one ``midlayer``) with SpecExit rows in ``fc``.

    Parameters
    ----------
    cfg : DraftConfig
    embed_weight : torch.Tensor
        ``# [vocab_size, hidden_size]`` the target's input embedding (frozen, not saved).
    """

    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor):
        super().__init__()
        H, nh, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        self.cfg = cfg
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.fc = nn.Linear(3 * H, H + cfg.num_signals, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.vocab_size, bias=False)

    # -- pieces
    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Token rows of ``fc``: ``# [..., 3H]`` -> ``# [..., H]``."""
        return F.linear(features, self.fc.weight[: self.cfg.hidden_size])

    def signal_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Raw SpecExit signals ``z``: ``# [..., 3H]`` -> ``# [..., num_signals]``."""
        return F.linear(features, self.fc.weight[self.cfg.hidden_size:])

    def _qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """tokens ``# [B, S]``, hidden ``# [B, S, H]``, positions ``# [B, S]``."""
        c = self.cfg
        return eagle3_qkv(self, tokens, hidden, positions, c.num_heads, c.num_heads, c.head_dim, c.rope_theta)

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor):
        """attn ``# [B, heads, S, head_dim]``, residual ``# [B, S, H]`` -> (logits, g)."""
        g = eagle3_layer_output(self, attn, residual)
        return self.lm_head(self.norm(g)), g

    def ttt_forward(self, input_ids: torch.Tensor, features: torch.Tensor, num_steps: int):
        """Training-time-test forward over whole sequences.

        Step 0 is the draft-extend computation: index ``p`` holds the pair
        (``input_ids[p + 1]``, ``fc(features[p])``) at position ``p`` and attends
        causally.  Step ``k >= 1`` holds (``input_ids[p + 1 + k]``, ``g`` of step
        ``k - 1`` at ``p``) at position ``p + k`` and attends to step-0 entries
        ``0..p`` and to its own chain entries of steps ``1..k`` at ``p``: exactly
        a ``k``-th chain draft step in SGLang (ground-truth tokens stand in for
        drafted ones, which only matter while all earlier drafts were right).

        Parameters
        ----------
        input_ids : torch.Tensor
            ``# [batch_size, seq_len]``
        features : torch.Tensor
            ``# [batch_size, seq_len, 3 * hidden_size]``
        num_steps : int

        Returns
        -------
        list of torch.Tensor
            ``num_steps`` logits ``# [batch_size, seq_len - 1, vocab_size]``; step
            ``k`` at index ``p`` predicts ``input_ids[p + 2 + k]``.

        Examples
        --------
        Token diagram for ``x = [x0 x1 x2 x3 x4]`` (index p = 0..3)::

            step 0: (x1,f0)@0 (x2,f1)@1 (x3,f2)@2 (x4,f3)@3   -> predicts x2 x3 x4 -
            step 1: (x2,g0)@1 (x3,g1)@2 (x4,g2)@3 (-- ,g3)@4  -> predicts x3 x4 -  -
        """
        B, S = input_ids.shape
        n = S - 1
        pad = input_ids.new_zeros(B, num_steps)
        toks_all = torch.cat([input_ids, pad], dim=1)
        pos0 = torch.arange(n, device=input_ids.device).unsqueeze(0).expand(B, n)
        hidden = self.project_features(features[:, :n])
        q0, k0, v0 = self._qkv(toks_all[:, 1 : n + 1], hidden, pos0)
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        causal = torch.ones(n, n, dtype=torch.bool, device=input_ids.device).tril()
        out = F.scaled_dot_product_attention(q0, k0, v0, is_causal=True)
        logits, g = self._finish(out, hidden)
        all_logits = [logits]
        chain_k: List[torch.Tensor] = []
        chain_v: List[torch.Tensor] = []
        for step in range(1, num_steps):
            toks = toks_all[:, 1 + step : n + 1 + step]
            qk, kk, vk = self._qkv(toks, g, pos0 + step)
            chain_k.append(kk)
            chain_v.append(vk)
            out = ttt_chain_attention(qk, k0, v0, chain_k, chain_v, causal, scale)
            logits, g = self._finish(out, g)
            all_logits.append(logits)
        return all_logits

    # -- checkpoint
    def sglang_state_dict(self) -> Dict[str, torch.Tensor]:
        """Weights under SGLang's EAGLE3 checkpoint names (``midlayer.*``, ``fc``, ``d2t``...)."""
        sd = eagle3_checkpoint_weights(self)
        sd = {k: v.detach().float().contiguous().clone() for k, v in sd.items()}
        sd["d2t"] = torch.zeros(self.cfg.vocab_size, dtype=torch.int64)
        sd["t2d"] = torch.ones(self.cfg.vocab_size, dtype=torch.bool)
        return sd

    def load_sglang_state_dict(self, sd: Dict[str, torch.Tensor]) -> None:
        own = self.sglang_state_dict()
        mods = dict(self.named_parameters())
        for name in own:
            if name in ("d2t", "t2d"):
                continue
            with torch.no_grad():
                mods[eagle3_parameter_name(name)].copy_(sd[name])

    def save(self, out_dir: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        save_file(self.sglang_state_dict(), os.path.join(out_dir, "model.safetensors"))
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.cfg.hf_config(), f, indent=2, sort_keys=True)
            f.write("\n")


def load_draft(draft_dir: str, embed_weight: torch.Tensor) -> Eagle3Draft:
    """Load a draft saved by :meth:`Eagle3Draft.save`."""
    from safetensors.torch import load_file

    with open(os.path.join(draft_dir, "config.json")) as f:
        hf = json.load(f)
    cfg = DraftConfig(
        hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        target_num_layers=hf["target_num_hidden_layers"],
        max_position_embeddings=hf["max_position_embeddings"], rope_theta=hf["rope_theta"],
        rms_norm_eps=hf["rms_norm_eps"], num_signals=hf["specexit_num_signals"],
    )
    draft = Eagle3Draft(cfg, embed_weight)
    draft.load_sglang_state_dict(load_file(os.path.join(draft_dir, "model.safetensors")))
    return draft


def shape_to_json(shape: ModelShape) -> Dict:
    return asdict(shape)

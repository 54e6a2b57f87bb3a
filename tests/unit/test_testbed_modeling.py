"""Unit tests of the testbed's plain-torch EAGLE3 draft and helpers (``sglang_ext.testbed.modeling``).

The draft's training-time-test forward must equal SGLang's inference computation:
a draft extend over target features followed by chain decode steps against a KV
cache.  The reference below re-implements that incremental computation
independently (its own RMSNorm, RoPE as rotations of (i, i + d/2) pairs,
explicit softmax attention over a growing cache).

Budget: < 10 s.
"""

import json
import math

import pytest
import torch

from sglang_ext.testbed.check import chain_accept_lengths
from sglang_ext.testbed.modeling import (
    DRAFT_ARCHITECTURE,
    DraftConfig,
    Eagle3Draft,
    aux_layer_ids,
    load_draft,
)
from sglang_ext.testbed.train_draft import ttt_labels
from sglang_ext.testbed.train_signals import auc, position_labels
from sglang_ext.testbed.traces import Trace

H, HEADS, V = 32, 2, 40


def make_draft(seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = DraftConfig(hidden_size=H, num_heads=HEADS, intermediate_size=48, vocab_size=V,
                      target_num_layers=8, max_position_embeddings=128, rope_theta=10000.0,
                      rms_norm_eps=1e-6)
    d = Eagle3Draft(cfg, torch.randn(V, H, generator=g))
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.2) + (1.0 if p.dim() == 1 else 0.0))
    return d


def _rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    # x [heads, head_dim]; rotate pairs (i, i + d/2) by angle pos * theta^(-2i/d)
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        a = pos * theta ** (-2 * i / d)
        c, s = math.cos(a), math.sin(a)
        out[:, i] = x[:, i] * c - x[:, i + d // 2] * s
        out[:, i + d // 2] = x[:, i] * s + x[:, i + d // 2] * c
    return out


class RefDraft:
    """Incremental SGLang-style draft: one cache entry per call."""

    def __init__(self, d: Eagle3Draft):
        self.d = d
        self.keys, self.values = [], []

    def add(self, token: int, hidden: torch.Tensor, pos: int):
        d, hd = self.d, H // HEADS
        W = lambda lin: lin.weight.detach()  # noqa: E731
        e = _rms(d.embed_weight[token], d.input_layernorm.weight.detach())
        hn = _rms(hidden, d.hidden_norm.weight.detach())
        x = torch.cat([e, hn])
        q = _rope((W(d.q_proj) @ x).view(HEADS, hd), pos)
        k = _rope((W(d.k_proj) @ x).view(HEADS, hd), pos)
        v = (W(d.v_proj) @ x).view(HEADS, hd)
        self.keys.append(k)
        self.values.append(v)
        K, Vv = torch.stack(self.keys, 1), torch.stack(self.values, 1)  # [heads, n, hd]
        att = torch.softmax((K @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(hd), dim=-1)
        o = (att.unsqueeze(-1) * Vv).sum(1).reshape(-1)
        resid = hidden + W(d.o_proj) @ o
        h2 = _rms(resid, d.post_attention_layernorm.weight.detach())
        m = W(d.down_proj) @ (torch.nn.functional.silu(W(d.gate_proj) @ h2) * (W(d.up_proj) @ h2))
        g = m + resid
        logits = W(d.lm_head) @ _rms(g, d.norm.weight.detach())
        return logits, g

    def truncate(self, n: int):
        del self.keys[n:], self.values[n:]


@torch.no_grad()
def test_ttt_forward_equals_incremental_extend_and_chain():
    torch.manual_seed(0)
    d = make_draft()
    S, steps = 9, 3
    ids = torch.randint(0, V, (1, S))
    feats = torch.randn(1, S, 3 * H)
    ttt = d.ttt_forward(ids, feats, steps)
    assert [t.shape for t in ttt] == [(1, S - 1, V)] * steps
    fcw = d.fc.weight.detach()[:H]
    for n in range(0, S - 1 - steps):
        ref = RefDraft(d)
        # draft extend over verified positions 0..n: pair (ids[p+1], fc(f[p])) at position p
        for p in range(n + 1):
            logits, g = ref.add(int(ids[0, p + 1]), fcw @ feats[0, p], p)
            assert torch.allclose(logits, ttt[0][0, p], atol=1e-4), (n, p)
        # chain steps k = 1..steps-1 at position n + k, fed the previous draft hidden
        for k in range(1, steps):
            logits, g = ref.add(int(ids[0, n + 1 + k]), g, n + k)
            assert torch.allclose(logits, ttt[k][0, n], atol=1e-4), (n, k)


@torch.no_grad()
def test_ttt_rows_are_independent_of_later_positions_and_padding():
    d = make_draft(1)
    ids = torch.randint(0, V, (2, 12))
    feats = torch.randn(2, 12, 3 * H)
    full = d.ttt_forward(ids, feats, 3)
    ids2, feats2 = ids.clone(), feats.clone()
    ids2[:, 9:] = 0
    feats2[:, 9:] = 7.0
    part = d.ttt_forward(ids2, feats2, 3)
    # step k at index p reads ids up to p + 1 + k and features up to p
    for k in range(3):
        upto = 9 - 1 - k
        assert torch.allclose(full[k][:, :upto], part[k][:, :upto], atol=1e-5)


def test_signal_rows_do_not_touch_token_rows():
    d = make_draft(2)
    f = torch.randn(5, 3 * H)
    before = d.project_features(f).clone()
    with torch.no_grad():
        d.fc.weight[H:] = torch.randn(3, 3 * H)
    assert torch.equal(before, d.project_features(f))
    assert d.signal_logits(f).shape == (5, 3)
    assert torch.allclose(d.signal_logits(f), f @ d.fc.weight[H:].t())


def test_checkpoint_layout_and_round_trip(tmp_path):
    d = make_draft(3)
    d.save(str(tmp_path))
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    assert sd["fc.weight"].shape == (H + 3, 3 * H)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (H, 2 * H)
    assert sd["midlayer.self_attn.o_proj.weight"].shape == (H, H)
    assert sd["midlayer.mlp.gate_proj.weight"].shape == (48, H)
    assert sd["lm_head.weight"].shape == (V, H)
    assert sd["d2t"].dtype == torch.int64 and torch.all(sd["d2t"] == 0)
    assert sd["t2d"].dtype == torch.bool and sd["t2d"].all()
    assert not any("embed" in k for k in sd)  # SGLang shares the target's embedding
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [DRAFT_ARCHITECTURE]
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == V
    assert cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    d2 = load_draft(str(tmp_path), d.embed_weight)
    ids, feats = torch.randint(0, V, (1, 6)), torch.randn(1, 6, 3 * H)
    with torch.no_grad():
        a, b = d.ttt_forward(ids, feats, 2), d2.ttt_forward(ids, feats, 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_aux_layers():
    assert aux_layer_ids(8) == [2, 4, 5]
    assert aux_layer_ids(36) == [2, 18, 33]
    with pytest.raises(ValueError):
        aux_layer_ids(6)


def test_ttt_labels_shift():
    labels = torch.tensor([[-100, -100, 5, 6, 7, 8]])
    ids = labels.clamp(min=0)
    t0, t1, t2 = ttt_labels(ids, labels, 3)
    assert t0.tolist() == [[5, 6, 7, 8, -100]]
    assert t1.tolist() == [[6, 7, 8, -100, -100]]
    assert t2.tolist() == [[7, 8, -100, -100, -100]]


def test_chain_accept_lengths_walk():
    # prompt 3 tokens, continuation 10..16; drafts always right -> 4 per step (3 drafts + bonus)
    ids = [1, 2, 3] + list(range(10, 17))
    perfect = torch.tensor([[ids[p + 2 + k] if p + 2 + k < len(ids) else -1 for k in range(3)]
                            for p in range(len(ids) - 1)])
    # root ids[3]; steps commit 4, then root ids[7]; then 2 left -> drafts 15, 16 -> len 3
    assert chain_accept_lengths(ids, 3, perfect) == [4, 3]
    wrong = torch.full_like(perfect, -1)
    assert chain_accept_lengths(ids, 3, wrong) == [1] * 6


def test_position_labels_and_auc():
    # think tokens t=1..6, boundaries after t=2 and t=6; 2 steps in the problem
    tr = Trace("x", "q", "3", "train", [0] * 10, 4, 6, 2, "3", [2, 6], [0, 1], 0)
    conf, prog, rem, isb, comp = position_labels(tr)
    assert conf == [0, 0, 0, 0, 0, 1]
    assert prog == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1])
    assert rem == [5, 4, 3, 2, 1, 0]
    assert isb == [False, True, False, False, False, True]
    assert comp == [False, False, False, False, False, True]
    assert auc(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([1, 1, 0])) == 1.0
    assert auc(torch.tensor([0.1, 0.8, 0.9]), torch.tensor([1, 1, 0])) == 0.0
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([1, 0])) == 0.5
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([1, 1])) is None

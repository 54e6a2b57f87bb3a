"""Stage 3: train the EAGLE3 draft on the target's captured hidden states.

Data: the target's own greedy traces (``traces.pt``, split ``train``).  Each step
runs the frozen target over a batch (teacher forcing) to capture the features
SGLang's EAGLE3 feeds the draft, then the draft's training-time-test forward
(:meth:`Eagle3Draft.ttt_forward`, ``ttt_steps`` chain steps, each after the first
fed the draft's own previous hidden state) with a next-token loss per step on
completion tokens.  Only the token rows of ``fc`` learn here; the SpecExit rows
are fitted in stage 4.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F

from sglang_ext.testbed.common import (
    Example,
    collate,
    load_if_exists,
    lr_at,
    save_atomic,
    shift_step_labels,
)
from sglang_ext.testbed.modeling import IGNORE_INDEX, DraftConfig, Eagle3Draft, capture_features
from sglang_ext.testbed.traces import Trace, load_traces


@dataclass(frozen=True)
class DraftTrainConfig:
    steps: int = 500
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    ttt_steps: int = 3
    ckpt_every: int = 25
    #: Capture the target features of all traces once (fp16) instead of every step.
    cache_features: bool = True


def ttt_labels(ids: torch.Tensor, labels: torch.Tensor, num_steps: int) -> List[torch.Tensor]:
    """Targets of each TTT step: step ``k`` at index ``p`` must predict ``ids[p + 2 + k]``.

    Parameters
    ----------
    ids : torch.Tensor
        ``# [batch_size, seq_len]``
    labels : torch.Tensor
        ``# [batch_size, seq_len]`` ``ids`` on completion tokens, ``IGNORE_INDEX`` elsewhere.

    Returns
    -------
    list of torch.Tensor
        ``num_steps`` tensors ``# [batch_size, seq_len - 1]`` (``IGNORE_INDEX`` where
        the target token is outside the completion or past the end).

    Examples
    --------
    >>> lab = torch.tensor([[-100, 5, 6, 7]])
    >>> [t.tolist() for t in ttt_labels(lab.clamp(min=0), lab, 2)]
    [[[6, 7, -100]], [[7, -100, -100]]]
    """
    return shift_step_labels(labels, num_steps, IGNORE_INDEX)  # ids: same shape as labels


def draft_batch(traces: List[Trace], seed: int, step: int, batch_size: int,
                features: Optional[List[torch.Tensor]] = None):
    """Batch of ``step`` (pure function of ``(seed, step)``): ids, labels, lengths and,
    when ``features`` (cached per trace) is given, ``# [batch_size, seq_len, 3H]`` fp32 features."""
    rng = random.Random(f"sglang_ext-draft-{seed}-{step}")
    picks = [rng.randrange(len(traces)) for _ in range(batch_size)]
    ids, labels, lengths = collate([Example(traces[i].ids, traces[i].prompt_len) for i in picks])
    if features is None:
        return ids, labels, lengths, None
    feats = torch.zeros(len(picks), ids.shape[1], features[picks[0]].shape[-1])
    for r, i in enumerate(picks):
        feats[r, : features[i].shape[0]] = features[i].float()
    return ids, labels, lengths, feats


@torch.no_grad()
def cache_features(target, traces: List[Trace], batch: int = 32, progress: bool = False):
    """Target features of every trace, ``# [len, 3H]`` each, stored in fp16 (once per run)."""
    from tqdm import tqdm

    order = sorted(range(len(traces)), key=lambda i: len(traces[i].ids))
    out: List[Optional[torch.Tensor]] = [None] * len(traces)
    chunks = [order[s : s + batch] for s in range(0, len(order), batch)]
    for chunk in tqdm(chunks, desc="features", disable=not progress, leave=False):
        ids, _, _ = collate([Example(traces[i].ids, traces[i].prompt_len) for i in chunk])
        _, feats = capture_features(target, ids)
        for r, i in enumerate(chunk):
            out[i] = feats[r, : len(traces[i].ids)].to(torch.float16).clone()
    return out


def train_draft(out_dir: str, seed: int, cfg: DraftTrainConfig, progress: bool = True) -> dict:
    """Train (or resume, or skip when done) the draft; writes ``out_dir/draft_tokens.pt``."""
    from tqdm import tqdm

    from sglang_ext.testbed.train_target import load_target

    final_path = os.path.join(out_dir, "draft_tokens.pt")
    record_path = os.path.join(out_dir, "draft_record.json")
    if os.path.exists(final_path) and os.path.exists(record_path):
        with open(record_path) as f:
            return json.load(f)

    target = load_target(os.path.join(out_dir, "target"))
    for p in target.parameters():
        p.requires_grad_(False)
    traces = [t for t in load_traces(out_dir) if t.split == "train"]
    tc = target.config
    dcfg = DraftConfig(tc.hidden_size, tc.num_attention_heads,
                       _draft_intermediate(out_dir, tc), tc.vocab_size, tc.num_hidden_layers,
                       tc.max_position_embeddings, _rope_theta(tc), tc.rms_norm_eps)
    draft = init_draft(target, dcfg, seed)
    params, opt = draft_optimizer(draft, cfg)
    ckpt_path = os.path.join(out_dir, "draft_ckpt.pt")
    start, losses, accs = 0, [], []
    ck = load_if_exists(ckpt_path)
    if ck is not None:
        draft.load_state_dict(ck["model"], strict=False)
        opt.load_state_dict(ck["opt"])
        start, losses, accs = ck["step"], ck["losses"], ck["accs"]

    features = cache_features(target, traces, progress=progress) if cfg.cache_features else None
    bar = tqdm(range(start, cfg.steps), desc="draft", disable=not progress, initial=start,
               total=cfg.steps)
    for step in bar:
        draft.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        ids, labels, _, feats = draft_batch(traces, seed, step, cfg.batch_size, features)
        loss, step_acc = draft_train_step(draft, opt, params, target, ids, labels, feats, cfg)
        losses.append(loss)
        accs.append(step_acc)
        bar.set_postfix(loss=f"{losses[-1]:.4f}", acc="/".join(f"{a:.3f}" for a in step_acc))
        done = step + 1
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            save_atomic({"model": draft.state_dict(), "opt": opt.state_dict(), "step": done,
                         "losses": losses, "accs": accs}, ckpt_path)

    save_atomic({"sglang_state_dict": draft.sglang_state_dict(), "config": dcfg.__dict__},
                final_path)
    record = {"losses": losses, "accs": accs, "config": cfg.__dict__}
    with open(record_path, "w") as f:
        json.dump(record, f)
    return record


def init_draft(target, dcfg: DraftConfig, seed: int) -> Eagle3Draft:
    """A fresh draft: seeded init, ``lm_head`` copied from the target, signal rows zero."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        draft = Eagle3Draft(dcfg, target.get_input_embeddings().weight)
        with torch.no_grad():
            draft.lm_head.weight.copy_(target.lm_head.weight)
            draft.fc.weight[dcfg.hidden_size:].zero_()
    return draft


def draft_optimizer(draft: Eagle3Draft, cfg: DraftTrainConfig):
    """``(params, AdamW)`` of the draft stage."""
    params = [p for n, p in draft.named_parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    return params, opt


def draft_train_step(draft: Eagle3Draft, opt, params, target, ids: torch.Tensor, labels: torch.Tensor,
                     feats: Optional[torch.Tensor], cfg: DraftTrainConfig):
    """One optimizer step of the draft (training-time test); returns ``(loss, per-step acc)``.

    ``ids``, ``labels``: ``# [batch_size, seq_len]``; ``feats``: ``# [batch_size, seq_len, 3H]``
    cached target features, or None to capture them with ``target`` now. The caller sets
    the learning rate and ``draft.train()``.
    """
    if feats is None:
        with torch.no_grad():
            _, feats = capture_features(target, ids)
    logits = draft.ttt_forward(ids, feats, cfg.ttt_steps)
    targets = ttt_labels(ids, labels, cfg.ttt_steps)
    loss = 0.0
    step_acc = []
    for lg, tg in zip(logits, targets):
        loss = loss + F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tg.reshape(-1),
                                      ignore_index=IGNORE_INDEX)
        valid = tg != IGNORE_INDEX
        step_acc.append(float((lg.argmax(-1)[valid] == tg[valid]).float().mean()))
    loss = loss / len(logits)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    # The signal rows of fc are not trained here (stage 4 fits them as a probe).
    draft.fc.weight.grad[draft.cfg.hidden_size:] = 0
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item(), step_acc


def _rope_theta(tc) -> float:
    rp = getattr(tc, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(tc, "rope_theta", 10000.0)))


def _draft_intermediate(out_dir: str, tc) -> int:
    with open(os.path.join(out_dir, "target_record.json")) as f:
        return int(json.load(f)["shape"]["draft_intermediate_size"])


def load_draft_tokens(out_dir: str, embed_weight: torch.Tensor) -> Eagle3Draft:
    ck = torch.load(os.path.join(out_dir, "draft_tokens.pt"), weights_only=False)
    draft = Eagle3Draft(DraftConfig(**ck["config"]), embed_weight)
    draft.load_sglang_state_dict(ck["sglang_state_dict"])
    return draft

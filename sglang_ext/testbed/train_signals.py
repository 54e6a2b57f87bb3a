"""Stage 4: fit the SpecExit rows of the draft's ``fc`` (docs/algorithms.md#specexit-signal-row-training).

The signal rows receive gradient only from the signal losses, so they are fitted
as a linear probe of frozen target features (no bias: ``fc`` has none), then
written as rows ``H..H+2`` (confidence, progress, remain) of the trained draft's
``fc``; the token rows stay bit-identical.  Losses on think positions only:
BCE-with-logits for confidence, MSE of ``sigmoid(z)`` for progress, MSE of ``z``
against ``log(max(remain, 1))`` for remain.

Output: the final draft checkpoint ``out_dir/draft/`` (SGLang EAGLE3 layout).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from sglang_ext.testbed.common import Example, collate
from sglang_ext.testbed.modeling import capture_features
from sglang_ext.testbed.traces import NOT_LABELLED, Trace, load_traces


@dataclass(frozen=True)
class SignalTrainConfig:
    iters: int = 600
    lr: float = 0.05
    feature_batch: int = 32


@dataclass
class SignalData:
    """Think-position features and labels.

    features ``# [num_positions, 3 * hidden_size]``; confidence, progress,
    log_remain, remain ``# [num_positions]``; is_boundary ``# [num_positions]`` bool;
    computed ``# [num_positions]`` bool (every ``Step`` paragraph written);
    trace_index ``# [num_positions]``.
    """

    features: torch.Tensor
    confidence: torch.Tensor
    progress: torch.Tensor
    log_remain: torch.Tensor
    remain: torch.Tensor
    is_boundary: torch.Tensor
    computed: torch.Tensor
    trace_index: torch.Tensor


def labelled(traces: List[Trace]) -> List[Trace]:
    return [t for t in traces if t.think_len and t.empty_correct != NOT_LABELLED
            and NOT_LABELLED not in t.boundary_correct]


def position_labels(tr: Trace) -> Tuple[List[float], List[float], List[float], List[bool], List[bool]]:
    """Per think position ``t = 1..T``: confidence, progress, remain, is-boundary, answer-computed.

    Examples
    --------
    >>> tr = Trace("x", "q", "3", "train", [0] * 9, 3, 5, 1, "3", [2, 5], [0, 1], 0)
    >>> position_labels(tr)[0], position_labels(tr)[2], position_labels(tr)[4]
    ([0.0, 0.0, 0.0, 0.0, 1.0], [4.0, 3.0, 2.0, 1.0, 0.0], [False, True, True, True, True])
    """
    T = tr.think_len
    conf, comp = [], []
    cur, cur_comp = float(tr.empty_correct), False
    bset = {t: j for j, t in enumerate(tr.boundaries)}
    for t in range(1, T + 1):
        if t in bset:
            j = bset[t]
            cur = float(tr.boundary_correct[j])
            cur_comp = j + 1 >= tr.num_steps
        conf.append(cur)
        comp.append(cur_comp)
    prog = [t / T for t in range(1, T + 1)]
    rem = [float(T - t) for t in range(1, T + 1)]
    return conf, prog, rem, [t in bset for t in range(1, T + 1)], comp


@torch.no_grad()
def signal_data(target, traces: List[Trace], batch: int = 32) -> SignalData:
    feats, conf, prog, rem, isb, comp, idx = [], [], [], [], [], [], []
    for s in range(0, len(traces), batch):
        chunk = traces[s : s + batch]
        ids, _, _ = collate([Example(t.ids, t.prompt_len) for t in chunk])
        _, f = capture_features(target, ids)
        for r, tr in enumerate(chunk):
            T = tr.think_len
            feats.append(f[r, tr.prompt_len : tr.prompt_len + T].clone())
            c, p, m, b, k = position_labels(tr)
            conf += c
            prog += p
            rem += m
            isb += b
            comp += k
            idx += [s + r] * T
    remain = torch.tensor(rem)
    return SignalData(torch.cat(feats), torch.tensor(conf), torch.tensor(prog),
                      torch.log(remain.clamp(min=1.0)), remain, torch.tensor(isb),
                      torch.tensor(comp), torch.tensor(idx))


def fit_probe(data: SignalData, cfg: SignalTrainConfig, progress: bool = False) -> torch.Tensor:
    """Fit the 3 signal rows; returns ``W`` ``# [3, 3 * hidden_size]`` (no bias).

    Trained as ``W = V / scale`` (per-feature RMS), a diagonal preconditioning that
    changes nothing about the function class.
    """
    from tqdm import tqdm

    x = data.features
    scale = x.pow(2).mean(0).sqrt().clamp(min=1e-6)  # [3H]
    xs = x / scale
    V = torch.zeros(3, x.shape[1], requires_grad=True)
    opt = torch.optim.Adam([V], lr=cfg.lr)
    for it in tqdm(range(cfg.iters), desc="signals", disable=not progress, leave=False):
        lr = cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * it / cfg.iters)))
        for g in opt.param_groups:
            g["lr"] = lr
        z = xs @ V.t()
        loss = (F.binary_cross_entropy_with_logits(z[:, 0], data.confidence)
                + F.mse_loss(torch.sigmoid(z[:, 1]), data.progress) * 10.0
                + F.mse_loss(z[:, 2], data.log_remain))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (V.detach() / scale).contiguous()


def decode_signals(z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw rows ``# [n, 3]`` -> (confidence, progress, remain) per docs/algorithms.md#specexit-signals."""
    return torch.sigmoid(z[:, 0]), torch.sigmoid(z[:, 1]), torch.exp(z[:, 2])


def auc(scores: torch.Tensor, labels: torch.Tensor) -> Optional[float]:
    """Area under the ROC curve (Mann-Whitney, ties count half); None with one class.

    Examples
    --------
    >>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    0.75
    """
    pos, neg = scores[labels.bool()], scores[~labels.bool()]
    if len(pos) == 0 or len(neg) == 0:
        return None
    gt = (pos[:, None] > neg[None, :]).float().sum()
    eq = (pos[:, None] == neg[None, :]).float().sum()
    return float((gt + 0.5 * eq) / (len(pos) * len(neg)))


def signal_metrics(W: torch.Tensor, data: SignalData) -> dict:
    """Held-out metrics of the issue: AUC, progress MAE, remain within ±30 %."""
    conf, prog, rem = decode_signals(data.features @ W.t())
    b = data.is_boundary
    rel = (rem - data.remain).abs() / data.remain.clamp(min=1.0)
    return {
        "positions": int(len(conf)),
        "confidence_auc_forced_exit": auc(conf[b], data.confidence[b]),
        "confidence_auc_answer_computed": auc(conf[b], data.computed[b].float()),
        "progress_mae": float((prog - data.progress).abs().mean()),
        "remain_within_30pct": float((rel <= 0.3).float().mean()),
        "boundary_positive_rate": float(data.confidence[b].mean()) if b.any() else None,
    }


def train_signals(out_dir: str, seed: int, cfg: SignalTrainConfig, progress: bool = True) -> dict:
    """Stage entry: fit the rows, write ``out_dir/draft/``; return train metrics."""
    from sglang_ext.testbed.train_draft import load_draft_tokens
    from sglang_ext.testbed.train_target import load_target

    draft_dir = os.path.join(out_dir, "draft")
    record_path = os.path.join(out_dir, "signals_record.json")
    if os.path.exists(os.path.join(draft_dir, "model.safetensors")) and os.path.exists(record_path):
        with open(record_path) as f:
            return json.load(f)
    torch.manual_seed(seed)
    target = load_target(os.path.join(out_dir, "target"))
    traces = labelled([t for t in load_traces(out_dir) if t.split == "train"])
    data = signal_data(target, traces, cfg.feature_batch)
    W = fit_probe(data, cfg, progress)
    draft = load_draft_tokens(out_dir, target.get_input_embeddings().weight)
    H = draft.cfg.hidden_size
    with torch.no_grad():
        draft.fc.weight[H:] = W
    draft.save(draft_dir)
    record = {"train_traces": len(traces), **signal_metrics(W, data)}
    with open(record_path, "w") as f:
        json.dump(record, f)
    return record

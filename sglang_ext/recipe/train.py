"""Recipe stage (c): train the draft on the target's features, and estimate its acceptance.

Loss: for every chain step ``k`` of :meth:`Eagle3DraftModel.ttt_hidden`, cross-entropy over
the draft vocabulary of the answer tokens (prompt tokens and tokens outside the draft
vocabulary are not scored), weighted ``step_decay ** k``; the LM head runs only on scored
rows.  The label is the target's greedy token (hard) or, with soft targets
(``final_hidden`` and ``target_head`` given), the target's whole distribution restricted to
the draft vocabulary, ``softmax(target_head @ final_hidden[p + 1 + k])`` for the token at
``p + 2 + k`` (:func:`soft_step_targets`): the ranking of the target's alternatives is
information the greedy token alone does not carry, which matters when the data is small.

Acceptance estimate (:func:`chain_acceptance`): SGLang's greedy chain speculation replayed
offline on the target's own greedy answers: after each verify the draft proposes
``num_steps`` tokens from the last accepted position, the longest matching prefix is
accepted, and the target adds one token.  The estimate is tokens per verify step
(``spec_accept_length``).  No SGLang import.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from sglang_ext.recipe.draft import NOT_IN_DRAFT_VOCAB, Eagle3DraftModel
from sglang_ext.testbed.common import lr_at, shift_step_labels


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = 10.0
    batch_tokens: int = 2048      # padded tokens per optimizer step
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.0
    ttt_steps: int = 3
    step_decay: float = 0.8
    seed: int = 0
    #: Keep the LM head at the target's rows (a strong prior when the data is small).
    freeze_lm_head: bool = True


def step_labels(ids: torch.Tensor, prompt_lens: torch.Tensor, lengths: torch.Tensor,
                target_to_draft: torch.Tensor, num_steps: int) -> List[torch.Tensor]:
    """Draft-vocabulary labels of each chain step: step ``k`` at index ``p`` is scored on
    ``ids[p + 2 + k]`` when that position is in the answer (``>= prompt_len``, ``< length``).

    Parameters
    ----------
    ids : torch.Tensor
        ``# [batch_size, seq_len]``
    prompt_lens, lengths : torch.Tensor
        ``# [batch_size]``
    target_to_draft : torch.Tensor
        ``# [vocab_size]`` draft id or ``NOT_IN_DRAFT_VOCAB``.

    Returns
    -------
    list of torch.Tensor
        ``num_steps`` tensors ``# [batch_size, seq_len - 1]`` (``NOT_IN_DRAFT_VOCAB`` = not scored).

    Examples
    --------
    >>> t2d = torch.tensor([0, 1, 2, 3, -100, 4])
    >>> [x.tolist() for x in step_labels(torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([2]),
    ...                                  torch.tensor([5]), t2d, 2)]
    [[[3, -100, 4, -100]], [[-100, 4, -100, -100]]]
    """
    S = ids.shape[1]
    pos = torch.arange(S).unsqueeze(0)  # [1, S]
    ok = (pos >= prompt_lens.unsqueeze(1)) & (pos < lengths.unsqueeze(1))
    mapped = torch.where(ok, target_to_draft[ids], torch.full_like(ids, NOT_IN_DRAFT_VOCAB))
    return shift_step_labels(mapped, num_steps, NOT_IN_DRAFT_VOCAB)


def soft_step_targets(final_hidden: torch.Tensor, num_steps: int) -> List[torch.Tensor]:
    """The target's final hidden state that predicts each chain step's label: step ``k`` at
    index ``p`` gets ``final_hidden[:, p + 1 + k]`` (the target's prediction of
    ``ids[p + 2 + k]``, the label :func:`step_labels` puts there), zeros past the end.

    Parameters
    ----------
    final_hidden : torch.Tensor
        ``# [batch_size, seq_len, hidden_size]``

    Returns
    -------
    list of torch.Tensor
        ``num_steps`` tensors ``# [batch_size, seq_len - 1, hidden_size]``.

    Examples
    --------
    >>> h = torch.arange(5.0).view(1, 5, 1)
    >>> [t.flatten().tolist() for t in soft_step_targets(h, 2)]
    [[1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 0.0]]
    """
    B, S, H = final_hidden.shape
    pad = torch.cat([final_hidden, final_hidden.new_zeros(B, num_steps, H)], dim=1)
    return [pad[:, 1 + k : S + k] for k in range(num_steps)]


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``-sum(softmax(target_logits) * log_softmax(logits))``.

    ``logits`` and ``target_logits``: ``# [rows, draft_vocab_size]``.

    Examples
    --------
    >>> t = torch.tensor([[0.0, 0.0]])
    >>> round(float(soft_cross_entropy(torch.tensor([[0.0, 0.0]]), t)), 4)  # log 2
    0.6931
    """
    q = torch.softmax(target_logits.float(), dim=-1)
    return -(q * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


def make_batches(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> List[List[int]]:
    """Length-grouped batches of sequence indices (shuffled per epoch, deterministic)."""
    rng = random.Random(f"sglang_ext-recipe-{seed}-{epoch}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def pad_rows(rows: Sequence[torch.Tensor], idx: Sequence[int], seq_len: int) -> torch.Tensor:
    """``rows[i]`` (``# [len_i, D]``) for ``i`` in ``idx``, right-padded with zeros to
    ``# [len(idx), seq_len, D]`` fp32."""
    out = torch.zeros(len(idx), seq_len, rows[idx[0]].shape[-1])
    for r, i in enumerate(idx):
        out[r, : rows[i].shape[0]] = rows[i].float()
    return out


def collate(seqs: Sequence[Sequence[int]], prompt_lens: Sequence[int],
            features: Sequence[torch.Tensor], idx: Sequence[int]):
    """Right-padded ``ids`` ``# [B, S]``, ``feats`` ``# [B, S, 3H]`` fp32, ``prompt_lens``, ``lengths`` ``# [B]``."""
    S = max(len(seqs[i]) for i in idx)
    ids = torch.zeros(len(idx), S, dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
    return (ids, pad_rows(features, idx, S), torch.tensor([prompt_lens[i] for i in idx]),
            torch.tensor([len(seqs[i]) for i in idx]))


def train_draft(draft: Eagle3DraftModel, target_to_draft: torch.Tensor, seqs: Sequence[Sequence[int]],
                prompt_lens: Sequence[int], features: Sequence[torch.Tensor], cfg: TrainConfig,
                progress: bool = True, eval_fn=None,
                final_hidden: Optional[Sequence[torch.Tensor]] = None,
                target_head: Optional[torch.Tensor] = None) -> Dict:
    """Train in place; returns the record (losses, per-step accuracies, seconds).

    ``final_hidden`` (per sequence ``# [len_i, hidden_size]``, the target's final normed hidden
    states) with ``target_head`` (``# [draft_vocab_size, hidden_size]``, the target's LM-head
    rows of the draft vocabulary) switch the loss to soft targets (see the module docstring).
    """
    soft = final_hidden is not None
    if soft and target_head is None:
        raise ValueError("soft targets need target_head (the target's LM-head rows of the draft vocabulary)")
    if soft:
        target_head = target_head.detach().float()
    from tqdm import tqdm

    lengths = [len(s) for s in seqs]
    n_epochs = max(1, int(round(cfg.epochs)))
    per_epoch = len(make_batches(lengths, cfg.batch_tokens, cfg.seed, 0))
    total = max(1, int(round(cfg.epochs * per_epoch)))
    draft.lm_head.weight.requires_grad_(not cfg.freeze_lm_head)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    losses: List[float] = []
    accs: List[List[float]] = []
    evals: List[Dict] = []
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc="draft", unit="step", disable=not progress)
    step = 0
    for epoch in range(n_epochs + 1):
        for idx in make_batches(lengths, cfg.batch_tokens, cfg.seed, epoch):
            if step >= total:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, cfg.lr, cfg.warmup)
            ids, feats, plen, lens = collate(seqs, prompt_lens, features, idx)
            labels = step_labels(ids, plen, lens, target_to_draft, cfg.ttt_steps)
            soft_in = soft_step_targets(pad_rows(final_hidden, idx, ids.shape[1]), cfg.ttt_steps) if soft else None
            draft.train()
            hidden = draft.ttt_hidden(ids, feats, cfg.ttt_steps)
            loss = 0.0
            step_acc = []
            wsum = 0.0
            for k, (h, lab) in enumerate(zip(hidden, labels)):
                valid = lab != NOT_IN_DRAFT_VOCAB
                if not bool(valid.any()):
                    step_acc.append(float("nan"))
                    continue
                logits = draft.logits(h[valid])  # [n_valid, draft_vocab]
                w = cfg.step_decay ** k
                if soft:
                    with torch.no_grad():
                        t_logits = soft_in[k][valid] @ target_head.t()  # [n_valid, draft_vocab]
                    loss = loss + w * soft_cross_entropy(logits, t_logits)
                else:
                    loss = loss + w * F.cross_entropy(logits, lab[valid])
                wsum += w
                step_acc.append(float((logits.argmax(-1) == lab[valid]).float().mean()))
            loss = loss / max(wsum, 1e-9)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            accs.append(step_acc)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", acc="/".join(f"{a:.2f}" for a in step_acc))
        if eval_fn is not None and step < total:
            evals.append({"step": step, **eval_fn()})
            bar.write(f"[train] after {step} steps: {evals[-1]}")
        if step >= total:
            break
    bar.close()
    return {"losses": losses, "accs": accs, "evals": evals, "steps": step, "soft_targets": soft,
            "seconds": round(time.perf_counter() - t0, 1), "config": asdict(cfg)}


@torch.no_grad()
def chain_predictions(draft: Eagle3DraftModel, ids: Sequence[int], features: torch.Tensor,
                      num_steps: int) -> torch.Tensor:
    """Target ids the draft proposes: ``# [num_steps, len(ids) - 1]``; entry ``[k, p]`` is
    the ``k``-th chain draft after position ``p + 1`` (it guesses ``ids[p + 2 + k]``)."""
    draft.eval()
    x = torch.tensor([list(ids)])
    hidden = draft.ttt_hidden(x, features.float().unsqueeze(0), num_steps)
    preds = [draft.draft_ids[draft.logits(h[0]).argmax(-1)] for h in hidden]
    return torch.stack(preds)


def simulate_chain(ids: Sequence[int], prompt_len: int, preds: torch.Tensor) -> Dict[str, int]:
    """Replay greedy chain speculation on a finished greedy sequence.

    ``preds`` ``# [num_steps, len(ids) - 1]`` from :func:`chain_predictions`.  The prefill
    emits ``ids[prompt_len]``; each verify step drafts ``preds[k, q - 1]`` for
    ``ids[q + 1 + k]`` (``q`` = last emitted index), accepts the matching prefix and emits one
    more token.  Returns emitted tokens (after the prefill's) and verify steps.

    Examples
    --------
    Drafts always right (3 steps): every verify emits 4 tokens.

    >>> ids = list(range(10)); P = torch.tensor([[p + 2 + k for p in range(9)] for k in range(3)])
    >>> simulate_chain(ids, 1, P)
    {'tokens': 8, 'steps': 2, 'accepted': 6}
    """
    n = len(ids)
    num_steps = preds.shape[0]
    q = prompt_len
    tokens = steps = accepted = 0
    while q < n - 1:
        a = 0
        for k in range(num_steps):
            pos = q + 1 + k
            if pos >= n or int(preds[k, q - 1]) != ids[pos]:
                break
            a += 1
        emit = min(a + 1, n - 1 - q)
        tokens += emit
        accepted += a
        steps += 1
        q += emit
    return {"tokens": tokens, "steps": steps, "accepted": accepted}


def chain_acceptance(draft: Eagle3DraftModel, seqs: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                     features: Sequence[torch.Tensor], num_steps: int = 3) -> Dict[str, float]:
    """Held-out estimate: tokens per verify step (``spec_accept_length``) and per-step accuracy."""
    tot = {"tokens": 0, "steps": 0, "accepted": 0}
    for ids, plen, f in zip(seqs, prompt_lens, features):
        if len(ids) - plen < 2:
            continue
        r = simulate_chain(ids, plen, chain_predictions(draft, ids, f, num_steps))
        for k in tot:
            tot[k] += r[k]
    steps = max(tot["steps"], 1)
    return {"accept_length": round(tot["tokens"] / steps, 4),
            "accepted_drafts_per_step": round(tot["accepted"] / steps, 4),
            "verify_steps": tot["steps"], "num_steps": num_steps}

"""Offline checks of trained testbed models against the issue's targets (no SGLang).

* target: greedy accuracy and re-check paragraphs on held-out problems;
* draft: mean accept length of greedy EAGLE3 chain drafting (topk=1, ``num_steps``
  draft tokens per step) against the target's greedy trace, simulated exactly as
  SGLang runs it (draft extend on target features, chain steps on draft hiddens);
* SpecExit rows: confidence AUC at paragraph boundaries, progress MAE, remain
  within ±30 %, on held-out traces.

    python -m sglang_ext.testbed.check --run runs/full         # uses runs/full/{target,draft,traces.pt}
    python -m sglang_ext.testbed.check --models sglang_ext/testbed/models --n 200 --seed 12345
"""

from __future__ import annotations

import argparse
import json
import os
import random
from typing import List, Optional, Sequence

import torch

from sglang_ext.testbed import task
from sglang_ext.testbed.common import Example, collate
from sglang_ext.testbed.modeling import Eagle3Draft, capture_features, load_draft
from sglang_ext.testbed.traces import TraceConfig, Trace, label_confidence, make_traces

#: Acceptance targets of issue 6.
TARGETS = {
    "accuracy": 0.90,
    "mean_rechecks": 6.0,
    "accept_length": 2.5,
    "confidence_auc": 0.95,
    "progress_mae": 0.10,
    "remain_within_30pct": 0.80,
}


def chain_accept_lengths(ids: List[int], prompt_len: int, step_preds: torch.Tensor) -> List[int]:
    """Accept length (accepted drafts + 1 bonus) of each verify step of one request.

    Parameters
    ----------
    ids : list of int
        Prompt + the target's greedy continuation (what verification accepts).
    prompt_len : int
    step_preds : torch.Tensor
        ``# [seq_len - 1, num_steps]``: ``step_preds[p, k]`` is the draft's argmax
        for ``ids[p + 2 + k]`` when the last target-verified position is ``p``.

    Examples
    --------
    Prompt ``a b``, greedy continuation ``c d e f``; after prefill the root is
    ``c`` and the draft (last verified position p = 1) proposes ``d e X``::

        ids      a  b | c  d  e  f
        drafts          (d  e  X)      -> accept d e; bonus f; length 3
        root f is the last token       -> done

    >>> ids = [0, 1, 2, 3, 4, 5]
    >>> preds = torch.tensor([[9, 9, 9], [3, 4, 9], [9, 9, 9], [9, 9, 9], [9, 9, 9]])
    >>> chain_accept_lengths(ids, 2, preds)
    [3]
    """
    N, K = len(ids), step_preds.shape[1]
    n = prompt_len - 1  # last position whose target features the draft has
    out = []
    while n + 1 < N - 1:
        a = 0
        while a < K and n + 2 + a < N and int(step_preds[n, a]) == ids[n + 2 + a]:
            a += 1
        out.append(a + 1)
        n += a + 1
    return out


@torch.no_grad()
def draft_step_predictions(target, draft: Eagle3Draft, traces: List[Trace], num_steps: int,
                           batch: int = 16) -> List[torch.Tensor]:
    """Per trace ``# [len - 1, num_steps]`` argmax drafts (see :func:`chain_accept_lengths`)."""
    out = []
    for s in range(0, len(traces), batch):
        chunk = traces[s : s + batch]
        ids, _, _ = collate([Example(t.ids, t.prompt_len) for t in chunk])
        _, feats = capture_features(target, ids)
        logits = draft.ttt_forward(ids, feats, num_steps)
        preds = torch.stack([lg.argmax(-1) for lg in logits], dim=-1)  # [B, S-1, K]
        for r, t in enumerate(chunk):
            out.append(preds[r, : len(t.ids) - 1])
    return out


def accept_length(target, draft: Eagle3Draft, traces: List[Trace], num_steps: int = 3) -> float:
    preds = draft_step_predictions(target, draft, traces, num_steps)
    lens = [a for t, p in zip(traces, preds) for a in chain_accept_lengths(t.ids, t.prompt_len, p)]
    return sum(lens) / max(1, len(lens))


def check_traces(target, draft: Eagle3Draft, tok, traces: List[Trace], num_steps: int = 3) -> dict:
    from sglang_ext.testbed.train_signals import labelled, signal_data, signal_metrics

    texts = [tok.decode(t.ids[t.prompt_len :]) for t in traces]
    res = {
        "n": len(traces),
        "accuracy": sum(t.correct for t in traces) / len(traces),
        "mean_rechecks": sum(task.count_rechecks(x) for x in texts) / len(traces),
        "closed_think": sum(t.think_len is not None for t in traces) / len(traces),
        "mean_think_tokens": sum(t.think_len or 0 for t in traces) / len(traces),
        "accept_length": accept_length(target, draft, traces, num_steps),
    }
    lab = labelled(traces)
    if lab:
        H = draft.cfg.hidden_size
        res.update(signal_metrics(draft.fc.weight[H:].detach(), signal_data(target, lab)))
    res["pass"] = {
        "accuracy": res["accuracy"] >= TARGETS["accuracy"],
        "mean_rechecks": res["mean_rechecks"] >= TARGETS["mean_rechecks"],
        "accept_length": res["accept_length"] >= TARGETS["accept_length"],
        "confidence_auc": (res.get("confidence_auc_answer_computed") or 0) >= TARGETS["confidence_auc"],
        "progress_mae": res.get("progress_mae", 1) <= TARGETS["progress_mae"],
        "remain_within_30pct": res.get("remain_within_30pct", 0) >= TARGETS["remain_within_30pct"],
    }
    return res


def check_models(out_dir: str, progress: bool = False) -> dict:
    """Check ``out_dir/{target,draft}`` on the held-out traces of ``out_dir/traces.pt``."""
    from sglang_ext.testbed.tokenizer import build_tokenizer
    from sglang_ext.testbed.traces import load_traces
    from sglang_ext.testbed.train_target import load_target

    target = load_target(os.path.join(out_dir, "target"))
    draft = load_draft(os.path.join(out_dir, "draft"), target.get_input_embeddings().weight)
    held = [t for t in load_traces(out_dir) if t.split == "heldout"]
    res = check_traces(target, draft, build_tokenizer(), held)
    with open(os.path.join(out_dir, "check.json"), "w") as f:
        json.dump(res, f, indent=2)
    return res


def check_fresh(models_dir: str, n: int, seed: int, progress: bool = False) -> dict:
    """Check committed models on ``n`` fresh problems of CLI seed ``seed`` (labels included)."""
    from sglang_ext.testbed.tokenizer import build_tokenizer
    from sglang_ext.testbed.train_target import load_target

    tok = build_tokenizer()
    target = load_target(os.path.join(models_dir, "target"))
    draft = load_draft(os.path.join(models_dir, "draft"), target.get_input_embeddings().weight)
    problems = task.generate_problems(n, random.Random(seed), f"s{seed}-")
    cfg = TraceConfig()
    traces = make_traces(target, tok, problems, "heldout", cfg, progress)
    label_confidence(target, tok, traces, cfg, progress)
    return check_traces(target, draft, tok, traces)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="Offline checks of the testbed models.")
    ap.add_argument("--run", help="a training run directory")
    ap.add_argument("--models", help="a directory with target/ and draft/ (e.g. the committed ones)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=12345)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.run:
        res = check_models(args.run, progress=True)
    elif args.models:
        res = check_fresh(args.models, args.n, args.seed, progress=True)
    else:
        ap.error("give --run or --models")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

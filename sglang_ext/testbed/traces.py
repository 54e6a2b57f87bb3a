"""Stage 2: the target's own greedy traces, and SpecExit labels computed on them.

For every problem the target decodes greedily from the thinking prompt.  These
traces are the draft's training data (so the draft learns what the target
actually writes) and, for a subset, carry the SpecExit labels of
docs/algorithms.md#specexit-signal-row-training:

* think positions ``t = 1..T``: the generated tokens before ``</think>``;
* ``progress = t / T``, ``remain = T - t``;
* ``confidence``: at each paragraph boundary (a ``\\n\\n`` token inside the think
  span) the thinking is cut right after it, ``</think>`` is appended, and the
  target answers greedily; the boundary is labelled 1 if the parsed answer is
  correct.  Position ``t`` takes the label of the last boundary at or before
  ``t``; positions before the first boundary take the label of answering with an
  empty think span (``<think>\\n</think>``).

Written to ``out_dir/traces.pt`` (a list of :class:`Trace` as dicts).
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch

from sglang_ext.testbed import task
from sglang_ext.testbed.common import encode_prompt, greedy_generate, save_atomic
from sglang_ext.testbed.tokenizer import build_tokenizer

#: ``boundary_correct`` entry of a boundary whose forced answer was not decoded.
NOT_LABELLED = -1


@dataclass(frozen=True)
class TraceConfig:
    num_train: int = 2400          # draft training traces
    num_signal_train: int = 500    # of which labelled for the signal rows
    num_heldout: int = 200         # held-out traces (checks), all labelled
    max_new_tokens: int = 320
    answer_max_new_tokens: int = 10
    batch_size: int = 64
    #: Quick mode only: use reference completions (``reference_rechecks`` re-checks)
    #: instead of greedy generations, so that a barely trained model still yields
    #: closed think spans to label.
    reference_traces: bool = False
    reference_rechecks: int = 1


@dataclass
class Trace:
    """One greedy trace of the target.

    ``ids = prompt + generated``; think positions are ``prompt_len + t - 1`` for
    ``t = 1..think_len`` (the t-th generated token).  ``boundaries`` holds the
    ``t`` of each ``\\n\\n`` token in the think span; ``boundary_correct[i]`` its
    forced-exit label (1/0); ``empty_correct`` the label of an empty think span;
    ``boundary_paragraphs[i]`` the number of paragraphs finished at that boundary.
    """

    id: str
    question: str
    answer: str
    split: str
    ids: List[int]
    prompt_len: int
    think_len: Optional[int]
    num_steps: int
    predicted: Optional[str]
    boundaries: List[int] = field(default_factory=list)
    boundary_correct: List[int] = field(default_factory=list)
    empty_correct: int = NOT_LABELLED

    @property
    def correct(self) -> bool:
        return self.predicted == self.answer


def _think_len(gen: List[int], think_close_id: int) -> Optional[int]:
    return gen.index(think_close_id) if think_close_id in gen else None


def make_traces(target, tok, problems: List[task.Problem], split: str, cfg: TraceConfig,
                progress: bool = False) -> List[Trace]:
    """Greedy traces of ``problems`` (no labels yet)."""
    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)
    para_id = tok.convert_tokens_to_ids(task.PARAGRAPH_BREAK)
    prompts = [encode_prompt(tok, p.question) for p in problems]
    if cfg.reference_traces:
        gens = [tok.encode(task.completion_text(p, cfg.reference_rechecks), add_special_tokens=False)
                for p in problems]
    else:
        gens = greedy_generate(target, prompts, cfg.max_new_tokens, cfg.batch_size, progress)
    out = []
    for p, pr, g in zip(problems, prompts, gens):
        T = _think_len(g, close_id)
        bounds = [t + 1 for t in range(T or 0) if g[t] == para_id]
        out.append(Trace(p.id, p.question, str(p.answer), split, pr + g, len(pr), T,
                         len(p.steps), task.parse_answer(tok.decode(g)), bounds))
    return out


def label_confidence(target, tok, traces: List[Trace], cfg: TraceConfig,
                     progress: bool = False) -> None:
    """Fill ``boundary_correct`` and ``empty_correct`` by forced-exit greedy decoding."""
    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)
    prompts, where = [], []
    for i, tr in enumerate(traces):
        if tr.think_len is None:
            continue
        prompts.append(tr.ids[: tr.prompt_len] + [close_id])
        where.append((i, None))
        for j, t in enumerate(tr.boundaries):
            prompts.append(tr.ids[: tr.prompt_len + t] + [close_id])
            where.append((i, j))
    gens = greedy_generate(target, prompts, cfg.answer_max_new_tokens, cfg.batch_size, progress)
    for tr in traces:
        tr.boundary_correct = [NOT_LABELLED] * len(tr.boundaries)
    for (i, j), g in zip(where, gens):
        ok = int(task.parse_answer(tok.decode(g)) == traces[i].answer)
        if j is None:
            traces[i].empty_correct = ok
        else:
            traces[i].boundary_correct[j] = ok


def paragraphs_done(tr: Trace, j: int) -> int:
    """Paragraphs finished at boundary ``j`` (its 1-based index)."""
    return j + 1


def answer_computed(tr: Trace, j: int) -> bool:
    """Structural label: at boundary ``j`` every ``Step`` paragraph is written."""
    return paragraphs_done(tr, j) >= tr.num_steps


def build_traces(out_dir: str, seed: int, cfg: TraceConfig, progress: bool = True) -> dict:
    """Stage entry: write ``out_dir/traces.pt`` unless it exists; return a summary."""
    path = os.path.join(out_dir, "traces.pt")
    if os.path.exists(path):
        traces = load_traces(out_dir)
    else:
        from sglang_ext.testbed.train_target import load_target

        tok = build_tokenizer()
        target = load_target(os.path.join(out_dir, "target"))
        train_p = task.generate_problems(cfg.num_train, random.Random(f"sglang_ext-traces-{seed}"),
                                         "train-")
        held_p = task.generate_problems(cfg.num_heldout, random.Random(f"sglang_ext-heldout-{seed}"),
                                        "heldout-")
        train = make_traces(target, tok, train_p, "train", cfg, progress)
        held = make_traces(target, tok, held_p, "heldout", cfg, progress)
        label_confidence(target, tok, train[: cfg.num_signal_train] + held, cfg, progress)
        traces = train + held
        save_atomic([asdict(t) for t in traces], path)
    return summarize(traces)


def load_traces(out_dir: str) -> List[Trace]:
    return [Trace(**d) for d in torch.load(os.path.join(out_dir, "traces.pt"), weights_only=False)]


def summarize(traces: List[Trace]) -> dict:
    out = {}
    for split in ("train", "heldout"):
        ts = [t for t in traces if t.split == split]
        if not ts:
            continue
        out[split] = {
            "n": len(ts),
            "accuracy": sum(t.correct for t in ts) / len(ts),
            "closed_think": sum(t.think_len is not None for t in ts) / len(ts),
            "mean_think_len": sum(t.think_len or 0 for t in ts) / len(ts),
        }
    return out

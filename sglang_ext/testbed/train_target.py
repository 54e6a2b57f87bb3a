"""Stage 1: train the thinking target (``LlamaForCausalLM``) from scratch on generated traces.

Each step draws a fresh batch of problems from a RNG seeded by ``(seed, step)``, so a
resumed run sees exactly the batches an uninterrupted one would.  A checkpoint
(model, optimizer, step, loss history) is written every ``ckpt_every`` steps; the
final model is saved as a HF directory (``config.json``, ``model.safetensors``,
``generation_config.json``, tokenizer files).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from sglang_ext.testbed import task
from sglang_ext.testbed.common import Example, collate, encode_example, encode_prompt, greedy_generate, \
    load_if_exists, lr_at, save_atomic
from sglang_ext.testbed.modeling import IGNORE_INDEX, ModelShape, aux_layer_ids, build_target
from sglang_ext.testbed.tokenizer import build_tokenizer, save_tokenizer

#: Fraction of training sequences without thinking (``enable_thinking=False`` prompts).
P_NO_THINK = 0.05


@dataclass(frozen=True)
class TargetTrainConfig:
    """Three phases, each with a fresh optimizer, own warm-up and cosine decay:

    1. ``steps`` on the reference trace distribution;
    2. ``arith_steps`` with more operations per problem and the loss on the result
       tokens of each ``a op b = c`` weighted by ``result_weight``;
    3. ``drill_steps`` of arithmetic drill: larger batches where a fraction
       ``1 - drill_full_fraction`` of the sequences is cut right after the
       ``So the result is`` paragraph (no ``</think>``, so the learnt chance of ending
       the think span is untouched), the rest full traces.

    The templates are learnt in a few hundred steps, exact arithmetic much later."""

    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 40
    weight_decay: float = 0.01
    ckpt_every: int = 25
    eval_every: int = 150
    eval_problems: int = 32
    arith_steps: int = 400
    arith_lr: float = 1e-3
    arith_warmup: int = 20
    result_weight: float = 5.0
    #: Operand-count weights (2, 3, 4 operands) of phase-2 problems.
    arith_operand_weights: Tuple[float, float, float] = (0.2, 0.3, 0.5)
    #: Phase 2 also trains a throwaway linear head (no bias) on the EAGLE3 features to
    #: read progress and log-remain of the think span (weight of that loss; 0 = off), so
    #: that the features the SpecExit rows probe encode them linearly.  The head is not
    #: part of the target; the SpecExit rows are fitted afresh in stage 4.
    aux_signal_weight: float = 0.5
    drill_steps: int = 300
    drill_lr: float = 5e-4
    drill_warmup: int = 10
    drill_batch_size: int = 64
    drill_full_fraction: float = 0.25


def batch_for_step(tok, seed: int, step: int, batch_size: int):
    """The training batch of ``step``: a pure function of ``(seed, step)``."""
    rng = random.Random(f"sglang_ext-target-{seed}-{step}")
    examples = []
    for p in task.generate_problems(batch_size, rng):
        thinking = rng.random() >= P_NO_THINK
        examples.append(encode_example(tok, p, task.sample_num_rechecks(rng), thinking))
    return collate(examples)


def _weighted_problem(rng: random.Random, pid: str, operand_weights: Sequence[float]) -> task.Problem:
    """A problem with 2, 3 or 4 operands drawn with ``operand_weights`` (phases 2 and 3)."""
    k = rng.choices((2, 3, 4), weights=operand_weights)[0]
    operands = tuple(rng.randint(0, task.MAX_OPERAND_VALUE) for _ in range(k))
    ops = tuple(rng.choice(task.OPS) for _ in range(k - 1))
    return task.Problem(pid, operands, ops)


def arith_batch_for_step(tok, seed: int, step: int, batch_size: int,
                         operand_weights: Sequence[float]):
    """Phase-2 batch of ``step`` (pure function of ``(seed, step)``)."""
    rng = random.Random(f"sglang_ext-target-arith-{seed}-{step}")
    examples = []
    for i in range(batch_size):
        p = _weighted_problem(rng, str(i), operand_weights)
        thinking = rng.random() >= P_NO_THINK
        examples.append(encode_example(tok, p, task.sample_num_rechecks(rng), thinking))
    return collate(examples)


def drill_batch_for_step(tok, seed: int, step: int, batch_size: int,
                         operand_weights: Sequence[float], full_fraction: float):
    """Phase-3 batch of ``step`` (pure function of ``(seed, step)``); see :class:`TargetTrainConfig`."""
    rng = random.Random(f"sglang_ext-target-drill-{seed}-{step}")
    examples = []
    for i in range(batch_size):
        p = _weighted_problem(rng, str(i), operand_weights)
        if rng.random() < full_fraction:
            thinking = rng.random() >= P_NO_THINK
            examples.append(encode_example(tok, p, task.sample_num_rechecks(rng), thinking))
        else:
            prompt = encode_prompt(tok, p.question)
            paras = task.think_paragraphs(p, 0)  # steps + result paragraph
            body = "".join(x + task.PARAGRAPH_BREAK for x in paras)
            examples.append(Example(prompt + tok.encode(body, add_special_tokens=False), len(prompt)))
    return collate(examples)


def result_token_weights(labels: torch.Tensor, eq_id: int, stop_id: int, weight: float) -> torch.Tensor:
    """Loss weights ``# [batch_size, seq_len]``: ``weight`` on the tokens between ``" ="``
    and the next ``"."`` (the result of an equation), 1 on other labelled tokens, 0 elsewhere.

    Examples
    --------
    >>> lab = torch.tensor([[-100, 7, 9, 5, 5, 8, 7]])   # ... = 5 5 . x
    >>> result_token_weights(lab, eq_id=9, stop_id=8, weight=3.0).tolist()
    [[0.0, 1.0, 1.0, 3.0, 3.0, 1.0, 1.0]]
    """
    w = (labels != IGNORE_INDEX).float()
    for r in range(labels.shape[0]):
        inside = False
        for c, t in enumerate(labels[r].tolist()):
            if t == stop_id:
                inside = False
            elif inside and t != IGNORE_INDEX:
                w[r, c] = weight
            if t == eq_id:
                inside = True
    return w


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token CE, ``logits`` ``# [B, S, V]`` predicting ``labels[:, 1:]`` with ``weights[:, 1:]``."""
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                         ignore_index=IGNORE_INDEX, reduction="none")
    w = weights[:, 1:].reshape(-1)
    return (ce * w).sum() / w.sum().clamp(min=1.0)


def think_span_targets(ids: torch.Tensor, labels: torch.Tensor, think_close_id: int):
    """Progress and log-remain targets of think positions of reference sequences.

    Position ``p`` holds the ``t``-th generated token (``t = p - prompt_len + 1``) and
    belongs to the think span when ``t <= T`` (``T``: generated tokens before ``</think>``).

    Returns
    -------
    progress, log_remain : torch.Tensor
        ``# [batch_size, seq_len]`` (0 outside the span).
    mask : torch.Tensor
        ``# [batch_size, seq_len]`` bool, think positions.

    Examples
    --------
    >>> ids = torch.tensor([[5, 5, 7, 7, 7, 4, 9]])            # prompt 2, T = 3
    >>> lab = torch.tensor([[-100, -100, 7, 7, 7, 4, 9]])
    >>> prog, logrem, mask = think_span_targets(ids, lab, 4)
    >>> mask.tolist(), [round(x, 3) for x in prog[0].tolist()]
    ([[False, False, True, True, True, False, False]], [0.0, 0.0, 0.333, 0.667, 1.0, 0.0, 0.0])
    """
    B, S = ids.shape
    prog = torch.zeros(B, S)
    logrem = torch.zeros(B, S)
    mask = torch.zeros(B, S, dtype=torch.bool)
    for r in range(B):
        lab = labels[r].tolist()
        if all(x == IGNORE_INDEX for x in lab):
            continue
        start = next(i for i, x in enumerate(lab) if x != IGNORE_INDEX)
        row = ids[r].tolist()
        if think_close_id not in row[start:]:
            continue
        close = row.index(think_close_id, start)
        T = close - start
        if T <= 0:
            continue
        t = torch.arange(1, T + 1, dtype=torch.float32)
        prog[r, start:close] = t / T
        logrem[r, start:close] = torch.log((T - t).clamp(min=1.0))
        mask[r, start:close] = True
    return prog, logrem, mask


def evaluate_target(model, tok, problems: List[task.Problem], max_new_tokens: int = 320) -> dict:
    """Greedy accuracy, mean re-check paragraphs and completion rate on ``problems``."""
    prompts = [encode_prompt(tok, p.question) for p in problems]
    gens = greedy_generate(model, prompts, max_new_tokens)
    texts = [tok.decode(g, skip_special_tokens=False) for g in gens]
    correct = [task.parse_answer(t) == str(p.answer) for t, p in zip(texts, problems)]
    closed = [task.THINK_CLOSE in t for t in texts]
    return {
        "accuracy": sum(correct) / len(problems),
        "mean_rechecks": sum(task.count_rechecks(t) for t in texts) / len(problems),
        "closed_think": sum(closed) / len(problems),
        "mean_tokens": sum(len(g) for g in gens) / len(problems),
    }


@dataclass
class TargetPhase:
    """One phase of the target's training (see :class:`TargetTrainConfig`).

    ``make_batch(step) -> (input_ids, labels, lengths)`` is a pure function of the step;
    ``weights_fn(labels)`` gives per-token loss weights (None: plain LM loss);
    ``aux_fn(hidden_states, ids, labels, head) -> loss`` adds an auxiliary loss on the HF
    ``hidden_states`` with the extra trainable ``aux_head``.
    """

    name: str
    ckpt_name: str
    steps: int
    lr: float
    warmup: int
    make_batch: Callable[[int], tuple]
    weights_fn: Optional[Callable] = None
    aux_fn: Optional[Callable] = None
    aux_head: Optional[torch.nn.Module] = None


def target_phases(tok, seed: int, shape: ModelShape, cfg: TargetTrainConfig) -> List[TargetPhase]:
    """The phases of :func:`train_target`, in order (1 to 3 of them).

    Examples
    --------
    >>> from sglang_ext.testbed.modeling import QUICK_SHAPE
    >>> from sglang_ext.testbed.tokenizer import build_tokenizer
    >>> [p.name for p in target_phases(build_tokenizer(), 0, QUICK_SHAPE, TargetTrainConfig())]
    ['target', 'target-arith', 'target-drill']
    """
    phases = [TargetPhase("target", "target_ckpt.pt", cfg.steps, cfg.lr, cfg.warmup,
                          lambda step: batch_for_step(tok, seed, step, cfg.batch_size))]
    if cfg.arith_steps <= 0:
        return phases
    eq_id = tok.convert_tokens_to_ids(" =")
    stop_id = tok.convert_tokens_to_ids(".")
    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)
    aux_head, aux_fn = None, None
    if cfg.aux_signal_weight > 0:
        aux_ids = aux_layer_ids(shape.num_layers)  # EAGLE3's capture layers: >= 7 layers
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 2)
            aux_head = torch.nn.Linear(3 * shape.hidden_size, 2, bias=False)
        torch.nn.init.zeros_(aux_head.weight)

        def aux_fn(hidden_states, ids, labels, head):
            feats = torch.cat([hidden_states[i] for i in aux_ids], dim=-1)
            prog, logrem, mask = think_span_targets(ids, labels, close_id)
            if not mask.any():
                return feats.sum() * 0.0
            z = head(feats[mask])
            return cfg.aux_signal_weight * (
                F.mse_loss(torch.sigmoid(z[:, 0]), prog[mask]) * 10.0
                + F.mse_loss(z[:, 1], logrem[mask]))

    def weights_fn(labels):
        return result_token_weights(labels, eq_id, stop_id, cfg.result_weight)

    phases.append(TargetPhase(
        "target-arith", "target_arith_ckpt.pt", cfg.arith_steps, cfg.arith_lr, cfg.arith_warmup,
        lambda step: arith_batch_for_step(tok, seed, step, cfg.batch_size, cfg.arith_operand_weights),
        weights_fn, aux_fn, aux_head))
    if cfg.drill_steps > 0:
        phases.append(TargetPhase(
            "target-drill", "target_drill_ckpt.pt", cfg.drill_steps, cfg.drill_lr, cfg.drill_warmup,
            lambda step: drill_batch_for_step(tok, seed, step, cfg.drill_batch_size,
                                              cfg.arith_operand_weights, cfg.drill_full_fraction),
            weights_fn, aux_fn, aux_head))
    return phases


def phase_optimizer(model, phase: TargetPhase, cfg: TargetTrainConfig):
    """``(params, AdamW)`` of ``phase``: the model's parameters and the phase's ``aux_head``."""
    aux = list(phase.aux_head.parameters()) if phase.aux_head is not None else []
    params = list(model.parameters()) + aux
    opt = torch.optim.AdamW(params, lr=phase.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    return params, opt


def train_step(model, opt, params, phase: TargetPhase, ids: torch.Tensor,
               labels: torch.Tensor) -> float:
    """One optimizer step of ``phase`` on a batch; returns the loss.

    ``ids``, ``labels``: ``# [batch_size, seq_len]`` (from ``phase.make_batch``). The
    caller sets the learning rate and ``model.train()``.
    """
    if phase.weights_fn is None and phase.aux_fn is None:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    else:
        out = model(input_ids=ids, use_cache=False, output_hidden_states=phase.aux_fn is not None)
        w = phase.weights_fn(labels) if phase.weights_fn is not None else (labels != IGNORE_INDEX).float()
        loss = weighted_lm_loss(out.logits, labels, w)
        if phase.aux_fn is not None:
            loss = loss + phase.aux_fn(out.hidden_states, ids, labels, phase.aux_head)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item()


def phase_eval_steps(steps: int, eval_every: int) -> List[int]:
    """Steps (1-based counts done) after which a phase of ``steps`` evaluates (not the last).

    Examples
    --------
    >>> phase_eval_steps(600, 150), phase_eval_steps(40, 0)
    ([150, 300, 450], [])
    """
    return [d for d in range(1, steps + 1) if eval_every and d % eval_every == 0 and d < steps]


def _train_phase(model, tok, ckpt_path: str, phase: TargetPhase, cfg: TargetTrainConfig,
                 eval_problems, progress: bool):
    """One phase with its own AdamW and schedule; resumes from / writes ``ckpt_path``."""
    from tqdm import tqdm

    name, steps, aux_head = phase.name, phase.steps, phase.aux_head
    params, opt = phase_optimizer(model, phase, cfg)
    start, losses, evals = 0, [], []
    ck = load_if_exists(ckpt_path)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        if aux_head is not None:
            aux_head.load_state_dict(ck["aux_head"])
        start, losses, evals = ck["step"], ck["losses"], ck["evals"]

    def checkpoint(step):
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                 "losses": losses, "evals": evals}
        if aux_head is not None:
            state["aux_head"] = aux_head.state_dict()
        save_atomic(state, ckpt_path)

    eval_at = set(phase_eval_steps(steps, cfg.eval_every))
    bar = tqdm(range(start, steps), desc=name, disable=not progress, initial=start, total=steps)
    for step in bar:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, phase.lr, phase.warmup)
        ids, labels, _ = phase.make_batch(step)
        losses.append(train_step(model, opt, params, phase, ids, labels))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        done = step + 1
        if done in eval_at:
            ev = evaluate_target(model, tok, eval_problems)
            ev["step"] = done
            ev["phase"] = name
            evals.append(ev)
            bar.write(f"{name} step {done}: {json.dumps(ev)}")
        if done % cfg.ckpt_every == 0 or done == steps:
            checkpoint(done)
    return losses, evals


def train_target(out_dir: str, seed: int, shape: ModelShape, cfg: TargetTrainConfig,
                 progress: bool = True) -> dict:
    """Train (or resume, or skip when done) the target; returns the training record.

    Writes ``out_dir/target/`` (final HF model) and one checkpoint per phase
    (``target_ckpt.pt``, ``target_arith_ckpt.pt``, ``target_drill_ckpt.pt``).
    """
    final_dir = os.path.join(out_dir, "target")
    record_path = os.path.join(out_dir, "target_record.json")
    if os.path.exists(os.path.join(final_dir, "model.safetensors")) and os.path.exists(record_path):
        with open(record_path) as f:
            return json.load(f)

    tok = build_tokenizer()
    model = build_target(shape, seed)
    eval_problems = target_eval_problems(cfg, seed)
    losses, evals = [], []
    for phase in target_phases(tok, seed, shape, cfg):
        lp, ep = _train_phase(model, tok, os.path.join(out_dir, phase.ckpt_name), phase, cfg,
                              eval_problems, progress)
        losses, evals = losses + lp, evals + ep

    final_eval = evaluate_target(model, tok, eval_problems)
    final_eval["step"] = cfg.steps + cfg.arith_steps + (cfg.drill_steps if cfg.arith_steps else 0)
    evals.append(final_eval)
    save_target(model, final_dir)
    record = {"losses": losses, "evals": evals, "shape": shape.__dict__, "seed": seed,
              "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items()}}
    with open(record_path, "w") as f:
        json.dump(record, f)
    return record


def target_eval_problems(cfg: TargetTrainConfig, seed: int) -> List[task.Problem]:
    """The fixed monitoring problems of the target's periodic greedy evaluations."""
    return task.generate_problems(
        cfg.eval_problems, random.Random(f"sglang_ext-target-eval-{seed}"), "eval-")


def save_target(model, final_dir: str) -> None:
    """HF directory loadable by transformers and by SGLang's ``LlamaForCausalLM``."""
    os.makedirs(final_dir, exist_ok=True)
    model.generation_config.eos_token_id = [2, 0]
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    model.generation_config.do_sample = False
    model.save_pretrained(final_dir, safe_serialization=True)
    save_tokenizer(final_dir)


def load_target(target_dir: str):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model.eval()
    return model

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
from typing import List

import torch

from sglang_ext.testbed import task
from sglang_ext.testbed.common import collate, encode_example, encode_prompt, greedy_generate, \
    load_if_exists, lr_at, save_atomic
from sglang_ext.testbed.modeling import ModelShape, build_target
from sglang_ext.testbed.tokenizer import build_tokenizer, save_tokenizer

#: Fraction of training sequences without thinking (``enable_thinking=False`` prompts).
P_NO_THINK = 0.05


@dataclass(frozen=True)
class TargetTrainConfig:
    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 40
    weight_decay: float = 0.01
    ckpt_every: int = 25
    eval_every: int = 150
    eval_problems: int = 32


def batch_for_step(tok, seed: int, step: int, batch_size: int):
    """The training batch of ``step``: a pure function of ``(seed, step)``."""
    rng = random.Random(f"sglang_ext-target-{seed}-{step}")
    examples = []
    for p in task.generate_problems(batch_size, rng):
        thinking = rng.random() >= P_NO_THINK
        examples.append(encode_example(tok, p, task.sample_num_rechecks(rng), thinking))
    return collate(examples)


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


def train_target(out_dir: str, seed: int, shape: ModelShape, cfg: TargetTrainConfig,
                 progress: bool = True) -> dict:
    """Train (or resume, or skip when done) the target; returns the training record.

    Writes ``out_dir/target/`` (final HF model) and ``out_dir/target_ckpt.pt``.
    """
    from tqdm import tqdm

    final_dir = os.path.join(out_dir, "target")
    record_path = os.path.join(out_dir, "target_record.json")
    if os.path.exists(os.path.join(final_dir, "model.safetensors")) and os.path.exists(record_path):
        with open(record_path) as f:
            return json.load(f)

    tok = build_tokenizer()
    model = build_target(shape, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    ckpt_path = os.path.join(out_dir, "target_ckpt.pt")
    start, losses, evals = 0, [], []
    ck = load_if_exists(ckpt_path)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start, losses, evals = ck["step"], ck["losses"], ck["evals"]
    eval_problems = task.generate_problems(
        cfg.eval_problems, random.Random(f"sglang_ext-target-eval-{seed}"), "eval-")

    def checkpoint(step):
        save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                     "losses": losses, "evals": evals}, ckpt_path)

    bar = tqdm(range(start, cfg.steps), desc="target", disable=not progress,
               initial=start, total=cfg.steps)
    for step in bar:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        ids, labels, _ = batch_for_step(tok, seed, step, cfg.batch_size)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            ev = evaluate_target(model, tok, eval_problems)
            ev["step"] = done
            evals.append(ev)
            bar.write(f"target step {done}: {json.dumps(ev)}")
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            checkpoint(done)

    final_eval = evaluate_target(model, tok, eval_problems)
    final_eval["step"] = cfg.steps
    evals.append(final_eval)
    save_target(model, final_dir)
    record = {"losses": losses, "evals": evals, "shape": shape.__dict__, "seed": seed,
              "config": cfg.__dict__}
    with open(record_path, "w") as f:
        json.dump(record, f)
    return record


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

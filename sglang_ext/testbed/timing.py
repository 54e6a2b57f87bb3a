"""Time estimate of a training run without running it (``train --estimate-time``).

    python -m sglang_ext.testbed.train --estimate-time --threads 1          # the full run
    python -m sglang_ext.testbed.train --estimate-time --quick --timed-steps 1

Builds every stage in the configuration of the run (:func:`stages.stage_config`: same
model shapes, batch sizes, sequence lengths and step counts), times a few units of each
stage with the stage's own functions (``train_target.train_step`` on the batches of
sampled steps, ``traces.make_traces`` / ``label_confidence`` on sampled problems,
``train_draft.cache_features`` / ``draft_train_step``, ``train_signals.signal_data`` /
``fit_probe``, ``check.check_traces``, one checkpoint save), and projects each stage as
units in the run x seconds per unit.  Nothing is written into a run directory or the
committed models (the checkpoint save goes to a temporary directory).

Greedy decoding time depends on how long the model writes, so the decode stages use
the committed target (``models/target``) when it has the run's shape: it writes what
the trained target writes.  Otherwise (``--quick``) they use the model being timed.

Three clocks per unit: process CPU time (``time.process_time``: every thread of the
process, excluding time spent waiting for a CPU, so it is meaningful on a loaded
machine), CPU time of the main thread (``time.thread_time``) and wall time.  The
projected *idle* time assumes an idle machine: with one thread it is the process CPU
time; with ``T > 1`` threads it is ``max(main, (process - main) / (T - 1))``, the busiest
thread, a lower bound on the wall time (it ignores the waits at the end of each parallel
region).  With ``T > 1`` set ``OMP_WAIT_POLICY=PASSIVE``: OpenMP threads otherwise spin
while waiting, and on a loaded machine the spinning inflates their CPU time.

No SGLang import.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable, List, Optional, Sequence

import torch

#: The committed models (decode stages use their target when it has the run's shape).
MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


@dataclass
class StageTime:
    """Measured cost of one stage part.

    ``count`` units in the run (may be fractional where it is itself estimated, e.g.
    forced-exit prompts), ``timed`` units measured; seconds per unit on three clocks.
    """

    stage: str
    unit: str
    count: float
    timed: int
    cpu_s: float
    main_s: float
    wall_s: float

    def idle_s(self, threads: int) -> float:
        """Seconds per unit on an idle machine (see module docstring).

        Examples
        --------
        >>> StageTime("x", "step", 10, 2, cpu_s=3.0, main_s=1.6, wall_s=9.0).idle_s(2)
        1.6
        """
        if threads <= 1:
            return self.cpu_s
        return max(self.main_s, (self.cpu_s - self.main_s) / (threads - 1))

    def idle_min(self, threads: int) -> float:
        return self.count * self.idle_s(threads) / 60.0

    def wall_min(self) -> float:
        return self.count * self.wall_s / 60.0


@dataclass
class Estimate:
    quick: bool
    threads: int
    seed: int
    decode_model: str
    rows: List[StageTime] = field(default_factory=list)
    load_before: Sequence[float] = ()
    load_after: Sequence[float] = ()
    omp_wait_policy: Optional[str] = None
    elapsed_s: float = 0.0

    def total_idle_min(self) -> float:
        return sum(r.idle_min(self.threads) for r in self.rows)

    def total_wall_min(self) -> float:
        return sum(r.wall_min() for r in self.rows)


class _Clock:
    """Accumulates process CPU, main-thread CPU and wall seconds over ``with`` blocks."""

    def __init__(self):
        self.cpu = self.main = self.wall = 0.0

    def __enter__(self):
        self._t = (time.process_time(), time.thread_time(), time.perf_counter())
        return self

    def __exit__(self, *exc):
        c, m, w = self._t
        self.cpu += time.process_time() - c
        self.main += time.thread_time() - m
        self.wall += time.perf_counter() - w
        return False

    def row(self, stage: str, unit: str, count: float, timed: float) -> StageTime:
        n = max(timed, 1e-9)
        return StageTime(stage, unit, count, int(round(timed)), self.cpu / n, self.main / n,
                         self.wall / n)


def _sample(n_total: int, k: int) -> List[int]:
    """``k`` (distinct when possible) indices spread evenly over ``range(n_total)``.

    Examples
    --------
    >>> _sample(600, 4), _sample(3, 5)
    ([75, 225, 375, 525], [0, 1, 2])
    """
    k = min(k, n_total)
    return sorted({int((i + 0.5) * n_total / k) for i in range(k)})


def _shape_matches(target, shape) -> bool:
    c = target.config
    return (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
            c.vocab_size) == (shape.hidden_size, shape.num_layers, shape.num_heads,
                              shape.intermediate_size, shape.vocab_size)


def _tile(x: torch.Tensor, reps: int, size: int) -> torch.Tensor:
    """``x`` ``# [n, ...]`` repeated ``reps`` times along dim 0, cut to ``size`` rows."""
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:size]


def _timed(clock: _Clock, fn: Callable[[], object]):
    with clock:
        return fn()


def _time_train_steps(module, opt, steps: List[int], total: int, lr: float, warmup: int,
                      run_step: Callable[[int], object]) -> _Clock:
    """Run ``run_step(step)`` for each of ``steps`` with the training schedule's learning rate
    (as the real loop sets it); the first step is an untimed warm-up, the others are timed."""
    from sglang_ext.testbed.common import lr_at

    clock = _Clock()
    for j, step in enumerate(steps):
        module.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, lr, warmup)
        if j == 0:
            run_step(step)
        else:
            _timed(clock, lambda: run_step(step))
    return clock


def estimate(seed: int = 0, quick: bool = False, threads: int = 1, timed_steps: int = 3,
             progress: bool = True, models_dir: Optional[str] = MODELS_DIR) -> Estimate:
    """Time ``timed_steps`` units of every stage of the run ``train --seed seed [--quick]``.

    Each timed loop is preceded by one untimed warm-up unit (first-call allocations).

    Examples
    --------
    >>> est = estimate(quick=True, timed_steps=1, progress=False)   # doctest: +SKIP
    >>> [r.stage for r in est.rows][:3]                              # doctest: +SKIP
    ['target phase 1', 'target phase 2', 'target phase 3']
    """
    from sglang_ext.testbed import task
    from sglang_ext.testbed.check import check_traces
    from sglang_ext.testbed.common import encode_prompt, greedy_generate, save_atomic
    from sglang_ext.testbed.modeling import DraftConfig, build_target
    from sglang_ext.testbed.tokenizer import build_tokenizer
    from sglang_ext.testbed.stages import stage_config
    from sglang_ext.testbed.traces import label_confidence, make_traces
    from sglang_ext.testbed.train_draft import cache_features, draft_batch, draft_optimizer, \
        draft_train_step, init_draft
    from sglang_ext.testbed.train_signals import SignalData, fit_probe, labelled, signal_data
    from sglang_ext.testbed.train_target import evaluate_target, load_target, phase_eval_steps, \
        phase_optimizer, target_eval_problems, target_phases, train_step

    t_start = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    n = max(1, timed_steps)
    shape = stage_config("shape", quick)
    tcfg = stage_config("target", quick)
    rcfg = stage_config("traces", quick)
    dcfg = stage_config("draft", quick)
    scfg = stage_config("signals", quick)
    est = Estimate(quick, threads, seed, "", load_before=os.getloadavg(),
                   omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))

    def say(msg: str) -> None:
        if progress:
            print(f"[estimate {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    tok = build_tokenizer()

    # -- stage 1: target phases (fresh model, batches of steps spread over each phase)
    model = build_target(shape, seed)
    phases = target_phases(tok, seed, shape, tcfg)
    saves = 0
    for i, phase in enumerate(phases):
        params, opt = phase_optimizer(model, phase, tcfg)
        steps = _sample(phase.steps, n + 1)

        def one(step, phase=phase, opt=opt, params=params):
            ids, labels, _ = phase.make_batch(step)
            return train_step(model, opt, params, phase, ids, labels)

        clock = _time_train_steps(model, opt, steps, phase.steps, phase.lr, phase.warmup, one)
        est.rows.append(clock.row(f"target phase {i + 1}", "step", phase.steps, len(steps) - 1))
        saves += sum(1 for d in range(1, phase.steps + 1) if d % tcfg.ckpt_every == 0 or d == phase.steps)
        say(f"target phase {i + 1} ({phase.name}): {est.rows[-1].cpu_s:.3f} cpu s/step")
        if i == 0:  # checkpoint save: model + AdamW state, as _train_phase writes it
            clock = _Clock()
            with tempfile.TemporaryDirectory() as tmp:
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 0,
                         "losses": [], "evals": []}
                path = os.path.join(tmp, "ckpt.pt")
                save_atomic(state, path)
                for _ in range(n):
                    _timed(clock, lambda: save_atomic(state, path))
            save_row = clock
    model.eval()

    decoder, est.decode_model = model, "model being timed (untrained: decodes to the token limit)"
    if models_dir and os.path.exists(os.path.join(models_dir, "target", "config.json")):
        committed = load_target(os.path.join(models_dir, "target"))
        if _shape_matches(committed, shape):
            decoder, est.decode_model = committed, "committed target"
    for p in decoder.parameters():
        p.requires_grad_(False)
    greedy_generate(decoder, [encode_prompt(tok, "Compute: 1 + 2")], 4)  # warm-up

    n_evals = sum(len(phase_eval_steps(p.steps, tcfg.eval_every)) for p in phases) + 1
    eval_problems = target_eval_problems(tcfg, seed)
    clock = _Clock()
    _timed(clock, lambda: evaluate_target(decoder, tok, eval_problems))
    est.rows.append(clock.row("target evals", "eval", n_evals, 1))
    say(f"target eval: {est.rows[-1].cpu_s:.3f} cpu s")

    # -- stage 2: greedy traces (batches of the length-sorted problems, as greedy_generate cuts them)
    train_p = task.generate_problems(rcfg.num_train, random.Random(f"sglang_ext-traces-{seed}"), "train-")
    order = sorted(range(len(train_p)), key=lambda i: len(encode_prompt(tok, train_p[i].question)))
    chunks = [order[s : s + rcfg.batch_size] for s in range(0, len(order), rcfg.batch_size)]
    clock = _Clock()
    traces = []
    timed_problems = 0
    for c in _sample(len(chunks), n):
        probs = [train_p[i] for i in chunks[c]]
        traces += _timed(clock, lambda: make_traces(decoder, tok, probs, "train", rcfg))
        timed_problems += len(probs)
    est.rows.append(clock.row("greedy traces", "problem", rcfg.num_train + rcfg.num_heldout,
                              timed_problems))
    say(f"greedy traces: {est.rows[-1].cpu_s:.3f} cpu s/problem ({len(traces)} traces)")

    # forced-exit label decodes: one prompt per boundary + the empty think span
    closed = [t for t in traces if t.think_len is not None]
    per_trace = sum(1 + len(t.boundaries) for t in closed) / max(1, len(closed))
    k = max(1, min(len(closed), round(n * rcfg.batch_size / per_trace)))  # about n decode batches
    subset = [closed[i] for i in _sample(len(closed), k)]  # spread over the problem lengths
    prompts = sum(1 + len(t.boundaries) for t in subset)
    clock = _Clock()
    _timed(clock, lambda: label_confidence(decoder, tok, subset, rcfg))
    n_labelled = min(rcfg.num_signal_train, rcfg.num_train) + rcfg.num_heldout
    est.rows.append(clock.row("forced-exit labels", "prompt", n_labelled * per_trace, prompts))
    say(f"labels: {est.rows[-1].cpu_s:.4f} cpu s/prompt ({per_trace:.1f} prompts/trace)")

    # -- stage 3: draft (features cached once, then training-time-test steps)
    draft_cfg = DraftConfig.from_shape(shape)
    feat_traces = [traces[k] for k in _sample(len(traces), max(n, 2) * 32)]
    clock = _Clock()
    feats_cache = _timed(clock, lambda: cache_features(decoder, feat_traces))
    est.rows.append(clock.row("draft features", "trace", rcfg.num_train if dcfg.cache_features else 0,
                              len(feat_traces)))
    draft = init_draft(decoder, draft_cfg, seed)
    dparams, dopt = draft_optimizer(draft, dcfg)
    dsteps = _sample(dcfg.steps, n + 1)

    def dstep(step):
        ids, labels, _, feats = draft_batch(feat_traces, seed, step, dcfg.batch_size,
                                            feats_cache if dcfg.cache_features else None)
        return draft_train_step(draft, dopt, dparams, decoder, ids, labels, feats, dcfg)

    clock = _time_train_steps(draft, dopt, dsteps, dcfg.steps, dcfg.lr, dcfg.warmup, dstep)
    est.rows.append(clock.row("draft", "step", dcfg.steps, len(dsteps) - 1))
    saves += sum(1 for d in range(1, dcfg.steps + 1) if d % dcfg.ckpt_every == 0 or d == dcfg.steps)
    say(f"draft: {est.rows[-1].cpu_s:.3f} cpu s/step")
    draft.eval()

    # -- stage 4: signal rows (features of labelled traces, then the probe fit)
    lab = labelled(subset)
    clock = _Clock()
    data = _timed(clock, lambda: signal_data(decoder, lab, scfg.feature_batch))
    est.rows.append(clock.row("signal features", "trace", min(rcfg.num_signal_train, rcfg.num_train),
                              len(lab)))
    think = sum(t.think_len for t in lab) / max(1, len(lab))
    positions = int(round(min(rcfg.num_signal_train, rcfg.num_train) * think))
    reps = -(-positions // max(1, len(data.progress)))
    full = SignalData(*(_tile(getattr(data, f.name), reps, positions) for f in fields(SignalData)))
    iters = min(scfg.iters, max(2, 2 * n))
    fit_probe(full, replace(scfg, iters=1))  # warm-up
    clock = _Clock()
    _timed(clock, lambda: fit_probe(full, replace(scfg, iters=iters)))
    est.rows.append(clock.row(f"signal fit ({positions} positions)", "iter", scfg.iters, iters))
    del full
    say(f"signals: {est.rows[-1].cpu_s:.4f} cpu s/iter")

    # -- stage 5: offline check on held-out traces (accept length + signal metrics)
    held = [subset[i] for i in _sample(len(subset), 16)]
    clock = _Clock()
    _timed(clock, lambda: check_traces(decoder, draft, tok, held))
    est.rows.append(clock.row("check", "trace", rcfg.num_heldout, len(held)))

    est.rows.append(save_row.row("checkpoint saves", "save", saves, n))
    est.load_after = os.getloadavg()
    est.elapsed_s = time.perf_counter() - t_start
    say("done")
    return est


def format_table(est: Estimate) -> str:
    """The estimate as a plain-text table (one row per stage part, then the total)."""
    cmd = "python -m sglang_ext.testbed.train --out runs/full --seed 0" + (" --quick" if est.quick else "")
    cmd += f" --threads {est.threads}"
    lines = [
        f"time estimate of `{cmd}` ({'quick' if est.quick else 'full'} configuration, "
        f"{est.threads} thread(s), seed {est.seed}; decode stages use the {est.decode_model})",
        "idle = projected on an idle machine from CPU time (1 thread: process CPU; T threads: "
        "busiest thread); wall = at the load of this measurement",
        f"{'stage':<34} {'unit':<7} {'count':>7} {'timed':>5} {'cpu s/unit':>11} {'main s/unit':>11} "
        f"{'wall s/unit':>11} {'idle min':>9} {'wall min':>9}",
    ]
    for r in est.rows:
        lines.append(f"{r.stage:<34} {r.unit:<7} {r.count:>7.0f} {r.timed:>5d} {r.cpu_s:>11.4f} "
                     f"{r.main_s:>11.4f} {r.wall_s:>11.4f} {r.idle_min(est.threads):>9.2f} "
                     f"{r.wall_min():>9.2f}")
    lines.append(f"{'total':<34} {'':<7} {'':>7} {'':>5} {'':>11} {'':>11} {'':>11} "
                 f"{est.total_idle_min():>9.2f} {est.total_wall_min():>9.2f}")
    lb = " ".join(f"{x:.2f}" for x in est.load_before)
    la = " ".join(f"{x:.2f}" for x in est.load_after)
    lines.append(f"load average before: {lb}; after: {la}; measurement took {est.elapsed_s:.0f} s; "
                 f"OMP_WAIT_POLICY={est.omp_wait_policy or 'unset'}")
    if est.threads > 1 and (est.omp_wait_policy or "").lower() != "passive":
        lines.append("warning: T > 1 without OMP_WAIT_POLICY=PASSIVE: OpenMP spin-waiting inflates the "
                     "CPU times on a loaded machine")
    return "\n".join(lines)

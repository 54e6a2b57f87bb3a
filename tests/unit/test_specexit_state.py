"""SpecExitState: lifecycle by hand, slot reuse, batched == scalar reference, per-token invariance, replay.

Pure: no sglang import. The scalar reference below re-implements docs/algorithms.md#specexit (and
the project rules stated in ``criterion.py``) one request and one token at a time with plain
Python lists; the batched state must reproduce its decisions on 200 random multi-request runs
with slot reuse, mixed per-request options, NaN signals, stop tokens and guards. The invariance
test splits the same token streams into steps in many ways (widths, draft-off steps, batches)
and requires the same exit token and the same scores.
Budget: < 30 s.
"""

import json
import math
import random

import pytest
import torch

from sglang_ext.specexit.criterion import NO_BOUNDARY, PAD_TOKEN, ExitReason
from sglang_ext.specexit.overrides import SpecExitOptions
from sglang_ext.specexit.signals import ALL_METHODS
from sglang_ext.specexit.smoothing import SmoothingKind
from sglang_ext.specexit.state import SpecExitState

NAN = float("nan")
BOUNDARY = (7, 8)
STOP = 9
T = 10


def signals(confidence=NAN, progress=NAN, remain=NAN):
    return [confidence, progress, remain]


def one_step(state, slot, root, accepted, bonus, obs, width=4):
    """One request's step. ``obs``: one signal triple for every token of the run, or a list of
    triples, one per token r_0..r_a."""
    row = list(accepted) + [PAD_TOKEN] * (width - len(accepted))
    per_token = obs if isinstance(obs[0], list) else [obs] * (len(accepted) + 1)
    assert len(per_token) == len(accepted) + 1
    per_token = per_token + [signals()] * (width + 1 - len(per_token))
    return state.step(
        torch.tensor([slot]),
        torch.tensor([root]),
        torch.tensor([row]),
        torch.tensor([bonus]),
        torch.tensor([per_token], dtype=torch.float64),
    )


def new_state(max_slots=4):
    return SpecExitState.allocate(max_slots, BOUNDARY, STOP, max_window=16, dtype=torch.float64)


# --- hand-computed lifecycles -------------------------------------------------------------


@pytest.mark.parametrize("kind, exits", [("paragraph_mean", True), ("mean", False)])
def test_paragraph_cut_changes_the_decision(kind, exits):
    # confidence only, threshold 0.5, W = 4. Tokens T, T | 7, T, 8 with 0.25, 0.25 | 0.25, 1.0, 0.5.
    # At the boundary 7 both means are 0.25 (fail); paragraph_mean keeps only 7's 0.25.
    # At the boundary 8: paragraph_mean (0.25 + 1.0 + 0.5) / 3 = 0.583 > 0.5 -> exit, keep 2;
    # mean of the last 4 = (0.25 + 0.25 + 1.0 + 0.5) / 4 = 0.5, not > 0.5 -> no exit.
    state = new_state()
    options = SpecExitOptions(method="confidence", smoothing=kind, window=4, confidence_threshold=0.5)
    state.reset([1], [options], think_tokens=1)
    d1 = one_step(state, 1, T, [T], 7, [signals(0.25), signals(0.25)])
    assert not bool(d1.exit) and int(d1.first_boundary) == NO_BOUNDARY
    d2 = one_step(state, 1, 7, [T, 8], T, [signals(0.25), signals(1.0), signals(0.5)])
    assert int(d2.first_boundary) == 0
    assert bool(d2.exit) == exits and int(d2.keep_drafts) == 2
    assert bool(state.thinking[1]) == (not exits)


def test_think_tokens_count_emitted_tokens_and_drive_min_think():
    # think_tokens starts at 1 (prefill token = first root). Step 1 emits 3 (a = 2 + bonus) -> 4.
    # Step 2: boundary at j = 1 -> n = 4 + 1 = 5 < min 6: no exit; emits 2 -> 6.
    # Step 3: boundary root j = 0 -> n = 6 >= 6 -> exit, keep 0.
    state = new_state()
    state.reset([0], [SpecExitOptions(method="confidence", ewma_alpha=1.0, min_think_tokens=6)], think_tokens=1)
    one_step(state, 0, T, [T, T], T, signals(0.9))
    assert int(state.think_tokens[0]) == 4
    d = one_step(state, 0, T, [7], 8, signals(0.9))
    assert not bool(d.exit) and int(state.think_tokens[0]) == 6
    d = one_step(state, 0, 8, [T], T, signals(0.9))
    assert (bool(d.exit), int(d.keep_drafts), int(d.reason)) == (True, 0, ExitReason.SIGNALS)
    assert not bool(state.thinking[0])


def test_the_boundary_token_own_observation_counts_and_ewma_can_exit_at_the_first_token():
    state = new_state()
    state.reset([0, 1], [SpecExitOptions()] * 2)
    # slot 0: the very first token is a boundary whose own observation passes -> exit at once
    d = one_step(state, 0, 7, [T], T, [signals(0.99, 0.99, 1.0), signals(0.0, 0.0, 1e9)])
    assert bool(d.exit) and int(d.keep_drafts) == 0
    # slot 1: the boundary token's observation is missing (NaN): nothing defined, no exit;
    # the next token's observation does not reach back to it
    d = one_step(state, 1, 7, [T], T, [signals(), signals(0.99, 0.99, 1.0)])
    assert not bool(d.exit) and int(d.first_boundary) == 0


def test_natural_end_stops_everything_and_is_final():
    state = new_state()
    state.reset([0], [SpecExitOptions(method="confidence", ewma_alpha=1.0)])
    one_step(state, 0, T, [T], T, signals(0.5))
    d = one_step(state, 0, T, [7, STOP], T, signals(0.5))  # the boundary fails: the stop token ends it
    assert bool(d.natural_end) and not bool(d.exit) and not bool(state.thinking[0])
    d = one_step(state, 0, 7, [7], T, signals(0.99))  # the answer phase: never exited
    assert not bool(d.exit) and not bool(d.natural_end) and int(d.first_boundary) == NO_BOUNDARY


def test_nan_signals_never_pass_and_do_not_poison_the_smoother():
    state = new_state()
    state.reset([0], [SpecExitOptions(method="confidence_remain", ewma_alpha=0.5)])
    one_step(state, 0, T, [T], T, signals(NAN, NAN, NAN))
    d = one_step(state, 0, 7, [T], T, [signals(0.9, NAN, NAN), signals(0.9, NAN, 10.0)])  # no remain at 7
    assert not bool(d.exit)
    values, defined = state.scores(torch.tensor([0]))
    assert defined.tolist() == [[True, False, True]] and values[0, 0].item() == 0.9
    one_step(state, 0, T, [T], T, signals(NAN, 0.1, NAN))  # skipped for both used signals
    assert state.scores(torch.tensor([0]))[0][0].tolist()[0::2] == [0.9, 10.0]
    d = one_step(state, 0, 7, [T], T, signals(0.9, NAN, 10.0))
    assert bool(d.exit) and int(d.reason) == ExitReason.SIGNALS


def test_disabled_or_non_reasoning_requests_are_never_touched():
    state = new_state()
    state.reset([0, 1], [SpecExitOptions(enable=False), SpecExitOptions()], thinking=[True, False])
    for _ in range(3):
        d = state.step(
            torch.tensor([0, 1]),
            torch.tensor([7, 7]),
            torch.tensor([[8, 7], [8, 7]]),
            torch.tensor([T, T]),
            torch.tensor([[signals(0.99, 0.99, 1.0)] * 3] * 2, dtype=torch.float64),
        )
        assert d.exit.tolist() == [False, False] and d.keep_drafts.tolist() == [2, 2]
    assert state.scores(torch.tensor([0, 1]))[1].any().item() is False


def test_slot_reuse_does_not_leak_state():
    state = new_state()
    eager = SpecExitOptions(method="confidence", ewma_alpha=1.0, max_think_tokens=5, max_think_grace=0)
    state.reset([2], [eager], think_tokens=1)
    one_step(state, 2, T, [T], T, signals(0.99))
    state.reset([2], [SpecExitOptions(method="confidence")], think_tokens=1)
    values, defined = state.scores(torch.tensor([2]))
    assert not defined.any()
    # The new request has no max-think guard and fails its threshold (0.5 < 0.8): no exit.
    d = one_step(state, 2, 7, [T, T, T], T, signals(0.5))
    assert not bool(d.exit)
    assert int(state.think_tokens[2]) == 5


def test_step_without_observations_pushes_nothing_but_still_cuts_paragraphs():
    state = new_state()
    state.reset([0, 3], [SpecExitOptions(smoothing="paragraph_mean")] * 2)
    one_step(state, 0, T, [T], T, signals(0.5, 0.5, 50.0))
    assert state.smoother.length[0].tolist() == [2, 2, 2]
    d = state.step(torch.tensor([0, 3]), torch.tensor([7, T]), torch.tensor([[T], [T]]), torch.tensor([T, T]))
    assert d.exit.tolist() == [False, False]
    assert state.smoother.length[3].tolist() == [0, 0, 0]
    assert state.smoother.length[0].tolist() == [1, 1, 1]  # cut at the boundary, no push


def test_observations_must_have_one_column_per_run_position():
    state = new_state()
    state.reset([0], [SpecExitOptions()])
    with pytest.raises(ValueError, match=r"\[1, 3, 3\]"):
        state.step(torch.tensor([0]), torch.tensor([T]), torch.tensor([[T, T]]), torch.tensor([T]),
                   torch.zeros(1, 2, 3))


def test_allocate_rejects_an_empty_boundary_set_and_reset_checks_lengths():
    with pytest.raises(ValueError, match="empty"):
        SpecExitState.allocate(2, [], STOP)
    state = new_state()
    with pytest.raises(ValueError, match="2 slots but 1 options"):
        state.reset([0, 1], [SpecExitOptions()])


# --- scalar reference ---------------------------------------------------------------------


class RefPredictor:
    def __init__(self, kind, alpha, window):
        self.kind, self.alpha, self.window = kind, alpha, window
        self.history, self.ewma = [], None

    def push(self, x):
        if math.isfinite(x):
            self.history.append(x)
            self.ewma = x if self.ewma is None else self.alpha * x + (1 - self.alpha) * self.ewma

    def cut(self):
        if self.kind == SmoothingKind.PARAGRAPH_MEAN:
            self.history = self.history[-1:]

    def score(self):
        if self.kind == SmoothingKind.EWMA:
            return self.ewma
        if self.kind == SmoothingKind.MOMENTUM:
            if len(self.history) < self.window:
                return None
            last = self.history[-1]
            return last if self.window == 1 else last + (last - self.history[-self.window]) / (self.window - 1)
        recent = self.history[-self.window :]
        return sum(recent) / len(recent) if recent else None


class RefRequest:
    """One request, one step at a time, straight from the spec."""

    def __init__(self, options, think_tokens, thinking):
        self.o = options
        self.think = think_tokens
        self.thinking = thinking and options.enable
        self.predictors = [RefPredictor(options.smoothing, options.ewma_alpha, options.window) for _ in range(3)]

    def passes(self):
        used = [i for i, on in enumerate(self.o.method.active_columns) if on]
        for i in used:
            s = self.predictors[i].score()
            if s is None or math.isnan(s):
                return False
            limit = self.o.thresholds[i]
            if not (s < limit if i == 2 else s > limit):
                return False
        return bool(used)

    def step(self, root, accepted, bonus, obs):
        """``obs``: one signal triple per token r_0..r_a (entries past a are ignored)."""
        a = len(accepted)
        quiet = dict(exit=False, keep=a, reason=0, natural=False, first=NO_BOUNDARY)
        if not self.thinking:
            return quiet
        run = [root] + accepted
        first, exit_at, reason = NO_BOUNDARY, None, 0
        max_think, grace = self.o.max_think_tokens, self.o.max_think_grace
        for j, tok in enumerate(run):
            if tok == STOP:
                break
            for p, x in zip(self.predictors, obs[j]):
                p.push(x)
            n = self.think + j
            is_boundary = tok in BOUNDARY
            if is_boundary and first == NO_BOUNDARY:
                first = j
            by_signals = is_boundary and n >= self.o.min_think_tokens and self.passes()
            forced = max_think is not None and ((is_boundary and n >= max_think) or n >= max_think + grace)
            if by_signals or forced:
                exit_at, reason = j, (1 if by_signals else 2)
                break
            if is_boundary:
                for p in self.predictors:
                    p.cut()
        natural = exit_at is None and (STOP in run or bonus == STOP)
        if exit_at is not None or natural:
            self.thinking = False
        keep = a if exit_at is None else exit_at
        if self.thinking:
            self.think += keep + 1
        return dict(exit=exit_at is not None, keep=keep, reason=reason, natural=natural, first=first)


# --- random scenarios -----------------------------------------------------------------------


def random_options(rng):
    min_think = rng.choice([0, 0, rng.randint(1, 40)])
    max_think = rng.choice([None, None, rng.randint(max(5, min_think), 60)])
    return SpecExitOptions(
        enable=rng.random() < 0.95,
        method=rng.choice(ALL_METHODS),
        smoothing=SmoothingKind(rng.randrange(4)),
        ewma_alpha=rng.uniform(0.05, 1.0),
        window=rng.randint(1, 8),
        confidence_threshold=rng.uniform(0.55, 0.9),
        progress_threshold=rng.uniform(0.1, 0.6),
        remain_threshold=rng.uniform(30.0, 600.0),
        min_think_tokens=min_think,
        max_think_tokens=max_think,
        max_think_grace=rng.randint(0, 10),
    )


def random_token(rng):
    u = rng.random()
    if u < 0.15:
        return rng.choice(BOUNDARY)
    if u < 0.17:
        return STOP
    return rng.randint(10, 30)


def random_signals(rng):
    values = [rng.uniform(0.5, 1.0), rng.uniform(0.0, 1.0), math.exp(rng.uniform(2.0, 7.0))]
    return [NAN if rng.random() < 0.05 else v for v in values]


def random_token_signals(rng, width):
    return [random_signals(rng) for _ in range(width + 1)]


def make_scenario(rng, max_slots=6, steps=20, width=4):
    """Two events per step, both possibly empty: ("reset", slots, options, think_tokens, thinking)
    then ("step", slots, roots, accepted, bonus, signals)."""
    events, occupied = [], set()
    for _ in range(steps):
        for slot in sorted(occupied):
            if rng.random() < 0.08:
                occupied.discard(slot)  # request finished; the slot will be reused
        new = [s for s in range(max_slots) if s not in occupied and rng.random() < 0.5]
        events.append(
            (
                "reset",
                new,
                [random_options(rng) for _ in new],
                [rng.randint(1, 40) for _ in new],
                [rng.random() < 0.9 for _ in new],
            )
        )
        occupied.update(new)
        batch = rng.sample(sorted(occupied), rng.randint(1, len(occupied))) if occupied else []
        accepted = []
        for _ in batch:
            a = rng.randint(0, width)
            accepted.append([random_token(rng) for _ in range(a)] + [PAD_TOKEN] * (width - a))
        events.append(
            (
                "step",
                batch,
                [random_token(rng) for _ in batch],
                accepted,
                [random_token(rng) for _ in batch],
                [random_token_signals(rng, width) for _ in batch],
            )
        )
    return events


def run_state(events, max_slots=6):
    """Drive a fresh SpecExitState; return the decisions of every non-empty step."""
    state = SpecExitState.allocate(max_slots, BOUNDARY, STOP, max_window=16, dtype=torch.float64)
    decisions = []
    for event in events:
        if event[0] == "reset":
            _, slots, options, think, thinking = event
            state.reset(slots, options, think_tokens=think, thinking=thinking)
            continue
        _, slots, roots, accepted, bonus, obs = event
        if not slots:
            continue
        d = state.step(
            torch.tensor(slots),
            torch.tensor(roots),
            torch.tensor(accepted),
            torch.tensor(bonus),
            torch.tensor(obs, dtype=torch.float64),
        )
        decisions.append(d)
    return state, decisions


def test_batched_state_equals_the_scalar_reference_on_200_random_runs():
    # 200 independent runs share one state (6 slots each) and are stepped together: each
    # batch interleaves rows of every run in random order, so batching itself is under test.
    rng = random.Random(20250521)
    runs, per_run, steps = 200, 6, 20
    scenarios = [make_scenario(rng, per_run, steps) for _ in range(runs)]
    state = SpecExitState.allocate(runs * per_run, BOUNDARY, STOP, max_window=16, dtype=torch.float64)
    reference = {}
    seen = {"signals": 0, "max_think": 0, "natural": 0, "boundary_no_exit": 0, "cut_short": 0}
    for t in range(steps):
        slots, options, think, thinking = [], [], [], []
        for r, events in enumerate(scenarios):
            _, new, opts, counts, flags = events[2 * t]
            for s, o, n, f in zip(new, opts, counts, flags):
                slots.append(r * per_run + s)
                options.append(o)
                think.append(n)
                thinking.append(f)
                reference[r * per_run + s] = RefRequest(o, n, f)
        state.reset(slots, options, think_tokens=think, thinking=thinking)

        rows = []
        for r, events in enumerate(scenarios):
            _, batch, roots, accepted, bonus, obs = events[2 * t + 1]
            rows += [(r * per_run + s, roots[i], accepted[i], bonus[i], obs[i]) for i, s in enumerate(batch)]
        rng.shuffle(rows)
        index = torch.tensor([row[0] for row in rows])
        d = state.step(
            index,
            torch.tensor([row[1] for row in rows]),
            torch.tensor([row[2] for row in rows]),
            torch.tensor([row[3] for row in rows]),
            torch.tensor([row[4] for row in rows], dtype=torch.float64),
        )
        values, defined = (x.tolist() for x in state.scores(index))
        fields = ("exit", "keep_drafts", "reason", "natural_end", "first_boundary")
        got_all = {k: getattr(d, k).tolist() for k in fields}
        thinking_now, think_now = state.thinking.tolist(), state.think_tokens.tolist()
        for i, (slot, root, accepted, bonus, obs) in enumerate(rows):
            ref = reference[slot]
            drafts = [tok for tok in accepted if tok != PAD_TOKEN]
            expected = ref.step(root, drafts, bonus, obs)
            got = dict(
                exit=got_all["exit"][i],
                keep=got_all["keep_drafts"][i],
                reason=got_all["reason"][i],
                natural=got_all["natural_end"][i],
                first=got_all["first_boundary"][i],
            )
            assert got == expected, (t, slot, ref.o, root, accepted, bonus)
            assert thinking_now[slot] == ref.thinking
            if ref.thinking:
                assert think_now[slot] == ref.think
            for c in range(3 if ref.thinking else 0):
                score = ref.predictors[c].score()
                assert defined[i][c] == (score is not None), (t, slot, c)
                if score is not None:
                    assert math.isclose(values[i][c], score, rel_tol=1e-9, abs_tol=1e-12), (values[i][c], score)
            seen["signals"] += expected["reason"] == ExitReason.SIGNALS
            seen["max_think"] += expected["reason"] == ExitReason.MAX_THINK
            seen["natural"] += expected["natural"]
            seen["boundary_no_exit"] += expected["first"] != NO_BOUNDARY and not expected["exit"]
            seen["cut_short"] += expected["exit"] and expected["keep"] < len(drafts)
    # The random runs must exercise every path, or the comparison proves little.
    assert min(seen.values()) >= 30, seen


def test_replay_from_a_json_log_gives_the_same_decisions():
    rng = random.Random(7)
    events = make_scenario(rng, steps=30)
    _, decisions = run_state(events)

    def encode(event):
        if event[0] == "reset":
            _, slots, options, think, thinking = event
            opts = [
                {**{f: getattr(o, f) for f in ("enable", "ewma_alpha", "window", "confidence_threshold",
                                                "progress_threshold", "remain_threshold", "min_think_tokens",
                                                "max_think_tokens", "max_think_grace")},
                 "method": o.method.name, "smoothing": o.smoothing.label}
                for o in options
            ]
            return ["reset", slots, opts, think, thinking]
        return list(event)

    log = json.dumps(
        {
            "events": [encode(e) for e in events],
            "decisions": [
                {k: getattr(d, k).tolist() for k in ("exit", "keep_drafts", "reason", "natural_end", "first_boundary")}
                for d in decisions
            ],
        }
    )
    loaded = json.loads(log)
    replayed_events = []
    for e in loaded["events"]:
        if e[0] == "reset":
            replayed_events.append(("reset", e[1], [SpecExitOptions(**o) for o in e[2]], e[3], e[4]))
        else:
            replayed_events.append(tuple(e))
    _, replayed = run_state(replayed_events)
    assert len(replayed) == len(decisions) == len(loaded["decisions"])
    for original, again, logged in zip(decisions, replayed, loaded["decisions"]):
        for k in ("exit", "keep_drafts", "reason", "natural_end", "first_boundary", "num_accepted"):
            assert torch.equal(getattr(original, k), getattr(again, k)), k
        for k, v in logged.items():
            assert getattr(again, k).tolist() == v
    assert any(bool(d.exit.any()) for d in decisions)


# --- per-token invariance -------------------------------------------------------------------


def random_stream(rng, length=80):
    """A request's thinking tokens and one signal triple per token."""
    tokens = [random_token(rng) if rng.random() < 0.98 else STOP for _ in range(length)]
    return tokens, [random_signals(rng) for _ in tokens]


def _advance(d, batch, streams, pos, outcome):
    """Apply one step's decision to the streams' positions and outcomes."""
    for k, i in enumerate(batch):
        if bool(d.exit[k]):
            outcome[i] = (pos[i] + int(d.keep_drafts[k]), int(d.reason[k]))
        elif bool(d.natural_end[k]):
            outcome[i] = (None, "natural")
        else:
            pos[i] += int(d.keep_drafts[k]) + 1
            if pos[i] + 2 >= len(streams[i][0]):
                outcome[i] = (None, "running")


def run_chunked(streams, options, rng, widths):
    """Feed every stream's tokens through one batched state in random steps: each step takes a
    random subset of the unfinished streams (a batch), a random accepted count per stream
    (0 = a draft-off step) up to the step's width; returns, per stream, (exit position, reason)
    or (None, natural end)."""
    n = len(streams)
    state = SpecExitState.allocate(n, BOUNDARY, STOP, max_window=16, dtype=torch.float32)
    state.reset(list(range(n)), options, think_tokens=1)
    pos = [0] * n
    outcome = [None] * n
    while True:
        live = [i for i in range(n) if outcome[i] is None]
        if not live:
            return outcome
        width = rng.choice(widths)
        batch = [i for i in live if rng.random() < 0.8] or live[:1]
        rng.shuffle(batch)
        roots, accepted, bonus, obs = [], [], [], []
        for i in batch:
            tokens, sig = streams[i]
            room = len(tokens) - pos[i] - 2  # leave a bonus
            a = min(rng.randint(0, width), max(room, 0))
            roots.append(tokens[pos[i]])
            accepted.append(tokens[pos[i] + 1 : pos[i] + 1 + a] + [PAD_TOKEN] * (width - a))
            bonus.append(tokens[pos[i] + 1 + a])
            obs.append(sig[pos[i] : pos[i] + 1 + a] + [signals()] * (width - a))
        d = state.step(torch.tensor(batch), torch.tensor(roots), torch.tensor(accepted, dtype=torch.int64).view(
            len(batch), width), torch.tensor(bonus), torch.tensor(obs, dtype=torch.float32))
        _advance(d, batch, streams, pos, outcome)


def test_the_exit_token_does_not_depend_on_how_tokens_are_split_into_steps():
    # The property: the same tokens and per-token signals give the same exit token whatever
    # the verify width (chains of 1..8 drafts), draft-off steps (a = 0), D-Cut's cut of the accepted
    # run and the batch composition. 150 streams, every smoother, method and guard.
    rng = random.Random(35)
    streams = [random_stream(rng) for _ in range(150)]
    options = [random_options(rng) for _ in streams]
    options = [SpecExitOptions(**{**o.__dict__, "enable": True}) if not o.enable else o for o in options]
    one_token = run_chunked(streams, options, random.Random(0), widths=[0])  # one token per step
    for seed, widths in ((1, [3]), (2, [7]), (3, [0, 1, 3]), (4, [0, 0, 0, 15]), (5, [1, 2, 4, 8])):
        assert run_chunked(streams, options, random.Random(seed), widths) == one_token, widths
    kinds = [o[1] for o in one_token]
    assert kinds.count(ExitReason.SIGNALS) >= 30 and kinds.count(ExitReason.MAX_THINK) >= 5, kinds
    assert kinds.count("natural") >= 5, kinds
    by_kind = {SmoothingKind(o.smoothing) for o, out in zip(options, one_token) if out[1] == ExitReason.SIGNALS}
    assert by_kind == set(SmoothingKind), by_kind


# --- lagged observations (draft-confidence) -------------------------------------------------

KNOWN = 2  # the draft-confidence source knows the observations of r_0 and r_1 at the decision


def run_chunked_lagged(streams, options, rng, widths, bound=True):
    """As :func:`run_chunked`, but a token's observation is known only once the step whose root
    precedes it by at most one position has come (the draft extend computes it after the verify):
    each step calls ``truncation`` first and cuts the run there, passes the observations of r_0 and
    r_1 only, and the owed ones of earlier tokens through ``backlog_positions``. With ``bound`` the
    truncation sees the known observations (cuts only where the rule could fire); without, it cuts at
    every boundary it cannot decide. Returns the outcomes and how many steps were cut short."""
    n = len(streams)
    state = SpecExitState.allocate(n, BOUNDARY, STOP, max_window=16, dtype=torch.float32)
    state.reset(list(range(n)), options, think_tokens=1)
    pos = [0] * n
    outcome = [None] * n
    truncated = 0
    while True:
        live = [i for i in range(n) if outcome[i] is None]
        if not live:
            return outcome, truncated
        width = rng.choice(widths)
        batch = [i for i in live if rng.random() < 0.8] or live[:1]
        rng.shuffle(batch)
        roots, accepted, bonus = [], [], []
        for i in batch:
            tokens, _ = streams[i]
            room = len(tokens) - pos[i] - 2
            a = min(rng.randint(0, width), max(room, 0))
            roots.append(tokens[pos[i]])
            accepted.append(tokens[pos[i] + 1 : pos[i] + 1 + a] + [PAD_TOKEN] * (width - a))
            bonus.append(tokens[pos[i] + 1 + a])
        slots = torch.tensor(batch)
        acc = torch.tensor(accepted, dtype=torch.int64).view(len(batch), width)
        obs, owed = [], []
        positions = state.backlog_positions(slots, torch.tensor([pos[i] for i in batch]))
        for k, i in enumerate(batch):
            tokens, sig = streams[i]
            obs.append([sig[pos[i] + c] if c < KNOWN else signals() for c in range(width + 1)])
            owed.append([sig[p] if p >= 0 else signals() for p in positions[k].tolist()])
        obs_t = torch.tensor(obs, dtype=torch.float32)
        owed_t = torch.tensor(owed, dtype=torch.float32).view(len(batch), positions.shape[1], 3)
        seen = dict(observations=obs_t, backlog_observations=owed_t) if bound else {}
        cut, keep = state.truncation(slots, torch.tensor(roots), acc, torch.tensor(bonus), KNOWN, **seen)
        truncated += int(cut.sum())
        for k, i in enumerate(batch):
            if bool(cut[k]):
                j = int(keep[k]) + 1  # r_j becomes the bonus
                acc[k, j - 1 :] = PAD_TOKEN
                bonus[k] = streams[i][0][pos[i] + j]
        d = state.step(slots, torch.tensor(roots), acc, torch.tensor(bonus), obs_t,
                       known_columns=KNOWN, backlog_observations=owed_t)
        _advance(d, batch, streams, pos, outcome)


def test_lagged_observations_give_the_exit_of_one_token_per_step():
    # draft-confidence: the observation of r_j (j >= 2) exists only after the step's draft extend.
    # Cutting a step short before a boundary at j >= 2 and pushing the owed observations first in the
    # next step gives the exit token of the one-token-per-step run with every observation known.
    rng = random.Random(35)
    streams = [random_stream(rng) for _ in range(150)]
    options = [random_options(rng) for _ in streams]
    options = [SpecExitOptions(**{**o.__dict__, "enable": True}) if not o.enable else o for o in options]
    one_token = run_chunked(streams, options, random.Random(0), widths=[0])
    for seed, widths in ((1, [3]), (2, [7]), (3, [0, 1, 3]), (4, [0, 0, 0, 15]), (5, [1, 2, 4, 8])):
        lagged, truncated = run_chunked_lagged(streams, options, random.Random(seed), widths)
        assert lagged == one_token, widths
        every, truncated_every = run_chunked_lagged(streams, options, random.Random(seed), widths, bound=False)
        assert every == one_token, widths
        if max(widths) >= 3:
            # the bound cuts only where the rule could fire: fewer cuts, none where none is needed
            assert 0 < truncated < truncated_every, (widths, truncated, truncated_every)
    kinds = [o[1] for o in one_token]
    assert kinds.count(ExitReason.SIGNALS) >= 30 and kinds.count(ExitReason.MAX_THINK) >= 5, kinds


def test_lagged_steps_without_truncation_would_exit_elsewhere():
    # The truncation is what makes the lagged mode exact: skipping it (a boundary at j >= 2 is then
    # decided before its observation is known, i.e. never by signals) moves exits.
    rng = random.Random(36)
    streams = [random_stream(rng) for _ in range(60)]
    options = [SpecExitOptions(method="confidence", smoothing="ewma", ewma_alpha=0.5, confidence_threshold=0.7)
               for _ in streams]
    one_token = run_chunked(streams, options, random.Random(0), widths=[0])
    original = SpecExitState.truncation
    try:
        SpecExitState.truncation = lambda self, s, r, a, b, k, **kw: (torch.zeros(len(s), dtype=torch.bool),
                                                                      (a != PAD_TOKEN).sum(dim=1))
        lagged, truncated = run_chunked_lagged(streams, options, random.Random(2), [7])
    finally:
        SpecExitState.truncation = original
    assert truncated == 0 and lagged != one_token


def test_truncation_respects_min_think_and_stops_and_leaves_known_columns_alone():
    state = new_state()
    state.reset([0, 1, 2], [SpecExitOptions(min_think_tokens=5), SpecExitOptions(), SpecExitOptions()],
                think_tokens=[1, 1, 1])
    roots = torch.tensor([T, T, T])
    acc = torch.tensor([[T, T, 7, T], [T, STOP, 7, T], [7, T, T, 8]])
    cut, keep = state.truncation(torch.tensor([0, 1, 2]), roots, acc, torch.tensor([T, T, T]), 2)
    # request 0: n_3 = 4 < 5 at the boundary r_3, but r_4 = T: nothing; request 1: the boundary comes
    # after the stop token (not a thinking token); request 2: r_1 = 7 is decidable now, r_4 = 8 cuts at j = 4
    assert cut.tolist() == [False, False, True] and keep.tolist() == [4, 4, 3]

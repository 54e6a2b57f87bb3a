"""The recipe's generation order (sglang_ext/recipe/generate.py: run_in_order), without SGLang.

A fake server finishes requests after a random delay; the scheduler must submit in index order,
never hold more than ``window`` unfinished requests, start a later turn only after its context
finished (and after that context's ``on_done``), and return every result in index order.
"""

import asyncio
import random

import pytest

from sglang_ext.recipe.generate import NO_DEPENDENCY, run_in_order


def _run(n, after, window, seed=0, fail_at=None):
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 0.004) for _ in range(n)]
    events = []
    unfinished = set()
    peak = [0]

    async def submit(i):
        events.append(("submit", i))
        unfinished.add(i)
        peak[0] = max(peak[0], len(unfinished))
        await asyncio.sleep(delays[i])
        unfinished.discard(i)
        if i == fail_at:
            raise RuntimeError(f"request {i} failed")
        return [i, i + 1000]

    def on_done(i, out):
        events.append(("done", i))

    out = asyncio.run(run_in_order(n, after, submit, window, on_done))
    return out, events, peak[0]


def test_submits_in_order_within_the_window_and_after_the_context():
    n = 60
    rng = random.Random(3)
    after = [NO_DEPENDENCY if i == 0 or rng.random() < 0.6 else rng.randrange(max(0, i - 5), i) for i in range(n)]
    for window in (1, 3, 8, 100):
        out, events, peak = _run(n, after, window, seed=window)
        assert out == [[i, i + 1000] for i in range(n)]
        submitted = [i for kind, i in events if kind == "submit"]
        assert submitted == list(range(n))
        assert peak <= window
        pos = {e: k for k, e in enumerate(events)}
        for i, d in enumerate(after):
            if d != NO_DEPENDENCY:
                assert pos[("done", d)] < pos[("submit", i)], (window, i, d)
    # window 1 is strictly sequential: every request done before the next is submitted
    _, events, _ = _run(10, [NO_DEPENDENCY] * 10, 1)
    assert events == [e for i in range(10) for e in (("submit", i), ("done", i))]


def test_a_window_keeps_the_finished_requests_close_to_a_prefix():
    """When request i is submitted, at most ``window - 1`` of the requests before it are unfinished."""
    n, window = 80, 6
    _, events, _ = _run(n, [NO_DEPENDENCY] * n, window, seed=11)
    done = set()
    for kind, i in events:
        if kind == "done":
            done.add(i)
        else:
            assert len(set(range(i)) - done) <= window - 1, i


def test_bad_dependencies_and_window_are_refused():
    async def submit(i):
        return i

    with pytest.raises(ValueError, match="only an earlier request"):
        asyncio.run(run_in_order(2, [1, NO_DEPENDENCY], submit, 2))
    with pytest.raises(ValueError, match="only an earlier request"):
        asyncio.run(run_in_order(2, [NO_DEPENDENCY, 1], submit, 2))
    with pytest.raises(ValueError, match="window"):
        asyncio.run(run_in_order(1, [NO_DEPENDENCY], submit, 0))


def test_a_failed_request_fails_the_call_and_its_dependents_are_not_submitted():
    n = 6
    after = [NO_DEPENDENCY, 0, NO_DEPENDENCY, 2, NO_DEPENDENCY, NO_DEPENDENCY]
    events = []

    async def submit(i):
        events.append(i)
        await asyncio.sleep(0.001)
        if i == 2:
            raise RuntimeError("boom")
        return i

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run_in_order(n, after, submit, 4))
    assert 3 not in events

"""Deferred draft extend of draft-off steps: the catch-up layout (pure) and the rows the glue hands
to SGLang's ``_draft_extend_for_decode`` (stand-in batch objects, no SGLang import).

The engine-level checks (lossless, catch-ups before every drafted step, acceptance as with the
extend run every step) are in ``tests/integration/test_dcut_draft_off.py``.

Budget: < 2 s.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ext.dcut.catch_up import catch_up_layout, row_offsets
from sglang_ext.engine.dcut.deferred_extend import MAX_PENDING_ROWS, DeferredDraftExtend

HIDDEN = 3


# ----------------------------------------------------------------------------- layout (pure)
def test_layout_repeats_each_requests_last_row():
    lay = catch_up_layout(torch.tensor([3, 0, 1]))
    assert lay.width == 4
    assert lay.source.tolist() == [[0, 1, 2, 3], [0, 0, 0, 0], [0, 1, 1, 1]]
    assert lay.accept_lens.tolist() == [4, 1, 2] and lay.accept_lens.dtype == torch.int32
    # rows concatenated per request (4, 1 and 2 of them): request b's window starts at its offset
    idx = lay.flat_index(row_offsets(torch.tensor([4, 1, 2])))
    assert idx.tolist() == [0, 1, 2, 3, 4, 4, 4, 4, 5, 6, 6, 6]
    # SGLang selects row b * width + accept_lens[b] - 1: each request's own last row
    sel = torch.arange(3) * lay.width + lay.accept_lens - 1
    assert idx[sel].tolist() == [3, 4, 6]


def test_layout_rejects_bad_counts():
    with pytest.raises(ValueError, match=">= 0"):
        catch_up_layout(torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="at least one"):
        catch_up_layout(torch.tensor([], dtype=torch.int64))


# ----------------------------------------------------------------------------- glue, stand-ins
class _Mode:
    def is_idle(self):
        return False


def _batch(rids, positions, slots):
    return SimpleNamespace(reqs=[SimpleNamespace(rid=r) for r in rids], forward_mode=_Mode(),
                           seq_lens=torch.tensor(positions, dtype=torch.int64),
                           seq_lens_cpu=torch.tensor(positions, dtype=torch.int64), seq_lens_sum=sum(positions),
                           out_cache_loc=torch.tensor(slots, dtype=torch.int64), global_num_tokens=None)


def _result(tokens):
    bs = len(tokens)
    hidden = torch.tensor([[float(t)] * HIDDEN for t in tokens])  # row value = its token, easy to follow
    return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=hidden, next_token_logits=None),
                           next_token_ids=torch.tensor(tokens, dtype=torch.int32),
                           accept_lens=torch.ones(bs, dtype=torch.int32), prepared_draft_extend_inputs=None,
                           next_draft_input=SimpleNamespace(tag="shared"))


class _Algorithm:
    def __init__(self, standalone):
        self.standalone = standalone

    def is_standalone(self):
        return self.standalone


class _Worker:
    def __init__(self, standalone=False):
        self._draft_worker = SimpleNamespace(speculative_num_draft_tokens=1)
        self.speculative_algorithm = _Algorithm(standalone)
        self.stubbed = 0

    def _stub_skipped_draft_extend(self, batch, result):
        self.stubbed += 1


class _Recorder:
    """Stands in for SGLang's ``_draft_extend_for_decode``: records what it was given."""

    def __init__(self, worker):
        self.worker, self.calls = worker, []

    def __call__(self, batch, result, **kwargs):
        self.calls.append(dict(seq_lens=batch.seq_lens.tolist(), seq_lens_cpu=batch.seq_lens_cpu.tolist(),
                               seq_lens_sum=batch.seq_lens_sum, slots=batch.out_cache_loc.tolist(),
                               tokens=result.next_token_ids.tolist(),
                               hidden=(None if result.logits_output.hidden_states is None
                                       else result.logits_output.hidden_states[:, 0].tolist()),
                               accept=result.accept_lens.tolist(), width=self.worker._draft_worker.speculative_num_draft_tokens,
                               kwargs=kwargs, shared=result.next_draft_input))
        return "ran"


def _setup(next_off, standalone=False):
    worker = _Worker(standalone)
    d = DeferredDraftExtend(worker, "defer", lambda bs: next_off[0])
    return worker, d, _Recorder(worker)


def test_defer_then_catch_up_hands_sglang_the_skipped_rows():
    next_off = [True]
    worker, d, sglang = _setup(next_off)
    # two draft-off steps of requests a (positions 10, 11) and b (20, 21): deferred, stubs filled
    for step in range(2):
        batch = _batch(["a", "b"], [10 + step, 20 + step], [110 + step, 220 + step])
        assert d.extend(sglang, batch, _result([100 + step, 200 + step]), kv_loc_plan="plan") is None
    assert sglang.calls == [] and worker.stubbed == 2
    assert d.summary()["pending_rows"] == 4
    # b finished; c joined (prefilled: no rows); the next step drafts -> catch up now
    batch = _batch(["a", "c"], [12, 5], [112, 305])
    d.forget_absent(batch)
    assert d.stats.dropped_rows == 2
    next_off[0] = False
    assert d.extend(sglang, batch, _result([102, 300]), kv_loc_plan="plan") == "ran"
    (call,) = sglang.calls
    # a: its two skipped rows and this step's (positions 10-12); c: this step's row, repeated
    assert call["width"] == 3 and call["accept"] == [3, 1]
    assert call["seq_lens"] == [10, 5] and call["seq_lens_cpu"] == [10, 5] and call["seq_lens_sum"] == 15
    assert call["slots"] == [110, 111, 112, 305, 305, 305]
    assert call["tokens"] == [100, 101, 102, 300, 300, 300]
    assert call["hidden"] == [100.0, 101.0, 102.0, 300.0, 300.0, 300.0]
    assert call["kwargs"] == {"kv_loc_plan": None}  # the window's own plan, not the verify's
    assert call["shared"].tag == "shared"  # outputs land in the step's own next draft input
    assert worker._draft_worker.speculative_num_draft_tokens == 1  # restored
    assert d.summary()["pending_rows"] == 0 and d.stats.catch_ups == 1 and d.stats.caught_up_rows == 2


def test_standalone_draft_defers_tokens_without_hidden_states():
    """A STANDALONE verify captures no hidden state: its rows are deferred all the same (tokens and
    slots) and caught up with none; an EAGLE verify without hidden states is not deferrable."""
    next_off = [True]
    worker, d, sglang = _setup(next_off, standalone=True)
    for step in range(2):
        res = _result([100 + step])
        res.logits_output.hidden_states = None
        assert d.extend(sglang, _batch(["a"], [10 + step], [110 + step]), res) is None
    assert sglang.calls == [] and d.summary()["pending_rows"] == 2 and d.pending["a"].hidden == []
    next_off[0] = False
    res = _result([102])
    res.logits_output.hidden_states = None
    assert d.extend(sglang, _batch(["a"], [12], [112]), res) == "ran"
    (call,) = sglang.calls
    assert call["tokens"] == [100, 101, 102] and call["slots"] == [110, 111, 112] and call["hidden"] is None
    assert call["seq_lens"] == [10] and call["accept"] == [3] and d.stats.caught_up_rows == 2
    # the same result on an EAGLE worker: SGLang's extend runs (nothing to replay the draft from)
    worker, d, sglang = _setup([True])
    res = _result([5])
    res.logits_output.hidden_states = None
    assert d.extend(sglang, _batch(["a"], [3], [30]), res) == "ran" and d.stats.deferred_rows == 0


def test_nothing_pending_runs_sglangs_extend_unchanged():
    worker, d, sglang = _setup([False])
    batch = _batch(["a"], [7], [70])
    res = _result([9])
    assert d.extend(sglang, batch, res) == "ran"
    (call,) = sglang.calls
    assert call["width"] == 1 and call["slots"] == [70] and call["kwargs"] == {}
    assert d.stats.catch_ups == 0


def test_rows_that_do_not_follow_on_are_dropped():
    next_off = [True]
    worker, d, sglang = _setup(next_off)
    d.extend(sglang, _batch(["a"], [10], [110]), _result([100]))
    d.extend(sglang, _batch(["a"], [15], [115]), _result([105]))  # a gap: the first row is dropped
    assert d.stats.dropped_rows == 1 and len(d.pending["a"]) == 1 and d.pending["a"].first_position == 15
    next_off[0] = False
    d.extend(sglang, _batch(["a"], [16], [116]), _result([106]))
    assert sglang.calls[0]["slots"] == [115, 116] and sglang.calls[0]["seq_lens"] == [15]


def test_flush_request_mode_always_and_the_row_cap():
    next_off = [True]
    worker, d, sglang = _setup(next_off)
    d.extend(sglang, _batch(["a"], [10], [110]), _result([100]))
    d.flush_requested = True  # the worker runs a would-be drafted step draft-off to catch up
    d.extend(sglang, _batch(["a"], [11], [111]), _result([101]))
    assert sglang.calls[-1]["slots"] == [110, 111] and not d.flush_requested
    # switched to "always" with rows pending: they are caught up, then SGLang's extend as usual
    d.extend(sglang, _batch(["a"], [12], [112]), _result([102]))
    d.mode = "always"
    d.extend(sglang, _batch(["a"], [13], [113]), _result([103]))
    assert sglang.calls[-1]["slots"] == [112, 113]
    d.extend(sglang, _batch(["a"], [14], [114]), _result([104]))
    assert sglang.calls[-1]["slots"] == [114] and d.stats.catch_ups == 2
    # the cap: a request never holds more than MAX_PENDING_ROWS - 1 rows
    d.mode = "defer"
    n = len(sglang.calls)
    for i in range(MAX_PENDING_ROWS):
        d.extend(sglang, _batch(["a"], [20 + i], [200 + i]), _result([i]))
    assert len(sglang.calls) == n + 1 and sglang.calls[-1]["accept"] == [MAX_PENDING_ROWS]

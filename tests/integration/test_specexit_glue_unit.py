"""SpecExit glue without an engine: the verify-result cut and truncation, the draft-confidence rows kept by position,
logprob fix, reports, hooks, launch checks.

Expected values come from docs/sglang_internals.md#the-specexit-cut (worked example and the two special
cases) and from hand computation, never from the code under test.

Budget: < 10 s.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.config import SpecExitConfig
from sglang_ext.engine.specexit.cut import NO_NODE, apply_exit_cut, cut_lengths, stop_token_logprobs
from sglang_ext.engine.specexit.report import (
    META_KEYS,
    REPORT_ATTR,
    ROW_FIELDS,
    ExitLog,
    SpecExitRequestReport,
    SpecExitSink,
    SpecExitStats,
)

STOP = 9
N = 4


def _worked_example():
    """bs = 2, N = 4, chain (docs/sglang_internals.md#verify-outputs)."""
    return dict(
        next_token_ids=torch.tensor([11, 12, 13, 99, 21, 22, 77, 0], dtype=torch.int32),
        accept_lens=torch.tensor([4, 3], dtype=torch.int32),
        new_seq_lens=torch.tensor([14, 23], dtype=torch.int64),
        bonus_tokens=torch.tensor([99, 77], dtype=torch.int32),
        accept_index=torch.tensor([[0, 1, 2, 3], [4, 5, 6, -1]], dtype=torch.int32),
        prepared_draft_extend_inputs=(
            torch.tensor([3, 2], dtype=torch.int32),
            torch.tensor([3, 6], dtype=torch.int64),
            torch.tensor([11, 12, 13, 99, 21, 22, 77, 0], dtype=torch.int64),
        ),
    )


def _cut(t, exit_mask, keep):
    return apply_exit_cut(t["next_token_ids"], t["accept_lens"], t["new_seq_lens"], t["bonus_tokens"],
                          torch.tensor(exit_mask), torch.tensor(keep), STOP, N,
                          accept_index=t["accept_index"],
                          prepared_draft_extend_inputs=t["prepared_draft_extend_inputs"])


def test_cut_worked_example_matches_the_map():
    t = _worked_example()
    new = _cut(t, [True, False], [1, 2])
    assert new.tolist() == [2, 3]
    assert t["next_token_ids"].view(2, N)[0].tolist() == [11, STOP, 13, 99]
    assert t["next_token_ids"].view(2, N)[1].tolist() == [21, 22, 77, 0]
    assert t["accept_lens"].tolist() == [2, 3]
    assert t["new_seq_lens"].tolist() == [12, 23]
    assert t["bonus_tokens"].tolist() == [STOP, 77]
    correct, select, ids = t["prepared_draft_extend_inputs"]
    assert correct.tolist() == [1, 2] and select.tolist() == [1, 6]
    assert ids.tolist() == [11, STOP, 13, 99, 21, 22, 77, 0]
    assert t["accept_index"].tolist() == [[0, 1, NO_NODE, NO_NODE], [4, 5, 6, -1]]
    # dtypes are kept (the scheduler copies these buffers as they are)
    assert t["accept_lens"].dtype == torch.int32 and t["bonus_tokens"].dtype == torch.int32


def test_cut_pure_bonus_override_changes_no_length():
    t = _worked_example()
    _cut(t, [True, False], [3, 2])  # j* = a = 3: the boundary is the last accepted draft
    assert t["next_token_ids"].view(2, N)[0].tolist() == [11, 12, 13, STOP]
    assert t["accept_lens"].tolist() == [4, 3]
    assert t["new_seq_lens"].tolist() == [14, 23]
    assert t["bonus_tokens"].tolist() == [STOP, 77]
    assert t["prepared_draft_extend_inputs"][1].tolist() == [3, 6]
    assert t["accept_index"].tolist() == [[0, 1, 2, 3], [4, 5, 6, -1]]


def test_cut_at_the_root_emits_only_the_stop_token():
    t = _worked_example()
    _cut(t, [False, True], [3, 0])  # request 1: its root was the boundary
    assert t["next_token_ids"].view(2, N)[1].tolist()[0] == STOP
    assert t["accept_lens"].tolist() == [4, 1]
    assert t["new_seq_lens"].tolist() == [14, 21]
    assert t["bonus_tokens"].tolist() == [99, STOP]
    assert t["prepared_draft_extend_inputs"][0].tolist() == [3, 0]
    assert t["prepared_draft_extend_inputs"][1].tolist() == [3, 4]
    assert t["accept_index"].tolist() == [[0, 1, 2, 3], [4, -1, -1, -1]]


def test_no_exit_leaves_every_tensor_bitwise_unchanged():
    t = _worked_example()
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else tuple(x.clone() for x in v)) for k, v in t.items()}
    _cut(t, [False, False], [3, 2])
    for k, v in t.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k
        else:
            assert all(torch.equal(a, b) for a, b in zip(v, before[k])), k


def test_cut_on_a_front_compacted_tree():
    # topk = 2, N = 4: request 0 accepted node 2 then node 3 (global ids 2, 3); after SGLang's
    # compaction predict holds the accepted run at the front: [r_1=55, r_2=56, bonus=57, x].
    ids = torch.tensor([55, 56, 57, 0], dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    seq = torch.tensor([13])
    bonus = torch.tensor([57], dtype=torch.int32)
    index = torch.tensor([[0, 2, 3]], dtype=torch.int32)
    apply_exit_cut(ids, lens, seq, bonus, torch.tensor([True]), torch.tensor([1]), STOP, N, accept_index=index)
    assert ids.tolist()[:2] == [55, STOP] and lens.tolist() == [2] and seq.tolist() == [12]
    assert bonus.tolist() == [STOP] and index.tolist() == [[0, 2, NO_NODE]]


def test_random_cuts_keep_the_commit_invariants():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        bs = int(torch.randint(1, 9, (1,), generator=g))
        seq_lens = torch.randint(5, 50, (bs,), generator=g)
        lens = torch.randint(1, N + 1, (bs,), generator=g)
        ids = torch.randint(10, 99, (bs * N,), generator=g)
        new_seq = seq_lens + lens
        bonus = ids.view(bs, N).gather(1, (lens - 1)[:, None]).squeeze(1).clone()
        exit_mask = torch.rand(bs, generator=g) < 0.5
        keep = (torch.rand(bs, generator=g) * lens).long()  # 0 .. a
        new = apply_exit_cut(ids, lens, new_seq, bonus, exit_mask, keep, STOP, N)
        assert torch.equal(new_seq, seq_lens + lens)
        assert torch.equal(bonus, ids.view(bs, N).gather(1, (lens - 1)[:, None]).squeeze(1))
        assert torch.equal(bonus == STOP, exit_mask)
        assert torch.equal(new, lens.long())


def test_cut_lengths_never_grow_a_run():
    assert cut_lengths(torch.tensor([2]), torch.tensor([True]), torch.tensor([5])).tolist() == [2]


def test_stop_token_logprob_by_hand():
    logits = torch.tensor([[0.0, 0.0, math.log(3.0)], [1.0, 1.0, 1.0]])
    lp = stop_token_logprobs(logits, torch.tensor([0, 1]), stop_think_id=2)
    assert lp.exp().tolist() == pytest.approx([0.6, 1 / 3])
    hot = stop_token_logprobs(logits, torch.tensor([0]), stop_think_id=2, temperatures=torch.tensor([[0.5]]))
    assert hot.exp().item() == pytest.approx(9 / 11)  # logits / 0.5: weights 1, 1, 9


# ----------------------------------------------------------------------------- reports
def _req(rid, output_ids, finished=False, finished_len=None, active=True):
    r = SimpleNamespace(rid=rid, output_ids=list(output_ids), finished_len=finished_len)
    r.finished = lambda: finished
    setattr(r, REPORT_ATTR, SpecExitRequestReport(active=active))
    return r


def _commit(start, tokens):
    return SimpleNamespace(output_index=start, token_ids=tuple(tokens))


def _row(reason=0, natural=0, remain=float("nan")):
    row = [0.0] * len(ROW_FIELDS)
    row[0], row[1], row[2] = float(reason), float(natural), remain
    return row


def test_sink_records_exit_natural_end_and_unfinished_thinking():
    stats = SpecExitStats()
    sink = SpecExitSink(STOP, stats, ExitLog(interval_s=1e9))
    exiting = _req("a", [5, 6, 7, STOP], finished=False)
    natural = _req("b", [5, STOP, 8], finished=True)
    capped = _req("c", [5, 6, 7, 8, 8], finished=True, finished_len=4)
    sink.consume([exiting, natural, capped],
                 [_row(1, 0, 42.0), _row(0, 1), _row(0, 0)],
                 [_commit(2, [7, STOP]), _commit(0, [5, STOP, 8]), _commit(2, [7, 8])])
    a, b, c = (getattr(r, REPORT_ATTR) for r in (exiting, natural, capped))
    assert (a.exited, a.reason, a.think_tokens, a.skipped_tokens_estimate) == (True, "signals", 3, 42.0)
    assert (b.exited, b.natural_end, b.think_tokens) == (False, True, 1)
    assert (c.exited, c.natural_end, c.think_tokens) == (False, False, 4)  # capped at finished_len
    info = stats.as_dict()
    assert info["exits_by_reason"] == {"signals": 1, "max_think_tokens": 0}
    assert info["finished_thinking_requests"] == 2  # "a" has not finished yet
    sink.consume([exiting], [_row()], [None])  # nothing new, still running
    exiting.finished = lambda: True
    sink.consume([exiting], [_row()], [None])
    info = stats.as_dict()
    assert info["finished_thinking_requests"] == 3 and info["natural_ends"] == 1
    assert info["unfinished_thinking"] == 1 and info["mean_think_tokens"] == pytest.approx((3 + 1 + 4) / 3)
    assert a.meta_values() == [True, True, "signals", 3, 42.0]


def test_exit_hidden_by_the_length_cap_is_not_reported():
    stats = SpecExitStats()
    sink = SpecExitSink(STOP, stats, ExitLog(interval_s=1e9))
    r = _req("a", [5, 6, 7], finished=True, finished_len=3)
    sink.consume([r], [_row(2, 0)], [_commit(1, [6, 7])])  # the forced STOP fell past max_new_tokens
    assert getattr(r, REPORT_ATTR).exited is False
    assert stats.as_dict()["exits_total"] == 0


def test_exit_log_is_rate_limited():
    now = [0.0]
    log = ExitLog(interval_s=10.0, clock=lambda: now[0])
    assert log.note("a", "signals", 10, None)
    now[0] = 5.0
    assert not log.note("b", "signals", 10, None) and log.suppressed == 1
    now[0] = 10.5
    assert log.note("c", "signals", 10, None) and log.suppressed == 0


# ----------------------------------------------------------------------------- glue helpers
def test_thinking_detection():
    from sglang_ext.engine.specexit.runner import ends_inside_think, is_thinking, think_start_text

    assert think_start_text("</think>") == "<think>"
    assert ends_inside_think([1, 3, 10, 11], 3, 4)
    assert not ends_inside_think([1, 3, 10, 4, 11], 3, 4)
    assert not ends_inside_think([1, 10], 3, 4)
    base = dict(grammar=None, require_reasoning=False, origin_input_ids=[1, 3, 10], output_ids=[])
    assert is_thinking(SimpleNamespace(**base), 3, 4)
    assert not is_thinking(SimpleNamespace(**{**base, "grammar": object()}), 3, 4)
    assert not is_thinking(SimpleNamespace(**{**base, "output_ids": [7, 4]}), 3, 4)  # closed after a retraction
    plain = {**base, "origin_input_ids": [1, 10]}
    assert not is_thinking(SimpleNamespace(**plain), 3, 4)
    assert is_thinking(SimpleNamespace(**{**plain, "require_reasoning": True}), 3, 4)
    assert not is_thinking(SimpleNamespace(**{**plain, "require_reasoning": True, "output_ids": [4]}), 3, 4)


def _fake_worker(model):
    return SimpleNamespace(draft_worker=SimpleNamespace(draft_runner=SimpleNamespace(model=model)))


def test_head_source_launch_checks():
    from sglang_ext.engine.specexit.runner import SpecExitLaunchError, SpecExitRunner

    runner = SpecExitRunner.__new__(SpecExitRunner)
    runner.method = __import__("sglang_ext.specexit.signals", fromlist=["parse_method"]).parse_method(
        "confidence_remain")
    stock = SimpleNamespace()  # SGLang's LlamaForCausalLMEagle3: no signal rows
    with pytest.raises(SpecExitLaunchError, match=r"--specexit-signal-source head: .*no SpecExit signal rows"):
        runner._check_head(_fake_worker(stock))
    one_row = SimpleNamespace(specexit_k=1, specexit_method="progress", specexit_logits=None)
    with pytest.raises(SpecExitLaunchError, match=r"^--specexit-method: .*confidence.*lacks"):
        runner._check_head(_fake_worker(one_row))
    full = SimpleNamespace(specexit_k=3, specexit_method="confidence_progress_remain", specexit_logits=None)
    assert runner._check_head(_fake_worker(full)) == (0, 2)


# ----------------------------------------------------------------------------- hooks
def test_custom_params_validation_names_the_field():
    from sglang_ext.engine.specexit.hooks import validate_custom_params

    cfg = SpecExitConfig(enabled=True, method="confidence_progress")
    validate_custom_params(cfg, {"specexit_confidence_threshold": 0.9, "other_feature": [1]})
    cases = {
        "specexit_confidence_threshold": ("high", "must be a number"),
        "specexit_progress_threshold": (1.5, "must be in"),
        "specexit_windw": (3, "unknown SpecExit option"),
        "specexit_method": ("remain", "does not compute"),
        "specexit_enable": ("no", "true or false"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ValueError, match=rf"{key[9:] if key == 'specexit_method' else key}.*{message}"):
            validate_custom_params(cfg, {key: value})
    validate_custom_params(SpecExitConfig(enabled=False), {"specexit_window": 0})  # feature off: untouched


def test_streamer_subclass_adds_one_value_per_request_and_meta_info_is_scalar():
    from sglang_ext.engine.specexit.hooks import _around_update_request_meta_info, streamer_class_with_specexit

    class Base:
        __slots__ = ()
        has_additional_customized_info = False

        def build_additional_customized_info(self, reqs):
            return {"other": [[1] for _ in reqs]}

        def is_request_level_customized_info_key(self, key):
            return False

    cls = streamer_class_with_specexit(Base)
    assert cls.has_additional_customized_info and streamer_class_with_specexit(Base) is cls
    done = _req("a", [5, STOP])
    getattr(done, REPORT_ATTR).__dict__.update(exited=True, reason="signals", think_tokens=1)
    plain = SimpleNamespace(rid="b", output_ids=[])
    info = cls().build_additional_customized_info([done, plain])
    assert info["other"] == [[1], [1]]
    assert info["specexit_exited"] == [[True], [False]] and info["specexit_think_tokens"] == [[1], [None]]
    assert cls().is_request_level_customized_info_key("specexit_exited")

    seen = {}

    def original(self, meta_info, state, customized_info, index, finish_reason):
        seen.update(customized_info)
        for k, v in customized_info.items():
            meta_info[k] = list(v[index])

    meta = {}
    _around_update_request_meta_info(original, None, meta, None, info, 0, None)
    assert set(seen) == {"other"}  # SpecExit keys are not accumulated as token lists
    assert meta["other"] == [1]
    assert {k: meta[k] for k in META_KEYS} == {
        "specexit_active": True, "specexit_exited": True, "specexit_exit_reason": "signals",
        "specexit_think_tokens": 1, "specexit_skipped_tokens_estimate": None}


def test_frontend_endpoint_adds_custom_params_to_generation_requests():
    from sglang_ext.engine.specexit.frontend import SpecExitRuntimeEndpoint, specexit_custom_params

    ep = SpecExitRuntimeEndpoint.__new__(SpecExitRuntimeEndpoint)  # no server needed for the body rewrite
    ep.specexit_params = specexit_custom_params({"confidence_threshold": 0.9, "specexit_max_think_tokens": 64})
    s = SimpleNamespace(images_=[])
    gen = {"text": "q", "sampling_params": {"max_new_tokens": 16, "custom_params": {"other": 1}}}
    ep._add_images(s, gen)
    assert gen["sampling_params"]["custom_params"] == {"other": 1, "specexit_confidence_threshold": 0.9,
                                                       "specexit_max_think_tokens": 64}
    prefill = {"text": "q", "sampling_params": {"max_new_tokens": 0}}
    ep._add_images(s, prefill)
    assert "custom_params" not in prefill["sampling_params"]
    with pytest.raises(ValueError, match="specexit_window"):
        specexit_custom_params({"window": 0})


# --- draft-confidence per token: truncation edit, the draft-extend rows kept by position -----------


def test_truncation_keeps_the_tokens_and_makes_the_next_accepted_draft_the_bonus():
    # Worked example, request 0 ends after r_1 (keep 1): r_2 = 12 becomes its bonus (the next root);
    # request 1 is untouched. No token changes anywhere.
    from sglang_ext.engine.specexit.cut import apply_truncation

    ex = _worked_example()
    ids_before = ex["next_token_ids"].clone()
    prepared = (torch.tensor([3, 2]), torch.tensor([3, 6]), ex["next_token_ids"].clone())
    new = apply_truncation(ex["next_token_ids"], ex["accept_lens"], ex["new_seq_lens"], ex["bonus_tokens"],
                           torch.tensor([True, False]), torch.tensor([1, 2]), N, accept_index=ex["accept_index"],
                           prepared_draft_extend_inputs=prepared)
    assert torch.equal(ex["next_token_ids"], ids_before) and torch.equal(prepared[2], ids_before)
    assert new.tolist() == [2, 3] and ex["accept_lens"].tolist() == [2, 3]
    assert ex["new_seq_lens"].tolist() == [12, 23] and ex["bonus_tokens"].tolist() == [12, 77]
    assert ex["accept_index"].tolist() == [[0, 1, -1, -1], [4, 5, 6, -1]]
    assert prepared[0].tolist() == [1, 2] and prepared[1].tolist() == [1, 6]


def _dc_runner(max_slots=4):
    from sglang_ext.engine.specexit.runner import SpecExitRunner

    runner = SpecExitRunner.__new__(SpecExitRunner)
    runner.source = "draft-confidence"
    runner.boundary_ids, runner.stop_think_id = (7,), STOP
    runner.state, runner.ring = None, None
    runner.missing = torch.zeros((), dtype=torch.int64)
    runner.truncations = torch.zeros((), dtype=torch.int64)
    runner._worker = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(
        req_to_token=torch.zeros((max_slots, 64), dtype=torch.int32)))
    return runner


def test_draft_extend_rows_are_kept_as_the_value_of_the_position_two_after():
    # Two requests in slots 3 and 1, extend windows of 3 rows from positions 10 and 20. Row logits
    # [ln 3, 0] have max-softmax 0.75, [0, 0] 0.5; row i of slot 3 is the value of position 12 + i.
    runner = _dc_runner()
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0], [0.0, 0.0],
                           [0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]])
    fb = SimpleNamespace(positions=torch.tensor([10, 11, 12, 20, 21, 22]), extend_seq_lens=torch.tensor([3, 3]),
                         req_pool_indices=torch.tensor([3, 1]))
    runner._extend_rows(fb, logits)
    values, held = runner.ring.read(torch.tensor([3, 1]), torch.tensor([[12, 13, 14, 15], [22, 23, 24, 12]]))
    assert held.tolist() == [[True, True, True, False], [True, True, True, False]]
    assert torch.allclose(values[:, :3], torch.tensor([[0.75, 0.5, 0.5], [0.5, 0.75, 0.5]]), atol=1e-6)
    # a prefill (prompt length 30 in slot 3) forgets the slot, leaves position 30 held without a value
    # and keeps its last row as the value of position 31
    runner._prefill_rows(SimpleNamespace(seq_lens=torch.tensor([30]), req_pool_indices=torch.tensor([3])),
                         torch.tensor([[math.log(3.0), 0.0]]))
    values, held = runner.ring.read(torch.tensor([3]), torch.tensor([[12, 30, 31]]))
    assert held.tolist() == [[False, True, True]] and math.isnan(values[0, 1])
    assert values[0, 2].item() == pytest.approx(0.75, abs=1e-6)
    # rows that do not match their positions are not kept (warned once)
    runner._extend_rows(SimpleNamespace(positions=torch.tensor([40]), extend_seq_lens=torch.tensor([2]),
                                        req_pool_indices=torch.tensor([2])), logits[:2])
    assert not runner.ring.read(torch.tensor([2]), torch.tensor([[42]]))[1].any()

"""The accepted-rows draft extend on a stand-in forward batch (no SGLang import, no engine).

What the compacted forward receives (rows, lengths, slots, hidden states, a fresh attention
plan), what the caller gets back (outputs at their window rows), that the batch is restored
field by field, and every case where the full window must run instead. The engine-level check
(same output, steps and accepted tokens as SGLang's full-window extend on the trained models) is
``tests/integration/test_dcut_trained.py::check_draft_extend_rows``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.engine.dcut.draft_extend import (
    DRAFT_EXTEND_ACCEPTED,
    DRAFT_EXTEND_WINDOW,
    AcceptedRowsDraftExtend,
    accepted_row_index,
)

HIDDEN, VOCAB = 6, 5


class _Mode:
    def __init__(self, draft_extend_v2=True):
        self._v2 = draft_extend_v2

    def is_draft_extend_v2(self):
        return self._v2


def _batch(gen, accept, n, prefix):
    bs = len(accept)
    total = bs * n
    spec = SimpleNamespace(num_tokens_per_req=n, num_accept_tokens=torch.tensor(accept, dtype=torch.int32),
                           num_front_tokens=0, hidden_states=torch.randn(total, 3 * HIDDEN, generator=gen))
    positions = (torch.tensor(prefix).view(bs, 1) + torch.arange(n).view(1, n)).reshape(-1)
    return SimpleNamespace(
        forward_mode=_Mode(), spec_info=spec, batch_size=bs,
        input_ids=torch.randint(0, VOCAB, (total,), generator=gen),
        positions=positions,
        out_cache_loc=torch.randperm(1000, generator=gen)[:total],
        extend_seq_lens=torch.full((bs,), n, dtype=torch.int32),
        extend_seq_lens_cpu=[n] * bs,
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32),
        extend_prefix_lens_cpu=list(prefix),
        extend_start_loc=torch.arange(0, total, n, dtype=torch.int32),
        extend_num_tokens=total,
        seq_lens=torch.tensor(prefix, dtype=torch.int64) + n,
        seq_lens_cpu=torch.tensor(prefix, dtype=torch.int64) + n,
        seq_lens_sum=sum(prefix) + bs * n,
        forward_metadata_ready=True,
        mrope_positions=None,
        global_num_tokens_cpu=None,
    )


def _runner(flag=True):
    backend = SimpleNamespace(supports_ragged_draft_extend=flag)
    return SimpleNamespace(attn_backend=backend, device="cpu")


def _model(record):
    """A stand-in draft forward: per-row outputs that depend on the row's token and position."""

    def forward(fb):
        record.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(fb).items()
                       if k not in ("forward_mode", "spec_info")})
        record[-1]["hidden_in"] = fb.spec_info.hidden_states.clone()
        logits = torch.nn.functional.one_hot(fb.input_ids, VOCAB).float() + fb.positions.view(-1, 1).float()
        hidden = fb.spec_info.hidden_states[:, :HIDDEN] * 2
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden))

    return forward


@pytest.mark.parametrize("seed", range(20))
def test_accepted_row_index_matches_a_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 17, (1,), generator=gen))
    bs = int(torch.randint(1, 9, (1,), generator=gen))
    accept = torch.randint(1, n + 1, (bs,), generator=gen)
    want = [b * n + j for b in range(bs) for j in range(int(accept[b]))]
    assert accepted_row_index(accept, n).tolist() == want


@pytest.mark.parametrize("seed", range(10))
def test_compacted_forward_sees_the_accepted_rows_and_outputs_return_to_their_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    n = 8
    accept = torch.randint(1, n + 1, (5,), generator=gen).tolist()
    prefix = torch.randint(3, 40, (5,), generator=gen).tolist()
    fb = _batch(gen, accept, n, prefix)
    before = {k: v for k, v in vars(fb).items()}
    spec_before = fb.spec_info
    full_out = _model([])(fb)  # what SGLang's full-window forward would return, row by row
    record = []
    ext = AcceptedRowsDraftExtend(_runner(), DRAFT_EXTEND_ACCEPTED)
    out = ext(_model(record), (fb,), {})
    rows = [b * n + j for b in range(5) for j in range(accept[b])]
    seen = record[0]
    assert seen["input_ids"].tolist() == before["input_ids"][rows].tolist()
    assert seen["positions"].tolist() == before["positions"][rows].tolist()
    assert seen["out_cache_loc"].tolist() == before["out_cache_loc"][rows].tolist()
    assert torch.equal(seen["hidden_in"], spec_before.hidden_states[rows])
    assert seen["extend_seq_lens"].tolist() == accept and seen["extend_seq_lens_cpu"] == accept
    assert seen["extend_start_loc"].tolist() == [sum(accept[:b]) for b in range(5)]
    assert seen["extend_num_tokens"] == sum(accept)
    assert seen["seq_lens"].tolist() == [p + a for p, a in zip(prefix, accept)]
    assert seen["seq_lens_cpu"].tolist() == [p + a for p, a in zip(prefix, accept)]
    assert seen["seq_lens_sum"] == sum(prefix) + sum(accept)
    assert seen["forward_metadata_ready"] is False  # the full-window plan is not reused
    # restored, field by field (same objects)
    for k, v in before.items():
        assert getattr(fb, k) is v, k
    assert fb.spec_info is spec_before
    # every accepted row holds what the full-window forward computes there; other rows are zero
    lo = out.logits_output
    assert lo.next_token_logits.shape == (5 * n, VOCAB) and lo.hidden_states.shape == (5 * n, HIDDEN)
    assert torch.equal(lo.next_token_logits[rows], full_out.logits_output.next_token_logits[rows])
    assert torch.equal(lo.hidden_states[rows], full_out.logits_output.hidden_states[rows])
    other = [r for r in range(5 * n) if r not in set(rows)]
    assert torch.all(lo.next_token_logits[other] == 0)
    # SGLang's select_index (last accepted row per request) lands on computed rows
    select = [b * n + accept[b] - 1 for b in range(5)]
    assert torch.equal(lo.next_token_logits[select], full_out.logits_output.next_token_logits[select])
    assert ext.stats.compacted_forwards == 1 and ext.stats.rows_run == sum(accept)
    assert ext.stats.rows_window == 5 * n and ext.stats.window_forwards == 0


def _case(name):
    gen = torch.Generator().manual_seed(0)
    fb = _batch(gen, [2, 3], 4, [5, 6])
    runner = _runner()
    mode = DRAFT_EXTEND_ACCEPTED
    if name == "window":
        mode = DRAFT_EXTEND_WINDOW
    elif name == "backend":
        runner = _runner(flag=False)
    elif name == "widened":
        fb.spec_info.num_front_tokens = 2
    elif name == "zero_accept":
        fb.spec_info.num_accept_tokens = torch.tensor([0, 3], dtype=torch.int32)
    elif name == "rows":  # a window that is not bs x N rows (e.g. padded by another path)
        fb.input_ids = fb.input_ids[:-1]
        fb.positions = fb.positions[:-1]
    elif name == "mrope":
        fb.mrope_positions = torch.zeros(3, 8)
    elif name == "dp":
        fb.global_num_tokens_cpu = [8]
    elif name == "selected":
        fb.spec_info.select_index = torch.tensor([1, 6])
    return fb, AcceptedRowsDraftExtend(runner, mode)


@pytest.mark.parametrize("name", ["window", "backend", "widened", "zero_accept", "rows", "mrope", "dp", "selected"])
def test_full_window_runs_unchanged_where_compaction_is_not_exact(name, caplog):
    fb, ext = _case(name)
    ids, lens = fb.input_ids, fb.extend_seq_lens
    record = []
    with caplog.at_level(logging.WARNING):
        ext(_model(record), (fb,), {})
        ext(_model(record), (fb,), {})
    assert record[0]["input_ids"] is not None and torch.equal(record[0]["input_ids"], ids)
    assert torch.equal(record[0]["extend_seq_lens"], lens)
    assert ext.stats.compacted_forwards == 0 and ext.stats.window_forwards == 2
    warnings = [r for r in caplog.records if "full verify window" in r.getMessage()]
    if name == "window":  # the user's choice: counted, not warned, not a skip
        assert ext.stats.skipped == {} and not warnings
    else:  # each reason warned once, counted every time
        assert sum(ext.stats.skipped.values()) == 2 and len(warnings) == 1


def test_other_forward_modes_pass_through_uncounted():
    gen = torch.Generator().manual_seed(1)
    fb = _batch(gen, [1, 1], 4, [3, 3])
    fb.forward_mode = _Mode(draft_extend_v2=False)
    ext = AcceptedRowsDraftExtend(_runner())
    record = []
    ext(_model(record), (fb,), {})
    assert record[0]["extend_num_tokens"] == 8
    assert ext.stats.window_forwards == 0 and ext.stats.compacted_forwards == 0


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="accepted, window"):
        AcceptedRowsDraftExtend(_runner(), "some")

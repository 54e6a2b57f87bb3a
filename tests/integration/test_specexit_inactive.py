"""SpecExit on a model without a one-token ``</think>`` (a non-thinking model): inactive, not a launch error.

The project tokenizer (``sglang_ext.testbed.tokenizer``) is wrapped so that ``</think>`` encodes
to several tokens, as on SmolLM2-135M-Instruct; the :class:`SpecExitRunner` is built around it
(its tokenizer loader replaced, a stand-in worker) and driven with stand-in batches:

* one warning at start, ``/server_info`` says ``active: false`` with the reason;
* every prefilled request gets ``specexit_active`` false in its ``meta_info`` values;
* a verify result passes through untouched (no state, no cut);
* an explicitly given multi-token ``--specexit-stop-think-token`` still refuses the start.

The end-to-end check on the real model is the slow test in ``test_real_model.py``.
Budget: < 5 s (no engine, no model).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.config import ConfigError, SpecExitConfig


class _NoThinkTokenizer:
    """The project tokenizer, except that ``</think>`` is spelled as several ordinary tokens."""

    def __init__(self):
        from sglang_ext.testbed.tokenizer import build_tokenizer

        self.inner = build_tokenizer()

    def encode(self, text, add_special_tokens=False):
        return self.inner.encode(text.replace("</think>", "</ think>").replace("<think>", "< think>"),
                                 add_special_tokens=add_special_tokens)


@pytest.fixture
def no_think_tokenizer(monkeypatch):
    from sglang_ext.engine.specexit.runner import SpecExitRunner

    tok = _NoThinkTokenizer()
    assert len(tok.encode("</think>")) > 1  # the premise: no single stop-think token
    assert len(tok.inner.encode("</think>", add_special_tokens=False)) == 1  # the unwrapped one has it
    monkeypatch.setattr(SpecExitRunner, "_load_tokenizer", staticmethod(lambda: tok))
    return tok


def _worker():
    return SimpleNamespace(draft_worker=SimpleNamespace(draft_runner=SimpleNamespace(model=SimpleNamespace())))


def _req(rid, slot, prompt):
    return SimpleNamespace(rid=rid, kv=SimpleNamespace(req_pool_idx=slot), output_ids=[], origin_input_ids=prompt,
                           require_reasoning=True, grammar=None, sampling_params=SimpleNamespace(custom_params=None))


_EXTEND = SimpleNamespace(is_idle=lambda: False, is_extend=lambda: True)


@pytest.mark.parametrize("source", ["draft-confidence", "head"])
def test_runner_is_inactive_and_touches_nothing(no_think_tokenizer, caplog, source):
    from sglang_ext.engine.specexit.hooks import report_values
    from sglang_ext.engine.specexit.runner import SpecExitRunner

    cfg = SpecExitConfig(enabled=True, signal_source=source)
    worker = _worker()  # no SpecExit rows: the head source would be refused on an active model
    with caplog.at_level(logging.WARNING):
        if source == "head":
            with pytest.raises(ConfigError, match=r"^--specexit-signal-source head: .*no SpecExit signal rows"):
                SpecExitRunner(worker, cfg)
            return
        runner = SpecExitRunner(worker, cfg)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["SpecExit: the tokenizer has no single '</think>' token (it encodes to "
                        f"{len(no_think_tokenizer.encode('</think>'))} tokens); SpecExit is inactive on this model "
                        "(no thinking span to end); requests are served as without --specexit"]
    assert not runner.active

    think_open = no_think_tokenizer.inner.encode("<think>", add_special_tokens=False)
    reqs = [_req("a", 0, [7, 8] + think_open), _req("b", 1, [9])]  # 'a' even ends inside a <think> block
    runner.on_prefill(worker, SimpleNamespace(reqs=reqs, forward_mode=_EXTEND), None)
    assert [report_values(r) for r in reqs] == [[False, False, None, None, None]] * 2
    assert runner.state is None  # nothing allocated, nothing watched

    next_ids = torch.tensor([11, 12, 13, 14, 21, 22, 23, 24])  # [bs * num_draft_tokens]
    accept = torch.tensor([4, 2])  # [bs]
    result = SimpleNamespace(accept_lens=accept, next_token_ids=next_ids, speculative_num_draft_tokens=4,
                             new_seq_lens=torch.tensor([10, 8]), logits_output=SimpleNamespace())
    batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_idle=lambda: False),
                            req_pool_indices=torch.tensor([0, 1]))
    out = runner.after_verify(worker, batch, SimpleNamespace(draft_token_num=4), result)
    assert out is result
    assert out.next_token_ids.tolist() == [11, 12, 13, 14, 21, 22, 23, 24] and out.accept_lens.tolist() == [4, 2]
    assert out.new_seq_lens.tolist() == [10, 8] and not hasattr(out.logits_output, "auxiliary_device_output")

    info = runner.server_info()
    assert info["active"] is False and "no single '</think>' token" in info["inactive_reason"]
    assert info["signal_source"] == "draft-confidence" and info["method"] == "confidence"
    assert info["exits_total"] == 0


def test_explicit_multi_token_stop_think_token_refuses_the_start(no_think_tokenizer):
    from sglang_ext.engine.specexit.runner import SpecExitRunner

    cfg = SpecExitConfig(enabled=True, signal_source="draft-confidence", stop_think_token="</think>")
    with pytest.raises(ConfigError, match=r"^--specexit-stop-think-token: '</think>' must encode to exactly one"):
        SpecExitRunner(_worker(), cfg)


def test_the_same_runner_is_active_with_the_unwrapped_tokenizer(monkeypatch):
    """Control: the project tokenizer has a one-token ``</think>``, so the runner watches requests."""
    from sglang_ext.engine.specexit.runner import SpecExitRunner
    from sglang_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    monkeypatch.setattr(SpecExitRunner, "_load_tokenizer", staticmethod(lambda: tok))
    runner = SpecExitRunner(_worker(), SpecExitConfig(enabled=True, signal_source="draft-confidence"))
    assert runner.active and runner.stop_think_id == tok.encode("</think>", add_special_tokens=False)[0]
    assert runner.server_info()["active"] is True

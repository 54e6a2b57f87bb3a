"""Unit tests of the evaluate tool's scoring helpers (no SGLang; the Engine run is not exercised here).

Budget: < 5 s.
"""

import pytest

from sglang_ext.testbed import evaluate as ev
from sglang_ext.testbed import task
from sglang_ext.testbed.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_think_and_oracle_tokens_on_a_reference_trace(tok):
    p = task.parse_question("Compute: 7 + 4 - 2")
    text = task.completion_text(p, 8)
    ids = tok.encode(text, add_special_tokens=False)
    think = ev.think_tokens(ids, tok.convert_tokens_to_ids("</think>"))
    # the think span is every paragraph plus its break
    paras = task.think_paragraphs(p, 8)
    expected = sum(len(tok.encode(x + "\n\n", add_special_tokens=False)) for x in paras)
    assert think == expected
    oracle = ev.oracle_think_tokens(tok, text)
    assert oracle == sum(len(tok.encode(x + "\n\n", add_special_tokens=False)) for x in paras[:3])
    assert oracle < think
    assert ev.oracle_think_tokens(tok, "Step 1: 1 + 2 = 3.\n\n") is None


def test_summary_fields_and_values():
    def r(correct, out, think, lat, text="", exited=False):
        return ev.Result("i", "3", text, "3" if correct else None, correct, out, think, exited, None, lat)

    results = [r(True, 10, 6, 1.0, exited=True), r(False, 30, 20, 3.0)]
    s = ev.summarize(results, wall_s=4.0, verify_steps=16)
    assert s["n"] == 2 and s["accuracy"] == 0.5
    assert s["mean_output_tokens"] == 20 and s["mean_think_tokens"] == 13
    assert s["mean_latency_s"] == 2.0 and s["throughput_tok_s"] == 10.0
    assert s["accept_length"] == 40 / 16 and s["exited_early_rate"] == 0.5
    assert s["mean_oracle_think_tokens"] is None
    assert ev.summarize(results, 4.0, 0)["accept_length"] == 0.0
    keys = {"n", "accuracy", "mean_output_tokens", "mean_think_tokens", "mean_latency_s",
            "accept_length", "throughput_tok_s"}
    assert keys <= set(s)

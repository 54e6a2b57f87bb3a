"""Unit tests of the synthetic task (``sglang_ext.testbed.task``).

Budget: < 10 s.
"""

import json
import random
import re

import pytest

from sglang_ext.testbed import task
from sglang_ext.testbed.tokenizer import UNK_TOKEN, build_tokenizer

QUESTION_RE = re.compile(r"Compute: \d( [+-] \d){1,3}")


def test_generated_problems_follow_the_grammar():
    ps = task.generate_problems(500, random.Random(3))
    assert all(QUESTION_RE.fullmatch(p.question) for p in ps)
    assert {len(p.operands) for p in ps} == {2, 3, 4}
    assert {op for p in ps for op in p.ops} == {"+", "-"}
    # answers by direct left-to-right evaluation, not by Problem.steps
    for p in ps[:50]:
        toks = p.question[len("Compute: "):].split()
        acc = int(toks[0])
        for op, x in zip(toks[1::2], toks[2::2]):
            acc = acc + int(x) if op == "+" else acc - int(x)
        assert p.answer == acc


def test_generation_is_deterministic_in_the_rng():
    a = [p.to_json() for p in task.generate_problems(20, random.Random(7), "s7-")]
    b = [p.to_json() for p in task.generate_problems(20, random.Random(7), "s7-")]
    c = [p.to_json() for p in task.generate_problems(20, random.Random(8), "s7-")]
    assert a == b and a != c


def test_known_trace():
    p = task.parse_question("Compute: 7 + 4 - 2")
    assert p.answer == 9
    assert task.completion_text(p, 2) == (
        "Step 1: 7 + 4 = 11.\n\nStep 2: 11 - 2 = 9.\n\nSo the result is 9.\n\n"
        "Let me double-check step 1: 7 + 4 = 11.\n\n"
        "Wait, let me verify step 2 again: 11 - 2 = 9.\n\n"
        "</think>\n\nThe answer is 9.<|im_end|>"
    )
    paras = task.think_paragraphs(p, task.MAX_RECHECKS)
    assert len(paras) == 2 + 1 + 8
    assert paras[-1] == "Everything checks out, so the result is 9."


def test_negative_answer_and_parse():
    p = task.parse_question("Compute: 1 - 9 - 9")
    assert p.answer == -17
    text = task.completion_text(p, 0)
    assert "Step 2: -8 - 9 = -17." in text
    assert task.parse_answer(text) == "-17"
    assert task.parse_answer("So the result is 3.\n\n</think>\n\nno answer") is None
    # only the answer after </think> counts when present
    assert task.parse_answer("The answer is 1.\n\n</think>\n\nThe answer is 2.") == "2"


def test_bad_question_rejected():
    for q in ["Compute: 10 + 1", "Compute: 1", "Compute: 1 * 2", "Compute: 1 + 2 + 3 + 4 + 5"]:
        with pytest.raises(ValueError):
            task.parse_question(q)


def test_recheck_distribution_overthinks():
    rng = random.Random(0)
    ks = [task.sample_num_rechecks(rng) for _ in range(20000)]
    assert min(ks) == 0 and max(ks) == task.MAX_RECHECKS
    # the hazard of stopping after k < MAX re-checks stays below 1/2: greedy keeps going
    for k in range(task.MAX_RECHECKS):
        at_least = sum(x >= k for x in ks)
        assert sum(x == k for x in ks) / at_least < 0.2
    assert task.count_rechecks(task.completion_text(task.parse_question("Compute: 1 + 2"), 8)) == 8


def test_all_task_texts_tokenize_without_unknowns_and_round_trip():
    tok = build_tokenizer()
    unk = tok.convert_tokens_to_ids(UNK_TOKEN)
    for p in task.generate_problems(200, random.Random(1)):
        for k in (0, task.MAX_RECHECKS):
            text = task.prompt_text(p.question) + task.completion_text(p, k)
            ids = tok.encode(text, add_special_tokens=False)
            assert unk not in ids
            assert tok.decode(ids) == text
    assert tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                   add_generation_prompt=True) == task.prompt_text(p.question)


def test_cli_writes_jsonl(tmp_path):
    out = tmp_path / "p.jsonl"
    task.main(["--n", "5", "--seed", "11", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"id", "question", "answer"}
    for r in rows:
        assert task.parse_question(r["question"]).answer == int(r["answer"])
    assert len({r["id"] for r in rows}) == 5

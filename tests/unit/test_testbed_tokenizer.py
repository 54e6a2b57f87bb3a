"""Unit tests of the testbed tokenizer (``sglang_ext.testbed.tokenizer``).

Budget: < 5 s.
"""

import pytest

from sglang_ext.testbed import tokenizer as T

TRACE = (
    "Step 1: 7 + 4 = 11.\n\nStep 2: 11 - 9 = 2.\n\nStep 3: 2 - 8 = -6.\n\n"
    "So the result is -6.\n\nLet me double-check step 1: 7 + 4 = 11.\n\n"
    "Wait, let me verify step 2 again: 11 - 9 = 2.\n\n</think>\n\nThe answer is -6."
)


@pytest.fixture(scope="module")
def tok():
    return T.build_tokenizer()


def test_roundtrip_task_texts(tok):
    for text in [TRACE, "Compute: 7 + 4 - 2", "Compute: 0 - 9 + 9 - 0", "The answer is -17.", " x\ty\n"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert T.UNK_TOKEN not in tok.convert_ids_to_tokens(ids)


def test_pieces_of_a_step_paragraph(tok):
    ids = tok.encode("Step 1: 7 + 4 = 11.\n\n", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == [
        "Step", " 1", ":", " 7", " +", " 4", " =", " 1", "1", ".", "\n\n"
    ]


def test_digits_are_single_tokens_and_never_merged(tok):
    for d in "0123456789":
        assert len(tok.encode(d, add_special_tokens=False)) == 1
        assert len(tok.encode(" " + d, add_special_tokens=False)) == 1
    assert len(tok.encode("1234567", add_special_tokens=False)) == 7


def test_special_and_think_tokens_are_one_id(tok):
    expected = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<think>": 3, "</think>": 4}
    for text, idx in expected.items():
        assert tok.encode(text, add_special_tokens=False) == [idx]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # </think> survives skip_special_tokens (the reasoning parser needs it), <|im_end|> does not.
    ids = tok.encode("a\n\n</think>\n\nb<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "a\n\n</think>\n\nb"


def test_paragraph_break_and_step_split_strings(tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    para = tok.convert_tokens_to_ids("\n\n")
    assert enc("\n\n") == [para]
    assert enc(".\n\n") == [tok.convert_tokens_to_ids("."), para]
    # Of SpecExit's default split strings exactly one is a single token here.
    splits = ["\n\n", "\n\n\n", ".\n\n", ".\n\n\n", " \n\n", " \n\n\n"]
    assert [s for s in splits if len(enc(s)) == 1] == ["\n\n"]


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "Compute: 7 + 4 - 2"}]
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert on == "<|im_start|>user\nCompute: 7 + 4 - 2<|im_end|>\n<|im_start|>assistant\n<think>\n"
    off = tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == "<|im_start|>user\nCompute: 7 + 4 - 2<|im_end|>\n<|im_start|>assistant\n"
    assert "<think>" not in off


def test_vocab_small_and_deterministic():
    v1, v2 = T.base_vocab(), T.base_vocab()
    assert v1 == v2
    assert 100 < len(v1) <= T.MODEL_VOCAB_SIZE
    assert sorted(v1.values()) == list(range(len(v1)))


def test_save_and_reload(tmp_path):
    from transformers import AutoTokenizer

    T.save_tokenizer(str(tmp_path))
    tok2 = AutoTokenizer.from_pretrained(str(tmp_path))
    ref = T.build_tokenizer()
    assert tok2.encode(TRACE, add_special_tokens=False) == ref.encode(TRACE, add_special_tokens=False)
    assert tok2.decode(tok2.encode(TRACE, add_special_tokens=False)) == TRACE
    msgs = [{"role": "user", "content": "Compute: 1 + 2"}]
    assert tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n<think>\n"
    )
    assert tok2.eos_token_id == 2 and tok2.pad_token_id == 0

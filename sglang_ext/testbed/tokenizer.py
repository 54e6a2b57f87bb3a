"""Word-level tokenizer for the tiny thinking models of the CPU testbed.

The vocabulary is built by hand (no training, so it is deterministic) with the
``tokenizers`` library and wrapped as a ``transformers.PreTrainedTokenizerFast``
with a Qwen3-style chat template.

Pieces, in the order the pre-tokenizer tries them at each position::

    "\\n\\n"                 paragraph break, ONE token (the SpecExit boundary)
    " ?<word>"             a known word, optionally with its leading space
    " ?[0-9]"              one digit, optionally with its leading space
    " ?[+-=]"              an operator, optionally with its leading space
    any other character    one token per printable ASCII character, "\\n", "\\t"

Example: ``"Step 1: 7 + 4 = 11.\\n\\n"`` ->
``["Step", " 1", ":", " 7", " +", " 4", " =", " 1", "1", ".", "\\n\\n"]``.
Digits are never merged, so numbers are read digit by digit.  ``".\\n\\n"``
encodes to ``[".", "\\n\\n"]``; of SpecExit's default step-split strings only
``"\\n\\n"`` is a single token.  Decoding concatenates the pieces, so
``decode(encode(text)) == text`` for every ASCII text.

Special tokens: ``<|endoftext|>`` (pad, also an end-of-sequence id),
``<|im_start|>``, ``<|im_end|>`` (end of an assistant turn, the tokenizer's eos as
in Qwen3 chat models), ``<think>`` and ``</think>`` (non-special added tokens, so
they survive ``skip_special_tokens=True`` as in Qwen3, each one id).

Chat template (Qwen3 style)::

    <|im_start|>user\\nCompute: 7 + 4 - 2<|im_end|>\\n<|im_start|>assistant\\n<think>\\n

With ``enable_thinking=False`` the generation prompt stops after
``<|im_start|>assistant\\n`` (no ``<think>`` opener: a non-thinking request).
The assistant turn of a thinking trace reads
``<think>\\n{paragraph}\\n\\n...{paragraph}\\n\\n</think>\\n\\nThe answer is 9.<|im_end|>``,
so SGLang's ``--reasoning-parser qwen3-thinking`` applies unchanged.
"""

from __future__ import annotations

import json
import os
import string
from typing import Dict, List

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
UNK_TOKEN = "<unk>"
PARAGRAPH = "\n\n"

#: Special tokens, in id order (ids 0..4); ``<think>``/``</think>`` follow.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
THINK_TOKENS = (THINK_START, THINK_END)

#: Words of the task and trace templates (``sglang_ext.testbed.task``) and of the
#: chat template.  Each is in the vocabulary with and without a leading space.
WORDS = (
    "Actually", "Compute", "Everything", "Hmm", "Let", "One", "So", "Step", "The",
    "To", "Wait", "Yes", "again", "answer", "assistant", "at", "be", "check",
    "checking", "checks", "double", "gives", "is", "let", "look", "me", "more",
    "once", "out", "recompute", "result", "safe", "so", "step", "sure", "system",
    "the", "time", "to", "user", "verify",
)

OPERATORS = ("+", "-", "=")

#: Qwen3-style chat template; ``enable_thinking=False`` omits the ``<think>`` opener.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is not defined or enable_thinking -%}"
    "{{- '<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

#: Size the model's embedding is padded to (a multiple of 64, >= the vocabulary).
MODEL_VOCAB_SIZE = 256


def _escape(text: str) -> str:
    """Escape ``text`` for an Oniguruma regex."""
    return "".join("\\" + c if not (c.isalnum() or c == " ") else c for c in text)


def base_vocab() -> Dict[str, int]:
    """Return the token -> id map, deterministic and independent of the environment.

    Returns
    -------
    dict of str to int
        Ids are dense, 0..len-1: specials, think tokens, ``<unk>``, the paragraph
        break, single characters, spaced digits/operators, words.

    Examples
    --------
    >>> v = base_vocab()
    >>> v["<|endoftext|>"], v["</think>"], v["\\n\\n"] > 0
    (0, 4, True)
    """
    tokens: List[str] = list(SPECIAL_TOKENS) + list(THINK_TOKENS) + [UNK_TOKEN, PARAGRAPH]
    tokens += list(string.digits + string.ascii_letters + string.punctuation + " \n\t")
    tokens += [" " + d for d in string.digits]
    tokens += [" " + op for op in OPERATORS]
    for w in WORDS:
        tokens += [w, " " + w]
    seen: Dict[str, int] = {}
    for tok in tokens:
        if tok not in seen:
            seen[tok] = len(seen)
    assert len(seen) <= MODEL_VOCAB_SIZE, "vocabulary outgrew MODEL_VOCAB_SIZE"
    return seen


def _pretokenize_pattern() -> str:
    words = sorted(WORDS, key=lambda w: (-len(w), w))
    ops = "".join(_escape(o) for o in OPERATORS)
    return "|".join(
        [
            "\\n\\n",
            " ?(?:" + "|".join(_escape(w) for w in words) + ")",
            " ?[0-9]",
            " ?[" + ops + "]",
            "[\\s\\S]",
        ]
    )


def build_backend():
    """Build the raw ``tokenizers.Tokenizer`` (no chat template).

    Returns
    -------
    tokenizers.Tokenizer

    Examples
    --------
    >>> tok = build_backend()
    >>> tok.encode("7 + 4").tokens
    ['7', ' +', ' 4']
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=base_vocab(), unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_pretokenize_pattern()), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS + (UNK_TOKEN,)]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tok


def build_tokenizer():
    """Build the testbed tokenizer as a HF fast tokenizer with its chat template.

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        eos ``<|im_end|>``, pad ``<|endoftext|>``; ``chat_template`` set.

    Examples
    --------
    >>> tok = build_tokenizer()
    >>> tok.decode(tok.encode("Step 1: 7 + 4 = 11.\\n\\n"))
    'Step 1: 7 + 4 = 11.\\n\\n'
    >>> len(tok.encode("</think>"))
    1
    """
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_backend(),
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(out_dir: str):
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and the chat template to ``out_dir``.

    Parameters
    ----------
    out_dir : str
        Directory (created if missing); typically a model directory.

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        The tokenizer that was saved.

    Examples
    --------
    >>> import tempfile, transformers
    >>> d = tempfile.mkdtemp()
    >>> _ = save_tokenizer(d)
    >>> transformers.AutoTokenizer.from_pretrained(d).encode("9")
    [16]
    """
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer()
    tok.save_pretrained(out_dir)
    # Also keep the template inside tokenizer_config.json for loaders that only read it.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if "chat_template" not in cfg:
        cfg["chat_template"] = CHAT_TEMPLATE
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
    return tok

"""Whether a draft model's vocabulary matches its target's (pure; stdlib only).

SGLang's ``STANDALONE`` speculative decoding verifies the draft's token ids with the target, so
the two models must map every token to the same id: a draft whose tokenizer differs proposes ids
that mean other tokens to the target (users report silently wrong answers where a check is
missing). :func:`vocab_difference` names the first difference in one line, for a launch-time
refusal.
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = ["vocab_difference"]


def vocab_difference(target_vocab: Mapping[str, int], draft_vocab: Mapping[str, int],
                     target_size: Optional[int] = None, draft_size: Optional[int] = None) -> Optional[str]:
    """One line describing how the draft's vocabulary differs from the target's, or None when
    they match. ``*_vocab`` map token strings to ids (a tokenizer's ``get_vocab()``); ``*_size``
    are the models' embedding rows (``config.vocab_size``), compared when both are given.

    Examples
    --------
    >>> vocab_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}, 8, 8) is None
    True
    >>> vocab_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}, 8, 16)
    'the draft model has 16 vocabulary rows, the target 8'
    >>> vocab_difference({"a": 0, "b": 1, "c": 2}, {"a": 0, "b": 2, "c": 1})
    "2 of 3 tokens have other ids: 'b' is 1 in the target's tokenizer, 2 in the draft's"
    >>> vocab_difference({"a": 0, "b": 1}, {"a": 0})
    "the draft's tokenizer lacks 1 of the target's 2 tokens, e.g. 'b' (id 1)"
    >>> vocab_difference({"a": 0}, {"a": 0, "z": 1})
    "the draft's tokenizer has 1 token the target's lacks, e.g. 'z' (id 1)"
    """
    if target_size is not None and draft_size is not None and int(target_size) != int(draft_size):
        return f"the draft model has {int(draft_size)} vocabulary rows, the target {int(target_size)}"
    missing = [t for t in target_vocab if t not in draft_vocab]
    if missing:
        t = min(missing, key=lambda k: target_vocab[k])
        return (f"the draft's tokenizer lacks {len(missing)} of the target's {len(target_vocab)} tokens, "
                f"e.g. {t!r} (id {target_vocab[t]})")
    extra = [t for t in draft_vocab if t not in target_vocab]
    if extra:
        t = min(extra, key=lambda k: draft_vocab[k])
        return (f"the draft's tokenizer has {len(extra)} token{'s' if len(extra) > 1 else ''} the target's lacks, "
                f"e.g. {t!r} (id {draft_vocab[t]})")
    moved = [t for t in target_vocab if target_vocab[t] != draft_vocab[t]]
    if moved:
        t = min(moved, key=lambda k: target_vocab[k])
        return (f"{len(moved)} of {len(target_vocab)} tokens have other ids: {t!r} is {target_vocab[t]} in the "
                f"target's tokenizer, {draft_vocab[t]} in the draft's")
    return None

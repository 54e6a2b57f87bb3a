"""Process-environment helpers (stdlib only)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional


@contextmanager
def environ(values: Mapping[str, Optional[str]]) -> Iterator[None]:
    """Set (a str) or unset (None) each variable for the block, then restore what was there.

    Processes started inside the block (SGLang's spawned schedulers) inherit the values.

    Examples
    --------
    >>> os.environ.pop("SGLANG_EXT_DOCTEST", None)
    >>> with environ({"SGLANG_EXT_DOCTEST": "1"}):
    ...     os.environ["SGLANG_EXT_DOCTEST"]
    '1'
    >>> "SGLANG_EXT_DOCTEST" in os.environ
    False
    """
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

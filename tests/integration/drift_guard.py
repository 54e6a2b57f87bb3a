"""Helpers of the drift-guard tests: resolve a hooked SGLang symbol and read its parameters."""

from __future__ import annotations

import inspect
import pkgutil


def resolve(target: str):
    """The function behind a dotted hook target (``pkg.mod.Class.method``), unwrapped."""
    mod, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(mod)
    return inspect.unwrap(getattr(owner, attr))


def param_names(fn) -> list:
    """Parameter names of ``fn`` in order."""
    return list(inspect.signature(fn).parameters)

"""Load a script of ``bench/`` as a module, for tests that call its functions in-process."""

from __future__ import annotations

import importlib.util
import os
import sys

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


def load(name: str):
    """A fresh module of ``bench/<name>.py`` (registered in ``sys.modules``: dataclasses look
    their module up there)."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", os.path.join(BENCH_DIR, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod

"""Load ``tests/gpu/run_gpu_checks.py`` as a module for its CPU dry-run tests (a fresh copy per call)."""

from __future__ import annotations

import importlib.util
import os
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "run_gpu_checks.py")


def load():
    """A freshly executed copy of the GPU check script, registered as ``run_gpu_checks``."""
    spec = importlib.util.spec_from_file_location("run_gpu_checks", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod

"""Import-time stand-ins that let real SGLang 0.5.23 run on a machine without CUDA.

SGLang imports two packages that cannot work next to a CPU build of torch:

* ``torchvision`` -- imported unconditionally by multimodal code paths; PyPI's wheel is
  CUDA-linked and fails to import beside CPU torch (``operator torchvision::nms does not
  exist``). Text models never call it, so a stand-in with lazy placeholders suffices.
  ``__version__`` is a valid version string (transformers parses it) and
  ``transforms.InterpolationMode`` is a real Enum (used in class bodies).
* ``sgl_kernel`` -- with ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports ``*_cpu`` names from it at
  module load. The stand-in exposes **only** names ending in ``_cpu`` (plain-torch
  implementations from :mod:`sglang_ext.engine.cpu.spec_ops` where the project provides
  one, otherwise a function that raises a clear error when called) and the
  ``sgl_kernel.speculative`` submodule. Every other attribute raises ``AttributeError`` so
  SGLang's own ``try/except ImportError`` fallbacks keep working.

Activation: :func:`install` puts a meta-path finder *in front of* the normal finders, but the
finder serves a stand-in only when no CUDA device is present (``torch.cuda.is_available()``
is False, checked lazily at the first import of either package) and
``SGLANG_EXT_CPU_STANDINS`` is not ``"0"``. On a GPU machine the real packages are always
used. The finder is installed in every process, including SGLang's spawned scheduler and
detokenizer, through the ``sitecustomize`` module in :data:`SHIMS_DIR`, which the CPU
testbed puts on ``PYTHONPATH`` (see :func:`cpu_testbed_env`).
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Callable, Dict, Optional

SHIMS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims")
ENV_SWITCH = "SGLANG_EXT_CPU_STANDINS"
STANDIN_TOPLEVEL = ("torchvision", "sgl_kernel")
TORCHVISION_STANDIN_VERSION = "0.0.0+sglangext.cpu"

_active_cache: Optional[bool] = None


def standins_active() -> bool:
    """True when the stand-ins should shadow ``torchvision``/``sgl_kernel`` in this process."""
    global _active_cache
    if _active_cache is None:
        if os.environ.get(ENV_SWITCH, "1") == "0":
            _active_cache = False
        else:
            import torch

            _active_cache = not torch.cuda.is_available()
    return _active_cache


# ----------------------------------------------------------------------------- torchvision
class _Placeholder:
    """Stands for any torchvision object; using it (calling) raises a clear error."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} is unavailable: sglang_ext's CPU testbed replaces torchvision "
            "with a stand-in (text models only)."
        )

    def __repr__(self) -> str:
        return f"<sglang_ext torchvision stand-in {self._qualname}>"


class InterpolationMode(enum.Enum):
    """Mirror of ``torchvision.transforms.InterpolationMode`` (values as upstream)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _TorchvisionModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode" and self.__name__.startswith("torchvision.transforms"):
            return InterpolationMode
        return _Placeholder(f"{self.__name__}.{name}")


def _exec_torchvision(module: types.ModuleType) -> None:
    module.__class__ = _TorchvisionModule
    if module.__name__ == "torchvision":
        module.__version__ = TORCHVISION_STANDIN_VERSION
    if module.__name__.startswith("torchvision.transforms"):
        module.InterpolationMode = InterpolationMode


# ----------------------------------------------------------------------------- sgl_kernel
def _missing_cpu_op(name: str) -> Callable:
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by sglang_ext's CPU stand-in; this code path "
            "is not supported on the CPU testbed."
        )

    op.__name__ = name
    op.__qualname__ = name
    return op


def _spec_ops_module():
    import importlib

    return importlib.import_module("sglang_ext.engine.cpu.spec_ops")


def _cpu_ops() -> Dict[str, Callable]:
    return dict(_spec_ops_module().CPU_OPS)


def _speculative_ops() -> Dict[str, Callable]:
    return dict(getattr(_spec_ops_module(), "SPECULATIVE_OPS", {}))


class _SglKernelModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.endswith("_cpu") and not name.startswith("__"):
            op = _cpu_ops().get(name) or _missing_cpu_op(name)
            setattr(self, name, op)
            return op
        raise AttributeError(f"module 'sgl_kernel' (sglang_ext CPU stand-in) has no attribute {name!r}")


class _SglKernelSpeculativeModule(types.ModuleType):
    def __getattr__(self, name: str):
        ops = _speculative_ops()
        if name in ops:
            return ops[name]
        raise AttributeError(
            f"module 'sgl_kernel.speculative' (sglang_ext CPU stand-in) has no attribute {name!r}"
        )


_SGL_KERNEL_MODULES = {
    "sgl_kernel": _SglKernelModule,
    "sgl_kernel.speculative": _SglKernelSpeculativeModule,
}


# ----------------------------------------------------------------------------- finder
class _StandinLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name.split(".")[0] == "torchvision":
            _exec_torchvision(module)
        else:
            module.__class__ = _SGL_KERNEL_MODULES[name]
        module.__sglang_ext_standin__ = True


class StandinFinder(importlib.abc.MetaPathFinder):
    """Serves the stand-ins for ``torchvision.*``, ``sgl_kernel`` and ``sgl_kernel.speculative``."""

    _loader = _StandinLoader()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in STANDIN_TOPLEVEL:
            return None
        if top == "sgl_kernel" and fullname not in _SGL_KERNEL_MODULES:
            return None  # e.g. sgl_kernel.scalar_type: let the import fail as upstream expects
        if not standins_active():
            return None
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)


def install() -> bool:
    """Put the stand-in finder first on ``sys.meta_path`` (idempotent). Returns True if added."""
    if any(isinstance(f, StandinFinder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, StandinFinder())
    return True


def cpu_testbed_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for a process tree that runs SGLang on the CPU testbed.

    Adds :data:`SHIMS_DIR` in front of ``PYTHONPATH`` (so every spawned SGLang process runs the
    ``sitecustomize`` that calls :func:`install`) and sets ``SGLANG_USE_CPU_ENGINE=1``.

    Examples
    --------
    >>> env = cpu_testbed_env({"PYTHONPATH": "x"})
    >>> env["PYTHONPATH"].endswith(os.pathsep + "x"), env["SGLANG_USE_CPU_ENGINE"]
    (True, '1')
    """
    env = dict(os.environ if base is None else base)
    parts = [SHIMS_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHIMS_DIR]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


#: ``sglang.Engine`` settings that make SGLang 0.5.23 run (and agree with HF greedy output) on the
#: CPU testbed; shared by the engine tests and the benches.
CPU_ENGINE_KWARGS = dict(
    device="cpu",
    sampling_backend="pytorch",
    disable_cuda_graph=True,
    dtype="float32",
    mem_fraction_static=0.5,
    max_total_tokens=4096,
    chunked_prefill_size=-1,
    skip_server_warmup=True,
    random_seed=0,
    log_level="warning",
)

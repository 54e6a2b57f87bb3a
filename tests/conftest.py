"""Test-session set-up shared by every tier.

On a machine without CUDA the CPU testbed is activated before anything imports SGLang:
``SGLANG_USE_CPU_ENGINE=1``, the torchvision/sgl_kernel stand-ins in this process, and the
stand-ins' ``sitecustomize`` on ``PYTHONPATH`` for SGLang's spawned processes.
"""

import os

import pytest


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if not _cuda_available():
    from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

    os.environ.update(cpu_testbed_env())
    install()
    # The kernel tests compare the project's torch ops with SGLang's Triton kernels run by the
    # Triton interpreter. TRITON_INTERPRET only takes effect when a kernel module is first imported,
    # and test collection imports those modules as a side effect, so it is set for the whole session
    # here (SGLang itself never reads it; without a GPU no compiled Triton kernel can run anyway).
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="GPU test: no CUDA device on this machine (GPU path not run)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

"""Test-session set-up shared by every tier.

On a machine without CUDA the CPU testbed is activated before anything imports SGLang:
``SGLANG_USE_CPU_ENGINE=1``, the torchvision/sgl_kernel stand-ins in this process, and the
stand-ins' ``sitecustomize`` on ``PYTHONPATH`` for SGLang's spawned processes.
"""

import atexit
import os
import warnings

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


def _tracker_pid():
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None)


def _spare_the_resource_tracker() -> None:
    """``Engine.shutdown`` kills every child of this process, multiprocessing's resource tracker among
    them; the tracker is relaunched with an empty table, and at exit it prints a ``KeyError``
    traceback for each semaphore registered with the old one. The test process runs many in-process
    engines, so their teardown skips the tracker (SGLang's own ``skip_pid``). Tests only: a server
    process runs one engine and exits with it."""
    import sglang.srt.entrypoints.engine as engine

    if getattr(engine.kill_process_tree, "_spares_tracker", False):
        return
    kill = engine.kill_process_tree

    def kill_process_tree(parent_pid, include_parent=True, skip_pid=None, **kwargs):
        if skip_pid is None and parent_pid in (None, os.getpid()) and not include_parent:
            skip_pid = _tracker_pid()
        return kill(parent_pid, include_parent=include_parent, skip_pid=skip_pid, **kwargs)

    kill_process_tree._spares_tracker = True
    engine.kill_process_tree = kill_process_tree


def pytest_runtest_setup(item):
    if "integration" in item.path.parts:  # the tier that runs engines in this process
        _spare_the_resource_tracker()


class _ShutdownStderr:
    """sys.stderr from the last atexit handler on: drops the one SWIG line (see below), passes the rest
    line by line. Holds what it needs itself: module globals may be gone when the interpreter writes."""

    NOISE = "DeprecationWarning: builtin type swigvarlink has no __module__ attribute"

    def __init__(self, stream):
        self.stream = stream
        self.line = ""  # the interpreter writes a warning in pieces: file, line, category, message

    def write(self, text):
        self.line += text
        if "\n" in self.line:
            done, self.line = self.line.rsplit("\n", 1)
            kept = [line for line in done.split("\n") if self.NOISE not in line]
            if kept:
                self.stream.write("\n".join(kept) + "\n")
        return len(text)

    def flush(self):
        if self.line:
            self.stream.write(self.line)
            self.line = ""
        return self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _quiet_swig_at_exit() -> None:
    import sys

    # the shutdown puts sys.__stderr__ back in place of sys.stderr before it clears the modules
    sys.stderr = sys.__stderr__ = _ShutdownStderr(sys.stderr)


# SWIG-built extensions that SGLang imports (sentencepiece) warn once more while the interpreter
# shuts down, after pytest's summary, its warning capture and the warning filters themselves are
# gone: ``sys:1: DeprecationWarning: builtin type swigvarlink has no __module__ attribute``. This
# handler runs last (the first registered); from then on that one line is dropped, nothing else.
atexit.register(_quiet_swig_at_exit)


def pytest_unconfigure(config):
    # SGLang's Engine registers its shutdown with atexit; an engine a test already shut down logs
    # "kill_process_tree called" once more at exit, to a stream pytest's capture has closed by then.
    # Logging's own "--- Logging error ---" report of that write is noise after the summary.
    import logging

    logging.raiseExceptions = False

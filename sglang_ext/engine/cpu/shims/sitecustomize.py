"""Loaded by every Python process that has this folder on PYTHONPATH (the sglang_ext CPU testbed).

It only installs sglang_ext's import finder for the torchvision/sgl_kernel stand-ins; the
finder itself decides lazily (no CUDA device present) whether to serve them.
"""
try:
    from sglang_ext.engine.cpu.standins import install as _install

    _install()
except ImportError:  # sglang_ext not importable in this interpreter: nothing to do
    pass

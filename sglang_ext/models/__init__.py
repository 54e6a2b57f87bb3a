"""Real models for the project without a model hub: ``python -m sglang_ext.models fetch NAME``.

See :mod:`sglang_ext.models.registry` (the table), :mod:`sglang_ext.models.download`
(download, checksum, cache) and :mod:`sglang_ext.models.convert` (GGUF -> safetensors).
No SGLang import.
"""

from sglang_ext.models.registry import REGISTRY, ModelsError, default_cache_dir, lookup

__all__ = ["REGISTRY", "ModelsError", "default_cache_dir", "lookup", "fetch", "path"]


def fetch(name, cache_dir=None, progress=True):
    """Local directory of ``name`` (fetched and converted on first use)."""
    from sglang_ext.models.download import fetch as _fetch

    return _fetch(name, cache_dir, progress)


def path(name, cache_dir=None):
    """Where ``name`` lives once fetched (it may not exist yet)."""
    from sglang_ext.models.registry import model_dir

    return model_dir(lookup(name), cache_dir)

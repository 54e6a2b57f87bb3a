"""sglang_ext: SpecExit and D-Cut for SGLang 0.5.23 speculative decoding.

SGLang finds this package through the ``sglang.srt.plugins`` entry point and calls
:func:`register` in every process (launcher, schedulers, detokenizer). Nothing heavy is
imported at module load; :func:`register` imports the glue layer lazily.
"""

__version__ = "0.1.0"

SUPPORTED_SGLANG_VERSION = "0.5.23"


def register() -> None:
    """Install the extension's hooks into SGLang (idempotent)."""
    from sglang_ext.engine.plugin import register_hooks

    register_hooks()

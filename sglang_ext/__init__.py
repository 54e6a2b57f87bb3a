"""sglang_ext: SpecExit and D-Cut for SGLang 0.5.23 speculative decoding.

SGLang finds this package through the ``sglang.srt.plugins`` entry point and calls
:func:`register` in every process (launcher, schedulers, detokenizer). Nothing heavy is
imported at module load; :func:`register` imports the glue layer lazily.
"""

from sglang_ext.version import SUPPORTED_SGLANG_VERSION, __version__  # noqa: F401


def register() -> None:
    """Install the extension's hooks into SGLang (idempotent)."""
    from sglang_ext.engine.plugin import register_hooks

    register_hooks()


def load() -> None:
    """Load SGLang's plugins (this one included) in the current process.

    SGLang loads plugins itself inside ``sglang.Engine.__init__``, which is too late for the first
    Engine of a process to accept extension keyword arguments. Call this once before
    ``sglang.Engine(..., specexit=True, dcut="auto")``.
    """
    from sglang.srt.plugins import load_plugins

    load_plugins()

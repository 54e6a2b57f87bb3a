"""Make an attention backend of the plugin known to SGLang (shared by ``torch_sdpa`` and ``flashinfer_dcut``).

See ``patches/attention_registry.md``: the name goes into SGLang's attention registry and the CLI
choices of ``--attention-backend``; the backend's AROUND hooks go through ``HookRegistry``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple


def hook_registered(registry: Any, target: str, hook: Callable) -> bool:
    """``hook`` is already registered on ``target`` in SGLang's ``HookRegistry``."""
    return any(h is hook for _, h, _ in registry._hooks.get(target, ()))


def register_backend(name: str, factory: Callable, around_hooks: Sequence[Tuple[str, Callable]] = (), *,
                     apply_hooks: bool = False) -> None:
    """Register ``factory`` as attention backend ``name``, add ``name`` to the CLI choices and register
    each ``(target, hook)`` of ``around_hooks`` as an AROUND hook (idempotent). ``apply_hooks=True``
    applies the hooks at once (outside a ``load_plugins()`` run, e.g. in tests)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if ATTENTION_BACKENDS.get(name) is not factory:
        register_attention_backend(name)(factory)
    if name not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([name])
    for target, hook in around_hooks:
        if not hook_registered(HookRegistry, target, hook):
            HookRegistry.register(target, hook, HookType.AROUND)
    if apply_hooks:
        HookRegistry.apply_hooks()

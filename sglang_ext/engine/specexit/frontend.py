"""SpecExit options for SGLang frontend programs (``sgl.function`` / ``sgl.gen``).

``sgl.gen`` has no ``custom_params`` argument, so a frontend program normally runs with the
server's SpecExit settings. :class:`SpecExitRuntimeEndpoint` is a drop-in for SGLang's
``sgl.RuntimeEndpoint`` that adds fixed SpecExit options to every generation request it sends
(without patching the frontend)::

    import sglang as sgl
    from sglang_ext.engine.specexit.frontend import SpecExitRuntimeEndpoint

    sgl.set_default_backend(SpecExitRuntimeEndpoint("http://127.0.0.1:30000",
                                                    specexit={"confidence_threshold": 0.9,
                                                              "max_think_tokens": 2048}))

Options are the per-request keys of ``sglang_ext.specexit.overrides`` with or without the
``specexit_`` prefix; they are checked locally (types and ranges) and by the server (whether it
serves the method). All programs of that backend get the same options; use several endpoints
for several settings.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from sglang_ext.specexit.defaults import OVERRIDE_PREFIX
from sglang_ext.specexit.overrides import parse_overrides


def specexit_custom_params(options: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``custom_params`` entries for SpecExit options given with or without the ``specexit_`` prefix.

    Raises ``SpecExitOptionError`` (a ``ValueError``) naming the key for an invalid option.

    Examples
    --------
    >>> specexit_custom_params({"window": 4, "specexit_enable": True})
    {'specexit_window': 4, 'specexit_enable': True}
    """
    out = {}
    for key, value in (options or {}).items():
        name = key if key.startswith(OVERRIDE_PREFIX) else OVERRIDE_PREFIX + key
        out[name] = value
    parse_overrides(out)  # validates types, ranges and names
    return out


class SpecExitRuntimeEndpoint(RuntimeEndpoint):
    """``RuntimeEndpoint`` whose generation requests carry SpecExit ``custom_params``.

    Parameters
    ----------
    base_url : str
        Server URL.
    specexit : mapping
        SpecExit options (see :func:`specexit_custom_params`).
    **kwargs
        Passed to ``RuntimeEndpoint`` (``api_key``, ``verify``, ``chat_template_name``).
    """

    def __init__(self, base_url: str, specexit: Optional[Mapping[str, Any]] = None, **kwargs) -> None:
        self.specexit_params = specexit_custom_params(specexit)
        super().__init__(base_url, **kwargs)

    def _add_images(self, s, data):
        # Every /generate body the frontend sends passes through here (generate, generate_stream,
        # select); prefill-only bodies (max_new_tokens 0) are left alone.
        super()._add_images(s, data)
        params = data.get("sampling_params")
        if isinstance(params, dict) and params.get("max_new_tokens") != 0 and self.specexit_params:
            params["custom_params"] = {**(params.get("custom_params") or {}), **self.specexit_params}

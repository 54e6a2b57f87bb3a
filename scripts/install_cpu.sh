#!/usr/bin/env bash
# Install the CPU testbed into .venv at the repository root (idempotent).
#   torch 2.13.0 (CPU build), sglang==0.5.23 without its CUDA dependencies, the CPU dependency
#   set, and this package (editable). On machines whose default torch wheel is the CUDA build,
#   set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
STAMP=.venv/.sglang_ext_cpu_installed
HASH="$(cat scripts/requirements-cpu.txt scripts/constraints-cpu.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
export PIP_CONSTRAINT="$PWD/scripts/constraints-cpu.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip install --quiet; drops only pip's notes about configured index locations that do not exist on
# this host ("WARNING: Location '...' is ignored"); pip's exit status and every other line are kept
pip_install() {
  .venv/bin/python -m pip install --quiet "$@" \
    2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" >&2)
}
PIP=(pip_install)
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${PIP[@]}" --index-url "$TORCH_INDEX_URL" torch==2.13.0
else
  "${PIP[@]}" torch==2.13.0
fi
"${PIP[@]}" --no-deps sglang==0.5.23
# sglang's CUDA-only requirements are left out on purpose (--no-deps above), so pip's after-install
# conflict report would list them all; --no-warn-conflicts drops that report only (a failed install
# still stops the script) and check_dependencies below does the check instead.
"${PIP[@]}" --no-warn-conflicts -r scripts/requirements-cpu.txt
"${PIP[@]}" --no-warn-conflicts --no-deps -e .
.venv/bin/python - <<'PYEOF'
# check_dependencies: every installed distribution's requirements are met, except sglang's
# requirements listed here as skipped on purpose (one summary line); anything else is fatal.
import importlib.metadata as md
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CUDA_ONLY = {  # GPU kernels / CUDA bindings, or wheels that are CUDA-linked next to the CPU torch
    "cuda-python", "flash-attn-4", "flashinfer-python", "humming-kernels", "kernels", "nvidia-cutlass-dsl",
    "nvidia-mathdx", "nvidia-ml-py", "nvshmem4py-cu13", "quack-kernels", "sgl-deep-ep", "sgl-deep-gemm",
    "sgl-flash-mla", "sglang-kernel", "tilelang", "torch-memory-saver", "torchaudio", "torchcodec",
    "torchvision",
}
UNUSED_ON_CPU = {  # other model families, grammar/tool back-ends, profilers: not on the CPU testbed's path
    "anthropic", "blobfile", "build", "deepseek-recipe", "easydict", "interegular", "llguidance", "mistral-common", "modelscope",
    "ninja", "numba", "openai-harmony", "outlines", "py-spy", "scipy", "smg-grpc-servicer", "tiktoken", "timm",
    "tml-renderers", "watchfiles", "zstandard",
}
REPLACED = {"torch"}  # the CPU build pinned in scripts/constraints-cpu.txt instead of sglang's CUDA pin

installed = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}
skipped, replaced, problems = {"CUDA-only": [], "unused on CPU": []}, [], []
for name, dist in sorted(installed.items()):
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dep = canonicalize_name(req.name)
        have = installed.get(dep)
        if have is not None and req.specifier.contains(have.version, prereleases=True):
            continue
        if name == "sglang" and dep in CUDA_ONLY | UNUSED_ON_CPU and have is None:
            skipped["CUDA-only" if dep in CUDA_ONLY else "unused on CPU"].append(dep)
        elif name == "sglang" and dep in REPLACED and have is not None:
            replaced.append(f"{dep} {have.version} for {req}")
        else:
            problems.append(f"  {dist.metadata['Name']} {dist.version} requires {req}, "
                            + (f"but {have.version} is installed" if have else "which is not installed"))
if problems:
    sys.exit("install_cpu.sh: unmet dependencies (add them to scripts/requirements-cpu.txt):\n"
             + "\n".join(problems))
print("sglang dependencies skipped on purpose: CUDA-only: " + ", ".join(skipped["CUDA-only"])
      + "; unused on the CPU testbed: " + ", ".join(skipped["unused on CPU"])
      + ("; replaced: " + "; ".join(replaced) if replaced else ""))
PYEOF
.venv/bin/python -c "import torch, sglang, sglang_ext; print('torch', torch.__version__, 'sglang_ext', sglang_ext.__version__)"
echo "$HASH" > "$STAMP"
echo "sglang_ext CPU testbed installed in .venv"

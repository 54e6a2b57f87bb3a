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
PIP=(.venv/bin/python -m pip install --quiet)
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${PIP[@]}" --index-url "$TORCH_INDEX_URL" torch==2.13.0
else
  "${PIP[@]}" torch==2.13.0
fi
"${PIP[@]}" --no-deps sglang==0.5.23
"${PIP[@]}" -r scripts/requirements-cpu.txt
"${PIP[@]}" --no-deps -e .
.venv/bin/python -c "import torch, sglang, sglang_ext; print('torch', torch.__version__, 'sglang_ext', sglang_ext.__version__)"
echo "$HASH" > "$STAMP"
echo "sglang_ext CPU testbed installed in .venv"

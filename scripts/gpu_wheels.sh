#!/usr/bin/env bash
# FlashInfer wheels for the GPU checks on a CUDA machine without a package registry (see scripts/gpu_wheels.py).
#   scripts/gpu_wheels.sh prepare                       here (registry reachable): pruned wheels into .gpu_wheels/
#   scripts/gpu_wheels.sh run --out DIR [--quick] ...   on the CUDA machine: offline install into .gpu_wheels/site,
#                                                       FlashInfer JIT warm-up, tests/gpu/run_gpu_checks.py;
#                                                       results and gpu_runner.json in DIR
# Carry .gpu_wheels with the working tree (about 35 MiB; the machine takes 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "${1:-}" = "prepare" ] && [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
exec "$PY" scripts/gpu_wheels.py "$@"

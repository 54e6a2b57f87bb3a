#!/usr/bin/env bash
# GPU checks of the D-Cut verify path (FlashInfer pruned verify, graphs per tier, cost curves).
# Needs torch (CUDA) + flashinfer-python + this repository; no SGLang install. Results: bench/results/.
# Usage: bash tests/gpu/run_gpu_checks.sh [--quick] [--time-budget SECONDS] [--skip-moe] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" tests/gpu/run_gpu_checks.py "$@"

#!/usr/bin/env bash
# Install (if needed) and run the test suite.
#   scripts/test.sh           the CI tier (unit, kernels, integration on the CPU testbed; < 45 min on 2 cores)
#   scripts/test.sh --slow    the slow tier only (interpreted-Triton matrices, soaks, full benches)
#   extra arguments are passed to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_cpu.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [ "${1:-}" = "--slow" ]; then
  shift
  exec .venv/bin/python -m pytest -m slow "$@"
fi
exec .venv/bin/python -m pytest "$@"

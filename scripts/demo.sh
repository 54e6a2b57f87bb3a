#!/usr/bin/env bash
# Install (if needed) and run the main job: a CPU SGLang server with EAGLE3 + SpecExit + D-Cut on the
# embedded tiny thinking model, answering a real request through the OpenAI-compatible API.
#   scripts/demo.sh                 start, answer one question, print it, stop
#   scripts/demo.sh --keep-running  leave the server up (Ctrl-C to stop)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_cpu.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m sglang_ext.demo "$@"

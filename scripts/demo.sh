#!/usr/bin/env bash
# Install (if needed) and run the main job: a CPU SGLang server with EAGLE3 + SpecExit + D-Cut on the
# embedded tiny thinking model, answering a real request, then a side-by-side report against plain
# decoding and EAGLE3 alone (what SpecExit and D-Cut did).
#   scripts/demo.sh                 the testbed models: plain decoding, then the server, the answer, the report
#   scripts/demo.sh --real          the same on the real pair the project ships (SmolLM2-135M-Instruct and
#                                   its EAGLE3 draft; fetched into the cache on the first run)
#   scripts/demo.sh --keep-running  leave the server up after the report (Ctrl-C to stop)
#   scripts/demo.sh --verbose       show the servers' logs live (they always go to .cache/demo/)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_cpu.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m sglang_ext.demo "$@"

#!/usr/bin/env bash
# Run an SGLang tool (python -m MODULE) in the CPU testbed environment of .venv, from the current
# directory:
#   scripts/sglang.sh sglang.benchmark.serving --backend sglang --base-url http://127.0.0.1:PORT \
#       --dataset-name random-ids --num-prompts 16 --random-input-len 32 --random-output-len 64
# (see sglang_ext/cpu_run.py; installs the environment first if needed)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$ROOT/scripts/install_cpu.sh"
exec "$ROOT/.venv/bin/python" -m sglang_ext.cpu_run "$@"

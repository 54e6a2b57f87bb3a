"""Run any ``python -m sglang.*`` command in the CPU testbed environment.

``python -m sglang_ext.cpu_run MODULE [ARGS ...]`` (or ``scripts/sglang.sh MODULE [ARGS ...]``)
runs ``python -m MODULE ARGS ...`` with the interpreter of this environment, the CPU stand-ins
(``torchvision``, ``sgl_kernel``) on ``PYTHONPATH`` and ``SGLANG_USE_CPU_ENGINE=1``
(:func:`sglang_ext.engine.cpu.standins.cpu_testbed_env`), so SGLang's own tools import on a machine
without CUDA. On a GPU machine the stand-ins stay inactive and the command runs as usual.

Example, SGLang's serving benchmark against the demo server (``scripts/demo.sh --keep-running``)::

    scripts/sglang.sh sglang.benchmark.serving --backend sglang --base-url http://127.0.0.1:PORT \\
        --dataset-name random-ids --num-prompts 64 --random-input-len 32 --random-output-len 128

(``random-ids`` draws token ids locally; ``random`` and ``sharegpt`` download a data set from the hub.)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional

USAGE = "usage: python -m sglang_ext.cpu_run MODULE [ARGS ...]   (e.g. sglang.benchmark.serving --help)"


def command(module: str, args: List[str]) -> List[str]:
    """The command line run for ``module`` and its arguments."""
    return [sys.executable, "-m", module, *args]


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["-m"]:  # accept python's own spelling too: cpu_run -m sglang.xxx ...
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n" + USAGE)
        return 0 if argv else 2
    module, args = argv[0], argv[1:]
    if module.startswith("-") or importlib.util.find_spec(module.split(".")[0]) is None:
        sys.stderr.write(f"sglang_ext.cpu_run: error: MODULE {module!r} is not an importable module\n{USAGE}\n")
        return 2
    from sglang_ext.engine.cpu.standins import cpu_testbed_env

    cmd = command(module, args)
    os.execve(cmd[0], cmd, cpu_testbed_env())
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

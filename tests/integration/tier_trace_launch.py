"""``python tier_trace_launch.py <sglang.launch_server arguments>``: SGLang's HTTP server that also
writes the D-Cut tier of every verify step of each scheduler process to ``$DCUT_TIER_TRACE_DIR/tiers-<pid>.txt``.

Test helper (``test_dcut_tp.py``). SGLang starts its scheduler processes with multiprocessing's
``spawn``, which re-imports this file as ``__mp_main__`` in every child, so the module-level patch
below runs in the TP ranks' schedulers too; it wraps ``DCutMetrics.record`` (called once per verify
step with the step's ``StepDecision``) and leaves it otherwise unchanged.
"""

import os
import sys

TRACE_DIR = os.environ.get("DCUT_TIER_TRACE_DIR")

if TRACE_DIR:
    from sglang_ext.engine.dcut import runner as _runner

    _record = _runner.DCutMetrics.record

    def _traced_record(self, d, accept_lens):  # accept_lens: [batch_size]
        with open(os.path.join(TRACE_DIR, f"tiers-{os.getpid()}.txt"), "a") as f:
            f.write(f"{d.batch_size} {d.tier}\n")
        return _record(self, d, accept_lens)

    if not getattr(_runner.DCutMetrics.record, "_tier_traced", False):
        _traced_record._tier_traced = True
        _runner.DCutMetrics.record = _traced_record

if __name__ == "__main__":  # what ``python -m sglang.launch_server`` runs, with this file as the main module
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sys.argv[1:])
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)

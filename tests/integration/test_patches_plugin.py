"""Drift guards for every SGLang internal the plugin hooks (see patches/), and plugin behaviour:
idempotent register(), stock SGLang when the plugin is excluded.

Budget: < 60 s (two small subprocesses).
"""

from __future__ import annotations

import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

SGLANG_DIR = None


def _resolve(target: str):
    mod, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(mod)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    obj = getattr(owner, attr)
    fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else obj
    return inspect.unwrap(fn), raw


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_cli_targets():
    add, raw_add = _resolve("sglang.srt.server_args.ServerArgs.add_cli_args")
    assert isinstance(raw_add, staticmethod) and _params(add) == ["parser"]
    frm, raw_frm = _resolve("sglang.srt.server_args.ServerArgs.from_cli_args")
    assert isinstance(raw_frm, classmethod) and _params(frm) == ["cls", "args"]
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    assert "parser" in inspect.getsource(prepare_server_args) and "from_cli_args" in inspect.getsource(
        prepare_server_args)
    # underscore attributes must be settable and survive pickling (configs travel this way)
    src = inspect.getsource(ServerArgs.__reduce__)
    assert "__dict__" in src


def test_engine_init_target():
    init, _ = _resolve("sglang.srt.entrypoints.engine.Engine.__init__")
    assert _params(init) == ["self", "kwargs"]
    src = inspect.getsource(init)
    assert "server_args_class(**kwargs)" in src and '"server_args" in kwargs' in src


def test_create_worker_target():
    fn, _ = _resolve("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker")
    assert _params(fn) == ["self", "server_args"]
    src = inspect.getsource(fn)
    assert "EAGLEWorkerV2" in src and "is_eagle()" in src


def test_eagle_worker_signatures():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    assert _params(EAGLEWorkerV2.__init__) == ["self", "server_args", "gpu_id", "nccl_port", "target_worker"]
    assert _params(EAGLEWorkerV2.verify) == ["self", "batch", "pp_proxy_tensors", "grammar_barrier"]
    assert _params(EAGLEWorkerV2.forward_batch_generation) == [
        "self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"]


def test_standalone_worker_target():
    """``ExtStandaloneWorker`` (patches/standalone_worker.md) relies on SGLang's standalone worker being an
    ``EAGLEWorkerV2`` with the same constructor and an ``EagleDraftWorker`` as its draft worker."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker, StandaloneWorkerV2

    from sglang_ext.engine.eagle_worker import ExtEAGLEWorker, ExtStandaloneWorker

    assert issubclass(StandaloneWorkerV2, EAGLEWorkerV2) and issubclass(StandaloneDraftWorker, EagleDraftWorker)
    assert _params(StandaloneWorkerV2.__init__) == ["self", "server_args", "gpu_id", "nccl_port", "target_worker"]
    assert "StandaloneDraftWorker(" in inspect.getsource(StandaloneWorkerV2.__init__)
    assert ExtStandaloneWorker.__mro__[1:4] == (ExtEAGLEWorker, StandaloneWorkerV2, EAGLEWorkerV2)
    for name in ("verify", "forward_batch_generation"):  # the seams ExtEAGLEWorker wraps are not overridden
        assert name not in vars(StandaloneWorkerV2), name


def test_tree_mask_target():
    fn, _ = _resolve("sglang.srt.speculative.eagle_utils.default_tree_mask_mode")
    assert _params(fn) == []
    from sglang.srt.runtime_context import attention_backends
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    assert {"FULL_MASK", "QLEN_ONLY"} <= set(TreeMaskMode.__members__)
    assert _params(attention_backends) == []


def test_cpu_backends_target():
    fn, _ = _resolve("sglang.srt.arg_groups.platform_hook.handle_cpu_backends")
    assert _params(fn) == ["server_args"]
    src = inspect.getsource(fn)
    assert "attention_backend is None" in src and "declare_resolution" in src
    import sglang.srt.arg_groups.pipeline as pipeline

    assert "from sglang.srt.arg_groups.platform_hook import" in inspect.getsource(pipeline)


def test_cpu_testbed_defaults_to_torch_sdpa():
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import attention_backends  # noqa: F401  (import check)
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    sa = prepare_server_args(["--model-path", "m", "--device", "cpu"])
    from sglang.srt.arg_groups.platform_hook import handle_cpu_backends
    from sglang.srt.arg_groups.overrides import resolving_view

    handle_cpu_backends(sa)
    assert resolving_view(sa).attention_backend == "torch_sdpa"
    sa2 = prepare_server_args(["--model-path", "m", "--device", "cpu", "--attention-backend", "triton"])
    handle_cpu_backends(sa2)
    assert resolving_view(sa2).attention_backend == "triton"


def test_cpu_op_names_imported_by_sglang():
    """Every ``*_cpu`` name SGLang's speculative/KV kernels import from sgl_kernel has a torch op."""
    import sglang

    from sglang_ext.engine.cpu.spec_ops import CPU_OPS

    root = os.path.dirname(sglang.__file__)
    names = set()
    for sub in ("kernels/ops/speculative", "kernels/ops/kvcache", "srt/speculative", "srt/mem_cache"):
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(dirpath, f)) as fh:
                        text = fh.read()
                    for m in re.finditer(r"from sgl_kernel(?:\.speculative)? import \(?([^)\n]*(?:\n[^)]*)?)\)?", text):
                        names.update(n.strip().split(" as ")[0] for n in m.group(1).split(",")
                                     if n.strip().split(" as ")[0].endswith("_cpu"))
    assert names, "no sgl_kernel *_cpu import found: the scan itself drifted"
    missing = sorted(names - set(CPU_OPS))
    assert not missing, f"sgl_kernel ops without a CPU stand-in: {missing}"


def test_register_twice_is_harmless():
    from sglang.srt.plugins.hook_registry import HookRegistry

    import sglang_ext
    from sglang_ext.engine import plugin

    sglang_ext.register()
    before = {t: len(h) for t, h in HookRegistry._hooks.items()}
    sglang_ext.register()
    after = {t: len(h) for t, h in HookRegistry._hooks.items()}
    assert before == after
    for target in (plugin.HOOK_ADD_CLI_ARGS, plugin.HOOK_FROM_CLI_ARGS, plugin.HOOK_CREATE_WORKER,
                   plugin.HOOK_ENGINE_INIT, plugin.HOOK_TREE_MASK_MODE):
        ours = [h for _, h, _ in HookRegistry._hooks[target] if h.__module__ == "sglang_ext.engine.plugin"]
        assert len(ours) == 1, target


def test_wrong_sglang_version_is_a_readable_error():
    from sglang_ext.engine.plugin import SGLangVersionError, check_sglang_version

    with pytest.raises(SGLangVersionError, match=r"supports only sglang==0\.5\.23, but sglang==0\.6\.0"):
        check_sglang_version("0.6.0")
    assert check_sglang_version("0.5.23") == "0.5.23"


_STOCK_PROBE = r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
sa = prepare_server_args(["--model-path", "m", "--speculative-algorithm", "EAGLE3"])
print("HAS_CONFIG", hasattr(sa, "_specexit"))
print("WRAPPED", hasattr(SpeculativeAlgorithm.create_worker, "__wrapped__"))
try:
    prepare_server_args(["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--dcut", "auto"])
    print("DCUT_ACCEPTED")
except SystemExit as e:
    print("DCUT_REJECTED", e.code)
"""


@pytest.mark.parametrize("plugins,expect_ext", [("some_other_plugin", False), ("sglang_ext", True)])
def test_sglang_plugins_allowlist(plugins, expect_ext):
    env = dict(os.environ, SGLANG_PLUGINS=plugins)
    res = subprocess.run([sys.executable, "-c", _STOCK_PROBE], capture_output=True, text=True, env=env, timeout=300)
    out = res.stdout
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"HAS_CONFIG {expect_ext}" in out
    assert f"WRAPPED {expect_ext}" in out
    assert ("DCUT_ACCEPTED" in out) == expect_ext and ("DCUT_REJECTED 2" in out) == (not expect_ext)


def test_project_backends_declare_ragged_verify():
    """D-Cut compacts the verify forward only on backends that declare ragged TARGET_VERIFY support."""
    from types import SimpleNamespace

    from sglang_ext.engine.dcut import runner as dcut_glue
    from sglang_ext.engine.attention.torch_sdpa import TorchSDPABackend

    assert getattr(TorchSDPABackend, dcut_glue.RAGGED_VERIFY_FLAG) is True
    src = inspect.getsource(__import__("sglang_ext.engine.attention.flashinfer_dcut", fromlist=["x"]))
    assert "supports_ragged_target_verify = True" in src

    def worker_with(backend):
        return SimpleNamespace(target_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=backend)))

    assert dcut_glue._backend_runs_ragged_verify(worker_with(TorchSDPABackend.__new__(TorchSDPABackend)))
    assert not dcut_glue._backend_runs_ragged_verify(worker_with(object()))

"""SGLang plugin glue: every hook the extension installs, in one place.

``sglang_ext.register()`` (the ``sglang.srt.plugins`` entry point) calls :func:`register_hooks`
in every SGLang process (launcher, HTTP server, schedulers, detokenizer). Hooks are registered
with SGLang's ``HookRegistry``; SGLang applies them right after all plugins ran. Each hooked
internal is documented in ``patches/`` (see ``patches/INDEX.md``) and has a drift-guard test.

Hooks:

=====================================================================  ======  =======================
target                                                                 type    purpose
=====================================================================  ======  =======================
``sglang.srt.server_args.ServerArgs.add_cli_args``                     AFTER   add --specexit*/--dcut*
``sglang.srt.server_args.ServerArgs.from_cli_args``                    AROUND  build + attach configs
``ConfigArgumentMerger._convert_config_to_args`` (--config reader)     AROUND  YAML lists, switches
``sglang.srt.entrypoints.engine.Engine.__init__``                      AROUND  Engine(**kwargs) support
``sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker`` AROUND  worker subclass swap
``sglang.srt.speculative.eagle_utils.default_tree_mask_mode``           AROUND  FULL mask for triton on CPU
``sglang.srt.arg_groups.platform_hook.handle_cpu_backends``             BEFORE  torch_sdpa default on CPU testbed
``...model_runner.ModelRunner._decode_cuda_graph_runner_cls`` (CUDA)     AROUND  D-Cut tier verify graphs
``...UnquantizedLinearMethod.apply`` (env, CPU)                        AROUND  packed GEMM (opt-in)
``...LogitsProcessor._compute_lm_head`` (env, CPU)                     AROUND  packed GEMM (opt-in)
=====================================================================  ======  =======================

plus the CPU testbed's torch attention backend registration (``engine/attention/torch_sdpa.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from typing import Any, Optional

from sglang_ext.version import SUPPORTED_SGLANG_VERSION, __version__
from sglang_ext.config import (
    EXTENSION_DESTS,
    SPECEXIT_ALGORITHMS,
    STANDALONE,
    ConfigError,
    DCutConfig,
    ExtensionConfig,
    SpecExitConfig,
    attach_extension_config,
    check_against_server,
    configs_from_mapping,
    get_extension_config,
    iter_flags,
    preset_values,
)

logger = logging.getLogger(__name__)

HOOK_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
HOOK_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
HOOK_CONFIG_TO_ARGS = "sglang.srt.utils.server_args_config_parser.ConfigArgumentMerger._convert_config_to_args"
HOOK_ENGINE_INIT = "sglang.srt.entrypoints.engine.Engine.__init__"
HOOK_CREATE_WORKER = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
HOOK_TREE_MASK_MODE = "sglang.srt.speculative.eagle_utils.default_tree_mask_mode"
HOOK_CPU_BACKENDS = "sglang.srt.arg_groups.platform_hook.handle_cpu_backends"
CPU_TESTBED_ATTENTION_BACKEND = "torch_sdpa"

_registered = False


class SGLangVersionError(RuntimeError):
    pass


def check_sglang_version(installed: Optional[str] = None) -> str:
    """Raise :class:`SGLangVersionError` unless the installed SGLang is the supported release."""
    if installed is None:
        try:
            installed = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            raise SGLangVersionError("sglang_ext needs sglang==%s, but sglang is not installed"
                                     % SUPPORTED_SGLANG_VERSION) from None
    if installed != SUPPORTED_SGLANG_VERSION:
        raise SGLangVersionError(
            f"sglang_ext {__version__} supports only sglang=={SUPPORTED_SGLANG_VERSION}, "
            f"but sglang=={installed} is installed; install the pinned release or disable the plugin with "
            f"SGLANG_PLUGINS=<other plugins>"
        )
    return installed


# ----------------------------------------------------------------------------- CLI
def add_extension_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add every ``--specexit*``/``--dcut*`` flag (generated from the config dataclasses)."""
    if any(a.dest == "specexit" for a in parser._actions):
        return
    for title, cls in (("sglang_ext SpecExit", SpecExitConfig), ("sglang_ext D-Cut", DCutConfig)):
        group = parser.add_argument_group(title)
        for _name, spec, default in iter_flags(cls):
            shown = spec.show_default if spec.show_default is not None else default
            help_text = f"{spec.help} (default: {shown})" if not spec.store_true else spec.help
            if spec.store_true:
                group.add_argument(spec.flag, dest=spec.dest, action="store_true", default=None, help=help_text)
            else:
                # Values are parsed and validated by the config dataclasses so that argparse, YAML
                # presets and Engine kwargs share one code path and one message format.
                # (choices are checked there too, so a bad value gives one line, not argparse's usage dump)
                metavar = spec.metavar or ("{" + ",".join(spec.choices) + "}" if spec.choices else None)
                group.add_argument(spec.flag, dest=spec.dest, default=None, metavar=metavar, help=help_text)


def _speculative_algorithm_of(obj: Any) -> Optional[str]:
    algo = getattr(obj, "speculative_algorithm", None)
    if algo is None:
        return None
    return getattr(algo, "name", str(algo))


def build_checked_config(values: dict, speculative_algorithm: Optional[str],
                         disaggregation_mode: Optional[str] = None) -> ExtensionConfig:
    cfg = configs_from_mapping(values)
    check_against_server(cfg, speculative_algorithm, disaggregation_mode)
    if cfg.enabled and (speculative_algorithm or "").upper() == STANDALONE:
        check_standalone_vocab(values.get("model_path"), values.get("speculative_draft_model_path"),
                               values.get("tokenizer_path"))
    return cfg


def check_standalone_vocab(model_path: Optional[str], draft_path: Optional[str],
                           tokenizer_path: Optional[str] = None) -> None:
    """Refuse a STANDALONE draft whose vocabulary differs from the target's, at launch, with one line
    (:func:`sglang_ext.vocab.vocab_difference`). SGLang checks the same in the scheduler after
    loading both models; this runs first, in the launching process, where the error is a
    one-line usage error. When a model's tokenizer or config cannot be read here (a hub id
    offline), a warning says so and SGLang's own check remains."""
    if not model_path or not draft_path:
        return
    from sglang_ext.vocab import vocab_difference

    try:
        from transformers import AutoConfig, AutoTokenizer

        tok_t = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        tok_d = AutoTokenizer.from_pretrained(draft_path)
        size_t = getattr(AutoConfig.from_pretrained(model_path), "vocab_size", None)
        size_d = getattr(AutoConfig.from_pretrained(draft_path), "vocab_size", None)
    except Exception as e:  # unreadable here: SGLang's check in the scheduler still applies
        logger.warning("sglang_ext: could not compare the STANDALONE draft's vocabulary with the target's at "
                       "launch (%s: %s); SGLang checks it when the models are loaded", type(e).__name__, e)
        return
    diff = vocab_difference(tok_t.get_vocab(), tok_d.get_vocab(), size_t, size_d)
    if diff is not None:
        raise ConfigError(f"--speculative-draft-model-path: {diff}; a STANDALONE draft must use the target's "
                          "tokenizer and vocabulary")


def _fail_cli(err: ConfigError) -> None:
    sys.stderr.write(f"sglang serve: error: {err}\n")
    sys.exit(2)


def _after_add_cli_args(result, parser, *args, **kwargs):
    add_extension_cli_args(parser)
    return result


def _around_from_cli_args(original_fn, cls, args, *rest, **kwargs):
    server_args = original_fn(cls, args, *rest, **kwargs)
    try:
        cfg = build_checked_config(vars(args), _speculative_algorithm_of(args), getattr(args, "disaggregation_mode", None))
    except ConfigError as e:
        _fail_cli(e)
    attach_extension_config(server_args, cfg)
    return server_args


def _around_config_to_args(original_fn, self, config, *args, **kwargs):
    """``--config`` presets: before SGLang's reader turns the YAML mapping into argv items, give every
    extension entry the form of one command-line value (a YAML list of a list-valued flag joined, a
    switch's boolean word read as a boolean); a value no flag can take stops the launch with one line
    naming the flag. Other keys, and parsers without the extension flags, pass through unchanged."""
    parser = getattr(self, "parser", None)
    if parser is not None and isinstance(config, dict) and any(a.dest == "specexit" for a in parser._actions):
        try:
            config = preset_values(config)
        except ConfigError as e:
            _fail_cli(e)
    return original_fn(self, config, *args, **kwargs)


def _around_engine_init(original_fn, self, *args, **kwargs):
    ext = {k: kwargs.pop(k) for k in list(kwargs) if k in EXTENSION_DESTS}
    if not ext:
        return original_fn(self, *args, **kwargs)
    if "server_args" in kwargs:
        raise TypeError("sglang_ext: pass extension options either as Engine keyword arguments or attached to "
                        "server_args (sglang_ext.config.attach_extension_config), not both")
    # Mirror Engine.__init__'s own construction so the extension configs can be attached
    # before the scheduler processes are spawned.
    from sglang.srt.entrypoints.engine import Engine

    cfg = build_checked_config({**kwargs, **ext}, kwargs.get("speculative_algorithm"), kwargs.get("disaggregation_mode"))
    kwargs.setdefault("log_level", "error")
    server_args = getattr(self, "server_args_class", None) or Engine.server_args_class
    sa = server_args(**kwargs)
    sa._launch_command = "Engine(" + ", ".join(f"{k}={v!r}" for k, v in {**kwargs, **ext}.items()) + ")"
    attach_extension_config(sa, cfg)
    return original_fn(self, server_args=sa)


# ----------------------------------------------------------------------------- worker swap
def select_worker_class(base_cls: Any, server_args: Any) -> Any:
    """The worker class to use instead of SGLang's ``base_cls`` for these server args."""
    cfg = get_extension_config(server_args)
    if not cfg.enabled:
        return base_cls
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    if isinstance(base_cls, type) and base_cls is EAGLEWorkerV2:
        from sglang_ext.engine.eagle_worker import ExtEAGLEWorker

        return ExtEAGLEWorker
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    if isinstance(base_cls, type) and base_cls is StandaloneWorkerV2:  # [standalone]
        from sglang_ext.engine.eagle_worker import ExtStandaloneWorker

        return ExtStandaloneWorker
    algo = _speculative_algorithm_of(server_args)
    if cfg.specexit.enabled and algo not in SPECEXIT_ALGORITHMS:
        raise ConfigError(f"--specexit: needs a draft (EAGLE3, EAGLE, NEXTN or STANDALONE), got {algo}")
    if algo == "DFLASH" and cfg.dcut.enabled:  # [dcut/dflash]
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        if base_cls is DFlashWorkerV2:
            from sglang_ext.engine.dflash_worker import ExtDFlashWorker

            return ExtDFlashWorker
    logger.warning("sglang_ext: no extension worker for %s (%s); D-Cut/SpecExit are inactive",
                   getattr(base_cls, "__name__", base_cls), algo)
    return base_cls


def _around_create_worker(original_fn, self, server_args, *args, **kwargs):
    base_cls = original_fn(self, server_args, *args, **kwargs)
    return select_worker_class(base_cls, server_args)


# ----------------------------------------------------------------------------- CPU + triton tree mask
def _triton_attention_on_cpu() -> bool:
    from sglang.srt.runtime_context import attention_backends
    from sglang.srt.utils.common import is_cpu

    if not is_cpu():
        return False
    try:
        backends = attention_backends()  # (prefill, decode), resolved
    except Exception:  # no runtime context published in this process (e.g. the HTTP server)
        return False
    return "triton" in backends


def _around_default_tree_mask_mode(original_fn, *args, **kwargs):
    """On CPU SGLang builds the QLEN_ONLY tree mask that intel_amx consumes; the Triton backend
    (run under ``TRITON_INTERPRET=1`` on the CPU testbed) reads the FULL layout. Only the mask
    layout changes: ``eagle_utils._is_cpu`` (which also routes sampling) is left alone."""
    mode = original_fn(*args, **kwargs)
    if _triton_attention_on_cpu():
        from sglang.srt.speculative.eagle_utils import TreeMaskMode

        return TreeMaskMode.FULL_MASK
    return mode


def _before_handle_cpu_backends(server_args, *args, **kwargs):
    """On the CPU testbed (no CUDA, the project's sgl_kernel stand-in in use) SGLang's CPU default
    attention backend ``intel_amx`` cannot run (it needs the native CPU kernels and AMX); default to the
    project's ``torch_sdpa`` backend instead when the user chose none."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    if cfg.device == "cpu" and cfg.attention_backend is None and _cpu_testbed_active():
        logger.info("sglang_ext: CPU testbed: attention backend defaults to %s", CPU_TESTBED_ATTENTION_BACKEND)
        declare_resolution(server_args, "sglang_ext_cpu_testbed", attention_backend=CPU_TESTBED_ATTENTION_BACKEND)
    return None


def _cpu_testbed_active() -> bool:
    """The project's import stand-ins are installed in this process and serving (no CUDA device)."""
    import sys

    from sglang_ext.engine.cpu.standins import StandinFinder, standins_active

    return any(isinstance(f, StandinFinder) for f in sys.meta_path) and standins_active()


# ----------------------------------------------------------------------------- registration
def register_hooks() -> None:
    """Register all hooks (idempotent)."""
    global _registered
    if _registered:
        return
    check_sglang_version()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_ADD_CLI_ARGS, _after_add_cli_args, HookType.AFTER)
    HookRegistry.register(HOOK_FROM_CLI_ARGS, _around_from_cli_args, HookType.AROUND)
    HookRegistry.register(HOOK_CONFIG_TO_ARGS, _around_config_to_args, HookType.AROUND)
    HookRegistry.register(HOOK_ENGINE_INIT, _around_engine_init, HookType.AROUND)
    HookRegistry.register(HOOK_CREATE_WORKER, _around_create_worker, HookType.AROUND)
    HookRegistry.register(HOOK_TREE_MASK_MODE, _around_default_tree_mask_mode, HookType.AROUND)
    HookRegistry.register(HOOK_CPU_BACKENDS, _before_handle_cpu_backends, HookType.BEFORE)
    from sglang_ext.engine.specexit.hooks import register_specexit_hooks  # [specexit]

    register_specexit_hooks()  # custom_params check, meta_info, /server_info, SpecExit draft class (patches/INDEX.md)
    from sglang_ext.engine.dcut.hooks import register_hooks as register_dcut_hooks  # [dcut]

    register_dcut_hooks()  # draft confidences + D-Cut in /server_info (patches/INDEX.md)
    _register_cpu_backend()
    from sglang_ext.engine.cpu.packed_gemm_hooks import register as register_packed_gemm  # [cpu/packed_gemm]

    register_packed_gemm()  # only with SGLANG_EXT_CPU_PACKED_GEMM set (patches/cpu_packed_gemm.md)
    import torch

    from sglang_ext.engine.attention.flashinfer_dcut import register as register_flashinfer_dcut

    # [attention/flashinfer_dcut] `flashinfer_dcut` backend (patches/flashinfer_dcut_backend.md); the name
    # is registered everywhere (a clear error when built without CUDA/flashinfer).
    register_flashinfer_dcut()
    if torch.cuda.is_available():
        from sglang_ext.engine.dcut.graphs import register_hooks as register_dcut_graph_hooks  # [dcut/graphs]

        register_dcut_graph_hooks()  # one verify graph per (bs, tier) (patches/dcut_graph_runner.md)
    _registered = True


def _register_cpu_backend() -> None:
    """Register the torch tree-attention backend (usable on any device; the CPU testbed's default)."""
    import importlib

    try:
        torch_backend = importlib.import_module("sglang_ext.engine.attention.torch_sdpa")
    except ModuleNotFoundError as e:
        if e.name != "sglang_ext.engine.attention.torch_sdpa":
            raise
        return
    torch_backend.register()

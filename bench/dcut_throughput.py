"""Does D-Cut raise EAGLE3 decode throughput, and is ``--dcut auto`` never slower than its peers?

In one run, for batch sizes 1, 4, 16, 32, 64 (all requests submitted together, greedy,
``--max-new-tokens`` each, EOS ignored so the batch stays full), measures output tokens/s of:

* ``no-spec``: the target alone (an engine without speculation);
* ``full``: EAGLE3 with full verification (D-Cut ratio 1.0, the ``--dcut off`` behaviour);
* ``r0.25`` / ``r0.5`` / ``r0.75``: each fixed tier;
* ``auto``: ``--dcut auto`` with ``--dcut-draft-off auto`` (the defaults): the tier chosen per step
  from the launch-time cost table, and whole steps without drafting when the table says a
  draft-off step commits more tokens per ms;
* ``auto-never``: ``--dcut auto --dcut-draft-off never`` on the same cost table (a second engine);
* ``adaptive``: SGLang's own ``--speculative-adaptive`` (EAGLE3, same draft and shape), where SGLang
  supports the shape: chains only (topk 1; ``num_draft_tokens = num_steps + 1``); for trees it is
  printed ``n/a`` with SGLang's reason. Its config: SGLang's default adaptive config with
  ``--num-steps`` added to the candidates of its batch-size-1 slot (SGLang requires the launch
  steps to be a candidate), or ``--adaptive-config FILE``;
* ``auto-depth``: ``--dcut auto`` under ``--speculative-adaptive`` (the same config): D-Cut's depth
  mode, which chooses the chain depth among SGLang's adaptive runtime states and when to switch
  drafting off, from a cost table of the depths profiled at its own launch (chains only, like
  ``adaptive``).

``--algorithm STANDALONE`` runs every speculative engine with SGLang's ``STANDALONE`` worker (``--draft`` a
small LM of the target's family, e.g. Qwen2.5-Coder-0.5B for the 1.5B; ``adaptive`` and
``auto-depth`` are ``n/a``: SGLang has no adaptive mode for it); a real target without a recipe
split gets the 24 held-out prompts of the shipped SmolLM2 draft's split (GSM8K and MT-bench, chat
and code; ``--split`` names another).

Each engine runs in a process of its own (:class:`EngineProcess`), all up side by side with SGLang's
``--sleep-on-idle``; the five modes of the D-Cut engine are switched at runtime with
``/set_internal_state`` ``dcut_force_ratio`` (so they share weights, profile and warm-up). The
runs are interleaved: for each batch size, every repeat runs every mode once, back to back (order
reversed on odd repeats), so a repeat's ratios compare runs taken close together in time; the
best of ``--repeats`` is kept too. The D-Cut engine is launched alone after the others are up and
profiles its cost table at launch (schema version 2, with the draft-off step's cost) in a fresh
temporary cache directory unless ``--cache-dir`` / ``--cost-table`` is given; ``auto-never`` loads
that table from a file. Every mode's output is checked token for token against the full-verify
output (lossless; ``no-spec`` and ``adaptive`` included). SpecExit is not launched (all modes
decode the same tokens).

On CPU: ``--packed-gemm P`` runs the D-Cut engines with the backend's packed GEMM for P-row inputs
(``SGLANG_EXT_CPU_PACKED_GEMM=P``) and adds ``no-spec-packed`` (plain decoding with it) beside
``no-spec`` (without); ``--no-spec-sync`` adds ``no-spec-sync``, plain decoding without SGLang's
overlap scheduler (which SGLang does not run for speculative decoding on CPU); ``--sequential``
keeps one engine up at a time (each measured at every batch size and repeat, then shut down: for
models whose engines do not fit in memory together; only no-spec, the D-Cut engine and
auto-never; the repeats it pairs were taken minutes apart).

Printed: a table of tok/s (``adaptive`` ``n/a`` with the reason where SGLang does not support the
shape), then the ratios per batch size, of the best-of-repeats tok/s and paired (median over
repeats of the ratio within one repeat): ``auto/full``, ``auto/best`` (best = the fastest fixed tier
below full), ``best/full``, ``auto/nospec``, ``full/nospec``, ``auto/peak`` (peak = the fastest of
no-spec, full and every fixed tier: everything auto chooses between), ``auto/never`` (what the
draft-off choice adds), ``never/peak``, ``auto/adaptive`` and ``adaptive/peak``; D-Cut's keep ratio,
tier histogram (``draft_off`` = steps without drafting) and draft-off share for ``auto`` and
``auto-never`` per batch size, the acceptance along the draft chain (full verification) and the
per-step time split (draft steps / planner / target verify forward / rest of verify / draft
extend / other; ``SGLANG_EXT_DCUT_TIMING``). A PNG plot and optionally JSON (``tok_s``,
``tok_s_runs`` per repeat, ``paired_ratios``, ``dcut`` metrics, ``lossless_vs_full``,
``tokens_per_verify``, ``adaptive``, the cost table) are written.

Models: by default the trained testbed models (``sglang_ext/testbed/models/{target,draft}``,
thinking target + EAGLE3 draft) with held-out problems of the synthetic task through the chat
template (thinking on); ``--models tiny`` uses the CPU testbed's tiny random models built under
``--models-dir`` with prompts from the distribution their draft was fitted on; ``--target`` /
``--draft`` name any other pair (prompts: a draft of the project's recipe, with its ``split.json``,
brings its held-out prompts through the target's chat template, repeated to fill the largest batch,
64 new tokens; otherwise held-out problems when the target has the testbed's chat template, else
the tiny-model prompts). On a shared CPU machine use ``OMP_NUM_THREADS=1``.
Run (the first is the D-Cut acceptance run: SGLang's documented 16-draft-token EAGLE tree, 3 steps,
topk 4; the second the 15-step chain, where SGLang's adaptive mode runs too; the engine end to end
is tested in ``tests/integration/test_bench_dcut_engine.py``)::

    OMP_NUM_THREADS=1 python bench/dcut_throughput.py --num-steps 3 --topk 4 --num-draft-tokens 16 \\
        --batch-sizes 1,4,16,32,64 --out bench/out/dcut_tree16.png --json bench/out/dcut_tree16.json
    OMP_NUM_THREADS=1 python bench/dcut_throughput.py --num-steps 15 --num-draft-tokens 16 \\
        --batch-sizes 1,4,16,32,64 --out bench/out/dcut_chain16.png --json bench/out/dcut_chain16.json

``--url http://host:port``: no engines; measure a running SGLang server (``bs`` concurrent
``/generate`` requests, the held-out problems as text). With D-Cut on (``/server_info`` has
``dcut``) the five modes are switched through ``/set_internal_state`` like above and the
configured mode restored at the end; without it the server is measured as is (mode ``server``)::

    python bench/dcut_throughput.py --url http://127.0.0.1:30000 --batch-sizes 1,4,16 --json bench/out/url.json

``--what-if FILE``: instead of running engines, replay a saved ``--json`` result. With
``--what-if-table TABLE.json`` (the ``CostTable`` schema, e.g. a GPU profile from
``bench/profile_cost.py --json`` or a D-Cut cache file) the recorded survival curves (the draft's
predicted one and the measured acceptance) are planned with ``sglang_ext.dcut.choose`` on that
table: chosen tier, keep ratio, expected accepted tokens, cost and predicted speed-up per tier
and batch size. Without it, each tier's cost of the saved table is scaled by
``--what-if-verify-scale`` on the verify share. Planning aids, not measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINED = os.path.join(REPO, "sglang_ext", "testbed", "models")
MODES = ("full", "r0.25", "r0.5", "r0.75", "auto")
MODE_RATIO = {"full": 1.0, "r0.25": 0.25, "r0.5": 0.5, "r0.75": 0.75, "auto": 0.0}
FIXED = ("r0.25", "r0.5", "r0.75")  # the fixed tiers below full verification ("best" = the fastest of them)
NEVER = "auto-never"  # --dcut auto --dcut-draft-off never (a second engine on the same cost table)
ADAPTIVE = "adaptive"  # SGLang's --speculative-adaptive (the chain only: topk 1)
DEPTH = "auto-depth"  # --dcut auto under --speculative-adaptive: D-Cut's depth mode (chains only)
NO_SPEC = "no-spec"
#: ``--packed-gemm P``: the project's speculative engines run with the CPU backend's row-blocked packed
#: GEMM (SGLANG_EXT_CPU_PACKED_GEMM=P); this engine is plain decoding with it, ``no-spec`` without it
NO_SPEC_PACKED = "no-spec-packed"
#: ``--no-spec-sync``: plain decoding without SGLang's overlap scheduler, which SGLang 0.5.23 does not run
#: for speculative decoding on CPU ("Overlap schedule is not implemented for speculative decoding on
#: CPU"): what a speculative engine's step is compared with once that difference is taken out
NO_SPEC_SYNC = "no-spec-sync"
PACKED_ENV = "SGLANG_EXT_CPU_PACKED_GEMM"  # sglang_ext.engine.cpu.packed_gemm.ENV_ROWS (not imported: no torch yet)
#: the D-Cut engine with every decode step draft-off (``dcut_force_draft_off`` 1): what a draft-off
#: step costs against a plain decode step (``off/nospec``); measured only when ``--modes`` names it
OFF = "off"
OPT_IN_MODES = (OFF,)
DCUT_MODES = MODES + OPT_IN_MODES + (NEVER, DEPTH)  # the modes with D-Cut metrics
#: printing order of every mode a result may hold
ALL_MODES = (NO_SPEC, NO_SPEC_SYNC, NO_SPEC_PACKED, OFF, "server", "full", "r0.25", "r0.5", "r0.75", NEVER, "auto", DEPTH, ADAPTIVE)
#: why SGLang's adaptive speculative decoding cannot run a shape (its adaptive_unsupported_reason)
ADAPTIVE_TOPK_REASON = ("SGLang's --speculative-adaptive supports only --speculative-eagle-topk 1 "
                        "(sglang.srt.speculative.adaptive_spec_params.adaptive_unsupported_reason); this shape has "
                        "topk {topk}, SGLang would fall back to the static tree")
TIMING_ENV = "SGLANG_EXT_DCUT_TIMING"  # sglang_ext.engine.dcut.runner.TIMING_ENV (not imported: no SGLang yet)
PROBLEM_SEED = 777


def _trained_present() -> bool:
    return all(os.path.isfile(os.path.join(TRAINED, d, "config.json")) for d in ("target", "draft"))


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", choices=("trained", "tiny"), default=None,
                   help="trained testbed models (default when present) or the tiny random ones")
    p.add_argument("--target", default=None, help="target model dir (overrides --models)")
    p.add_argument("--draft", default=None, help="draft dir (overrides --models): an EAGLE3 draft, or with "
                   "--algorithm STANDALONE a small LM of the target's family")
    p.add_argument("--algorithm", choices=("EAGLE3", "STANDALONE"), default="EAGLE3",
                   help="--speculative-algorithm of every speculative engine (STANDALONE: no SGLang adaptive peer, "
                        "SGLang has none for it)")
    p.add_argument("--split", default=None, metavar="SPLIT.json",
                   help="held-out prompts of a recipe split (default: the draft's split.json; with a draft "
                        "without one and --algorithm STANDALONE, the shipped SmolLM2 draft's: 12 GSM8K and "
                        "12 MT-bench prompts, chat and code)")
    p.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "sglang_ext_tiny_models"),
                   help="where the tiny models are built (--models tiny)")
    p.add_argument("--num-steps", type=int, default=15)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=16)
    p.add_argument("--batch-sizes", default="1,4,16,32,64")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="new tokens per request (default: 128 trained, 64 tiny)")
    p.add_argument("--prompt-len", type=int, default=4, help="prompt length of the tiny-model prompts")
    p.add_argument("--problem-seed", type=int, default=PROBLEM_SEED, help="held-out problems' seed (trained)")
    p.add_argument("--refill", type=int, default=1, metavar="K",
                   help="each run sends K x bs requests with at most bs in flight, a new one joining as one "
                        "finishes (a server's refilled batch); 1 (default): a closed batch of bs requests that "
                        "start together, whose last steps run a thinning batch when requests finish at "
                        "different steps (speculation)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed repetitions per (mode, bs), interleaved across modes; the best is kept")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=None, help="KV pool (default: fits the largest batch)")
    p.add_argument("--attention-backend", default="torch_sdpa")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="SGLang's --mem-fraction-static of every engine (CPU default 0.5; a real pair of several GB "
                        "with two engines up side by side needs more, SGLang's error says how much)")
    p.add_argument("--cache-dir", default=None,
                   help="--dcut-cache-dir (default: a fresh temporary directory, so the cost table, with the "
                        "draft-off costs, is profiled at launch)")
    p.add_argument("--cost-table", default=None, help="--dcut-cost-table FILE (skips profiling; a table profiled on another host misleads auto "
                   "where drafting and draft-off are close: for repeating a run on the host that profiled it)")
    p.add_argument("--profile-steps", type=int, default=None, help="--dcut-profile-steps (default: the server's)")
    p.add_argument("--no-timing", action="store_true", help="do not collect the per-step time split")
    p.add_argument("--out", default=os.path.join("bench", "out", "dcut_throughput.png"))
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--skip-no-spec", action="store_true")
    p.add_argument("--no-spec-sync", action="store_true",
                   help=f"add a plain engine without SGLang's overlap scheduler ({NO_SPEC_SYNC}; SGLang runs every "
                        "speculative engine on CPU without it)")
    p.add_argument("--sequential", action="store_true",
                   help="one engine up at a time (each measured at every batch size and repeat, then shut down): "
                        "for models too large to keep several engines in memory; the ratios then pair runs taken "
                        "minutes apart")
    p.add_argument("--packed-gemm", type=int, default=0, metavar="P",
                   help="run the D-Cut engines with the CPU backend's row-blocked packed GEMM in blocks of P rows "
                        f"({PACKED_ENV}=P) and add a plain engine with it ({NO_SPEC_PACKED}); {NO_SPEC} stays "
                        "without it (0: off)")
    p.add_argument("--skip-never", action="store_true",
                   help=f"no '{NEVER}' engine (--dcut auto --dcut-draft-off never on the same cost table)")
    p.add_argument("--skip-adaptive", action="store_true", help="no SGLang --speculative-adaptive engine")
    p.add_argument("--skip-depth", action="store_true",
                   help=f"no '{DEPTH}' engine (--dcut auto under --speculative-adaptive: D-Cut's depth mode)")
    p.add_argument("--modes", default=None, metavar="M1,M2",
                   help=f"measure only these modes (of {', '.join(m for m in ALL_MODES if m != 'server')}; "
                        "'auto' is always measured): e.g. 'no-spec,auto' for long runs of the draft-off "
                        "comparison. Without 'full' the lossless check compares with no-spec. 'off' (only when "
                        "named): the D-Cut engine with every decode step draft-off, to compare a draft-off step "
                        "with a plain decode step (off/nospec)")
    p.add_argument("--adaptive-config", default=None, metavar="JSON",
                   help="--speculative-adaptive-config of the adaptive engine (default: SGLang's default "
                        "config with --num-steps added to the candidates of its batch-size-1 slot, since SGLang "
                        "requires the launch --speculative-num-steps to be a candidate)")
    p.add_argument("--url", default=None, metavar="http://host:port",
                   help="measure a running SGLang server instead of launching engines (D-Cut modes "
                        "switched through /set_internal_state when its /server_info has a dcut entry)")
    p.add_argument("--what-if", default=None, metavar="FILE", help="replay a --json result (no engines)")
    p.add_argument("--what-if-verify-scale", type=float, default=2.0,
                   help="--what-if without --what-if-table: scale the saved table's verify share")
    p.add_argument("--what-if-table", default=None, metavar="TABLE.json",
                   help="--what-if: replay the recorded survival curves against this cost-table JSON "
                        "(CostTable schema: bench/profile_cost.py --json or a D-Cut cache file)")
    from sglang_ext.testbed.evaluate import refuse_config

    refuse_config(p, "it launches its engines with its own flags (--num-steps, --topk, --num-draft-tokens, ...); "
                     "pass those, or start a server with `python -m sglang.launch_server --config FILE` and "
                     "measure it with --url")
    args = p.parse_args(argv)
    if args.refill < 1:
        p.error(f"--refill {args.refill}: must be at least 1")
    return args


def _resolve_models(args):
    """(target, draft, prompt kind) from --target/--draft or --models."""
    if args.target and args.draft:
        if getattr(args, "split", None) or os.path.isfile(os.path.join(args.draft, "split.json")):  # the recipe's
            return args.target, args.draft, "heldout"
        if getattr(args, "algorithm", "EAGLE3") == "STANDALONE" and not _is_testbed_target(args.target):
            from sglang_ext.models.registry import SMOLLM2_EAGLE3

            args.split = os.path.join(SMOLLM2_EAGLE3.directory, "split.json")
            return args.target, args.draft, "heldout"
        chat = os.path.isfile(os.path.join(args.target, "chat_template.jinja"))
        return args.target, args.draft, "problems" if chat else "corpus"
    kind = args.models or ("trained" if _trained_present() else "tiny")
    if kind == "trained":
        if not _trained_present():
            raise SystemExit(f"trained testbed models not found in {TRAINED}")
        return os.path.join(TRAINED, "target"), os.path.join(TRAINED, "draft"), "problems"
    from sglang_ext.testbed.tiny import build_tiny_models

    if not os.path.exists(os.path.join(args.models_dir, "draft", "config.json")):
        print(f"building the tiny testbed models in {args.models_dir} ...", flush=True)
    models = build_tiny_models(args.models_dir, seed=0, fit_steps=400)
    return models.target, models.draft, "corpus"


def _is_testbed_target(target: str) -> bool:
    """Whether ``target`` uses the testbed's word-level tokenizer (its held-out problems apply)."""
    path = os.path.join(target, "tokenizer.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return json.load(f).get("model", {}).get("type") == "WordLevel"


def _prompts(target: str, kind: str, n: int, args) -> List[List[int]]:
    if kind == "heldout":  # the recipe's held-out prompts (never trained on), repeated to fill the batch
        from transformers import AutoTokenizer

        from sglang_ext.recipe.data import read_split
        from sglang_ext.recipe.generate import encode_prompts

        held = read_split(getattr(args, "split", None) or os.path.join(args.draft, "split.json"))["heldout"]
        ids = encode_prompts(AutoTokenizer.from_pretrained(target), held)
        return [ids[i % len(ids)] for i in range(n)]
    if kind == "problems":  # held-out problems through the chat template, thinking on
        if os.path.join(REPO, "bench") not in sys.path:
            sys.path.insert(0, os.path.join(REPO, "bench"))
        from specexit_eval import held_out_problems
        from transformers import AutoTokenizer

        from sglang_ext.testbed import task

        tok = AutoTokenizer.from_pretrained(target)
        return [tok.encode(task.prompt_text(p["question"], True), add_special_tokens=False)
                for p in held_out_problems(n, args.problem_seed)]
    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, n, args.prompt_len, seed=0).tolist()


def _activate_cpu_testbed() -> None:
    """Without CUDA: the CPU testbed's stand-ins, before anything imports SGLang."""
    import torch

    if not torch.cuda.is_available():
        from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

        os.environ.update(cpu_testbed_env())
        install()


def _engine(target: str, args, **kw):
    import sglang

    import sglang_ext
    from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS

    sglang_ext.load()
    max_bs = max(args.bs_list)
    per_req = args.max_prompt_len + args.max_new_tokens + 4 * args.num_draft_tokens + 8
    base = dict(CPU_ENGINE_KWARGS)
    base.update(max_total_tokens=args.max_total_tokens or max(4096, 2 * max_bs * per_req),
                max_running_requests=max(args.max_running_requests, max_bs),
                attention_backend=args.attention_backend,
                # several engines stay up side by side (paired repeats): an idle scheduler waits on its
                # sockets instead of polling (SGLang's --sleep-on-idle), so it takes no core from the one measured
                sleep_on_idle=True)
    if getattr(args, "mem_fraction_static", None) is not None:
        base.update(mem_fraction_static=args.mem_fraction_static)
    try:
        import torch

        if torch.cuda.is_available():
            base.update(device="cuda", disable_cuda_graph=False, sampling_backend=None, dtype="auto",
                        max_total_tokens=args.max_total_tokens, attention_backend=None, mem_fraction_static=None)
            base = {k: v for k, v in base.items() if v is not None}
    except ImportError:
        pass
    base.update(kw)
    return sglang.Engine(model_path=target, **base)


class EngineProcess:
    """One ``sglang.Engine`` in a process of its own, driven over a pipe.

    Several engines are up side by side for the paired repeats. In one process they would share
    SGLang's process-wide runtime context (the last engine's speculative settings are read by every
    engine's tokenizer manager: a plain engine next to EAGLE ones fails on SGLang's speculative
    metrics) and ``Engine.shutdown`` kills every child process of the caller. Each engine therefore
    runs in a spawned process; a run is timed there, around ``engine.generate``, as in
    :func:`_run`, and the pipe round trip is outside the timed span.
    """

    def __init__(self, name: str, target: str, args, wait: bool = True, **kw):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.name = name
        self.ready = False
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_process_main, args=(child, target, args, kw), name=f"bench-{name}")
        self.proc.start()
        child.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the engine is up (SystemExit with its traceback when it failed to start)."""
        if self.ready:
            return
        status, payload = self._recv()
        if status != "ready":
            self.proc.join(30)
            raise SystemExit(f"the {self.name} engine did not start:\n{payload}")
        self.ready = True

    def _recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            return "error", f"the {self.name} engine process exited (code {self.proc.exitcode})"

    def call(self, op: str, *a):
        self.conn.send((op, a))
        status, payload = self._recv()
        if status != "ok":
            raise RuntimeError(f"{self.name} engine, {op}: {payload}")
        return payload

    def client(self, fn: str, *a):
        """``sglang_ext.engine.dcut.client.<fn>(engine, *a)`` in the engine's process."""
        return self.call("client", fn, *a)

    def get_server_info(self) -> dict:
        return self.call("server_info")

    def shutdown(self) -> None:
        if self.proc.is_alive() and self.ready:
            try:
                self.conn.send(("stop", ()))
                self._recv()
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def _engine_process_main(conn, target: str, args, kw: dict) -> None:
    """Body of an :class:`EngineProcess`: launch the engine, then serve requests until ``stop``."""
    import threading
    import traceback

    parent = os.getppid()
    try:
        _activate_cpu_testbed()
        from sglang_ext.engine.dcut import client

        eng = _engine(target, args, **kw)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return

    def orphan_guard():  # the bench process died: take the engine's processes down with us
        while True:
            time.sleep(2.0)
            if os.getppid() != parent:
                try:
                    eng.shutdown()
                finally:
                    os._exit(1)

    threading.Thread(target=orphan_guard, daemon=True).start()
    conn.send(("ready", None))
    while True:
        try:
            op, a = conn.recv()
        except EOFError:
            op, a = "stop", ()
        try:
            if op == "stop":
                eng.shutdown()
                conn.send(("ok", None))
                return
            if op == "generate":
                out = _run(eng, *a)
            elif op == "client":
                out = getattr(client, a[0])(eng, *a[1:])
            elif op == "server_info":
                out = eng.get_server_info()
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", out))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


def _post_generate(url: str, prompt, params: dict) -> dict:
    import urllib.request

    body = {"sampling_params": params}
    body["text" if isinstance(prompt, str) else "input_ids"] = prompt
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read().decode())


def _run_http(url: str, prompts, params: dict, concurrency=None) -> tuple:
    """``/generate`` requests, all concurrent (or at most ``concurrency`` in flight, refilled);
    (output tok/s, outputs, verify steps, tokens)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency or len(prompts)) as ex:
        outs = list(ex.map(lambda p: _post_generate(url, p, params), prompts))
    dt = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return tokens / dt, [o.get("output_ids", o.get("text")) for o in outs], _verify_ct(outs), tokens


def _verify_ct(outs) -> int:
    """Sum of SGLang's per-request ``spec_verify_ct`` (0 without speculation or when not reported)."""
    return sum(int(o["meta_info"].get("spec_verify_ct") or 0) for o in outs)


def _refill_note(args) -> str:
    return f", refilled batches ({args.refill} x bs requests, bs in flight)" if args.refill > 1 else ""


def _generate_refilled(engine, prompts, params: dict, concurrency: int) -> list:
    """``engine.async_generate`` of every prompt with at most ``concurrency`` requests in flight
    (the next one submitted as soon as one finishes); the outputs in prompt order."""
    import asyncio

    async def run():
        gate = asyncio.Semaphore(concurrency)

        async def one(p):
            async with gate:
                return await engine.async_generate(input_ids=p, sampling_params=params)

        return await asyncio.gather(*(one(p) for p in prompts))

    return list(engine.loop.run_until_complete(run()))


def _run(engine, prompts, max_new_tokens, concurrency=None) -> tuple:
    """One timed run of ``prompts``: (output tok/s, output ids per request, SGLang's verify steps
    summed over requests, output tokens). ``concurrency`` (None: all at once, a closed batch): at
    most that many requests in flight, refilled as they finish (``--refill``)."""
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    if concurrency is not None and concurrency >= len(prompts):
        concurrency = None
    if isinstance(engine, str):  # a server URL
        return _run_http(engine, prompts, params, concurrency)
    if isinstance(engine, EngineProcess):
        return engine.call("generate", prompts, max_new_tokens, concurrency)
    t0 = time.perf_counter()
    if concurrency is None:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    else:
        outs = _generate_refilled(engine, prompts, params, concurrency)
    dt = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return tokens / dt, [o["output_ids"] for o in outs], _verify_ct(outs), tokens


def _measure(engine, prompts_all, bs_list, args, modes=(None,), set_mode=None, stats=None, prime=()) -> Dict:
    """{mode: {bs: {"tok_s", "ids", "runs", ...}}}, the modes interleaved per repeat.

    ``engine``: one engine / URL for every mode, or a dict {mode: engine / URL} (several engines
    up side by side); ``set_mode(mode)`` is called before each run of a mode; ``stats(mode)``
    returns that mode's D-Cut metrics snapshot (None: none), whose deltas are kept per run.
    Before each timed run of a mode in ``prime``, an untimed 2-token request of one prompt runs on
    its engine: the D-Cut step timer measures verify-to-verify intervals (up to 5 s), so without it
    the first step of a run would include the time the engine sat idle while other engines ran.
    Every repeat runs every mode back to back (order reversed on odd repeats), so a repeat's
    ratios pair runs taken close together in time."""
    out: Dict = {m: {} for m in modes}

    def eng(m):
        return engine[m] if isinstance(engine, dict) else engine

    for bs in bs_list:
        prompts = prompts_all[:bs * args.refill]
        for m in modes:
            if set_mode:
                set_mode(m)
            _run(eng(m), prompts[:bs], min(8, args.max_new_tokens))  # warm-up at this batch size
            out[m][bs] = {"tok_s": 0.0, "ids": None}
        for rep in range(args.repeats):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for m in order:
                if set_mode:
                    set_mode(m)
                if m in prime:
                    _run(eng(m), prompts[:1], 2)
                before = stats(m) if stats else None
                tps, ids, verify_ct, tokens = _run(eng(m), prompts, args.max_new_tokens, bs)
                r = out[m][bs]
                if before is not None:
                    r.setdefault("metrics", []).append(_delta(before, stats(m)))
                if r["ids"] is not None and r["ids"] != ids:
                    r["repeat_differs"] = True
                r["ids"] = ids
                r["tok_s"] = max(r["tok_s"], tps)
                r.setdefault("runs", []).append(tps)  # per repeat, for the paired ratios
                r["verify_ct"] = r.get("verify_ct", 0) + verify_ct
                r["tokens"] = r.get("tokens", 0) + tokens
        print(f"  bs={bs}: " + ", ".join(f"{m or NO_SPEC} {out[m][bs]['tok_s']:.1f}" for m in modes)
              + " tok/s", flush=True)
    return out


def run_bench(args) -> dict:
    _activate_cpu_testbed()

    args.bs_list = [int(b) for b in args.batch_sizes.split(",")]
    dcut_modes = _apply_modes(args)
    if not args.no_timing:
        # before the first engine: SGLang's later subprocesses may not see later changes
        os.environ[TIMING_ENV] = "1"
    target, draft, kind = _resolve_models(args)
    if args.max_new_tokens is None:
        args.max_new_tokens = 128 if kind == "problems" else 64  # heldout (a real pair): 64
    prompts = _prompts(target, kind, max(args.bs_list) * args.refill, args)
    args.max_prompt_len = max(len(p) for p in prompts)
    print(f"[dcut_throughput] target={target} draft={draft} prompts={kind} (max {args.max_prompt_len} tokens), "
          f"steps {args.num_steps}, topk {args.topk}, {args.num_draft_tokens} draft tokens, "
          f"{args.max_new_tokens} new tokens, batch sizes {args.bs_list}, repeats {args.repeats}{_refill_note(args)}",
          flush=True)
    results: Dict[str, Dict[int, dict]] = {}
    engines: Dict[str, EngineProcess] = {}  # engine name -> its process, all up until the end
    engine_of: Dict[str, object] = {}  # mode -> its engine
    extra = {"dcut_cache_dir": args.cache_dir or tempfile.mkdtemp(prefix="dcut_throughput_cache_")}
    if args.cost_table:
        extra["dcut_cost_table"] = args.cost_table
    if args.profile_steps:
        extra["dcut_profile_steps"] = args.profile_steps
    eagle = dict(speculative_algorithm=args.algorithm, speculative_draft_model_path=draft,
                 speculative_num_steps=args.num_steps, speculative_eagle_topk=args.topk,
                 speculative_num_draft_tokens=args.num_draft_tokens)
    adaptive = _adaptive_plan(args) if not getattr(args, "sequential", False) else \
        {"status": "n/a", "reason": "--sequential runs only no-spec, the D-Cut engine and auto-never"}
    if adaptive["status"] != "measured":
        print(f"  adaptive: n/a ({adaptive['reason']})", flush=True)
    dcut_kw = dict(dcut="auto", dcut_draft_off="auto", **eagle, **extra)
    never_kw = dict(dcut="auto", dcut_draft_off="never", **eagle, **extra)

    packed = {PACKED_ENV: str(args.packed_gemm)} if getattr(args, "packed_gemm", 0) else {}

    def start(name, env=None, **kw):
        from sglang_ext.envutil import environ

        with environ(env or {}):  # the engine's processes read the environment when they start
            engines[name] = EngineProcess(name, target, args, wait=False, **kw)

    def wait(*names):
        for n in names:
            if n in engines:
                engines[n].wait_ready()

    try:
        if getattr(args, "sequential", False):
            results, info, online, startup = _run_sequential(args, start, engines, prompts, dcut_kw, never_kw,
                                                             extra, packed, dcut_modes)
            return _result(args, results, info, online, startup, extra, adaptive, target, draft, kind)
        # Launch order: the engines that profile nothing first (side by side), then the D-Cut engine alone
        # (its launch-time profile must not share the cores with other launches), then auto-never on the
        # profiled table. With --cost-table nothing is profiled and all start together.
        if not args.skip_no_spec:
            start(NO_SPEC, env={PACKED_ENV: "0"} if packed else None)
            if packed:
                start(NO_SPEC_PACKED, env=packed)
            if getattr(args, "no_spec_sync", False):
                start(NO_SPEC_SYNC, env={PACKED_ENV: "0"} if packed else None, disable_overlap_schedule=True)
        if adaptive["status"] == "measured":
            start(ADAPTIVE, speculative_adaptive=True, speculative_adaptive_config=adaptive["config_path"], **eagle)
        if args.cost_table:
            start("dcut", env=packed, **dcut_kw)
            if not args.skip_never:
                start(NEVER, env=packed, **never_kw)
        wait(NO_SPEC, NO_SPEC_SYNC, NO_SPEC_PACKED, ADAPTIVE)
        t0 = time.perf_counter()
        if "dcut" not in engines:
            start("dcut", env=packed, **dcut_kw)
        wait("dcut")
        startup = time.perf_counter() - t0
        if adaptive.get("config_path") and not getattr(args, "skip_depth", False):
            # D-Cut's depth mode profiles its own table (the depths are its columns): launched alone too
            start(DEPTH, env=packed, speculative_adaptive=True, speculative_adaptive_config=adaptive["config_path"], dcut="auto",
                  dcut_draft_off="auto", dcut_cache_dir=extra["dcut_cache_dir"],
                  **({"dcut_profile_steps": args.profile_steps} if args.profile_steps else {}), **eagle)
            wait(DEPTH)
        eng = engines["dcut"]
        print(f"  {args.algorithm} --dcut auto engine up in {startup:.1f} s", flush=True)
        info = eng.client("dcut_info")
        _say_table(info)
        if not args.skip_never and NEVER not in engines:
            # the same table (a file), drafting never switched off: auto's tier choice alone
            never_kw["dcut_cost_table"] = os.path.join(extra["dcut_cache_dir"], "bench_table.json")
            with open(never_kw["dcut_cost_table"], "w") as f:
                json.dump(info["cost_table"], f)
            start(NEVER, env=packed, **never_kw)
        wait(NEVER)
        engine_of.update({m: eng for m in dcut_modes})
        engine_of.update({n: engines[n] for n in (NO_SPEC, NO_SPEC_SYNC, NO_SPEC_PACKED, NEVER, ADAPTIVE, DEPTH)
                          if n in engines})
        if ADAPTIVE in engines:
            adaptive["server"] = {k: engines[ADAPTIVE].get_server_info().get(k) for k in
                                  ("speculative_adaptive", "speculative_num_steps", "speculative_num_draft_tokens",
                                   "speculative_eagle_topk")}
            if not adaptive["server"].get("speculative_adaptive"):
                raise SystemExit(f"SGLang turned --speculative-adaptive off for this shape: {adaptive['server']}")

        def set_mode(m):
            if m not in MODE_RATIO and m != OFF:
                return  # another engine's mode
            assert eng.client("set_force_ratio", MODE_RATIO.get(m, 0.0)), f"server refused dcut_force_ratio for {m}"
            if OFF in dcut_modes:
                assert eng.client("set_force_draft_off", int(m == OFF)), f"server refused dcut_force_draft_off for {m}"

        def stats(m):
            if m not in DCUT_MODES:
                return None
            return _stats_with_calibration(engine_of[m].client("dcut_states")[0])

        modes = [m for m in ALL_MODES if m in engine_of]
        results.update(_measure(engine_of, prompts, args.bs_list, args, modes=modes, set_mode=set_mode, stats=stats,
                                prime=() if args.no_timing else DCUT_MODES))
        # the online corrections auto planned with at the end (the corrected cells per profiled bs)
        online = {m: engine_of[m].client("dcut_states")[0].get("online_costs") for m in ("auto", NEVER, DEPTH)
                  if m in engine_of}
    finally:
        _shutdown_all(engines)
    return _result(args, results, info, online, startup, extra, adaptive, target, draft, kind)


def _run_sequential(args, start, engines, prompts, dcut_kw, never_kw, extra, packed, dcut_modes) -> tuple:
    """``--sequential``: one engine up at a time (hosts without memory for several copies of the
    models): each engine is started, measured at every batch size and repeat, and shut down before
    the next starts. The ratios then pair repeat i of each engine, taken minutes apart."""
    if not args.skip_adaptive or not getattr(args, "skip_depth", True):
        print("  --sequential: SGLang's adaptive engine and D-Cut's depth mode are not run", flush=True)
    args.skip_adaptive = args.skip_depth = True
    results: Dict[str, Dict[int, dict]] = {}

    def measure_alone(name, modes, set_mode=None, stats=None, prime=()):
        engines[name].wait_ready()
        results.update(_measure({m: engines[name] for m in modes}, prompts, args.bs_list, args, modes=list(modes),
                                set_mode=set_mode, stats=stats, prime=prime))

    def stop(name):
        engines.pop(name).shutdown()

    if not args.skip_no_spec:
        start(NO_SPEC, env={PACKED_ENV: "0"} if packed else None)
        measure_alone(NO_SPEC, [NO_SPEC])
        stop(NO_SPEC)
        if packed:
            start(NO_SPEC_PACKED, env=packed)
            measure_alone(NO_SPEC_PACKED, [NO_SPEC_PACKED])
            stop(NO_SPEC_PACKED)
        if getattr(args, "no_spec_sync", False):
            start(NO_SPEC_SYNC, env={PACKED_ENV: "0"} if packed else None, disable_overlap_schedule=True)
            measure_alone(NO_SPEC_SYNC, [NO_SPEC_SYNC])
            stop(NO_SPEC_SYNC)
    t0 = time.perf_counter()
    start("dcut", env=packed, **dcut_kw)
    engines["dcut"].wait_ready()
    startup = time.perf_counter() - t0
    eng = engines["dcut"]
    print(f"  {args.algorithm} --dcut auto engine up in {startup:.1f} s", flush=True)
    info = eng.client("dcut_info")
    _say_table(info)

    def set_mode(m):
        assert eng.client("set_force_ratio", MODE_RATIO.get(m, 0.0)), f"server refused dcut_force_ratio for {m}"
        if OFF in dcut_modes:
            assert eng.client("set_force_draft_off", int(m == OFF)), f"server refused dcut_force_draft_off for {m}"

    def stats_of(e):
        return lambda m: _stats_with_calibration(e.client("dcut_states")[0])

    modes = [m for m in ALL_MODES if m in dcut_modes]
    measure_alone("dcut", modes, set_mode=set_mode, stats=stats_of(eng), prime=() if args.no_timing else modes)
    online = {"auto": eng.client("dcut_states")[0].get("online_costs")}
    stop("dcut")
    if not args.skip_never:
        never_kw["dcut_cost_table"] = os.path.join(extra["dcut_cache_dir"], "bench_table.json")
        with open(never_kw["dcut_cost_table"], "w") as f:
            json.dump(info["cost_table"], f)
        start(NEVER, env=packed, **never_kw)
        never = engines[NEVER]
        measure_alone(NEVER, [NEVER], stats=stats_of(never), prime=() if args.no_timing else [NEVER])
        online[NEVER] = never.client("dcut_states")[0].get("online_costs")
        stop(NEVER)
    return results, info, online, startup


def _result(args, results, info, online, startup, extra, adaptive, target, draft, kind) -> dict:
    """The saved result of one engine run (side by side or ``--sequential``)."""
    ref = next((m for m in ("full", NO_SPEC, NO_SPEC_SYNC, NO_SPEC_PACKED) if m in results), next(iter(results)))
    lossless = {m: all(results[m][bs]["ids"] == results[ref][bs]["ids"] and not results[m][bs].get("repeat_differs")
                       for bs in args.bs_list) for m in results}
    dcut_stats = {m: {bs: _merge(results[m][bs].get("metrics", [])) for bs in args.bs_list}
                  for m in DCUT_MODES if m in results}
    spec = {m: {bs: (r["tokens"] / r["verify_ct"] if r.get("verify_ct") else None) for bs, r in results[m].items()}
            for m in results if m != NO_SPEC}
    settings = {k: v for k, v in vars(args).items() if k not in ("what_if",)}
    settings["cache_dir"] = extra["dcut_cache_dir"]
    res = {
        "settings": settings,
        "target": target, "draft": draft, "prompts": kind, "startup_s": startup,
        "cost_table": info.get("cost_table"), "cost_table_info": info.get("cost_table_info"),
        **_throughput(results), "dcut": dcut_stats, "lossless_vs_full": lossless, "lossless_reference": ref,
        "tokens_per_verify": spec, "adaptive": {k: v for k, v in adaptive.items() if k != "config_path"},
        "online_costs": {m: (o or {}).get("corrections") for m, o in online.items()},
        "online_context_slope": {m: (o or {}).get("context_slope") for m, o in online.items()},
    }
    res["paired_ratios"] = _paired_ratios(res["tok_s_runs"], args.bs_list, [m for m in FIXED if m in results])
    return res


def _apply_modes(args) -> tuple:
    """The D-Cut engine's modes to measure under ``--modes`` (all of :data:`MODES` without it); sets
    the ``skip_*`` flags of the other engines it leaves out.  'auto' is always measured.

    >>> import argparse
    >>> a = argparse.Namespace(modes="no-spec, auto", skip_no_spec=False, skip_never=False, skip_adaptive=False)
    >>> _apply_modes(a), a.skip_no_spec, a.skip_never, a.skip_adaptive
    (('auto',), False, True, True)
    >>> _apply_modes(argparse.Namespace(modes="auto,fast", skip_no_spec=False, skip_never=False,
    ...                                 skip_adaptive=False))
    Traceback (most recent call last):
    SystemExit: --modes: unknown mode 'fast' (known: no-spec, no-spec-sync, no-spec-packed, off, full, r0.25, r0.5, r0.75, auto-never, auto, auto-depth, adaptive)
    """
    if not args.modes:
        return MODES
    known = [m for m in ALL_MODES if m != "server"]
    want = {m.strip() for m in args.modes.split(",") if m.strip()}
    bad = sorted(want - set(known))
    if bad:
        raise SystemExit(f"--modes: unknown mode {bad[0]!r} (known: {', '.join(known)})")
    want.add("auto")
    args.skip_no_spec = args.skip_no_spec or NO_SPEC not in want
    args.skip_never = args.skip_never or NEVER not in want
    args.skip_adaptive = args.skip_adaptive or ADAPTIVE not in want
    args.skip_depth = getattr(args, "skip_depth", False) or DEPTH not in want
    return tuple(m for m in MODES + OPT_IN_MODES if m in want)


def _say_table(info: dict) -> None:
    """Print where the D-Cut engine's cost table came from and whether it holds draft-off costs."""
    src = (info.get("cost_table_info") or {}).get("source")
    table = info.get("cost_table") or {}
    off = table.get("off_ms")
    print(f"  cost table: {src}, schema version {table.get('version')}, draft-off costs "
          + ("none: auto never switches drafting off" if not off else
             ", ".join(f"bs {b}: {o:.1f} ms" for b, o in zip(table.get("batch_sizes", []), off))), flush=True)
    if not off:
        print("  WARNING: the draft-off comparison needs a cost table with draft-off costs (schema version 2; "
              "drop --cost-table / --cache-dir for a fresh profile)", flush=True)
    elif src != "profiled":
        print(f"  note: the cost table was not profiled by this run (source: {src}); its costs are those of the "
              "host that profiled it, and the online costs correct the cells that run", flush=True)


def _adaptive_plan(args) -> dict:
    """Whether SGLang's ``--speculative-adaptive`` runs this shape, and with which config.

    SGLang's adaptive mode supports only ``topk == 1`` (chains) and requires the launch
    ``--speculative-num-steps`` to be a candidate of its config; by default the config is
    SGLang's ``DEFAULT_ADAPTIVE_CONFIG`` with ``--num-steps`` added to its batch-size-1 slot.
    Returns ``{"status": "measured" | "n/a", "reason", "config", "config_path"}``."""
    if args.skip_adaptive:
        return {"status": "n/a", "reason": "--skip-adaptive"}
    if getattr(args, "algorithm", "EAGLE3") != "EAGLE3":
        return {"status": "n/a", "reason": f"SGLang has no --speculative-adaptive for {args.algorithm}"}
    if args.topk != 1:
        return {"status": "n/a", "reason": ADAPTIVE_TOPK_REASON.format(topk=args.topk)}
    if args.adaptive_config:
        with open(args.adaptive_config) as f:
            cfg = json.load(f)
        path = args.adaptive_config
    else:
        from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG

        cfg = json.loads(json.dumps(DEFAULT_ADAPTIVE_CONFIG))
        slot = cfg[min(cfg, key=int)]
        slot["candidate_steps"] = sorted(set(slot["candidate_steps"]) | {args.num_steps})
        fd, path = tempfile.mkstemp(prefix="adaptive_", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
    steps = sorted({s for k, e in cfg.items() if k.isdigit() for s in e["candidate_steps"]})
    if args.num_steps not in steps:
        raise SystemExit(f"--adaptive-config: --num-steps {args.num_steps} is not among its candidate_steps {steps} "
                         "(SGLang requires it)")
    if args.num_draft_tokens != args.num_steps + 1:
        return {"status": "n/a", "reason": f"SGLang's --speculative-adaptive sets num_draft_tokens = num_steps + 1 "
                                           f"(a chain); this shape has {args.num_draft_tokens} draft tokens for "
                                           f"{args.num_steps} steps"}
    return {"status": "measured", "reason": None, "config": cfg, "config_path": path}


def _shutdown_all(engines: Dict[str, "EngineProcess"]) -> None:
    """Shut every engine down (each in its own process, so one shutdown leaves the others alone)."""
    for name, e in reversed(list(engines.items())):
        try:
            e.shutdown()
        except Exception as exc:
            print(f"  ({name} engine shutdown: {type(exc).__name__}: {exc})", flush=True)


def _url_prompts(n: int, args) -> List[str]:
    """The held-out problems as chat-formatted text, thinking on (the server's tokenizer encodes them)."""
    if os.path.join(REPO, "bench") not in sys.path:
        sys.path.insert(0, os.path.join(REPO, "bench"))
    from specexit_eval import held_out_problems

    from sglang_ext.testbed import task

    return [task.prompt_text(p["question"], True) for p in held_out_problems(n, args.problem_seed)]


def run_url(args) -> dict:
    """Measure a running server at ``args.url`` (no engines launched).

    With D-Cut on (``/server_info`` has ``dcut``): every mode of :data:`MODES`, switched through
    ``/set_internal_state`` ``dcut_force_ratio`` and interleaved like :func:`run_bench`, with the
    D-Cut metrics deltas from ``internal_states``; the configured mode is restored at the end.
    Else one mode, ``server``, as it is.
    """
    from sglang_ext.engine.dcut.client import dcut_states, server_info, set_force_ratio

    args.bs_list = [int(b) for b in args.batch_sizes.split(",")]
    if args.max_new_tokens is None:
        args.max_new_tokens = 128
    url = args.url.rstrip("/")
    info = server_info(url)
    dcut = info.get("dcut")
    prompts = _url_prompts(max(args.bs_list) * args.refill, args)
    print(f"[dcut_throughput] server {url} (model {info.get('model_path')}, speculative "
          f"{info.get('speculative_algorithm')}, D-Cut {'on: ' + str(dcut.get('mode')) if dcut else 'off'}), "
          f"{args.max_new_tokens} new tokens, batch sizes {args.bs_list}, repeats {args.repeats}{_refill_note(args)}",
          flush=True)
    if not dcut:
        res = _measure(url, prompts, args.bs_list, args)[None]
        return {"settings": {k: v for k, v in vars(args).items() if k != "what_if"}, "url": url,
                "tok_s": {"server": {bs: r["tok_s"] for bs, r in res.items()}}}

    def set_mode(m):
        if not set_force_ratio(url, MODE_RATIO[m]):
            raise SystemExit(f"{url} refused /set_internal_state dcut_force_ratio={MODE_RATIO[m]} ({m})")

    def stats(m=None):
        st = dcut_states(url)
        return _stats_with_calibration(st[0]) if st and "metrics" in st[0] else None

    has_stats = stats() is not None
    try:
        results = _measure(url, prompts, args.bs_list, args, modes=MODES, set_mode=set_mode,
                           stats=stats if has_stats else None)
    finally:
        set_force_ratio(url, 0.0)  # back to the configured mode
    lossless = {m: all(results[m][bs]["ids"] == results["full"][bs]["ids"] and not results[m][bs].get("repeat_differs")
                       for bs in args.bs_list) for m in MODES}
    dcut_stats = ({m: {bs: _merge(results[m][bs].get("metrics", [])) for bs in args.bs_list} for m in MODES}
                  if has_stats else {})
    return {"settings": {k: v for k, v in vars(args).items() if k != "what_if"}, "url": url,
            "cost_table": dcut.get("cost_table"), "cost_table_info": dcut.get("cost_table_info"),
            **_throughput(results), "dcut": dcut_stats, "lossless_vs_full": lossless,
            "paired_ratios": _paired_ratios(_throughput(results)["tok_s_runs"], args.bs_list, list(FIXED))}


def _stats_with_calibration(state: dict) -> dict:
    """The live D-Cut metrics plus the calibration exponent ``tau`` at this moment (None: off)."""
    calib = state.get("calibration")
    explore = (state.get("draft_off") or {}).get("explore_steps", 0)
    return {**state["metrics"], "calibration_tau": None if not calib else calib["tau"], "explore_steps": explore}


def _delta(before: dict, after: dict) -> dict:
    """D-Cut metrics of one run: ``after - before`` of two ``dcut_states(...)["metrics"]`` snapshots."""
    d = {k: after[k] - before[k] for k in ("steps", "pruned_steps", "verified_tokens", "full_tokens",
                                          "accepted_tokens")}
    d["draft_off_steps"] = after.get("draft_off_steps", 0) - before.get("draft_off_steps", 0)
    d["explore_steps"] = after.get("explore_steps", 0) - before.get("explore_steps", 0)
    hist = {k: v - before["tier_histogram"].get(k, 0) for k, v in after["tier_histogram"].items()}
    d["tier_histogram"] = {k: v for k, v in hist.items() if v}
    if after.get("calibration_tau") is not None:  # summed over runs; _merge divides by "runs"
        d["calibration_tau_sum"] = after["calibration_tau"]
        d["runs"] = 1
    tb, ta = before.get("step_timing"), after.get("step_timing")
    if ta:
        steps = ta["steps"] - (tb["steps"] if tb else 0)
        d["timed_steps"] = steps
        d["ms_total"] = ta["step_ms"] * ta["steps"] - (tb["step_ms"] * tb["steps"] if tb else 0.0)
        d["part_ms_total"] = {k: v * ta["steps"] - (tb["ms_per_step"][k] * tb["steps"] if tb else 0.0)
                              for k, v in ta["ms_per_step"].items()}
        hb = tb["accept_length_histogram"] if tb else []
        d["accept_hist"] = [v - (hb[i] if i < len(hb) else 0) for i, v in enumerate(ta["accept_length_histogram"])]
        sb = tb.get("predicted_survival_sum", []) if tb else []
        d["survival_sum"] = [v - (sb[i] if i < len(sb) else 0.0)
                             for i, v in enumerate(ta.get("predicted_survival_sum", []))]
        d["survival_rows"] = ta.get("predicted_survival_rows", 0) - (tb.get("predicted_survival_rows", 0) if tb else 0)
    return d


def _merge(runs: List[dict]) -> dict:
    """Sum the per-run deltas of one (mode, batch size); derived ratios on the sums."""
    if not runs:
        return {}
    out: dict = {}
    for r in runs:
        for k, v in r.items():
            if isinstance(v, dict):
                acc = out.setdefault(k, {})
                for kk, vv in v.items():
                    acc[kk] = acc.get(kk, 0) + vv
            elif isinstance(v, list):
                acc = out.setdefault(k, [])
                acc.extend([0] * (len(v) - len(acc)))
                for i, vv in enumerate(v):
                    acc[i] += vv
            else:
                out[k] = out.get(k, 0) + v
    out["keep_ratio"] = out["verified_tokens"] / out["full_tokens"] if out.get("full_tokens") else None
    if out.get("runs"):
        out["calibration_tau"] = out["calibration_tau_sum"] / out["runs"]
    if out.get("timed_steps"):
        out["step_ms"] = out["ms_total"] / out["timed_steps"]
        out["ms_per_step"] = {k: v / out["timed_steps"] for k, v in out["part_ms_total"].items()}
    hist = out.get("accept_hist")
    if hist and sum(hist):
        n = sum(hist)
        out["mean_accept_length"] = sum(i * c for i, c in enumerate(hist)) / n
        # P(accept length >= k), k = 1..N: the survival of the k-th chain position (bonus at k = 1)
        out["accept_survival"] = [sum(hist[k:]) / n for k in range(1, len(hist))]
    if out.get("survival_rows"):
        # the planner's predicted P(draft k accepted) = P(accept length >= k + 1), k = 1..N-1
        out["predicted_survival"] = [v / out["survival_rows"] for v in out["survival_sum"]]
    return out


PARTS = ("draft", "plan", "target_forward", "verify_rest", "draft_extend", "other")


def report(res: dict, out_png: str = None) -> None:
    tok = res["tok_s"]
    bs_list = sorted({int(b) for m in tok.values() for b in m})
    modes = [m for m in ALL_MODES if m in tok]
    adaptive = res.get("adaptive") or {}
    print("\noutput tokens/s (higher is better)")
    print("mode        " + "".join(f"{'bs=' + str(b):>10}" for b in bs_list))
    for m in modes:
        print(f"{m:<12}" + "".join(f"{tok[m][_k(tok[m], b)]:>10.1f}" for b in bs_list))
    if adaptive.get("status") == "n/a":
        print(f"{ADAPTIVE:<12}" + "".join(f"{'n/a':>10}" for _ in bs_list) + f"   ({adaptive.get('reason')})")
    fixed = [m for m in FIXED if m in tok]
    if not ("auto" in tok and len(tok) > 1):  # a server without D-Cut (--url)
        if out_png:
            _plot(res, bs_list, modes, out_png)
            print(f"plot: {out_png}")
        return
    rows = ratio_rows(list(tok), adaptive_na=adaptive.get("status") == "n/a", tiers=bool(fixed and "full" in tok))
    best_of = {b: {m: tok[m][_k(tok[m], b)] for m in tok} for b in bs_list}
    print("\nratios of the best-of-repeats tok/s (peak = max(no-spec, full, each fixed tier); best = the fastest "
          "fixed tier below full; never = auto with --dcut-draft-off never)")
    _print_ratio_rows(rows, {b: ratios_of(best_of[b], fixed) for b in bs_list}, bs_list)
    paired = _paired_ratios(res.get("tok_s_runs") or {}, bs_list, fixed)
    if paired:
        print("\npaired ratios (median over repeats of one repeat's ratio; a repeat runs every mode back to back,"
              " so slow drifts of a shared host cancel)")
        _print_ratio_rows(rows, paired, bs_list)
    st = res.get("dcut") or {}
    eff = _step_efficiency(st, bs_list) if fixed and "full" in tok else {}  # its rows need full and the tiers
    if eff:
        print("\ndecode-step efficiency ratios (accepted tokens per ms of timed decode steps, all repeats;"
              " mean over repeats, prefill excluded)")
        for name, (num, den) in (("auto/full", ("auto", "full")), ("auto/best", ("auto", None)),
                                 ("best/full", (None, "full"))):
            vals = []
            for b in bs_list:
                e = eff[b]
                best = max((e[m] for m in ("r0.25", "r0.5", "r0.75") if e.get(m)), default=None)
                a = e.get(num) if num else best
                c = e.get(den) if den else best
                vals.append(a / c if a and c else float("nan"))
            print(f"{name:<12}" + "".join(f"{v:>10.2f}" for v in vals))
    if st and all(isinstance(v, dict) and (not v or _k(v, bs_list[0]) in v) for v in st.values()):
        _report_steps(st, bs_list)
    elif st.get("auto"):  # results of the earlier format (one entry per mode)
        a = st["auto"]
        print(f"\nauto: keep ratio {a.get('keep_ratio')}, tiers {a.get('tier_histogram')}")
    for m, rows in (res.get("online_costs") or {}).items():
        if rows:
            print(f"\nonline cost corrections of {m} at the end (per profiled bs: column -> factor, corrected ms): "
                  + "; ".join(f"bs {b}: " + ", ".join(f"{c} x{v['factor']:.2f} {v['ms']:.0f}" for c, v in cells.items())
                              for b, cells in rows.items()))
            slopes = (res.get("online_context_slope") or {}).get(m)
            if slopes:
                print("  context slope per profiled bs (step cost ~ context ** slope): "
                      + ", ".join(f"bs {b}: {v:.2f}" for b, v in slopes.items()))
    if res.get("lossless_vs_full"):
        ref = res.get("lossless_reference", "full")
        print(f"\nlossless vs {'full verify' if ref == 'full' else ref} (token for token): {res['lossless_vs_full']}")
    if res.get("cost_table_info"):
        print(f"cost table: {res['cost_table_info']}")
    if out_png:
        _plot(res, bs_list, modes, out_png)
        print(f"plot: {out_png}")


def _throughput(results: Dict) -> dict:
    """The saved throughput of ``{mode: {bs: measurement}}``: best-of (``tok_s``) and per repeat
    (``tok_s_runs``, for the paired ratios)."""
    return {"tok_s": {m: {bs: r["tok_s"] for bs, r in res.items()} for m, res in results.items()},
            "tok_s_runs": {m: {bs: r.get("runs", []) for bs, r in res.items()} for m, res in results.items()}}


#: (row name, numerator, denominator) of the printed ratios; "best" = the fastest fixed tier below
#: full verification, "peak" = the fastest of no-spec, full and every fixed tier (all that auto chooses from)
RATIOS = (("auto/full", "auto", "full"), ("auto/best", "auto", "best"), ("best/full", "best", "full"),
          (f"auto/{NO_SPEC.replace('-', '')}", "auto", NO_SPEC), (f"full/{NO_SPEC.replace('-', '')}", "full", NO_SPEC),
          ("auto/peak", "auto", "peak"), ("auto/never", "auto", NEVER), ("never/peak", NEVER, "peak"),
          ("auto/adaptive", "auto", ADAPTIVE), ("adaptive/peak", ADAPTIVE, "peak"),
          ("depth/adaptive", DEPTH, ADAPTIVE), (f"depth/{NO_SPEC.replace('-', '')}", DEPTH, NO_SPEC),
          ("depth/peak", DEPTH, "peak"), (f"off/{NO_SPEC.replace('-', '')}", OFF, NO_SPEC),
          ("nospecpacked/nospec", NO_SPEC_PACKED, NO_SPEC), ("nospecsync/nospec", NO_SPEC_SYNC, NO_SPEC),
          ("auto/nospecsync", "auto", NO_SPEC_SYNC), ("off/nospecsync", OFF, NO_SPEC_SYNC))


def ratios_of(tps: Dict[str, float], fixed: List[str]) -> Dict[str, float]:
    """Every ratio of :data:`RATIOS` computable from one set of tok/s per mode (one repeat, or the
    best of the repeats); ``fixed`` are the fixed tiers below full.

    >>> r = ratios_of({"no-spec": 100.0, "full": 80.0, "r0.5": 110.0, "auto": 99.0, "auto-never": 90.0}, ["r0.5"])
    >>> [(k, round(v, 3)) for k, v in r.items()][:4]
    [('auto/full', 1.238), ('auto/best', 0.9), ('best/full', 1.375), ('auto/nospec', 0.99)]
    >>> [(k, round(v, 3)) for k, v in r.items()][4:]
    [('full/nospec', 0.8), ('auto/peak', 0.9), ('auto/never', 1.1), ('never/peak', 0.818)]
    """
    v = dict(tps)
    if fixed and all(v.get(m) for m in fixed):
        v["best"] = max(v[m] for m in fixed)
    peak = [v[m] for m in (NO_SPEC, NO_SPEC_PACKED, "full", *fixed) if v.get(m)]
    if "full" in v and fixed:
        v["peak"] = max(peak)
    return {name: v[a] / v[b] for name, a, b in RATIOS if v.get(a) and v.get(b)}


def ratio_rows(modes: List[str], adaptive_na: bool = False, tiers: bool = True) -> List[str]:
    """The ratio rows printed for a result holding ``modes`` (rows naming an absent mode are left
    out; the adaptive rows stay, printed n/a, when the shape is not supported by SGLang; ``tiers``:
    full and the fixed tiers were measured, so "best" and "peak" exist).

    >>> ratio_rows(["no-spec", "auto"], tiers=False)
    ['auto/nospec']
    """
    have = set(modes) | ({"best", "peak"} if tiers else set()) | ({ADAPTIVE} if adaptive_na else set())
    return [name for name, a, b in RATIOS if a in have and b in have]


def _print_ratio_rows(rows: List[str], ratios: Dict[int, Dict[str, float]], bs_list: List[int]) -> None:
    for name in rows:
        print(f"{name:<14}" + "".join(f"{ratios[b][name]:>10.2f}" if name in ratios.get(b, {}) else f"{'n/a':>10}"
                                      for b in bs_list))


def _paired_ratios(runs: dict, bs_list: List[int], fixed: List[str]) -> dict:
    """{bs: {ratio name: median over repeats of the ratio within one repeat}} for every ratio of
    :data:`RATIOS` the recorded modes allow (repeat ``i`` of every mode ran back to back).

    >>> r = {"full": {"64": [100.0, 80.0, 90.0]}, "auto": {"64": [130.0, 100.0, 120.0]},
    ...      "r0.5": {"64": [125.0, 104.0, 110.0]}}
    >>> {k: round(v, 3) for k, v in _paired_ratios(r, [64], ["r0.5"])[64].items()}
    {'auto/full': 1.3, 'auto/best': 1.04, 'best/full': 1.25, 'auto/peak': 1.04}
    """
    out = {}
    for b in bs_list:
        per = {m: (runs.get(m) or {}).get(_k(runs.get(m) or {}, b)) or [] for m in runs}
        per = {m: v for m, v in per.items() if v}
        if "auto" not in per or len(per) < 2:
            continue
        n = min(len(v) for v in per.values())
        each = [ratios_of({m: v[i] for m, v in per.items()}, [m for m in fixed if m in per]) for i in range(n)]
        out[b] = {name: statistics.median(e[name] for e in each) for name in each[0]}
    return out


def _step_efficiency(st: dict, bs_list: List[int]) -> dict:
    """{bs: {mode: accepted tokens per ms of timed decode steps}} (empty without the time split)."""
    out = {}
    for b in bs_list:
        row = {}
        for m in DCUT_MODES:
            r = (st.get(m) or {}).get(_k(st.get(m) or {}, b)) or {}
            if isinstance(r, dict) and r.get("ms_total") and r.get("timed_steps", 0) >= 0.9 * r.get("steps", 0):
                row[m] = r["accepted_tokens"] / (r["ms_total"] * r["steps"] / r["timed_steps"])
        if row:
            out[b] = row
    return out if len(out) == len(bs_list) else {}


def _report_steps(st: dict, bs_list: List[int]) -> None:
    def g(m, b):
        return st.get(m, {}).get(_k(st.get(m, {}), b)) or {}

    print("\nauto per batch size: keep ratio, tier histogram (steps; draft_off = steps without drafting), "
          "survival calibration exponent tau (mean at the end of the auto runs; 1 = raw draft confidences)")
    for m in ("auto", NEVER, DEPTH):
        if not st.get(m):
            continue
        for b in bs_list:
            a = g(m, b)
            kr = a.get("keep_ratio")
            tau = a.get("calibration_tau")
            off = a.get("draft_off_steps")
            label = "" if m == "auto" else f" {m}"
            print(f"  bs={b:>3}{label}: keep {kr if kr is None else round(kr, 3)}  tiers {a.get('tier_histogram')}"
                  + ("" if tau is None else f"  tau {tau:.2f}")
                  + (f"  draft-off share {off / a['steps']:.2f}" if off is not None and a.get("steps") else "")
                  + (f" (exploring {a['explore_steps']})" if a.get("explore_steps") else ""))
    full = [g("full", b) for b in bs_list]
    if any(f.get("accept_survival") for f in full):
        print("\nacceptance along the chain (full verify): mean accept length (bonus incl.) and P(len >= k)")
        for b, f in zip(bs_list, full):
            sv = f.get("accept_survival")
            if sv:
                picks = [k for k in (2, 4, 8, 12, 16) if k <= len(sv)]
                print(f"  bs={b:>3}: mean {f['mean_accept_length']:.2f}  "
                      + "  ".join(f"P(>={k}) {sv[k - 1]:.2f}" for k in picks))
                pr = f.get("predicted_survival")
                if pr:  # pr[k - 2] predicts P(len >= k)
                    print(f"        predicted by the draft's confidences: mean {1 + sum(pr):.2f}  "
                          + "  ".join(f"P(>={k}) {pr[k - 2]:.2f}" for k in picks if 0 <= k - 2 < len(pr)))
    if any(g(m, b).get("ms_per_step") for m in DCUT_MODES for b in bs_list):
        print("\nper-step time split, ms per decode step (SGLANG_EXT_DCUT_TIMING); tok/step = accepted per step")
        print(f"  {'bs':>3} {'mode':<10}" + "".join(f"{p:>15}" for p in PARTS) + f"{'step':>9}{'tok/step':>10}")
        for b in bs_list:
            for m in DCUT_MODES:
                r = g(m, b)
                if not r.get("ms_per_step"):
                    continue
                tps = r["accepted_tokens"] / r["steps"] if r.get("steps") else float("nan")
                print(f"  {b:>3} {m:<10}" + "".join(f"{r['ms_per_step'][p]:>15.2f}" for p in PARTS)
                      + f"{r['step_ms']:>9.1f}{tps:>10.1f}")


def _k(d: dict, b: int):
    return b if b in d else str(b)


def _plot(res, bs_list, modes, path):
    """Left: tok/s vs batch size per mode. Right (when timed): ms per step by part at the largest bs.

    Also usable on a saved ``--json`` result (``python -c``: ``_plot(json.load(f), ...)``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tok = res["tok_s"]
    st = res.get("dcut") or {}
    big = bs_list[-1]
    split = {m: (st.get(m, {}).get(_k(st.get(m, {}), big)) or {}) for m in DCUT_MODES} if st else {}
    split = {m: r for m, r in split.items() if isinstance(r, dict) and r.get("ms_per_step")}
    fig, axes = plt.subplots(1, 2 if split else 1, figsize=(12 if split else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for m in modes:
        ax.plot(bs_list, [tok[m][_k(tok[m], b)] for b in bs_list], marker="o", label=m,
                linewidth=2.5 if m == "auto" else 1.2, linestyle="--" if m in (NO_SPEC, ADAPTIVE) else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs_list, [str(b) for b in bs_list])
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s")
    s = res.get("settings", {})
    ax.set_title(f"D-Cut: EAGLE3 steps {s.get('num_steps')}, topk {s.get('topk')}, "
                 f"{s.get('num_draft_tokens')} draft tokens")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if split:
        ax = axes[0][1]
        names = list(split)
        bottom = [0.0] * len(names)
        for part in PARTS:
            vals = [split[m]["ms_per_step"].get(part, 0.0) for m in names]
            ax.bar(names, vals, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, m in enumerate(names):
            r = split[m]
            if r.get("steps"):
                ax.text(i, bottom[i], f"{r['accepted_tokens'] / r['steps']:.0f} tok", ha="center",
                        va="bottom", fontsize=8)
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"ms per decode step at bs={big} (accepted tokens per step on top)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def what_if(res: dict, verify_scale: float) -> None:
    """Re-plan ``auto`` on the saved cost table with the verify share scaled (no engines)."""
    table = res.get("cost_table")
    if not table:
        print("no cost table in the result; nothing to replay")
        return
    tiers = table["tiers"]
    print(f"what-if: tier costs with the (cost - cost at tier {tiers[0]}) part scaled by {verify_scale}")
    for bs, row in zip(table["batch_sizes"], table["step_ms"]):
        base = row[0]
        scaled = [base + (c - base) * verify_scale for c in row]
        print(f"  bs={bs:>3}: " + ", ".join(f"{t:g}:{c:.1f}ms" for t, c in zip(tiers, scaled)))


def _curves(res: dict, bs) -> dict:
    """{"predicted": [...], "measured": [...]}: P(draft k accepted), k = 1..N-1, recorded at ``bs``.

    From the full-verify entry (every draft scored), else ``auto``'s; ``measured`` is
    ``accept_survival[1:]`` (``accept_survival[0]`` is the bonus token, always 1)."""
    out = {}
    for m in ("full", "auto"):
        st = (res.get("dcut") or {}).get(m) or {}
        r = st.get(_k(st, bs)) if st else None
        if not isinstance(r, dict):
            continue
        if "predicted" not in out and r.get("predicted_survival"):
            out["predicted"] = [float(x) for x in r["predicted_survival"]]
        if "measured" not in out and r.get("accept_survival"):
            out["measured"] = [float(x) for x in r["accept_survival"][1:]]
    return out


def what_if_table(res: dict, table_path: str) -> dict:
    """Replay the recorded survival curves against a cost-table JSON (no engines).

    For every batch size of the result, each recorded curve (the draft's predicted survival and,
    when recorded, the measured acceptance) becomes ``bs`` identical chains of ``N - 1`` slots;
    :func:`sglang_ext.dcut.choose` (``mode="auto"``) picks the tier on ``table_path``'s costs.
    Per tier: expected accepted tokens per step ``bs + S(K_q)``, step cost ``C_q`` and the
    predicted speed-up ``(E_q / C_q) / (E_full / C_full)`` over full verification (the largest
    tier). A mean curve replayed for every request ignores the per-request spread the live
    planner exploits, so it is a planning aid, not a measurement.

    With draft-off costs (schema version 2) the draft-off step is listed too: ``bs`` committed
    tokens at ``off_ms``, its speed-up over full verification (the tier choice shown is the
    drafted one; the live draft-off choice also has a dwell and probe steps).

    Returns ``{bs: {curve: {"tier", "keep_ratio", "expected", "costs", "speedup",
    "auto_speedup", "profiled_bs"[, "draft_off_speedup"]}}}``; a batch size beyond the table uses
    its largest row (as the server does).

    Examples
    --------
    ``python bench/dcut_throughput.py --what-if bench/results/dcut_throughput_trained_cpu_chain16.json
    --what-if-table gpu_cost.json``
    """
    import torch

    from sglang_ext.dcut import CostTable, choose, tier_keep_counts

    with open(table_path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "version" not in data and isinstance(data.get("cost_table"), dict):
        table = CostTable.from_dict(data["cost_table"])  # profile_cost.py --json / a --json result
    else:
        table = CostTable.load(table_path)
    tiers = list(table.tiers)
    bs_list = sorted({int(b) for m in res["tok_s"].values() for b in m})
    n_res = (res.get("settings") or {}).get("num_draft_tokens")
    print(f"\nwhat-if against {table_path}: tiers {tiers}, profiled bs {list(table.batch_sizes)}, "
          f"key draft_tokens={table.key.draft_tokens} device={table.key.device}")
    if tiers[-1] != 1.0:
        print(f"  note: the table has no 1.0 tier; 'full' below is its largest tier {tiers[-1]:g}")
    out: dict = {}
    for bs in bs_list:
        curves = _curves(res, bs)
        if not curves:
            print(f"  bs={bs:>3}: no recorded survival curve")
            continue
        n = len(next(iter(curves.values()))) + 1
        if n_res and int(n_res) != n:
            print(f"  bs={bs:>3}: curve has {n - 1} slots but the result ran N={n_res}")
        if table.key.draft_tokens != n:
            print(f"  bs={bs:>3}: note: table profiled for N={table.key.draft_tokens}, the result has N={n}")
        row = table.lookup(bs)
        if row is None:  # tables of the former contract
            print(f"  bs={bs:>3}: no table row >= {bs} (largest {table.batch_sizes[-1]}); "
                  f"the server would use the fallback ratio")
            out[bs] = None
            continue
        profiled_bs, costs = row
        if profiled_bs < bs:
            print(f"  bs={bs:>3}: no table row >= {bs} (largest {profiled_bs}); the server uses the costs of "
                  f"batch size {profiled_bs}")
        off = table.lookup_off(bs)
        keeps = tier_keep_counts(bs, n, tiers)
        out[bs] = {}
        for name, curve in curves.items():
            scores = torch.tensor([curve] * bs, dtype=torch.float64)  # [bs, N - 1]
            plan = choose(scores, table, mode="auto")
            flat = sorted((x for x in curve for _ in range(bs)), reverse=True)
            expected = [bs + sum(flat[:k]) for k in keeps]
            eff = [e / c for e, c in zip(expected, costs)]
            speedup = [x / eff[-1] for x in eff]
            out[bs][name] = {"tier": tiers[plan.tier_index], "keep_ratio": plan.verify_width / (bs * n),
                             "expected": expected, "costs": list(costs), "speedup": speedup,
                             "auto_speedup": speedup[plan.tier_index], "profiled_bs": profiled_bs}
            if off is not None:  # a draft-off step commits bs tokens at off_ms
                out[bs][name]["draft_off_speedup"] = (bs / off[1]) / eff[-1]
        for name, label in (("predicted", "draft's predicted survival"), ("measured", "measured acceptance")):
            if name not in out[bs]:
                continue
            r = out[bs][name]
            print(f"  bs={bs:>3} (table row bs={profiled_bs}), {label}: auto -> tier {r['tier']:g}, "
                  f"keep {r['keep_ratio']:.3f}, speed-up {r['auto_speedup']:.2f}x over full")
            print(f"      {'tier':>6}{'keep':>8}{'E[acc]/step':>13}{'cost ms':>10}{'speed-up':>10}")
            for q, t in enumerate(tiers):
                print(f"      {t:>6g}{(bs + keeps[q]) / (bs * n):>8.3f}{r['expected'][q]:>13.2f}"
                      f"{r['costs'][q]:>10.2f}{r['speedup'][q]:>9.2f}x")
            if "draft_off_speedup" in r:
                print(f"      {'off':>6}{'-':>8}{float(bs):>13.2f}{off[1]:>10.2f}{r['draft_off_speedup']:>9.2f}x")
    return out


def portable_paths(value):
    """``value`` with every absolute path string made shareable: paths inside the repository
    become repository-relative, other absolute paths keep only their last two components
    (``.../cache/dcut-<key>.json``), so saved results name no directory of the machine they ran on.

    >>> portable_paths({"a": os.path.join(REPO, "bench", "x.png"), "b": ["/tmp/run3/cache/t.json", 4]})
    {'a': 'bench/x.png', 'b': ['.../cache/t.json', 4]}
    """
    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        real = os.path.realpath(value)
        root = os.path.realpath(REPO)
        if real == root or real.startswith(root + os.sep):
            return os.path.relpath(real, root)
        parts = [x for x in value.split(os.sep) if x]
        return ".../" + "/".join(parts[-2:])
    return value


def main(argv=None):
    args = _parse_args(argv)
    if args.what_if:
        with open(args.what_if) as f:
            res = json.load(f)
        report(res, None)
        if args.what_if_table:
            from sglang_ext.dcut.cost_table import CostTableError

            try:
                what_if_table(res, args.what_if_table)
            except CostTableError as e:
                print(f"error: --what-if-table: {e}", file=sys.stderr)
                return 2
        else:
            what_if(res, args.what_if_verify_scale)
        return None
    res = run_url(args) if args.url else run_bench(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(portable_paths(res), f, indent=2)
    report(res, args.out)


if __name__ == "__main__":
    sys.exit(main())

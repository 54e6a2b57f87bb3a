"""Run task problems through real SGLang (an in-process ``sglang.Engine``) and score them.

    python -m sglang_ext.testbed.task --n 200 --seed 777 --out p.jsonl
    python -m sglang_ext.testbed.evaluate --problems p.jsonl --out results.json
    python -m sglang_ext.testbed.evaluate --problems p.jsonl --speculative-algorithm EAGLE3 \\
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \\
        [--specexit ...] [--dcut ...] --out results.json

Every SGLang server flag (and the extension's ``--specexit*``/``--dcut*`` flags) is
accepted, and so is ``--config FILE`` (a launcher preset, e.g.
``configs/specexit_testbed_tuned.yaml``), read by SGLang's own reader
(``ConfigArgumentMerger``) with SGLang's precedence: command-line flags over the file,
the file over the defaults below.  ``--model-path`` defaults to the committed target
(``sglang_ext/testbed/models/target``); with ``--speculative-algorithm`` the draft
defaults to the committed draft.  Without CUDA the CPU testbed settings are applied
unless given (device cpu, fp32, ``torch_sdpa`` attention, pytorch sampling, no CUDA
graphs, small KV pool).  Problems are sent concurrently (``--concurrency``, default
16) so that batching happens as in serving; decoding is greedy.

Prints one JSON line::

    {"n", "accuracy", "mean_output_tokens", "mean_think_tokens", "mean_latency_s",
     "accept_length", "throughput_tok_s", "mean_oracle_think_tokens", "mean_rechecks",
     "exited_early_rate"}

``--out`` holds that summary plus ``"results"``: one item per problem in input order,
``{"id", "answer", "output", "predicted", "correct", "output_tokens", "think_tokens",
"exited_early", "oracle_think_tokens", "latency_s"}``.  ``oracle_think_tokens`` is the
think length had thinking stopped right after the ``So the result is ...`` paragraph
(the oracle exit); ``exited_early`` is ``meta_info["specexit_exited"]`` when the
engine reports it, else false.  ``accept_length`` pools committed tokens per verify
step over all requests (0 without speculation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

from sglang_ext.testbed import task

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
DEFAULT_TARGET = os.path.join(MODELS_DIR, "target")
DEFAULT_DRAFT = os.path.join(MODELS_DIR, "draft")
#: Package whose modules define ``EntryClass`` for SGLang's model registry (SpecExit draft).
MODEL_PACKAGE = "sglang_ext.testbed.sglang_models"
EXIT_META_KEY = "specexit_exited"

CPU_DEFAULTS = {
    "device": "cpu",
    "dtype": "float32",
    "attention_backend": "torch_sdpa",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.5,
    "max_total_tokens": 32768,
    "chunked_prefill_size": -1,
    "skip_server_warmup": True,
    "random_seed": 0,
}


@dataclass
class Result:
    id: str
    answer: str
    output: str
    predicted: Optional[str]
    correct: bool
    output_tokens: int
    think_tokens: int
    exited_early: bool
    oracle_think_tokens: Optional[int]
    latency_s: float


def think_tokens(output_ids: Sequence[int], think_close_id: int) -> int:
    """Generated tokens before ``</think>`` (all of them when thinking never closed).

    Examples
    --------
    >>> think_tokens([7, 8, 4, 9], 4), think_tokens([7, 8], 4)
    (2, 2)
    """
    ids = list(output_ids)
    return ids.index(think_close_id) if think_close_id in ids else len(ids)


def oracle_think_tokens(tok, output: str) -> Optional[int]:
    """Think length if thinking had stopped right after the ``So the result is`` paragraph.

    Examples
    --------
    >>> from sglang_ext.testbed.tokenizer import build_tokenizer
    >>> oracle_think_tokens(build_tokenizer(), "Step 1: 1 + 2 = 3.\\n\\nSo the result is 3.\\n\\nYes")
    17
    """
    think = output.split(task.THINK_CLOSE, 1)[0]
    at = think.find("So the result is")
    if at < 0:
        return None
    end = think.find(task.PARAGRAPH_BREAK, at)
    if end < 0:
        return None
    prefix = think[: end + len(task.PARAGRAPH_BREAK)]
    return len(tok.encode(prefix, add_special_tokens=False))


def summarize(results: List[Result], wall_s: float, verify_steps: int) -> dict:
    n = len(results)
    out_tokens = sum(r.output_tokens for r in results)
    oracle = [r.oracle_think_tokens for r in results if r.oracle_think_tokens is not None]
    return {
        "n": n,
        "accuracy": sum(r.correct for r in results) / n,
        "mean_output_tokens": out_tokens / n,
        "mean_think_tokens": sum(r.think_tokens for r in results) / n,
        "mean_latency_s": sum(r.latency_s for r in results) / n,
        "accept_length": out_tokens / verify_steps if verify_steps else 0.0,
        "throughput_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "mean_oracle_think_tokens": sum(oracle) / len(oracle) if oracle else None,
        "mean_rechecks": sum(task.count_rechecks(r.output) for r in results) / n,
        "exited_early_rate": sum(r.exited_early for r in results) / n,
    }


def _prepare_environment() -> None:
    """CPU stand-ins (no CUDA) and the SpecExit draft class for every SGLang process."""
    import torch

    os.environ.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", MODEL_PACKAGE)
    if not torch.cuda.is_available():
        from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

        os.environ.update(cpu_testbed_env())
        install()


def build_parser():
    from sglang.srt.server_args import ServerArgs

    ap = argparse.ArgumentParser(description="Evaluate the testbed task through SGLang.")
    ap.add_argument("--problems", required=True, help="JSONL file of the task")
    ap.add_argument("--out", default=None, help="results JSON file")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--no-thinking", action="store_true", help="enable_thinking=False prompts")
    ServerArgs.add_cli_args(ap)
    for action in ap._actions:
        if action.dest == "model_path":
            action.required = False
            action.default = DEFAULT_TARGET
    return ap


def refuse_config(parser: argparse.ArgumentParser, hint: str) -> None:
    """Give ``parser`` a ``--config FILE`` that stops with one line (for the bench scripts, which set
    the server flags themselves and take no preset): ``<prog>: error: --config is not supported ...``."""

    class RefuseConfig(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"--config is not supported by this script: {hint}")

    parser.add_argument("--config", action=RefuseConfig, metavar="FILE", help=f"not supported (an error): {hint}")


def _split_config_equals(argv: Sequence[str]) -> List[str]:
    """``--config=FILE`` as ``--config FILE`` (the only spelling SGLang's reader looks for).

    Examples
    --------
    >>> _split_config_equals(["--problems", "p", "--config=c.yaml"])
    ['--problems', 'p', '--config', 'c.yaml']
    """
    out: List[str] = []
    for a in argv:
        out += ["--config", a.split("=", 1)[1]] if a.startswith("--config=") else [a]
    return out


def parse_args(argv: Sequence[str]):
    """Parse the command line with ``--config FILE`` merged in as SGLang's launcher does.

    The preset's keys become command-line items placed before the given ones, so a flag on the
    command line wins over the file (SGLang's ``ConfigArgumentMerger``, the reader behind
    ``python -m sglang.launch_server --config``); keys of the file count as given for the
    testbed defaults (``_apply_defaults``). Needs ``sglang_ext.load()`` first (the extension
    flags and their preset values).

    Returns
    -------
    (argparse.Namespace, list of str)
        The parsed arguments (defaults applied) and the merged argv.
    """
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    ap = build_parser()
    argv = _split_config_equals(argv)
    if "--config" in argv:
        try:
            argv = ConfigArgumentMerger(ap).merge_config_with_args(argv)
        except (ValueError, OSError) as e:
            ap.error(f"--config: {e}")
    args = ap.parse_args(argv)
    _apply_defaults(args, argv)
    return args, argv


def _apply_defaults(args, argv: Sequence[str]) -> None:
    import torch

    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if args.speculative_algorithm and "--speculative-draft-model-path" not in given \
            and "--speculative-draft-model" not in given:
        args.speculative_draft_model_path = DEFAULT_DRAFT
    if not torch.cuda.is_available():
        for key, value in CPU_DEFAULTS.items():
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, value)


async def _run_all(engine, tok, problems: List[dict], prompts: List[List[int]], max_new_tokens: int,
                   concurrency: int):
    sem = asyncio.Semaphore(concurrency)
    close_id = tok.convert_tokens_to_ids(task.THINK_CLOSE)

    async def one(p, ids):
        async with sem:
            t0 = time.perf_counter()
            o = await engine.async_generate(
                input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens})
            dt = time.perf_counter() - t0
        meta = o.get("meta_info", {})
        out_ids = o.get("output_ids") or tok.encode(o["text"], add_special_tokens=False)
        text = o["text"]
        pred = task.parse_answer(text)
        res = Result(
            id=p["id"], answer=p["answer"], output=text, predicted=pred, correct=pred == p["answer"],
            output_tokens=int(meta.get("completion_tokens", len(out_ids))),
            think_tokens=think_tokens(out_ids, close_id),
            exited_early=bool(meta.get(EXIT_META_KEY, False)),
            oracle_think_tokens=oracle_think_tokens(tok, text), latency_s=dt)
        return res, int(meta.get("spec_verify_ct", 0) or 0)

    return await asyncio.gather(*(one(p, ids) for p, ids in zip(problems, prompts)))


def main(argv: Optional[Sequence[str]] = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    _prepare_environment()
    import sglang

    import sglang_ext

    sglang_ext.load()
    from sglang.srt.server_args import ServerArgs
    from transformers import AutoTokenizer

    args, _ = parse_args(argv)
    problems = task.read_problems(args.problems)
    tok = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
    prompts = [tok.encode(task.prompt_text(p["question"], not args.no_thinking), add_special_tokens=False)
               for p in problems]
    server_args = ServerArgs.from_cli_args(args)
    engine = sglang.Engine(server_args=server_args)
    try:
        t0 = time.perf_counter()
        loop = asyncio.get_event_loop()
        pairs = loop.run_until_complete(
            _run_all(engine, tok, problems, prompts, args.max_new_tokens, args.concurrency))
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    results = [r for r, _ in pairs]
    summary = summarize(results, wall, sum(v for _, v in pairs))
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "results": [asdict(r) for r in results]}, f, indent=1)
    return summary


if __name__ == "__main__":
    main()

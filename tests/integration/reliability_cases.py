"""Bad inputs of the reliability suite, one table per entry point, each with the field its error must name.

``tests/integration/test_cli_flags.py`` (``INVALID``) already covers the common launcher-flag
mistakes; the launcher flags here are the ones it does not cover. Every table is used by a
test file named ``test_reliability_*.py``; ``test_reliability_inputs.py`` counts them all.

* :data:`BAD_FLAGS` -- ``python -m sglang.launch_server`` argv -> the flag the one-line error names;
* :data:`BAD_YAML` -- body of a ``--config`` preset (YAML) -> the flag the error names;
  :data:`BAD_YAML_KEYS` -- presets with a misspelt key -> that key;
* :data:`BAD_ENGINE_KWARGS` -- ``sglang.Engine(**kwargs)`` extension keywords (typed Python values)
  -> the flag the ``ConfigError`` names;
* :data:`BAD_CUSTOM_PARAMS` -- a request's ``custom_params`` -> the key the HTTP 400 names, sent
  through ``/generate`` and through the OpenAI chat API.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

BASE = ["--model-path", "unused-model"]
EAGLE3 = BASE + ["--speculative-algorithm", "EAGLE3"]
SE = EAGLE3 + ["--specexit"]
DC = EAGLE3 + ["--dcut", "auto"]

#: (argv, flag named by the error), none of them in test_cli_flags.INVALID.
BAD_FLAGS: List[Tuple[List[str], str]] = [
    (SE + ["--specexit-ewma-alpha", "fast"], "--specexit-ewma-alpha"),
    (SE + ["--specexit-window", "2.5"], "--specexit-window"),
    (SE + ["--specexit-window", "257"], "--specexit-window"),
    (SE + ["--specexit-confidence-threshold", "nan"], "--specexit-confidence-threshold"),
    (SE + ["--specexit-remain-threshold", "inf"], "--specexit-remain-threshold"),
    (SE + ["--specexit-remain-threshold", "-5"], "--specexit-remain-threshold"),
    (SE + ["--specexit-min-think-tokens", "1.5"], "--specexit-min-think-tokens"),
    (SE + ["--specexit-max-think-grace", "-1"], "--specexit-max-think-grace"),
    (SE + ["--specexit-min-think-tokens", "10", "--specexit-max-think-tokens", "5"], "--specexit-max-think-tokens"),
    (SE + ["--specexit-stop-think-token", ""], "--specexit-stop-think-token"),
    (SE + ["--specexit-step-split-tokens", '["\\n\\n", 3]'], "--specexit-step-split-tokens"),
    (SE + ["--specexit-step-split-tokens", '["\\n\\n", ""]'], "--specexit-step-split-tokens"),
    (SE + ["--specexit-step-split-tokens", '{"para": "\\n\\n"}'], "--specexit-step-split-tokens"),
    (SE + ["--specexit-method", "confidence,progress"], "--specexit-method"),
    (BASE + ["--speculative-algorithm", "DFLASH", "--specexit"], "--specexit"),
    (EAGLE3 + ["--dcut", "nan"], "--dcut"),
    (EAGLE3 + ["--dcut", "-0.5"], "--dcut"),
    (DC + ["--dcut-tiers", "0.5,1.5"], "--dcut-tiers"),
    (DC + ["--dcut-tiers", ""], "--dcut-tiers"),
    (DC + ["--dcut-profile-steps", "many"], "--dcut-profile-steps"),
    (DC + ["--dcut-profile-context-len", "-5"], "--dcut-profile-context-len"),
    (DC + ["--dcut-profile-batch-sizes", ""], "--dcut-profile-batch-sizes"),
    (DC + ["--dcut-profile-batch-sizes", "1.5,4"], "--dcut-profile-batch-sizes"),
    (DC + ["--dcut-profile-batch-sizes", "4,4"], "--dcut-profile-batch-sizes"),
    (DC + ["--dcut-cost-table", "."], "--dcut-cost-table"),  # a directory, not a file
]

_YAML_HEAD = "model-path: unused-model\nspeculative-algorithm: EAGLE3\n"

#: (YAML preset body, flag named by the error). ``specexit-window: 0`` is in test_presets.py.
BAD_YAML: List[Tuple[str, str]] = [
    (_YAML_HEAD + "dcut: 2.0\n", "--dcut"),
    (_YAML_HEAD + "dcut: true\n", "--dcut"),
    (_YAML_HEAD + "specexit: true\nspecexit-ewma-alpha: abc\n", "--specexit-ewma-alpha"),
    (_YAML_HEAD + "specexit: true\nspecexit-window: 2.5\n", "--specexit-window"),
    (_YAML_HEAD + "specexit: true\nspecexit-max-think-tokens: -5\n", "--specexit-max-think-tokens"),
    (_YAML_HEAD + "specexit: true\nspecexit-stop-think-token: ''\n", "--specexit-stop-think-token"),
    (_YAML_HEAD + "specexit: true\nspecexit-confidence-threshold: .nan\n", "--specexit-confidence-threshold"),
    (_YAML_HEAD + "specexit: true\nspecexit-remain-threshold: .inf\n", "--specexit-remain-threshold"),
    (_YAML_HEAD + "specexit: true\nspecexit-smoothing: null\n", "--specexit-smoothing"),
    (_YAML_HEAD + "specexit: true\nspecexit-method: {confidence: 1}\n", "--specexit-method"),
    (_YAML_HEAD + "specexit: true\nspecexit-min-think-tokens: 10\nspecexit-max-think-tokens: 5\n",
     "--specexit-max-think-tokens"),
    ("model-path: unused-model\nspeculative-algorithm: DFLASH\nspecexit: true\n", "--specexit"),
    ("model-path: unused-model\ndcut: auto\n", "--dcut"),
    (_YAML_HEAD + "dcut: auto\ndcut-profile-steps: 1.5\n", "--dcut-profile-steps"),
    (_YAML_HEAD + "dcut: auto\ndcut-cost-table: no/such/table.json\n", "--dcut-cost-table"),
    # YAML lists of the list-valued flags are joined, then validated like the command-line string
    (_YAML_HEAD + "dcut: auto\ndcut-tiers: [0.5, 1.5]\n", "--dcut-tiers"),
    (_YAML_HEAD + "dcut: auto\ndcut-tiers: []\n", "--dcut-tiers"),
    (_YAML_HEAD + "dcut: auto\ndcut-profile-batch-sizes: [4, 2]\n", "--dcut-profile-batch-sizes"),
    (_YAML_HEAD + "specexit: true\nspecexit-method: [confidence, speed]\n", "--specexit-method"),
    (_YAML_HEAD + "specexit: true\nspecexit-step-split-tokens: [\"\\n\\n\", 3]\n", "--specexit-step-split-tokens"),
    # a list for a single-valued flag, a non-boolean for the switch
    (_YAML_HEAD + "dcut: [auto]\n", "--dcut"),
    (_YAML_HEAD + "specexit: yes-please\n", "--specexit"),
    (_YAML_HEAD + "specexit:\n", "--specexit"),
    (_YAML_HEAD + "specexit: 0.5\n", "--specexit"),
]

#: (YAML preset body, misspelt key): argparse prints its usage, then one error line naming the key.
BAD_YAML_KEYS: List[Tuple[str, str]] = [
    (_YAML_HEAD + "specexit: true\nspecexit-windw: 4\n", "--specexit-windw"),
    (_YAML_HEAD + "dcut: auto\ndcut-teirs: 0.5,1.0\n", "--dcut-teirs"),
]

#: (extension keyword arguments of sglang.Engine, flag named by the ConfigError).
BAD_ENGINE_KWARGS: List[Tuple[Dict[str, Any], str]] = [
    (dict(specexit=True, specexit_window=True), "--specexit-window"),
    (dict(specexit=True, specexit_ewma_alpha="fast"), "--specexit-ewma-alpha"),
    (dict(specexit=True, specexit_confidence_threshold=False), "--specexit-confidence-threshold"),
    (dict(specexit=True, specexit_max_think_tokens=2.5), "--specexit-max-think-tokens"),
    (dict(specexit=True, specexit_step_split_tokens=["\n\n", 3]), "--specexit-step-split-tokens"),
    (dict(specexit=True, specexit_signal_source="logits"), "--specexit-signal-source"),
    (dict(dcut=True), "--dcut"),
    (dict(dcut="auto", dcut_tiers=[0.5, 0.25, 1.0]), "--dcut-tiers"),
    (dict(dcut="auto", dcut_profile_batch_sizes=(0, 4)), "--dcut-profile-batch-sizes"),
    (dict(dcut="auto", dcut_profile_warmup=-2), "--dcut-profile-warmup"),
]

#: (custom_params of one request, text the HTTP 400 must contain). The server runs the
#: ``confidence`` method (``--specexit-signal-source draft-confidence``), so ``remain`` is unserved.
BAD_CUSTOM_PARAMS: List[Tuple[Dict[str, Any], str]] = [
    ({"specexit_enable": "yes"}, "specexit_enable"),
    ({"specexit_enable": 1}, "specexit_enable"),
    ({"specexit_method": "confidence_foo"}, "specexit_method"),
    ({"specexit_method": "remain"}, "method"),  # a signal this server does not compute
    ({"specexit_method": 3}, "specexit_method"),
    ({"specexit_smoothing": "kalman"}, "specexit_smoothing"),
    ({"specexit_ewma_alpha": 0}, "specexit_ewma_alpha"),
    ({"specexit_ewma_alpha": 1.5}, "specexit_ewma_alpha"),
    ({"specexit_ewma_alpha": "0.5"}, "specexit_ewma_alpha"),
    ({"specexit_window": 0}, "specexit_window"),
    ({"specexit_window": 257}, "specexit_window"),
    ({"specexit_window": 2.5}, "specexit_window"),
    ({"specexit_window": None}, "specexit_window"),
    ({"specexit_confidence_threshold": 1.01}, "specexit_confidence_threshold"),
    ({"specexit_progress_threshold": -0.5}, "specexit_progress_threshold"),
    ({"specexit_remain_threshold": 0}, "specexit_remain_threshold"),
    ({"specexit_remain_threshold": True}, "specexit_remain_threshold"),
    ({"specexit_min_think_tokens": -1}, "specexit_min_think_tokens"),
    ({"specexit_max_think_tokens": 0}, "specexit_max_think_tokens"),
    ({"specexit_max_think_tokens": "many"}, "specexit_max_think_tokens"),
    ({"specexit_max_think_grace": -3}, "specexit_max_think_grace"),
    ({"specexit_min_think_tokens": 50, "specexit_max_think_tokens": 10}, "max_think_tokens"),
    ({"specexit_temperature": 0.5}, "specexit_temperature"),  # unknown SpecExit key
]


def total_bad_inputs() -> int:
    """Bad inputs in this module's tables."""
    return len(BAD_FLAGS) + len(BAD_YAML) + len(BAD_YAML_KEYS) + len(BAD_ENGINE_KWARGS) + len(BAD_CUSTOM_PARAMS)

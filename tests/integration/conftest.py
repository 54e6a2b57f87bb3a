"""Fixtures for engine integration tests: the tiny models, built once per test session."""

import pytest

TINY_FIT_STEPS = 400


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny random Llama target + EAGLE3 draft fitted to the target's greedy outputs (~30 s)."""
    from sglang_ext.testbed.tiny import build_tiny_models

    return build_tiny_models(str(tmp_path_factory.mktemp("tiny_models")), seed=0, fit_steps=TINY_FIT_STEPS)


@pytest.fixture(scope="session")
def tiny_prompts(tiny_models):
    """Prompts from the distribution the tiny draft was fitted on (so drafts are accepted)."""
    import json
    import os

    from sglang_ext.testbed.tiny import corpus_prompts

    with open(os.path.join(tiny_models.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return corpus_prompts(vocab, 8, 4, seed=0).tolist()

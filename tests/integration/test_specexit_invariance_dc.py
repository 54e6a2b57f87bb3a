"""SpecExit's training-free signal per token: the same request gives the same output whatever D-Cut, the load or TP do.

``--specexit-signal-source draft-confidence``: every committed token is observed with the draft's one-step
confidence at its position, read from the draft extends (lagged by a step; a step is cut short before a
boundary it cannot decide yet). The runs of ``test_specexit_invariance.py`` (same trained testbed models,
40 held-out problems, EAGLE3 chain 3 steps / 4 tokens, ``--dcut auto`` with the hand-written table), with
the confidence threshold at 0.98 (the trained draft is so confident that 0.8 exits at the first
boundary): every run must give the reference's output ids, every value a decision read must have been
there (``missing_signals`` 0) and steps must have been cut short (``truncated_steps`` > 0). With one value
per accepted draft (earlier versions) tier 0.25 and ``auto`` agreed on 0 of 40 problems.

Slow tier: a TP 2 engine gives the same outputs as the TP 1 engine (``auto`` and tier 0.5). A module of
its own, so that the head-signal module's engine is gone before this one's engines start (memory).

Budget: CI tier ~1 min on the shared 2-core host (one engine start, seven 40-problem runs); slow tier
~1.5 min more (one TP 2 engine start, three 40-problem runs).
"""

from __future__ import annotations

import os

import pytest

from engine_utils import make_engine
from test_specexit_invariance import N, _compare_with_reference, compare_tp2_with_tp1
from trained_models import MODELS, hand_written_table, requires_trained_models
from trained_models import held_out_prompts as _prompts

pytestmark = requires_trained_models


@pytest.fixture(scope="module")
def prompts():
    return _prompts(N)


DRAFT_CONFIDENCE = {"specexit_confidence_threshold": 0.98}  # the trained draft is confident: 0.8 exits at once


def _draft_confidence_engine(tmp, **extra):
    table = hand_written_table(str(tmp / "table.json"), 4, 1, 3, off_ms=[50, 1, 2])
    return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                       speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                       speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                       max_total_tokens=32768, max_running_requests=64, specexit=True, dcut="auto",
                       specexit_signal_source="draft-confidence", specexit_method="confidence",
                       dcut_cost_table=table, dcut_cache_dir=str(tmp / "cache"), **extra)


@pytest.fixture(scope="module")
def dc_engine(tmp_path_factory):
    eng = _draft_confidence_engine(tmp_path_factory.mktemp("specexit_invariance_dc"))
    try:
        yield eng
    finally:
        eng.shutdown()


def _specexit_info(eng):
    return eng.get_server_info()["internal_states"][0]["specexit"]


def test_draft_confidence_source_gives_the_same_output_under_every_setting(dc_engine, prompts):
    # The draft's one-step confidence of every committed token, read from the draft extends (lagged by
    # a step, steps cut short before a boundary they cannot decide yet): the runs of test_specexit_invariance.py.
    # Before it (one value per accepted draft, from whichever draft depth proposed it) the exit moved
    # with the tier and the load.
    ref_ids, failures = _compare_with_reference(dc_engine, prompts, DRAFT_CONFIDENCE, "draft-confidence, ")
    lengths = sorted(len(i) for i in ref_ids)
    assert lengths[N // 4] < lengths[3 * N // 4], lengths  # exits at different points, not all at the first
    info = _specexit_info(dc_engine)
    assert info["missing_signals"] == 0, info  # every value a decision read was there
    assert info["truncated_steps"] > 0, info  # the cut-short path ran
    assert not failures, failures


@pytest.mark.slow
def test_tp2_draft_confidence_gives_the_same_outputs_as_tp1(dc_engine, prompts, tmp_path):
    # The draft-confidence values are computed on every rank from the draft's gathered logits; the
    # lagged decisions and the steps cut short must agree between the ranks and with TP 1.
    info = compare_tp2_with_tp1(dc_engine, prompts, DRAFT_CONFIDENCE,
                                lambda: _draft_confidence_engine(tmp_path, tp_size=2), "draft-confidence ")
    assert info["missing_signals"] == 0 and info["truncated_steps"] > 0, info

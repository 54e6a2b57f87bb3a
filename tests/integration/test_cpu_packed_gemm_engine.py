"""The row-blocked packed GEMM (``SGLANG_EXT_CPU_PACKED_GEMM``) in real SGLang on the CPU testbed.

Trained testbed target + EAGLE3 draft, held-out problems, greedy, 64 new tokens, 8 requests at once.
Two engines with ``SGLANG_EXT_CPU_PACKED_GEMM=4`` and ``..._MIN_ROWS=1``, ``..._MAX_ROWS=16``
(blocks of 4 rows for 1 to 16 rows: the batch-invariant setting): no speculation, and the EAGLE3
chain (3 steps, 4 draft tokens) with ``--dcut`` switched between full verification and tier 0.5 --
a verify of up to 4 x 8 = 32 rows, so blocked calls (<= 16 rows) and ``F.linear`` fallbacks
(prefill, the 32-row verify) both occur. Checks: every output equals the packed
no-speculation output token for token; ``/server_info`` shows the layers packed and the blocked
calls; the packed outputs equal the unpacked engine's (the testbed's shapes round alike).

Budget: CI tier ~1.5 min (three engine starts, five 8-request runs).
"""

from __future__ import annotations

import os

import pytest

from engine_utils import make_engine
from trained_models import MODELS, requires_trained_models
from trained_models import held_out_prompts as _prompts

from sglang_ext.engine.cpu.packed_gemm import ENV_MAX_ROWS, ENV_MIN_ROWS, ENV_ROWS, mkl_packed_available
from sglang_ext.engine.cpu.packed_gemm_hooks import SERVER_INFO_KEY
from sglang_ext.envutil import environ

pytestmark = [requires_trained_models,
              pytest.mark.skipif(not mkl_packed_available(), reason="torch without MKL packed GEMM")]

MAX_NEW = 64
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}


PACKED_ENV = {ENV_ROWS: "4", ENV_MIN_ROWS: "1", ENV_MAX_ROWS: "16"}


def _engine(packed: bool, **kw):
    # read by the plugin in each SGLang process at start-up
    with environ({k: (v if packed else None) for k, v in PACKED_ENV.items()}):
        return make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa", max_total_tokens=16384,
                           max_running_requests=16, **kw)


def _packed_info(eng):
    states = eng.get_server_info()["internal_states"]
    return states[0].get(SERVER_INFO_KEY)


def _ids(eng, prompts):
    return [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=GREEDY)]


def test_packed_gemm_is_lossless_under_speculation_and_tiers(tmp_path):
    from sglang_ext.engine.dcut.client import set_force_ratio

    prompts = _prompts(8)
    eng = _engine(False)
    try:
        assert _packed_info(eng) is None  # off unless asked for
        plain = _ids(eng, prompts)
    finally:
        eng.shutdown()
    eng = _engine(True)
    try:
        ref = _ids(eng, prompts)
        info = _packed_info(eng)
        assert info["rows"] == 4 and info["min_rows"] == 1 and info["max_rows"] == 16
        assert info["packed_layers"] > 0 and info["blocked_calls"] > 0 and info["fallback_calls"] > 0, info
    finally:
        eng.shutdown()
    assert ref == plain
    eng = _engine(True, speculative_algorithm="EAGLE3", speculative_draft_model_path=os.path.join(MODELS, "draft"),
                  speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4, dcut="auto",
                  dcut_cache_dir=str(tmp_path / "cache"), dcut_profile_steps=1, dcut_profile_warmup=1,
                  dcut_profile_batch_sizes="1,8")
    try:
        before = _packed_info(eng)["blocked_calls"]
        for ratio in (1.0, 0.5, 0.0):  # full verification, tier 0.5, back to auto
            assert set_force_ratio(eng, ratio)
            assert _ids(eng, prompts) == ref, f"dcut_force_ratio {ratio}"
        assert _packed_info(eng)["blocked_calls"] > before
    finally:
        eng.shutdown()

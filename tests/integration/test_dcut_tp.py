"""D-Cut decisions are identical on every TP rank: real 2-process ``torch.distributed`` (gloo, CPU).

Each rank computes its own plan from slightly different confidences (as TP ranks may), then
``agree_across_ranks`` makes both use rank 0's keep mask and tier; the launch profile's
``max_over_ranks`` gives both ranks the element-wise max of their cost rows. A single-rank
group is a no-op.

Launched servers (trained testbed models, EAGLE3 + SpecExit + ``--dcut auto``): TP 2 on the CPU
testbed (``SGLANG_CPU_OMP_THREADS_BIND="0|1"``) answers as TP 1, token for token with SpecExit on (its
exit is decided per committed token), a forced tier 0.5 as ``--dcut auto``, and both ranks verify with
the same tier at every step (traced by ``tier_trace_launch.py``); DP 2 likewise. Both server
tests are in the slow tier; the CI tier checks the rank agreement over real gloo processes.

Budget: < 30 s for the gloo tests (CI); the TP 2 server test ~2 min idle, up to 4 min on the loaded
2-core host (two server start-ups); the DP 2 test likewise.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _Group:
    """The slice of SGLang's ``GroupCoordinator`` the D-Cut glue uses, over the default group."""

    def __init__(self):
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()
        self.cpu_group = dist.group.WORLD

    def broadcast(self, t, src=0):
        dist.broadcast(t, src=src)
        return t


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from sglang_ext.dcut import chain_keep_mask, choose
        from sglang_ext.engine.dcut.runner import agree_across_ranks
        from sglang_ext.engine.dcut.profiler import max_over_ranks

        # rank 1's confidences differ a little: on its own it would keep other slots
        scores = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])
        if rank == 1:
            scores = torch.tensor([[0.5, 0.1, 0.1], [0.95, 0.9, 0.1]])
        plan = choose(scores, None, mode=0.5)
        keep = chain_keep_mask(plan.keep_lens, 4)
        tier = plan.tier_index + rank  # make the ranks disagree on the tier too
        agreed, agreed_tier = agree_across_ranks(keep, tier, _Group())
        costs = max_over_ranks([[1.0 + rank, 5.0 - rank], [3.0, 3.0 + 2 * rank]], _Group())
        torch.save({"own": keep, "agreed": agreed, "tier": agreed_tier, "costs": costs},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_agree_on_rank0_plan(tmp_path):
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    # rank 0 keeps the globally best 2 drafts: request 0's first two; rank 1 would keep request 1's
    assert r0["own"].int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert r1["own"].int().tolist() == [[1, 0, 0, 0], [1, 1, 1, 0]]
    for r in (r0, r1):
        assert torch.equal(r["agreed"], r0["own"]) and r["agreed"].dtype == torch.bool
        assert r["tier"] == 1  # rank 0's tier (0.5)
        assert r["costs"] == [[2.0, 5.0], [3.0, 5.0]]


def test_single_rank_is_a_no_op():
    from sglang_ext.engine.dcut.runner import agree_across_ranks
    from sglang_ext.engine.dcut.profiler import max_over_ranks

    keep = torch.tensor([[True, False]])
    out, tier = agree_across_ranks(keep, 2, None)
    assert out is keep and tier == 2
    assert max_over_ranks([[1.0]], None) == [[1.0]]


# ----------------------------------------------------------------------------- launched servers
# TP 2 / DP 2 on the CPU testbed (trained testbed models, configs/cpu_demo.yaml: EAGLE3 + SpecExit +
# --dcut auto), compared with TP 1. Each server runs through tier_trace_launch.py, which records the
# D-Cut tier of every verify step of each scheduler process (one file per process).
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402

TRACE_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tier_trace_launch.py")
QUESTIONS = [f"Compute: {a} + {b} - {c}" for a, b, c in
             ((7, 4, 2), (5, 6, 1), (9, 3, 3), (8, 8, 4), (2, 9, 5), (6, 1, 0), (3, 3, 3), (4, 7, 2))]
#: a short launch profile (3 batch sizes x 4 tiers, 1 warm-up + 2 timed steps each)
SERVER_FLAGS = ["--max-running-requests", "8", "--dcut-profile-batch-sizes", "1,4,8", "--dcut-profile-steps", "2",
                "--dcut-profile-warmup", "1", "--skip-server-warmup"]


def _chat(base, question):
    import requests

    r = requests.post(base + "/v1/chat/completions", timeout=300,
                      json={"model": "default", "messages": [{"role": "user", "content": question}],
                            "max_tokens": 200, "temperature": 0.0})
    r.raise_for_status()
    msg = r.json()["choices"][0]["message"]
    return [msg.get("reasoning_content"), msg["content"]]


def _serve(tmp_path, name, flags, env):
    """Answers of QUESTIONS under --dcut auto and under a forced tier 0.5, /server_info, tier traces."""
    from sglang_ext import demo
    from sglang_ext.engine.dcut.client import server_info, set_force_ratio

    models = demo.pick_models()
    if not models.trained:
        pytest.skip("needs the committed trained testbed models (SpecExit rows in the draft)")
    trace = tmp_path / f"trace-{name}"
    trace.mkdir()
    log = tmp_path / f"server-{name}.log"
    extra = SERVER_FLAGS + flags + ["--dcut-cache-dir", str(tmp_path / f"cache-{name}")]
    try:
        with demo.running_server(models, extra, log_path=str(log), timeout_s=420, launcher=[sys.executable, TRACE_LAUNCHER],
                                 env={"DCUT_TIER_TRACE_DIR": str(trace), **env}) as (base, _):
            with ThreadPoolExecutor(len(QUESTIONS)) as pool:
                answers = list(pool.map(lambda q: _chat(base, q), QUESTIONS))
                assert set_force_ratio(base, 0.5)  # a pruned tier for sure, whatever auto picks
                answers += list(pool.map(lambda q: _chat(base, q), QUESTIONS))
                assert set_force_ratio(base, 0.0)
            info = server_info(base)
    except Exception:
        print(log.read_text()[-5000:] if log.exists() else "(no server log)")
        raise
    traces = {p.name: p.read_text().splitlines() for p in sorted(trace.iterdir()) if p.read_text()}
    return answers, info, traces


def _assert_same_answers(out, ref):
    """Reasoning and answers equal, SpecExit on: its exit is decided per committed token, so neither the
    verify width (``--dcut auto`` and a forced tier 0.5 run the same questions) nor the TP / DP layout may
    move it. (With the per-step exit rule of earlier versions TP 2 agreed with TP 1 only up to the exit
    paragraph.)"""
    assert len(out) == len(ref)
    for i, (got, want) in enumerate(zip(out, ref)):
        assert got == want, (i, got, want)


@pytest.mark.slow
def test_tp2_matches_tp1_with_the_same_tier_on_both_ranks(tmp_path):
    """Budget: ~2 min idle, up to 4 min on the loaded 2-core host (two server start-ups, 16 requests each)."""
    t0 = time.time()
    ref, info1, _ = _serve(tmp_path, "tp1", ["--tp-size", "1"], {})
    out, info2, traces = _serve(tmp_path, "tp2", ["--tp-size", "2"], {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})
    print(f"tp1 + tp2: {time.time() - t0:.0f} s")
    _assert_same_answers(out, ref)
    _assert_same_answers(ref[len(QUESTIONS):], ref[:len(QUESTIONS)])  # tier 0.5 forced == --dcut auto
    assert "The answer is 9." in ref[0][1]
    for info in (info1, info2):
        state = info["internal_states"][0]
        assert state["specexit"]["exits_total"] > 0
        assert state["dcut"]["metrics"]["tier_histogram"].get("0.5", 0) > 0  # pruned verify steps
    # TP 2: one scheduler per rank, the same tier (and batch size) at every verify step, profiling included
    assert len(traces) == 2, list(traces)
    rank_a, rank_b = traces.values()
    assert len(rank_a) > len(QUESTIONS) and rank_a == rank_b
    assert any(line.split()[1] == "0.5" for line in rank_a)


@pytest.mark.slow
def test_dp2_matches_tp1(tmp_path):
    """DP 2 (two schedulers, requests split round-robin): the same answers as TP 1, and both DP ranks run
    D-Cut and SpecExit. Each rank batches half the requests (matmul shapes differ from TP 1). Budget:
    ~2-4 min (two server start-ups)."""
    ref, _, _ = _serve(tmp_path, "tp1", ["--tp-size", "1"], {})
    out, info, traces = _serve(tmp_path, "dp2", ["--dp-size", "2"], {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})
    _assert_same_answers(out, ref)
    states = info["internal_states"]
    assert len(states) == 2
    for state in states:
        assert state["dcut"]["metrics"]["steps"] > 0 and "specexit" in state
    assert sum(s["specexit"]["exits_total"] for s in states) > 0
    assert len(traces) == 2

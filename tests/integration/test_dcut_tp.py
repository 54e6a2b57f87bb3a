"""D-Cut decisions are identical on every TP rank: real 2-process ``torch.distributed`` (gloo, CPU).

Each rank computes its own plan from slightly different confidences (as TP ranks may), then
``agree_across_ranks`` makes both use rank 0's keep mask and tier; the launch profile's
``max_over_ranks`` gives both ranks the element-wise max of their cost rows. A single-rank
group is a no-op.

Budget: < 30 s (two spawned CPU processes).
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

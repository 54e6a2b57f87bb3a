"""The torch SDPA backend's plan for each forward mode, and the multi-step draft round (pure torch).

:func:`plan_extend`, :func:`plan_target_verify` (tree or ragged D-Cut verify), :func:`plan_decode`
and :func:`plan_draft_decode` turn a forward's lengths and slots into an
:class:`~sglang_ext.engine.attention.torch_sdpa_plan.AttentionPlan` (or a bucketed one); the draft
round (:class:`DraftRoundPlan`, :func:`run_draft_round_step`) attends every draft step of a round
against one shared prefix buffer. Plans, masks, buckets and :func:`run_plan`:
:mod:`sglang_ext.engine.attention.torch_sdpa_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sglang_ext.engine.attention.torch_sdpa_plan import (
    NO_MASK,
    AttentionPlan,
    MaskKind,
    _attend,
    bucket_plan,
    gather_row_slots,
    make_plan,
    padded_kv_source,
    split_tree_mask,
)

__all__ = ["plan_extend", "plan_target_verify", "plan_decode", "plan_draft_decode", "NO_DRAFT_ROUND",
           "DraftRoundPlan", "plan_draft_round", "DraftRoundKV", "run_draft_round_step"]


# ----------------------------------------------------------------------------- per-mode builders
def plan_extend(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    prefix_lens: Sequence[int],  # host, cached tokens per request
    extend_lens: Sequence[int],  # host, new tokens per request (rows of q, packed)
    *,
    causal: bool = True,
) -> AttentionPlan:
    """EXTEND / DRAFT_EXTEND_V2: request ``i`` attends its cached prefix
    ``req_to_token[rp[i], 0:p_i]`` and its own rows, bottom-right causal.

    Examples
    --------
    >>> r2t = torch.arange(20, dtype=torch.int32).view(2, 10)
    >>> plan = plan_extend(r2t, torch.tensor([1, 0]), [2, 0], [1, 2])
    >>> plan.prefix_slots.tolist(), plan.qo_indptr
    ([10, 11], (0, 1, 3))
    """
    rows = req_pool_indices.to(torch.int64)
    slots = gather_row_slots(req_to_token, rows, [0] * len(prefix_lens), prefix_lens)
    kind = MaskKind.CAUSAL if causal else MaskKind.VISIBLE
    return bucket_plan(extend_lens, prefix_lens, slots, kind)


def plan_target_verify(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    seq_lens: Sequence[int],  # host, committed lengths (drafts excluded)
    q_lens: Sequence[int],  # host, verify rows per request (uniform N or ragged)
    custom_mask: Optional[torch.Tensor],  # [num_cells] FULL or QLEN_ONLY layout; None = chains
) -> AttentionPlan:
    """TARGET_VERIFY: request ``i`` attends its committed prefix ``req_to_token[rp[i], 0:s_i]``
    and, among its ``q_i`` draft rows, the ancestors-or-self given by ``custom_mask``.
    Without a mask every request is treated as a chain (causal). One row per request whose mask
    cells are all set (SGLang's one-node verify of a draft-off step) is planned as a decode step:
    the same attention without the tree blocks and query-length buckets.

    Examples
    --------
    One request, 1 cached token, root with two children (FULL layout, rows of width 4):

    >>> r2t = torch.arange(10, dtype=torch.int32).view(1, 10)
    >>> m = torch.tensor([1, 1, 0, 0,  1, 1, 1, 0,  1, 1, 0, 1], dtype=torch.bool)
    >>> plan = plan_target_verify(r2t, torch.tensor([0]), [1], [3], m)
    >>> plan.attend[0].int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    """
    rows = req_pool_indices.to(torch.int64)
    slots = gather_row_slots(req_to_token, rows, [0] * len(seq_lens), seq_lens)
    if all(int(q) == 1 for q in q_lens) and (custom_mask is None or bool(custom_mask.all())):
        # one node per request (a draft-off step): each row sees its prefix and itself -- the
        # decode plan, one call without the tree blocks
        return make_plan([1] * len(seq_lens), seq_lens, slots, MaskKind.VISIBLE)
    if custom_mask is None:
        return bucket_plan(q_lens, seq_lens, slots, MaskKind.CAUSAL)
    blocks = split_tree_mask(custom_mask, seq_lens, q_lens)
    return bucket_plan(q_lens, seq_lens, slots, MaskKind.TREE, tree_blocks=blocks)


def plan_decode(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    seq_lens: Sequence[int],  # host, lengths including the token being decoded
) -> AttentionPlan:
    """DECODE: row ``i`` attends ``req_to_token[rp[i], 0:seq_lens[i] - 1]`` and itself.

    Examples
    --------
    >>> r2t = torch.arange(20, dtype=torch.int32).view(2, 10)
    >>> plan_decode(r2t, torch.tensor([1, 0]), [3, 1]).prefix_slots.tolist()
    [10, 11]
    """
    prefix = [int(s) - 1 for s in seq_lens]
    rows = req_pool_indices.to(torch.int64)
    slots = gather_row_slots(req_to_token, rows, [0] * len(prefix), prefix)
    return make_plan([1] * len(prefix), prefix, slots, MaskKind.VISIBLE)


def plan_draft_decode(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    seq_lens: Sequence[int],  # host, committed lengths s_b (not advanced per step)
    topk: int,
    num_steps: int,
    step: int,
) -> AttentionPlan:
    """Multi-step EAGLE draft decode, step ``step`` (0-based, ``step <= num_steps - 2``).

    Query row ``r = b * topk + t`` attends the committed prefix ``req_to_token[rp[b], 0:s_b]``,
    the slots of its branch's earlier steps ``req_to_token[rp[b], s_b + t * num_steps + j]``,
    ``j < step``, and itself (written at ``s_b + t * num_steps + step``). This is SGLang's
    upstream draft KV layout (page size 1), so outputs match the Triton/FlashInfer drafts.

    Examples
    --------
    One request with s = 2, topk = 2, 3 steps; at step 1 branch 1 reads slots 0, 1 and 5
    (its step-0 slot ``2 + 1 * 3 + 0``) before its own row:

    >>> r2t = torch.arange(12, dtype=torch.int32).view(1, 12)
    >>> plan = plan_draft_decode(r2t, torch.tensor([0]), [2], topk=2, num_steps=3, step=1)
    >>> plan.prefix_lens, plan.prefix_slots.tolist()
    ((3, 3), [0, 1, 2, 0, 1, 5])
    """
    if not 0 <= step <= num_steps - 2:
        raise ValueError(f"draft step {step} out of range for num_steps={num_steps}")
    device = req_to_token.device
    bs = len(seq_lens)
    s = torch.tensor([int(x) for x in seq_lens], dtype=torch.int64, device=device)
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    g_req = torch.arange(bs, device=device).repeat_interleave(topk)  # [bs * topk]
    g_branch = torch.arange(topk, device=device).repeat(bs)  # [bs * topk]
    prefix_lens = (s[g_req] + step).tolist()
    lens_t = s[g_req] + step
    total = int(lens_t.sum())
    group = torch.repeat_interleave(torch.arange(bs * topk, device=device), lens_t)
    within = torch.arange(total, device=device) - (torch.cumsum(lens_t, 0) - lens_t)[group]
    s_g = s[g_req][group]
    # columns < s_b: committed prefix; then this branch's earlier draft slots
    cols = torch.where(within < s_g, within, s_g + g_branch[group] * num_steps + (within - s_g))
    slots = req_to_token[rows[g_req][group], cols].to(torch.int64)
    return make_plan([1] * (bs * topk), prefix_lens, slots, MaskKind.VISIBLE)


# ----------------------------------------------------------------------------- draft rounds
@dataclass(frozen=True)
class DraftRoundPlan:
    """Keys of one multi-step draft round, gathered once and extended by one column per step.

    Every draft step of a round attends the same committed prefix plus its branch's rows of the
    earlier steps (see :func:`plan_draft_decode`). Instead of gathering all of them from the pool
    at every step, the round keeps one padded buffer per layer, ``[num_groups, max_cols]`` key
    rows: column ``c < s_g`` is the committed slot, column ``s_g + j`` is step ``j``'s row of the
    group (written when step ``j`` runs), later columns are padding. The buffers are stored
    head-major, ``[num_kv_heads, num_groups * max_cols, head_dim]`` (:class:`DraftRoundKV`).

    Attributes
    ----------
    topk, num_steps : int
        The draft's branching and steps; groups are ``(request, branch)``, row-major.
    prefix_lens : tuple[int, ...]
        Committed length ``s_g`` of each group (host).
    max_cols : int
        ``max(s_g) + num_steps - 1`` key columns per group in the buffer.
    kv_src : torch.Tensor
        ``[num_groups * max_cols]`` int64 slot per buffer row; columns ``>= s_g`` read the
        group's first committed slot (finite keys of the same request, never attended).
    step_slots : torch.Tensor
        ``[num_groups, num_steps - 1]`` int64 pool slot of each step's row (SGLang's layout
        ``req_to_token[rp[b], s_b + t * num_steps + j]``).
    step_dst : torch.Tensor
        ``[num_groups]`` int64 buffer row of column ``s_g`` (``g * max_cols + s_g``).
    col_limit : torch.Tensor
        ``[num_groups, 1]`` int64 ``s_g + 1``: step ``j`` attends columns ``< s_g + 1 + j``.
    """

    topk: int
    num_steps: int
    prefix_lens: tuple
    max_cols: int
    kv_src: torch.Tensor
    step_slots: torch.Tensor
    step_dst: torch.Tensor
    col_limit: torch.Tensor

    @property
    def num_groups(self) -> int:
        return len(self.prefix_lens)

    @property
    def uniform(self) -> bool:
        """Every group has the same committed length (no key padding: no mask)."""
        return len(set(self.prefix_lens)) <= 1


NO_DRAFT_ROUND = None  # sentinel: the round cannot use a shared buffer (a request with s_b = 0)


def plan_draft_round(
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32 slot ids
    req_pool_indices: torch.Tensor,  # [batch_size]
    seq_lens: Sequence[int],  # host, committed lengths s_b
    topk: int,
    num_steps: int,
) -> Optional[DraftRoundPlan]:
    """The :class:`DraftRoundPlan` of a multi-step draft round, or ``NO_DRAFT_ROUND``.

    Examples
    --------
    One request with ``s = 2``, topk 1, 3 steps (2 draft-decode steps), pool row ``[0..9]``:

    >>> r2t = torch.arange(10, dtype=torch.int32).view(1, 10)
    >>> rnd = plan_draft_round(r2t, torch.tensor([0]), [2], topk=1, num_steps=3)
    >>> rnd.max_cols, rnd.kv_src.tolist(), rnd.step_slots.tolist(), rnd.step_dst.tolist()
    (4, [0, 1, 0, 0], [[2, 3]], [2])
    """
    if num_steps < 2:
        raise ValueError(f"a draft round needs num_steps >= 2, got {num_steps}")
    s_list = [int(x) for x in seq_lens]
    if not s_list or min(s_list) == 0:
        return NO_DRAFT_ROUND
    device = req_to_token.device
    bs = len(s_list)
    s = torch.tensor(s_list, dtype=torch.int64, device=device)  # [bs]
    rows = req_pool_indices.to(device=device, dtype=torch.int64)  # [bs]
    g_req = torch.arange(bs, device=device).repeat_interleave(topk)  # [G]
    g_branch = torch.arange(topk, device=device).repeat(bs)  # [G]
    s_g = s[g_req]  # [G]
    num_groups = bs * topk
    max_cols = max(s_list) + num_steps - 1
    prefix_lens = [int(x) for x in s_g.tolist()]
    committed = gather_row_slots(req_to_token, rows[g_req], [0] * num_groups, prefix_lens)  # [sum(s_g)]
    kv_src = padded_kv_source(prefix_lens, committed, max_cols)  # pads: the group's first slot
    j = torch.arange(num_steps - 1, device=device).view(1, -1)  # [1, num_steps - 1]
    step_cols = s_g.view(-1, 1) + g_branch.view(-1, 1) * num_steps + j  # [G, num_steps - 1]
    step_slots = req_to_token[rows[g_req].view(-1, 1), step_cols].to(torch.int64)
    step_dst = torch.arange(num_groups, device=device) * max_cols + s_g  # [G]
    return DraftRoundPlan(
        topk=int(topk),
        num_steps=int(num_steps),
        prefix_lens=tuple(prefix_lens),
        max_cols=max_cols,
        kv_src=kv_src,
        step_slots=step_slots,
        step_dst=step_dst,
        col_limit=(s_g + 1).view(-1, 1),
    )


@dataclass
class DraftRoundKV:
    """One layer's key/value buffers of a draft round and the next step they expect."""

    k: Optional[torch.Tensor] = None  # [hkv, num_groups * max_cols, d], head-major (see run_draft_round_step)
    v: Optional[torch.Tensor] = None  # [hkv, num_groups * max_cols, dv]
    next_step: int = -1


def run_draft_round_step(
    rnd: DraftRoundPlan,
    step: int,
    q: torch.Tensor,  # [num_groups, num_q_heads, qk_head_dim]
    k: torch.Tensor,  # [num_groups, num_kv_heads, qk_head_dim]
    v: torch.Tensor,  # [num_groups, num_kv_heads, v_head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, qk_head_dim], dtype of q
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, v_head_dim], dtype of q
    state: DraftRoundKV,
    *,
    scaling: float,
    logit_cap: float = 0.0,
) -> torch.Tensor:  # [num_groups, num_q_heads, v_head_dim]
    """Draft step ``step`` of a round: the same output as :func:`run_plan` on that step's
    :func:`plan_draft_decode` plan, without re-gathering the round's keys.

    The buffers are (re)filled from the pool when ``state`` does not expect this step (first step
    of the round, or a step skipped); otherwise only the step's own rows are written. The caller
    guarantees that the pool holds exactly ``k``/``v`` at the slots of earlier steps (the forward
    wrote them there, unquantized), which is what makes the shared buffer equal to a fresh
    gather.

    Examples
    --------
    One group with 2 committed keys, step 0 and then step 1 (their rows are written to the pool
    by the caller first, as the backend does):

    >>> r2t = torch.arange(10, dtype=torch.int32).view(1, 10)
    >>> rnd = plan_draft_round(r2t, torch.tensor([0]), [2], topk=1, num_steps=3)
    >>> kc, vc = torch.zeros(10, 1, 2), torch.zeros(10, 1, 2)
    >>> vc[:2] = torch.tensor([[[1.0, 1.0]], [[3.0, 3.0]]])
    >>> st = DraftRoundKV()
    >>> q = k = torch.zeros(1, 1, 2); v = torch.full((1, 1, 2), 5.0)
    >>> vc[2] = v[0]
    >>> run_draft_round_step(rnd, 0, q, k, v, kc, vc, st, scaling=1.0)[0, 0].tolist()  # mean of 1, 3, 5
    [3.0, 3.0]
    >>> vc[3] = torch.full((1, 2), 7.0)
    >>> run_draft_round_step(rnd, 1, q, k, vc[3:4], kc, vc, st, scaling=1.0)[0, 0].tolist()
    [4.0, 4.0]
    """
    n = rnd.num_groups
    if not 0 <= step <= rnd.num_steps - 2:
        raise ValueError(f"draft step {step} out of range for num_steps={rnd.num_steps}")
    if q.shape[0] != n or k.shape[0] != n or v.shape[0] != n:
        raise ValueError(f"draft step has {q.shape[0]} rows, the round has {n} groups")
    hq, d = q.shape[1], q.shape[2]
    hkv, dv = k_cache.shape[1], v_cache.shape[2]
    c = rnd.max_cols
    if state.next_step != step or state.k is None or state.k.shape[1] != n * c:
        # Head-major buffers: SDPA then reads each (group, head) key block contiguously (faster than
        # the slot-major gather layout in an ad-hoc micro-benchmark; same values, same result).
        state.k = k_cache.index_select(0, rnd.kv_src).transpose(0, 1).contiguous()  # [hkv, n * c, d]
        state.v = v_cache.index_select(0, rnd.kv_src).transpose(0, 1).contiguous()  # [hkv, n * c, dv]
        if step > 0:
            j = torch.arange(step, device=rnd.step_dst.device).view(1, step)  # [1, step]
            dst = (rnd.step_dst.view(n, 1) + j).reshape(-1)  # [n * step]
            src = rnd.step_slots[:, :step].reshape(-1)  # [n * step]
            state.k.index_copy_(1, dst, k_cache.index_select(0, src).transpose(0, 1))
            state.v.index_copy_(1, dst, v_cache.index_select(0, src).transpose(0, 1))
    dst = rnd.step_dst + step
    state.k.index_copy_(1, dst, k.transpose(0, 1))
    state.v.index_copy_(1, dst, v.transpose(0, 1))
    state.next_step = step + 1
    width = max(rnd.prefix_lens) + step + 1
    kb = state.k.view(hkv, n, c, d)[:, :, :width].permute(1, 0, 2, 3)  # [n, hkv, width, d]
    vb = state.v.view(hkv, n, c, dv)[:, :, :width].permute(1, 0, 2, 3)  # [n, hkv, width, dv]
    qb = q.view(n, 1, hq, d).transpose(1, 2)  # [n, hq, 1, d]
    mask = NO_MASK
    if not rnd.uniform:
        cols = torch.arange(width, device=q.device).view(1, width)
        mask = (cols < rnd.col_limit + step).view(n, 1, 1, width)
    ob = _attend(qb, kb, vb, mask, scaling, logit_cap, hq, hkv)  # [n, hq, 1, dv]
    return ob.transpose(1, 2).reshape(n, hq, dv)

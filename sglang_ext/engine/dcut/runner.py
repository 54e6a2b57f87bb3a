"""D-Cut in SGLang's EAGLE/EAGLE3 worker: pruned, compacted target verification (SGLang glue).

:class:`DCutRunner` is created by ``ExtEAGLEWorker`` when ``--dcut`` is not ``off`` and runs
inside its ``verify()``. One decode step (``docs/sglang_internals.md#pruned-verification``, "Route B")::

    draft (full tree, N nodes per request)
      -> DraftCapture scores                    [bs, N] survival (root 1)
      -> exemptions (grammar, logprobs, penalties/logit bias, rejection sampling): full tree
      -> planner: tier + global top-K           sglang_ext.dcut.choose
      -> agree on (keep mask, tier) across TP   rank 0 broadcasts
      -> compact_tree + build_full_mask         kept nodes only, ragged, padded to the tier width
      -> verify_input links cut                 pruned nodes unreachable for eagle_sample
      -> SGLang's own run_eagle_verify, with the target forward intercepted:
           forward batch compacted  (input_ids, positions, out_cache_loc, custom mask,
                                     RaggedVerifyLayout) -> target forward over T rows
           logits / hidden states scattered back to the strided [bs * N] layout
      -> eagle_sample, commit, tree compaction: unchanged (strided)

Worked example (bs = 2, chain, N = 4, tier 0.5 -> width ceil(2 * 4 * 0.5) = 4 tokens)::

    survival (drafts)  [[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]]   -> keep_lens [2, 0]
    strided rows       [r0 d1 d2 d3 | r1 d1 d2 d3]           (8 rows, full verify)
    compact rows       [r0 d1 d2 | r1]                       (4 rows, kept_index [0, 1, 2, 4])
    next_token (cut)   [[1, 2, -1, -1], [-1, -1, -1, -1]]    request 1 accepts at most its root
    logits after scatter-back: rows 3, 5, 6, 7 are 0 (never read: unreachable)

KV consistency (``docs/sglang_internals.md#kv-slots-of-the-verify-window``): kept nodes write their KV into their own
strided window slots (``kv_loc_plan.bind(..., cols=kept_index)``); pruned slots are never
written, lie past every possible committed length and are ordinary over-allocation that the
request's release frees. No slot is allocated or freed here, so nothing can leak.

Tiers and TP: the tier and the keep mask are computed on every rank and taken from rank 0
(:func:`agree_across_ranks`), so all ranks run the same shapes. The forward is compacted only
when the target attention backend runs ragged TARGET_VERIFY batches (class attribute
``supports_ragged_target_verify = True``; the CPU testbed's ``torch_sdpa`` backend does, eagerly);
with any other backend the pruned nodes are only cut from the links ("Route C": lossless, no
FLOPs saved, warned once). The ``/set_internal_state`` knob ``dcut_compact`` 0 forces that
oracle. GPU path: the ``flashinfer_dcut`` attention backend (``flashinfer_verify``) and the
runner capturing one verify graph per (batch size, tier) (``dcut_graphs``); never run on a GPU.

Metrics (:class:`DCutMetrics`) are bonus-inclusive like the planner: a step verifies
``verified_tokens`` target rows (roots included, padding excluded) out of ``bs * N``; its
``accepted_tokens`` is ``sum(accept_lens)`` (bonus included, SGLang's convention); the
acceptance rate of kept drafts is ``(accepted_tokens - bs) / (verified_tokens - bs)``, the
corrected denominator (SGLang's own rate assumes ``N - 1`` drafts per request).

Online costs (``--dcut auto --dcut-online-costs on``, the default): the step clock
(:meth:`DCutRunner.begin_step`, one ``time.perf_counter()`` per worker forward, no device sync)
times each decode step from its start to the next decode step's start; the steps auto chose
(a tier, or a draft-off step) correct the cost table cell they ran
(``sglang_ext.dcut.online_costs.OnlineCosts``) and auto plans with the corrected table
(:meth:`DCutRunner.planning_table`), for the tier and the draft-off choice. With TP, rank 0's
corrections are broadcast every :data:`ONLINE_COSTS_SYNC_STEPS` decode steps and every rank plans
with the broadcast ones. The same intervals give the metrics' ``measured_step_ms``.

Diagnostics (opt-in, environment variable ``SGLANG_EXT_DCUT_TIMING=1`` at launch): the metrics
also carry a per-step time split (:class:`StepTiming`: draft steps, planner, target verify
forward, rest of verify, draft extend, other), the accept-length histogram and the planner's
predicted chain survival per position; ``bench/dcut_throughput.py`` turns it on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from sglang_ext.config import DCUT_CALIBRATION_POWER
from sglang_ext.dcut import (
    DEFAULT_TIERS,
    MODE_AUTO,
    CompactTree,
    CostTable,
    DCutPlan,
    DraftOffParams,
    DraftOffState,
    TreeTopology,
    build_full_mask,
    chain_keep_mask,
    choose,
    compact_tree,
    cut_links,
    draft_off_decision,
    observe_draft_gains,
)
from sglang_ext.dcut.calibration import PowerCalibration
from sglang_ext.dcut.depth import depth_decision
from sglang_ext.dcut.online_costs import OFF_COLUMN, OnlineCosts, apply_factors
from sglang_ext.dcut.switch_cost import CatchUpCost
from sglang_ext.engine.dcut.compact_verify import (
    CompactVerify,
    TargetForwardInterceptor,
    graph_ineligible_width,
    make_ragged_layout,
)
from sglang_ext.engine.dcut.depth_mode import DepthMode, adaptive_depths
from sglang_ext.engine.dcut.metrics import (
    EXEMPT_REASONS,
    FULL_TIER,
    TIMING_ENV,
    DCutMetrics,
    PendingObservation,
    StepDecision,
    StepTiming,
)

logger = logging.getLogger(__name__)

LOG_INTERVAL_STEPS = 50
"""Steps between two D-Cut log lines."""
ONLINE_COSTS_SYNC_STEPS = 16
"""With TP, decode steps between two broadcasts of rank 0's online cost corrections (every rank
plans with the corrections of the last broadcast, so all ranks plan alike)."""

__all__ = [
    "DCutRunner",
    "DCutMetrics",
    "StepDecision",
    "StepPlan",
    "agree_across_ranks",
    "exemption_reasons",
    "EXEMPT_REASONS",
    "FULL_TIER",
    "CompactVerify",
    "TargetForwardInterceptor",
    "make_ragged_layout",
    "graph_ineligible_width",
    "agreement_tp_group",
    "StepTiming",
    "TIMING_ENV",
]



# ----------------------------------------------------------------------------- exemptions
def exemption_reasons(req: Any, batch_return_logprob: bool = True) -> Tuple[str, ...]:
    """Reasons a request keeps its full draft tree (empty when it may be pruned).

    Parameters
    ----------
    req : sglang Req
        Reads ``grammar``, ``return_logprob`` and ``sampling_params`` (penalties, logit bias,
        min_new_tokens).
    batch_return_logprob : bool
        ``batch.return_logprob`` (no request returns logprobs when False).

    Returns
    -------
    tuple of str
        Subset of :data:`EXEMPT_REASONS` (rejection sampling is server-wide, see the runner).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> sp = NS(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
    ...         min_new_tokens=0)
    >>> exemption_reasons(NS(grammar=None, return_logprob=False, sampling_params=sp))
    ()
    >>> exemption_reasons(NS(grammar=object(), return_logprob=True, sampling_params=sp))
    ('grammar', 'logprobs')
    """
    out = []
    if getattr(req, "grammar", None) is not None:
        out.append("grammar")
    if batch_return_logprob and getattr(req, "return_logprob", False):
        out.append("logprobs")
    sp = getattr(req, "sampling_params", None)
    if sp is not None and (
        (getattr(sp, "frequency_penalty", 0.0) or 0.0) != 0.0
        or (getattr(sp, "presence_penalty", 0.0) or 0.0) != 0.0
        or (getattr(sp, "repetition_penalty", 1.0) or 1.0) != 1.0
        or bool(getattr(sp, "logit_bias", None))
        or (getattr(sp, "min_new_tokens", 0) or 0) > 0
    ):
        out.append("penalties")
    return tuple(out)


# ----------------------------------------------------------------------------- TP agreement
def agree_across_ranks(
    keep_mask: torch.Tensor,  # [batch_size, num_draft_tokens] bool
    tier_index: int,
    group: Any,
) -> Tuple[torch.Tensor, int]:
    """Make every TP rank use rank 0's keep mask and tier (one broadcast of a packed tensor).

    ``group`` is SGLang's ``GroupCoordinator`` (``get_parallel().tp_group``) or any object with
    ``world_size`` and ``broadcast(tensor, src)`` (in place, like ``torch.distributed``).
    With one rank (or ``group=None``) the inputs are returned unchanged.

    Parameters
    ----------
    keep_mask : torch.Tensor
        ``[batch_size, num_draft_tokens]`` bool, this rank's kept nodes.
    tier_index : int
        This rank's tier (``NO_TIER`` allowed).
    group : GroupCoordinator or None

    Returns
    -------
    (keep_mask, tier_index) : rank 0's values.

    Examples
    --------
    >>> class Rank1:  # a fake 2-rank group whose rank 0 kept only the roots, tier 0
    ...     world_size = 2
    ...     def broadcast(self, t, src=0):
    ...         t.zero_(); t[0] = t[2] = 1; return t
    >>> keep, tier = agree_across_ranks(torch.ones(2, 2, dtype=torch.bool), 3, Rank1())
    >>> keep.int().tolist(), tier
    ([[1, 0], [1, 0]], 0)
    """
    if group is None or int(getattr(group, "world_size", 1)) <= 1:
        return keep_mask, tier_index
    packed = torch.empty(keep_mask.numel() + 1, dtype=torch.int32, device=keep_mask.device)
    packed[:-1].copy_(keep_mask.reshape(-1))
    packed[-1] = int(tier_index)
    group.broadcast(packed, src=0)
    return packed[:-1].view(keep_mask.shape).to(torch.bool), int(packed[-1].item())


# ----------------------------------------------------------------------------- the runner
ADAPTIVE_FLAG = "--speculative-adaptive"
"""The unsupported reason that depth mode may lift (``sglang_ext.engine.dcut.depth_mode``)."""


def _unsupported_reason(worker: Any) -> Optional[str]:
    """Why D-Cut cannot prune on this server (None when it can)."""
    try:
        from sglang.srt.runtime_context import get_parallel, get_spec

        if get_parallel().pp_size > 1:
            return "pipeline parallelism"
        if bool(get_spec().speculative_adaptive):
            return ADAPTIVE_FLAG
    except Exception:  # runtime context unavailable (unit tests)
        pass
    try:
        mc = worker.target_worker.model_runner.model_config
        if getattr(mc, "mambaish_config", None) is not None:
            return "hybrid (mamba) target models"
    except AttributeError:
        pass
    try:
        from sglang.srt.utils.common import require_mlp_sync

        if require_mlp_sync():
            return "DP attention / MLP sync"
    except Exception:
        pass
    return None


class DCutRunner:
    """D-Cut for one ``ExtEAGLEWorker`` (see the module docstring).

    Parameters
    ----------
    worker : ExtEAGLEWorker
        The EAGLE worker (``draft_capture``, ``target_worker``, ``topk``,
        ``speculative_num_draft_tokens`` are read).
    cfg : sglang_ext.config.DCutConfig
        ``mode`` (auto / ratio), ``tiers`` and the profiling settings.

    Attributes
    ----------
    cost_table : CostTable or None
        Set by :meth:`init_after_graphs` (None: the planner falls back to ratio 0.75).
    table_info : dict
        Where the table came from (``source``: profiled / cache / file / fallback, ``path``,
        ``error``), shown in ``/server_info``.
    forced_ratio : float or None
        When set (profiling), every step uses this fixed ratio instead of ``cfg.mode``.
    override_ratio : float or None
        Runtime override of ``cfg.mode`` (``/set_internal_state`` key ``dcut_force_ratio``; 1.0 =
        full verification, the ``off`` behaviour); None = the configured mode.
    compact : bool or None
        True: compacted forward (saves FLOPs). False: full forward with cut links only
        ("Route C", the correctness oracle; no FLOP saving). None (default): compact when the
        target attention backend runs ragged TARGET_VERIFY batches (it sets
        ``supports_ragged_target_verify = True``, as the project's ``torch_sdpa`` does), else cut
        links only, with a warning.
    """

    def __init__(self, worker: Any, cfg: Any):
        self.cfg = cfg
        self.tiers: Tuple[float, ...] = tuple(float(t) for t in cfg.tiers)
        self.num_draft_tokens = int(worker.speculative_num_draft_tokens)
        self.topk = int(worker.topk)
        self.cost_table: Optional[CostTable] = None
        self.table_info: Dict[str, Any] = {"source": "none"}
        self.metrics = DCutMetrics(tiers=self.tiers)
        self.calibration: Optional[PowerCalibration] = (
            PowerCalibration() if cfg.calibration == DCUT_CALIBRATION_POWER else None)
        self._pending_obs: Optional[PendingObservation] = None
        self.forced_ratio: Optional[float] = None
        self.override_ratio: Optional[float] = None
        self.compact: Optional[bool] = None
        self.log_interval = LOG_INTERVAL_STEPS
        # draft-off steps (--dcut auto --dcut-draft-off auto; see draft_off_for_step)
        self.draft_off_params = DraftOffParams()
        self.draft_off_state = DraftOffState()
        self.forced_draft_off: Optional[bool] = None  # profiling: every step drafts (False) or not (True)
        self.force_draft_off_every = 0  # /set_internal_state dcut_force_draft_off (0: the configured choice)
        self.step_draft_off = False  # the step in progress runs without drafting (set by the worker)
        self._decode_steps = 0
        self._no_off_costs_warned = False
        self.explore_steps = 0  # draft-off steps of exploration bursts (drafting stayed the choice)
        # --dcut-online-costs: corrections learned from the step clock (created with the table)
        self.online_costs: Optional[OnlineCosts] = None
        self._applied_factors: Optional[Tuple[Tuple[float, ...], ...]] = None  # what the planner uses
        # rows whose draft-off cell has counted observations, with the factors (rank 0's under TP)
        self._applied_off_observed: Tuple[bool, ...] = ()
        self._step_context: Optional[float] = None  # mean context length of the decode step in progress
        # deferred draft-extend rows replayed by catch-ups so far (set by the worker): a step during
        # which it grew ran a catch-up, is not observed as a draft-off cost and feeds the switching cost
        self.catch_up_rows: Optional[Callable[[], int]] = None
        self._catch_up_rows_seen = 0
        self.catch_up_steps = 0  # closed steps left out of the online costs because they ran a catch-up
        self.catch_up_cost = CatchUpCost()
        self._applied_catch_up: Optional[Tuple[float, float]] = None  # (fixed, per_row) the choice uses
        self._planning: Optional[Tuple[Any, CostTable]] = None  # (factors, corrected table) cache
        self._clock_steps = 0  # decode steps seen by the step clock (TP broadcast schedule)
        self.unsupported = _unsupported_reason(worker)
        # depth mode: --dcut auto under --speculative-adaptive chooses the chain depth
        self.depth: Optional[DepthMode] = None
        if self.unsupported == ADAPTIVE_FLAG:
            depths, why = adaptive_depths(worker, cfg)
            if depths is None:
                self.unsupported = f"{ADAPTIVE_FLAG} ({why})"
            else:
                self.enable_depth_mode(depths, int(worker.speculative_num_steps))
        if self.unsupported is not None:
            logger.warning("D-Cut disabled: not supported with %s (full verification is used)", self.unsupported)
        if self.metrics.timing is not None:
            # the timers read the current metrics' timing (the profiler replaces the metrics)
            _install_step_timers(worker, lambda: self.metrics.timing)

    # ------------------------------------------------------------------ depth mode
    def enable_depth_mode(self, depths: Tuple[int, ...], initial: int) -> None:
        """Choose the chain depth among ``depths`` (SGLang's adaptive runtime states) instead of a
        verify tier: the cost table's columns become the depths (tier ``(s + 1) / (S + 1)``)."""
        self.depth = DepthMode(tuple(depths), initial if initial in depths else max(depths))
        self.unsupported = None
        if tuple(float(t) for t in self.cfg.tiers) != tuple(DEFAULT_TIERS):
            logger.warning("D-Cut depth mode: --dcut-tiers %s is not used (the depths %s are the tiers)",
                           list(self.cfg.tiers), list(self.depth.depths))
        self.tiers = self.depth.tiers
        self.num_draft_tokens = self.depth.max_depth + 1
        self.metrics = DCutMetrics(tiers=self.tiers)
        logger.info("D-Cut depth mode: --dcut auto chooses the chain depth among %s (SGLang's adaptive runtime "
                    "states) and when to switch drafting off", list(self.depth.depths))

    def depth_for_step(self, batch_size: int) -> int:
        """The depth of the drafted decode step about to run (the adaptive policy's
        ``get_steps_for_batch``; called once per drafted decode step, before drafting)."""
        dm = self.depth
        ratio = self.forced_ratio if self.forced_ratio is not None else self.override_ratio
        if ratio is not None:  # profiling a column, or dcut_force_ratio (1.0: the deepest chain)
            d = dm.depth_at_ratio(ratio)
        elif self.cost_table is None or batch_size <= 0:
            d = dm.state.depth if dm.state.depth in dm.depths else dm.initial
        else:
            decision = depth_decision(dm.state, batch_size, self.planning_table(), dm.depths, dm.gains, dm.params)
            dm.state, d = decision.state, decision.depth
        if batch_size > 0 and self.forced_draft_off is None:  # not a profiling step (no verify result comes back)
            dm.pending.append((int(batch_size), int(d)))
        return int(d)

    def observe_depth(self, accepted: Any, batch_size: int) -> None:
        """The accepted drafts per request of a verified decode step (the adaptive policy's
        ``on_verify_complete``): updates the acceptance model and, from it, the gains of the
        draft-off choice. Draft-off steps and profiling steps teach nothing."""
        dm = self.depth
        counts = [int(a) for a in (accepted or [])]
        if not counts:
            return
        if not dm.pending or dm.pending[0][0] != len(counts):
            dm.pending.clear()  # not the step we think it is: never mis-attribute
            dm.dropped_observations += 1
            return
        _, d = dm.pending.popleft()
        if d <= 0 or any(c > d for c in counts):
            return
        dm.learn(counts, d)
        self.draft_off_state = dataclasses.replace(self.draft_off_state, gains=dm.gains)

    def _record_depth_step(self, worker: Any, bs: int, result: Any) -> None:
        """Metrics (and the online costs' column) of a drafted step in depth mode."""
        dm = self.depth
        d = int(worker.speculative_num_steps)
        rows = bs * (d + 1)
        column = dm.depths.index(d) if d in dm.depths else None
        observed = column is not None and self._observed_mode()
        predicted = None
        if column is not None and self.cost_table is not None and self.forced_ratio is None:
            predicted = self.planning_table().lookup(bs)[1][column]
        decision = StepDecision(bs, dm.max_depth + 1, f"steps={d}", MODE_AUTO, rows, rows, 0, predicted,
                                pruned=d < dm.max_depth, cost_column=column if observed else None)
        self.metrics.record(decision, getattr(result, "accept_lens", None))

    # ------------------------------------------------------------------ launch
    def init_after_graphs(self, worker: Any) -> None:
        """Obtain the cost table (cache, ``--dcut-cost-table`` or profiling) and publish it on the
        target ``model_config``; any failure -> warning + fixed fallback ratio, never a crash."""
        from sglang_ext.engine.dcut.profiler import obtain_cost_table, publish_cost_table

        try:
            self.cost_table, self.table_info = obtain_cost_table(self, worker)
        except Exception as e:  # profiling must never take the server down
            logger.warning("D-Cut: cost table unavailable (%s: %s); fallback ratio 0.75", type(e).__name__, e)
            self.cost_table, self.table_info = None, {"source": "fallback", "error": f"{type(e).__name__}: {e}"}
        publish_cost_table(worker, self.cost_table, self.table_info)
        self.reset_online_costs()

    def reset_online_costs(self) -> None:
        """(Re)start the online cost corrections from the current table (``--dcut auto
        --dcut-online-costs on`` with a table; else none)."""
        on = bool(getattr(self.cfg, "corrects_costs", False)) and self.cost_table is not None
        self.online_costs = OnlineCosts(self.cost_table) if on and self.unsupported is None else None
        self._applied_factors = None  # None: the launch-time table (no correction yet)
        self._applied_off_observed, self._planning = (), None
        self.catch_up_cost, self._applied_catch_up = CatchUpCost(), None

    def info(self, worker: Any = None) -> Dict[str, Any]:
        """Static description for ``/server_info`` (``get_init_info``). With ``worker``, the table
        shown is the one stored on the target ``model_config`` (what the planner's server sees),
        and ``hf_config_matches`` says whether ``hf_config`` holds the same table."""
        from sglang_ext.engine.dcut.profiler import MODEL_CONFIG_ATTR

        table = None if self.cost_table is None else self.cost_table.to_dict()
        hf_matches = None
        if worker is not None:
            mc = worker.target_worker.model_runner.model_config
            table = getattr(mc, MODEL_CONFIG_ATTR, None)
            hf = getattr(mc, "hf_config", None)
            hf_matches = hf is not None and getattr(hf, MODEL_CONFIG_ATTR, None) == table
        return {
            "mode": self.cfg.mode,
            "override_ratio": self.override_ratio,
            "tiers": list(self.tiers),
            "num_draft_tokens": self.num_draft_tokens,
            "topk": self.topk,
            "unsupported": self.unsupported,
            "cost_table": table,
            "cost_table_info": dict(self.table_info),
            "hf_config_matches": hf_matches,
            "calibration": self.cfg.calibration,
            "draft_off": getattr(self.cfg, "draft_off", None),
            "online_costs": getattr(self.cfg, "online_costs", None),
            "depth_mode": None if self.depth is None else list(self.depth.depths),
        }

    # ------------------------------------------------------------------ per step
    def _mode(self):
        if self.forced_ratio is not None:
            return float(self.forced_ratio)
        if self.override_ratio is not None:
            return float(self.override_ratio)
        return self.cfg.mode  # "auto" or a float ratio

    # ------------------------------------------------------------------ online costs
    def begin_step(self, decode: bool, context: Optional[float] = None) -> None:
        """The step clock (``--dcut-online-costs``): called by the worker at the start of every
        ``forward_batch_generation``; ``decode`` False for a prefill / extend / idle batch,
        ``context`` the batch's mean context length (:func:`batch_context`).

        What is measured: the wall time between the starts of two consecutive decode steps of this
        worker, one ``time.perf_counter()`` read per forward. It is attributed to the earlier step
        (its batch size and the tier or draft-off step it ran, ``StepDecision.cost_column``) and
        covers what the profiler timed for that step (draft, verify, draft extend) plus the
        scheduler's work between two steps. No device synchronisation is needed: each step reads
        its results on the host before the next one starts (the auto tier choice reads the
        planner's sums; the scheduler reads the accepted tokens), so on a steady stream the
        interval between step starts is the step's cost, and an EMA smooths what an asynchronous
        launch shifts between neighbours. An interval is dropped when anything else ran in between
        (a prefill or extend batch, an idle gap over 5 s) and when the step is not comparable with
        the table (fixed or forced ratio, ``dcut_force_ratio`` / ``dcut_force_draft_off``,
        profiling, exempt requests), and when the step ran a catch-up draft extend (the draft-off
        step that replays the deferred extends before drafting resumes: a cost of switching, not of
        the draft-off column; counted in ``catch_up_steps``). The same intervals give the metrics'
        measured step time. Each observation carries the context of its step, and the planner's
        corrections are evaluated at the context of the step about to run
        (:class:`~sglang_ext.dcut.online_costs.OnlineCosts` fits a context slope per row).

        TP: ranks may time a step differently, so only rank 0's corrections count: every
        :data:`ONLINE_COSTS_SYNC_STEPS` decode steps rank 0's factors are broadcast and every rank
        plans with the broadcast factors (the same table on every rank, so tier and draft-off
        choices stay identical, as with the launch-time table).
        """
        if self.metrics.trace is not None:
            self.metrics.trace.context = self._trace_context
        closed = self.metrics.start_step(time.perf_counter(), decode)
        closed_context, self._step_context = self._step_context, (context if decode else None)
        rows = 0  # deferred rows a catch-up replayed during the closed step (a catch-up has at least one)
        if self.catch_up_rows is not None:
            n = int(self.catch_up_rows())
            rows, self._catch_up_rows_seen = n - self._catch_up_rows_seen, n
        oc = self.online_costs
        if oc is None:
            return
        if closed is not None and closed[0].cost_column is not None:
            if rows > 0:
                self.catch_up_steps += 1
                self._observe_catch_up(closed[0].batch_size, closed[1], closed_context, rows)
            else:
                oc.observe(closed[0].batch_size, closed[0].cost_column, closed[1], closed_context)
        if not decode:
            return
        self._clock_steps += 1
        group = agreement_tp_group()
        if group is None:
            if oc.counted:  # the factors move with the context, so they are evaluated every decode step
                self._applied_factors = oc.factors(context)
                self._applied_off_observed = tuple(r[-1] for r in oc.observed_mask())
            self._applied_catch_up = self.catch_up_cost.estimate()
        elif self._clock_steps % ONLINE_COSTS_SYNC_STEPS == 0:
            self._applied_factors, self._applied_off_observed, self._applied_catch_up = sync_factors(
                (oc.factors(context), tuple(r[-1] for r in oc.observed_mask()), self.catch_up_cost.estimate()),
                group)

    def _observe_catch_up(self, batch_size: int, ms: float, context: Optional[float], rows: int) -> None:
        """A step that ran a catch-up extend: its time beyond a draft-off step's expected cost at
        its batch size and context (the corrected table) is the catch-up's, ``rows`` replayed."""
        if self.cost_table is None or not self.cost_table.has_draft_off:
            return
        off = self.online_costs.corrected(batch_size, context).off_ms
        if off is not None:
            self.catch_up_cost.observe(rows, ms - off)

    def _trace_context(self) -> Dict[str, Any]:
        """What a step-trace line (``SGLANG_EXT_DCUT_STEP_TRACE``) adds: whether a runtime knob or the
        profiler forced the step, the online-cost factor of the step's column now, and the counters
        ``trace_extra`` returns (the worker's deferred draft extend), and the step's mean context length."""
        ctx = self._step_context
        out: Dict[str, Any] = {"forced": not self._observed_mode(),
                               "context": None if ctx is None else round(float(ctx), 1)}
        extra = getattr(self, "trace_extra", None)
        if extra is not None:
            out.update(extra())
        return out

    def planning_table(self) -> Optional[CostTable]:
        """The table auto plans with: the launch-time table times the online corrections in use
        (the launch-time table itself without ``--dcut-online-costs``)."""
        if self.online_costs is None or self.cost_table is None or self._applied_factors is None:
            return self.cost_table
        if self._planning is None or self._planning[0] != self._applied_factors:
            self._planning = (self._applied_factors, apply_factors(self.cost_table, self._applied_factors))
        return self._planning[1]

    def _observed_mode(self) -> bool:
        """Whether this step's time is comparable with the table: configured auto, not forced."""
        return (self.online_costs is not None and self.forced_ratio is None and self.override_ratio is None
                and self.forced_draft_off is None and not self.force_draft_off_every and self._mode() == MODE_AUTO)

    def online_costs_summary(self) -> Dict[str, Any]:
        """``/server_info`` ``internal_states[i].dcut.online_costs``: the setting and, when active,
        per profiled batch size the factor and corrected cost of each corrected column (the
        factors the planner uses) and the observation counters."""
        out: Dict[str, Any] = {"setting": getattr(self.cfg, "online_costs", None),
                               "active": self.online_costs is not None}
        if self.online_costs is not None:
            out.update(self.online_costs.summary(self._applied_factors))
            out["catch_up_steps"] = self.catch_up_steps
            out["catch_up_cost"] = self.catch_up_cost.summary()
        return out

    def set_force_draft_off(self, every: int) -> None:
        """Runtime knob ``dcut_force_draft_off``: 0 = the configured choice; 1 = every decode step
        runs without drafting; ``k >= 2`` = every step but each k-th (tests and benches; also under
        fixed ratios). Raises ValueError on a negative or non-integer value."""
        if isinstance(every, bool) or int(every) != every or int(every) < 0:
            raise ValueError(f"dcut_force_draft_off must be an integer >= 0, got {every!r}")
        self.force_draft_off_every = int(every)

    def draft_off_for_step(self, batch_size: int) -> bool:
        """Whether the decode step about to start skips drafting (called by the worker *before*
        drafting, once per decode step).

        The draft's confidences of this step do not exist yet, so the choice comes from earlier
        steps: :func:`sglang_ext.dcut.draft_off_decision` compares the cost table's draft-off cost
        with every tier's, valued with the planner's smoothed expected accepted drafts per request
        of the drafted steps (fed by :meth:`choose_step`; in depth mode by :meth:`observe_depth`),
        with a minimum dwell, probe steps that back off while they keep confirming draft-off, and
        exploration bursts of draft-off steps where the online costs never measured the draft-off
        cost (:meth:`_off_observed`). Only ``--dcut auto`` with
        ``--dcut-draft-off auto`` and a table holding draft-off costs switches drafting off (a
        table without them is warned about once); fixed ratios
        (configured or ``dcut_force_ratio``) never do. ``forced_draft_off`` (profiling) and
        ``dcut_force_draft_off`` override the choice.
        """
        self._decode_steps += 1
        off, state = self._draft_off_choice(batch_size, self._decode_steps)
        if state is not None:
            self.draft_off_state = state
            self.explore_steps += int(off and state.drafting)  # off while drafting is the choice: a burst
        if off and self.depth is not None and batch_size > 0 and self.forced_draft_off is None:
            self.depth.pending.append((int(batch_size), 0))  # its verify result teaches nothing
        return off

    def preview_draft_off(self, batch_size: int) -> bool:
        """The choice :meth:`draft_off_for_step` would make for the next decode step at this batch
        size, without changing any state (the deferred draft extend asks it, during a draft-off
        step, whether to catch the draft up now)."""
        return self._draft_off_choice(batch_size, self._decode_steps + 1)[0]

    def _draft_off_choice(self, batch_size: int, step: int) -> Tuple[bool, Optional[DraftOffState]]:
        """``(off, next draft-off state or None)`` for decode step number ``step``."""
        if self.unsupported is not None or batch_size <= 0:
            return False, None
        if self.forced_draft_off is not None:
            return bool(self.forced_draft_off), None
        k = self.force_draft_off_every
        if k:
            return k == 1 or step % k != 0, None
        if not getattr(self.cfg, "may_draft_off", False) or self._mode() != MODE_AUTO or self.cost_table is None:
            return False, None
        if not self.cost_table.has_draft_off:
            if not self._no_off_costs_warned:
                self._no_off_costs_warned = True
                logger.warning("D-Cut: the cost table has no draft-off costs (schema version 1, or profiled with "
                               "--dcut-draft-off never); drafting is never switched off (re-profile to enable it)")
            return False, None
        decision = draft_off_decision(self.draft_off_state, batch_size, self.planning_table(), self.draft_off_params,
                                      self._off_observed(batch_size), catch_up=self._applied_catch_up)
        return decision.off, decision.state

    def _off_observed(self, batch_size: int) -> Optional[bool]:
        """Whether the corrections the planner uses hold a measured draft-off cost for the row of
        ``batch_size`` (its factor moved from 1.0: one counted observation sets it to
        ``sqrt(observed / predicted)``); None without online costs (then the policy never
        explores). With TP these are rank 0's broadcast factors, so every rank answers alike."""
        oc = self.online_costs
        if oc is None:
            return None
        if self._applied_factors is None or not self._applied_off_observed:
            return False
        return bool(self._applied_off_observed[oc.row_index(batch_size)])

    def draft_off_summary(self) -> Dict[str, Any]:
        """``/server_info`` ``internal_states[i].dcut.draft_off``: the setting, the current choice
        and the smoothed expected accepted drafts per request at each tier."""
        st = self.draft_off_state
        return {"setting": getattr(self.cfg, "draft_off", None), "drafting": st.drafting,
                "gains": None if st.gains is None else [round(g, 4) for g in st.gains],
                "probe_interval": st.probe_interval or None,
                "exploring": st.explore_left > 0, "explore_steps": self.explore_steps,
                "force_every": self.force_draft_off_every,
                "table_has_costs": None if self.cost_table is None else self.cost_table.has_draft_off}

    def _draft_off_predicted_ms(self, batch_size: int) -> Optional[float]:
        if self.cost_table is None or self.forced_draft_off is not None:
            return None
        row = self.planning_table().lookup_off(batch_size)
        return None if row is None else row[1]

    def set_override_ratio(self, ratio: Optional[float]) -> None:
        """Runtime mode override: a ratio in (0, 1] (1.0 = full verify), or None / 0 to return to
        the configured mode. Raises ValueError outside that range."""
        if ratio is None or float(ratio) == 0.0:
            self.override_ratio = None
            return
        r = float(ratio)
        if not (0.0 < r <= 1.0) or math.isnan(r):
            raise ValueError(f"dcut_force_ratio must be in (0, 1] or 0 (configured mode), got {ratio}")
        self.override_ratio = r

    def choose_step(self, scores: torch.Tensor, n: int, exempt: Optional[List[bool]] = None,
                    topology: Optional[TreeTopology] = None) -> DCutPlan:  # scores: [bs, slots]
        """The planner's plan for this step's batch (shared by EAGLE and DFlash).

        ``scores`` are the raw survival scores of the whole batch (chains ``[bs, N - 1]``, trees
        ``[bs, N]`` with the root column); ``exempt`` flags the requests verified in full. In
        ``auto`` mode the planner sees the scores through the online calibration (a strictly
        increasing map: same kept set at any budget, only the tier moves). The raw scores and the
        kept slots of the scored requests are remembered for :meth:`observe_step`.
        """
        mode = self._mode()
        planned = scores
        if self.calibration is not None and mode == MODE_AUTO:
            planned = self.calibration.apply(scores)
        table = self.planning_table() if mode == MODE_AUTO else self.cost_table
        plan = choose(planned, table, self.tiers, mode, topology=topology, num_draft_tokens=n, exempt=exempt)
        if plan.tier_expected is not None:  # auto: what the next steps' draft-off choice learns from
            self.draft_off_state = observe_draft_gains(self.draft_off_state, plan.batch_size, plan.tier_expected,
                                                       self.draft_off_params)
        if self.calibration is not None:
            tree = plan.keep_mask is not None
            keep = plan.keep_mask if tree else chain_keep_mask(plan.keep_lens, n)  # [bs, N], root column 0
            obs_scores, kept = (scores[:, 1:] if tree else scores), keep[:, 1:]  # draft slots only
            cand = None
            if exempt is not None and any(exempt):
                cand = torch.tensor([i for i, e in enumerate(exempt) if not e], dtype=torch.int64,
                                    device=scores.device)
                obs_scores, kept = obs_scores.index_select(0, cand), kept.index_select(0, cand)
            self._pending_obs = PendingObservation(obs_scores, kept.to(torch.bool), cand)
        return plan

    def decide(self, batch: Any, bs: int, n: int,
               step_scores: Callable[[], Optional[Tuple[torch.Tensor, Optional[TreeTopology]]]]) -> "StepPlan":
        """This step's D-Cut decision (both runners): exemptions, the planner, TP agreement.

        ``step_scores()`` gives the whole batch's survival scores and tree topology (``None`` for
        chains), or None when the drafts were not captured (counted in the metrics); it is called
        only when some request may be pruned.
        """
        exempt = self._exemptions(batch, bs)
        n_exempt = sum(exempt)
        full = StepDecision.full(bs, n, n_exempt)
        if n_exempt == bs or n <= 1:
            return StepPlan(full)
        got = step_scores()
        if got is None:
            self.metrics.uncaptured_steps += 1
            return StepPlan(full)
        scores, topology = got
        if self.metrics.timing is not None and topology is None:
            cand = [i for i in range(bs) if not exempt[i]]
            self.metrics.timing.add_survival(scores[cand])
        plan = self.choose_step(scores, n, exempt, topology)
        # the step costs its table cell only without exempt requests (else the cost staircase)
        observed = self._observed_mode() and plan.mode == MODE_AUTO and n_exempt == 0
        if not plan.prunes:
            full.mode, full.predicted_ms = plan.mode, plan.predicted_ms
            full.cost_column = plan.tier_index if observed else None
            return StepPlan(full)
        keep = plan.keep_mask if plan.keep_mask is not None else chain_keep_mask(plan.keep_lens, n)  # [bs, N]
        keep, tier_index = agree_across_ranks(keep, plan.tier_index, agreement_tp_group())
        plan = plan.at_tier(tier_index)
        decision = StepDecision(bs, n, plan.tier_label, plan.mode, keep.sum(), plan.forward_width, n_exempt,
                                plan.predicted_ms, pruned=True,
                                cost_column=tier_index if observed and tier_index >= 0 else None)
        return StepPlan(decision, plan, keep)

    def compact_verify(
        self,
        step: "StepPlan",
        draft_token: torch.Tensor,  # [bs * N]
        positions: torch.Tensor,  # [bs * N]
        next_token: torch.Tensor,  # [bs, N] first-child links
        next_sibling: torch.Tensor,  # [bs, N] next-sibling links
        seq_lens: Optional[torch.Tensor] = None,  # [bs] prefix lengths; None = no mask (causal chains)
    ) -> Tuple[CompactVerify, CompactTree]:
        """The compacted verify of a pruned step (both runners): the kept rows, padded to the
        step's forward width, and their compact FULL mask when ``seq_lens`` is given."""
        width = step.decision.padded_tokens
        ct = compact_tree(step.keep, draft_token, positions, next_token, next_sibling, num_tokens=width)
        mask = None if seq_lens is None else build_full_mask(ct.tree_block, ct.counts, seq_lens)[0]
        cv = CompactVerify(
            kept_index=ct.kept_index,
            draft_token=ct.draft_token.to(draft_token.dtype),
            positions=ct.positions.to(positions.dtype),
            custom_mask=mask,
            layout=make_ragged_layout(ct.counts, ct.qo_indptr, width),
            total_nodes=step.keep.numel(),
        )
        return cv, ct

    def observe_step(self, accept_lens: Optional[torch.Tensor]) -> None:  # accept_lens: [batch_size]
        """Feed the calibration with the step's kept scores and its candidates' accepted drafts
        (not while profiling: forced-ratio steps are not the workload); clears the pending step."""
        obs, self._pending_obs = self._pending_obs, None
        if obs is None or self.calibration is None or accept_lens is None or self.forced_ratio is not None:
            return
        lens = accept_lens.detach().to(torch.int64)
        if obs.cand is not None:
            lens = lens.index_select(0, obs.cand.to(lens.device))
        if lens.shape[0] != obs.scores.shape[0]:
            return  # a batch the planner did not see (never expected; skip rather than mis-attribute)
        accepted = (lens - 1).clamp(min=0).sum()  # bonus excluded
        self.calibration.observe(obs.scores, accepted, kept=obs.kept)

    def verify(self, worker: Any, batch: Any, pp_proxy_tensors: Any, grammar_barrier: Any,
               base_verify: Callable) -> Any:
        """Pruned verification of one decode step; returns SGLang's ``GenerationBatchResult``."""

        def full():
            return base_verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)

        if self.unsupported is not None or batch.forward_mode.is_idle() or batch.spec_info is None:
            return full()
        vi = batch.spec_info
        bs = len(batch.seq_lens)
        n = self.num_draft_tokens
        if bs == 0 or not hasattr(vi, "retrieve_next_token"):
            return full()
        if self.step_draft_off:  # SGLang's one-node verify input (draft-off step): nothing to prune
            result = one_node_verify(worker, full)
            column = OFF_COLUMN if self._observed_mode() and self.cost_table.has_draft_off else None
            self.metrics.record(StepDecision.draft_off(bs, self._draft_off_predicted_ms(bs), column),
                                getattr(result, "accept_lens", None))
            self._pending_obs = None
            if self.log_interval and self.forced_draft_off is None and self.metrics.steps % self.log_interval == 0:
                logger.info(self.metrics.log_line())
            return result
        if self.depth is not None:  # depth mode: the chain's depth is the cut; SGLang's own verify
            result = full()
            self._record_depth_step(worker, bs, result)
            if self.log_interval and self.forced_ratio is None and self.metrics.steps % self.log_interval == 0:
                logger.info(self.metrics.log_line())
            return result

        if self.compact is None:
            self.compact = _backend_runs_ragged_verify(worker)
        timing = self.metrics.timing
        if timing is not None:
            t0 = _timed_now(batch.seq_lens.device)
        decision, prepared = self._plan(worker, batch, vi, bs, n)
        if timing is not None:
            t1 = _timed_now(batch.seq_lens.device)
            timing.add("plan", t1 - t0)
        if prepared is None:
            result = full()
        elif not self.compact:
            vi.retrieve_next_token, vi.retrieve_next_sibling = prepared[1]
            result = full()
        else:
            plan, links = prepared
            vi.retrieve_next_token, vi.retrieve_next_sibling = links
            with TargetForwardInterceptor(worker.target_worker, plan, verify_input=vi) as icpt:
                result = full()
            if icpt.calls != 1:
                raise RuntimeError(f"D-Cut: expected one intercepted target verify forward, saw {icpt.calls}")
        if timing is not None:
            timing.add("verify_rest", _timed_now(batch.seq_lens.device) - t1 - timing._pending["target_forward"])
        self.metrics.record(decision, getattr(result, "accept_lens", None))
        self.observe_step(getattr(result, "accept_lens", None))
        if self.log_interval and self.forced_ratio is None and self.metrics.steps % self.log_interval == 0:
            logger.info(self.metrics.log_line())
        return result

    def _exemptions(self, batch: Any, bs: int) -> List[bool]:
        from sglang.srt.runtime_context import get_spec

        reqs = list(getattr(batch, "reqs", None) or [])
        if bool(get_spec().speculative_use_rejection_sampling):
            self.metrics.exempt_requests["rejection_sampling"] += bs
            return [True] * bs
        exempt = []
        rl = bool(getattr(batch, "return_logprob", False))
        for i in range(bs):
            reasons = exemption_reasons(reqs[i], rl) if i < len(reqs) else ()
            for r in reasons:
                self.metrics.exempt_requests[r] += 1
            exempt.append(bool(reasons))
        return exempt

    def _plan(self, worker: Any, batch: Any, vi: Any, bs: int, n: int):
        """(StepDecision, None | (CompactVerify or None, cut links)) for this EAGLE step."""
        nt, ns = vi.retrieve_next_token, vi.retrieve_next_sibling  # [bs, N]
        cap = getattr(worker, "draft_capture", None)

        def step_scores():
            scores = cap.scores_for_verify(vi, bs) if cap is not None else None  # SpecExit reads them too
            if scores is None or not scores.valid:
                return None
            if scores.is_tree:
                return scores.survival, TreeTopology.from_retrive(nt, ns)
            return scores.draft_survival, None

        step = self.decide(batch, bs, n, step_scores)
        if step.keep is None:
            return step.decision, None
        if not self.compact:  # Route C: same layout, pruned nodes unreachable, full-width forward
            cut_nt, cut_ns = cut_links(nt, ns, step.keep)
            step.decision.padded_tokens = bs * n
            return step.decision, (None, (cut_nt.to(nt.dtype), cut_ns.to(ns.dtype)))
        cv, ct = self.compact_verify(step, vi.draft_token, vi.positions, nt, ns, seq_lens=batch.seq_lens)
        links = (ct.cut_next_token.to(nt.dtype), ct.cut_next_sibling.to(ns.dtype))
        return step.decision, (cv, links)


@dataclass
class StepPlan:
    """One verify step's D-Cut decision (:meth:`DCutRunner.decide`, both runners)."""

    decision: StepDecision
    plan: Optional[DCutPlan] = None  # the planner's plan at the agreed tier; None = verified in full
    keep: Optional[torch.Tensor] = None  # [batch_size, N] bool kept nodes (TP rank 0's); None = all


def _timed_now(device: Any) -> float:
    """``time.perf_counter()`` after the device's queued work (timing mode only)."""
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _install_step_timers(worker: Any, timing_of: Callable[[], Optional[StepTiming]]) -> None:
    """Wrap draft, draft extend and the target verify forward with timers (instance attributes);
    ``timing_of()`` gives the :class:`StepTiming` to add to (None: not timed)."""

    def wrap(obj: Any, name: str, part: str, only_verify: bool = False) -> None:
        original = getattr(obj, name, None)
        if original is None:
            return
        device = getattr(getattr(worker, "target_worker", None), "device", None) or getattr(worker, "device", "cpu")
        device = torch.device(device) if isinstance(device, str) else device

        def timed(*args, **kwargs):
            timing = timing_of()
            if timing is None or (only_verify and not kwargs.get("is_verify", False)):
                return original(*args, **kwargs)
            t = _timed_now(device)
            try:
                return original(*args, **kwargs)
            finally:
                timing.add(part, _timed_now(device) - t)

        setattr(obj, name, timed)

    dw = getattr(worker, "draft_worker", None)
    if dw is not None:
        wrap(dw, "draft", "draft")
        wrap(dw, "_draft_extend_for_decode", "draft_extend")
    tw = getattr(worker, "target_worker", None)
    if tw is not None:
        wrap(tw, "forward_batch_generation", "target_forward", only_verify=True)


RAGGED_VERIFY_FLAG = "supports_ragged_target_verify"
"""Attribute an attention backend sets (True) when it runs ragged TARGET_VERIFY batches
(``spec_info.ragged_verify_layout`` + a compact FULL mask), so D-Cut can compact the forward."""


def _backend_runs_ragged_verify(worker: Any) -> bool:
    backend = getattr(worker.target_worker.model_runner, "attn_backend", None)
    ok = bool(getattr(backend, RAGGED_VERIFY_FLAG, False))
    if not ok:
        logger.warning("D-Cut: attention backend %s cannot run ragged verify batches; pruned nodes are cut "
                       "from the links only (lossless, but no verify FLOPs are saved)", type(backend).__name__)
    return ok


def one_node_verify(worker: Any, verify: Callable[[], Any]) -> Any:
    """``verify()`` -- SGLang's verify of a draft-off step's one-node input -- with ``worker.topk``
    at 1 for the call (``patches/zero_step_draft_off.md``).

    ``run_eagle_verify`` compacts the accepted tree path to the front of each request's block only
    when ``topk > 1``: a KV move in every layer plus two gathers. With one node per request the
    accepted path *is* the front, so on a tree the move copies every accepted slot onto itself
    (about 1 % of a bs-1 draft-off step on the CPU testbed, ad-hoc profile). ``topk`` 1 with one
    verify token is SGLang's own zero-step configuration (``--speculative-adaptive`` on a chain),
    and the worker's ``topk`` is read there only for that compaction and the choice of commit
    path; the verify input (built before, with the real ``topk``) is unchanged.
    """
    saved = worker.topk
    worker.topk = 1
    try:
        return verify()
    finally:
        worker.topk = saved


def is_decode_batch(batch: Any) -> bool:
    """Whether a worker forward is a decode step (not a prefill / extend, mixed or idle batch)."""
    mode = batch.forward_mode
    return not (mode.is_extend() or bool(getattr(batch, "is_extend_in_batch", False)) or mode.is_idle())


def sync_factors(applied: Tuple[Any, ...], group: Any) -> Tuple[Any, ...]:
    """Rank 0's online cost factors, per-row "draft-off cell observed" flags and catch-up fit
    ``(fixed, per_row)`` or None on every rank (``group.broadcast_object``, SGLang's
    ``GroupCoordinator``); with ``group=None`` they are returned unchanged.

    Examples
    --------
    >>> sync_factors((((1.0, 2.0),), (True,), None), None)
    (((1.0, 2.0),), (True,), None)
    """
    if group is None:
        return applied
    got = group.broadcast_object(applied if int(getattr(group, "rank_in_group", 0)) == 0 else None, src=0)
    factors, observed, catch_up = got
    return (tuple(tuple(float(x) for x in row) for row in factors), tuple(bool(b) for b in observed),
            None if catch_up is None else (float(catch_up[0]), float(catch_up[1])))


def batch_context(batch: Any) -> Optional[float]:
    """Mean context length (tokens per request, prompt and output) of a worker batch: from
    ``seq_lens_cpu`` when the batch carries it, else from its requests; None when neither is there.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> batch_context(NS(seq_lens_cpu=torch.tensor([10, 30])))
    20.0
    >>> batch_context(NS(seq_lens_cpu=None, reqs=[NS(origin_input_ids=[1, 2], output_ids=[3])]))
    3.0
    >>> batch_context(NS(reqs=[])) is None
    True
    """
    lens = getattr(batch, "seq_lens_cpu", None)
    if isinstance(lens, torch.Tensor) and lens.numel() > 0:
        return float(lens.sum()) / lens.numel()
    reqs = getattr(batch, "reqs", None) or ()
    if not reqs:
        return None
    return sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs) / len(reqs)


def agreement_tp_group() -> Any:
    """The TP group on which rank 0's D-Cut decision is broadcast, or None without TP.

    Returns
    -------
    GroupCoordinator or None
        SGLang's TP group when its ``world_size > 1`` (read from the runtime context), else None
        (single rank, or no runtime context, as in unit tests): :func:`agree_across_ranks` then
        returns its inputs unchanged.

    Examples
    --------
    >>> agreement_tp_group() is None  # no SGLang runtime context here
    True
    """
    try:
        from sglang.srt.runtime_context import get_parallel

        group = get_parallel().tp_group
    except Exception:
        return None
    return group if int(getattr(group, "world_size", 1)) > 1 else None

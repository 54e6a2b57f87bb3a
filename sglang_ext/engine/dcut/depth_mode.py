"""D-Cut depth mode: ``--dcut auto`` under SGLang's ``--speculative-adaptive`` (SGLang glue).

SGLang's adaptive EAGLE worker keeps one runtime state per candidate step count (its own
attention backends and graphs) and switches between them with an ``AdaptiveController`` driven by
a policy object (the ``AdaptiveSpecPolicy`` protocol of
``sglang.srt.speculative.adaptive_runtime_state``: ``candidate_steps``, ``set_cuda_graph_bs``,
``get_steps_for_batch``, ``on_verify_complete``, ``cuda_graph_bs_for_step``). SGLang's own policy
follows the accept length with per-batch-size candidate lists and ignores the step cost. In depth
mode the project's worker builds the controller with :class:`DCutDepthPolicy` instead (SGLang's
public constructor ``AdaptiveController(worker, policy)``), which asks the D-Cut runner:

* before each drafted step, ``get_steps_for_batch(bs)`` -> ``DCutRunner.depth_for_step``: the
  depth with the most expected committed tokens per ms (:func:`sglang_ext.dcut.depth.depth_decision`
  over a cost table whose columns are the candidate depths, profiled at launch like the tiers);
* after each verify, ``on_verify_complete(counts, bs)`` -> ``DCutRunner.observe_depth``: the
  accepted drafts per request update the acceptance model along the chain
  (:func:`sglang_ext.dcut.depth.observe_chain_accepts`), whose expected accepts per depth are
  also the gains of the draft-off choice (a draft-off step is the project's own zero-step round,
  not SGLang's 0-step state).

Chains only (SGLang's adaptive mode requires ``topk 1``), ``--dcut auto`` only (a fixed ratio has
no depth to choose; such a server keeps SGLang's policy and D-Cut off, with a warning). The
verify of a drafted step is SGLang's own (no pruning inside a depth: on a chain the depth is the
cut). See ``patches/dcut_depth_policy.md``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Deque, List, Optional, Sequence, Tuple

from sglang_ext.dcut.depth import (
    ChainAcceptance,
    DepthParams,
    DepthState,
    depth_gains,
    depth_tiers,
    observe_chain_accepts,
)

__all__ = ["DepthMode", "DCutDepthPolicy", "adaptive_depths"]


def adaptive_depths(worker: Any, cfg: Any) -> Tuple[Optional[Tuple[int, ...]], str]:
    """``(positive candidate depths, "")`` when depth mode applies to this adaptive worker, else
    ``(None, why not)``."""
    controller = getattr(worker, "adaptive_controller", None)
    if controller is None:
        return None, "no adaptive controller on this rank"
    if int(getattr(worker, "topk", 1)) != 1:
        return None, "chains only (topk 1)"
    if not getattr(cfg, "auto", False):
        return None, "depth choice needs --dcut auto"
    depths = tuple(sorted({int(s) for s in controller.params.candidate_steps if int(s) > 0}))
    if not depths:
        return None, "no positive candidate step count"
    return depths, ""


@dataclass
class DepthMode:
    """Per-worker state of depth mode (owned by ``DCutRunner.depth``)."""

    depths: Tuple[int, ...]  # positive candidate depths, increasing; the table's columns
    initial: int  # depth used before a cost table exists
    params: DepthParams = field(default_factory=DepthParams)
    model: ChainAcceptance = None  # type: ignore[assignment]  # set in __post_init__
    tiers: Tuple[float, ...] = field(init=False)  # (s + 1) / (S + 1) per depth: the cost table's columns
    gains: Tuple[float, ...] = field(init=False)  # E(s) of every depth under ``model`` (kept by learn)
    state: DepthState = field(default_factory=DepthState)
    # (batch size, depth) of each decode step issued and not yet observed (overlap scheduling
    # processes a step's results after the next step started); depth 0 = a draft-off step
    pending: Deque[Tuple[int, int]] = field(default_factory=lambda: collections.deque(maxlen=8))
    observed_steps: int = 0
    dropped_observations: int = 0

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = ChainAcceptance.empty(self.max_depth)
        self.tiers = depth_tiers(self.depths, self.max_depth)
        self._update_gains()

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    def _update_gains(self) -> None:
        self.gains = depth_gains(self.model, self.depths, self.params.prior, self.params.prior_weight)

    def learn(self, accepted: Sequence[int], depth: int) -> None:
        """Fold one verified step drafted to ``depth`` into the model (and the gains)."""
        self.model = observe_chain_accepts(self.model, accepted, depth, self.params.discount)
        self.observed_steps += 1
        self._update_gains()

    def depth_at_ratio(self, ratio: float) -> int:
        """The shallowest depth whose tier is at least ``ratio`` (a forced / profiled column)."""
        for d, t in zip(self.depths, self.tiers):
            if t >= float(ratio) - 1e-9:
                return d
        return self.max_depth

    def summary(self) -> dict:
        return {"depths": list(self.depths), "current": self.state.depth,
                "acceptance": [None if r is None else round(r, 4)
                               for r in self.model.rates(self.params.prior, self.params.prior_weight)],
                "observed_steps": self.observed_steps, "dropped_observations": self.dropped_observations}


class DCutDepthPolicy:
    """SGLang's ``AdaptiveSpecPolicy`` answered by D-Cut's depth choice (see the module docstring).

    ``base`` is SGLang's own policy object (``AdaptiveSpeculativeParams``): its candidate steps
    size the runtime states; every candidate is built for every CUDA-graph batch size, since the
    depth choice may pick any of them at any batch size.
    """

    def __init__(self, runner: Any, base: Any):
        self.runner = runner
        self.base = base
        self._graph_bs: Optional[List[int]] = None

    @property
    def candidate_steps(self) -> List[int]:
        return list(self.base.candidate_steps)

    def set_cuda_graph_bs(self, cuda_graph_bs: Optional[List[int]]) -> None:
        self._graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> Optional[List[int]]:
        return None if self._graph_bs is None else list(self._graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.runner.depth_for_step(int(batch_size))

    def on_verify_complete(self, num_correct_drafts_per_req: Sequence[int], batch_size: int) -> Optional[int]:
        self.runner.observe_depth(num_correct_drafts_per_req, int(batch_size))
        return None  # the next step's depth is chosen by get_steps_for_batch

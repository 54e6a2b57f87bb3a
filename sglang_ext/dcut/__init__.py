"""D-Cut: batch-level pruning of draft tokens before target verification (pure torch).

Pure math only: this package imports torch, numpy and the standard library, never sglang.
The SGLang glue (``sglang_ext.engine``) calls these functions and nothing else:

* confidences and survival scores: :func:`confidence_from_logits`,
  :func:`confidence_from_probs`, :func:`chain_survival`, :func:`tree_survival`;
* the planner: :func:`choose` (tier + global top-K) -> :class:`DCutPlan`; the mode table
  :data:`TIER_POLICIES` (one function per tier policy) and :func:`parse_mode`;
* the draft-off choice of ``auto``: :func:`draft_off_decision`, :class:`DraftOffParams`;
* tiers: :func:`keep_count` (bonus-inclusive, exact), :data:`DEFAULT_TIERS`,
  :data:`FALLBACK_RATIO`;
* the cost table: :class:`CostTable`, :class:`CostTableKey`, :class:`CostTableError`;
* trees: :class:`TreeTopology`, :func:`cut_links` (same layout, pruned nodes unreachable),
  :func:`compact_tree` (ragged verify inputs), :func:`build_full_mask` (FULL_MASK layout),
  :func:`scatter_to_full` (outputs back to the strided layout);
* the catch-up draft extend after draft-off steps: :func:`catch_up_layout` (ragged rows in
  SGLang's uniform window), :func:`row_offsets`; its cost, charged to the off steps that cause
  it: :class:`~sglang_ext.dcut.switch_cost.CatchUpCost`;
* online calibration of the survival scores for the tier choice:
  :class:`~sglang_ext.dcut.calibration.PowerCalibration` (``s -> s ** tau``, monotone).

A typical chain step::

    conf = confidence_from_logits(draft_logits)            # [bs, K]
    plan = choose(chain_survival(conf).scores, table)      # tier + keep_lens
    keep = chain_keep_mask(plan.keep_lens, K + 1)          # [bs, N]
    ct = compact_tree(keep, draft_token, positions, nt, ns, num_tokens=plan.verify_width)
"""

from sglang_ext.dcut.budget import Ranking, rank_chain, rank_tree, select, top_sums
from sglang_ext.dcut.catch_up import CatchUpLayout, catch_up_layout, row_offsets
from sglang_ext.dcut.cost_table import (
    COST_TABLE_VERSION,
    CostTable,
    CostTableError,
    CostTableKey,
)
from sglang_ext.dcut.draft_off import (
    DRAFT_OFF_TIER,
    DraftOffDecision,
    DraftOffParams,
    DraftOffState,
    draft_off_decision,
    observe_draft_gains,
    probe_wait,
)
from sglang_ext.dcut.planner import (
    MODE_AUTO,
    MODE_FALLBACK,
    MODE_OFF,
    MODE_RATIO,
    TIER_POLICIES,
    DCutMode,
    DCutPlan,
    PolicyInput,
    TierChoice,
    choose,
    forward_costs,
    parse_mode,
    reset_fallback_warning,
)
from sglang_ext.dcut.scores import (
    INELIGIBLE_SCORE,
    SurvivalScores,
    chain_survival,
    confidence_from_logits,
    confidence_from_probs,
    tree_survival,
)
from sglang_ext.dcut.tiers import (
    DEFAULT_TIERS,
    FALLBACK_RATIO,
    NO_TIER,
    keep_count,
    page_keep_count,
    smallest_fitting_tier,
    tier_keep_counts,
)
from sglang_ext.dcut.compaction import (
    CompactTree,
    build_full_mask,
    compact_tree,
    scatter_to_full,
    tree_block_from_full_mask,
)
from sglang_ext.dcut.tree import (
    NO_LINK,
    NO_PARENT,
    NOT_KEPT,
    PAD_INDEX,
    UNREACHABLE_DEPTH,
    TreeTopology,
    ancestor_mask,
    chain_keep_mask,
    chain_retrive,
    cut_links,
    parents_from_retrive,
    path_reduce,
    retrive_from_parents,
)

__all__ = [
    "COST_TABLE_VERSION",
    "CatchUpLayout",
    "catch_up_layout",
    "row_offsets",
    "CompactTree",
    "CostTable",
    "CostTableError",
    "CostTableKey",
    "DCutMode",
    "DCutPlan",
    "DEFAULT_TIERS",
    "DRAFT_OFF_TIER",
    "DraftOffDecision",
    "DraftOffParams",
    "DraftOffState",
    "FALLBACK_RATIO",
    "INELIGIBLE_SCORE",
    "MODE_AUTO",
    "MODE_FALLBACK",
    "MODE_OFF",
    "MODE_RATIO",
    "NO_LINK",
    "NO_PARENT",
    "NO_TIER",
    "NOT_KEPT",
    "PAD_INDEX",
    "PolicyInput",
    "Ranking",
    "SurvivalScores",
    "TIER_POLICIES",
    "TierChoice",
    "TreeTopology",
    "UNREACHABLE_DEPTH",
    "ancestor_mask",
    "build_full_mask",
    "chain_keep_mask",
    "chain_retrive",
    "chain_survival",
    "choose",
    "compact_tree",
    "confidence_from_logits",
    "confidence_from_probs",
    "cut_links",
    "draft_off_decision",
    "forward_costs",
    "keep_count",
    "observe_draft_gains",
    "page_keep_count",
    "parents_from_retrive",
    "parse_mode",
    "path_reduce",
    "probe_wait",
    "rank_chain",
    "rank_tree",
    "reset_fallback_warning",
    "retrive_from_parents",
    "scatter_to_full",
    "select",
    "smallest_fitting_tier",
    "tier_keep_counts",
    "top_sums",
    "tree_block_from_full_mask",
    "tree_survival",
]

"""Per-node draft confidences, captured while the EAGLE/EAGLE3 draft drafts (SGLang glue).

D-Cut ranks draft nodes by survival scores and SpecExit's training-free signal
(``--specexit-signal-source draft-confidence``) averages the draft's confidences over the
accepted run. SGLang 0.5.23 keeps neither for chains: with ``topk = 1`` it stores the
placeholder probability 1.0 (``docs/sglang_internals.md#draft-confidences``). This module captures them.

What the worker gets, once per verify step
------------------------------------------
:meth:`DraftCapture.scores_for_verify` returns a :class:`DraftScores` for the batch that is
about to be verified (node ``k`` of request ``b`` is global node ``b * N + k``, node 0 is the
root = the previous bonus token, ``N = --speculative-num-draft-tokens``):

* ``confidence`` ``[batch_size, num_draft_tokens]`` float32: the draft's probability of node
  ``k`` given its parent (its own proposal); ``confidence[:, 0] = 1`` (root);
* ``survival`` ``[batch_size, num_draft_tokens]`` float32: the product of ``confidence`` on
  the root -> node path (chains: prefix products; trees: SGLang's own EAGLE-2 path scores);
  ``survival[:, 0] = 1``; ``INELIGIBLE_SCORE`` (-inf) where a confidence was not finite;
* ``valid``: False when this step's draft was not captured (e.g. ``speculative_num_steps = 0``,
  or a read after the step's draft extend started); the values must not drive decisions then.
  Any number of readers may read the same step (D-Cut before verify, SpecExit after it).

Where each number comes from
----------------------------
==========================  =============================================================
node                        source
==========================  =============================================================
chain ``d_1`` (node 1)      ``spec_info.topk_p`` at draft time: the previous step's draft
                            extend (``_draft_extend_for_decode``), where this module replaces
                            SGLang's 1.0 by the max-softmax of the selected draft logits,
                            ``exp(max - logsumexp)``; after a prefill it is already the real
                            probability (``_draft_extend_for_prefill``)
chain ``d_2 .. d_S``        max-softmax of the logits of draft step ``i = 0 .. S - 2``
                            (``draft_forward``), written to column ``i + 2``
tree node ``i >= 1``        ``flat_scores[b, top_scores_index[b, i - 1]]`` of SGLang's
                            ``organize_draft_results`` (real path products); the per-node
                            confidence is ``path[i] / path[parent(i)]``
sampled drafting            ``q(x)`` from ``verify_input.draft_probs`` (rejection sampling)
==========================  =============================================================

Worked example (bs = 1, chain, N = 4): previous draft extend proposes ``d_1`` with max-softmax
0.9; draft steps 0 and 1 propose ``d_2``, ``d_3`` with 0.5 and 0.8::

    confidence = [[1.0, 0.9, 0.5, 0.8]]
    survival   = [[1.0, 0.9, 0.45, 0.36]]

Graph safety. The chain confidences live in a persistent ``[max_rows, N]`` buffer
(``node_conf``) and the tree path scores in another (``path_score``), allocated before the
draft CUDA graphs are captured. Every write is a fixed-shape in-place copy into rows
``[:rows]``, so ``EAGLEDraftCudaGraphRunner`` (which captures ``draft_forward``) replays it;
only rows ``[:batch_size]`` are valid after a padded replay. The draft-extend fix runs
outside any graph (on the runner's returned, row-selected logits).

How it is wired (see ``patches/``):

* the worker's ``EagleDraftWorker`` instance is re-classed to a subclass (:func:`install`)
  whose ``draft_forward`` / ``_draft_extend_for_decode`` / ``_draft_extend_for_prefill`` /
  ``init_cuda_graphs`` call SGLang's and add the capture; the draft ``ModelRunner.forward`` and the draft-extend graph runner's
  ``execute`` are wrapped per instance to see the logits they return;
* an AROUND hook on ``sglang.srt.speculative.eagle_utils.organize_draft_results``
  (:func:`register_hooks`, called from the plugin) records tree path scores while a capture
  is active and is a pass-through otherwise.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Type

import torch

from sglang_ext.dcut.scores import INELIGIBLE_SCORE, chain_survival, confidence_from_logits, confidence_from_probs
from sglang_ext.dcut.tree import NO_PARENT, TreeTopology

logger = logging.getLogger(__name__)

__all__ = [
    "DraftScores",
    "DraftCapture",
    "install",
    "register_hooks",
    "HOOK_ORGANIZE_DRAFT_RESULTS",
    "ROOT_CONFIDENCE",
]

HOOK_ORGANIZE_DRAFT_RESULTS = "sglang.srt.speculative.eagle_utils.organize_draft_results"
ROOT_CONFIDENCE = 1.0
"""Confidence and survival of node 0 (the root: the previous bonus, already committed)."""

_MODE_IDLE = 0
_MODE_DRAFT = 1
_MODE_EXTEND = 2
_MODE_PREFILL = 3  # the draft extend of a prefill (its logits: one row per request)

_active = threading.local()  # .capture: the DraftCapture whose draft_forward is running


def _active_capture() -> Optional["DraftCapture"]:
    return getattr(_active, "capture", None)


@dataclass(frozen=True)
class DraftScores:
    """Per-node draft confidences of one verify step (see the module docstring).

    Attributes
    ----------
    confidence : torch.Tensor
        ``[batch_size, num_draft_tokens]`` float32, node given its parent; column 0 = 1.
    survival : torch.Tensor
        ``[batch_size, num_draft_tokens]`` float32 root -> node path products; column 0 = 1;
        ``INELIGIBLE_SCORE`` after a non-finite confidence.
    is_tree : bool
        ``topk > 1`` (survival = SGLang's path scores) or a chain.
    valid : bool
        False when this step's draft was not captured (values are then all ones).
    """

    confidence: torch.Tensor  # [batch_size, num_draft_tokens]
    survival: torch.Tensor  # [batch_size, num_draft_tokens]
    is_tree: bool
    valid: bool

    @property
    def draft_survival(self) -> torch.Tensor:  # [batch_size, num_draft_tokens - 1]
        """Chain survival of the drafts only (root column dropped), the planner's chain input."""
        return self.survival[:, 1:]


class DraftCapture:
    """Persistent confidence buffers of one EAGLE draft worker and the logic that fills them.

    Parameters
    ----------
    topk : int
        ``--speculative-eagle-topk``.
    num_steps : int
        ``speculative_num_steps`` (S).
    num_draft_tokens : int
        ``--speculative-num-draft-tokens`` (N).
    device : str or torch.device
        Where the buffers live (the draft's device).
    max_rows : int
        Initial buffer rows (grown on demand outside graph capture).

    Examples
    --------
    >>> cap = DraftCapture(topk=1, num_steps=3, num_draft_tokens=4, device="cpu", max_rows=2)
    >>> cap.begin_draft(torch.tensor([[0.9], [0.6]]), rows=2)
    >>> cap.record_step_logits(torch.log(torch.tensor([[0.5, 0.5], [0.8, 0.2]])))
    >>> cap.record_step_logits(torch.log(torch.tensor([[0.25, 0.75], [1.0, 0.0]])))
    >>> cap.end_draft()
    >>> s = cap.scores(2)
    >>> s.confidence.mul(100).round().tolist()
    [[100.0, 90.0, 50.0, 75.0], [100.0, 60.0, 80.0, 100.0]]
    >>> s.survival.mul(1000).round().tolist()
    [[1000.0, 900.0, 450.0, 338.0], [1000.0, 600.0, 480.0, 480.0]]
    """

    def __init__(self, *, topk: int, num_steps: int, num_draft_tokens: int, device: Any, max_rows: int = 1):
        self.topk = int(topk)
        self.num_steps = int(num_steps)
        self.num_draft_tokens = int(num_draft_tokens)
        self.device = torch.device(device)
        self.node_conf = torch.empty(0)  # [max_rows, num_draft_tokens] chain confidences
        self.path_score = torch.empty(0)  # [max_rows, num_draft_tokens] tree path scores
        self._mode = _MODE_IDLE
        self._step = 0
        self._rows = 0  # rows written by the last draft (0: nothing captured since the last read)
        self._extend_logits_owner: Any = None
        #: Optional ``(original_forward, args, kwargs) -> output`` that runs the draft runner's
        #: forward while a draft extend is active, in place of a plain call (the accepted-rows
        #: draft extend of :mod:`sglang_ext.engine.dcut.draft_extend`); None = plain call.
        self.extend_forward: Optional[Callable] = None
        #: Optional ``(forward_batch, next_token_logits) -> None`` called with every row's logits of
        #: each draft extend after a verify, before SGLang selects one row per request (SpecExit's
        #: per-token ``draft-confidence``); while set, the draft-extend CUDA graph is not replayed
        #: (it selects the rows before the LM head). None = nothing.
        self.extend_rows_sink: Optional[Callable] = None
        #: Optional ``(forward_batch, next_token_logits) -> None`` called with the logits of a
        #: prefill's draft extend (one row per request: its last prompt row). None = nothing.
        self.prefill_rows_sink: Optional[Callable] = None
        self.allocate(max_rows)

    # ------------------------------------------------------------------ buffers
    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def max_rows(self) -> int:
        return int(self.node_conf.shape[0])

    def allocate(self, max_rows: int) -> None:
        """(Re)allocate the persistent buffers with at least ``max_rows`` rows, filled with 1."""
        rows = max(1, int(max_rows))
        n = self.num_draft_tokens
        self.node_conf = torch.ones((rows, n), dtype=torch.float32, device=self.device)
        self.path_score = torch.ones((rows, n), dtype=torch.float32, device=self.device)

    def _ensure_rows(self, rows: int) -> None:
        if rows <= self.max_rows:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"draft capture: {rows} rows exceed the {self.max_rows} allocated before graph capture")
        self.allocate(max(rows, 2 * self.max_rows))

    # ------------------------------------------------------------------ draft steps
    def begin_draft(
        self,
        first_topk_p: Optional[torch.Tensor],  # [rows, topk] spec_info.topk_p at draft time
        rows: int,
    ) -> None:
        """Start capturing one ``draft_forward``: chains take ``d_1``'s confidence from ``topk_p``."""
        self._mode = _MODE_DRAFT
        self._step = 0
        self._rows = 0
        if rows <= 0:
            return
        self._ensure_rows(rows)
        if not self.is_tree and first_topk_p is not None and first_topk_p.numel() >= rows:
            self.node_conf[:rows, 1].copy_(first_topk_p.reshape(rows, -1)[:, 0])
        self._rows = rows

    def record_step_logits(
        self,
        logits: torch.Tensor,  # [rows * topk, vocab_size] draft logits of draft step self._step
    ) -> None:
        """Chains: write the max-softmax of draft step ``i`` into column ``i + 2``."""
        step = self._step
        self._step += 1
        if self.is_tree or self._rows == 0:
            return
        col = step + 2
        if col >= self.num_draft_tokens:
            return
        rows = min(self._rows, logits.shape[0])
        self.node_conf[:rows, col].copy_(confidence_from_logits(logits[:rows]))

    def record_tree(
        self,
        score_list: List[torch.Tensor],  # per step [rows, 1 or topk, topk] cumulative path scores
        top_scores_index: torch.Tensor,  # [rows, num_draft_tokens - 1] sorted flat indices
    ) -> None:
        """Trees: node ``i >= 1`` gets ``flat_scores[b, top_scores_index[b, i - 1]]``."""
        if not self.is_tree or self._rows == 0:
            return
        flat = torch.cat(score_list, dim=1).flatten(1)  # [rows, topk + (S - 1) * topk^2]
        rows = min(self._rows, flat.shape[0])
        self.path_score[:rows, 1:].copy_(flat[:rows].gather(1, top_scores_index[:rows].to(torch.int64)))

    def end_draft(self) -> None:
        self._mode = _MODE_IDLE

    # ------------------------------------------------------------------ draft extend (d_1 of the next step)
    def begin_extend(self) -> None:
        """Start the draft extend that follows a verify: this step's scores were consumed by then
        (D-Cut before the target forward, SpecExit after it), so later reads report ``valid=False``
        until the next ``draft_forward``."""
        self._mode = _MODE_EXTEND
        self._extend_logits_owner = None
        self._rows = 0

    def record_extend_output(self, logits_output: Any) -> None:
        """Remember the draft-extend ``LogitsProcessorOutput`` (rows are selected afterwards)."""
        self._extend_logits_owner = logits_output

    def end_extend(self, next_draft_input: Any, batch_size: int) -> None:
        """topk = 1: replace SGLang's placeholder ``topk_p = 1`` by the max-softmax of the selected
        draft-extend logits, so the next ``draft_forward`` reads ``d_1``'s real confidence."""
        self._mode = _MODE_IDLE
        owner, self._extend_logits_owner = self._extend_logits_owner, None
        if self.is_tree or owner is None or next_draft_input is None or batch_size <= 0:
            return
        logits = getattr(owner, "next_token_logits", None)
        topk_p = getattr(next_draft_input, "topk_p", None)
        if logits is None or topk_p is None or logits.shape[0] < batch_size:
            return
        conf = confidence_from_logits(logits[:batch_size]).unsqueeze(1)  # [bs, 1]
        next_draft_input.topk_p = conf.to(topk_p.dtype)

    # ------------------------------------------------------------------ read-out
    def scores(
        self,
        batch_size: int,
        retrieve_next_token: Optional[torch.Tensor] = None,  # [batch_size, num_draft_tokens] (trees)
        retrieve_next_sibling: Optional[torch.Tensor] = None,  # [batch_size, num_draft_tokens] (trees)
        draft_probs: Optional[torch.Tensor] = None,  # [batch_size, S, vocab_size] sampled drafting
        draft_token: Optional[torch.Tensor] = None,  # [batch_size * num_draft_tokens] (with draft_probs)
    ) -> DraftScores:
        """Confidences and survival of the last captured draft, rows ``[:batch_size]`` (copies).

        Trees need the verify input's links (``retrieve_next_*``) for the per-node
        confidences; sampled chains (``draft_probs``) use ``q(x)`` of the draft tokens.
        """
        n = self.num_draft_tokens
        bs = int(batch_size)
        valid = self._rows >= bs and bs > 0
        if bs > self.max_rows:
            ones = torch.ones((bs, n), dtype=torch.float32, device=self.device)
            return DraftScores(ones, ones.clone(), self.is_tree, False)
        if not self.is_tree:
            conf = self.node_conf[:bs].clone()
            if draft_probs is not None and draft_token is not None and bs > 0:
                steps = min(draft_probs.shape[1], n - 1)
                tokens = draft_token.reshape(bs, n)[:, 1 : steps + 1]
                conf[:, 1 : steps + 1] = confidence_from_probs(draft_probs[:bs, :steps], tokens)
            conf[:, 0] = ROOT_CONFIDENCE
            surv = torch.empty_like(conf)
            surv[:, 0] = ROOT_CONFIDENCE
            surv[:, 1:] = chain_survival(conf[:, 1:]).scores
            return DraftScores(conf, surv, False, valid)
        path = self.path_score[:bs].clone()
        path[:, 0] = ROOT_CONFIDENCE
        if retrieve_next_token is not None and retrieve_next_sibling is not None:
            parent = TreeTopology.from_retrive(retrieve_next_token[:bs], retrieve_next_sibling[:bs]).parent
            safe = torch.where(parent == NO_PARENT, torch.zeros_like(parent), parent)
            parent_path = path.gather(1, safe)
            conf = torch.where(parent_path > 0, path / parent_path.clamp_min(torch.finfo(torch.float32).tiny),
                               torch.zeros_like(path))
            conf[:, 0] = ROOT_CONFIDENCE
        else:
            conf = torch.ones_like(path)
        surv = torch.where(torch.isfinite(path), path, torch.full_like(path, INELIGIBLE_SCORE))
        return DraftScores(conf, surv, True, valid)

    def scores_for_verify(self, verify_input: Any, batch_size: int) -> DraftScores:
        """:meth:`scores` for an ``EagleVerifyInput`` (uses its links and ``draft_probs``)."""
        return self.scores(
            batch_size,
            retrieve_next_token=getattr(verify_input, "retrieve_next_token", None),
            retrieve_next_sibling=getattr(verify_input, "retrieve_next_sibling", None),
            draft_probs=getattr(verify_input, "draft_probs", None),
            draft_token=getattr(verify_input, "draft_token", None),
        )

    def mark_consumed(self) -> None:
        """Forget the last draft (a later read without a new draft reports ``valid=False``)."""
        self._rows = 0


# ---------------------------------------------------------------------- per-instance wrappers
_WRAPPED_ATTR = "_sglang_ext_draft_capture"


def _wrap_runner_forward(runner: Any, capture: DraftCapture) -> None:
    """Wrap ``runner.forward`` (the draft ``ModelRunner``) on this instance only."""
    if getattr(runner.forward, _WRAPPED_ATTR, None) is capture:
        return
    original = runner.forward

    def forward(*args, **kwargs):
        if capture._mode == _MODE_EXTEND and capture.extend_forward is not None:
            out = capture.extend_forward(original, args, kwargs)
        else:
            out = original(*args, **kwargs)
        mode = capture._mode
        if mode != _MODE_IDLE:
            logits_output = getattr(out, "logits_output", None)
            if logits_output is not None and mode == _MODE_PREFILL:
                if capture.prefill_rows_sink is not None:
                    forward_batch = args[0] if args else kwargs.get("forward_batch")
                    capture.prefill_rows_sink(forward_batch, logits_output.next_token_logits)
            elif logits_output is not None:
                if mode == _MODE_DRAFT:
                    capture.record_step_logits(logits_output.next_token_logits)
                else:
                    capture.record_extend_output(logits_output)
                    if capture.extend_rows_sink is not None:
                        forward_batch = args[0] if args else kwargs.get("forward_batch")
                        capture.extend_rows_sink(forward_batch, logits_output.next_token_logits)
        return out

    setattr(forward, _WRAPPED_ATTR, capture)
    runner.forward = forward


def _wrap_extend_graph_runner(graph_runner: Any, capture: DraftCapture) -> None:
    """Wrap ``EAGLEDraftExtendCudaGraphRunner.execute`` on this instance (returns selected rows),
    and its ``can_run_graph``: False while ``capture.extend_rows_sink`` needs every row's logits."""
    if graph_runner is None or getattr(graph_runner.execute, _WRAPPED_ATTR, None) is capture:
        return
    original = graph_runner.execute
    original_can_run = graph_runner.can_run_graph

    def execute(*args, **kwargs):
        out = original(*args, **kwargs)
        if capture._mode == _MODE_EXTEND:
            capture.record_extend_output(out)
        return out

    def can_run_graph(*args, **kwargs):
        if capture.extend_rows_sink is not None:
            return False  # the graph selects one row per request before the LM head
        return original_can_run(*args, **kwargs)

    setattr(execute, _WRAPPED_ATTR, capture)
    graph_runner.execute = execute
    graph_runner.can_run_graph = can_run_graph


def _capture_methods(cls_ref: List[type]) -> Dict[str, Callable]:
    """Methods of the re-classed ``EagleDraftWorker`` (each calls SGLang's own first/around).

    The subclass is built with the SGLang class as its only base (a mixin base would change the
    instance layout, which ``__class__`` assignment refuses), so ``super`` is spelled out.
    """

    def init_cuda_graphs(self):
        # Size the persistent buffers before the draft graphs are captured.
        self._ext_capture.allocate(max(self._ext_capture.max_rows, _max_batch_rows(self)))
        _wrap_runner_forward(self.draft_runner, self._ext_capture)
        return super(cls_ref[0], self).init_cuda_graphs()

    def draft_forward(self, forward_batch):
        cap = self._ext_capture
        _wrap_runner_forward(self.draft_runner, cap)
        idle = forward_batch.forward_mode.is_idle()
        rows = 0 if idle else int(forward_batch.batch_size)
        cap.begin_draft(None if idle else getattr(forward_batch.spec_info, "topk_p", None), rows)
        _active.capture = cap
        try:
            return super(cls_ref[0], self).draft_forward(forward_batch)
        finally:
            _active.capture = None
            cap.end_draft()

    def draft(self, batch, **kwargs):
        # A draft CUDA-graph replay runs the captured draft_forward kernels (buffer writes included)
        # without calling draft_forward in Python: record the valid rows here for both paths.
        cap = self._ext_capture
        cap._rows = 0
        out = super(cls_ref[0], self).draft(batch, **kwargs)
        if not batch.forward_mode.is_idle():
            cap._rows = max(cap._rows, len(batch.seq_lens))
        return out

    def _draft_extend_for_decode(self, batch, batch_result, **kwargs):
        cap = self._ext_capture
        _wrap_runner_forward(self.draft_runner, cap)
        _wrap_extend_graph_runner(getattr(self, "cuda_graph_runner_for_draft_extend", None), cap)
        cap.begin_extend()
        try:
            out = super(cls_ref[0], self)._draft_extend_for_decode(batch, batch_result, **kwargs)
        except BaseException:
            cap._mode = _MODE_IDLE
            raise
        if _rejection_sampling():
            cap._mode = _MODE_IDLE  # topk_p already carries q(x)
        else:
            cap.end_extend(batch_result.next_draft_input, len(batch.seq_lens))
        return out

    def _draft_extend_for_prefill(self, *args, **kwargs):
        cap = self._ext_capture
        _wrap_runner_forward(self.draft_runner, cap)
        cap._mode = _MODE_PREFILL
        try:
            return super(cls_ref[0], self)._draft_extend_for_prefill(*args, **kwargs)
        finally:
            cap._mode = _MODE_IDLE

    return {
        "_draft_extend_for_prefill": _draft_extend_for_prefill,
        "draft": draft,
        "init_cuda_graphs": init_cuda_graphs,
        "draft_forward": draft_forward,
        "_draft_extend_for_decode": _draft_extend_for_decode,
    }


def _rejection_sampling() -> bool:
    from sglang.srt.runtime_context import get_spec

    return bool(get_spec().speculative_use_rejection_sampling)


def _max_batch_rows(draft_worker: Any) -> int:
    rows = 1
    pool = getattr(draft_worker, "req_to_token_pool", None)
    if pool is not None:
        rows = max(rows, int(getattr(pool, "size", 0) or 0))
    try:
        from sglang.srt.runtime_context import get_exec

        bs_list = get_exec().graph.cuda_graph_bs_decode
        if bs_list:
            rows = max(rows, max(int(b) for b in bs_list))
    except Exception:  # no runtime context (unit tests) or no graph settings
        pass
    return rows + 1


_CLASS_CACHE: Dict[type, type] = {}


def _capture_class(base: Type) -> Type:
    """``base`` plus the capture methods (cached per base class)."""
    cls = _CLASS_CACHE.get(base)
    if cls is None:
        ref: List[type] = []
        cls = type(f"Capture{base.__name__}", (base,), {"__module__": __name__, **_capture_methods(ref)})
        ref.append(cls)
        _CLASS_CACHE[base] = cls
    return cls


def install(spec_worker: Any) -> Optional[DraftCapture]:
    """Attach a :class:`DraftCapture` to an ``EAGLEWorkerV2``'s draft worker (idempotent).

    Re-classes the ``EagleDraftWorker`` instance to a subclass that adds the capture around
    SGLang's own ``draft_forward`` / ``_draft_extend_for_decode``. Call it right after
    ``EAGLEWorkerV2.__init__`` (before the draft graphs are captured). Returns None on a
    pipeline stage that hosts no draft.

    Examples
    --------
    >>> cap = install(worker)  # doctest: +SKIP
    >>> scores = cap.scores_for_verify(batch.spec_info, len(batch.seq_lens))  # doctest: +SKIP
    """
    draft = getattr(spec_worker, "_draft_worker", None)
    if draft is None:
        return None
    existing = getattr(draft, "_ext_capture", None)
    if isinstance(existing, DraftCapture):
        return existing
    capture = DraftCapture(
        topk=int(draft.topk),
        num_steps=int(draft.speculative_num_steps),
        num_draft_tokens=int(draft.speculative_num_draft_tokens),
        device=draft.device,
        max_rows=_max_batch_rows(draft),
    )
    draft._ext_capture = capture
    draft.__class__ = _capture_class(type(draft))
    _wrap_runner_forward(draft.draft_runner, capture)
    return capture


# ---------------------------------------------------------------------- HookRegistry hook
def around_organize_draft_results(original_fn: Callable, *args, **kwargs):
    """AROUND hook: SGLang's ``organize_draft_results(score_list, token_list, parents_list,
    num_draft_token)``, plus tree path-score capture when a :class:`DraftCapture` is active on
    this thread (pass-through otherwise)."""
    out = original_fn(*args, **kwargs)
    cap = _active_capture()
    if cap is not None and cap.is_tree:
        score_list = args[0] if args else kwargs["score_list"]
        cap.record_tree(score_list, out[1])
    return out


def register_hooks() -> None:
    """Register this module's ``HookRegistry`` hook (called from the plugin's ``register_hooks``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if any(h is around_organize_draft_results for _, h, _ in HookRegistry._hooks.get(HOOK_ORGANIZE_DRAFT_RESULTS, ())):
        return
    HookRegistry.register(HOOK_ORGANIZE_DRAFT_RESULTS, around_organize_draft_results, HookType.AROUND)

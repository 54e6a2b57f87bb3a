"""Deferred draft extend of D-Cut draft-off steps (SGLang glue; ``--dcut-draft-off-extend defer``).

SGLang's zero-step round (``patches/zero_step_draft_off.md``) still runs the draft extend over one
row per request after its one-node verify, so that the draft's KV and hidden state stay current
for the next drafted step. That extend is a visible share of a draft-off step on an eager runner
(on the CPU testbed about 20 ms per call at bs 64 however few rows it runs: its cost is mostly
per call, not per row). SGLang's own way to skip it (``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND``)
leaves the draft stale. Here the extend of a draft-off step is deferred instead:

* **defer**: the step keeps, per request, what its draft extend would have read -- the token at
  the row (``next_token_ids``), the target's captured auxiliary hidden state of the verified
  position (``logits_output.hidden_states``, computed by the verify anyway), the KV slot
  (``out_cache_loc``) and the position -- in a :class:`PendingDraftRows`, and fills the next draft
  input with SGLang's shape-valid stubs (``EAGLEWorkerV2._stub_skipped_draft_extend``), which a
  draft-off step never reads. A STANDALONE draft (a small LM of the target's family) reads only the
  tokens and computes its own hidden states, and its verify captures none: its rows keep no hidden
  state, and its catch-up is a forward of the draft LM over the pending tokens;
* **catch up**: the draft-off step *before* drafting resumes runs one draft extend over each
  request's pending rows plus its own row (SGLang's ``_draft_extend_for_decode`` over a ragged
  window laid out by :func:`sglang_ext.dcut.catch_up.catch_up_layout`; the accepted-rows extend
  of :mod:`.draft_extend` runs only the real rows). The draft then holds the KV every skipped
  extend would have written and the next draft input comes from each request's last row, as
  after an ordinary extend.

Which step catches up: the worker asks the D-Cut runner, during a draft-off step's extend,
whether the next step will draft at the current batch size (``DCutRunner.preview_draft_off``);
if it will, this step catches up. Should the next step's choice differ (the batch size moved),
the worker runs that step draft-off once more and catches up there (``flush_requested``), so a
step never drafts from a stale draft. A request's rows are also caught up when they reach
:data:`MAX_PENDING_ROWS`. Requests that leave the batch (finished, retracted) drop their rows; a
request that reappears through a prefill is re-extended by SGLang's prefill. Rows whose
positions do not follow on are dropped with a warning (the draft then misses them: fewer
accepted drafts, never different output -- verification decides every token).

Only the project's own draft-off steps defer; the profiler's forced draft-off steps run SGLang's
extend (the profiled draft-off cost stays the conservative one, the online costs correct it).
With SpecExit's ``draft-confidence`` signal on, no step defers (``every_extend_needed_by``, warned
once): that signal is read from every draft extend's rows before the next exit decision.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from sglang_ext.config import DRAFT_OFF_EXTEND_DEFER
from sglang_ext.dcut.catch_up import catch_up_layout, row_offsets

logger = logging.getLogger(__name__)

MAX_PENDING_ROWS = 64
"""A request's deferred rows are caught up at the latest when it holds this many (bounds the kept
hidden states: ``MAX_PENDING_ROWS * hidden_dim`` values per request)."""


@dataclass
class PendingDraftRows:
    """One request's deferred draft-extend rows, in position order.

    Attributes
    ----------
    first_position : int
        Position of the first row (the rows cover ``first_position .. first_position + n - 1``).
    tokens : list of torch.Tensor
        Per row a 0-d int64 tensor: the token the draft reads at the row (the one verified next).
    hidden : list of torch.Tensor
        Per row ``# [hidden_dim]``: the target's captured auxiliary hidden state of the position
        (empty for a STANDALONE draft, which reads only the tokens).
    slots : list of torch.Tensor
        Per row a 0-d int64 tensor: the KV slot of the position (``out_cache_loc``).
    """

    first_position: int
    tokens: List[torch.Tensor] = field(default_factory=list)
    hidden: List[torch.Tensor] = field(default_factory=list)
    slots: List[torch.Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def next_position(self) -> int:
        return self.first_position + len(self.tokens)


@dataclass
class DeferredExtendStats:
    """Counters (``/server_info`` ``internal_states[i].dcut.draft_off_extend``)."""

    deferred_steps: int = 0
    deferred_rows: int = 0
    catch_ups: int = 0
    caught_up_rows: int = 0  # deferred rows replayed by catch-ups (this step's rows not counted)
    extra_draft_off_steps: int = 0  # steps run draft-off only to catch up before drafting
    dropped_rows: int = 0  # rows of requests that left, or whose positions did not follow on

    def summary(self) -> dict:
        return dict(self.__dict__)


class DeferredDraftExtend:
    """The deferred draft extend of one ``ExtEAGLEWorker`` (see the module docstring).

    Parameters
    ----------
    spec_worker : ExtEAGLEWorker
        Its draft worker runs the catch-ups; its ``_stub_skipped_draft_extend`` fills the stubs.
    mode : str
        ``"defer"`` or ``"always"`` (SGLang's extend on every draft-off step).
    next_step_off : callable
        ``(batch_size) -> bool``: whether the next decode step runs draft-off
        (``DCutRunner.preview_draft_off``).
    """

    def __init__(self, spec_worker: Any, mode: str, next_step_off: Callable[[int], bool]):
        self.spec_worker = spec_worker
        self.mode = mode
        self.next_step_off = next_step_off
        self.pending: Dict[str, PendingDraftRows] = {}  # by request id
        self.flush_requested = False
        #: Why no draft-off step may defer its extend on this worker (None: they may): SpecExit's
        #: ``draft-confidence`` signal reads every draft extend's rows before its next decision.
        self.every_extend_needed_by: Optional[str] = None
        self.stats = DeferredExtendStats()
        self._warned: set = set()
        #: The draft reads only the tokens (and writes its own KV): a STANDALONE draft model, whose
        #: verify captures no target hidden state. Its rows then keep no hidden state.
        algo = getattr(spec_worker, "speculative_algorithm", None)
        self.reads_tokens_only = bool(algo is not None and algo.is_standalone())

    @property
    def enabled(self) -> bool:
        return self.mode == DRAFT_OFF_EXTEND_DEFER

    # ------------------------------------------------------------------ bookkeeping
    def has_pending(self, batch: Any) -> bool:
        return bool(self.pending) and any(r.rid in self.pending for r in batch.reqs)

    def forget_absent(self, batch: Any) -> None:
        """Drop the rows of requests no longer in the decode batch (finished or retracted)."""
        if not self.pending:
            return
        present = {r.rid for r in batch.reqs}
        for rid in [rid for rid in self.pending if rid not in present]:
            self.stats.dropped_rows += len(self.pending.pop(rid))

    def drop(self, reqs: List[Any]) -> None:
        """Drop the rows of these requests (a prefill re-extends their draft)."""
        for r in reqs:
            rows = self.pending.pop(r.rid, None)
            if rows is not None:
                self.stats.dropped_rows += len(rows)

    def summary(self) -> dict:
        return {"mode": self.mode, "pending_requests": len(self.pending),
                "pending_rows": sum(len(p) for p in self.pending.values()), **self.stats.summary()}

    def _warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)

    # ------------------------------------------------------------------ the draft-off step's extend
    def extend(self, original: Callable, batch: Any, batch_result: Any, **kwargs) -> Any:
        """In place of the draft worker's ``_draft_extend_for_decode`` for one draft-off step
        (``original``: SGLang's, bound to the draft worker)."""
        reason = self._not_deferrable(batch, batch_result)
        flush, self.flush_requested = self.flush_requested, False
        if reason is not None:
            if reason != "mode":
                self._warn_once(reason, "D-Cut: draft-off step runs its draft extend (%s)", reason)
            if self.has_pending(batch):
                return self._catch_up(original, batch, batch_result, kwargs)
            return original(batch, batch_result, **kwargs)
        bs = len(batch.reqs)
        full = any(len(self.pending.get(r.rid, ())) + 1 >= MAX_PENDING_ROWS for r in batch.reqs)
        if flush or full or not self.next_step_off(bs):
            return self._catch_up(original, batch, batch_result, kwargs)
        self._defer(batch, batch_result)
        return None

    def _not_deferrable(self, batch: Any, batch_result: Any) -> Optional[str]:
        if not self.enabled:
            return "mode"
        if self.every_extend_needed_by is not None:
            return self.every_extend_needed_by
        if batch.forward_mode.is_idle() or not batch.reqs:
            return "idle batch"
        if getattr(batch, "global_num_tokens", None) is not None:
            return "DP attention"
        lo = getattr(batch_result, "logits_output", None)
        hs = getattr(lo, "hidden_states", None)
        bs = len(batch.reqs)
        if (not self.reads_tokens_only) if hs is None else hs.shape[0] != bs:
            return "no per-request hidden states of the verify"
        if batch_result.next_token_ids is None or batch_result.next_token_ids.shape[0] != bs:
            return "verify output is not one token per request"
        if batch.out_cache_loc is None or batch.out_cache_loc.shape[0] != bs:
            return "verify window is not one slot per request"
        return None

    @staticmethod
    def _positions(batch: Any) -> List[int]:
        src = batch.seq_lens_cpu if getattr(batch, "seq_lens_cpu", None) is not None else batch.seq_lens
        return [int(x) for x in src.tolist()]

    def _current_rows(self, batch: Any, batch_result: Any):
        hs = batch_result.logits_output.hidden_states
        hidden = None if hs is None else hs.detach().clone()  # [bs, hidden_dim]; None: a STANDALONE draft
        tokens = batch_result.next_token_ids.detach().to(torch.int64).clone()  # [bs]
        slots = batch.out_cache_loc.detach().to(torch.int64).clone()  # [bs]
        return tokens, hidden, slots

    def _rows_of(self, rid: str, position: int) -> Optional[PendingDraftRows]:
        rows = self.pending.get(rid)
        if rows is not None and rows.next_position != position:
            self._warn_once("order", "D-Cut: deferred draft-extend rows of a request do not follow on (position %d, "
                            "expected %d): dropped, the draft misses them", position, rows.next_position)
            self.stats.dropped_rows += len(self.pending.pop(rid))
            rows = None
        return rows

    def _defer(self, batch: Any, batch_result: Any) -> None:
        tokens, hidden, slots = self._current_rows(batch, batch_result)
        for b, (req, pos) in enumerate(zip(batch.reqs, self._positions(batch))):
            rows = self._rows_of(req.rid, pos)
            if rows is None:
                rows = self.pending[req.rid] = PendingDraftRows(first_position=pos)
            rows.tokens.append(tokens[b])
            if hidden is not None:
                rows.hidden.append(hidden[b])
            rows.slots.append(slots[b])
        self.spec_worker._stub_skipped_draft_extend(batch, batch_result)
        self.stats.deferred_steps += 1
        self.stats.deferred_rows += len(batch.reqs)

    def _catch_up(self, original: Callable, batch: Any, batch_result: Any, kwargs: dict) -> Any:
        """One draft extend over every request's pending rows plus this step's row."""
        tokens, hidden, slots = self._current_rows(batch, batch_result)
        positions = self._positions(batch)
        tok_rows: List[torch.Tensor] = []
        hid_rows: List[torch.Tensor] = []
        slot_rows: List[torch.Tensor] = []
        counts: List[int] = []
        for b, (req, pos) in enumerate(zip(batch.reqs, positions)):
            rows = self._rows_of(req.rid, pos)
            if rows is not None:
                tok_rows.extend(rows.tokens)
                hid_rows.extend(rows.hidden)
                slot_rows.extend(rows.slots)
            tok_rows.append(tokens[b])
            if hidden is not None:
                hid_rows.append(hidden[b])
            slot_rows.append(slots[b])
            counts.append(0 if rows is None else len(rows))
        for req in batch.reqs:
            self.pending.pop(req.rid, None)
        pending = torch.tensor(counts, dtype=torch.int64)  # [bs]
        if int(pending.sum()) == 0:
            return original(batch, batch_result, **kwargs)
        layout = catch_up_layout(pending)
        device = tokens.device
        index = layout.flat_index(row_offsets(pending + 1)).to(device)  # [bs * width]
        first = [p - c for p, c in zip(positions, counts)]
        # The window starts at each request's first pending position: a surrogate batch (shallow
        # copy, the scheduler's batch is not touched) with those lengths and the rows' slots.
        sb = copy.copy(batch)
        sb.seq_lens = torch.tensor(first, dtype=batch.seq_lens.dtype, device=batch.seq_lens.device)
        if getattr(batch, "seq_lens_cpu", None) is not None:
            sb.seq_lens_cpu = torch.tensor(first, dtype=batch.seq_lens_cpu.dtype)
            sb.seq_lens_sum = int(sum(first))
        sb.out_cache_loc = torch.stack(slot_rows).to(batch.out_cache_loc.dtype)[index]
        res = copy.copy(batch_result)  # next_draft_input is shared: the extend's outputs land there
        res.logits_output = copy.copy(batch_result.logits_output)
        if hidden is not None:  # a STANDALONE draft reads no target hidden state
            res.logits_output.hidden_states = torch.stack(hid_rows)[index]  # [bs * width, hidden_dim]
        res.next_token_ids = torch.stack(tok_rows)[index]  # [bs * width]
        accept_dtype = batch_result.accept_lens.dtype if batch_result.accept_lens is not None else torch.int32
        res.accept_lens = layout.accept_lens.to(device=device, dtype=accept_dtype)
        res.prepared_draft_extend_inputs = None
        draft = self.spec_worker._draft_worker
        saved = draft.speculative_num_draft_tokens
        draft.speculative_num_draft_tokens = layout.width
        try:
            out = original(sb, res, **{**kwargs, "kv_loc_plan": None})
        finally:
            draft.speculative_num_draft_tokens = saved
        self.stats.catch_ups += 1
        self.stats.caught_up_rows += int(pending.sum())
        return out

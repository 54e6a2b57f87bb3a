"""Draft extend over the accepted rows only, on an eager draft runner (SGLang glue).

After every verify, SGLang 0.5.23's ``EagleDraftWorker._draft_extend_for_decode`` runs the draft
model over the whole verify window: ``N = --speculative-num-draft-tokens`` rows per request
(``prepare_for_draft_extend`` sets ``extend_lens = [N] * bs``). Only the first
``accept_lens[b]`` rows of each request are ever used -- the accepted tokens, which the base
verify has already moved to the front of the request's block for trees
(``_finalize_accept_tree_path``; chains are in order anyway):

* their draft KV (the next draft round attends ``seq_lens + accept_lens`` committed tokens);
* the logits and hidden state of the last one (``select_index = b * N + accept_lens[b] - 1``).

Rows past the accepted run write draft KV into slots past the new sequence length (ordinary
over-allocation, rewritten by the next round before anyone reads it) and produce logits nobody
selects. On GPU the fixed width is what the draft-extend CUDA graph replays; on an eager runner
it is pure waste: with 16 draft tokens and about 6 accepted (the trained testbed models), about
10 of every 16 rows.

:class:`AcceptedRowsDraftExtend` runs that forward over the accepted rows only and scatters the
per-row outputs back to the ``bs * N`` layout SGLang selects from, so everything downstream
(row selection, top-k, the draft capture of D-Cut / SpecExit, the next draft round) is
unchanged. It is called by the draft capture's ``ModelRunner.forward`` wrapper while a draft
extend is running (``DraftCapture.extend_forward``) and applies only where it is exact:

* the forward is a ``DRAFT_EXTEND_V2`` over exactly ``bs * N`` rows (no widened window);
* the draft runner's attention backend declares ragged draft extends
  (``supports_ragged_draft_extend``; the project's ``torch_sdpa`` backend does);
* no DP attention / MLP sync, no M-RoPE, no DSA top-k seeding, no row selection inside the
  forward, and every request accepted at least one row.

Anything else runs SGLang's forward unchanged. ``--dcut-draft-extend window`` (or the
``/set_internal_state`` knob ``dcut_draft_extend``) turns it off.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from sglang_ext.config import DRAFT_EXTEND_ACCEPTED, DRAFT_EXTEND_CHOICES, DRAFT_EXTEND_WINDOW  # noqa: F401
from sglang_ext.dcut.compaction import scatter_to_full
from sglang_ext.engine.dcut.compact_verify import reset_token_counts

logger = logging.getLogger(__name__)

RAGGED_DRAFT_EXTEND_FLAG = "supports_ragged_draft_extend"
SKIP_MODE_WINDOW = "mode window"  # skip reason of --dcut-draft-extend window: counted, never warned


def accepted_row_index(
    accept_lens: torch.Tensor,  # [batch_size] int, accepted rows per request (>= 1)
    num_tokens_per_req: int,
) -> torch.Tensor:  # [sum(accept_lens)] int64 flat rows b * N + j, j < accept_lens[b]
    """Rows of the ``bs * N`` draft-extend window that hold accepted tokens.

    Examples
    --------
    >>> accepted_row_index(torch.tensor([2, 1, 3]), 4).tolist()
    [0, 1, 4, 8, 9, 10]
    """
    lens = accept_lens.to(torch.int64)
    bs = lens.shape[0]
    col = torch.arange(num_tokens_per_req, device=lens.device).view(1, -1)  # [1, N]
    keep = col < lens.view(bs, 1)  # [bs, N]
    return torch.nonzero(keep.reshape(-1), as_tuple=False).view(-1)


@dataclass
class DraftExtendRowStats:
    """Counters of :class:`AcceptedRowsDraftExtend` (``/server_info`` ``dcut.draft_extend``)."""

    compacted_forwards: int = 0
    window_forwards: int = 0  # draft extends that ran the full window (mode off or not applicable)
    rows_run: int = 0
    rows_window: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count

    def summary(self) -> dict:
        return {"compacted_forwards": self.compacted_forwards, "window_forwards": self.window_forwards,
                "rows_run": self.rows_run, "rows_window": self.rows_window, "skipped": dict(self.skipped)}


class AcceptedRowsDraftExtend:
    """Runs an eager draft-extend forward over the accepted rows (see the module docstring).

    Parameters
    ----------
    model_runner : sglang ModelRunner
        The draft runner (its attention backend and KV translator are read per call).
    mode : str
        ``"accepted"`` (compact where exact) or ``"window"`` (always SGLang's full window).
    """

    def __init__(self, model_runner: Any, mode: str = DRAFT_EXTEND_ACCEPTED):
        if mode not in DRAFT_EXTEND_CHOICES:
            raise ValueError(f"draft extend rows must be one of {', '.join(DRAFT_EXTEND_CHOICES)}, got {mode!r}")
        self.model_runner = model_runner
        self.mode = mode
        self.stats = DraftExtendRowStats()
        self._warned: set = set()

    # ------------------------------------------------------------------ applicability
    def skip_reason(self, fb: Any) -> Optional[str]:
        """Why this forward must run the full window (None when it can be compacted)."""
        if self.mode != DRAFT_EXTEND_ACCEPTED:
            return SKIP_MODE_WINDOW
        if fb is None or not fb.forward_mode.is_draft_extend_v2():
            return "not a draft extend"
        if not getattr(self.model_runner.attn_backend, RAGGED_DRAFT_EXTEND_FLAG, False):
            return "attention backend has no ragged draft extend"
        spec = fb.spec_info
        n = int(getattr(spec, "num_tokens_per_req", -1) or -1)
        accept = getattr(spec, "num_accept_tokens", None)
        if n <= 0 or accept is None or fb.input_ids is None:
            return "no accept lengths"
        bs = int(accept.shape[0])
        if bs == 0 or int(fb.input_ids.shape[0]) != bs * n or int(getattr(spec, "num_front_tokens", 0) or 0):
            return "window is not bs x num_draft_tokens"
        if getattr(fb, "mrope_positions", None) is not None:
            return "M-RoPE positions"
        if getattr(spec, "dsa_seed_topk_capture", None) is not None:
            return "DSA top-k seeding"
        if getattr(spec, "select_index", None) is not None:
            return "rows selected inside the forward"
        if getattr(fb, "global_num_tokens_cpu", None) is not None:
            return "DP attention / MLP sync"
        return None

    # ------------------------------------------------------------------ the call
    def __call__(self, original: Callable, args: tuple, kwargs: dict):
        fb = args[0] if args else kwargs.get("forward_batch")
        reason = self.skip_reason(fb)
        if reason is None:
            accept = fb.spec_info.num_accept_tokens
            lens = [int(x) for x in accept.tolist()]
            if min(lens) < 1 or max(lens) > int(fb.spec_info.num_tokens_per_req):
                reason = "accept length outside [1, num_draft_tokens]"
        if reason is not None:
            if fb is not None and fb.forward_mode.is_draft_extend_v2():
                self.stats.window_forwards += 1
                if reason != SKIP_MODE_WINDOW:
                    self.stats.skipped[reason] = self.stats.skipped.get(reason, 0) + 1
                    if reason not in self._warned:
                        self._warned.add(reason)
                        logger.warning("draft extend runs the full verify window (%s)", reason)
            return original(*args, **kwargs)
        return self._run_compacted(original, fb, lens, args, kwargs)

    def _run_compacted(self, original: Callable, fb: Any, lens: list, args: tuple, kwargs: dict):
        spec = fb.spec_info
        n = int(spec.num_tokens_per_req)
        bs = len(lens)
        total = bs * n
        device = fb.input_ids.device
        lens_t = torch.tensor(lens, dtype=torch.int32, device=device)  # [bs]
        rows = accepted_row_index(lens_t, n)  # [T]
        num_rows = int(rows.shape[0])
        saved = {name: getattr(fb, name, None) for name in (
            "input_ids", "positions", "out_cache_loc", "out_cache_loc_virtual", "out_cache_loc_is_physical",
            "kv_loc_cols", "spec_info", "extend_seq_lens", "extend_seq_lens_cpu", "extend_start_loc",
            "extend_num_tokens", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "forward_metadata_ready")}
        new_spec = copy.copy(spec)
        if getattr(spec, "hidden_states", None) is not None:
            new_spec.hidden_states = spec.hidden_states.index_select(0, rows)
        fb.spec_info = new_spec
        fb.input_ids = saved["input_ids"].index_select(0, rows)
        fb.positions = saved["positions"].index_select(0, rows)
        plan = getattr(fb, "kv_loc_plan", None)
        translator = getattr(self.model_runner, "kv_index_translator", None)
        if plan is not None and translator is not None:
            plan.bind(fb, translator, cols=rows)
        else:
            fb.out_cache_loc = saved["out_cache_loc"].index_select(0, rows)
        fb.extend_seq_lens = lens_t.to(saved["extend_seq_lens"].dtype) if saved["extend_seq_lens"] is not None else lens_t
        fb.extend_seq_lens_cpu = list(lens)
        fb.extend_start_loc = (torch.cumsum(lens_t, 0) - lens_t).to(
            saved["extend_start_loc"].dtype if saved["extend_start_loc"] is not None else torch.int32)
        fb.extend_num_tokens = num_rows
        # The forward sees the post-write length (SGLang: committed + N); here committed + accepted.
        fb.seq_lens = saved["seq_lens"] - n + lens_t.to(saved["seq_lens"].dtype)
        if saved["seq_lens_cpu"] is not None:
            fb.seq_lens_cpu = saved["seq_lens_cpu"] - n + torch.tensor(lens, dtype=saved["seq_lens_cpu"].dtype)
            fb.seq_lens_sum = int(fb.seq_lens_cpu.sum())
        fb.forward_metadata_ready = False  # the pre-made plan covers the full window: re-plan
        reset_token_counts(fb, self.model_runner.device, is_draft_worker=True)
        try:
            out = original(*args, **kwargs)
        finally:
            # every field the compaction (and plan.bind) changed is in `saved`
            for name, value in saved.items():
                if name in ("out_cache_loc_virtual", "kv_loc_cols") and not hasattr(fb, name):
                    continue
                setattr(fb, name, value)
            reset_token_counts(fb, self.model_runner.device, is_draft_worker=True)
        self.stats.compacted_forwards += 1
        self.stats.rows_run += num_rows
        self.stats.rows_window += total
        lo = getattr(out, "logits_output", None)
        if lo is not None:
            for name in ("next_token_logits", "hidden_states"):
                value = getattr(lo, name, None)
                if isinstance(value, torch.Tensor) and value.shape[0] == num_rows:
                    setattr(lo, name, scatter_to_full(value, rows, total))
        return out

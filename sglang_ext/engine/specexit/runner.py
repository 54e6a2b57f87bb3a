"""SpecExit inside the project's EAGLE3 worker: per-request state, signals, the exit cut.

``ExtEAGLEWorker`` (``sglang_ext/engine/eagle_worker.py``) drives one :class:`SpecExitRunner`:

* ``on_prefill(worker, batch, result)`` after every prefill/extend batch: resolves each
  request's options from ``sampling_params.custom_params``, decides whether it is thinking
  and resets its request-pool slot of the batched :class:`SpecExitState`;
* ``after_verify(worker, batch, verify_input, result)`` after every verify (D-Cut, when on,
  has already run): the signal of every committed token, pushed and tested token by token
  with the exit decision of every thinking request (``SpecExitState.step``), the cut
  (:func:`sglang_ext.engine.specexit.cut.apply_exit_cut`, docs/sglang_internals.md#the-specexit-cut),
  and a step record handed to the scheduler for per-request ``meta_info`` and
  ``/server_info`` (``specexit_report.py``).

Everything in the step path stays on the device: decisions, the cut and the state updates
are vectorised, so the runner adds no host synchronisation (except with the replay trace,
see :data:`TRACE_ENV`).

**Thinking.** A request is thinking iff SGLang marks it ``require_reasoning`` and its output
holds no stop-think token yet, or its prompt (plus output, after a retraction) ends inside
an unclosed ``<think>`` block (the ``qwen3-thinking`` convention). Requests with a grammar
are left alone (the grammar FSM sees the emitted run, and ``</think>`` may be illegal for
it). A prefill-sampled ``</think>`` ends thinking at once.

**Signals.** With ``--specexit-signal-source head`` the draft's SpecExit rows of ``fc``
(``LlamaForCausalLMEagle3SpecExit.specexit_logits``) are applied to the target's captured
EAGLE3 features of the verify window (``logits_output.hidden_states``, rows root..r_a,
front-compacted for trees): one observation per committed token, the bonus excluded (it is
the next step's root and observed there). The target computes these hidden states in every
verify, draft-off steps included, so no deferral delays a signal and the exit is a function
of the committed tokens. With ``draft-confidence`` every committed token is observed with the
draft's one-step confidence at its position (``sglang_ext.specexit.draft_confidence``, "Per
token"), which the draft extends compute: the draft capture hands this runner every row of each
draft extend (``DraftCapture.extend_rows_sink``), kept per slot and position in an
:class:`~sglang_ext.specexit.observation_ring.ObservationRing` until read. At a verify the values
of ``r_0`` and ``r_1`` are known, those of ``r_2..`` only after this step's extend, so the state
runs lagged (``SpecExitState.step(known_columns=2)``: the later ones are pushed first thing next
step) and a step whose ``r_j`` (``j >= 2``) is a boundary the rule could fire at (tested with every
unknown value at its most favourable) is cut short before it (``SpecExitState.truncation``, :func:`~sglang_ext.engine.specexit.cut.apply_truncation`):
the same tokens, committed over one more step. Draft-off steps run their draft extend (no
deferral) while this source is on, so every value exists by the time it is read.

**Inactive.** On a model whose tokenizer has no one-token stop-think string (a non-thinking
model such as SmolLM2, where ``</think>`` is 3 tokens) and no ``--specexit-stop-think-token``
given, :func:`sglang_ext.config.resolve_token_ids` says why; the runner logs one warning,
watches no request (``meta_info`` ``specexit_active`` false, results untouched) and
``/server_info`` shows ``active: false`` with ``inactive_reason``.

**Slot reuse.** State is indexed by request-pool slot. A slot is reset at the prefill of the
request that owns it; the runner remembers the owner (``rid``) of every slot it reset, and a
verify row whose request it did not reset (e.g. a request that arrived with its KV from a
prefill server) is treated as not thinking.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sglang_ext.config import ConfigError, SpecExitConfig, resolve_token_ids
from sglang_ext.engine.specexit.cut import apply_exit_cut, apply_truncation, stop_token_logprobs
from sglang_ext.engine.specexit.report import (
    REPORT_ATTR,
    ROW_FIELDS,
    ExitLog,
    SpecExitDeviceOutput,
    SpecExitRequestReport,
    SpecExitSink,
    SpecExitStats,
)
from sglang_ext.specexit.criterion import PAD_TOKEN, ExitDecision, split_emitted_run
from sglang_ext.specexit.defaults import MAX_WINDOW
from sglang_ext.specexit.draft_confidence import (
    DRAFT_CONFIDENCE_SOURCE,
    KNOWN_COLUMNS,
    OBSERVED_OFFSET,
    draft_confidence_signals,
    max_softmax,
)
from sglang_ext.specexit.observation_ring import ObservationRing
from sglang_ext.specexit.overrides import SpecExitOptionError, SpecExitOptions, options_for_request
from sglang_ext.specexit.signals import (
    NUM_SIGNALS,
    Signal,
    SpecExitMethod,
    SpecExitMethodError,
    decode_signals,
    parse_method,
    strided_token_columns,
)
from sglang_ext.specexit.state import SpecExitState

logger = logging.getLogger(__name__)

#: Environment variable: path of a JSONL file to which every scheduler process appends the
#: runner's resets and per-step inputs/decisions (for replay tests; forces host syncs).
TRACE_ENV = "SGLANG_EXT_SPECEXIT_TRACE"

HEAD_SOURCE = "head"


class SpecExitLaunchError(ConfigError):
    """SpecExit cannot run with this draft/tokenizer/flags; the message names the flag."""


# --------------------------------------------------------------------------- server options
def server_options(cfg: SpecExitConfig) -> SpecExitOptions:
    """The server-level :class:`SpecExitOptions` of the launcher flags (``cfg.options()``).

    Examples
    --------
    >>> server_options(SpecExitConfig(enabled=True, method="remain", window=4)).window
    4
    """
    return cfg.options()


def options_to_json(options: SpecExitOptions) -> Dict[str, object]:
    """Plain-JSON form of options (``SpecExitOptions(**d)`` rebuilds them).

    Examples
    --------
    >>> SpecExitOptions(**options_to_json(SpecExitOptions(method="remain"))).method.name
    'remain'
    """
    out: Dict[str, object] = {}
    for name in ("enable", "ewma_alpha", "window", "confidence_threshold", "progress_threshold",
                 "remain_threshold", "min_think_tokens", "max_think_tokens", "max_think_grace"):
        out[name] = getattr(options, name)
    out["method"] = options.method.name
    out["smoothing"] = options.smoothing.label
    return out


# --------------------------------------------------------------------------- thinking detection
def think_start_text(stop_think_text: str) -> Optional[str]:
    """The opening tag matching a ``</tag>`` stop-think text (None for other texts).

    Examples
    --------
    >>> think_start_text("</think>"), think_start_text("END")
    ('<think>', None)
    """
    if stop_think_text.startswith("</") and stop_think_text.endswith(">"):
        return "<" + stop_think_text[2:]
    return None


def ends_inside_think(ids: Sequence[int], start_id: Optional[int], end_id: int,
                      before: Sequence[int] = ()) -> bool:
    """Whether ``before + ids`` ends inside an unclosed ``start ... end`` block.

    Scans backwards and stops at the last start or end token (no concatenation of long prompts).

    Examples
    --------
    >>> ends_inside_think([1, 3, 7, 8], start_id=3, end_id=4)
    True
    >>> ends_inside_think([1, 3, 7, 4, 9], start_id=3, end_id=4), ends_inside_think([1, 2], 3, 4)
    (False, False)
    >>> ends_inside_think([7, 8], start_id=3, end_id=4, before=[1, 3])
    True
    """
    if start_id is None:
        return False
    for part in (ids, before):
        for token in reversed(part):
            if token == end_id:
                return False
            if token == start_id:
                return True
    return False


def is_thinking(req, start_id: Optional[int], end_id: int) -> bool:
    """Thinking rule of the module docstring for one SGLang ``Req`` (host side, at prefill)."""
    if getattr(req, "grammar", None) is not None:
        return False
    output = req.output_ids
    if getattr(req, "require_reasoning", False) and end_id not in output:
        return True
    return ends_inside_think(output, start_id, end_id, before=req.origin_input_ids)


# --------------------------------------------------------------------------- the runner
class SpecExitRunner:
    """Per-worker SpecExit driver (see the module docstring).

    Parameters
    ----------
    worker : ExtEAGLEWorker
        The speculative worker (its draft model is loaded; pools may not exist yet).
    cfg : SpecExitConfig
        The server's SpecExit flags.
    """

    inactive_reason: Optional[str] = None
    """Why SpecExit watches no request on this model (:func:`sglang_ext.config.resolve_token_ids`), or None."""

    def __init__(self, worker, cfg: SpecExitConfig) -> None:
        self.cfg = cfg
        self.options = server_options(cfg)
        self.method: SpecExitMethod = self.options.method
        self.source = cfg.signal_source
        tokenizer = self._load_tokenizer()
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        tokens = resolve_token_ids(cfg, encode)
        self.inactive_reason: Optional[str] = tokens.inactive_reason
        if self.inactive_reason is not None:
            logger.warning("SpecExit: %s; requests are served as without --specexit", self.inactive_reason)
        elif tokens.dropped_step_split:
            logger.warning("--specexit-step-split-tokens: dropped %s (not a single token with this tokenizer); "
                           "boundary ids %s", json.dumps(list(tokens.dropped_step_split)), list(tokens.step_split_ids))
        self.stop_think_id = tokens.stop_think_id
        self.boundary_ids = tokens.step_split_ids
        start = think_start_text(cfg.stop_think_token)
        start_ids = encode(start) if start is not None else []
        self.think_start_id: Optional[int] = int(start_ids[0]) if len(start_ids) == 1 else None
        self.signal_rows: Optional[Tuple[int, ...]] = None
        if self.source == HEAD_SOURCE:
            self.signal_rows = self._check_head(worker)  # flags vs draft: checked even when inactive
        self.state: Optional[SpecExitState] = None
        self.ring: Optional[ObservationRing] = None  # draft-confidence: per-position values
        self.missing = torch.zeros((), dtype=torch.int64)  # draft-confidence values read but not held
        self.truncations = torch.zeros((), dtype=torch.int64)  # steps cut short before an undecidable boundary
        self._worker = worker
        self.owner: Dict[int, str] = {}
        self.stats = SpecExitStats()
        self.sink = SpecExitSink(self.stop_think_id, self.stats, ExitLog())
        self.trace_path = os.environ.get(TRACE_ENV) or None
        if self.inactive_reason is not None:
            return
        if self.source == DRAFT_CONFIDENCE_SOURCE:
            capture = getattr(worker, "draft_capture", None)
            if capture is None:
                logger.warning("--specexit-signal-source draft-confidence: this worker hosts no draft; "
                               "no signal-driven exits")
            else:
                capture.extend_rows_sink = self._extend_rows
                capture.prefill_rows_sink = self._prefill_rows
        logger.info("SpecExit on: method=%s source=%s smoothing=%s stop_think_id=%d boundary_ids=%s",
                    self.method.name, self.source, self.options.smoothing.label, self.stop_think_id,
                    list(self.boundary_ids))

    # ---------------------------------------------------------------- launch checks
    @staticmethod
    def _load_tokenizer():
        from sglang.srt.runtime_context import get_model, get_serving
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        return get_tokenizer(get_serving().tokenizer_path, tokenizer_mode=get_serving().tokenizer_mode,
                             trust_remote_code=get_model().trust_remote_code, revision=get_model().revision)

    @staticmethod
    def draft_model(worker):
        """The loaded draft ``nn.Module`` of an EAGLE worker."""
        return worker.draft_worker.draft_runner.model

    def _check_head(self, worker) -> Tuple[int, ...]:
        model = self.draft_model(worker)
        k = int(getattr(model, "specexit_k", 0) or 0)
        if not hasattr(model, "specexit_logits") or k == 0:
            raise SpecExitLaunchError(
                f"--specexit-signal-source head: the draft model ({type(model).__name__}) has no SpecExit signal rows; "
                "use a draft whose fc has hidden_size + k rows (EAGLE3 trainers' format) or "
                "--specexit-signal-source draft-confidence")
        trained = getattr(model, "specexit_method", None)
        try:
            trained_method = parse_method(trained) if trained else None
            return self.method.checkpoint_rows(k, trained_method)
        except SpecExitMethodError as e:
            raise SpecExitLaunchError(f"--specexit-method: {e} (--specexit-signal-source head)") from None

    # ---------------------------------------------------------------- state
    def _ensure_state(self, worker) -> SpecExitState:
        if self.state is None:
            pool = worker.req_to_token_pool
            slots = int(pool.req_to_token.shape[0])
            self.state = SpecExitState.allocate(slots, self.boundary_ids, self.stop_think_id,
                                                max_window=MAX_WINDOW, device=worker.device)
            if self.lagged:
                self.ring = ObservationRing.allocate(slots, device=worker.device)
                self.missing = self.missing.to(worker.device)
                self.truncations = self.truncations.to(worker.device)
        return self.state

    @property
    def lagged(self) -> bool:
        """The signal of ``r_j`` (``j >= KNOWN_COLUMNS``) is known only after the step (draft-confidence)."""
        return self.source == DRAFT_CONFIDENCE_SOURCE

    # ---------------------------------------------------------------- draft-confidence values
    _rows_warned = False

    @staticmethod
    def _warn_rows(what: str) -> None:
        if not SpecExitRunner._rows_warned:
            SpecExitRunner._rows_warned = True
            logger.warning("--specexit-signal-source draft-confidence: %s; its values are not kept (exits may "
                           "then come later)", what)

    def _extend_rows(self, forward_batch, logits) -> None:
        """``DraftCapture.extend_rows_sink``: every row of a draft extend after a verify.

        ``logits`` ``[num_rows, draft_vocab]``: row ``i`` is the draft's prediction from the
        target's hidden state at ``forward_batch.positions[i]`` and the token after it, so its
        max-softmax is the value of position ``positions[i] + OBSERVED_OFFSET``. Rows past a
        request's accepted run write positions nobody has committed yet; the extend of the
        step that verifies them writes them again before they are read.
        """
        if forward_batch is None or logits is None:
            return
        positions = getattr(forward_batch, "positions", None)  # [num_rows]
        lens = getattr(forward_batch, "extend_seq_lens", None)  # [bs]
        slots = getattr(forward_batch, "req_pool_indices", None)  # [bs]
        rows = int(logits.shape[0])
        if (positions is None or lens is None or slots is None or positions.shape[0] != rows
                or not isinstance(lens, torch.Tensor)):
            self._warn_rows("a draft extend's rows do not match its positions")
            return
        self._ensure_state(self._worker)
        row_slot = torch.repeat_interleave(slots.to(torch.int64), lens.to(device=slots.device, dtype=torch.int64),
                                           output_size=rows)  # [num_rows]
        with torch.no_grad():
            values = max_softmax(logits)  # [num_rows]
        self.ring.write(row_slot, positions.to(torch.int64) + OBSERVED_OFFSET, values)

    def request_options(self, req) -> SpecExitOptions:
        """Options of one request: server defaults merged with its ``custom_params``."""
        return options_for_request(self.options, getattr(req.sampling_params, "custom_params", None), self.method)

    def _prefill_rows(self, forward_batch, logits) -> None:
        """``DraftCapture.prefill_rows_sink``: a prefill's draft extend, one row per request.

        Forgets what the slots held, then: no value for the first output token (position
        ``L = seq_lens``, sampled by the prefill; the prefill's draft extend keeps no row that
        predicts it) and the last row's max-softmax for position ``L + 1``.
        """
        seq_lens = getattr(forward_batch, "seq_lens", None)  # [bs]
        slots = getattr(forward_batch, "req_pool_indices", None)  # [bs]
        if seq_lens is None or slots is None or logits is None or logits.shape[0] != slots.shape[0]:
            self._warn_rows("a prefill's draft extend has not one row per request")
            return
        self._ensure_state(self._worker)
        index = slots.to(torch.int64)
        first = seq_lens.to(device=index.device, dtype=torch.int64)  # [bs] position L
        self.ring.clear(index)
        self.ring.write(index, first, torch.full(first.shape, float("nan"), device=index.device))
        with torch.no_grad():
            self.ring.write(index, first + 1, max_softmax(logits))

    # ---------------------------------------------------------------- prefill
    def on_prefill(self, worker, batch, result) -> None:
        """Initialise the slots of the requests of a prefill/extend batch."""
        reqs = list(getattr(batch, "reqs", None) or [])
        if not reqs or batch.forward_mode.is_idle():
            return
        if not self.active:
            for req in reqs:  # watched by nobody: meta_info says specexit_active false
                if getattr(req, REPORT_ATTR, None) is None:
                    setattr(req, REPORT_ATTR, SpecExitRequestReport(active=False))
            return
        state = self._ensure_state(worker)
        slots: List[int] = []
        options: List[SpecExitOptions] = []
        think: List[int] = []
        flags: List[bool] = []
        for req in reqs:
            slot = req.kv.req_pool_idx
            if slot is None:
                continue
            try:
                opts = self.request_options(req)
            except SpecExitOptionError as e:
                self._abort(req, e)
                opts = SpecExitOptions(enable=False)
            thinking = opts.enable and is_thinking(req, self.think_start_id, self.stop_think_id)
            slots.append(int(slot))
            options.append(opts)
            think.append(len(req.output_ids) + 1)
            flags.append(thinking)
            self.owner[int(slot)] = req.rid
            report = getattr(req, REPORT_ATTR, None)
            if report is None:  # kept across a retraction + re-prefill
                setattr(req, REPORT_ATTR, SpecExitRequestReport(active=thinking))
        if not slots:
            return
        state.reset(slots, options, think_tokens=think, thinking=flags)
        first = result.next_token_ids if result is not None else None
        index = torch.tensor(slots, dtype=torch.int64, device=state.thinking.device)
        if isinstance(first, torch.Tensor) and first.numel() == len(reqs) and len(slots) == len(reqs):
            # a prefill that sampled the stop token ends thinking at once (no host sync)
            state.thinking[index] &= first.to(state.thinking.device) != self.stop_think_id
        if self.trace_path:
            self._trace({"event": "reset", "slots": slots, "rids": [r.rid for r in reqs],
                         "options": [options_to_json(o) for o in options], "think_tokens": think,
                         "thinking": state.thinking[index].tolist()})

    @staticmethod
    def _abort(req, error: SpecExitOptionError) -> None:
        from http import HTTPStatus

        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        message = f"invalid SpecExit option {error}"
        logger.warning("aborting request %s: %s", req.rid, message)
        req.to_finish = FINISH_ABORT(message, HTTPStatus.BAD_REQUEST, "BadRequestError")

    # ---------------------------------------------------------------- verify
    def after_verify(self, worker, batch, verify_input, result):
        """Decide, cut and observe one verify step; returns ``result`` (edited in place)."""
        if not self.active or batch.forward_mode.is_idle() or result is None or result.accept_lens is None:
            return result
        bs = int(result.accept_lens.shape[0])
        if bs == 0:
            return result
        state = self._ensure_state(worker)
        num_draft = int(result.speculative_num_draft_tokens or verify_input.draft_token_num)
        slots = batch.req_pool_indices.to(device=state.thinking.device, dtype=torch.int64)
        self._forget_unknown(batch)

        roots = verify_input.draft_token.view(bs, -1)[:, 0]  # [bs]
        accepted, bonus = split_emitted_run(result.next_token_ids, result.accept_lens, num_draft)
        accepted = accepted[:, : self.max_accepted(worker, num_draft)]  # [bs, longest a]
        remain_before = state.scores(slots)[0][:, int(Signal.REMAIN)]  # [bs], NaN where undefined
        truncated = None
        if self.lagged:
            signals, owed = self.lagged_signals(batch, slots, accepted)
            truncated, keep = state.truncation(slots, roots, accepted, bonus, KNOWN_COLUMNS, observations=signals,
                                               backlog_observations=owed)
            self.truncations += truncated.sum()
            apply_truncation(result.next_token_ids, result.accept_lens, result.new_seq_lens,
                             result.next_draft_input.bonus_tokens, truncated, keep, num_draft,
                             accept_index=result.accept_index,
                             prepared_draft_extend_inputs=result.prepared_draft_extend_inputs)
            accepted, bonus = split_emitted_run(result.next_token_ids, result.accept_lens, num_draft)
            accepted = accepted[:, : self.max_accepted(worker, num_draft)]
            decision = state.step(slots, roots, accepted, bonus, signals, known_columns=KNOWN_COLUMNS,
                                  backlog_observations=owed)
        else:
            signals = self.token_signals(worker, batch, verify_input, result, num_draft, accepted.shape[1] + 1)
            decision = state.step(slots, roots, accepted, bonus, signals)

        self._fix_logprobs(batch, result, decision)
        bonus_tokens = result.next_draft_input.bonus_tokens
        apply_exit_cut(result.next_token_ids, result.accept_lens, result.new_seq_lens, bonus_tokens,
                       decision.exit, decision.keep_drafts, self.stop_think_id, num_draft,
                       accept_index=result.accept_index,
                       prepared_draft_extend_inputs=result.prepared_draft_extend_inputs)
        self._publish(result, decision, remain_before)
        if self.trace_path:
            self._trace({"event": "step", "slots": slots.tolist(), "rids": [r.rid for r in batch.reqs],
                         "roots": roots.tolist(), "accepted": accepted.tolist(), "bonus": bonus.tolist(),
                         "signals": signals.tolist(),
                         "decision": {k: getattr(decision, k).tolist() for k in
                                      ("exit", "keep_drafts", "reason", "natural_end", "first_boundary")},
                         "truncated": None if truncated is None else truncated.tolist(),
                         "accept_lens": result.accept_lens.tolist(),
                         "next_token_ids": result.next_token_ids.view(bs, num_draft).tolist()})
        return result

    def _forget_unknown(self, batch) -> None:
        """Rows whose request this runner never reset are not thinking (slot-reuse guard)."""
        unknown = [req.kv.req_pool_idx for req in batch.reqs
                   if self.owner.get(req.kv.req_pool_idx) != req.rid]
        if unknown:
            self.state.release(unknown)
            for slot in unknown:
                self.owner[slot] = None
            if self.trace_path:
                self._trace({"event": "release", "slots": unknown})

    # ---------------------------------------------------------------- signals
    @staticmethod
    def max_accepted(worker, num_draft: int) -> int:
        """The longest accepted run ``a`` a verify of width ``num_draft`` can commit: chains
        ``num_draft - 1``; trees (``topk > 1``) at most the draft depth, which is smaller."""
        longest = num_draft - 1
        if int(getattr(worker, "topk", 1) or 1) > 1:
            return min(longest, int(worker.speculative_num_steps))
        return longest

    def lagged_signals(self, batch, slots: torch.Tensor, accepted: torch.Tensor):
        """draft-confidence: the known observations of this step's run and the owed ones.

        Returns ``(signals [bs, a_max + 1, NUM_SIGNALS], owed [bs, backlog_width, NUM_SIGNALS])``:
        the values of ``r_0`` (position ``seq_lens``) and ``r_1`` in columns 0 and 1 (NaN after),
        and those of the state's backlog positions. Values a thinking request needs but the ring
        does not hold are counted in ``missing``.
        """
        state = self.state
        device = state.thinking.device
        bs, width = accepted.shape[0], accepted.shape[1] + 1
        roots = batch.seq_lens.to(device=device, dtype=torch.int64)  # [bs] position of r_0
        known = min(KNOWN_COLUMNS, width)
        keys = roots[:, None] + torch.arange(known, device=device)[None, :]  # [bs, known]
        values, held = self.ring.read(slots, keys)
        owed_keys = state.backlog_positions(slots, roots)  # [bs, backlog_width], -1 where none
        owed_values, owed_held = self.ring.read(slots, owed_keys)
        thinking = state.thinking[slots][:, None]  # [bs, 1]
        present = torch.ones((bs, known), dtype=torch.bool, device=device)
        if known > 1:
            present[:, 1] = accepted[:, 0].to(device) != PAD_TOKEN
        self.missing += ((~held & present & thinking).sum() + (~owed_held & (owed_keys >= 0) & thinking).sum())
        signals = draft_confidence_signals(values, width)  # [bs, width, NUM_SIGNALS]
        owed = torch.full((bs, owed_keys.shape[1], NUM_SIGNALS), float("nan"), device=device)
        owed[:, :, int(Signal.CONFIDENCE)] = owed_values
        return signals.to(device=device, dtype=torch.float32), owed

    def token_signals(self, worker, batch, verify_input, result, num_draft: int, width: int) -> torch.Tensor:
        """This step's observation of every committed token, ``[bs, width, NUM_SIGNALS]``.

        Column ``j`` belongs to ``r_j`` (root, accepted drafts); NaN where a signal has no
        value (unused columns, the draft-confidence root); columns past ``a`` are ignored.
        """
        bs = int(result.accept_lens.shape[0])
        device = self.state.thinking.device
        hidden = result.logits_output.hidden_states  # [bs * N, num_aux * H], front-compacted
        rows = strided_token_columns(hidden, bs, num_draft, width)  # [bs, width, num_aux * H]
        model = self.draft_model(worker)
        with torch.no_grad():
            raw = model.specexit_logits(rows.reshape(bs * width, -1))  # [bs * width, checkpoint_k]
            raw = raw[:, list(self.signal_rows)]  # [bs * width, method.k]
            values = decode_signals(raw, self.method)  # [bs * width, NUM_SIGNALS]
        return values.view(bs, width, NUM_SIGNALS).to(device=device, dtype=torch.float32)

    # ---------------------------------------------------------------- logprobs, reporting, trace
    def _fix_logprobs(self, batch, result, decision: ExitDecision) -> None:
        logits_output = result.logits_output
        logprobs = getattr(logits_output, "next_token_logprobs", None)
        if not getattr(batch, "return_logprob", False) or logprobs is None or result.accept_index is None:
            return
        column = decision.keep_drafts.clamp(max=result.accept_index.shape[1] - 1)  # L' - 1
        rows = result.accept_index.gather(1, column[:, None].to(result.accept_index.device)).squeeze(1)
        rows = rows.clamp(min=0)
        temps = None
        info = getattr(batch, "sampling_info", None)
        if info is not None and not info.is_all_greedy:
            temps = info.temperatures
        forced = stop_token_logprobs(logits_output.next_token_logits, rows, self.stop_think_id, temps)
        col = column[:, None].to(logprobs.device)
        current = logprobs.gather(1, col).squeeze(1)
        new = torch.where(decision.exit.to(logprobs.device), forced.to(logprobs.dtype), current)
        logprobs.scatter_(1, col, new[:, None])

    def _publish(self, result, decision: ExitDecision, remain_before: torch.Tensor) -> None:
        from sglang.srt.managers.auxiliary_output import append_auxiliary_output

        rows = torch.stack([
            decision.reason.to(torch.float32),
            decision.natural_end.to(torch.float32),
            remain_before.to(torch.float32),
            decision.keep_drafts.to(torch.float32),
            decision.num_accepted.to(torch.float32),
        ], dim=1)  # [bs, len(ROW_FIELDS)]
        assert rows.shape[1] == len(ROW_FIELDS)
        out = result.logits_output
        out.auxiliary_device_output = append_auxiliary_output(out.auxiliary_device_output,
                                                              SpecExitDeviceOutput(rows, self.sink))

    def _trace(self, record: Dict[str, object]) -> None:
        with open(self.trace_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    @property
    def active(self) -> bool:
        """False when SpecExit watches no request on this model (``inactive_reason`` says why)."""
        return self.inactive_reason is None

    def server_info(self) -> Dict[str, object]:
        """The ``/server_info`` payload of this worker (``active`` false and ``inactive_reason``
        when SpecExit watches no request on this model)."""
        info = self.stats.as_dict()
        if self.lagged:
            info["missing_signals"] = int(self.missing)
            info["truncated_steps"] = int(self.truncations)
        info.update({"active": self.active, "inactive_reason": self.inactive_reason,
                     "method": self.method.name, "signal_source": self.source,
                     "stop_think_id": self.stop_think_id, "boundary_ids": list(self.boundary_ids)})
        return info

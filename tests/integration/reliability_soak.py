"""Concurrency soak client for the reliability suite: N HTTP clients, a fixed mix of request kinds.

Each client thread loops until the deadline, sending the kinds of :data:`KINDS` in turn (offset by
its index, so every kind is in flight at once) and checking each answer against what that kind
must return. A request that raises, times out or answers wrongly is an *error*; a request that
never answers is *lost*. After the deadline every client finishes its request in flight, so
``sent == ok + errors + lost`` at the end.

Request kinds (``max_tokens`` = :data:`MAX_TOKENS`, greedy, EOS ignored, so every valid request
generates exactly ``MAX_TOKENS`` tokens):

======================  ===========================  ===========================================
kind                    endpoint                     what it must return
======================  ===========================  ===========================================
``chat_think``          ``/v1/chat/completions``     thinking (template opens ``<think>``), server
                                                     SpecExit settings; 200, ``finish_reason`` length
``chat_forced_exit``    ``/v1/chat/completions``     ``custom_params`` max_think_tokens: forced exit
``chat_stream_off``     ``/v1/chat/completions``     streamed, SpecExit off for the request; SSE
                                                     ends with ``[DONE]``, usage = MAX_TOKENS
``gen_think_forced``    ``/generate`` (text)         thinking prompt + forced exit: ``meta_info``
                                                     ``specexit_exited`` with reason max_think_tokens
``gen_plain``           ``/generate`` (text)         not thinking: ``specexit_active`` false
``gen_ids_logprob``     ``/generate`` (input_ids)    not thinking, with logprobs (D-Cut exempt)
``bad_params``          ``/generate``                invalid ``custom_params``: HTTP 400 naming it
======================  ===========================  ===========================================
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

MAX_TOKENS = 16
#: custom_params of a forced exit: thinking ends after 8 tokens, no paragraph boundary needed.
FORCED = {"specexit_max_think_tokens": 8, "specexit_max_think_grace": 0}
FORCED_THINK_TOKENS = 8
BAD = {"specexit_window": 0}
KINDS = ("chat_think", "chat_forced_exit", "chat_stream_off", "gen_think_forced", "gen_plain", "gen_ids_logprob",
         "bad_params")
#: Kinds whose request SpecExit must end early (reason ``max_think_tokens``).
FORCED_KINDS = ("chat_forced_exit", "gen_think_forced")


@dataclass(frozen=True)
class SoakInputs:
    """What the clients send: chat questions, a templated thinking prompt, plain prompts, token ids."""

    questions: Sequence[str]
    thinking_text: str  # a chat-templated prompt ending inside an open <think> block
    plain_texts: Sequence[str]
    prompt_ids: Sequence[Sequence[int]]


@dataclass
class SoakReport:
    """Outcome of one soak run (counts per kind)."""

    clients: int
    duration_s: float
    sent: Counter = field(default_factory=Counter)
    ok: Counter = field(default_factory=Counter)
    errors: List[str] = field(default_factory=list)  # answered, but wrongly (or the client failed)
    lost: int = 0  # never answered (timed out, or still in flight at the end)
    lost_detail: List[str] = field(default_factory=list)
    latencies_s: List[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_ok(self) -> int:
        return sum(self.ok.values())

    def summary(self) -> Dict[str, object]:
        lat = sorted(self.latencies_s)
        return {"clients": self.clients, "duration_s": self.duration_s, "wall_s": round(self.wall_s, 1),
                "sent": self.total_sent, "ok": self.total_ok, "errors": len(self.errors), "lost": self.lost,
                "per_kind_ok": dict(self.ok),
                "p50_latency_s": round(lat[len(lat) // 2], 2) if lat else None,
                "max_latency_s": round(lat[-1], 2) if lat else None}


class _Mismatch(Exception):
    pass


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise _Mismatch(what)


def _chat(session, url: str, question: str, params: Optional[dict], stream: bool, timeout: float) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "ignore_eos": True}
    if params is not None:
        body["custom_params"] = params
    if not stream:
        r = session.post(url + "/v1/chat/completions", json=body, timeout=timeout)
        _expect(r.status_code == 200, f"status {r.status_code}: {r.text[:300]}")
        out = r.json()
        choice = out["choices"][0]
        _expect(choice["finish_reason"] == "length", f"finish_reason {choice['finish_reason']}")
        _expect(out["usage"]["completion_tokens"] == MAX_TOKENS, f"usage {out['usage']}")
        return
    body.update(stream=True, stream_options={"include_usage": True})
    with session.post(url + "/v1/chat/completions", json=body, timeout=timeout, stream=True) as r:
        _expect(r.status_code == 200, f"status {r.status_code}")
        done, finish, usage = False, None, None
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            _expect("error" not in chunk, f"stream error {chunk}")
            for c in chunk.get("choices") or []:
                finish = c.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
        _expect(done, "stream ended without [DONE]")
        _expect(finish == "length", f"stream finish_reason {finish}")
        _expect(usage is not None and usage["completion_tokens"] == MAX_TOKENS, f"stream usage {usage}")


def _generate(session, url: str, payload: dict, timeout: float) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    params.update(payload.pop("sampling_params", {}))
    r = session.post(url + "/generate", json=dict(payload, sampling_params=params), timeout=timeout)
    _expect(r.status_code == 200, f"status {r.status_code}: {r.text[:300]}")
    meta = r.json()["meta_info"]
    _expect(meta["completion_tokens"] == MAX_TOKENS, f"completion_tokens {meta['completion_tokens']}")
    _expect(meta["finish_reason"]["type"] == "length", f"finish_reason {meta['finish_reason']}")
    return meta


def send_one(session, url: str, kind: str, inputs: SoakInputs, i: int, timeout: float) -> None:
    """Send one request of ``kind`` and check its answer (raises on any mismatch)."""
    q = inputs.questions[i % len(inputs.questions)]
    if kind == "chat_think":
        _chat(session, url, q, None, False, timeout)
    elif kind == "chat_forced_exit":
        _chat(session, url, q, FORCED, False, timeout)
    elif kind == "chat_stream_off":
        _chat(session, url, q, {"specexit_enable": False}, True, timeout)
    elif kind == "gen_think_forced":
        meta = _generate(session, url, {"text": inputs.thinking_text, "sampling_params": {"custom_params": FORCED}},
                         timeout)
        _expect(meta.get("specexit_exited") is True and meta.get("specexit_exit_reason") == "max_think_tokens",
                f"no forced exit: {meta}")
        _expect(meta.get("specexit_think_tokens") == FORCED_THINK_TOKENS, f"think tokens {meta}")
    elif kind == "gen_plain":
        meta = _generate(session, url, {"text": inputs.plain_texts[i % len(inputs.plain_texts)]}, timeout)
        _expect(meta.get("specexit_active") is False and not meta.get("specexit_exited"), f"thinking? {meta}")
    elif kind == "gen_ids_logprob":
        ids = list(inputs.prompt_ids[i % len(inputs.prompt_ids)])
        meta = _generate(session, url, {"input_ids": ids, "return_logprob": True}, timeout)
        _expect(len(meta.get("output_token_logprobs") or []) == MAX_TOKENS, "logprobs missing")
    elif kind == "bad_params":
        r = session.post(url + "/generate", json={"text": q, "sampling_params": {
            "max_new_tokens": MAX_TOKENS, "custom_params": BAD}}, timeout=timeout)
        _expect(r.status_code == 400 and "specexit_window" in r.text, f"bad params got {r.status_code}: {r.text[:200]}")
    else:
        raise ValueError(f"unknown kind {kind!r}")


#: D-Cut modes cycled during a soak (``dcut_force_ratio``; 0 = the configured ``auto``).
DCUT_MODE_CYCLE = (0.25, 0.5, 0.0, 0.75, 1.0)


class DCutModeCycler:
    """Context manager: switch the server's D-Cut mode every ``period_s`` seconds while a soak runs.

    Under the tiny CPU models ``auto`` mostly chooses the full tier, so the soak forces the pruned
    tiers too (``/set_internal_state`` ``dcut_force_ratio``), switching them under load; the
    configured mode is restored on exit. ``switches`` counts accepted switches, ``failures`` the
    refused ones.
    """

    def __init__(self, url: str, period_s: float = 2.0, ratios: Sequence[float] = DCUT_MODE_CYCLE) -> None:
        self.url, self.period_s, self.ratios = url, period_s, tuple(ratios)
        self.switches = 0
        self.failures: List[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        from sglang_ext.engine.dcut.client import set_force_ratio

        i = 0
        while not self._stop.wait(self.period_s if i else 0.0):
            ratio = self.ratios[i % len(self.ratios)]
            try:
                if set_force_ratio(self.url, ratio):
                    self.switches += 1
                else:
                    self.failures.append(f"dcut_force_ratio={ratio} refused")
            except Exception as e:  # noqa: BLE001
                self.failures.append(f"dcut_force_ratio={ratio}: {type(e).__name__}: {e}")
            i += 1

    def __enter__(self) -> "DCutModeCycler":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        from sglang_ext.engine.dcut.client import set_force_ratio

        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
        if not set_force_ratio(self.url, 0.0):
            self.failures.append("could not restore the configured mode")


def run_soak(url: str, inputs: SoakInputs, clients: int = 64, duration_s: float = 20.0,
             request_timeout_s: float = 300.0) -> SoakReport:
    """Run ``clients`` threads against ``url`` for ``duration_s`` seconds (see the module docstring)."""
    import requests

    report = SoakReport(clients=clients, duration_s=duration_s)
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    def client(index: int) -> None:
        session = requests.Session()
        n = 0
        while time.monotonic() < deadline:
            kind = KINDS[(index + n) % len(KINDS)]
            with lock:
                report.sent[kind] += 1
            t0 = time.monotonic()
            try:
                send_one(session, url, kind, inputs, index + n, request_timeout_s)
            except requests.Timeout:
                with lock:
                    report.lost += 1
                    report.lost_detail.append(f"{kind}: no answer within {request_timeout_s:.0f} s")
            except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the soak
                with lock:
                    report.errors.append(f"{kind}: {type(e).__name__}: {e}")
            else:
                with lock:
                    report.ok[kind] += 1
                    report.latencies_s.append(time.monotonic() - t0)
            n += 1
        session.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + request_timeout_s + 60)
    report.lost += sum(t.is_alive() for t in threads)
    report.wall_s = time.monotonic() - t0
    return report

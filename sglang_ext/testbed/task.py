"""Synthetic thinking task of the CPU testbed: problems, traces, answer parsing.

Question grammar (kept exactly; other tools generate problems from it)::

    Compute: <n1> <op> <n2> [<op> <n3> ...]

2 to 4 operands, each an integer 0..9, ops ``+`` or ``-``, evaluated left to right.
The answer is an integer (may be negative).

A thinking trace (the assistant turn after the prompt's ``<think>\\n``) has one
paragraph per operation, the result paragraph, then ``n_rechecks`` redundant
re-check paragraphs, each paragraph followed by the paragraph break ``\\n\\n``::

    Step 1: 7 + 4 = 11.\\n\\n
    Step 2: 11 - 2 = 9.\\n\\n
    So the result is 9.\\n\\n
    Let me double-check step 1: 7 + 4 = 11.\\n\\n        <- re-check 1 of 0..8
    ...
    </think>\\n\\nThe answer is 9.<|im_end|>

Re-check ``j`` (0-based) uses template ``j`` of :data:`RECHECK_TEMPLATES` and
re-checks step ``j mod num_steps + 1``, so the text itself tells how many
re-checks came before.  The training distribution of ``n_rechecks``
(:func:`sample_num_rechecks`) puts most mass on the maximum, so that a model
decoding greedily writes all :data:`MAX_RECHECKS` re-checks (over-thinking: most
of the think span comes after the answer is known).

CLI: ``python -m sglang_ext.testbed.task --n N --seed S --out FILE`` writes JSONL
lines ``{"id": "...", "question": "Compute: 7 + 4 - 2", "answer": "9"}``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

MIN_OPERANDS = 2
MAX_OPERANDS = 4
MAX_OPERAND_VALUE = 9
OPS = ("+", "-")

PARAGRAPH_BREAK = "\n\n"
THINK_OPEN = "<think>\n"  # ends the generation prompt of a thinking request
THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"

STEP_TEMPLATE = "Step {i}: {eq}."
RESULT_TEMPLATE = "So the result is {r}."
ANSWER_TEMPLATE = "The answer is {r}."
#: Re-check paragraph templates, in the order they appear in a trace.
RECHECK_TEMPLATES = (
    "Let me double-check step {i}: {eq}.",
    "Wait, let me verify step {i} again: {eq}.",
    "Hmm, checking step {i} once more: {eq}.",
    "Let me recompute step {i} to be sure: {eq}.",
    "Actually, let me look at step {i} again: {eq}.",
    "To be safe, step {i} gives {eq}.",
    "One more time, step {i}: {eq}.",
    "Everything checks out, so the result is {r}.",
)
MAX_RECHECKS = len(RECHECK_TEMPLATES)
#: Probability of a trace with fewer than MAX_RECHECKS re-checks (uniform over 0..MAX-1).
P_SHORT_RECHECK = 0.4

_ANSWER_RE = re.compile(r"The answer is (-?\d+)\.")


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem.

    Attributes
    ----------
    id : str
    operands : tuple of int
        2..4 values in 0..9.
    ops : tuple of str
        ``len(operands) - 1`` entries, each ``"+"`` or ``"-"``.
    """

    id: str
    operands: Tuple[int, ...]
    ops: Tuple[str, ...]

    @property
    def question(self) -> str:
        parts = [str(self.operands[0])]
        for op, x in zip(self.ops, self.operands[1:]):
            parts += [op, str(x)]
        return "Compute: " + " ".join(parts)

    @property
    def steps(self) -> List[Tuple[int, str, int, int]]:
        """Left-to-right steps ``(a, op, b, c)`` with ``c = a op b``."""
        out, acc = [], self.operands[0]
        for op, b in zip(self.ops, self.operands[1:]):
            c = acc + b if op == "+" else acc - b
            out.append((acc, op, b, c))
            acc = c
        return out

    @property
    def answer(self) -> int:
        return self.steps[-1][3]

    def to_json(self) -> dict:
        return {"id": self.id, "question": self.question, "answer": str(self.answer)}


def parse_question(question: str, id: str = "") -> Problem:
    """Parse a question of the task grammar.

    Examples
    --------
    >>> parse_question("Compute: 7 + 4 - 2").answer
    9
    """
    m = re.fullmatch(r"Compute: (\d)((?: [+-] \d){1,3})", question.strip())
    if m is None:
        raise ValueError(f"not a task question: {question!r}")
    toks = m.group(2).split()
    return Problem(id, (int(m.group(1)),) + tuple(int(t) for t in toks[1::2]), tuple(toks[0::2]))


def generate_problems(n: int, rng: random.Random, id_prefix: str = "") -> List[Problem]:
    """Draw ``n`` problems of the task grammar.

    Parameters
    ----------
    n : int
    rng : random.Random
        The only source of randomness.
    id_prefix : str
        Ids are ``f"{id_prefix}{i}"``.

    Examples
    --------
    >>> ps = generate_problems(2, random.Random(0), "p")
    >>> [p.id for p in ps], all(2 <= len(p.operands) <= 4 for p in ps)
    (['p0', 'p1'], True)
    """
    out = []
    for i in range(n):
        k = rng.randint(MIN_OPERANDS, MAX_OPERANDS)
        operands = tuple(rng.randint(0, MAX_OPERAND_VALUE) for _ in range(k))
        ops = tuple(rng.choice(OPS) for _ in range(k - 1))
        out.append(Problem(f"{id_prefix}{i}", operands, ops))
    return out


def sample_num_rechecks(rng: random.Random) -> int:
    """Training distribution of the number of re-check paragraphs.

    ``MAX_RECHECKS`` with probability ``1 - P_SHORT_RECHECK``, else uniform on
    ``0..MAX_RECHECKS-1``.  After ``k < MAX`` re-checks the chance that thinking
    ends is at most ``0.05 / 0.65`` < 0.5, so greedy decoding writes them all.
    """
    if rng.random() < P_SHORT_RECHECK:
        return rng.randrange(MAX_RECHECKS)
    return MAX_RECHECKS


def _eq(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}"


def think_paragraphs(problem: Problem, n_rechecks: int) -> List[str]:
    """Paragraphs of the think span (without the ``\\n\\n`` breaks).

    Examples
    --------
    >>> think_paragraphs(parse_question("Compute: 7 + 4 - 2"), 1)
    ['Step 1: 7 + 4 = 11.', 'Step 2: 11 - 2 = 9.', 'So the result is 9.', \
'Let me double-check step 1: 7 + 4 = 11.']
    """
    if not 0 <= n_rechecks <= MAX_RECHECKS:
        raise ValueError(f"n_rechecks must be in 0..{MAX_RECHECKS}, got {n_rechecks}")
    steps = problem.steps
    paras = [STEP_TEMPLATE.format(i=i + 1, eq=_eq(*s)) for i, s in enumerate(steps)]
    paras.append(RESULT_TEMPLATE.format(r=problem.answer))
    for j in range(n_rechecks):
        i = j % len(steps)
        paras.append(RECHECK_TEMPLATES[j].format(i=i + 1, eq=_eq(*steps[i]), r=problem.answer))
    return paras


def completion_text(problem: Problem, n_rechecks: int, thinking: bool = True) -> str:
    """Assistant text generated after the prompt, end-of-turn token included.

    Examples
    --------
    >>> completion_text(parse_question("Compute: 1 + 2"), 0)
    'Step 1: 1 + 2 = 3.\\n\\nSo the result is 3.\\n\\n</think>\\n\\nThe answer is 3.<|im_end|>'
    >>> completion_text(parse_question("Compute: 1 + 2"), 0, thinking=False)
    'The answer is 3.<|im_end|>'
    """
    answer = ANSWER_TEMPLATE.format(r=problem.answer) + END_OF_TURN
    if not thinking:
        return answer
    think = "".join(p + PARAGRAPH_BREAK for p in think_paragraphs(problem, n_rechecks))
    return think + THINK_CLOSE + PARAGRAPH_BREAK + answer


def prompt_text(question: str, thinking: bool = True) -> str:
    """The chat prompt (what the tokenizer's chat template renders).

    Examples
    --------
    >>> prompt_text("Compute: 1 + 2")
    '<|im_start|>user\\nCompute: 1 + 2<|im_end|>\\n<|im_start|>assistant\\n<think>\\n'
    """
    p = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return p + (THINK_OPEN if thinking else "")


def parse_answer(output: str) -> Optional[str]:
    """Extract the final answer from generated text.

    Takes the last ``The answer is X.`` after ``</think>`` when present, else the
    last one anywhere; ``None`` when there is none.

    Examples
    --------
    >>> parse_answer("Step 1: 1 + 2 = 3.\\n\\n</think>\\n\\nThe answer is 3.")
    '3'
    >>> parse_answer("The answer is -12.") , parse_answer("no answer") is None
    ('-12', True)
    """
    tail = output.rsplit(THINK_CLOSE, 1)[-1]
    found = _ANSWER_RE.findall(tail) or _ANSWER_RE.findall(output)
    return found[-1] if found else None


def count_rechecks(output: str) -> int:
    """Number of paragraphs after the first ``So the result is`` paragraph in the think span.

    Examples
    --------
    >>> count_rechecks(completion_text(parse_question("Compute: 1 + 2"), 5))
    5
    """
    think = output.split(THINK_CLOSE, 1)[0]
    paras = [p for p in think.split(PARAGRAPH_BREAK) if p.strip()]
    for k, p in enumerate(paras):
        if p.startswith("So the result is"):
            return len(paras) - k - 1
    return 0


def write_problems(path: str, problems: Sequence[Problem]) -> None:
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps(p.to_json()) + "\n")


def read_problems(path: str) -> List[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, required=True, help="number of problems")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True, help="output JSONL file")
    args = ap.parse_args(argv)
    write_problems(args.out, generate_problems(args.n, random.Random(args.seed), f"s{args.seed}-"))


if __name__ == "__main__":
    main()

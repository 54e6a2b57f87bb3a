"""Every document the project points a reader to is in the repository.

Scans code, tests, README, bench, patches, configs, scripts, examples and ``docs/`` for
references to ``*.md`` files (``docs/algorithms.md``, ``patches/INDEX.md``, a bare
``cli_args.md`` next to ``patches/``, a markdown link ``[..](../docs/architecture.md#rooms)``)
and checks that

* each referenced file exists (relative to the referring file, the repository root or
  ``patches/``);
* each ``#anchor`` is the GitHub anchor of a heading of that file;
* no design note that lives outside the repository is named.

Also checks that the engine's rooms (``sglang_ext/engine/{dcut,specexit,attention}``) name
their modules in their package docstring. No SGLang needed. Budget: < 3 s.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED_DIRS = ("sglang_ext", "tests", "bench", "patches", "configs", "docs", "scripts", "examples", "data")
SCANNED_TOP_FILES = ("README.md", "pyproject.toml")
SCANNED_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt")
SKIPPED_DIRS = {".venv", "__pycache__", "sglang_ext.egg-info", ".git"}
SKIPPED_PATHS = ("bench/results", "sglang_ext/testbed/models")  # recorded results, model files

# Design notes that were never part of the repository (spelled in pieces so this file does not
# name them itself).
EXTERNAL_NOTES = tuple(n + s for n, s in (("ALGORITHMS", ".md"), ("VERIFY_EDIT", "_MAP"), ("SGLANG", "_MAP"),
                                           ("CPU_TESTBED", ".md"), ("CPU_BACKEND", "_MAP"), ("DESIGN", ".md")))

# ``path/to/name.md`` optionally followed by ``#anchor``; the name must not follow a word
# character or a path character (so ``specexit_*.md`` and ``<name>.md`` are not references).
MD_REF = re.compile(r"(?<![\w*<>/.-])((?:\.\.?/)*(?:[\w-]+/)*[\w.-]*\w\.md)(#[\w-]+)?")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


THIS_FILE = os.path.abspath(__file__)


def scanned_files() -> List[str]:
    """Every scanned text file except this one (whose examples name files that do not exist)."""
    out = [os.path.join(ROOT, f) for f in SCANNED_TOP_FILES if os.path.isfile(os.path.join(ROOT, f))]
    for top in SCANNED_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            rel = os.path.relpath(dirpath, ROOT)
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS
                                 and os.path.join(rel, d).replace(os.sep, "/") not in SKIPPED_PATHS)
            out.extend(os.path.join(dirpath, f) for f in sorted(files) if f.endswith(SCANNED_SUFFIXES))
    return [p for p in out if os.path.abspath(p) != THIS_FILE]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: inline code marks and punctuation dropped, lower case,
    spaces to hyphens.

    >>> slug("D-Cut tier choice"), slug("The `verify()` seam (D-Cut, SpecExit)")
    ('d-cut-tier-choice', 'the-verify-seam-d-cut-specexit')
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](link) -> text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: str) -> Set[str]:
    """Every heading anchor of a markdown file (duplicates get ``-1``, ``-2`` as on GitHub)."""
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            m = None if in_fence else HEADING.match(line)
            if m is None:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def references(path: str) -> Iterator[Tuple[int, str, Optional[str]]]:
    """``(line number, referenced path, anchor or None)`` for every ``*.md`` reference in a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            for m in MD_REF.finditer(line):
                yield lineno, m.group(1), (m.group(2) or "")[1:] or None


def resolve(referrer: str, target: str) -> Optional[str]:
    for base in (os.path.dirname(referrer), ROOT, os.path.join(ROOT, "patches")):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(candidate):
            return candidate
    return None


def broken_references(files: List[str]) -> List[str]:
    problems = []
    anchor_cache: Dict[str, Set[str]] = {}
    for path in files:
        rel = os.path.relpath(path, ROOT)
        for lineno, target, anchor in references(path):
            found = resolve(path, target)
            if found is None:
                problems.append(f"{rel}:{lineno}: {target} is not in the repository")
                continue
            if anchor is not None:
                if found not in anchor_cache:
                    anchor_cache[found] = anchors_of(found)
                if anchor not in anchor_cache[found]:
                    problems.append(f"{rel}:{lineno}: {target} has no heading with anchor #{anchor}")
    return problems


def external_mentions(files: List[str]) -> List[str]:
    problems = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for name in EXTERNAL_NOTES:
                    if name in line:
                        problems.append(f"{os.path.relpath(path, ROOT)}:{lineno}: names {name}")
    return problems


# ----------------------------------------------------------------------------- the checks
def test_docs_pages_exist():
    for page in ("algorithms.md", "architecture.md", "where_to_add.md", "sglang_internals.md"):
        assert os.path.isfile(os.path.join(ROOT, "docs", page)), page


def test_every_markdown_reference_resolves():
    files = scanned_files()
    assert len(files) > 100, "the scan found too few files; is ROOT right?"
    problems = broken_references(files)
    assert not problems, "references to documents that are not in the repository:\n" + "\n".join(problems)


def test_no_external_design_note_is_named():
    problems = external_mentions(scanned_files())
    assert not problems, "references to design notes outside the repository:\n" + "\n".join(problems)


def test_tracked_files_are_scanned_too():
    """Files tracked by git outside the scanned folders (a new top-level folder) are named here."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git not available")
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    scanned = {os.path.relpath(p, ROOT) for p in scanned_files() + [THIS_FILE]}
    missed = [f for f in listed.stdout.splitlines()
              if f.endswith(SCANNED_SUFFIXES) and f not in scanned and os.path.isfile(os.path.join(ROOT, f))
              and not any(part in SKIPPED_DIRS for part in f.split("/")[:-1])
              and not f.startswith(tuple(p + "/" for p in SKIPPED_PATHS))]
    assert not missed, f"text files outside the scanned folders: {missed}"


# ----------------------------------------------------------------------------- the checker can fail
def test_checker_reports_a_missing_file_a_missing_anchor_and_an_external_note(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## D-Cut tier choice\n\n```\n# not a heading\n```\n")
    ok = tmp_path / "ok.py"
    ok.write_text(f'"""See {page.name}#d-cut-tier-choice and {page.name}#title."""\n')
    bad = tmp_path / "bad.py"
    bad.write_text(f'"""See {page.name}#not-a-heading, gone.md and {page.name}#d-cut-tiers."""\n'
                   f"# {EXTERNAL_NOTES[0]} section 1\n")
    assert broken_references([str(ok)]) == []
    problems = broken_references([str(bad)])
    assert len(problems) == 4, problems  # the external note is also a missing file
    assert any("gone.md is not in the repository" in p for p in problems)
    assert any(f"{EXTERNAL_NOTES[0]} is not in the repository" in p for p in problems)
    assert any("#not-a-heading" in p for p in problems) and any("#d-cut-tiers" in p for p in problems)
    assert len(external_mentions([str(bad)])) == 1


def test_slug_follows_github():
    assert slug("Where to add") == "where-to-add"
    assert slug("D-Cut global top-K") == "d-cut-global-top-k"
    assert slug("Editing `GenerationBatchResult` (SpecExit)") == "editing-generationbatchresult-specexit"
    assert slug("Step 1: draft_extend") == "step-1-draft_extend"


# ----------------------------------------------------------------------------- engine rooms
ROOMS = ("dcut", "specexit", "attention")


@pytest.mark.parametrize("room", ROOMS)
def test_engine_room_docstring_names_its_modules(room):
    folder = os.path.join(ROOT, "sglang_ext", "engine", room)
    with open(os.path.join(folder, "__init__.py"), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    modules = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    missing = [m for m in modules if f"``{m}``" not in doc]
    assert doc and not missing, f"sglang_ext/engine/{room}/__init__.py docstring does not name {missing}"

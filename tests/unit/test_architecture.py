"""The package's import graph has no cycle, the pure math imports no SGLang, and the plugin is
imported by nobody inside the package (it sits at the top of the graph).

Every ``import`` statement is read with ``ast`` -- module level and inside functions alike (a lazy
import still closes a cycle) -- and turned into an edge between ``sglang_ext`` modules. No SGLang
needed. Budget: < 2 s.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set

import pytest

import sglang_ext

PKG_DIR = os.path.dirname(sglang_ext.__file__)
PURE_PACKAGES = ("sglang_ext.dcut", "sglang_ext.specexit", "sglang_ext.vocab")
PLUGIN = "sglang_ext.engine.plugin"


def _modules() -> Dict[str, str]:
    """Dotted module name -> file, for every ``.py`` file of the package."""
    out = {}
    root = os.path.dirname(PKG_DIR)
    for dirpath, _, files in os.walk(PKG_DIR):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _imports(name: str, path: str, modules: Dict[str, str]) -> Set[str]:
    """The package modules that ``name`` imports (``from pkg import submodule`` counts as the submodule)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                keep = len(parts) - node.level + (1 if is_pkg else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            if base not in modules:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in modules else base)
    found.discard(name)
    return found


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_finds_the_package_edges():
    """The reader sees lazy and module-level imports (guards the test against reading nothing)."""
    g = _graph()
    assert "sglang_ext.config" in g["sglang_ext.engine.eagle_worker"]  # module level
    assert PLUGIN in g["sglang_ext"]  # inside register()
    assert "sglang_ext.engine.eagle_worker" in g[PLUGIN]  # inside select_worker_class()


def test_cycle_finder_reports_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_plugin_is_imported_only_by_the_package_entry_point():
    importers = sorted(m for m, deps in _graph().items() if PLUGIN in deps)
    assert importers == ["sglang_ext"]


@pytest.mark.parametrize("pkg", PURE_PACKAGES)
def test_pure_math_imports_no_sglang_and_no_glue(pkg):
    modules = _modules()
    for name, path in modules.items():
        if name != pkg and not name.startswith(pkg + "."):
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith("sglang.") and n != "sglang", f"{name} imports {n}"
                assert not n.startswith("sglang_ext.engine"), f"{name} imports {n}"


def test_test_file_basenames_are_unique():
    """pytest imports test files by basename (rootdir-relative, no packages): two files of one name
    in different folders stop the whole run at collection ("import file mismatch")."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tests_dir = os.path.join(root, "tests")
    seen = {}
    dups = []
    for dirpath, _, files in os.walk(tests_dir):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                if f in seen:
                    dups.append((f, seen[f], os.path.relpath(dirpath, root)))
                seen[f] = os.path.relpath(dirpath, root)
    assert not dups, f"test files with the same basename: {dups}"

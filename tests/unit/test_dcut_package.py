"""Package-level rules for ``sglang_ext.dcut``: purity, docstrings, runnable examples.

* Pure: every module imports only torch, numpy, the standard library and ``sglang_ext.dcut``
  (checked on the AST, so an sglang import anywhere in a module fails, even a lazy one).
* Every public function has a numpydoc docstring with an ``Examples`` section, and every
  example runs (doctest).

Budget: < 5 s.
"""

import ast
import doctest
import importlib
import inspect
import pathlib
import sys

import pytest

import sglang_ext.dcut as dcut

PKG_DIR = pathlib.Path(dcut.__file__).parent
MODULES = sorted(p.stem for p in PKG_DIR.glob("*.py") if p.stem != "__init__")
ALLOWED_TOP = {"torch", "numpy", "__future__"} | set(sys.stdlib_module_names)


@pytest.mark.parametrize("path", sorted(PKG_DIR.glob("*.py")), ids=lambda p: p.name)
def test_module_imports_are_pure(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: use absolute imports"
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            ok = top in ALLOWED_TOP or name == "sglang_ext.dcut" or name.startswith("sglang_ext.dcut.")
            assert ok, f"{path.name} imports {name!r}; D-Cut core must stay pure"


def _public_functions():
    out = []
    for name in dcut.__all__:
        obj = getattr(dcut, name)
        if inspect.isfunction(obj):
            out.append((name, obj))
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                fn = member.__func__ if isinstance(member, classmethod) else member
                if inspect.isfunction(fn):
                    out.append((f"{name}.{attr}", fn))
    return out


@pytest.mark.parametrize("name,fn", _public_functions(), ids=lambda x: x if isinstance(x, str) else "")
def test_public_functions_have_numpydoc_examples(name, fn):
    doc = inspect.getdoc(fn) or ""
    assert "Examples\n--------" in doc and ">>>" in doc, f"{name} lacks a worked example"


def test_public_classes_are_documented():
    for name in dcut.__all__:
        obj = getattr(dcut, name)
        if inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), name


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    mod = importlib.import_module(f"sglang_ext.dcut.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0

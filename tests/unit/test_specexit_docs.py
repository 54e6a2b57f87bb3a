"""SpecExit package hygiene: runnable docstring examples, purity, shape comments.

* every docstring example of ``sglang_ext.specexit`` runs and prints what it claims;
* every public function and class has a numpydoc ``Examples`` section;
* the modules import only torch, numpy, the standard library and each other (no sglang),
  and ``defaults`` imports only the standard library;
* every tensor argument carries a shape comment (``# [batch_size, ...]``) on its line.
Budget: < 5 s.
"""

import ast
import doctest
import importlib
import inspect
import pathlib
import sys

import pytest

import sglang_ext.specexit as package

PACKAGE_DIR = pathlib.Path(package.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__")
EXPECTED_MODULES = {"criterion", "defaults", "draft_confidence", "overrides", "signals", "smoothing", "state"}


def test_the_module_list_is_complete():
    assert EXPECTED_MODULES <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"sglang_ext.specexit.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0
    if name != "__init__":
        assert result.attempted > 0, f"{name} has no runnable example"


@pytest.mark.parametrize("name", MODULES)
def test_public_functions_and_classes_have_examples(name):
    module = importlib.import_module(f"sglang_ext.specexit.{name}")
    missing = []
    for attr, obj in vars(module).items():
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            is_enum_like = inspect.isclass(obj) and issubclass(obj, (int, Exception))
            if "Examples" not in doc and not is_enum_like:
                missing.append(attr)
    assert not missing, f"{name}: no Examples section in {missing}"


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""


@pytest.mark.parametrize("name", MODULES + ["__init__"])
def test_modules_are_pure(name):
    allowed_third_party = {"torch", "numpy"}
    for imported in _imports(PACKAGE_DIR / f"{name}.py"):
        top = imported.split(".")[0]
        if imported.startswith("sglang_ext.specexit"):
            continue
        assert top != "sglang", f"{name} imports {imported}"
        assert top in sys.stdlib_module_names or top in allowed_third_party, f"{name} imports {imported}"
        if name == "defaults":
            assert top in sys.stdlib_module_names, f"defaults must be stdlib-only, imports {imported}"


def _tensor_like(annotation):
    text = ast.unparse(annotation) if annotation is not None else ""
    return "Tensor" in text or "IndexLike" in text


@pytest.mark.parametrize("name", MODULES)
def test_every_tensor_argument_has_a_shape_comment(name):
    path = PACKAGE_DIR / f"{name}.py"
    lines = path.read_text().splitlines()
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                if _tensor_like(arg.annotation) and "# [" not in lines[arg.lineno - 1]:
                    missing.append(f"{node.name}({arg.arg}) line {arg.lineno}")
    assert not missing, f"{name}: tensor arguments without a shape comment: {missing}"

"""README's flag table is the one generated from the config dataclasses.

Budget: < 2 s.
"""

import os

from sglang_ext import docs
from sglang_ext.config import DCutConfig, SpecExitConfig, iter_flags


def test_readme_flag_table_is_generated():
    with open(docs.README) as f:
        text = f.read()
    assert docs.readme_block() in text, "README flag table is stale: run python -m sglang_ext.docs --write-readme"


def test_table_lists_every_flag_with_its_default():
    table = docs.flags_markdown()
    for cls in (SpecExitConfig, DCutConfig):
        for _, spec, _ in iter_flags(cls):
            assert f"| `{spec.flag}" in table
    assert "| `--specexit-confidence-threshold VALUE` | `0.8` |" in table
    assert "| `--dcut-tiers R1,R2,...` | `0.25,0.5,0.75,1.0` |" in table
    for cls in (SpecExitConfig, DCutConfig):
        for _, spec, _ in iter_flags(cls):
            row = next(r for r in table.splitlines() if r.startswith(f"| `{spec.flag}"))
            assert ("a list is accepted too" in row) == (spec.list_join is not None), row


def test_readme_names_two_setup_commands():
    with open(docs.README) as f:
        text = f.read()
    assert "scripts/demo.sh" in text and "scripts/test.sh" in text
    root = os.path.dirname(docs.README)
    for script in ("scripts/demo.sh", "scripts/test.sh", ".ci/run"):
        assert os.access(os.path.join(root, script), os.X_OK), script

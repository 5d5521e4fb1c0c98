"""The docs' sources are checked without building them (scripts/check_docs.py, fast): every
python/bash block is marked run / tested / not run, every page opens with a summary and is
reachable from the home page, the README's links resolve, and every generated table (the
command line, the result's fields, the registries, the verdicts' criteria) matches the
code. `make docs` builds the site and runs the blocks marked to run."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import check_docs  # noqa: E402


def test_every_block_is_marked_and_every_page_reachable():
    assert check_docs.static_checks() == []


def test_the_generated_tables_match_the_code():
    assert check_docs.check_tables() == [], "run `python scripts/docs_tables.py`"


def test_a_stale_generated_table_is_found(tmp_path, monkeypatch):
    import docs_tables

    page = tmp_path / "page.md"
    page.write_text("# P\n\nS.\n\n<!-- generated: criteria -->\n| old |\n<!-- end generated -->\n")
    monkeypatch.setattr(docs_tables, "DOCS", tmp_path)
    monkeypatch.setattr(docs_tables, "ROOT", tmp_path)
    stale = docs_tables.regenerate(write=False)
    assert stale == ["page.md: block 'criteria' differs from the code"]
    docs_tables.regenerate(write=True)
    assert docs_tables.regenerate(write=False) == []


def test_the_add_model_example_is_the_registry_entry():
    """docs/how-to/add-model.md shows Gemma-3-270M's entry as registered (every field but
    its free-text notes)."""
    import dataclasses

    from poskernel_tl.models.registry import REGISTRY, ModelSpec

    text = (ROOT / "docs" / "how-to" / "add-model.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    spec = eval(compile("\n".join(line.strip() for line in code.splitlines()), "add-model.md",
                        "eval"), {"ModelSpec": ModelSpec})
    assert dataclasses.replace(spec, notes=REGISTRY["gemma3-270m"].notes) == REGISTRY["gemma3-270m"]

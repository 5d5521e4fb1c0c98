"""The docs' "Add an analysis" example runs as written (docs/how-to/add-analysis.md):
registered, it is a `poskernel analyze` subcommand with its option as a flag and writes its
table; the README's Python example runs as written."""

import re
import shutil
import types
from pathlib import Path

import pandas as pd
import pytest

from poskernel_tl.analyses import registry
from poskernel_tl.apps import cli

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "v0.2.0"


def example_module() -> types.ModuleType:
    text = (ROOT / "docs" / "how-to" / "add-analysis.md").read_text()
    section = text[text.index("# Add an analysis"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()
                and not line.startswith("#")]) <= 20
    module = types.ModuleType("g_at_lag")
    exec(compile(code, "docs/how-to/add-analysis.md", "exec"), module.__dict__)
    return module


def test_the_docs_analysis_runs_from_the_command_line(tmp_path, monkeypatch, capsys):
    spec = example_module().SPEC
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    shutil.copytree(GOLDEN, tmp_path, dirs_exist_ok=True)
    rc = cli.main(["analyze", "g-at-lag", "--model", "tiny-llama", "--dataset", "prose",
                   "--length", "64", "--n-seqs", "16", "--out", str(tmp_path), "--lag", "3",
                   "--quiet"])
    assert rc == 0, capsys.readouterr().err
    table = pd.read_csv(tmp_path / "results" / "tiny-llama_prose_64_g-at-lag.csv")
    g_pooled = __import__("numpy").load(GOLDEN / "results" / "tiny-llama_prose_64_g.npz")[
        "trackA_pooled"]
    assert list(table.columns[:3]) == ["model", "dataset", "length"]
    assert table["g"].tolist() == g_pooled[..., 2].ravel().tolist()


@pytest.mark.smollm2
# slow: its calls on SmolLM2 run in make docs (the first tutorial) and test_sink_first.py
@pytest.mark.slow
def test_the_readme_python_example_runs_on_real_files(smollm2, tmp_path, monkeypatch):
    """The README's first Python block, as written, on the 20 smallest standard-library files
    over 600 bytes (texts of different lengths, both sets cut to the shortest)."""
    import sysconfig

    import poskernel_tl as pk

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Python\n\n```python\n(.*?)```", text, re.S).group(1)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in stdlib.glob("*.py") if p.stat().st_size > 600),
                   key=lambda p: (p.stat().st_size, p.name))[:20]
    assert len(files) == 20
    monkeypatch.setattr(pk, "load_model", lambda name: smollm2)
    monkeypatch.chdir(tmp_path)
    scope = {"my_files": [str(f) for f in files]}
    exec(compile(code, "README.md", "exec"), scope)
    res = scope["res"]
    assert res.length >= 100 and len(res.seq_id) == 10 and res.centered
    assert (tmp_path / "artifacts" / "mine" / "results").is_dir()

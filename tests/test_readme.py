"""The README's "Adding an analysis" example runs as written: registered, it is a
`poskernel analyze` subcommand with its option as a flag and writes its table."""

import re
import shutil
import types
from pathlib import Path

import pandas as pd

from poskernel_tl import cli
from poskernel_tl.analyses import registry

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "v0.2.0"


def example_module() -> types.ModuleType:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Adding an analysis"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()
                and not line.startswith("#")]) <= 20
    module = types.ModuleType("g_at_lag")
    exec(compile(code, "README.md", "exec"), module.__dict__)
    return module


def test_the_readme_analysis_runs_from_the_command_line(tmp_path, monkeypatch, capsys):
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

"""The analysis registry: every analysis runs on a condition through one path
(`poskernel analyze NAME`, the grid's --analyses) and writes
results/{model}_{dataset}_{T}_{NAME}.csv; the CLI's subcommands and flags come from the
registry and the options dataclasses."""

import dataclasses

import pandas as pd
import pytest
from tiny_models import tiny_loaded

from poskernel_tl import constants as C
from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.registry import REGISTRY, get
from poskernel_tl.apps import cli
from poskernel_tl.errors import UserError
from poskernel_tl.plan.config import RunConfig, cli_fields, from_args
from poskernel_tl.run.analyze import run_analysis


@pytest.mark.parametrize("name", ["separable", "fourier-kernel", "qig-control", "spectral"])
def test_analysis_writes_its_table(name, tiny_tokenizer, tmp_path):
    model = tiny_loaded("llama", tiny_tokenizer)
    cfg = RunConfig(model="tiny-llama", dataset="random", length=24, n_seqs=6,
                    out=str(tmp_path), batch_size=3, progress=False)
    table, path = run_analysis(name, cfg, model=model)
    assert path == C.result_path(tmp_path, "tiny-llama", "random", 24, get(name).suffix)
    back = pd.read_csv(path)
    assert len(back) == len(table) > 0 and list(back.columns[:3]) == ["model", "dataset",
                                                                      "length"]
    assert (back["model"] == "tiny-llama").all()
    assert all(c in back.columns for c in get(name).columns)


def test_every_analysis_declares_one_spec():
    expected = {"spectral", "freq-usage", "gk-baseline", "fourier-kernel", "seq-pca",
                "qig-control", "kernel-patching", "separable", "mean-field", "pe-correlation",
                "seq-compression"}
    assert set(REGISTRY) == expected
    for name, spec in REGISTRY.items():
        assert isinstance(spec, AnalysisSpec) and spec.name == name and callable(spec.compute)
        assert dataclasses.is_dataclass(spec.options)
        assert spec.suffix.endswith(".csv")


def test_analyze_subcommands_and_flags_come_from_the_registry():
    parser = cli.build_parser()
    for spec in REGISTRY.values():
        args = parser.parse_args(["analyze", spec.name, "--model", "tiny"])
        assert args.analysis == spec.name
        for f in cli_fields(spec.options):
            assert hasattr(args, f.name), (spec.name, f.name)
    args = parser.parse_args(["analyze", "kernel-patching", "--max-seqs", "3"])
    assert from_args(REGISTRY["kernel-patching"].options, args).max_seqs == 3


def test_kernel_patching_default_is_small():
    assert REGISTRY["kernel-patching"].options().max_seqs <= 2


def test_unknown_analysis_names_the_valid_ones():
    with pytest.raises(UserError, match="separable"):
        get("nosuch")


def test_unknown_analysis_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["analyze", "nosuch"])
    assert exit_.value.code == 2
    assert "separable" in capsys.readouterr().err


def test_analyses_declare_whether_they_are_defined_for_encoders():
    both = {name for name, spec in REGISTRY.items() if spec.bidirectional}
    assert both == {"spectral", "pe-correlation", "gk-baseline", "freq-usage"}


@pytest.mark.parametrize("name", ["separable", "kernel-patching", "mean-field"])
def test_causal_only_analyses_refuse_an_encoder(name, tiny_tokenizer, tmp_path, monkeypatch):
    model = tiny_loaded("bert", tiny_tokenizer)
    cfg = RunConfig(model="tiny-bert", dataset="random", length=24, n_seqs=6,
                    out=str(tmp_path), batch_size=3, progress=False)
    with pytest.raises(UserError, match="bidirectional"):
        run_analysis(name, cfg, model=model)
    # a registered encoder is refused before anything loads
    monkeypatch.setattr("poskernel_tl.run.analyze.prepare", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(UserError, match="minilm-l6 is a bidirectional encoder"):
        run_analysis(name, dataclasses.replace(cfg, model="minilm-l6"))


def test_encoder_analysis_runs_two_sided(tiny_tokenizer, tmp_path):
    model = tiny_loaded("bert", tiny_tokenizer)
    cfg = RunConfig(model="tiny-bert", dataset="random", length=24, n_seqs=6,
                    out=str(tmp_path), batch_size=3, progress=False)
    table, _ = run_analysis("pe-correlation", cfg, model=model)
    assert len(table) == 2 * 4 and table["two_sided_trackA_pooled"].all()

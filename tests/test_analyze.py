"""`poskernel analyze NAME`: each analysis module runs on a condition through one path
and writes results/{model}_{dataset}_{T}_{NAME}.csv."""

import pandas as pd
import pytest
from tiny_models import tiny_loaded

from poskernel_tl import constants as C
from poskernel_tl.analyze import ANALYSES, analysis_module, run_analysis
from poskernel_tl.runner import RunConfig


@pytest.mark.parametrize("name", ["separable", "fourier-kernel", "qig-control"])
def test_analysis_writes_its_table(name, tiny_tokenizer, tmp_path):
    model = tiny_loaded("llama", tiny_tokenizer)
    cfg = RunConfig(model="tiny-llama", dataset="random", length=24, n_seqs=6,
                    out=str(tmp_path), batch_size=3, progress=False)
    table, path = run_analysis(name, cfg, model=model)
    assert path == C.result_path(tmp_path, "tiny-llama", "random", 24, f"{name}.csv")
    back = pd.read_csv(path)
    assert len(back) == len(table) > 0 and list(back.columns[:3]) == ["model", "dataset",
                                                                      "length"]
    assert (back["model"] == "tiny-llama").all()


def test_every_listed_analysis_has_an_entry_point():
    for name in ANALYSES:
        module = analysis_module(name)
        assert module.NAME == name and callable(module.analyze)


def test_unknown_analysis_names_the_valid_ones():
    with pytest.raises(ValueError, match="separable"):
        analysis_module("nosuch")

"""The report's Reproductions section: each published figure beside ours, read from the
per-condition values of the registered statistics, with our protocol and what differs."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl.report import reproductions as R
from poskernel_tl.report.build import build_report


def result(dataset: str, length: int = 64, bos: bool = False):
    return SimpleNamespace(model="m", dataset=dataset, length=length, provenance={
        "bos_first": bos, "n_eval": 100, "weights": "GGUF Q8_0, dequantised"},
        config={"null_seqs": 100 if dataset != "prose" else 8})


def per(rows) -> pd.DataFrame:
    return pd.DataFrame(rows).set_index("condition")


def test_gu_row_reads_sink1_per_dataset_at_their_length():
    table = R.reproductions_table(per([
        {"condition": "a", "model": "m", "dataset": "prose", "length": 64, "Sink1": 0.72},
        {"condition": "b", "model": "m", "dataset": "repeated", "length": 64, "Sink1": 0.0},
        {"condition": "c", "model": "m", "dataset": "random", "length": 256, "Sink1": 0.9}]),
        [result("prose"), result("repeated"), result("random", 256)])
    (row,) = table.to_dict("records")
    assert row["our figure"] == "72.00 / — / 0.00 %"  # T = 64 as Gu et al.; random not at 64
    # the sequences Sink₁ read: the first null_seqs of each condition's
    assert row["our protocol"].startswith("T = 64, 8/100 sequences of prose / repeated")
    assert "no BOS first" in row["our protocol"] and "GGUF" in row["our protocol"]
    assert "LLaMA3-8B 99.02 / 91.23 / 0.00 %" in row["their figure"]


def test_frequency_row_and_nothing_without_values():
    rows = [{"condition": "a", "model": "m", "dataset": "prose", "length": 256,
             "hf_share_positional": 0.61, "hf_share_others": 0.52, "hf_share_diff": 0.09,
             "hf_share_p": 0.004, "n_positional_heads": 12.0, "Sink1": np.nan}]
    (row,) = R.reproductions_table(per(rows), [result("prose", 256)]).to_dict("records")
    assert row["source"].startswith("Barbero et al.")
    assert row["our figure"] == "prose, T = 256: 0.610 vs 0.520 (12 positional heads), p = 0.004"
    rows[0]["hf_share_diff"] = np.nan
    assert R.reproductions_table(per(rows), [result("prose", 256)]).empty


def test_in_the_report(tiny_tokenizer, tmp_path):
    model = tiny_loaded("llama", tiny_tokenizer)
    gen = torch.Generator().manual_seed(0)
    tokens = {"random": torch.randint(3, 290, (4, 24), generator=gen),
              "repeated": torch.randint(3, 290, (4, 1), generator=gen).expand(4, 24)}
    for dataset, ids in tokens.items():
        pk.measure(model, ids, progress=False, null_perms=2, dataset=dataset).save(tmp_path)
    page = build_report(tmp_path, workers=1).read_text()
    assert '<h2 id="reproductions">Reproductions</h2>' in page
    table = pd.read_csv(tmp_path / "report" / "reproductions.csv")
    assert list(table["our model"]) == ["tiny-llama"] * len(table)
    assert table["source"].str.startswith("Gu et al.").any()
    data = next((tmp_path / "report" / "data").glob("*random*.js")).read_text()
    assert '["r2-within-pooled",' in data  # the head view's within-row R² beside the raw one

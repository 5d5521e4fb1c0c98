"""The spectral analysis' file layer: ``run_spectral`` on synthetic ConditionResults
writes both g sources (Track B, pre-registered; Track A, exploratory) with their peaks and
spectra, ``read_spectral`` reads them back, and the grid's gate."""

import numpy as np
import pandas as pd
import pytest
from synthetic import make_result
from test_spectral import LAGS, SMOL, T, rope_head

from poskernel_tl.analyses import spectral as S
from poskernel_tl.analyses.spectral import io as SIO
from poskernel_tl.analyses.spectral import processing as SP
from poskernel_tl.analyses.spectral import table as ST
from poskernel_tl.constants import SPECTRAL_CSV, SPECTRAL_PEAKS_CSV, result_path
from poskernel_tl.models.registry import ModelSpec


def rope_spec(n_layers: int = 2, n_heads: int = 2) -> ModelSpec:
    return ModelSpec("syn-rope", None, "rope", "rmsnorm", n_layers, n_heads, n_heads, 64,
                     1e5, 2048)


def run(spec, g, r2, length, out, dataset="wikipedia", centered=True, s_pe=None,
        usage=None, **kw):
    """run_spectral on a synthetic ConditionResult; returns (summary, table, peaks) as
    read back from the CSVs it writes."""
    result = make_result(spec, length, g=g, r2=r2, dataset=dataset, centered=centered,
                         s_pe=s_pe, usage=usage)
    _, _, summary = S.run_spectral(result, out, **kw)
    table = pd.read_csv(result_path(out, spec.name, dataset, length, SPECTRAL_CSV))
    peaks = pd.read_csv(result_path(out, spec.name, dataset, length, SPECTRAL_PEAKS_CSV))
    return summary, table, peaks


def test_grid_gate_over_rotary_models_only():
    rope = make_result(rope_spec(), T, r2=np.full((2, 2), 0.7))
    low = make_result(rope_spec(), T, r2=np.full((2, 2), 0.4))
    gpt2 = make_result(ModelSpec("syn-gpt2", None, "learned-absolute", "layernorm", 2, 2, 2,
                                 16, None, 1024), T, r2=np.full((2, 2), 0.0))
    assert S.grid_gate([rope, gpt2]) is True  # GPT-2 does not enter the gate
    assert S.grid_gate([rope, low]) is False  # mean 0.55 over both rotary conditions
    assert S.grid_gate([gpt2]) is None


def test_run_spectral_rotary(tmp_path):
    spec = rope_spec()
    heads = [[rope_head(SMOL, T, 10 * layer + h) for h in range(2)] for layer in range(2)]
    g = np.array([[gu[0] for gu in row] for row in heads])
    usage = np.array([[gu[1] for gu in row] for row in heads])
    r2 = np.array([[0.9, 0.8], [0.7, 0.3]])  # gate = 0.675 > 0.6; head (1, 1) below 0.40
    summary, table, peaks = run(spec, g, r2, T, tmp_path, usage=usage, n_null=200)
    assert summary["gate_met"] and summary["gate_value"] == pytest.approx(0.675)
    assert table["preregistered"].tolist() == [True, True, True, False]
    assert table["analysed"].all() and summary["n_preregistered"] == 3
    done = table[table["preregistered"]]
    assert done["aligned"].astype(bool).all() and summary["frac_aligned"] == 1.0
    assert summary["frac_aligned_early"] == 1.0 and summary["n_early"] == 4
    assert summary["fpr_early"] == pytest.approx(table["fpr"].mean())
    assert (done["ref_peak_r"] > 0.9).all() and (table["source"] == "gram_centered").all()
    assert len(peaks) == 20 and not table["raw_spectrum"].any()
    assert summary["mean_frac_matched_early"] == pytest.approx(table["frac_matched"].mean())
    # the usage file weights the reference, in θ order: same scores as from the arrays
    direct, _ = ST.spectral_table(g, r2, SMOL, T, usage=usage, gate_met=True, n_null=50)
    np.testing.assert_allclose(done["ref_peak_r"], direct["ref_peak_r"][:3], rtol=1e-5)
    equal, _ = ST.spectral_table(g, r2, SMOL, T, gate_met=True, n_null=50)
    assert (done["ref_peak_r"].to_numpy() > equal["ref_peak_r"][:3].to_numpy()).all()

    # a failed gate: nothing pre-registered, every head still analysed (exploratory)
    summary, table, _ = run(spec, g, r2 * 0.5, T, tmp_path, n_null=50)
    assert summary["n_preregistered"] == 0 and summary["n_analysed"] == 4
    assert (table["status"].str.startswith("exploratory")).all()
    assert summary["trackA_frac_aligned_early"] == 1.0  # Track A's g is the same here
    _, table, _ = run(spec, g, r2 * 0.5, T, tmp_path, force=True, raw_spectrum=True,
                      n_null=50)
    assert table["analysed"].all() and table["forced"].all() and table["raw_spectrum"].all()
    assert (table["status"] == "ungated").all() and not table["gate_met"].any()


def test_both_sources_are_written_and_read_back(tmp_path):
    """Track B (pre-registered) and Track A (exploratory) tables, peaks and spectra are
    saved with the condition; read_spectral gives back what run_spectral returned, and says
    what is missing or damaged instead of raising."""

    spec = rope_spec()
    g = np.array([[rope_head(SMOL, T, 10 * layer + h)[0] for h in range(2)]
                  for layer in range(2)])
    result = make_result(spec, T, g=g, r2=np.array([[0.9, 0.8], [0.7, 0.3]]))
    result = result.replace(g_pooled=np.exp(-LAGS / 10) * np.ones((2, 2, 1)))  # smooth
    table, peaks, summary = S.run_spectral(result, tmp_path, n_null=100)
    saved = SIO.read_spectral(tmp_path, spec.name, "wikipedia", T, 2, 2)
    assert not saved.missing and not saved.problems and saved.has("trackA")
    back = saved.tables["trackB"]
    np.testing.assert_allclose(back["p_value"], table["p_value"])
    np.testing.assert_array_equal(back["aligned"], table["aligned"].astype(float))
    np.testing.assert_allclose(saved.peaks["trackB"]["omega"], peaks["omega"])
    a = saved.tables["trackA"]
    assert (a["status"] == "exploratory").all() and not a["preregistered"].any()
    assert (a["source"] == "trackA_pooled").all() and (a["aligned"] == 0).all()
    assert summary["trackA_frac_aligned_early"] == 0.0 and summary["frac_aligned_early"] == 1
    np.testing.assert_allclose(saved.spectra["trackB"][0, 1], SP.spectrum(g[0, 1], T),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(saved.omega, SP.frequency_grid(T))
    assert saved.head("trackB", 1, 0)["layer"] == 1

    where = SIO.paths(tmp_path, spec.name, "wikipedia", T)
    where["trackA"].unlink()
    where["trackB_peaks"].write_text("garbage\n\"")
    saved = SIO.read_spectral(tmp_path, spec.name, "wikipedia", T, 2, 2)
    assert saved.missing == ["trackA"] and not saved.has("trackB")
    assert saved.problems and saved.problems[0][0] == where["trackB_peaks"].name
    where["spectra"].write_bytes(b"not a zip")
    assert SIO.read_spectral(tmp_path, spec.name, "wikipedia", T, 2, 2).problems
    empty = SIO.read_spectral(tmp_path / "nothing", spec.name, "wikipedia", T, 2, 2)
    assert empty.missing == ["trackB", "trackA"] and not empty.problems


def test_run_spectral_random_tokens_read_the_raw_gram(tmp_path):
    spec = rope_spec()
    g = np.stack([[rope_head(SMOL, T, h)[0] for h in range(2)]] * 2)
    _, table, _ = run(spec, g, np.full((2, 2), 0.9), T, tmp_path, "random", centered=False,
                      n_null=50)
    assert (table["source"] == "gram_raw").all() and table["analysed"].all()


def test_run_spectral_gpt2_and_nope(tmp_path):
    r = np.random.default_rng(0)
    gpt2 = ModelSpec("syn-gpt2", None, "learned-absolute", "layernorm", 1, 2, 2, 16, None, 1024)
    s_pe = np.stack([np.cos(0.4 * LAGS), r.standard_normal(T - 1)])[None]
    g = s_pe + 0.05 * r.standard_normal(s_pe.shape)
    summary, table, peaks = run(gpt2, g, np.array([[0.5, 0.1]]), T, tmp_path, s_pe=s_pe,
                                n_null=50)
    assert summary["gate_met"] is None and table["gate_met"].isna().all()
    assert table["status"].tolist() == ["ungated", "exploratory: R2 <= 0.40"]
    for col in ("r_pe_trackA_pooled", "r_pe_gram_raw", "r_pe_gram_centered"):
        assert table[col][0] > 0.95
    assert table["n_matched"].isna().all() and not peaks["matched"].any()

    nope = ModelSpec("syn-nope", None, "none", "rmsnorm", 1, 2, 2, 16, None, 2048)
    _, table, _ = run(nope, g, np.array([[0.1, 0.1]]), T, tmp_path, force=True, n_null=50)
    assert table["analysed"].all() and table["ref_peak_r"].isna().all()
    assert table["n_above_3x_median"].between(0, 5).all()


def test_plot_head_spectrum(tmp_path):
    spec = rope_spec(1, 1)
    result = make_result(spec, T, g=rope_head(SMOL, T, 0)[0][None, None], r2=np.array([[0.9]]))
    fig = S.plot_head_spectrum(result, 0, 0)
    assert "aligned=True" in fig.axes[0].get_title()


def test_a_spectral_table_of_an_older_version_says_what_to_do(tmp_path):
    """A missing column is named, with the command that rewrites the file; an unreadable
    file and a wrong row count are named without it."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"layer": [0], "head": [0]}).to_csv(path, index=False)
    df, why = SIO._read_csv(path, ("layer", "head", "R2"), None)
    assert df is None and why == ("missing column R2 (written by an older version: rerun "
                                  "poskernel spectral)")
    df, why = SIO._read_csv(path, ("layer", "head"), 2)
    assert df is None and why == "has 1 rows, expected 2"
    path.write_bytes(b"\xff\xfe\x00")
    df, why = SIO._read_csv(path, ("layer",), None)
    assert df is None and why.startswith("could not be parsed") and "rerun" not in why

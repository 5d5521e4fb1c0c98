"""Spectral analysis of g(Δ): processing, peaks, matching, the per-head null, references,
GPT-2's S_PE correlations and the condition table (the file layer: test_spectral_files.py).

The four ``test_issue_*`` tests are the reproductions of the issue "Spectral analysis that a
flat kernel cannot pass": each shows the seed's literal procedure (``raw_spectrum=True`` or
the seed's score) failing and the default passing."""


import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from poskernel_tl.analyses import spectral as S
from poskernel_tl.analyses.spectral import align as SA
from poskernel_tl.analyses.spectral import null as N
from poskernel_tl.analyses.spectral import processing as SP
from poskernel_tl.analyses.spectral import table as ST
from poskernel_tl.models.registry import ModelSpec

T = 256
N_FFT = 4 * T
LAGS = np.arange(1, T, dtype=np.float64)
BIN = 2 * np.pi / T
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def thetas_of(base: float, d_head: int) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, d_head, 2) / d_head)


SMOL = thetas_of(1e5, 64)  # SmolLM2-135M


def rope_head(thetas: np.ndarray, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(g, usage) of a pure-RoPE head: g(Δ) = Re Σ_i q_i k̄_i e^{iθ_iΔ} for random complex
    pairs q, k; usage = |q_i|·|k_i|."""
    r = np.random.default_rng(seed)
    q = r.standard_normal(len(thetas)) + 1j * r.standard_normal(len(thetas))
    k = r.standard_normal(len(thetas)) + 1j * r.standard_normal(len(thetas))
    lags = np.arange(1, length)
    g = np.real((q * k.conj())[None] * np.exp(1j * np.outer(lags, thetas))).sum(1)
    return g, np.abs(q) * np.abs(k)


# ------------------------------------------------------------------ processing and peaks
def test_raw_spectrum_is_the_seeds_zero_padded_fft():
    g = np.random.default_rng(0).standard_normal(T - 1)
    mag = SP.spectrum(g, T, raw_spectrum=True)
    assert mag.shape == (N_FFT // 2 + 1,)
    padded = np.zeros(N_FFT)
    padded[1:T] = g  # g(Δ) at index Δ instead of Δ−1: only the phase changes
    np.testing.assert_allclose(mag, np.abs(np.fft.fft(padded))[: N_FFT // 2 + 1], atol=1e-9)
    assert SP.frequency_grid(T)[-1] == pytest.approx(np.pi)
    demeaned = SP.spectrum(g, T, raw_spectrum=True, demean=True)
    assert demeaned[0] == pytest.approx(0, abs=1e-9)


def test_default_processing_removes_quadratic_trends_and_tapers():
    trend = 3.0 - 0.02 * LAGS + 1e-4 * LAGS ** 2
    assert not SP.prepare(trend, T).any()  # a constant or quadratic g leaves nothing
    assert SA.spectral_alignment(trend, SMOL)["n_peaks_found"] == 0
    w = SP.lag_window(T)
    assert w[T // 2 - 1] == pytest.approx(1.0) and w[0] < 1e-3 and w[-1] < 1e-3
    cosine = np.cos(0.5 * LAGS)
    h = SP.prepare(cosine + trend, T)
    np.testing.assert_allclose(h, SP.prepare(cosine, T), atol=1e-9)  # linear in g
    # batch axes are processed row by row
    batch = np.stack([cosine, trend, cosine + trend])
    np.testing.assert_allclose(SP.prepare(batch, T)[0], SP.prepare(cosine, T), atol=1e-12)
    with pytest.raises(ValueError, match="lags"):
        SP.prepare(cosine[:-1], T)


@pytest.mark.parametrize("length", [300, 32768])
def test_the_trend_is_numpys_weighted_least_squares_fit(length):
    """The removed trend equals np.polyfit's weighted least-squares quadratic (weights √w,
    the taper's square root, on the lags' scaled positions), at a length where a [lag, lag]
    projection matrix would take 8.6 GB (the trend is kept as its two thin factors)."""
    lags = np.arange(1, length)
    g = np.cos(0.01 * lags) + 1e-5 * lags + np.random.default_rng(0).standard_normal(length - 1)
    w = SP.lag_window(length)
    x = (lags - length / 2) / (length / 2)
    coef = np.polyfit(x, g, SP.DETREND_DEGREE, w=np.sqrt(w))
    want = (g - np.polyval(coef, x)) * w
    np.testing.assert_allclose(SP.prepare(g, length), want, atol=1e-9 * np.abs(g).max())


@pytest.mark.parametrize("length", [256, 1024])
def test_interpolated_peaks_are_precise(length):
    """Off-grid planted frequencies come back within 1% of a DFT bin (grid step: 25%)."""
    planted = np.array([0.2037, 0.5213, 0.9871, 1.6042, 2.4519])
    lags = np.arange(1, length)
    g = np.cos(np.outer(lags, planted) + [0.3, 1.2, 2.0, 0.1, 2.9]) @ [1.0, 0.8, 1.2, 0.9, 1.1]
    res = SA.spectral_alignment(g, planted, length=length)
    assert res["n_peaks_found"] == 5 and res["significant"].all()
    found = np.sort(res["peaks"])
    assert np.abs(found - planted).max() < 0.01 * 2 * np.pi / length, found - planted
    assert res["matched"].all() and res["frac_matched"] == 1.0
    assert res["aligned"] and res["p_value"] < 0.01


def test_peaks_need_prominence_and_sit_above_the_trend_region():
    g = np.cos(0.6 * LAGS) + 0.1 * np.cos(1.3 * LAGS) + 0.01 * np.cos(2.0 * LAGS)
    res = SA.spectral_alignment(g, SMOL)
    # the 1% component's peak is 1% of the largest: below the 5% prominence floor
    assert res["n_peaks_found"] == 2
    np.testing.assert_allclose(np.sort(res["peaks"]), [0.6, 1.3], atol=0.01 * BIN)
    for bins in (1.0, 2.0, 3.0):  # inside the trend region: its side lobes are no evidence
        low = SA.spectral_alignment(np.cos(bins * BIN * LAGS), SMOL)
        assert (low["peaks"] >= 4 * BIN).all() and low["n_significant"] == 0
        assert not low["aligned"]


# ------------------------------------------------------------ the issue's reproductions
@pytest.mark.parametrize("thetas,raw_matched", [(SMOL, 4), (thetas_of(1e4, 64), 3),
                                                (thetas_of(1e4, 128), 5)])
def test_issue_flat_kernel_matches_only_in_the_raw_spectrum(thetas, raw_matched):
    flat = np.ones(T - 1)
    raw = SA.spectral_alignment(flat, thetas, raw_spectrum=True)
    # the Dirichlet side lobes ≈ 1 bin apart pass as peaks, as the issue reports
    np.testing.assert_allclose(raw["peaks"], [0.0368, 0.0614, 0.0859, 0.1104, 0.1350],
                               atol=5e-4)
    assert raw["n_matched"] == raw_matched and raw["criterion_met"]
    assert raw["chance"] > 0.5  # and the criterion's chance level says why
    new = SA.spectral_alignment(flat, thetas)
    assert new["n_peaks_found"] == 0 and new["frac_matched"] == 0.0
    assert not new["criterion_met"] and not new["aligned"]


def test_issue_reference_score_follows_structure_not_low_frequency_power():
    """The seed's equal-weight linear-power Pearson scores a flat kernel 1.0 and an
    exponential decay ≈ 0.67; the usage-weighted peak-shape score gives neither credit and
    recognises a pure RoPE head."""
    ref_equal = thetas_of(1e4, 64)
    flat = SA.spectral_alignment(np.ones(T - 1), ref_equal)
    assert flat["pearson_literal"] > 0.99
    for tau in (5.0, 20.0, 100.0):
        res = SA.spectral_alignment(np.exp(-LAGS / tau), ref_equal)
        assert abs(res["ref_peak_r"]) < 0.15, (tau, res["ref_peak_r"])
        assert not res["aligned"]
    assert SA.spectral_alignment(np.exp(-LAGS / 20), ref_equal)["pearson_literal"] > 0.6
    own = []
    for seed in range(10):
        g, usage = rope_head(ref_equal, T, seed)
        res = SA.spectral_alignment(g, ref_equal, usage=usage)
        own.append(res["ref_peak_r"])
        assert res["aligned"], seed
    assert np.median(own) > 0.9, own


def test_issue_chance_and_p_value_do_not_depend_on_other_heads():
    """The old null drew frequencies over a band spanned by all heads' peaks; now each head
    is judged on its own peaks: its row is identical whatever the other heads are."""
    g_a, _ = rope_head(SMOL, T, 1)
    others = [np.exp(-LAGS / 10) + 0.3 * np.cos(0.06 * LAGS),
              np.cos(2.9 * LAGS) + np.cos(0.13 * LAGS),
              np.random.default_rng(3).standard_normal(T - 1)]
    rows = []
    for other in others:
        table, _ = ST.spectral_table(np.stack([[g_a, other]]), np.array([[0.9, 0.9]]), SMOL, T,
                                    gate_met=True, n_null=500)
        rows.append(table.iloc[0])
    for row in rows[1:]:
        for col in ("chance", "p_value", "statistic", "n_matched", "ref_peak_r"):
            assert row[col] == rows[0][col], col
    alone = SA.spectral_alignment(g_a, SMOL, n_null=500)
    assert rows[0]["p_value"] == alone["p_value"] and rows[0]["chance"] == alone["chance"]


def test_issue_frac_matched_counts_out_of_five():
    g = np.cos(SMOL[1] * LAGS) + 0.7 * np.cos(SMOL[4] * LAGS + 1.0)
    res = SA.spectral_alignment(g, SMOL)
    assert res["n_peaks_found"] == 2 and res["matched"].all()
    assert res["n_matched"] == 2 and res["frac_matched"] == pytest.approx(0.4)
    assert not res["criterion_met"]  # 2 of 5, although both peaks found match
    assert res["aligned"]  # two exact rotary frequencies are evidence, unlike the count


# ------------------------------------------------------------------------- the null
def test_seed_criterion_and_marginal_flags():
    omega = np.array([0.103, 0.094, 0.5, 0.0405])
    thetas = np.array([0.1, 0.04])
    m = N.match_peaks(omega, thetas, N_FFT)
    np.testing.assert_array_equal(m["matched"], [True, True, False, True])
    np.testing.assert_allclose(m["rel_error"], [0.03, 0.06, 4.0, 0.0125])
    np.testing.assert_array_equal(m["marginal"], [False, True, False, False])
    # absolute floor: within one padded bin of θ although more than 10% away
    tiny = N.match_peaks(np.array([0.004]), np.array([0.0025]), N_FFT)
    assert tiny["matched"][0] and tiny["rel_error"][0] > 0.1


def test_rotation_null_chance_level_is_the_criterions_coverage():
    """For evenly spaced ln θ (spacing s) the ±10% windows cover ln(1.1/0.9)/s of the log
    axis: the chance level of a peak among the θ_i, whatever its position."""
    s = np.log(1e5) * 2 / 64
    for omega in (0.2, 0.45, 0.83):
        res = N.rotation_null(np.array([omega]), np.array([True]), SMOL, T, N_FFT, n_null=4000)
        assert res["chance"] == pytest.approx(np.log(1.1 / 0.9) / s, abs=0.01)
        assert res["spacing"] == pytest.approx(s)


def test_rotation_null_p_values():
    on = np.array([SMOL[0], SMOL[2], SMOL[3]])
    res = N.rotation_null(on, np.ones(3, bool), SMOL, T, N_FFT, n_null=1000, seed=2)
    assert res["p_value"] < 0.01
    between = np.sqrt(SMOL[1:4] * SMOL[2:5])  # geometric midpoints: as far as can be
    res = N.rotation_null(between, np.ones(3, bool), SMOL, T, N_FFT, n_null=1000)
    assert res["p_value"] > 0.95
    again = N.rotation_null(between, np.ones(3, bool), SMOL, T, N_FFT, n_null=1000)
    np.testing.assert_array_equal(res["null"], again["null"])  # seeded
    none = N.rotation_null(on, np.zeros(3, bool), SMOL, T, N_FFT, n_null=100)
    assert np.isnan(none["p_value"]) and np.isfinite(none["chance"])
    f = N.null_factors(0.36, 1000, 0)
    assert np.log(f).min() >= -0.18 and np.log(f).max() < 0.18
    counts, _ = np.histogram(np.log(f), np.linspace(-0.18, 0.18, 11))
    np.testing.assert_array_equal(counts, 100)  # stratified


def test_llama3_frequencies_match_hf_and_decide_matching():
    spec = ModelSpec("syn-llama3", None, "rope", "rmsnorm", 1, 2, 2, 64, 5e5, 131072,
                     rope_scaling=LLAMA3)
    used = spec.rotary_frequencies()
    hf_cfg = LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=131072,
                         rope_scaling=dict(LLAMA3, rope_theta=5e5))
    torch.manual_seed(0)
    hf_inv = LlamaForCausalLM(hf_cfg).model.rotary_emb.inv_freq.double().numpy()
    np.testing.assert_allclose(used, hf_inv, rtol=1e-6)
    plain = thetas_of(5e5, 64)
    j, length = 15, 32768
    assert abs(used[j] - plain[j]) / plain[j] > 0.3
    g = np.cos(used[j] * np.arange(1, length))
    scaled = SA.spectral_alignment(g, used, tau_rel=0.05, n_null=200, references=False)
    assert scaled["theta_index"][0] == j and scaled["matched"][0] and scaled["aligned"]
    unscaled = SA.spectral_alignment(g, plain, tau_rel=0.05, n_null=200, references=False)
    assert not unscaled["matched"][0] and not unscaled["aligned"]


def test_nope_has_no_matching_but_reports_peak_to_median():
    g = np.cos(0.7 * LAGS) + 0.1 * np.random.default_rng(0).standard_normal(T - 1)
    for thetas in (None, np.zeros(0)):
        res = SA.spectral_alignment(g, thetas)
        assert not res["aligned"] and not res["matched"].any()
        assert np.isnan(res["frac_matched"]) and np.isnan(res["p_value"])
        assert np.isnan(res["chance"]) and np.isnan(res["ref_peak_r"])
        assert res["peaks"][0] == pytest.approx(0.7, abs=0.01 * BIN)
        assert res["n_above_3x_median"] >= 1 and res["top_peak_to_median"] > 100


# ------------------------------------------------------------------------ GPT-2 S_PE
def test_pe_spectrum_correlations_on_a_planted_sinusoidal_pe():
    r = np.random.default_rng(0)
    s_pe = np.cos(0.31 * LAGS) + 0.6 * np.cos(0.87 * LAGS + 1) + 2 * np.exp(-LAGS / 15)
    content = 0.3 * r.standard_normal(T - 1).cumsum() / np.sqrt(T)
    sources = {"trackA_pooled": 1.5 * s_pe + content + 0.2 * r.standard_normal(T - 1),
               "gram_raw": s_pe + content,
               "gram_centered": content + 0.2 * r.standard_normal(T - 1)}
    out = SA.pe_spectrum_correlations(s_pe, sources)
    assert set(out) == {"r_pe_trackA_pooled", "r_pe_gram_raw", "r_pe_gram_centered"}
    assert out["r_pe_trackA_pooled"] > 0.95 and out["r_pe_gram_raw"] > 0.95
    assert abs(out["r_pe_gram_centered"]) < 0.2, out
    raw = SA.pe_spectrum_correlations(s_pe, {"gram_raw": s_pe}, raw_spectrum=True)
    assert raw["r_pe_gram_raw"] == pytest.approx(1.0)
    assert np.isnan(SA.pe_spectrum_correlations(s_pe, {"x": s_pe[:-1]})["r_pe_x"])


# --------------------------------------------------------------------- condition table
def test_spectral_table_gate_labels():
    g = np.stack([np.stack([rope_head(SMOL, T, 10 * layer + h)[0] for h in range(2)])
                  for layer in range(2)])
    r2 = np.array([[0.9, 0.8], [0.7, 0.3]])
    mags = {}
    table, peaks = ST.spectral_table(g, r2, SMOL, T, gate_met=True, model="m", dataset="d",
                                    pe="rope", source="gram_centered", n_null=200,
                                    magnitudes=mags)
    # every head is analysed; only the gated ones are in the pre-registered analysis
    assert table["status"].tolist() == ["gated"] * 3 + ["exploratory: R2 <= 0.40"]
    assert table["analysed"].all()
    assert table["preregistered"].tolist() == [True, True, True, False]
    assert (table["n_peaks_found"] == 5).all() and table["aligned"].all()
    assert len(peaks) == 20 and (peaks.groupby(["layer", "head"]).size() == 5).all()
    assert (peaks["marginal"] == (peaks["matched"] & (peaks["rel_error"] > 0.05))).all()
    assert list(table.columns) == ST.HEAD_COLUMNS and list(peaks.columns) == ST.PEAK_COLUMNS
    # the spectra handed back are those analysed, one per head, on the frequency grid
    assert mags["spectrum"].shape == (2, 2, 2 * T + 1)
    np.testing.assert_allclose(mags["spectrum"][1, 0], SP.spectrum(g[1, 0], T), atol=1e-9)
    np.testing.assert_array_equal(mags["omega"], SP.frequency_grid(T))
    # the test's false-positive rate: about alpha for heads with significant peaks
    assert table["fpr"].between(0.03, 0.05).all(), table["fpr"].tolist()
    one = SA.spectral_alignment(g[0, 1], SMOL, n_null=200)
    row = table.iloc[1]
    for col in ("p_value", "chance", "fpr", "n_matched", "ref_peak_r", "pearson_literal"):
        assert row[col] == pytest.approx(one[col], rel=1e-9, abs=1e-12), col

    # explore=False keeps the pre-registered analysis alone
    table, peaks = ST.spectral_table(g, r2, SMOL, T, gate_met=False, n_null=50, explore=False)
    assert not table["analysed"].any() and len(peaks) == 0
    assert (table["status"] == "skipped: gate not met").all()
    table, _ = ST.spectral_table(g, r2, SMOL, T, gate_met=False, n_null=50)
    assert table["analysed"].all() and not table["preregistered"].any()
    assert (table["status"] == "exploratory: gate not met").all()
    table, _ = ST.spectral_table(g, r2, SMOL, T, gate_met=False, force=True, n_null=50)
    assert table["analysed"].all() and table["forced"].all()
    assert (table["status"] == "ungated").all()
    table, _ = ST.spectral_table(g, r2, SMOL, T, gate_met=True, force=True, n_null=50)
    assert table["status"].tolist() == ["gated"] * 3 + ["ungated"]
    table, _ = ST.spectral_table(g, r2, None, T, gate_met=None, pe="none", n_null=50)
    assert table["status"].tolist() == ["ungated"] * 3 + ["exploratory: R2 <= 0.40"]
    assert table["frac_matched"].isna().all() and not table["aligned"].fillna(False).any()
    assert table["fpr"].isna().all()  # no rotary frequencies: no test to be wrong
    bad = g.copy()
    bad[0, 0, 3] = np.nan
    mags = {}
    table, _ = ST.spectral_table(bad, r2, SMOL, T, gate_met=True, n_null=50, magnitudes=mags)
    assert table["status"][0] == "skipped: non-finite g" and not table["analysed"][0]
    assert np.isnan(mags["spectrum"][0, 0]).all() and np.isfinite(mags["spectrum"][0, 1]).all()


def test_false_positive_rate_of_the_test():
    """The rate is the share of the head's own null draws that the test would call aligned:
    about alpha with significant peaks (the null is exact), 0 without."""
    on = np.array([SMOL[0], SMOL[2], SMOL[3]])
    res = N.rotation_null(on, np.ones(3, bool), SMOL, T, N_FFT, n_null=2000)
    assert res["fpr"] == pytest.approx(0.05, abs=0.002)
    assert N.false_positive_rate(res["null"], alpha=0.2) == pytest.approx(0.2, abs=0.002)
    ties = np.r_[np.zeros(100), np.arange(1, 101.0)]  # half the draws tied at the bottom
    assert N.false_positive_rate(ties, alpha=0.05) == 0.0
    none = N.rotation_null(on, np.zeros(3, bool), SMOL, T, N_FFT, n_null=100)
    assert none["fpr"] == 0.0 and np.isnan(none["p_value"])
    # across white-noise kernels the aligned share stays near the mean rate the table reports
    r = np.random.default_rng(8)
    rows = [SA.spectral_alignment(r.standard_normal(T - 1), SMOL, n_null=400, seed=s,
                                 references=False) for s in range(120)]
    rate = np.mean([x["aligned"] for x in rows])
    fpr = np.mean([x["fpr"] for x in rows])
    assert fpr <= 0.05 and rate <= fpr + 0.05, (rate, fpr)


def test_rotation_null_matches_the_direct_computation():
    """The log-domain null (binary search, no [draw, peak, pair] array) gives the chance
    level and p-value of the direct computation exactly."""
    r = np.random.default_rng(0)
    for _ in range(60):
        omega = np.exp(r.uniform(np.log(0.005), np.log(3.0), 5))
        sig = r.random(5) < 0.6
        sig[0] = True
        spacing = N.local_log_spacing(SMOL, omega[sig])
        scaled = N.null_factors(spacing, 500, 3)[:, None] * SMOL[None]
        diff = np.abs(omega[None, :, None] - scaled[:, None, :])
        hit = ((diff / scaled[:, None, :] < 0.1) | (diff < 2 * np.pi / N_FFT)).any(-1)
        floor = N.precision_floor(omega[sig], T)
        observed = float(N.alignment_statistic(omega[sig], SMOL, floor))
        null = N.alignment_statistic(omega[sig], scaled, floor)
        res = N.rotation_null(omega, sig, SMOL, T, N_FFT, n_null=500, seed=3)
        assert res["chance"] == hit.mean()
        np.testing.assert_allclose(res["null"], null, atol=1e-12)
        assert res["p_value"] == (1 + np.sum(null <= observed)) / 501


def test_gate_value():
    r2 = np.array([[0.9, 0.7], [0.5, np.nan], [0.0, 0.0]])
    assert S.gate_value(r2) == pytest.approx(0.7)
    assert np.isnan(S.gate_value(np.full((2, 2), np.nan)))

"""Spectral analysis of g(Δ): peaks, matching, chance level, permutation test, run_spectral."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from poskernel_tl.analyses import spectral as S
from poskernel_tl.constants import (
    CFG,
    G_ARRAYS,
    PE_KERNEL,
    SPECTRAL_CSV,
    SPECTRAL_PEAKS_CSV,
    TRACK_A_CSV,
    result_path,
)
from poskernel_tl.registry import ModelSpec

T = 256
N_FFT = 4 * T
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_spec(base: float = 1e5, d_head: int = 64, n_layers: int = 2, n_heads: int = 2,
              scaling: dict | None = None) -> ModelSpec:
    return ModelSpec("syn-rope", None, "rope", "rmsnorm", n_layers, n_heads, n_heads, d_head,
                     base, 131072 if scaling else 2048, rope_scaling=scaling)


def thetas_of(base: float, d_head: int) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, d_head, 2) / d_head)


def rope_head_g(thetas: np.ndarray, length: int, seed: int) -> np.ndarray:
    """g(Δ) of a pure-RoPE head: Re Σ_i q_i k̄_i e^{iθ_iΔ} for random complex q, k pairs."""
    r = np.random.default_rng(seed)
    q = r.standard_normal(len(thetas)) + 1j * r.standard_normal(len(thetas))
    k = r.standard_normal(len(thetas)) + 1j * r.standard_normal(len(thetas))
    lags = np.arange(1, length)
    return np.real((q * k.conj())[None] * np.exp(1j * np.outer(lags, thetas))).sum(1)


def write_condition(out, spec: ModelSpec, g: np.ndarray, r2: np.ndarray, length: int,
                    dataset: str = "wikipedia", centered: bool = True,
                    s_pe: np.ndarray | None = None) -> None:
    path = lambda suffix: result_path(out, spec.name, dataset, length, suffix)
    path(CFG).parent.mkdir(parents=True, exist_ok=True)
    cfg = {"model": spec.name, "dataset": dataset, "length": length, "centered": centered,
           "spec": spec.to_dict()}
    path(CFG).write_text(json.dumps(cfg))
    g = g.astype(np.float32)
    centered_g = g if centered else np.full_like(g, np.nan)
    np.savez(path(G_ARRAYS), lags=np.arange(1, length), gram_centered=centered_g, gram_raw=g,
             trackA_pooled=g, trackA_per_seq=g[None])
    rows = [{"model": spec.name, "dataset": dataset, "length": length, "layer": layer,
             "head": head, "seq_id": s, "R2_per_seq": r2[layer, head],
             "R2_pooled": r2[layer, head]}
            for layer in range(r2.shape[0]) for head in range(r2.shape[1]) for s in range(2)]
    pd.DataFrame(rows).to_csv(path(TRACK_A_CSV), index=False)
    if s_pe is not None:
        np.savez(path(PE_KERNEL), s_pe=s_pe.astype(np.float32))


def read_outputs(out, spec: ModelSpec, length: int, dataset: str = "wikipedia"):
    return (pd.read_csv(result_path(out, spec.name, dataset, length, SPECTRAL_CSV)),
            pd.read_csv(result_path(out, spec.name, dataset, length, SPECTRAL_PEAKS_CSV)))


@pytest.mark.parametrize("demean", [False, True])
def test_planted_cosines_recovered(demean):
    planted = np.array([0.35, 0.8, 1.4, 2.0, 2.7])
    amps = np.array([1.0, 0.8, 1.2, 0.9, 1.1])
    g = (amps * np.cos(np.outer(np.arange(1, T), planted))).sum(1)
    omega = S.frequency_grid(T)[S.top_peaks(S.spectrum(g, T, demean), T)]
    m = S.match_peaks(omega, planted, N_FFT)
    assert m["matched"].all(), (omega, planted)
    assert sorted(m["theta_index"]) == list(range(5))  # one peak per planted frequency
    assert np.abs(omega - m["nearest_theta"]).max() <= 2 * 2 * np.pi / N_FFT


def test_spectrum_is_zero_padded_fft():
    g = np.random.default_rng(0).standard_normal(T - 1)
    mag = S.spectrum(g, T)
    assert mag.shape == (N_FFT // 2 + 1,)
    padded = np.zeros(N_FFT)
    padded[1:T] = g  # g(Δ) at index Δ instead of Δ−1: only the phase changes
    np.testing.assert_allclose(mag, np.abs(np.fft.fft(padded))[: N_FFT // 2 + 1], atol=1e-9)
    assert S.frequency_grid(T)[-1] == pytest.approx(np.pi)


@pytest.mark.parametrize("base,d_head", [(1e5, 64), (1e4, 128)])
def test_pure_rope_head_matches_majority(base, d_head):
    th = thetas_of(base, d_head)
    for seed in range(10):
        g = rope_head_g(th, T, seed)
        omega = S.frequency_grid(T)[S.top_peaks(S.spectrum(g, T), T)]
        assert len(omega) == 5
        assert S.match_peaks(omega, th, N_FFT)["matched"].mean() >= 0.5, seed


def test_white_noise_exceeds_3x_median_at_the_exponential_rate():
    """|ĝ|² of white noise is ~exponential: a bin exceeds 3× the median power with
    probability 2⁻³ = 1/8 (a magnitude threshold would give 2⁻⁹), so the top five peaks
    essentially always exceed it: 'no peak above 3× median' has rate ≈ 0 under noise."""
    exceed, above = [], []
    for seed in range(200):
        mag = S.spectrum(np.random.default_rng(seed).standard_normal(T - 1), T)
        power = mag ** 2
        exceed.append(np.mean(power[1:-1] > 3 * np.median(power)))
        above.append(S.noise_check(mag, S.top_peaks(mag, T))[0])
    assert abs(np.mean(exceed) - 1 / 8) < 0.01, np.mean(exceed)
    assert np.mean(np.array(above) == 0) == 0.0 and np.mean(above) > 4.9


@pytest.mark.parametrize("base,d_head,full,below", [(1e5, 64, 0.22, 0.57), (1e4, 128, 0.35, 0.92)])
def test_chance_level_analytic_matches_monte_carlo(base, d_head, full, below):
    th = thetas_of(base, d_head)
    analytic = S.chance_level(th, T)
    analytic_low = S.chance_level(th, T, (0.0, 1.2))
    assert analytic == pytest.approx(full, abs=0.01)
    assert analytic_low == pytest.approx(below, abs=0.01)
    # random frequencies uniform on (0, π]
    w = np.random.default_rng(1).uniform(0, np.pi, 200_000)
    _, ok = S.criterion(w, th, N_FFT)
    assert ok.any(1).mean() == pytest.approx(analytic, abs=0.01)
    assert ok[w <= 1.2].any(1).mean() == pytest.approx(analytic_low, abs=0.015)
    # the top-5 peaks of white noise land on matching frequencies at the chance rate
    hits = [S.criterion(S.frequency_grid(T)[S.top_peaks(S.spectrum(
        np.random.default_rng(s).standard_normal(T - 1), T), T)], th, N_FFT)[1].any(1)
        for s in range(300)]
    assert np.mean(hits) == pytest.approx(analytic, abs=0.04)


def test_permutation_null_and_pvalue():
    hits = np.zeros(100, bool)
    hits[:30] = True
    null = S.permutation_null(hits, 5, n_perm=4000, seed=3)
    assert null.mean() == pytest.approx(5 * 0.3, abs=0.05)  # hypergeometric mean
    np.testing.assert_array_equal(null, S.permutation_null(hits, 5, n_perm=4000, seed=3))
    assert S.perm_pvalue(0, null) == 1.0
    exact5 = np.prod([(30 - i) / (100 - i) for i in range(5)])
    assert S.perm_pvalue(5, null) == pytest.approx((1 + exact5 * 4000) / 4001, abs=0.002)


def test_llama3_scaled_frequencies_are_used(tmp_path):
    spec = rope_spec(5e5, 64, 1, 1, LLAMA3)
    rebuilt = S.spec_from_cfg({"spec": json.loads(json.dumps(spec.to_dict()))})
    used = rebuilt.rotary_frequencies()
    hf_cfg = LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=131072,
                         rope_scaling=dict(LLAMA3, rope_theta=5e5))
    torch.manual_seed(0)
    hf_inv = LlamaForCausalLM(hf_cfg).model.rotary_emb.inv_freq.double().numpy()
    np.testing.assert_allclose(used, hf_inv, rtol=1e-6)
    plain = thetas_of(5e5, 64)
    assert used[0] == pytest.approx(plain[0]) and used[-1] == pytest.approx(plain[-1] / 32)
    # a head oscillating at a scaled frequency matches the scaled set, not the plain one
    length, j = 65536, 15
    assert abs(used[j] - plain[j]) / plain[j] > 0.3
    g = np.cos(used[j] * np.arange(1, length))[None, None]
    write_condition(tmp_path, spec, g, np.array([[0.9]]), length)
    S.run_spectral(tmp_path, spec.name, "wikipedia", length, demean=True, tau_rel=0.05,
                   force=True)
    _, peaks = read_outputs(tmp_path, spec, length)
    top = peaks[peaks["rank"] == 1].iloc[0]
    assert bool(top["matched"]) and top["theta_index"] == j
    assert not S.match_peaks(np.array([top["omega"]]), plain, 4 * length, 0.05)["matched"][0]


def test_run_spectral_rotary_gate_and_outputs(tmp_path):
    spec = rope_spec()
    th = spec.rotary_frequencies()
    g = np.stack([np.stack([rope_head_g(th, T, 10 * layer + head) for head in range(2)])
                  for layer in range(2)])
    r2 = np.array([[0.9, 0.8], [0.7, 0.3]])  # gate = 0.675 > 0.6; head (1, 1) below 0.40
    write_condition(tmp_path, spec, g, r2, T)
    summary = S.run_spectral(tmp_path, spec.name, "wikipedia", T)
    table, peaks = read_outputs(tmp_path, spec, T)
    assert summary["gate_met"] and summary["gate_value"] == pytest.approx(0.675)
    assert table["analysed"].tolist() == [True, True, True, False]
    done = table[table["analysed"]]
    assert (done["n_peaks"] == 5).all() and (done["frac_matched"] >= 0.5).all()
    assert (done["n_expected"] == 32).all() and (done["source"] == "gram_centered").all()
    assert (done["pearson"] > 0).all() and (done["perm_p"] <= 1).all()
    assert done["chance_full"].iloc[0] == pytest.approx(S.chance_level(th, T))
    lo, hi = peaks["omega"].min(), peaks["omega"].max()
    assert (done["band_lo"] == lo).all() and (done["band_hi"] == hi).all()
    assert done["chance_band"].iloc[0] == pytest.approx(S.chance_level(th, T, (lo, hi)))
    assert not table["forced"].any() and not table["demean"].any()
    assert len(peaks) == 15 and set(peaks.columns) >= {"nearest_theta", "marginal", "rel_error"}
    assert (peaks["marginal"] == (peaks["matched"] & (peaks["rel_error"] > 0.05))).all()
    assert summary["mean_frac_matched_early"] == pytest.approx(done["frac_matched"].mean())

    # gate not met: nothing analysed; force analyses every head and says so
    write_condition(tmp_path, spec, g, r2 * 0.5, T)
    assert S.run_spectral(tmp_path, spec.name, "wikipedia", T)["n_analysed"] == 0
    table, peaks = read_outputs(tmp_path, spec, T)
    assert not table["analysed"].any() and len(table) == 4 and len(peaks) == 0
    S.run_spectral(tmp_path, spec.name, "wikipedia", T, force=True, demean=True)
    table, _ = read_outputs(tmp_path, spec, T)
    assert table["analysed"].all() and table["forced"].all() and table["demean"].all()
    assert not table["gate_met"].any()


def test_run_spectral_random_tokens_use_raw_gram(tmp_path):
    spec = rope_spec()
    g = np.stack([[rope_head_g(spec.rotary_frequencies(), T, h) for h in range(2)]] * 2)
    write_condition(tmp_path, spec, g, np.full((2, 2), 0.9), T, "random", centered=False)
    S.run_spectral(tmp_path, spec.name, "random", T)
    table, _ = read_outputs(tmp_path, spec, T, "random")
    assert (table["source"] == "gram_raw").all() and table["analysed"].all()


def test_run_spectral_gpt2_and_nope(tmp_path):
    r = np.random.default_rng(0)
    gpt2 = ModelSpec("syn-gpt2", None, "learned-absolute", "layernorm", 1, 2, 2, 16, None, 1024)
    g = r.standard_normal((1, 2, T - 1)).cumsum(-1)
    s_pe = np.stack([g[:, 0], r.standard_normal((1, T - 1))], 1)  # head 0: S_PE = g
    write_condition(tmp_path, gpt2, g, np.array([[0.5, 0.1]]), T, s_pe=s_pe)
    summary = S.run_spectral(tmp_path, gpt2.name, "wikipedia", T)
    table, peaks = read_outputs(tmp_path, gpt2, T)
    assert summary["gate_met"] is None and table["gate_met"].isna().all()
    assert not table["gate_applicable"].any() and "not applicable" in table["gate_note"][0]
    assert table["analysed"].tolist() == [True, False]
    assert table["pearson"][0] == pytest.approx(1.0, abs=1e-6)
    assert table["n_matched"].isna().all() and peaks["matched"].isna().all()

    nope = ModelSpec("syn-nope", None, "none", "rmsnorm", 1, 2, 2, 16, None, 2048)
    write_condition(tmp_path, nope, g, np.array([[0.1, 0.1]]), T)
    S.run_spectral(tmp_path, nope.name, "wikipedia", T, force=True)
    table, peaks = read_outputs(tmp_path, nope, T)
    assert table["analysed"].all() and table["pearson"].isna().all()
    assert table["n_peaks_above_3x_median"].between(0, 5).all() and len(peaks) == 10

"""Fourier relative-position kernel (seed 001): cosine-series fits against planted kernels,
quadratic vs linear kernelized attention, and both against a naive loop."""

import math

import matplotlib
import numpy as np
import pytest
import torch

from poskernel_tl.analyses import fourier_kernel as F
from poskernel_tl.analyses.fourier_kernel import fit as FF
from poskernel_tl.analyses.spectral.null import match_peaks

# RoPE θ_i = 1e4^(−2i/64); at T = 512 the θ_i above 4π/T are i = 0..12.
T = 512
THETAS = 1e4 ** (-2 * np.arange(32) / 64)
LAGS = np.arange(1, T, dtype=np.float64)
# (θ index, amplitude, phase); the smallest component sits near the larger ones' sidelobes
PLANTED = [(0, 3.0, 0.3), (3, 2.0, -1.0), (7, 1.5, 2.0), (11, 0.25, 0.5)]
OFFSET = 0.5


def planted_g(planted=PLANTED, offset=OFFSET, lags=LAGS):
    return offset + sum(c * np.cos(THETAS[i] * lags + b) for i, c, b in planted)


def test_planted_rope_frequencies_above_resolution_limit():
    assert all(THETAS[i] > 4 * math.pi / T for i, _, _ in PLANTED)


# "peaks" takes the K largest spectral maxima at once: a 0.25 component can lose to a larger
# one's sidelobes there, so it gets comparable amplitudes; "residual" must find the small one.
@pytest.mark.parametrize("init,planted", [
    ("residual", PLANTED),
    ("peaks", [(i, c if c > 1 else 1.0, b) for i, c, b in PLANTED]),
])
def test_fit_recovers_planted_cosines_exactly(init, planted):
    g = planted_g(planted)
    fit = FF.fit_cosine_series(g, K=len(planted), init=init)
    assert fit.r2 == pytest.approx(1.0, abs=1e-10), fit.r2
    np.testing.assert_allclose(fit.freqs, [THETAS[i] for i, _, _ in planted], rtol=1e-8)
    np.testing.assert_allclose(fit.amplitudes, [c for _, c, _ in planted], rtol=1e-7)
    np.testing.assert_allclose(fit.phases, [b for _, _, b in planted], atol=1e-6)
    assert fit.offset == pytest.approx(OFFSET, abs=1e-7)
    np.testing.assert_allclose(fit.fitted, g, atol=1e-8)
    np.testing.assert_allclose(fit(LAGS[:5]), fit.fitted[:5], atol=1e-12)


def test_fit_from_given_frequencies_and_with_noise():
    rng = np.random.default_rng(0)
    truth = np.array([THETAS[i] for i, _, _ in PLANTED])
    init = truth * (1 + 0.002 * rng.standard_normal(len(truth)))
    fit = FF.fit_cosine_series(planted_g(), init_freqs=init)
    assert fit.K == len(PLANTED) and fit.r2 > 1 - 1e-10
    noisy = planted_g() + 0.3 * rng.standard_normal(len(LAGS))
    fit = FF.fit_cosine_series(noisy, K=3)
    np.testing.assert_allclose(fit.freqs, truth[:3], rtol=2e-3)
    assert 0.8 < fit.r2 < 1.0


def test_r2_grows_with_K_and_max_lag_restricts_the_fit():
    g = planted_g()
    r2 = [FF.fit_cosine_series(g, K=k).r2 for k in range(5)]
    assert r2[0] == pytest.approx(0.0, abs=1e-12)
    assert all(b >= a - 1e-12 for a, b in zip(r2, r2[1:])) and r2[-1] > 1 - 1e-10
    fit = FF.fit_cosine_series(g, K=2, max_lag=100)
    assert fit.max_lag == 100 and fit.fitted.shape == g.shape


def test_non_finite_kernel_gives_nan_fit():
    g = planted_g()
    g[10] = np.nan
    fit = FF.fit_cosine_series(g, K=2)
    assert np.isnan(fit.r2) and np.isnan(fit.freqs).all() and not fit.success


def test_cosine_fit_table_rows_and_theta_matching():
    g = np.stack([np.stack([planted_g(), planted_g(PLANTED[:2])]),
                  np.stack([np.full(T - 1, np.nan), planted_g(PLANTED[1:3], offset=-1.0)])])
    fits, comps = F.cosine_fit_table(g, Ks=(1, 2, 4), thetas=THETAS)
    assert len(fits) == 2 * 2 * 3 and list(fits.columns[:4]) == ["layer", "head", "K", "R2_fit"]
    assert len(comps) == 4 * (1 + 2 + 4)
    head = fits[(fits.layer == 0) & (fits["head"] == 0)].set_index("K")
    assert head.loc[4, "R2_fit"] > 1 - 1e-10 and head.loc[4, "frac_matched"] == 1.0
    assert head["R2_fit"].is_monotonic_increasing
    c4 = comps[(comps.layer == 0) & (comps["head"] == 0) & (comps.K == 4)]
    assert list(c4.theta_index) == [i for i, _, _ in PLANTED]
    assert (c4.rel_error < 1e-8).all() and c4.matched.all()
    assert c4.amplitude_share.sum() == pytest.approx(1.0)
    two = fits[(fits.layer == 0) & (fits["head"] == 1) & (fits.K == 2)].iloc[0]
    assert two.R2_fit > 1 - 1e-10
    assert fits[(fits.layer == 1) & (fits["head"] == 0)].R2_fit.isna().all()
    no_theta, _ = F.cosine_fit_table(g[:1, 1:], Ks=(2,))
    assert "nearest_theta" not in no_theta and no_theta.R2_fit.iloc[0] > 1 - 1e-10


def test_fitted_frequencies_match_by_the_spectral_criterion():
    thetas = np.array([1.0, 0.5, 0.01])
    m = match_peaks(np.array([0.95, 0.7, 0.0105, 0.0125]), thetas, n_fft=4 * 512)
    np.testing.assert_array_equal(m["theta_index"], [0, 0, 2, 2])
    np.testing.assert_array_equal(m["matched"], [True, False, True, True])  # last: |Δω| < 2π/N
    np.testing.assert_allclose(m["rel_error"], [0.05, 0.3, 0.05, 0.25])


def test_r2_is_monotone_in_K_on_a_trend_with_noise():
    """A decaying trend invites two slow cosines to merge into a huge-amplitude pair; the
    frequency windows prevent that, so each added cosine can only raise R²."""
    rng = np.random.default_rng(5)
    for _ in range(3):
        g = 4 * np.exp(-LAGS / rng.uniform(10, 80)) + np.cos(0.3 * LAGS) \
            + 0.5 * rng.standard_normal(len(LAGS))
        fits, comps = F.cosine_fit_table(g[None, None], Ks=(1, 2, 3, 4, 5, 6, 8))
        assert fits.R2_fit.is_monotonic_increasing, fits.R2_fit.tolist()
        for _, c in comps.groupby("K"):
            f = np.sort(c.freq.to_numpy())
            assert (np.diff(f) >= math.pi / len(LAGS) * (1 - 1e-9)).all()
        assert comps.amplitude.max() < 50


def test_trend_lands_on_the_lower_frequency_bound():
    g = 5 * np.exp(-LAGS / 40) + np.cos(0.5 * LAGS)
    _, comps = F.cosine_fit_table(g[None, None], Ks=(3,))
    assert comps.at_min_freq.any() and comps.freq.min() >= math.pi / len(LAGS) * (1 - 1e-9)
    assert np.isclose(comps.freq, 0.5, rtol=1e-2).any()


def test_plot_returns_figure_and_keeps_backend():
    backend = matplotlib.get_backend()
    g = np.stack([planted_g(), np.full(T - 1, np.nan)])[None]
    tables = F.cosine_fit_table(g, Ks=(1, 2, 4), thetas=THETAS)
    fig = F.plot_cosine_fit(tables, thetas=THETAS, highlight=(0, 0), title="planted")
    assert type(fig).__name__ == "Figure" and len(fig.axes) == 2
    assert matplotlib.get_backend() == backend


# ---------------------------------------------------------------------------- attention


def make_inputs(batch=2, pos=24, heads=3, feat=4, d=5, pos_dim=1, dtype=torch.float64,
                seed=0, positions="scalar"):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    q = torch.nn.functional.elu(rnd(batch, pos, heads, feat)) + 1
    k = torch.nn.functional.elu(rnd(batch, pos, heads, feat)) + 1
    v = rnd(batch, pos, heads, d)
    a = (torch.rand(heads, feat, pos_dim, generator=gen, dtype=torch.float64) * 0.8).to(dtype)
    b, c = rnd(heads, feat), rnd(heads, feat)
    if positions == "scalar":
        p = torch.arange(pos, dtype=dtype)
    elif positions == "shared":
        p = rnd(pos, pos_dim) * 3
    else:
        p = rnd(batch, pos, pos_dim) * 3
    return q, k, v, a, b, c, p


def naive_attention(q, k, v, a, b, c, p, causal):
    """Triple loop in numpy over (i, j, k), straight from the seed's formula."""
    q, k, v, a, b, c, p = (x.double().numpy() for x in (q, k, v, a, b, c, p))
    B, T_, H, K = q.shape
    p = np.broadcast_to(p.reshape(-1, T_, a.shape[-1]), (B, T_, a.shape[-1]))
    out = np.zeros(v.shape)
    for bb in range(B):
        for h in range(H):
            for i in range(T_):
                for j in range(i + 1 if causal else T_):
                    for kk in range(K):
                        dP = c[h, kk] * math.cos(b[h, kk] + a[h, kk] @ (p[bb, i] - p[bb, j]))
                        out[bb, i, h] += q[bb, i, h, kk] * k[bb, j, h, kk] * dP * v[bb, j, h]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("positions,pos_dim", [("scalar", 1), ("shared", 3), ("batched", 2)])
def test_quadratic_and_linear_agree_float64(causal, positions, pos_dim):
    x = make_inputs(pos_dim=pos_dim, positions=positions, seed=1)
    quad = F.fourier_kernel_attention_quadratic(*x, causal=causal)
    lin = F.fourier_kernel_attention_linear(*x, causal=causal)
    diff = (quad - lin).abs().max().item()
    assert diff < 1e-10, f"max |quadratic − linear| = {diff:.2e}"


@pytest.mark.parametrize("causal", [True, False])
def test_quadratic_and_linear_agree_float32(causal):
    x = make_inputs(pos=128, feat=8, d=16, dtype=torch.float32, seed=2)
    quad = F.fourier_kernel_attention_quadratic(*x, causal=causal)
    lin = F.fourier_kernel_attention_linear(*x, causal=causal)
    ref = F.fourier_kernel_attention_quadratic(*(t.double() for t in x), causal=causal)
    scale = ref.abs().max().item()
    for name, out in [("quadratic", quad), ("linear", lin)]:
        err = (out.double() - ref).abs().max().item() / scale
        assert err < 1e-5, f"{name} float32 vs float64: max error / max |A| = {err:.2e}"
    err = (quad - lin).abs().max().item() / scale
    assert err < 1e-5, f"max |quadratic − linear| / max |A| = {err:.2e} (float32)"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("positions,pos_dim", [("scalar", 1), ("batched", 2)])
def test_planted_case_against_naive_loop(causal, positions, pos_dim):
    x = make_inputs(batch=2, pos=7, heads=2, feat=3, d=2, pos_dim=pos_dim,
                    positions=positions, seed=3)
    want = naive_attention(*x, causal=causal)
    for fn in (F.fourier_kernel_attention_quadratic, F.fourier_kernel_attention_linear):
        got = fn(*x, causal=causal).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=fn.__name__)


def test_phase_b_sits_on_the_query_side():
    """ΔP_ij = c cos(b + a(p_i − p_j)): swapping i and j flips the sign of a(p_i − p_j)
    only, so ΔP is not symmetric when b ≠ 0."""
    a = torch.tensor([[[0.3]]], dtype=torch.float64)
    b, c = torch.tensor([[0.7]], dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64)
    p = torch.arange(5, dtype=torch.float64)
    dP = F.fourier_delta_p(a, b, c, p)[0, 0, :, :, 0]
    i, j = torch.meshgrid(p, p, indexing="ij")
    torch.testing.assert_close(dP, 2.0 * torch.cos(0.7 + 0.3 * (i - j)))
    assert not torch.allclose(dP, dP.T)


def test_chunked_prefix_sums_match_full():
    x = make_inputs(pos=50, seed=4)
    full = F.fourier_kernel_attention_linear(*x, causal=True)
    for chunk in (1, 7, 64):
        chunked = F.fourier_kernel_attention_linear(*x, causal=True, chunk_size=chunk)
        torch.testing.assert_close(chunked, full, rtol=1e-12, atol=1e-12)


def test_constant_features_give_a_cosine_series_kernel_that_the_fit_recovers():
    """With constant Q̄, K̄ and positions t, the scores are Toeplitz: g(Δ) = Σ_k q_k k_k c_k
    cos(b_k + a_k Δ). Part (a) recovers the a_k from the scores' lower triangle."""
    n, freqs = 256, torch.tensor([0.9, 0.35, 0.12], dtype=torch.float64)
    a = freqs.reshape(1, 3, 1)
    b = torch.tensor([[0.4, -1.2, 2.5]], dtype=torch.float64)
    c = torch.tensor([[1.0, 0.7, 0.4]], dtype=torch.float64)
    q = torch.ones(1, n, 1, 3, dtype=torch.float64)
    k = torch.full((1, n, 1, 3), 2.0, dtype=torch.float64)
    scores = F.fourier_kernel_scores(q, k, a, b, c, torch.arange(n, dtype=torch.float64))[0, 0]
    g = torch.stack([scores.diagonal(-d).mean() for d in range(1, n)]).numpy()
    assert torch.stack([scores.diagonal(-d).std() for d in range(1, n - 1)]).max() < 1e-12
    fit = FF.fit_cosine_series(g, K=3)
    assert fit.r2 > 1 - 1e-10
    np.testing.assert_allclose(np.sort(fit.freqs), np.sort(freqs.numpy()), rtol=1e-8)
    np.testing.assert_allclose(fit.amplitudes, 2 * c[0].numpy(), rtol=1e-7)


def test_shape_errors():
    q, k, v, a, b, c, p = make_inputs()
    with pytest.raises(ValueError, match="head_index feature pos_dim"):
        F.fourier_kernel_attention_linear(q, k, v, a[:, :, :0], b, c, p)
    with pytest.raises((ValueError, TypeError)):  # a shape-check error under pytest
        F.fourier_kernel_attention_quadratic(q, k, v, a, b, c, p[None, None, :, None])

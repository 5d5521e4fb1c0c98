"""The shift-invariance fit against a naive loop and planted ground truths."""

import math
import warnings

import numpy as np
import pytest
import torch

import poskernel_tl as pk
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import lag_sums, r2_from_sums, shift_invariance_r2

TOL = 1e-6


def naive_r2(a: np.ndarray) -> tuple[float, np.ndarray]:
    """Loop over sub-diagonals in numpy, float64: the seed's formulas written out."""
    T = a.shape[0]
    g = np.array([np.mean([a[t, t - d] for t in range(d, T)]) for d in range(1, T)])
    entries = np.array([a[t, s] for t in range(T) for s in range(t)])
    resid = np.array([a[t, s] - g[t - s - 1] for t in range(T) for s in range(t)])
    return 1.0 - np.sum(resid ** 2) / np.sum((entries - entries.mean()) ** 2), g


def test_matches_naive_loop(rng):
    scores = torch.randn(3, 2, 17, 17, generator=rng, dtype=torch.float64) * 3 + 1
    r2, g = shift_invariance_r2(scores)
    assert r2.shape == (3, 2) and g.shape == (3, 2, 16)
    for b in range(3):
        for h in range(2):
            want_r2, want_g = naive_r2(scores[b, h].numpy())
            assert abs(r2[b, h].item() - want_r2) < TOL, (r2[b, h].item(), want_r2)
            assert np.abs(g[b, h].numpy() - want_g).max() < TOL


def test_public_name_and_upper_triangle_ignored(rng):
    scores = torch.randn(9, 9, generator=rng)
    masked = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(), float("-inf"))
    r2a, ga = pk.shift_invariance_r2(scores)
    r2b, gb = pk.shift_invariance_r2(masked)
    assert torch.equal(r2a, r2b) and torch.equal(ga, gb)
    assert torch.isfinite(r2b)


def test_exact_toeplitz_has_r2_one(rng):
    T = 33
    g = torch.randn(2 * T, generator=rng, dtype=torch.float64)
    t = torch.arange(T)
    scores = g[(t[:, None] - t[None, :]) + T]
    r2, g_hat = shift_invariance_r2(scores)
    assert abs(r2.item() - 1.0) < TOL
    assert torch.allclose(g_hat, g[T + 1: 2 * T], atol=1e-12)


def test_known_variance_ratio(rng):
    """g(Δ) + i.i.d. noise: R² ≈ Var(g over entries) / (Var(g) + σ²)."""
    T, sigma = 256, 0.5
    lags = torch.arange(1, T, dtype=torch.float64)
    g = torch.cos(0.3 * lags) + 0.5 * torch.cos(0.05 * lags)
    t = torch.arange(T)
    delta = (t[:, None] - t[None, :]).clamp(min=1)
    clean = g[delta - 1]
    noisy = clean + sigma * torch.randn(T, T, generator=rng, dtype=torch.float64)
    tri = torch.ones(T, T, dtype=torch.bool).tril(-1)
    var_g = clean[tri].var(unbiased=False).item()
    expected = var_g / (var_g + sigma ** 2)
    r2, _ = shift_invariance_r2(noisy)
    # the fit also absorbs ≈ (T-2)/N of the noise variance; tolerance covers sampling
    assert abs(r2.item() - expected) < 0.01, (r2.item(), expected)


def test_iid_noise_null_expectation(rng):
    """E[R²] = (T−2)/(N−1) for i.i.d. entries, N = T(T−1)/2."""
    T, reps = 24, 400
    r2, _ = shift_invariance_r2(torch.randn(reps, T, T, generator=rng, dtype=torch.float64))
    N = T * (T - 1) // 2
    expected = (T - 2) / (N - 1)
    sem = r2.std().item() / math.sqrt(reps)
    assert abs(r2.mean().item() - expected) < 4 * sem, (r2.mean().item(), expected, sem)
    assert abs(expected - 2 / T) < 0.01


def test_constant_input_is_nan_with_warning():
    with pytest.warns(RuntimeWarning, match="constant"):
        r2, g = shift_invariance_r2(torch.full((2, 8, 8), 3.0))
    assert torch.isnan(r2).all()
    assert torch.allclose(g, torch.full_like(g, 3.0))


def test_no_warning_on_normal_input(rng):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shift_invariance_r2(torch.randn(8, 8, generator=rng))


def test_row_restricted_sums_match_naive(rng):
    T = 30
    a = torch.randn(T, T, generator=rng, dtype=torch.float64)
    s1, sq = lag_sums(a, 5, 12)
    counts = lag_counts(T, 5, 12)
    for d in range(1, T):
        rows = [t for t in range(5, 12) if t >= d]
        assert counts[d - 1] == len(rows)
        assert abs(s1[d - 1].item() - sum(a[t, t - d].item() for t in rows)) < 1e-9
    want_sq = sum(a[t, s].item() ** 2 for t in range(5, 12) for s in range(t))
    assert abs(sq.item() - want_sq) < 1e-9
    r2, _ = r2_from_sums(s1, sq, counts)
    assert torch.isfinite(r2)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        shift_invariance_r2(torch.zeros(4, 5))


def test_runtime_shape_checks_are_on():
    """pytest runs with jaxtyping's import hook: a wrong rank is a type-check error."""
    from jaxtyping import TypeCheckError

    from poskernel_tl.fit.toeplitz import lower_mean_from_qk

    with pytest.raises(TypeCheckError):
        lower_mean_from_qk(torch.zeros(2, 8, 4), torch.zeros(2, 8, 4), 1.0)  # rank 3, not 4

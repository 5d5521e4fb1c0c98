"""A window's sums from its band's entries (``reducers/band_sums.py``): against naive
diagonal sums of the materialised logits, a planted Toeplitz head, and the FFT + moments
path they replace (Track A, the permutation null and Track B's corrections)."""

import numpy as np
import pytest
import torch

from poskernel_tl.protocol import band_ends
from poskernel_tl.reducers import band_sums
from poskernel_tl.reducers.band_sums import (
    band_is_cheaper,
    band_lag_sums,
    band_part_sums,
)
from poskernel_tl.reducers.gram_fit import Pieces
from poskernel_tl.reducers.gram_variant import variant_fit
from poskernel_tl.reducers.lag_sums import lower_stats, track_a_stats, windowed

SCALE = 0.41


def draw(b, T, h, kv, d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(T, 1, d, generator=g, dtype=torch.float64)
    q = torch.randn(b, T, h, d, generator=g, dtype=torch.float64) + pos
    k = torch.randn(b, T, kv, d, generator=g, dtype=torch.float64) + pos
    return q.to(dtype), k.to(dtype)


def naive(q, k, W):
    """S1(Δ), S2(Δ), Δ = 1..W, of SCALE·q·kᵀ: numpy diagonals of the whole matrix."""
    qn, kn = q.double().numpy(), k.double().numpy()
    kn = np.repeat(kn, qn.shape[2] // kn.shape[2], axis=2)
    A = np.einsum("bthd,bshd->bhts", qn, kn) * SCALE
    s1 = np.stack([np.diagonal(A, -D, -2, -1).sum(-1) for D in range(1, W + 1)], -1)
    s2 = np.stack([np.square(np.diagonal(A, -D, -2, -1)).sum(-1) for D in range(1, W + 1)], -1)
    return s1, s2


@pytest.mark.parametrize("b,T,h,kv,d,W,chunk", [
    (2, 300, 4, 2, 8, 37, 64),     # GQA, T not a multiple of the chunk
    (1, 130, 3, 1, 16, 129, 64),   # the window is the whole triangle
    (1, 64, 2, 2, 4, 5, 16),       # a window shorter than the chunk
    (3, 97, 2, 1, 8, 200, 32),     # a window past T − 1 is clipped to it
    (1, 257, 4, 4, 6, 64, 64),     # W a multiple of the chunk
])
def test_band_sums_match_naive_diagonals(b, T, h, kv, d, W, chunk):
    q, k = draw(b, T, h, kv, d)
    s1, s2 = band_lag_sums(q, k, SCALE, W, chunk=chunk)
    n1, n2 = naive(q, k, min(W, T - 1))
    assert s1.dtype == s2.dtype == torch.float64
    np.testing.assert_allclose(s1.numpy(), n1, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(s2.numpy(), n2, rtol=1e-12, atol=1e-10)
    # products in float32: ~1e-7 relative
    f1, f2 = band_lag_sums(q.float(), k.float(), SCALE, W, torch.float32, chunk)
    np.testing.assert_allclose(f2.numpy(), n2, rtol=1e-5)
    assert np.abs(f1.numpy() - n1).max() <= 1e-5 * np.abs(n2).max() ** 0.5 * T


def test_planted_toeplitz_head_has_its_kernel_on_every_lag():
    """q_t = (cos θt, sin θt), k_s = (cos θs, sin θs): q_t·k_s = cos θ(t − s) exactly, so
    S1(Δ) = (T − Δ)·cos θΔ and S2(Δ) = (T − Δ)·cos² θΔ."""
    T, W, theta = 400, 150, 0.3
    t = torch.arange(T, dtype=torch.float64)
    x = torch.stack([torch.cos(theta * t), torch.sin(theta * t)], -1)[None, :, None]
    s1, s2 = band_lag_sums(x, x, 1.0, W)
    lag = torch.arange(1, W + 1, dtype=torch.float64)
    torch.testing.assert_close(s1[0, 0], (T - lag) * torch.cos(theta * lag), rtol=0, atol=1e-9)
    torch.testing.assert_close(s2[0, 0], (T - lag) * torch.cos(theta * lag) ** 2, rtol=0,
                               atol=1e-9)


def test_band_parts_are_the_partition_of_the_window():
    T, W = 300, 100
    q, k = draw(2, T, 4, 2, 8)
    _, s2 = band_lag_sums(q, k, SCALE, W)
    parts = band_part_sums(s2, T)
    _, n2 = naive(q, k, W)
    lo = 0
    for i, end in enumerate(band_ends(T)):
        hi = min(end, W)
        want = n2[..., lo:hi].sum(-1) if hi > lo else 0.0
        np.testing.assert_allclose(parts[..., i].numpy(), want, rtol=1e-12, atol=1e-9)
        lo = max(lo, hi)


def test_the_rule_takes_the_band_for_narrow_windows_only():
    assert band_is_cheaper(8192, 511, 256)  # Gemma 3's local layers
    assert not band_is_cheaper(8192, None, 256)  # no window
    assert not band_is_cheaper(512, 511, 256)  # the window keeps every lag
    assert not band_is_cheaper(8192, 2047, 64)  # far wider than d_head: FFT and moments
    assert band_is_cheaper(8192, 127, 64)


@pytest.fixture
def either_path(monkeypatch):
    """Run a computation on the band path and on the FFT + moments path."""
    def run(fn):
        monkeypatch.setattr(band_sums, "BAND_KEYS_PER_DIM", 10 ** 6)
        band = fn()
        monkeypatch.setattr(band_sums, "BAND_KEYS_PER_DIM", 0)
        moments = fn()
        return band, moments
    return run


@pytest.mark.parametrize("T,W", [(200, 30), (333, 64), (130, 128)])
def test_null_sums_are_the_same_on_either_path(either_path, T, W):
    """The permutation null's window sums (float32, permuted positions: no causality
    assumed), and in float64 the window's sums Track A takes by moments."""
    q, k = draw(2, T, 6, 2, 8, seed=3)
    pi = torch.randperm(T, generator=torch.Generator().manual_seed(1))
    qp, kp = q[:, pi], k[:, pi]
    null = either_path(lambda: lower_stats(qp.float(), kp.float(), SCALE, last=W,
                                           dtype=torch.float32))
    for a, b in zip(*null):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-4)
    assert (null[0][0][..., W:] == 0).all()  # the lags past the window are not summed
    exact = either_path(lambda: lower_stats(qp, kp, SCALE, last=W))
    moments = track_a_stats(qp, kp, SCALE, last=W)
    for a, b, c in zip(*exact, (windowed(moments.s1, W), moments.sq, moments.bands)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-9)
        torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-9)


def test_track_b_corrections_are_the_same_on_either_path(either_path):
    """variant_fit's U·Vᵀ sums under a window (rank 2·d_head), float64 on the band."""
    T, W, H, kv, r = 220, 40, 4, 2, 6
    g = torch.Generator().manual_seed(5)
    u = torch.randn(H, T, r, generator=g, dtype=torch.float64)
    v = torch.randn(kv, T, r, generator=g, dtype=torch.float64)
    w = torch.randn(H, T, r, generator=g, dtype=torch.float64)
    s1 = torch.randn(H, T - 1, generator=g, dtype=torch.float64)
    s1[:, W:] = 0
    pieces = lambda: Pieces(s1.clone(), torch.full((H,), 50.0, dtype=torch.float64),
                            torch.zeros(H, T, r, dtype=torch.float64))
    band, moments = either_path(lambda: variant_fit(pieces(), u, v, w, 0.3, last=W))
    torch.testing.assert_close(band[0], moments[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(band[1], moments[1], rtol=1e-9, atol=1e-9, equal_nan=True)

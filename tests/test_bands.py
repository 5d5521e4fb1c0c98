"""Track A restricted to offset bands, against a naive fit of each band's entries and a
planted ground truth."""

import numpy as np
import pytest
import torch
from masks import masks

from poskernel_tl.protocol import band_ends, offset_bands
from poskernel_tl.reducers import LayerBatch, TrackAReducer
from poskernel_tl.statistics import PermNullReducer

B, H, D = 4, 2, 8
SCALE = 1 / np.sqrt(D)


def naive_r2(values: list[tuple[int, float]]) -> float:
    """R² of the best g for (lag, value) pairs, by grouping the values of each lag."""
    lags = np.array([v[0] for v in values])
    vals = np.array([v[1] for v in values])
    g = {d: vals[lags == d].mean() for d in np.unique(lags)}
    res = vals - np.array([g[d] for d in lags])
    return 1 - (res ** 2).sum() / ((vals - vals.mean()) ** 2).sum()


def band_entries(a: np.ndarray, lo: int, hi: int, both: bool, last: int):
    """(lag, value) of the logits at offsets t − s in [lo, hi] (and s − t, ``both``)."""
    T = len(a)
    out = [(t - s, a[t, s]) for t in range(T) for s in range(t)
           if lo <= t - s <= min(hi, last)]
    if both:
        out += [(t - s, a[t, s]) for t in range(T) for s in range(t + 1, T)
                if lo <= s - t <= hi]
    return out


def qk(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(T, 1, D, generator=g, dtype=torch.float64)
    q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64) + 2 * pos
    k = torch.randn(B, T, H, D, generator=g, dtype=torch.float64) + 2 * pos
    return q, k


def feed(red, q, k):
    for start in (0, 2):
        idx = torch.arange(start, start + 2)
        red.update(LayerBatch(0, q[idx], k[idx], idx, float(SCALE), rows=tuple(idx.tolist())))


def test_offset_bands_partition_then_cumulative():
    assert band_ends(1024) == [16, 64, 256, 1023]
    assert offset_bands(1024) == [(1, 16), (17, 64), (65, 256), (257, 1023),
                                  (1, 64), (1, 256), (1, 1023)]
    assert offset_bands(8192)[4] == (1025, 4096) and offset_bands(8192)[5] == (4097, 8191)
    assert offset_bands(12) == [(1, 11)]


@pytest.mark.parametrize("source", ["lags", "scores"])
@pytest.mark.parametrize("T,causal,last", [(90, True, None), (90, True, 40),
                                               (70, False, None)])
def test_band_r2_equals_naive_fits(source, T, causal, last):
    """Pooled and per-sequence band R² equal the naive fit of each band's entries, on
    both triangles for a bidirectional model and within a sliding window."""
    q, k = qk(T)
    red = TrackAReducer(B, masks(T, causal=causal, lasts=None if last is None else [last]), H,
                        source=source)
    feed(red, q.float(), k.float())
    res = red.result()
    assert [tuple(b) for b in zip(res.band_lo, res.band_hi)] == offset_bands(T)
    qf, kf = q.float().double().numpy(), k.float().double().numpy()
    mats = [[qf[x, :, h] @ kf[x, :, h].T * SCALE for x in range(B)] for h in range(H)]
    end = T - 1 if last is None else last
    for b, (lo, hi) in enumerate(offset_bands(T)):
        for h in range(H):
            if lo > end:
                assert np.isnan(res.r2_band_pooled[b, 0, h])
                continue
            each = [band_entries(m, lo, hi, not causal, end) for m in mats[h]]
            assert res.r2_band_pooled[b, 0, h] == pytest.approx(naive_r2(sum(each, [])),
                                                                abs=1e-6)
            assert res.r2_band_per_seq[b, 0, h] == pytest.approx(
                np.mean([naive_r2(e) for e in each]), abs=1e-6)
    whole = offset_bands(T).index((1, T - 1))
    assert np.allclose(res.r2_band_pooled[whole], res.r2_pooled, atol=1e-9)


def test_exact_rope_head_has_band_r2_one():
    """Content constant over positions and shared by the sequences, rotated by RoPE: the
    logits depend on t − s alone, so every band's fit is exact."""
    T = 300
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None], \
        torch.cat([ang.sin()] * 2, -1)[None, :, None]
    rot = lambda x: x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin
    g = torch.Generator().manual_seed(1)
    q = rot(torch.randn(1, 1, H, D, generator=g, dtype=torch.float64).expand(B, T, H, D))
    k = rot(torch.randn(1, 1, H, D, generator=g, dtype=torch.float64).expand(B, T, H, D))
    red = TrackAReducer(B, masks(T), H)
    feed(red, q, k)
    res = red.result()
    assert np.abs(res.r2_band_pooled - 1).max() < 1e-9
    assert np.abs(res.r2_band_per_seq - 1).max() < 1e-9


@pytest.mark.parametrize("source", ["lags", "scores"])
def test_null_band_r2_equals_naive_fit_of_the_permuted_product(source):
    T = 90
    q, k = qk(T, seed=2)
    red = PermNullReducer(masks(T), H, n_perm=2, max_seqs=B, source=source)
    feed(red, q, k)
    res = red.result()
    for p, pi in enumerate(res.perms):
        for b, (lo, hi) in enumerate(offset_bands(T)):
            for h in range(H):
                mats = [(q[x][pi][:, h] @ k[x][pi][:, h].T * SCALE).numpy() for x in range(B)]
                want = naive_r2(sum((band_entries(m, lo, hi, False, T) for m in mats), []))
                assert res.r2_band_null[p, b, 0, h] == pytest.approx(want, abs=1e-6)


def test_the_band_benchmark_switches_band_sums_off_and_back():
    """scripts/bench_bands.py's variants: without band ends the whole and windowed Σ A²
    are the shipped ones and the bands zeros; the shipped functions come back after."""
    import importlib.util
    from pathlib import Path

    import poskernel_tl.reducers.lag_sums as lag
    import poskernel_tl.statistics.perm_null as perm_null

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_bands.py"
    spec = importlib.util.spec_from_file_location("bench_bands", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 40, 4, 8, generator=g), torch.randn(2, 40, 2, 8, generator=g)
    whole, kept, bands = lag.band_sum_squares(q, k, 0.3, 8, 20)
    shipped = lag.band_sum_squares, perm_null.lower_stats
    with bench.variant("none"):
        w, kp, b = lag.band_sum_squares(q, k, 0.3, 8, 20)
        assert perm_null.lower_stats is bench.null_stats
    assert torch.allclose(w, whole) and torch.allclose(kp, kept) and not b.any()
    assert bands.any() and b.shape == bands.shape
    with bench.variant("A"):
        assert lag.band_sum_squares is shipped[0] and perm_null.lower_stats is bench.null_stats
    assert (lag.band_sum_squares, perm_null.lower_stats) == shipped

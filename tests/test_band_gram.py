"""Track B on a sliding window's band and on factors above the moments' rank: the
accumulator of a windowed layer holds only the keys its window keeps (≈ T·w, not T²/2),
factors of rank n·d_head > FACTOR_RANK_MAX form the accumulator's blocks at fit time, the
path is chosen per kind of layer, and every number equals the naive fit on the explicit
mean Gram and the whole-matrix layout."""

import numpy as np
import pytest
import torch
from masks import masks
from tiny_models import arch_loaded

from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.plan import batching
from poskernel_tl.reducers import gram_cost
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.gram import GramReducer

T, SCALE = 150, 0.25


def _qk(n: int, L: int, H: int, kv: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, L, T, H, d, generator=g) + 0.5,
            torch.randn(n, L, T, kv, d, generator=g) - 0.3)


def _fitted(q, k, lasts, causal=True, **kw) -> GramReducer:
    n, L, _, H, d = q.shape
    red = GramReducer(masks(T, L, causal=causal, lasts=lasts), H, k.shape[3], d, SCALE, **kw)
    for i in range(0, n, 2):
        for layer in range(L):
            red.update(LayerBatch(layer, q[i:i + 2, layer], k[i:i + 2, layer],
                                  torch.arange(i, min(i + 2, n)), SCALE,
                                  rows=tuple(range(i, min(i + 2, n)))))
    return red


def _naive(q, k, layer: int, last: int | None, causal=True):
    qd, kd = q[:, layer].double(), k[:, layer].double()
    kd = kd.repeat_interleave(qd.shape[2] // kd.shape[2], 2)
    gram = torch.einsum("nthd,nshd->hts", qd, kd) * SCALE / len(qd)
    if causal:
        return shift_invariance_r2(gram, last=last)
    return shift_invariance_r2(gram), shift_invariance_r2(gram.transpose(1, 2))


def test_band_accumulator_holds_the_window_and_equals_the_whole_matrix():
    q, k = _qk(5, 2, 4, 2, 8)
    lasts = [20, T - 1]
    band = _fitted(q, k, lasts, full=False)
    whole = _fitted(q, k, lasts, full=True)  # every key of every row
    held = sum(a.numel() for a in band.acc[0])
    assert held == 4 * gram_cost.block_entries(T, False, 20)
    assert held < 4 * T * (20 + 64)  # the band, not the triangle
    assert sum(a.numel() for a in band.acc[1]) == 4 * gram_cost.block_entries(T, False)
    assert all(k0 == max(0, r0 - 20) for r0, _, k0, _ in band.blocks[0])
    a, b = band.result(), whole.result()
    for layer, lag in enumerate(lasts):
        r2, g = _naive(q, k, layer, lag)
        assert np.allclose(a.r2_gram_raw[layer], r2.numpy(), atol=1e-6)
        assert np.allclose(a.r2_gram_raw[layer], b.r2_gram_raw[layer], atol=1e-9, rtol=0)
        kept = slice(0, lag)
        assert np.allclose(a.g_gram_raw[layer][:, kept], b.g_gram_raw[layer][:, kept],
                           atol=1e-9, rtol=0)
    assert np.isnan(a.g_gram_raw[0][:, 20:]).all()


@pytest.mark.parametrize("lasts", [[17, T - 1], None])
def test_factors_above_the_moments_rank_form_the_blocks(lasts):
    """n·d_head = 6·48 = 288 > FACTOR_RANK_MAX: the factors' fit reads blocks formed from
    them, equal to the accumulator's and to the naive fit (windowed and global layers)."""
    q, k = _qk(6, 2, 4, 2, 48, seed=1)
    assert 6 * 48 > gram_cost.FACTOR_RANK_MAX
    fac = _fitted(q, k, lasts, full=False, factors=True).result()
    acc = _fitted(q, k, lasts, full=False).result()
    for layer in range(2):
        lag = None if lasts is None else lasts[layer]
        r2, _ = _naive(q, k, layer, lag)
        assert np.allclose(fac.r2_gram_raw[layer], r2.numpy(), atol=1e-6)
        assert np.allclose(fac.r2_gram_raw[layer], acc.r2_gram_raw[layer], atol=1e-6)
        finite = np.isfinite(acc.g_gram_raw[layer])
        assert np.allclose(fac.g_gram_raw[layer][finite], acc.g_gram_raw[layer][finite],
                           rtol=1e-5, atol=1e-5)


def test_factors_above_the_rank_read_both_triangles_of_an_encoder():
    q, k = _qk(6, 1, 2, 2, 48, seed=2)
    fac = _fitted(q, k, None, causal=False, full=False, factors=True).result()
    (low, _), (up, _) = _naive(q, k, 0, None, causal=False)
    acc = _fitted(q, k, None, causal=False, full=False).result()
    assert np.allclose(fac.r2_gram_raw[0], acc.r2_gram_raw[0], atol=1e-6)
    assert np.allclose(fac.g_gram_raw_back[0], acc.g_gram_raw_back[0], rtol=1e-5, atol=1e-5)
    assert np.isfinite(low.numpy()).all() and np.isfinite(up.numpy()).all()


def test_a_path_per_layer():
    """Factors on the global layer, the band accumulator on the windowed one: the same
    numbers as either path on every layer."""
    q, k = _qk(4, 2, 4, 2, 8, seed=3)
    lasts = [12, T - 1]
    mixed = _fitted(q, k, lasts, full=False, factors=(False, True))
    assert mixed.acc[1] == [] and mixed.acc[0] and mixed.kept[0] == []
    one = _fitted(q, k, lasts, full=False).result()
    res = mixed.result()
    assert np.allclose(res.r2_gram_raw, one.r2_gram_raw, atol=1e-6)
    with pytest.raises(ValueError, match="keeps no matrix"):
        GramReducer(masks(T, 2), 4, 2, 8, SCALE, full=True, factors=(False, True))


@pytest.fixture(scope="module")
def gemma(tiny_tokenizer):
    return arch_loaded("gemma3", tiny_tokenizer)


def test_the_plan_chooses_per_kind_of_layer(gemma):
    """A tiny Gemma 3 (window 16) at T = 4096 with 4 sequences: the windowed layers keep
    their band (≈ T·(w + 64) per head), the global ones the factors when the triangle does
    not fit; the plan says so per kind of layer."""
    T4, n = 4096, 4
    lags = gram_cost.layer_lags(gemma, T4)
    sliding = [i for i, m in enumerate(lags) if m is not None]
    assert sliding and len(sliding) < len(lags)
    band = gram_cost.accumulator_bytes(gemma, T4, False, lags[sliding[0]])
    tri = gram_cost.accumulator_bytes(gemma, T4, False)
    heads = gemma.spec.n_heads
    assert band <= heads * T4 * (lags[sliding[0]] + gram_cost.GRAM_ROWS) * 4 < tri / 20
    paths = gram_cost.track_b_paths(gemma, T4, n, False)
    assert len(paths) == 4 and all(len(p) == len(lags) for p in paths)
    w = batching.Workload(T4, n, 0)
    mixed = tuple(m is None for m in lags)  # factors on the global layers only
    tight = batching.estimate_peak(gemma, w, 1, len(lags), mixed)
    assert tight < batching.estimate_peak(gemma, w, 1, len(lags), False)
    plan = batching.plan_measure(gemma, w, 1, tight)
    assert not plan.blocked and plan.peak <= tight
    assert all(not plan.factors[i] for i in sliding), plan.why
    name = batching.path_name(gemma, T4, plan.factors)
    assert f"the accumulator on the band Δ ≤ {lags[sliding[0]]}" in name
    assert "global layers" in name and name in plan.why

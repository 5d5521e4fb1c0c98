"""Track A from q/k without the T×T logits (``reducers/lag_sums.py``): the sums against
naive numpy loops, and both reducers' lag path against their materialised-logits path."""

import numpy as np
import pytest
import torch
from masks import masks

from poskernel_tl.fit.variants import Variant, region_sums, strip_of
from poskernel_tl.reducers import LayerBatch, TrackAReducer
from poskernel_tl.reducers.lag_sums import (
    key_strip,
    lag_sums,
    lower_stats,
    lower_sum_squares,
    skew_keys,
    track_a_stats,
)
from poskernel_tl.reducers.track_a_result import REGIONS, SINK_COLUMN, STRIP, VARIANTS
from poskernel_tl.statistics import PermNullReducer

H, HKV, D = 6, 2, 5
SCALE = 0.37
R2_FIELDS = ("r2_per_seq", "r2_per_seq_nosink", "r2_pooled", "r2_pooled_nosink",
             "r2_pooled_early", "r2_pooled_interior", "r2_pooled_interior_keys", "r2_split")


class NoScores(LayerBatch):
    """A batch whose logits must not be read (the lag path never touches them)."""

    @property
    def scores(self):
        raise AssertionError("the lag path read batch.scores")


def draw(T, n=3, dtype=torch.float64, seed=0, offset=0.0, h=H, hkv=HKV, d=D):
    """Random q/k with a shared positional component (fits far from the null) and,
    with ``offset``, a common direction that gives every logit a large mean."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(T, 1, d, generator=g, dtype=torch.float64)
    u = torch.randn(1, 1, 1, d, generator=g, dtype=torch.float64)
    q = torch.randn(n, T, h, d, generator=g, dtype=torch.float64) + 2 * pos + offset * u
    k = torch.randn(n, T, hkv, d, generator=g, dtype=torch.float64) + 2 * pos + offset * u
    return q.to(dtype), k.to(dtype)


def full_logits(q, k):
    """numpy [n, head, T, T] = SCALE·q·kᵀ over every (t, s), GQA by h // group."""
    q, k = q.double().numpy(), k.double().numpy()
    kk = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    return np.einsum("nthd,nshd->nhts", q, kk) * SCALE


def naive_lower(q, k):
    """Per-lag sums and sum of squares of the strictly lower triangle, by loops over
    (t, s) with one dot product each."""
    qn, kn = q.double().numpy(), k.double().numpy()
    n, T, h, _ = qn.shape
    group = h // kn.shape[2]
    s1, sq = np.zeros((n, h, T - 1)), np.zeros((n, h))
    for x in range(n):
        for head in range(h):
            for t in range(T):
                for s in range(t):
                    a = SCALE * float(qn[x, t, head] @ kn[x, s, head // group])
                    s1[x, head, t - s - 1] += a
                    sq[x, head] += a * a
    return s1, sq


def feed(red, q, k, batch=2, hooked=None):
    """Feed in batches. Lag path (``red.source == "lags"``): batches whose logits must not
    be read. Otherwise, with ``hooked`` (a fill value) the logits come materialised in q's
    dtype, masked above the diagonal with that fill, as from ``hook_attn_scores``; without,
    the batch forms q·kᵀ itself."""
    T = q.shape[1]
    for start in range(0, len(q), batch):
        idx = torch.arange(start, min(len(q), start + batch))
        if red.source == "lags":
            b = NoScores(0, q[idx], k[idx], idx, SCALE, rows=tuple(idx.tolist()))
        elif hooked is None:
            b = LayerBatch(0, q[idx], k[idx], idx, SCALE, rows=tuple(idx.tolist()))
        else:
            A = torch.as_tensor(full_logits(q[idx], k[idx]), dtype=q.dtype)
            A = A.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(), hooked)
            b = LayerBatch(0, q[idx], k[idx], idx, SCALE, rows=tuple(idx.tolist()),
                           hooked_scores=A)
        red.update(b)


def assert_same_track_a(lags, ref, tol_sums, tol_r2):
    """Every kept sum (relative to the whole triangle's magnitude) and every result field."""
    for kind, regions in (("s1", lags.region_s1), ("sq", lags.region_sq)):
        size = getattr(ref, kind).abs().max()
        pairs = [(kind, getattr(lags, kind), getattr(ref, kind))] + [
            (v, regions[v], getattr(ref, f"region_{kind}")[v]) for v in regions]
        for name, x, y in pairs:
            diff = (x - y).abs().max()
            assert diff <= tol_sums * size, (name, float(diff / size))
    a, b = lags.result(), ref.result()
    for name in R2_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        assert np.nanmax(np.abs(x - y), initial=0.0) <= tol_r2, name
    gp, gr = a.g_pooled, b.g_pooled
    assert np.allclose(gp, gr, rtol=0, atol=tol_sums * np.abs(gr).max())
    assert np.allclose(a.g_per_seq, b.g_per_seq, rtol=0,
                       atol=max(tol_sums, 1e-6) * np.abs(b.g_per_seq).max())


# ------------------------------------------------------------------ the sums themselves
@pytest.mark.parametrize("T, chunk", [(3, 64), (4, 3), (13, 4), (37, 8), (37, 1)])
def test_sums_match_naive_loops(T, chunk):
    q, k = draw(T, n=2)
    s1, sq = naive_lower(q, k)
    assert np.abs(lag_sums(q, k, SCALE).numpy() - s1).max() <= 1e-12 * np.abs(s1).max()
    got = lower_sum_squares(q, k, SCALE, chunk).numpy()
    assert np.abs(got - sq).max() <= 1e-12 * sq.max()
    A = full_logits(q, k)
    K = min(50, T)
    assert np.abs(key_strip(q, k, SCALE, K).numpy() - A[..., :K]).max() <= 1e-12 * np.abs(A).max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cross_correlation_backends_agree(dtype):
    """scipy's FFT with numpy's einsum (a CPU's default) and torch's FFT: both the naive
    per-lag sums (GQA: 6 query heads on 2 key heads), within the dtype's rounding."""
    from poskernel_tl.reducers.lag_sums import _fft_size, cross_correlation

    q, k = draw(37, n=2, seed=3)
    s1, _ = naive_lower(q, k)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    n = _fft_size(2 * 37 - 1)
    for scipy in (True, False):
        got = cross_correlation(q, k, n, dtype, scipy=scipy)[..., 1:37].double() * SCALE
        assert got.dtype == torch.float64 and got.shape == s1.shape
        assert np.abs(got.numpy() - s1).max() <= tol * np.abs(s1).max()


@pytest.mark.parametrize("tokens", [1, 26, 40])
def test_long_batches_are_taken_in_pieces(monkeypatch, tokens):
    """A batch longer than PIECE_TOKENS positions goes through the float64 work a few
    sequences at a time (1, 2 or 3 of 5 at T = 13): the same sums as the naive loops."""
    import poskernel_tl.reducers.lag_sums as lag

    q, k = draw(13, n=5)
    s1, sq = naive_lower(q, k)
    seen = []  # the batch sizes the FFTs and the key moments see
    corr, matmul = lag.cross_correlation, torch.matmul
    monkeypatch.setattr(lag, "PIECE_TOKENS", tokens)
    monkeypatch.setattr(lag, "cross_correlation", lambda x, *a, **kw: seen.append(len(x)) or
                        corr(x, *a, **kw))
    assert np.abs(lag_sums(q, k, SCALE).numpy() - s1).max() <= 1e-12 * np.abs(s1).max()
    # the key moments' products are chunk-first: [chunk, batch, ...]
    monkeypatch.setattr(torch, "matmul", lambda x, y, *a, **kw: seen.append(x.shape[1]) or
                        matmul(x, y, *a, **kw))
    assert np.abs(lower_sum_squares(q, k, SCALE, 4).numpy() - sq).max() <= 1e-12 * sq.max()
    step = max(1, tokens // 13)
    # per piece: 1 cross-correlation; the key and query chunk moments, their inner products at chunk
    # offsets J = 0 and 2 (T − 1 = 12 holds 2 whole key chunks of 4 behind a query's
    # chunk) and 2 explicit chunk offsets (the chunk itself and the one T − 1 cuts through)
    assert max(seen) == step and len(seen) == 7 * -(-5 // step)


@pytest.mark.parametrize("T", [3, 4, 21, 49, 50, 64])
@pytest.mark.parametrize("last", [None, 7])
def test_region_sums_match_naive_loops(T, last):
    """Every Track A region (the variants and the sink column), on both sides, from the
    strip and the whole triangle's sums, against loops over the entries."""
    q, k = draw(T, n=2, seed=1)
    st = track_a_stats(q, k, SCALE, chunk=16, last=last)
    A = full_logits(q, k)
    end = T - 1 if last is None else last
    whole = (st.s1 * (torch.arange(1, T) <= end), st.sq)
    kx = k.repeat_interleave(H // HKV, 2)  # the upper side swaps q and k: one k per q
    up_sk = skew_keys(key_strip(kx, q, SCALE, min(STRIP, T)))
    up_whole = (lag_sums(kx, q, SCALE), lower_sum_squares(kx, q, SCALE, 16))
    for v in [*VARIANTS.values(), SINK_COLUMN]:
        for upper in (False, True):
            if upper and last is not None:
                continue  # windows are causal
            got1, gotsq = region_sums(up_sk if upper else st.skewed, v,
                                      up_whole if upper else whole, last, upper)
            w1, wsq = np.zeros(got1.shape), np.zeros(gotsq.shape)
            for t in range(T):
                for s in range(T):
                    lag = s - t if upper else t - s
                    if 1 <= lag <= end and v.holds(torch.tensor(t), torch.tensor(s)):
                        w1[..., lag - 1] += A[:, :, t, s]
                        wsq += A[:, :, t, s] ** 2
            scale = np.abs(A).max() * T
            assert np.abs(got1.numpy() - w1).max() <= 1e-11 * scale, (v, upper)
            assert np.abs(gotsq.numpy() - wsq).max() <= 1e-11 * (A ** 2).sum(), (v, upper)
            counts = v.counts(T, last, upper)
            assert counts.tolist() == [float(sum(
                1 for t in range(T) for s in range(T) if (s - t if upper else t - s) == lag
                and lag <= end and v.holds(torch.tensor(t), torch.tensor(s))))
                for lag in range(1, T)]


def test_region_counts_need_no_t_by_t_mask():
    """n(Δ) per region in O(T): at T = 2²⁰ a [T, T] mask would need a terabyte."""
    T = 1 << 20
    lag = torch.arange(1, T, dtype=torch.float64)
    assert torch.equal(Variant().counts(T), T - lag)
    assert torch.equal(Variant().counts(T, 511), (T - lag) * (lag <= 511))
    assert torch.equal(SINK_COLUMN.counts(T), torch.ones(T - 1, dtype=torch.float64))


def test_the_strip_is_derived_from_the_regions():
    """Any region can be declared: the strip widens to the nearest finite end of a region
    (or, open to the end, the start its complement ends at); a strip narrower than a
    region needs is refused rather than summed short."""
    assert STRIP == strip_of(REGIONS) >= max(v.strip_keys() for v in VARIANTS.values())
    far = Variant(rows=(60, STRIP + 30))
    assert far.inside() and far.strip_keys() == STRIP + 30
    assert strip_of([far, Variant(rows=(STRIP + 50, None), keys=(100, None))]) == STRIP + 50
    assert not Variant(rows=(120, None)).inside()
    with pytest.raises(ValueError, match="lo < hi"):
        Variant(rows=(5, 5))
    q, k = draw(STRIP + 40, n=1, seed=1)
    st = track_a_stats(q, k, SCALE)  # a strip of STRIP keys
    with pytest.raises(ValueError, match=f"needs a strip of {STRIP + 30} keys"):
        region_sums(st.skewed, far, (st.s1, st.sq))


@pytest.mark.parametrize("region", [Variant(rows=(60, 90)), Variant(rows=(21, 101)),
                                    Variant(rows=(70, None), keys=(65, None))])
def test_a_region_past_the_old_strip_is_exact(region):
    """A region beyond the first 50 keys, summed from a strip of its own width, against
    loops over the entries."""
    T = 110
    q, k = draw(T, n=2, seed=3)
    A = full_logits(q, k)
    K = strip_of([region])
    skewed = skew_keys(key_strip(q, k, SCALE, min(K, T)))
    whole = (lag_sums(q, k, SCALE), lower_sum_squares(q, k, SCALE, 16))
    got1, gotsq = region_sums(skewed, region, whole)
    w1, wsq = np.zeros(got1.shape), np.zeros(gotsq.shape)
    for t in range(T):
        for s in range(t):
            if region.holds(torch.tensor(t), torch.tensor(s)):
                w1[..., t - s - 1] += A[:, :, t, s]
                wsq += A[:, :, t, s] ** 2
    assert np.abs(got1.numpy() - w1).max() <= 1e-11 * np.abs(A).max() * T
    assert np.abs(gotsq.numpy() - wsq).max() <= 1e-11 * (A ** 2).sum()


def test_permuted_sums_read_both_triangles():
    """lower_stats(q[π], k[π]) = per-lag sums and Σ A² of A'[t, s] = A[π(t), π(s)], s < t,
    read off the full (unmasked) product of the original q/k."""
    T = 23
    q, k = draw(T, n=2, seed=2)
    A = full_logits(q, k)
    pi = torch.randperm(T, generator=torch.Generator().manual_seed(5))
    s1, sq, _ = lower_stats(q[:, pi], k[:, pi], SCALE, chunk=4)
    p = pi.numpy()
    want1 = np.zeros(s1.shape)
    for t in range(T):
        for s in range(t):
            want1[..., t - s - 1] += A[:, :, p[t], p[s]]
    Ap = A[:, :, p][:, :, :, p]
    wantsq = (np.tril(Ap, -1) ** 2).sum((-2, -1))
    assert np.abs(s1.numpy() - want1).max() <= 1e-12 * np.abs(A).max() * T
    assert np.abs(sq.numpy() - wantsq).max() <= 1e-12 * wantsq.max()


# ------------------------------------------------------- Track A: lags vs materialised
@pytest.mark.parametrize("T", [3, 4, 20, 49, 50, 51, 77])
@pytest.mark.parametrize("fill", [float("-inf"), 7.0])
def test_track_a_lags_equal_materialised_float64(T, fill):
    """Same sums and fits as sweeping float64 logits (GQA 6/2, T not a multiple of the
    chunk; below T = 50 the interior variants are NaN on both paths)."""
    q, k = draw(T, n=5, seed=T)
    lags = TrackAReducer(5, masks(T), H, seed=3, chunk=16)
    feed(lags, q, k)
    ref = TrackAReducer(5, masks(T), H, seed=3, source="scores")
    feed(ref, q, k, hooked=fill)
    assert_same_track_a(lags, ref, 1e-9, 1e-9)
    if T < 50:
        assert np.isnan(lags.result().r2_pooled_interior).all()


@pytest.mark.parametrize("offset", [0.0, 6.0])
def test_track_a_lags_equal_materialised_float32(offset):
    """float32 q/k: the lag path (float64 inside) against q·kᵀ formed in float32, also
    with a large common logit mean that makes sums of squares cancel."""
    T = 130
    q, k = draw(T, n=4, dtype=torch.float32, seed=7, offset=offset, d=16)
    lags = TrackAReducer(4, masks(T), H, seed=1)
    feed(lags, q, k)
    ref = TrackAReducer(4, masks(T), H, seed=1, source="scores")
    feed(ref, q, k)
    assert_same_track_a(lags, ref, 1e-5, 1e-5)


def rope_rotate(x, theta):
    """HF-style rotary (dimension i paired with i + d/2) at positions 0..T−1."""
    T, d = x.shape[1], x.shape[-1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def test_planted_rope_head_has_r2_one_on_every_variant():
    """q_t = R(t)a, k_s = R(s)b with the same a, b in every sequence: A depends on t − s
    only and is the same in every sequence, so every fit, pooled ones included, is exact."""
    T, n, d = 70, 4, 8
    g = torch.Generator().manual_seed(11)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a = torch.randn(1, 1, H, d, generator=g, dtype=torch.float64).expand(n, T, H, d)
    b = torch.randn(1, 1, HKV, d, generator=g, dtype=torch.float64).expand(n, T, HKV, d)
    q, k = rope_rotate(a, theta), rope_rotate(b, theta)
    red = TrackAReducer(n, masks(T), H, chunk=16)
    feed(red, q, k)
    res = red.result()
    for name in R2_FIELDS:
        assert np.abs(getattr(res, name) - 1).max() < 1e-9, name


def test_source_is_checked():
    """A ValueError (a TypeError first where jaxtyping checks the Literal at call time)."""
    with pytest.raises((ValueError, TypeError), match="source"):
        TrackAReducer(2, masks(8), H, source="hook")
    with pytest.raises((ValueError, TypeError), match="source"):
        PermNullReducer(masks(8), H, source="qk")


# ----------------------------------------------------------------- permutation null
def test_perm_null_lags_equal_materialised():
    """float32 q/k, the first 3 of 5 sequences (a batch split by max_seqs), GQA."""
    T = 40
    q, k = draw(T, n=5, dtype=torch.float32, seed=4, d=16)
    kw = dict(n_perm=3, max_seqs=3, seed=2)
    lags, ref = PermNullReducer(masks(T), H, **kw), PermNullReducer(masks(T), H, **kw,
                                source="scores")
    feed(lags, q, k)
    feed(ref, q, k)
    a, b = lags.result(), ref.result()
    assert a.n_seqs == b.n_seqs == 3
    assert np.abs(a.r2_null - b.r2_null).max() < 1e-5
    assert np.abs(a.r2_same_seqs - b.r2_same_seqs).max() < 1e-5


def test_perm_null_float32_sums_stay_within_1e6_of_float64():
    """The default float32 sums (float64 totals) against float64 on the same draws, at a
    length where running key moments and band windows (Δ ≤ 256) are in play."""
    T = 600
    q, k = draw(T, n=2, dtype=torch.float32, seed=3, offset=3.0)
    kw = dict(n_perm=2, max_seqs=2, seed=5)
    window = masks(T, lasts=[400])
    f32, f64 = PermNullReducer(window, H, **kw), PermNullReducer(window, H, **kw,
                                                                 dtype=torch.float64)
    assert f32.dtype == torch.float32
    feed(f32, q, k)
    feed(f64, q, k)
    a, b = f32.result(), f64.result()
    for x, y in ((a.r2_null, b.r2_null), (a.r2_same_seqs, b.r2_same_seqs),
                 (a.r2_band_null, b.r2_band_null)):
        assert np.abs(x - y).max() < 1e-6
    rel = lambda x, y: ((x - y).abs() / y.abs().clamp(min=1e-300)).max().item()
    assert rel(f32.sq, f64.sq) < 1e-6 and rel(f32.bands, f64.bands) < 1e-6


def test_perm_null_lags_match_permuted_full_product():
    """float64: each draw's kept sums equal those of A[π(t), π(s)] read from the full
    product of the original q/k."""
    T = 17
    q, k = draw(T, n=3, seed=9)
    red = PermNullReducer(masks(T), H, n_perm=2, max_seqs=8, seed=1, chunk=4, dtype=torch.float64)
    feed(red, q, k)
    A = full_logits(q, k)
    for p, pi in enumerate(red.perms.numpy()):
        Ap = A[:, :, pi][:, :, :, pi]
        want1 = np.stack([np.diagonal(Ap, -lag, -2, -1).sum(-1) for lag in range(1, T)], -1)
        wantsq = (np.tril(Ap, -1) ** 2).sum((-2, -1))
        assert np.abs(red.s1[p, 0].numpy() - want1.sum(0)).max() <= 1e-12 * np.abs(A).max() * T
        assert np.abs(red.sq[p, 0].numpy() - wantsq.sum(0)).max() <= 1e-12 * wantsq.sum()


def test_windowed_sums_of_squares_in_pieces_of_chunks(monkeypatch):
    """The windowed sums' query moments formed a few chunks at a time (as at T = 32,768
    with rank 512) give the sums of every end formed at once, and the naive ones."""
    from poskernel_tl.reducers import lag_sums as ls

    q, k = draw(300, n=2, seed=4)
    ends = [299, 40, 100, 170]
    whole = ls.sum_squares_upto(q, k, SCALE, ends, chunk=16)
    monkeypatch.setattr(ls, "MOMENT_BYTES", 3 * 2 * HKV * (H // HKV) * D * D * 8)
    pieces = ls.sum_squares_upto(q, k, SCALE, ends, chunk=16)
    assert torch.allclose(pieces, whole, rtol=1e-12, atol=0)
    A = full_logits(q, k)
    lag = np.arange(300)[:, None] - np.arange(300)[None]
    for j, W in enumerate(ends):
        want = (A ** 2 * ((lag >= 1) & (lag <= W))).sum((-2, -1))
        assert np.allclose(pieces[..., j].numpy(), want, rtol=1e-10)

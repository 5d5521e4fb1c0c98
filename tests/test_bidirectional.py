"""Bidirectional (encoder) fits: every off-diagonal entry, one g per signed lag.

The reducers against an independent numpy fit of explicitly built logit matrices, planted
asymmetric kernels, the measurement of the tiny BERT on both Track A paths, the result
files, the memory plan and the spectral analysis of a two-sided g."""

import dataclasses

import numpy as np
import pytest
import torch
from masks import masks
from tiny_models import VOCAB, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.analyses import spectral as S
from poskernel_tl.analyses.spectral import io as SIO
from poskernel_tl.analyses.spectral import table as ST
from poskernel_tl.errors import UserError
from poskernel_tl.fit.counts import upper_lag_counts
from poskernel_tl.fit.toeplitz import shift_invariance_r2_two_sided, sym_antisym, two_sided
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.protocol import EARLY_ROWS, INTERIOR_FROM, N_SPLITS, SPLIT_FRACTION
from poskernel_tl.reducers import (
    CenteringMeans,
    GramReducer,
    LayerBatch,
    MomentsReducer,
    TrackAReducer,
    gram_cost,
)
from poskernel_tl.reducers.moments import random_half
from poskernel_tl.statistics import PermNullReducer, WhitenedGramReducer
from poskernel_tl.statistics.perm_null import joint_permutations

B, T, H, D = 5, 64, 3, 6
SCALE = 0.41
EXACT = 1e-9  # float64 throughout (Track A from lag sums)
F32 = 1e-5  # paths that form float32 products (materialised logits, Track B's accumulator)


# ------------------------------------------------------------------ the naive reference
def naive_fit(mats, keep=None):
    """R², g by signed lag ({Δ: mean}) of the off-diagonal entries of ``mats`` (a list of
    [T, T] arrays) where ``keep(t, s)`` holds, by grouping the entries themselves."""
    n = mats[0].shape[0]
    t, s = np.indices((n, n))
    mask = (t != s) if keep is None else (t != s) & keep(t, s)
    vals = np.concatenate([m[mask] for m in mats])
    lags = np.tile((t - s)[mask], len(mats))
    g = {d: vals[lags == d].mean() for d in np.unique(lags)}
    resid = vals - np.array([g[d] for d in lags])
    return 1 - np.sum(resid ** 2) / np.sum((vals - vals.mean()) ** 2), g


def sides(g: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """g(Δ), Δ = 1..n−1, and g(−Δ) from a naive fit's dict (NaN at offsets it lacks)."""
    return (np.array([g.get(d, np.nan) for d in range(1, n)]),
            np.array([g.get(-d, np.nan) for d in range(1, n)]))


def draw(rng, n=B, length=T, heads=H):
    """Random float64 q/k with different positional parts (an asymmetric kernel) and a
    common offset (large logit means)."""
    pos_q = torch.randn(length, 1, D, generator=rng, dtype=torch.float64)
    pos_k = torch.randn(length, 1, D, generator=rng, dtype=torch.float64).roll(3, 0)
    q = torch.randn(n, length, heads, D, generator=rng, dtype=torch.float64) + 2 * pos_q + 1
    k = torch.randn(n, length, heads, D, generator=rng, dtype=torch.float64) + 2 * pos_k - 1
    return q, k


def mats_of(q, k, h):
    qn, kn = q.double().numpy(), k.double().numpy()
    return [qn[x, :, h] @ kn[x, :, h].T * SCALE for x in range(len(qn))]


def feed(red, q, k, batch=2):
    for start in range(0, len(q), batch):
        idx = torch.arange(start, min(len(q), start + batch))
        red.update(LayerBatch(0, q[idx], k[idx], idx, SCALE, rows=tuple(idx.tolist())))


# ----------------------------------------------------------------------------- Track A
WINDOW = 20  # a two-sided sliding window keeping |t − s| ≤ 20 of T − 1 = 63


def within(window):
    """The entry test of a two-sided window (every entry without one)."""
    return (lambda t, s: np.ones(np.shape(t), bool)) if window is None else \
        (lambda t, s: np.abs(t - s) <= window)


@pytest.fixture(scope="module", params=[None, WINDOW], ids=["whole", "window"])
def track_a(request):
    rng = torch.Generator().manual_seed(7)
    q, k = draw(rng)
    runs = {}
    lags = None if request.param is None else [request.param]
    for source in ("lags", "scores"):
        red = TrackAReducer(B, masks(T, causal=False, lasts=lags), H, seed=3, source=source)
        feed(red, q, k)
        runs[source] = red.result()
    return q, k, runs, request.param


def test_track_a_equals_the_naive_two_sided_fit(track_a):
    q, k, runs, window = track_a
    res, near = runs["lags"], within(window)
    both = lambda keep: lambda t, s: keep(t, s) & near(t, s)
    for h in range(H):
        mats = mats_of(q, k, h)
        for x in range(B):
            r2, g = naive_fit([mats[x]], near)
            assert abs(res.r2_per_seq[x, 0, h] - r2) < EXACT
            fwd, back = sides(g, T)
            assert np.allclose(res.g_per_seq[x, 0, h], fwd, rtol=1e-6, atol=1e-6,
                               equal_nan=True)  # float32
            assert np.allclose(res.g_per_seq_back[x, 0, h], back, rtol=1e-6, atol=1e-6,
                               equal_nan=True)
            assert abs(res.g_per_seq_self[x, 0, h] - np.diag(mats[x]).mean()) < EXACT
            r2_ns, _ = naive_fit([mats[x]], both(lambda t, s: s != 0))
            assert abs(res.r2_per_seq_nosink[x, 0, h] - r2_ns) < EXACT
        r2, g = naive_fit(mats, near)
        fwd, back = sides(g, T)
        assert abs(res.r2_pooled[0, h] - r2) < EXACT
        assert np.allclose(res.g_pooled[0, h], fwd, rtol=0, atol=EXACT, equal_nan=True)
        assert np.allclose(res.g_pooled_back[0, h], back, rtol=0, atol=EXACT, equal_nan=True)
        assert abs(res.g_pooled_self[0, h] - np.mean([np.diag(m).mean() for m in mats])) < EXACT
        blocks = {"r2_pooled_nosink": lambda t, s: s != 0,
                  "r2_pooled_early": lambda t, s: (t >= EARLY_ROWS[0]) & (t < EARLY_ROWS[1]),
                  "r2_pooled_interior": lambda t, s: t >= INTERIOR_FROM,
                  "r2_pooled_interior_keys": lambda t, s: (t >= INTERIOR_FROM)
                  & (s >= INTERIOR_FROM)}
        for name, keep in blocks.items():
            want = naive_fit(mats, both(keep))[0]
            assert abs(getattr(res, name)[0, h] - want) < EXACT, name
        draws = np.random.default_rng(3)
        n_sub = int(round(SPLIT_FRACTION * B))
        for i in range(N_SPLITS):
            rows = np.sort(draws.choice(np.arange(B), n_sub, replace=False))
            want = naive_fit([mats[j] for j in rows], near)[0]
            assert abs(res.r2_split[i, 0, h] - want) < EXACT


def test_track_a_materialised_path_equals_lag_sums(track_a):
    _, _, runs, _ = track_a
    a, b = runs["lags"], runs["scores"]
    for name in ("r2_per_seq", "r2_per_seq_nosink", "r2_pooled", "r2_pooled_nosink",
                 "r2_pooled_early", "r2_pooled_interior", "r2_pooled_interior_keys",
                 "r2_split", "g_pooled", "g_pooled_back", "g_pooled_self", "g_per_seq_self"):
        assert np.nanmax(np.abs(getattr(a, name) - getattr(b, name))) < F32, name


def test_causal_reducer_keeps_no_other_side(track_a):
    q, k, runs, window = track_a
    if window is not None:
        pytest.skip("the whole triangle's case")
    red = TrackAReducer(B, masks(T), H, seed=3)
    feed(red, q, k)
    res = red.result()
    assert res.g_pooled_back is None and res.g_per_seq_self is None
    r2, _ = naive_fit(mats_of(q, k, 0), lambda t, s: t > s)
    assert abs(res.r2_pooled[0, 0] - r2) < EXACT
    assert abs(runs["lags"].r2_pooled[0, 0] - r2) > 1e-3  # the two-sided fit differs


@pytest.mark.parametrize("window", [None, 12])
def test_permutation_null_fits_both_triangles(rng, window):
    q, k = draw(rng, n=3, length=40)
    perms = joint_permutations(40, 3, 2)
    near = within(window)
    for source in ("lags", "scores"):
        red = PermNullReducer(masks(40, causal=False, lasts=None if window is None else [window]),
                              H, n_perm=3, max_seqs=3, seed=2, source=source, dtype=torch.float64)
        feed(red, q, k)
        res = red.result()
        tol = EXACT if source == "lags" else F32
        for h in range(H):
            mats = mats_of(q, k, h)
            assert abs(res.r2_same_seqs[0, h] - naive_fit(mats, near)[0]) < tol
            for p, pi in enumerate(perms.numpy()):
                want = naive_fit([m[pi][:, pi] for m in mats], near)[0]
                assert abs(res.r2_null[p, 0, h] - want) < tol, (source, p, h)


def results_of(make, q, k, means=None):
    red = make()
    feed(red, q, k)
    return red.result() if means is None else red.result(means)


def same_fields(a, b, tol):
    """Every array field of two results equal within ``tol`` (NaNs where the other has)."""
    for name, x in vars(a).items():
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            y = getattr(b, name)
            assert np.array_equal(np.isnan(x), np.isnan(y)), name
            assert np.nanmax(np.abs(x - y), initial=0.0) <= tol * max(1.0, np.nanmax(
                np.abs(y), initial=0.0)), name


@pytest.mark.parametrize("what", ["lags", "scores", "null lags", "null scores", "full",
                                  "rows", "factors"])
def test_grouped_keys_fit_as_their_query_heads(rng, what):
    """Grouped-query attention, bidirectional: 4 query heads over 2 key heads (kv(h) =
    h // 2) give every statistic of Track A, the null and Track B that the same keys
    repeated to each query head give (one key head per query head, the path checked
    against the naive fits above)."""
    n, length, heads = 4, 40, 4
    q, k = draw(rng, n, length, heads)
    k = k[:, :, ::2].contiguous()
    wide = k.repeat_interleave(2, dim=2)
    if what in ("lags", "scores"):
        make = lambda kv: lambda: TrackAReducer(n, masks(length, causal=False), heads, seed=3,
                                                source=what)
        got, want = results_of(make(2), q, k), results_of(make(4), q, wide)
        tol = EXACT if what == "lags" else F32
    elif what.startswith("null"):
        make = lambda kv: lambda: PermNullReducer(masks(length, causal=False), heads, n_perm=3,
                                                  max_seqs=n, seed=2, dtype=torch.float64,
                                                  source=what.split()[1])
        got, want = results_of(make(2), q, k), results_of(make(4), q, wide)
        tol = EXACT if what == "null lags" else F32
    else:
        mom = MomentsReducer(n, 1, heads, 2, length, D, half_seed=5)
        feed(mom, q.float(), k.float())
        means = mom.result()
        mom_wide = MomentsReducer(n, 1, heads, 4, length, D, half_seed=5)
        feed(mom_wide, q.float(), wide.float())
        means_wide = mom_wide.result()
        make = lambda kv, ref: lambda: GramReducer(masks(length, causal=False), heads, kv, D, SCALE,
                                                   reference=ref, full=what == "full",
                                                   factors=what == "factors")
        got = results_of(make(2, means), q.float(), k.float(), means)
        want = results_of(make(4, means_wide), q.float(), wide.float(), means_wide)
        tol = F32
    same_fields(got, want, tol)


# ----------------------------------------------------------------------------- Track B
@pytest.mark.parametrize("window", [None, 40], ids=["whole", "window"])
@pytest.mark.parametrize("layout", ["full", "rows", "factors"])
def test_gram_equals_the_naive_two_sided_fit(rng, layout, window):
    """T = 150: two row blocks (the second partial); the accumulator with every key, or
    the factors, against explicit mean matrices (raw, centered, random half); under a
    two-sided window, on the entries it keeps."""
    n_eval, n_cen, length, heads = 3, 4, 150, 2
    q, k = draw(rng, n_eval, length, heads)
    cq, ck = draw(rng, n_cen, length, heads)
    mom = MomentsReducer(n_cen, 1, heads, heads, length, D, half_seed=5)
    feed(mom, cq.float(), ck.float())
    means = mom.result()
    red = GramReducer(masks(length, causal=False, lasts=None if window is None else [window]),
                      heads, heads, D, SCALE, reference=means, full=layout == "full",
                      factors=layout == "factors")
    feed(red, q.float(), k.float())
    res = red.result(means)
    near = within(window)
    qn, kn, cqn, ckn = (x.float().double().numpy() for x in (q, k, cq, ck))
    half = random_half(n_cen, 5)
    for h in range(heads):
        centred = lambda mq, mk, h=h: np.mean(
            [(qn[x, :, h] - mq) @ (kn[x, :, h] - mk).T * SCALE for x in range(n_eval)], axis=0)
        raw = centred(0.0, 0.0)
        cen = centred(cqn.mean(0)[:, h], ckn.mean(0)[:, h])
        cases = [(raw, res.r2_gram_raw, res.g_gram_raw, res.g_gram_raw_back,
                  res.g_gram_raw_self),
                 (cen, res.r2_gram, res.g_gram, res.g_gram_back, res.g_gram_self)]
        for mat, r2, g, g_back, g_self in cases:
            want, g_want = naive_fit([mat], near)
            fwd, back = sides(g_want, length)
            size = np.abs(mat).max()
            assert abs(r2[0, h] - want) < F32
            assert np.allclose(g[0, h], fwd, rtol=0, atol=F32 * size, equal_nan=True)
            assert np.allclose(g_back[0, h], back, rtol=0, atol=F32 * size, equal_nan=True)
            assert abs(g_self[0, h] - np.diag(mat).mean()) < F32 * size
        mat = centred(cqn[half].mean(0)[:, h], ckn[half].mean(0)[:, h])
        assert abs(res.r2_gram_half[0, h] - naive_fit([mat], near)[0]) < F32


def test_whitened_gram_fits_both_triangles(rng):
    q, k = draw(rng, n=3, length=40, heads=2)
    cq, ck = draw(rng, n=6, length=40, heads=2)
    mom = MomentsReducer(6, 1, 2, 2, 40, D, second_moments=True)
    feed(mom, cq.float(), ck.float())
    means = mom.result()
    red = WhitenedGramReducer(means, SCALE, masks(40, causal=False))
    feed(red, q.float(), k.float())
    got = red.result().r2_gram_whitened
    wq, wk = (w.double().numpy() for w in means.whitening())
    mq, mk = means.mean_q.double().numpy(), means.mean_k.double().numpy()
    qn, kn = q.float().double().numpy(), k.float().double().numpy()
    for h in range(2):
        mat = np.mean([((qn[x, :, h] - mq[0, h]) @ wq[0, h]) @ ((kn[x, :, h] - mk[0, h])
                                                               @ wk[0, h]).T * SCALE
                       for x in range(3)], axis=0)
        assert abs(got[0, h] - naive_fit([mat])[0]) < F32


# ------------------------------------------------------------------ planted ground truth
THETA = np.array([0.0, 0.3, 0.7])
COS, SIN = np.array([0.5, 1.0, 0.0]), np.array([0.0, 0.0, 0.8])


def g_true(lag):
    """0.5 + cos(0.3Δ) + 0.8 sin(0.7Δ): asymmetric (the sine is odd)."""
    lag = np.asarray(lag, np.float64)[..., None]
    return (COS * np.cos(THETA * lag) + SIN * np.sin(THETA * lag)).sum(-1)


def planted_qk(amp_q, amp_k, length=T):
    """q_t·k_s = amp_q·amp_k·g_true(t − s) exactly: per rotary pair i, q_t = R(θ_i t)(1, 0)
    and k_s = R(θ_i s)(c_i, d_i), so q_t·k_s = c_i cos θ_i(t−s) + d_i sin θ_i(t−s)."""
    ang = torch.arange(length, dtype=torch.float64)[:, None] * torch.tensor(THETA)
    cos, sin = ang.cos(), ang.sin()
    qv = torch.stack([cos, sin], -1).reshape(length, -1)
    c, d = torch.tensor(COS), torch.tensor(SIN)
    kv = torch.stack([c * cos - d * sin, c * sin + d * cos], -1).reshape(length, -1)
    a = torch.as_tensor(amp_q, dtype=torch.float64)[:, None, None, None]
    b = torch.as_tensor(amp_k, dtype=torch.float64)[:, None, None, None]
    return a * qv[None, :, None] / SCALE, b * kv[None, :, None]  # [n, T, 1, 2·pairs]


def test_planted_matrix_is_recovered_on_both_sides():
    lags = np.subtract.outer(np.arange(T), np.arange(T))
    r2, g, g_back, g_self = shift_invariance_r2_two_sided(torch.from_numpy(g_true(lags)))
    assert abs(float(r2) - 1) < EXACT
    assert np.abs(g.numpy() - g_true(np.arange(1, T))).max() < EXACT
    assert np.abs(g_back.numpy() - g_true(-np.arange(1, T))).max() < EXACT
    assert abs(float(g_self) - g_true(0)) < EXACT


def test_planted_kernel_through_the_reducers():
    amp_q, amp_k = np.array([1.0, 2.0, 0.5, 4.0]), np.array([1.0, 0.5, 2.0, 0.25])
    q, k = planted_qk(amp_q, amp_k)  # every sequence's logits are g_true(t − s) itself
    red = TrackAReducer(4, masks(T, causal=False), 1)
    feed(red, q, k)
    a = red.result()
    assert np.abs(a.r2_per_seq - 1).max() < EXACT and abs(a.r2_pooled[0, 0] - 1) < EXACT
    assert abs(a.r2_pooled_nosink[0, 0] - 1) < EXACT
    assert np.abs(a.g_pooled[0, 0] - g_true(np.arange(1, T))).max() < EXACT
    assert np.abs(a.g_pooled_back[0, 0] - g_true(-np.arange(1, T))).max() < EXACT
    assert abs(a.g_pooled_self[0, 0] - g_true(0)) < EXACT
    cq, ck = planted_qk([0.7, 1.3, 1.1], [1.2, 0.6, 0.8])
    mom = MomentsReducer(3, 1, 1, 1, T, 2 * len(THETA))
    feed(mom, cq.float(), ck.float())
    gram = GramReducer(masks(T, causal=False), 1, 1, 2 * len(THETA), SCALE, reference=mom.result())
    feed(gram, q.float(), k.float())
    b = gram.result(mom.result())
    assert abs(b.r2_gram_raw[0, 0] - 1) < F32 and abs(b.r2_gram[0, 0] - 1) < F32
    assert np.abs(b.g_gram_raw_back[0, 0] - g_true(-np.arange(1, T))).max() < F32
    assert np.abs(b.g_gram_raw[0, 0] - g_true(np.arange(1, T))).max() < F32


def test_symmetric_and_antisymmetric_parts():
    lags = np.arange(-(T - 1), T)
    g = two_sided(g_true(np.arange(1, T)), g_true(-np.arange(1, T)), g_true(0))
    assert np.array_equal(g, g_true(lags))
    sym, anti, asym = sym_antisym(g)
    assert np.abs(sym - (0.5 + np.cos(0.3 * lags))).max() < EXACT
    assert np.abs(anti - 0.8 * np.sin(0.7 * lags)).max() < EXACT
    off = lags != 0
    share = np.sum(anti[off] ** 2) / np.sum((g[off] - g[off].mean()) ** 2)
    assert abs(asym - share) < EXACT and 0.05 < asym < 0.95
    assert abs(sym_antisym(np.cos(0.3 * lags) + 2)[2]) < EXACT  # symmetric: 0
    assert abs(sym_antisym(np.sin(0.7 * lags))[2] - 1) < EXACT  # antisymmetric: 1
    assert np.isnan(two_sided(np.ones(3), np.ones(3))[3])  # Δ = 0 unknown
    assert np.isnan(sym_antisym(np.ones(7))[2])  # constant: no variance to share


def test_upper_counts_count_the_upper_triangle():
    t, s = np.indices((T, T))
    for lo, hi in ((0, None), EARLY_ROWS, (INTERIOR_FROM, None)):
        rows = (t >= lo) & (t < (hi or T))
        want = [np.sum(rows & (s - t == m)) for m in range(1, T)]
        assert upper_lag_counts(T, lo, hi).tolist() == want


# ------------------------------------------------------------- the tiny BERT, measured
@pytest.fixture(scope="module")
def bert(tiny_tokenizer):
    return tiny_loaded("bert", tiny_tokenizer)


@pytest.fixture(scope="module")
def measured(bert):
    ids = torch.randint(3, VOCAB, (6, 60), generator=torch.Generator().manual_seed(0))
    kw = dict(progress=False, null_perms=2)
    return {path: pk.measure(bert, ids, ids[:4], scores=path, **kw)
            for path in ("auto", "qk")}


def test_fast_path_equals_qk_path_on_the_tiny_bert(measured):
    fast, ref = measured["auto"], measured["qk"]
    assert fast.provenance["mask"] == "none"
    for name in ("r2_per_seq", "r2_per_seq_nosink", "r2_pooled", "r2_pooled_nosink",
                 "r2_pooled_early", "r2_pooled_interior", "r2_pooled_interior_keys",
                 "r2_split", "g_pooled", "g_pooled_back", "g_pooled_self", "g_per_seq_back",
                 "g_per_seq_self", "r2_perm_null", "r2_gram", "g_gram_back"):
        assert np.abs(getattr(fast, name) - getattr(ref, name)).max() < F32, name
    # one g per signed lag: the raw Gram's g is Track A's pooled g, on both sides
    assert np.abs(fast.g_gram_raw_back - fast.g_pooled_back).max() < F32
    assert np.abs(fast.g_gram_raw_self - fast.g_pooled_self).max() < F32


def test_hook_scores_refused_for_the_encoder(bert):
    ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with pytest.raises(UserError, match="--scores"):
        pk.measure(bert, ids, progress=False, scores="hook")


def test_saved_fields_come_back(measured, tmp_path):
    res = measured["auto"]
    res.save(tmp_path)
    back = ConditionResult.load(tmp_path)
    for name in ("g_pooled_back", "g_per_seq_back", "g_pooled_self", "g_per_seq_self",
                 "g_gram_back", "g_gram_raw_back", "g_gram_self", "g_gram_raw_self"):
        assert np.array_equal(getattr(back, name), getattr(res, name)), name
    assert back.provenance["mask"] == "none" and not back.causal
    a, b = back.to_frames()
    assert np.allclose(b["asym_gram_raw"], back.track_b.asymmetry(centered=False).ravel())
    assert {"asym_A", "asym_A_per_seq"} <= set(a.columns)
    assert back.g_two_sided("trackA").shape == (*res.r2_pooled.shape, 2 * res.length - 1)


def test_a_causal_result_has_none_of_them(track_a, tmp_path):
    q, k, _, window = track_a
    if window is not None:
        pytest.skip("the whole triangle's case")
    red = TrackAReducer(B, masks(T), H)
    feed(red, q, k)
    gram = GramReducer(masks(T), H, H, D, SCALE)
    feed(gram, q.float(), k.float())
    spec = pk.ModelSpec("toy", None, "none", "layernorm", 1, H, H, D, None, 0)
    res = ConditionResult("toy", "random", T, spec, np.arange(B),
                          parts={"track_a": red.result(), "track_b": gram.result(),
                                 "centering": CenteringMeans()})
    res.save(tmp_path)
    back = ConditionResult.load(tmp_path)
    assert back.g_pooled_back is None and back.g_gram_back is None and back.g_two_sided() is None
    with np.load(tmp_path / "results" / f"{res.stem()}_g.npz") as z:
        assert not [key for key in z.files if key.endswith(("_back", "_self"))]
    a, b = back.to_frames()
    assert not [c for c in (*a.columns, *b.columns) if c.startswith("asym")]


def test_plan_counts_every_key(bert):
    causal = dataclasses.replace(bert, spec=dataclasses.replace(bert.spec, causal=True))
    s, length = bert.spec, 300
    red = GramReducer(masks(length, s.n_layers, causal=False), s.n_heads, s.n_kv_heads, s.d_head,
                      SCALE, layers=[0], full=False)
    held = 4 * sum(a.numel() for a in red.acc[0])
    sums = (s.n_heads + s.n_kv_heads) * length * s.d_head * 8
    assert held == 4 * s.n_heads * length * length  # every key of every row
    n_eval = 100  # n·d_head beyond the factors' bar: the accumulator it is
    assert gram_cost.gram_layer_bytes(bert, length, False, n_eval) == held + sums
    assert gram_cost.gram_layer_bytes(causal, length, False, n_eval) < 0.8 * (held + sums)


# ------------------------------------------------------------------- spectral analysis
def test_two_sided_spectrum_finds_a_planted_frequency():
    lags = np.arange(-(T - 1), T)
    g = np.cos(0.9 * lags + 0.6)[None, None]  # one sinusoid, neither even nor odd
    mags = {}
    table, peaks = ST.spectral_table(g, np.full((1, 1), 0.9), None, T, two_sided=True,
                                    n_null=20, magnitudes=mags)
    assert mags["spectrum"].shape == (1, 1, 4 * T + 1) and len(mags["omega"]) == 4 * T + 1
    assert int(table["length"][0]) == T
    assert abs(peaks["omega"][0] - 0.9) < 2 * np.pi / (2 * T)


def test_spectral_reads_the_two_sided_g(measured, tmp_path):
    res = measured["auto"]
    cond = S.condition_inputs(res)
    assert cond["two_sided"] and cond["g"].shape[-1] == 2 * res.length - 1
    assert np.array_equal(cond["g"][..., res.length:], res.g_gram)
    assert np.array_equal(cond["g"][..., :res.length - 1], res.g_gram_back[..., ::-1])
    assert cond["s_pe"].shape == cond["g"].shape  # S_PE on both sides of Δ = 0 too
    table, _, _ = S.run_spectral(res, tmp_path, n_null=20)
    assert np.isfinite(table["r_pe_gram_raw"].astype(float)).all()
    assert (table["pe"] == "learned-absolute").all() and (table["length"] == res.length).all()
    saved = SIO.read_spectral(tmp_path, res.model, res.dataset, res.length, res.n_layers,
                              res.n_heads)
    assert not saved.problems and saved.omega.shape == (4 * res.length + 1,)

"""Track A and Track B reducers against naive numpy loops and planted ground truths."""

import numpy as np
import pytest
import torch
from masks import masks

from poskernel_tl.errors import NonFiniteError
from poskernel_tl.protocol import EARLY_ROWS, INTERIOR_FROM, N_SPLITS, SPLIT_FRACTION
from poskernel_tl.reducers import GramReducer, LayerBatch, MomentsReducer, TrackAReducer
from poskernel_tl.reducers.moments import random_half
from poskernel_tl.reducers.track_a_result import PER_SEQ, VARIANTS
from poskernel_tl.statistics import FreqUsageReducer

TOL = 1e-6
B, T, H, HKV, D, L = 6, 64, 4, 2, 8, 2
SCALE = 1 / np.sqrt(D)


def naive_fit(entries: list[tuple[int, float]]) -> float:
    """R² of the best g(Δ) for (lag, value) pairs, by grouping — no sufficient stats."""
    lags = np.array([e[0] for e in entries])
    vals = np.array([e[1] for e in entries], dtype=np.float64)
    g = {d: vals[lags == d].mean() for d in np.unique(lags)}
    resid = vals - np.array([g[d] for d in lags])
    return 1 - np.sum(resid ** 2) / np.sum((vals - vals.mean()) ** 2)


def entries(a: np.ndarray, rows=range(T), skip_sink=False):
    return [(t - s, a[t, s]) for t in rows for s in range(t) if not (skip_sink and s == 0)]


def logits(q, k, h):
    kvh = h // (H // HKV)
    return (q[:, h] @ k[:, kvh].T) * SCALE  # q: [pos, head, d]


def feed(reducer, qs, ks, batch=2, layer=0, hooked_fill=None):
    """Feed q/k in batches; with ``hooked_fill`` the logits come precomputed, as from
    ``hook_attn_scores``, with the masked entries set to that fill value."""
    for start in range(0, len(qs), batch):
        idx = torch.arange(start, min(len(qs), start + batch))
        scores = None
        if hooked_fill is not None:
            kk = ks[idx].repeat_interleave(H // HKV, dim=2)
            scores = torch.einsum("bthd,bshd->bhts", qs[idx], kk) * SCALE
            upper = torch.ones(T, T, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(upper, hooked_fill)
        reducer.update(LayerBatch(layer, qs[idx], ks[idx], idx, float(SCALE),
                                  rows=tuple(idx.tolist()), hooked_scores=scores))


@pytest.fixture
def qk(rng):
    q = torch.randn(B, T, H, D, generator=rng, dtype=torch.float64)
    k = torch.randn(B, T, HKV, D, generator=rng, dtype=torch.float64)
    # a shared positional component so the fits are far from the null
    pos = torch.randn(T, 1, D, generator=rng, dtype=torch.float64)
    return (q + 2 * pos).float(), (k + 2 * pos).float()


def test_track_a_matches_naive(qk):
    q, k = qk
    red = TrackAReducer(B, masks(T), H, seed=3)
    feed(red, q, k)
    res = red.result()
    qn, kn = q.double().numpy(), k.double().numpy()
    for h in range(H):
        mats = [logits(qn[x], kn[x], h) for x in range(B)]
        for x in range(B):
            want = naive_fit(entries(mats[x]))
            assert abs(res.r2_per_seq[x, 0, h] - want) < TOL
            want_ns = naive_fit(entries(mats[x], skip_sink=True))
            assert abs(res.r2_per_seq_nosink[x, 0, h] - want_ns) < TOL
            g1 = np.mean([mats[x][t, t - 1] for t in range(1, T)])
            assert abs(res.g_per_seq[x, 0, h, 0] - g1) < 1e-5
        pooled = sum((entries(m) for m in mats), [])
        assert abs(res.r2_pooled[0, h] - naive_fit(pooled)) < TOL
        pooled_ns = sum((entries(m, skip_sink=True) for m in mats), [])
        assert abs(res.r2_pooled_nosink[0, h] - naive_fit(pooled_ns)) < TOL
        early = sum((entries(m, rows=range(*EARLY_ROWS)) for m in mats), [])
        assert abs(res.r2_pooled_early[0, h] - naive_fit(early)) < TOL
        late = sum((entries(m, rows=range(INTERIOR_FROM, T)) for m in mats), [])
        assert abs(res.r2_pooled_interior[0, h] - naive_fit(late)) < TOL
        inner = sum(([(t - s_, m[t, s_]) for t in range(INTERIOR_FROM, T)
                      for s_ in range(INTERIOR_FROM, t)] for m in mats), [])
        assert abs(res.r2_pooled_interior_keys[0, h] - naive_fit(inner)) < TOL
        # the 80/20 subsets: same generator, same draws
        rng = np.random.default_rng(3)
        k_sub = int(round(SPLIT_FRACTION * B))
        subs = [naive_fit(sum((entries(mats[i]) for i in
                               np.sort(rng.choice(np.arange(B), k_sub, replace=False))), []))
                for _ in range(N_SPLITS)]
        assert abs(res.r2_split.mean(0)[0, h] - np.mean(subs)) < TOL
        assert abs(res.r2_split.std(0, ddof=1)[0, h] - np.std(subs, ddof=1)) < TOL


@pytest.mark.parametrize("source", ["lags", "scores"])
def test_every_declared_region_matches_naive(rng, source):
    """Every Track A region declared on the result (VARIANTS: the protocol's and any added
    one, such as query rows 21–100) against a naive fit of its entries, pooled over the
    sequences, at a length past every finite bound (T = 130)."""
    n, T_long = 3, 130
    q = torch.randn(n, T_long, H, D, generator=rng, dtype=torch.float64)
    k = torch.randn(n, T_long, HKV, D, generator=rng, dtype=torch.float64)
    pos = torch.randn(T_long, 1, D, generator=rng, dtype=torch.float64)
    q, k = (q + 2 * pos).float(), (k + 2 * pos).float()
    red = TrackAReducer(n, masks(T_long), H, source=source)
    for x in range(n):
        idx = torch.tensor([x])
        red.update(LayerBatch(0, q[idx], k[idx], idx, float(SCALE), rows=(x,)))
    res = red.result()
    assert max(v.strip_keys() for v in VARIANTS.values()) < T_long
    qn, kn = q.double().numpy(), k.double().numpy()
    t, s = (x.ravel() for x in np.indices((T_long, T_long)))
    for field, v in VARIANTS.items():
        if field in PER_SEQ:
            continue
        keep = (t > s) & v.holds(torch.from_numpy(t), torch.from_numpy(s)).numpy()
        for h in range(H):
            vals = np.concatenate([logits(qn[x], kn[x], h).ravel()[keep] for x in range(n)])
            want = naive_fit(list(zip(np.tile((t - s)[keep], n), vals)))
            assert abs(getattr(res, field)[0, h] - want) < TOL, (field, h)


def test_track_a_subsets_and_sink(qk):
    """Pooled fits over a subset of sequences read the per-sequence sums."""
    q, k = qk
    red = TrackAReducer(B, masks(T), H)
    feed(red, q, k)
    part = TrackAReducer(2, masks(T), H)
    feed(part, q[:2], k[:2])
    rows = torch.arange(2)
    assert torch.allclose(red.pooled(rows)[0], part.pooled()[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min, 7.0])
def test_track_a_from_hooked_scores_equals_qk_path(qk, fill):
    """The two materialised sources of Track A's logits (hook_attn_scores, masked with any
    fill value; or q·kᵀ formed from the hooked q/k) give the same numbers."""
    q, k = qk
    ours = TrackAReducer(B, masks(T), H, source="scores")
    feed(ours, q, k)
    hooked = TrackAReducer(B, masks(T), H, source="scores")
    feed(hooked, q, k, hooked_fill=fill)
    a, b = ours.result(), hooked.result()
    for name in ("r2_per_seq", "r2_pooled", "r2_pooled_nosink", "r2_pooled_early",
                 "r2_pooled_interior", "r2_pooled_interior_keys", "g_pooled"):
        assert np.abs(getattr(a, name) - getattr(b, name)).max() < TOL, name


def test_gram_matches_naive(qk, rng):
    q, k = qk
    cq = torch.randn(4, T, H, D, generator=rng) + q[:1]
    ck = torch.randn(4, T, HKV, D, generator=rng) + k[:1]
    cen = MomentsReducer(4, 1, H, HKV, T, D, half_seed=5)
    feed(cen, cq, ck)
    means = cen.result()
    gram = GramReducer(masks(T), H, HKV, D, float(SCALE), reference=means)
    feed(gram, q, k, batch=4)
    res = gram.result(means, keep_matrices=True)
    half_idx = random_half(4, 5)
    qn, kn, cqn, ckn = (x.double().numpy() for x in (q, k, cq, ck))
    for h in range(H):
        kvh = h // (H // HKV)
        raw = np.mean([logits(qn[x], kn[x], h) for x in range(B)], axis=0)
        mq, mk = cqn.mean(0)[:, h], ckn.mean(0)[:, kvh]
        cen_mat = np.mean([(qn[x, :, h] - mq) @ (kn[x, :, kvh] - mk).T * SCALE
                           for x in range(B)], axis=0)
        mq2, mk2 = cqn[half_idx].mean(0)[:, h], ckn[half_idx].mean(0)[:, kvh]
        half = np.mean([(qn[x, :, h] - mq2) @ (kn[x, :, kvh] - mk2).T * SCALE
                        for x in range(B)], axis=0)
        assert np.abs(res.gram_raw[0, h] - raw).max() < 1e-4
        assert np.abs(res.gram_centered[0, h] - cen_mat).max() < 1e-4
        assert abs(res.r2_gram_raw[0, h] - naive_fit(entries(raw))) < TOL
        assert abs(res.r2_gram[0, h] - naive_fit(entries(cen_mat))) < TOL
        assert abs(res.r2_gram_half[0, h] - naive_fit(entries(half))) < TOL


@pytest.mark.parametrize("centered", [True, False])
def test_float32_gram_keeps_float64_precision(rng, centered):
    """The Gram accumulates in float32; with per-position mean terms 100× the content
    part (as in real q/k), R² of the raw and centered Gram stay within 1e-6 of a float64
    computation of the same products."""
    n, Tn = 40, 48
    mu_q = 100 * torch.randn(1, Tn, H, D, generator=rng, dtype=torch.float64)
    mu_k = 100 * torch.randn(1, Tn, HKV, D, generator=rng, dtype=torch.float64)
    pos = torch.randn(1, Tn, 1, D, generator=rng, dtype=torch.float64)  # weak structure
    draw = lambda m, heads: m + pos + torch.randn(n, Tn, heads, D, generator=rng,
                                                  dtype=torch.float64)
    q, k = draw(mu_q, H).float(), draw(mu_k, HKV).float()
    cq, ck = draw(mu_q, H).float(), draw(mu_k, HKV).float()
    means = None
    if centered:
        cen = MomentsReducer(n, 1, H, HKV, Tn, D)
        for s in range(0, n, 4):
            idx = torch.arange(s, s + 4)
            cen.update(LayerBatch(0, cq[idx], ck[idx], idx, float(SCALE)))
        means = cen.result()
    gram = GramReducer(masks(Tn), H, HKV, D, float(SCALE), reference=means)
    for s in range(0, n, 4):
        idx = torch.arange(s, s + 4)
        gram.update(LayerBatch(0, q[idx], k[idx], idx, float(SCALE)))
    res = gram.result(means)
    qd, kd = q.double(), k.double().repeat_interleave(H // HKV, dim=2)
    ref_raw = torch.einsum("bthd,bshd->hts", qd, kd) / n * SCALE
    from poskernel_tl.fit.toeplitz import shift_invariance_r2

    assert np.abs(res.r2_gram_raw[0] - shift_invariance_r2(ref_raw)[0].numpy()).max() < 1e-6
    if centered:
        mq = means.mean_q[0].transpose(0, 1)[None]
        mk = means.mean_k[0].transpose(0, 1)[None].repeat_interleave(H // HKV, dim=2)
        ref_c = torch.einsum("bthd,bshd->hts", qd - mq, kd - mk) / n * SCALE
        r2c = shift_invariance_r2(ref_c)[0].numpy()
        assert np.abs(res.r2_gram[0] - r2c).max() < 1e-6


def rope_rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """HF-style rotary (dimension i paired with i + d/2) at positions 0..T-1."""
    T, d = x.shape[1], x.shape[-1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta[None]  # [T, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def test_exact_rope_head_has_r2_one(rng):
    """Content vectors constant across positions, then rotated: A depends on t − s only."""
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)

    def draw(n):
        a = torch.randn(n, 1, H, D, generator=rng, dtype=torch.float64).expand(n, T, H, D)
        b = torch.randn(n, 1, HKV, D, generator=rng, dtype=torch.float64).expand(n, T, HKV, D)
        return rope_rotate(a, theta), rope_rotate(b, theta)

    q, k = draw(B)
    cq, ck = draw(4)
    red = TrackAReducer(B, masks(T), H)
    feed(red, q, k)
    a = red.result()
    assert np.abs(a.r2_per_seq - 1).max() < TOL
    cen = MomentsReducer(4, 1, H, HKV, T, D)
    feed(cen, cq, ck)
    gram = GramReducer(masks(T), H, HKV, D, float(SCALE), reference=cen.result())
    feed(gram, q, k)
    b = gram.result(cen.result())
    assert np.abs(b.r2_gram - 1).max() < TOL
    assert np.abs(b.r2_gram_raw - 1).max() < TOL


def test_nonfinite_names_layer_head_sequence(qk):
    q, k = qk
    q = q.clone()
    q[3, 5, 2, 0] = float("inf")
    red = TrackAReducer(B, masks(T, 2), H)
    feed(red, q, k, layer=1)
    with pytest.raises(NonFiniteError, match="layer 1, head 2, eval sequence 3"):
        red.check_finite()


def test_whitened_gram_matches_naive(qk, rng):
    from poskernel_tl.statistics import WhitenedGramReducer

    q, k = qk
    cq = torch.randn(5, T, H, D, generator=rng) * torch.linspace(0.5, 3, D) + q[:1]
    ck = torch.randn(5, T, HKV, D, generator=rng) + k[:1]
    cen = MomentsReducer(5, 1, H, HKV, T, D, second_moments=True)
    feed(cen, cq, ck)
    means = cen.result()
    wq, wk = means.whitening()
    red = WhitenedGramReducer(means, float(SCALE), masks(T))
    feed(red, q, k)
    got = red.result().r2_gram_whitened
    qn, kn, cqn, ckn = (x.double().numpy() for x in (q, k, cq, ck))

    def inv_sqrt_cov(x):  # x: [n, T, d], centered per position, pooled covariance
        c = (x - x.mean(0)).reshape(-1, x.shape[-1])
        vals, vecs = np.linalg.eigh(c.T @ c / len(c))
        return vecs @ np.diag(vals ** -0.5) @ vecs.T

    for h in range(H):
        kvh = h // (H // HKV)
        w_q, w_k = inv_sqrt_cov(cqn[:, :, h]), inv_sqrt_cov(ckn[:, :, kvh])
        assert np.abs(wq[0, h].numpy() - w_q).max() < 1e-6
        mq, mk = cqn.mean(0)[:, h], ckn.mean(0)[:, kvh]
        gram = np.mean([((qn[x, :, h] - mq) @ w_q) @ ((kn[x, :, kvh] - mk) @ w_k).T * SCALE
                        for x in range(B)], axis=0)
        assert abs(got[0, h] - naive_fit(entries(gram))) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frequency_usage_matches_naive(qk, dtype):
    """Mean |(x_a, x_b)| per rotary pair, head and layer, against a loop over tokens."""
    q, k = (x.to(dtype) for x in qk)
    first = torch.arange(D // 2)
    red = FreqUsageReducer(1, H, HKV, first, first + D // 2)
    feed(red, q, k)
    res = red.result()
    for x, got in ((q, res.q_pair_norm), (k, res.k_pair_norm)):
        xs = x.double().numpy()
        want = np.zeros(got.shape[1:])
        for b in range(B):
            for t in range(T):
                for h in range(xs.shape[2]):
                    for i in range(D // 2):
                        want[h, i] += np.hypot(xs[b, t, h, i], xs[b, t, h, i + D // 2])
        assert np.abs(got[0] - want / (B * T)).max() <= 1e-6 * want.max() / (B * T)


def test_the_docs_region_is_the_declared_one():
    """docs/how-to/add-region.md shows the field as declared."""
    import inspect
    import re
    from pathlib import Path

    from poskernel_tl.reducers import track_a_result

    text = (Path(__file__).parents[1] / "docs" / "how-to" / "add-region.md").read_text()
    section = text[text.index("# Add a Track A region"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code in inspect.getsource(track_a_result)
    assert "r2_pooled_rows_21_100" in VARIANTS

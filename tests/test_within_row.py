"""Track A's within-row R² (:mod:`poskernel_tl.fit.within_row`): against a dense least-squares
fit of g(Δ) + c_x(t) (causal, sliding window, bidirectional, grouped-query), exactly
invariant to a constant added to any row, 1 on a planted kernel with arbitrary row
offsets, and on tiny models equal to the dense fit on what Hugging Face's eager softmax
reads as it reads it — ALiBi in its key-position form, gpt-oss with each row's maximum
subtracted — whatever form the measurement folds in."""

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, naive_within_fit, naive_within_r2, softmax_inputs
from test_softmax_terms import what_softmax_reads
from tiny_models import arch_hf_model, arch_loaded, tiny_hf_model, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.fit.within_row import RowLayout, match_mean, within_fit, within_r2
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.lag_sums import track_a_stats
from poskernel_tl.reducers.two_sided import upper_stats
from poskernel_tl.statistics import within_row
from poskernel_tl.statistics.within_row import row_sums

SCALE = 0.25


def streamed(q, k, layout: RowLayout, from_scores: bool = False):
    """(per-sequence R², pooled R²) from the sums the reducers keep."""
    st = track_a_stats(q, k, SCALE, last=layout.last)
    kept = torch.arange(1, layout.T) <= layout.last
    s1, sq = st.s1 * kept, st.sq
    if layout.two_sided:
        up = upper_stats(q, k, SCALE)
        s1, sq = torch.cat([s1, up.whole[0]], -1), sq + up.whole[1]
    batch = LayerBatch(0, q, k, torch.arange(len(q)), SCALE)
    u, row_sq = layout.row_terms(row_sums(batch, layout, "scores" if from_scores else "lags"))
    rhs, within = s1 - u, sq - row_sq
    r2, g = within_fit(rhs.sum(0), within.sum(0), layout, len(q))
    streamed.g = match_mean(g, s1.sum(0), layout, len(q))  # the pooled kernel, for a test
    return within_r2(rhs, within, layout), r2


def dense(q, k, layout: RowLayout):
    """The logits [n, head, T, T] (float64) and the entries the layer keeps."""
    g = q.shape[2] // k.shape[2]
    A = torch.einsum("bthd,bshd->bhts", q.double(), k.double().repeat_interleave(g, 2)) * SCALE
    t = torch.arange(layout.T)
    lag = t[:, None] - t[None]
    keep = lag != 0 if layout.two_sided else (lag >= 1) & (lag <= layout.last)
    return A, keep.expand_as(A)


def qk(n=3, T=24, H=4, kv=2, d=8, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, T, H, d, generator=gen, dtype=dtype)
    k = torch.randn(n, T, kv, d, generator=gen, dtype=dtype) + 0.3
    return q, k


@pytest.mark.parametrize("layout,kv", [(RowLayout(24, 23), 2), (RowLayout(24, 7), 2),
                                       (RowLayout(24, 23), 4), (RowLayout(20, 19, True), 4)],
                         ids=["causal-gqa", "window", "causal", "bidirectional"])
def test_equals_the_dense_least_squares_fit(layout, kv, monkeypatch):
    monkeypatch.setattr(within_row, "ROW_BLOCK", 7)  # the logits' rows in several blocks
    q, k = qk(T=layout.T, kv=kv)
    per_seq, pooled = streamed(q, k, layout)
    A, keep = dense(q, k, layout)
    assert np.abs(pooled.numpy() - naive_within_r2(A, keep)).max() <= 1e-9
    for x in range(len(q)):
        assert np.abs(per_seq[x].numpy() - naive_within_r2(A[x:x + 1], keep[x:x + 1])).max() \
            <= 1e-9
    assert np.allclose(streamed(q, k, layout, from_scores=True)[1], pooled, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", [RowLayout(32, 31), RowLayout(32, 9),
                                    RowLayout(24, 23, True)], ids=["causal", "window", "both"])
def test_a_constant_per_row_changes_nothing(layout):
    """q' = [q, c_t/scale], k' = [k, 1]: the logits gain c_t on every entry of row t."""
    q, k = qk(T=layout.T, kv=4)
    c = torch.randn(*q.shape[:2], 1, 1, generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64).expand(*q.shape[:3], 1) * 5
    shifted = (torch.cat([q, c / SCALE], -1), torch.cat([k, torch.ones_like(k[..., :1])], -1))
    for a, b in zip(streamed(q, k, layout), streamed(*shifted, layout)):
        assert (a - b).abs().max() <= 1e-12
    raw = lambda q, k: pk.fit.toeplitz.shift_invariance_r2(dense(q, k, layout)[0])[0]
    if not layout.two_sided:  # Track A's raw R² does move
        assert (raw(q, k) - raw(*shifted)).abs().max() > 1e-2


def test_a_planted_kernel_with_row_offsets_reads_one():
    """A head whose logits are g(Δ) plus a constant per row: q_t = [cos tθ, sin tθ, c_t],
    k_s = [cos sθ, sin sθ, 1]: R² within rows 1, Track A's raw R² well below."""
    T, n = 48, 3
    theta = torch.tensor([0.3, 0.05], dtype=torch.float64)
    pos = torch.arange(T, dtype=torch.float64)[:, None] * theta
    rot = torch.cat([pos.cos(), pos.sin()], -1)
    c = torch.randn(n, T, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    q = torch.cat([rot.expand(n, T, 4), c], -1)[:, :, None] / SCALE
    k = torch.cat([rot.expand(n, T, 4), torch.ones(n, T, 1, dtype=torch.float64)], -1)[:, :,
                                                                                        None]
    per_seq, pooled = streamed(q, k, RowLayout(T, T - 1))
    assert (pooled - 1).abs().max() <= 1e-12 and (per_seq - 1).abs().max() <= 1e-12
    lags = torch.arange(1, T, dtype=torch.float64)
    planted = (lags[:, None] * theta).cos().sum(-1)  # g(Δ) = Σ_i cos(θ_i Δ)
    off = streamed.g[0] - planted  # the within-row kernel: the planted one, to a constant
    assert (off - off.mean()).abs().max() <= 1e-10
    counts = RowLayout(T, T - 1).lag_counts()  # its level: the raw logits' mean
    A = dense(q, k, RowLayout(T, T - 1))[0]
    assert float((streamed.g[0] * counts).sum() / counts.sum()) == pytest.approx(
        float(A.tril(-1).sum() / (n * counts.sum())), abs=1e-12)
    raw = pk.fit.toeplitz.shift_invariance_r2(dense(q, k, RowLayout(T, T - 1))[0])[1][0]
    assert ((raw - planted) - (raw - planted).mean()).abs().max() > 0.1  # rows leak into it
    assert pk.fit.toeplitz.shift_invariance_r2(dense(q, k, RowLayout(T, T - 1))[0])[0].max() < 0.9


def test_large_lengths_solve_like_a_dense_system():
    """The causal sweep against a dense solve at T = 1024 (window 300 and none)."""
    for W in (1023, 300):
        layout = RowLayout(1024, W)
        rhs = torch.randn(5, 1023, dtype=torch.float64) * (torch.arange(1, 1024) <= W)
        rhs[:, :W] -= rhs[:, :W].mean(-1, keepdim=True)
        m = layout.row_counts()
        lags = torch.arange(1, W + 1)
        B = ((lags[None] <= m[:, None]) & (m[:, None] > 0)).double()
        K = torch.diag(layout.lag_counts()[:W]) - B.T @ (B / m.clamp(min=1)[:, None])
        g = layout.solve(rhs)
        assert (g[:, W:] == 0).all()
        assert ((g[:, :W] @ K.T) - rhs[:, :W]).abs().max() <= 1e-9 * rhs.abs().max()


# ------------------------------------------------------------ on tiny models
ARCHS = ["bloom", "mpt", "falcon_alibi", "gpt_oss", "gemma2", "starcoder2", "llama"]


@pytest.mark.parametrize("arch", ARCHS)
def test_what_the_softmax_reads_as_it_reads_it(arch, tiny_tokenizer):
    """pk.measure's within-row R² (pooled and per sequence) against the dense fit on the
    raw input of HF's eager softmax — ALiBi in HF's key-position form, gpt-oss's rows less
    their maximum, Gemma 2's soft-cap — which differ from what Track A fits by a constant
    per row: ≤ 1e-6 (float32 models)."""
    model = arch_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (3, 28), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_perms=0)
    part = res.parts["within_row"]
    for layer, (A, keep, _) in enumerate(softmax_inputs(arch_hf_model(arch), ids)):
        want, kernels = naive_within_fit(A, keep)
        assert np.abs(part.r2_within_pooled[layer] - want).max() <= 1e-6, (arch, layer)
        check_kernels(part, layer, kernels, A)
        one = naive_within_r2(A[1:2], keep[1:2])
        assert np.abs(part.r2_within_per_seq[1, layer] - one).max() <= 1e-6, (arch, layer)
    if arch in ("bloom", "mpt", "falcon_alibi", "gpt_oss"):  # the form Track A fits
        for (A, keep, _), (B, _) in zip(softmax_inputs(arch_hf_model(arch), ids),
                                        what_softmax_reads(arch, model, ids)):
            assert np.abs(naive_within_r2(A, keep) - naive_within_r2(B, keep)).max() <= 1e-9
            if arch != "gpt_oss":  # (gpt-oss's maxima may sit on one row's same key)
                assert np.abs(naive_r2(A, keep) - naive_r2(B, keep)).max() > 1e-3


def check_kernels(part, layer: int, kernels: list, A) -> None:
    """The within-row g of every head against the dense fit's up to a constant (HF's
    softmax input may differ from what Track A fits by a constant per row, which moves
    the raw mean the level is set from): ≤ 1e-5 of the logits' scale (float32 models);
    NaN where no entry is kept."""
    scale = float(A.abs().max())
    for h, kernel in enumerate(kernels):
        got = {d: part.g_within[layer, h, d - 1] for d in range(1, part.g_within.shape[-1] + 1)}
        if part.g_within_back is not None:
            got.update({-d: part.g_within_back[layer, h, d - 1] for d in got if d > 0})
        assert all(np.isnan(v) for d, v in got.items() if d not in kernel)
        diff = np.array([got[d] - kernel[d] for d in kernel])
        assert np.abs(diff - diff.mean()).max() <= 1e-5 * scale, (layer, h)


def test_an_encoder_both_sides(tiny_tokenizer):
    """A bidirectional BERT: every off-diagonal entry of each row."""
    model = tiny_loaded("bert", tiny_tokenizer)
    ids = torch.randint(3, 290, (3, 20), generator=torch.Generator().manual_seed(1))
    part = pk.measure(model, ids, progress=False, null_perms=0).parts["within_row"]
    for layer, (A, keep, _) in enumerate(softmax_inputs(tiny_hf_model("bert"), ids)):
        want, kernels = naive_within_fit(A, keep)
        assert np.abs(part.r2_within_pooled[layer] - want).max() <= 1e-6
        check_kernels(part, layer, kernels, A)


def test_columns_reach_the_tables(tiny_tokenizer):
    model = arch_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (3, 20), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_perms=0)
    track_a, _ = res.to_frames()
    assert {"R2_within_row_per_seq", "R2_within_row_pooled"} <= set(track_a.columns)
    heads = res.kernels()
    part = res.parts["within_row"]
    assert np.allclose(heads["R2_within_row_per_seq"], part.r2_within_per_seq.mean(0).ravel())
    assert res.condition_values()["R2_within_row"] == pytest.approx(part.r2_within_pooled.mean())

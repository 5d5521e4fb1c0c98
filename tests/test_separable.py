"""Causal-mask separable baseline: sufficient-statistics R² against dense least squares,
planted matrices of each form, and the streaming reducer against the function."""

from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch
from masks import masks

from poskernel_tl.analyses.separable import (
    FITS,
    SeparableReducer,
    gram,
    plot_separable,
    separable_r2,
    separable_r2_from_stats,
    separable_stats,
    separable_table,
)
from poskernel_tl.fit.toeplitz import shift_invariance_r2

TOL = 1e-9


def design(T: int, keep: np.ndarray | None = None
           ) -> tuple[np.ndarray, dict[str, slice], np.ndarray, np.ndarray]:
    """Explicit indicator design on the strictly lower triangle (its entries ``keep``
    holds, [T, T] bool, where given): columns (lag, row, col)."""
    m = T - 1
    t, s = np.tril_indices(T, -1) if keep is None else np.nonzero(np.tril(keep, -1))
    X = np.zeros((len(t), 3 * m))
    X[np.arange(len(t)), t - s - 1] = 1
    X[np.arange(len(t)), m + t - 1] = 1
    X[np.arange(len(t)), 2 * m + s] = 1
    blocks = {"R2_toeplitz": slice(0, m), "R2_separable": slice(m, 3 * m),
              "R2_toeplitz_separable": slice(0, 3 * m)}
    return X, blocks, t, s


def dense_r2(X: np.ndarray, y: np.ndarray) -> float:
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    return 1 - resid @ resid / np.sum((y - y.mean()) ** 2)


@pytest.mark.parametrize("T", [6, 7, 9, 12])
def test_matches_dense_lstsq_per_sequence_and_pooled(T, rng):
    n = 3
    scores = torch.randn(n, T, T, generator=rng, dtype=torch.float64) * 2 + 5
    scores = scores + torch.arange(T, dtype=torch.float64)[:, None] * 0.3  # a row trend
    X, blocks, t, s = design(T)
    got = separable_r2(scores)
    ys = [scores[i].numpy()[t, s] for i in range(n)]
    for name, cols in blocks.items():
        for i in range(n):
            want = dense_r2(X[:, cols], ys[i])
            assert abs(got[name][i].item() - want) < TOL, (name, i, got[name][i].item(), want)
    pooled = separable_r2_from_stats(separable_stats(scores).sum(0), T, n=n)
    Xn, yn = np.vstack([X] * n), np.concatenate(ys)
    for name, cols in blocks.items():
        want = dense_r2(Xn[:, cols], yn)
        assert abs(pooled[name].item() - want) < TOL, (name, pooled[name].item(), want)


@pytest.mark.parametrize("T", [6, 11])
def test_gram_matches_explicit_design(T):
    X, *_ = design(T)
    assert torch.allclose(gram(T), torch.from_numpy(X.T @ X))


def _planted(T: int, rng: torch.Generator) -> dict[str, torch.Tensor]:
    t = torch.arange(T)
    g = torch.randn(2 * T, generator=rng, dtype=torch.float64)
    r = torch.randn(T, generator=rng, dtype=torch.float64) * 2
    c = torch.randn(T, generator=rng, dtype=torch.float64) * 2
    toep = g[t[:, None] - t[None, :] + T]
    sep = r[:, None] + c[None, :]
    return {"toeplitz": toep, "separable": sep, "sum": toep + sep}


@pytest.mark.parametrize("T", [8, 64])
def test_planted_matrices(T, rng):
    p = _planted(T, rng)
    r_toep = separable_r2(p["toeplitz"])
    r_sep = separable_r2(p["separable"])
    r_sum = separable_r2(p["sum"])
    assert abs(r_toep["R2_toeplitz"].item() - 1) < TOL
    assert abs(r_toep["R2_toeplitz_separable"].item() - 1) < TOL
    assert abs(r_sep["R2_separable"].item() - 1) < TOL
    assert abs(r_sep["R2_toeplitz_separable"].item() - 1) < TOL
    assert r_sep["R2_toeplitz"].item() < 0.9
    assert abs(r_sum["R2_toeplitz_separable"].item() - 1) < TOL
    assert r_sum["R2_toeplitz"].item() < 0.99 and r_sum["R2_separable"].item() < 0.99


def test_nested_models_and_noise(rng):
    scores = torch.randn(5, 4, 33, 33, generator=rng, dtype=torch.float64)
    r = separable_r2(scores)
    assert torch.all(r["R2_toeplitz_separable"] >= r["R2_toeplitz"] - TOL)
    assert torch.all(r["R2_toeplitz_separable"] >= r["R2_separable"] - TOL)
    assert torch.all((r["R2_toeplitz_separable"] > 0) & (r["R2_toeplitz_separable"] < 0.5))


def test_toeplitz_equals_core_fit_and_upper_triangle_ignored(rng):
    T = 40
    scores = torch.randn(2, 3, T, T, generator=rng) * 4 + 30  # float32, large mean
    masked = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(), float("-inf"))
    ours = separable_r2(masked)
    core, _ = shift_invariance_r2(scores)
    assert torch.allclose(ours["R2_toeplitz"], core, atol=1e-6, rtol=0)
    ref = separable_r2(scores.double())
    for name in FITS:
        assert torch.allclose(ours[name], ref[name], atol=1e-5, rtol=0), name
        assert torch.isfinite(ours[name]).all()


def test_constant_input_gives_nan():
    with pytest.warns(RuntimeWarning, match="constant"):
        r = separable_r2(torch.full((7, 7), 3.0))
    assert all(torch.isnan(r[name]) for name in FITS)


def test_reducer_matches_function(rng):
    n, L, H, T, b = 5, 2, 3, 24, 2
    scores = torch.randn(n, L, H, T, T, generator=rng) * 3
    scores = scores + torch.arange(T)[None, None, None, None, :] * 0.1
    red = SeparableReducer(n, masks(T, L), H)
    order = [torch.tensor([3, 0]), torch.tensor([4, 1]), torch.tensor([2])]
    for idx in order[:b] + order[b:]:
        for layer in range(L):
            red.update(SimpleNamespace(layer=layer, index=idx, scores=scores[idx, layer]))
    res = red.result()
    assert res.R2_toeplitz_per_seq.shape == (n, L, H) and res.R2_separable.shape == (L, H)
    per_seq = separable_r2(scores.double())
    pooled = separable_r2_from_stats(separable_stats(scores.double()).sum(0), T, n=n)
    core_seq, _ = shift_invariance_r2(scores)
    for name in FITS:
        np.testing.assert_allclose(getattr(res, f"{name}_per_seq"), per_seq[name].numpy(),
                                   atol=1e-6, rtol=0)
        np.testing.assert_allclose(getattr(res, name), pooled[name].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(res.R2_toeplitz_per_seq, core_seq.numpy(), atol=1e-6, rtol=0)

    table = separable_table(res, "tiny", "random", T)
    assert len(table) == L * H
    assert {"layer", "head", *FITS, "R2_toeplitz_seq_mean"} <= set(table.columns)
    row = table[(table.layer == 1) & (table["head"] == 2)].iloc[0]
    assert abs(row.R2_separable - res.R2_separable[1, 2]) < 1e-12
    assert abs(row.R2_toeplitz_seq_mean - res.R2_toeplitz_per_seq[:, 1, 2].mean()) < 1e-12

    backend = matplotlib.get_backend()
    fig = plot_separable(table)
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3
    assert matplotlib.get_backend() == backend


def test_reducer_on_a_pooled_planted_kernel(rng):
    """Sequences sharing one Toeplitz kernel plus per-sequence row/column effects: the
    pooled Toeplitz + separable fit is not exact (row effects differ across sequences)
    but per sequence it is."""
    n, T = 4, 16
    seqs = torch.stack([_planted(T, rng)["sum"] for _ in range(n)])
    red = SeparableReducer(n, masks(T), 1)
    red.update(SimpleNamespace(layer=0, index=torch.arange(n), scores=seqs[:, None]))
    res = red.result()
    assert np.allclose(res.R2_toeplitz_separable_per_seq, 1, atol=1e-9)
    assert res.R2_toeplitz_separable[0, 0] < 1 - 1e-3

"""QIG Fisher–Rao kernel (seed 003) as a position-free control, and the joint
position-permutation null of the Toeplitz R²."""

import math

import matplotlib
import numpy as np
import pytest
import torch

from poskernel_tl.analyses.qig_kernel import (
    QIGKernel,
    QIGKernelConfig,
    fisher_rao_distance,
    fisher_rao_distances,
    kappa_proxy,
    pair_permutation_null_r2,
    phi_proxy,
    plot_qig_null,
    project_to_simplex,
    qfi_attention_weights,
    qig_logits,
    qig_table,
    r2_vs_permutation_null,
    residual_streams,
    synthetic_basins,
)
from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.statistics.perm_null import joint_permutations


def seed_formula(x: np.ndarray, temperature: float, eps: float = 1e-8) -> np.ndarray:
    """The seed's pairwise logits written out in numpy, float64, one pair at a time."""
    sp = np.log1p(np.exp(x))
    p = np.maximum(sp / (sp.sum(-1, keepdims=True) + eps), eps)
    p = p / (p.sum(-1, keepdims=True) + eps)
    T = x.shape[0]
    out = np.empty((T, T))
    for i in range(T):
        for j in range(T):
            inner = np.clip(np.sqrt(p[i] * p[j] + eps).sum(), -1 + 1e-6, 1 - 1e-6)
            out[i, j] = -2 * np.arccos(inner) / temperature
    return out


def test_logits_match_seed_formula(rng):
    x = torch.randn(2, 9, 16, generator=rng, dtype=torch.float64) * 2
    got = qig_logits(x, temperature=0.5)
    assert got.shape == (2, 9, 9)
    for b in range(2):
        want = seed_formula(x[b].numpy(), 0.5)
        assert np.abs(got[b].numpy() - want).max() < 1e-12
    # the broadcast form of the seed gives the same numbers
    p = project_to_simplex(x)
    d = fisher_rao_distance(p[:, :, None, :], p[:, None, :, :])
    assert torch.allclose(fisher_rao_distances(x), d, atol=1e-12, rtol=0)
    assert torch.equal(got, got.transpose(-1, -2))


def test_distance_range_and_weights(rng):
    a = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    b = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert abs(fisher_rao_distance(a, b).item() - math.pi) < 1e-3
    assert fisher_rao_distance(a, a).item() < 3e-3  # the seed's clamp: 2·acos(1 − 1e-6)
    x = torch.randn(3, 11, 8, generator=rng)
    w = qfi_attention_weights(x, temperature=0.3)
    assert torch.allclose(w.sum(-1), torch.ones(3, 11), atol=1e-6)


def test_permuting_positions_permutes_logits_exactly(rng):
    x = torch.randn(3, 37, 64, generator=rng)
    pi = torch.randperm(37, generator=rng)
    logits = qig_logits(x, temperature=0.7)
    assert torch.equal(qig_logits(x[:, pi], temperature=0.7), logits[:, pi][:, :, pi])
    kernel = QIGKernel(QIGKernelConfig(basin_dim=64))
    with torch.no_grad():
        out, metrics = kernel(x)
        out_p, metrics_p = kernel(x[:, pi])
    assert torch.allclose(out_p, out[:, pi], atol=1e-5)
    for name in ("phi_proxy", "kappa_proxy"):
        assert torch.allclose(metrics_p[name], metrics[name], atol=1e-5)


def test_proxies_are_the_seed_statistics(rng):
    x = torch.randn(2, 50, 6, generator=rng, dtype=torch.float64)
    assert torch.allclose(kappa_proxy(x), x.norm(dim=-1).mean(-1))
    corr = np.corrcoef(x[0].numpy().T)
    want = np.abs(corr - np.diag(np.diag(corr))).mean()
    assert abs(phi_proxy(x)[0].item() - want) < 1e-6
    with pytest.raises(ValueError, match="basin_dim"):
        QIGKernel(QIGKernelConfig(basin_dim=64))(x)


def test_null_equals_explicit_joint_permutation(rng):
    T = 15
    a = torch.randn(2, T, T, generator=rng, dtype=torch.float64)
    sym = a + a.transpose(-1, -2)
    null = pair_permutation_null_r2(sym, n_perm=12, seed=3)
    perms = joint_permutations(T, 12, seed=3)
    for k, pi in enumerate(perms):
        want, _ = shift_invariance_r2(sym[:, pi][:, :, pi])
        assert torch.allclose(null[k], want, atol=1e-12, rtol=0)
    # a causal-masked matrix: the null only ever sees lower-triangle values
    masked = a.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(), float("-inf"))
    lower_sym = torch.tril(a, -1) + torch.tril(a, -1).transpose(-1, -2)
    assert torch.allclose(pair_permutation_null_r2(masked, 12, 3),
                          pair_permutation_null_r2(lower_sym, 12, 3), atol=1e-12, rtol=0)


def test_qig_on_iid_basins_matches_the_null_and_planted_kernel_does_not(rng):
    x = synthetic_basins(4, 48, 64, seed=0)
    test = r2_vs_permutation_null(qig_logits(x), n_perm=200, seed=1)
    assert test.null.shape == (200, 4)
    lo, hi = torch.quantile(test.null, 0.01, dim=0), torch.quantile(test.null, 0.99, dim=0)
    assert torch.all((test.r2 >= lo) & (test.r2 <= hi)), (test.r2, lo, hi)
    assert torch.all((test.percentile > 1) & (test.percentile < 99)), test.percentile

    T = 48
    t = torch.arange(T)
    g = torch.cos(0.3 * torch.arange(2 * T)) + 0.02 * torch.arange(2 * T)
    planted = g[t[:, None] - t[None, :] + T] + 0.1 * torch.randn(T, T, generator=rng)
    ref = r2_vs_permutation_null(planted, n_perm=200, seed=1)
    assert ref.r2 > 0.95 and ref.percentile == 100 and ref.p_value == pytest.approx(1 / 201)
    assert ref.null.max() < 0.5 * ref.r2


def test_table_and_figure():
    sources = {"basins": synthetic_basins(3, 24, 16, seed=2),
               "blocks.1.hook_resid_pre": synthetic_basins(2, 24, 16, seed=3)}
    table = qig_table(sources, temperature=1.0, n_perm=50, seed=0, model="m", dataset="d")
    assert len(table) == 5
    assert list(table.layer.unique()) == [-1, 1]
    for col in ("R2_qig", "null_p01", "null_p99", "percentile", "p_value", "phi_proxy",
                "kappa_proxy"):
        assert table[col].notna().all(), col
    assert (table.null_p01 <= table.null_p99).all()
    backend = matplotlib.get_backend()
    fig = plot_qig_null(table)
    assert len(fig.axes) == 1
    assert matplotlib.get_backend() == backend


def test_residual_stream_of_a_tiny_model(tiny_tokenizer):
    from tiny_models import tiny_loaded

    model = tiny_loaded("llama", tiny_tokenizer, compatibility_mode=False)
    tokens = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    streams = residual_streams(model, tokens, layers=[0, 1])
    assert list(streams) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    assert streams["blocks.1.hook_resid_pre"].shape == (2, 20, 64)
    table = qig_table(streams, n_perm=20, model="tiny-llama", dataset="random")
    assert len(table) == 4 and set(table.layer) == {0, 1}
    assert table.R2_qig.between(0, 1).all()

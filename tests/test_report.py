"""The report's parts: figures on synthetic results, verdict logic on hand-built tables, the
permutation-null reducer on planted heads and the analytic null (build_report end to end:
test_report_build.py)."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from masks import masks
from matplotlib.figure import Figure

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.reducers import LayerBatch
from poskernel_tl.report import figure_nulls as FN
from poskernel_tl.report import figures as F
from poskernel_tl.report import nulls as N
from poskernel_tl.report import tables as TB
from poskernel_tl.report import verdicts as V
from poskernel_tl.statistics.perm_null import PermNullReducer

SCRIPT = "<script>alert(1)</script>\"quoted\" 'single'"


def make_spec(name: str, **changes):
    spec = REGISTRY[name]
    if spec.pe == "rope":
        i = np.arange(0, spec.d_head, 2)
        changes.setdefault("inv_freq", tuple(float(spec.rope_base) ** (-i / spec.d_head)))
    return dataclasses.replace(spec, **changes)


def synthetic(model: str = "smollm2-135m", dataset: str = "prose", T: int = 32, n: int = 6,
              layers: int = 4, heads: int | None = None, kv: int | None = None,
              centered: bool = True, level: float = 0.8, seed: int = 0,
              **spec_changes) -> ConditionResult:
    """A ConditionResult with random arrays of the right shapes; R² decays with depth and
    Track B's g(Δ) is a sum of the model's rotary cosines."""
    rng = np.random.default_rng(seed)
    base = REGISTRY[model]
    H = heads or base.n_heads
    Hkv = kv or (base.n_kv_heads if heads is None else H)
    spec = make_spec(model, n_layers=layers, n_heads=H, n_kv_heads=Hkv, d_head=8,
                     **spec_changes)
    L, d = layers, spec.d_head
    depth = np.clip(level - 0.15 * np.arange(L)[:, None] + 0.05 * rng.standard_normal((L, H)),
                    0.01, 0.99)
    per_seq = np.clip(depth[None] + 0.05 * rng.standard_normal((n, L, H)), 0, 1)
    lags = np.arange(1, T)
    th = spec.rotary_frequencies()
    cos = np.cos(np.outer(lags, th)).sum(1) if th is not None else np.exp(-lags / 8)
    g = np.broadcast_to(cos, (L, H, T - 1)) + 0.01 * rng.standard_normal((L, H, T - 1))
    f = lambda *s: rng.standard_normal(s)
    r2_gram = np.clip(depth + 0.03, 0, 1) if centered else np.full((L, H), np.nan)
    gram = np.zeros((L, H, T, T))
    t, s = np.tril_indices(T, -1)
    gram[:, :, t, s] = g[:, :, t - s - 1]
    extra = {"n_centering": 0}  # uncentered: as a run of random tokens records it
    if centered:
        extra = dict(mean_q=f(L, H, T, d).astype(np.float32),
                     mean_k=f(L, Hkv, T, d).astype(np.float32), n_centering=n,
                     gram_centered=gram.astype(np.float32))
    return ConditionResult(
        model=model, dataset=dataset, length=T, spec=spec, seq_id=np.arange(100, 100 + n),
        r2_per_seq=per_seq, r2_per_seq_nosink=np.clip(per_seq + 0.02, 0, 1),
        g_per_seq=f(n, L, H, T - 1).astype(np.float32), r2_pooled=depth,
        r2_pooled_nosink=np.clip(depth + 0.03, 0, 1), g_pooled=g + 1.0,
        r2_pooled_early=np.clip(depth - 0.2, 0, 1), r2_pooled_interior=depth,
        r2_pooled_interior_keys=depth, r2_split=depth[None] + 0.01 * f(5, L, H),
        centered=centered, r2_gram=r2_gram, g_gram=g if centered else np.full(g.shape, np.nan),
        r2_gram_raw=np.clip(depth - 0.05, 0, 1), g_gram_raw=g + 0.5,
        r2_gram_half=r2_gram, gram_raw=gram.astype(np.float32),
        logits={}, provenance={"weights": "synthetic"}, **extra)


@pytest.fixture(scope="module")
def grid() -> list[ConditionResult]:
    """SmolLM2-like GQA (prose, centered; random tokens, uncentered), a LLaMA-like GQA
    model, GPT-2 (absolute PE) and a NoPE model."""
    return [synthetic(), synthetic(dataset="random", centered=False, seed=1),
            synthetic("llama-3.2-1b", layers=5, heads=8, kv=2, seed=2),
            synthetic("gpt2", heads=6, level=0.4, seed=3),
            synthetic("tinyllama-nope-1.1b", heads=8, kv=4, level=0.2, seed=4)]


# --------------------------------------------------------------------------- figures
def test_fig1_marks_kv_groups_and_shares_scale(grid):
    fig = F.fig1_heatmaps(grid)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(grid)
    for ax, r in zip(panels, grid):
        assert ax.images[0].get_clim() == (0, 1)
        rules = [ln for ln in ax.lines if ln.get_xdata()[0] % 1 == 0.5]
        assert len(rules) == r.spec.n_kv_heads - 1 if r.spec.group_size > 1 else not rules
    assert "Q4_1-dequantized" in panels[0].get_title()


def test_fig2_slope_in_legend_and_uncentered_condition(grid):
    fig = F.fig2_depth(grid)
    legends = [[t.get_text() for t in ax.get_legend().get_texts()]
               for ax in fig.axes if ax.get_visible() and ax.get_legend()]
    assert len(legends) == len(grid)
    slope, se, _ = TB.depth_slope(grid[0].r2_pooled)
    assert any(f"{slope:+.4f} ± {se:.4f}" in t for t in legends[0])
    assert "Track B centered" in legends[0]
    assert any("not run (uncentered)" in t for t in legends[1])


def test_depth_slope_against_a_naive_least_squares_line():
    """The per-layer means' line against numpy's polyfit and the textbook standard error;
    NaN layers are skipped, and fewer than 3 finite layers give NaN."""
    rng = np.random.default_rng(3)
    r2 = 0.8 - 0.02 * np.arange(8)[:, None] + 0.01 * rng.standard_normal((8, 4))
    r2[5] = np.nan
    y = np.nanmean(r2, axis=1)
    x = np.arange(8.0)[np.isfinite(y)]
    y = y[np.isfinite(y)]
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    se = np.sqrt((resid ** 2).sum() / (len(x) - 2) / ((x - x.mean()) ** 2).sum())
    np.testing.assert_allclose(TB.depth_slope(r2), (slope, se, intercept), rtol=1e-10)
    assert np.isnan(TB.depth_slope(r2[:2])).all()


def test_fig3_one_panel_per_populated_cell(grid):
    fig = F.fig3_violins(grid, n_top=3)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3  # RoPE+RMSNorm, NoPE+RMSNorm, absolute PE+LayerNorm
    assert titles[0].startswith("RoPE + RMSNorm")
    assert "SmolLM2-135M (Q4_1-dequantized weights)" in titles[0]
    assert titles[1].startswith("NoPE + RMSNorm") and titles[2].startswith("absolute PE")
    assert len(fig.axes[2].get_xticks()) == 3
    assert F.top_early_heads(grid[3], 3)[0] == tuple(
        np.unravel_index(np.argmax(grid[3].r2_pooled[:2]), (2, 6)))


def test_fig4_gate_label_and_matched_peaks(grid):
    from poskernel_tl.analyses.spectral.align import spectral_alignment

    r, layer, head = F.pick_spectral_head(grid)
    assert r.spec.pe == "rope" and layer in (0, 1)
    res = spectral_alignment(r.g_trackB[0][layer, head], r.thetas, length=r.length, n_null=50)
    failed = F.fig4_spectral(r, layer, head, res, gate_met=False)
    assert "gate not met" in failed.get_suptitle()
    met = F.fig4_spectral(r, layer, head, res, gate_met=True)
    assert "gate" not in met.get_suptitle()
    spec_ax = next(ax for ax in met.axes if ax.get_xlabel() == "ω (rad/token)")
    assert spec_ax.get_xscale() == "log" and spec_ax.patches  # ±10% bands
    labels = [t.get_text() for t in spec_ax.texts]
    assert len(labels) == int(np.sum(res["matched"]))
    # without a kept Gram matrix and with a minimal spectral dict, panel (a) says why
    minimal = {"peaks": np.array([0.5]), "omega": res["omega"], "spectrum": res["spectrum"]}
    kernels = {k: v for k, v in F.head_arrays(r, layer, head).items() if "gram" not in k}
    fig = F.fig4_spectral(r, layer, head, minimal, gate_met=None, kept=kernels)
    assert any("not kept" in t.get_text() for t in fig.axes[0].texts)
    with pytest.raises(ValueError, match="saved spectrum"):
        F.fig4_spectral(r, layer, head, {"peaks": np.array([0.5])}, gate_met=None)


def test_fig_nulls_with_and_without_permutation_null(grid, tmp_path):
    r = grid[0]
    fig = FN.fig_nulls(r)
    assert any("not measured" in t.get_text() for t in fig.axes[0].texts)
    r2 = r.replace(r2_perm_null=np.full((8, *r.r2_pooled.shape), 1e-3))
    fig = FN.fig_nulls(r2, nope=grid[4].r2_pooled.ravel())
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any("perm pct 100" in t and "NoPE pct" in t for t in legend)
    png, pdf = F.save_figure(fig, tmp_path / "nulls_llama-3.2-1b")
    assert png.name == "nulls_llama-3.2-1b.png" and png.stat().st_size > 0
    assert pdf.read_bytes().startswith(b"%PDF")


# ----------------------------------------------------------------------------- nulls
@pytest.mark.parametrize("n_seqs", [1, 3])
def test_analytic_null_mean_matches_simulation(n_seqs):
    from poskernel_tl.fit.counts import lag_counts
    from poskernel_tl.fit.toeplitz import lag_sums, r2_from_sums

    T, reps = 12, 4000
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(reps, n_seqs, T, T, generator=gen, dtype=torch.float64)
    s1, sq = lag_sums(a)
    r2, _ = r2_from_sums(s1.sum(1), sq.sum(1), lag_counts(T) * n_seqs)
    expected = N.analytic_null_mean(T, n_seqs)
    N_ = n_seqs * T * (T - 1) // 2
    assert expected == pytest.approx((T - 2) / (N_ - 1))
    se = float(r2.std()) / np.sqrt(reps)
    assert abs(float(r2.mean()) - expected) < 4 * se, (float(r2.mean()), expected)
    beta = N.analytic_null(T, n_seqs)
    assert beta.mean() == pytest.approx(expected)
    assert abs(float((r2 < beta.median()).double().mean()) - 0.5) < 0.03


def test_threshold_table_places_thresholds_in_each_null(grid):
    r = grid[0].replace(r2_perm_null=np.linspace(0.0, 0.5, 8 * 36).reshape(8, 4, 9))
    table = N.threshold_table([r, grid[4]])
    mine = table[table.model == r.model]
    assert set(mine["null"]) == {"i.i.d. analytic, one sequence",
                                 "i.i.d. analytic, pooled over 6 sequences",
                                 "joint permutation, all heads",
                                 "NoPE heads, same dataset and length"}
    perm = mine[mine["null"] == "joint permutation, all heads"].set_index("threshold")
    assert perm.loc[0.40, "percentile"] == pytest.approx(80, abs=1)
    assert perm.loc[0.80, "percentile"] == 100
    heads = N.head_null_table(r)
    assert len(heads) == 36 and heads["percentile"].between(0, 100).all()


# -------------------------------------------------------------------------- verdicts
def row(**kw) -> dict:
    base = dict(model="m", dataset="wikipedia", length=256, pe="rope", norm="rmsnorm",
                centered=True, natural=True, A_early_mean=0.9, A_early_n=18, A_slope=-0.01,
                A_slope_se=0.002,
                n_bucking=0, bucking_heads="", B_centered_early=0.88, AB_diff_early=0.02,
                seq_std_early=0.05, n_early_ge_040=0, early_ge_040="",
                spec_status="computed", spec_n_analysed=10, spec_n_criterion_met=8,
                spec_n_aligned=5, spec_frac_matched_mean=0.6, spec_chance_mean=0.3)
    base.update(kw)
    return base


NAN = float("nan")
NOPE = dict(model="n", pe="none", spec_status="no PE frequencies")
RAND = dict(dataset="random", natural=False, centered=False, B_centered_early=NAN,
            AB_diff_early=NAN)
CASES = {
    "early_r2": {V.MET: [row()], V.PARTIAL: [row(A_early_mean=0.6)],
                 V.FAILED: [row(A_early_mean=0.3)], V.NA: [row(pe="learned-absolute")]},
    "falsification": {
        V.MET: [row()], V.PARTIAL: [row(A_early_mean=0.3, B_centered_early=0.5)],
        V.FAILED: [row(A_early_mean=0.3, B_centered_early=0.3)],
        V.NA: [row(A_early_mean=0.3, **RAND)]},
    "agreement": {V.MET: [row()], V.PARTIAL: [row(), row(model="m2", AB_diff_early=0.2)],
                  V.FAILED: [row(AB_diff_early=0.3)], V.NA: [row(**RAND)]},
    "depth_decay": {V.MET: [row()],
                    V.PARTIAL: [row(A_slope=-0.05), row(model="m2", A_slope=0.01)],
                    "partial (not significant)": [row(A_slope=-0.001, A_slope_se=0.002)],
                    V.FAILED: [row(A_slope=0.02)], V.NA: [row(pe="learned-absolute")]},
    "gate": {V.MET: [row()], V.PARTIAL: [row(), row(model="m2", A_early_mean=0.5)],
             V.FAILED: [row(A_early_mean=0.5)], V.NA: [row(**NOPE)]},
    "spectral": {V.MET: [row()], V.PARTIAL: [row(spec_n_criterion_met=2)],
                 V.FAILED: [row(spec_n_criterion_met=0)], V.NA: [row(A_early_mean=0.5)]},
    "nope": {V.MET: [row(), row(A_early_mean=0.1, **NOPE)],
             V.PARTIAL: [row(A_early_mean=0.1, **NOPE),
                         row(A_early_mean=0.5, **{**NOPE, "model": "n2"})],
             V.FAILED: [row(A_early_mean=0.5, **NOPE)], V.NA: [row()]},
    "random_vs_text": {
        V.MET: [row(), row(A_early_mean=0.85, **RAND)],
        V.PARTIAL: [row(), row(A_early_mean=0.85, **RAND), row(length=1024),
                    row(length=1024, A_early_mean=0.5, **RAND)],
        V.FAILED: [row(), row(A_early_mean=0.5, **RAND)], V.NA: [row()]},
    "seq_std": {V.MET: [row()], V.PARTIAL: [row(), row(model="m2", seq_std_early=0.2)],
                V.FAILED: [row(seq_std_early=0.3)], V.NA: [row(**NOPE)]},
}


def test_every_criterion_has_cases():
    assert set(CASES) == {c[0] for c in V.CRITERIA}


@pytest.mark.parametrize("cid,expected", [(c, v) for c in CASES for v in CASES[c]])
def test_verdict_logic(cid, expected):
    out = V.evaluate(pd.DataFrame(CASES[cid][expected])).set_index("id").loc[cid]
    assert out["verdict"] == expected.split(" (")[0], out.to_dict()
    if expected == V.NA:
        assert out["reason"]
    else:
        assert out["numbers"] and out["reading"]


def test_verdicts_on_results_say_why_not_computable(grid):
    v = V.verdicts(grid[:2]).set_index("id")
    assert v.loc["nope", "verdict"] == V.NA
    assert v.loc["nope", "reason"] == "no NoPE model in this folder"
    assert v.loc["random_vs_text", "verdict"] in (V.MET, V.PARTIAL, V.FAILED)
    t1 = TB.table1(TB.condition_summary(grid))
    assert list(t1.columns) == TB.TABLE1_COLUMNS and len(t1) == len(grid)
    cell = dict(zip(t1["model"], t1["spectral_alignment"]))  # no spectral results given
    assert cell == {"gpt2": "no rotary PE", "llama-3.2-1b": "not run",
                    "smollm2-135m": "not run", "tinyllama-nope-1.1b": "no PE frequencies"}


# ------------------------------------------------------------ permutation-null reducer
T_, H_, HKV_, D_ = 32, 4, 2, 8


def rope_rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """HF-style rotary (dimension i paired with i + d/2) at positions 0..T-1."""
    T, d = x.shape[1], x.shape[-1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def feed(red, q, k, device, batch=2, layer=0):
    for start in range(0, len(q), batch):
        rows = tuple(range(start, min(len(q), start + batch)))
        idx = torch.tensor(rows, device=device)
        red.update(LayerBatch(layer, q[start:rows[-1] + 1].to(device),
                              k[start:rows[-1] + 1].to(device), idx, 1 / np.sqrt(D_),
                              rows=rows))


def test_perm_null_planted_rope_head_far_above_null(device):
    gen = torch.Generator().manual_seed(3)
    theta = 10000.0 ** (-torch.arange(0, D_, 2, dtype=torch.float64) / D_)
    n = 6
    # the same content in every sequence, so one g(Δ) fits the pooled sequences exactly
    q = rope_rotate(torch.randn(1, 1, H_, D_, generator=gen, dtype=torch.float64)
                    .expand(n, T_, H_, D_), theta)
    k = rope_rotate(torch.randn(1, 1, HKV_, D_, generator=gen, dtype=torch.float64)
                    .expand(n, T_, HKV_, D_), theta)
    red = PermNullReducer(masks(T_), H_, n_perm=8, max_seqs=4, seed=0, device=device)
    feed(red, q, k, device)
    res = red.result()
    assert res.r2_null.shape == (8, 1, H_) and res.n_seqs == 4
    assert np.abs(res.r2_same_seqs - 1).max() < 1e-5
    assert res.r2_null.max() < 0.5, res.r2_null.max()
    assert (res.percentile(res.r2_same_seqs) == 100).all()
    assert np.allclose(res.p_value(res.r2_same_seqs), 1 / 9)


def test_null_percentile_and_p_value_match_a_naive_loop():
    """Mid-rank percentile (ties half) and the one-sided p-value over the finite draws,
    per cell, with ties, NaN draws, a NaN observation and a cell of NaN draws only."""
    from poskernel_tl.statistics.perm_null import null_p_value, null_percentile

    rng = np.random.default_rng(0)
    null = rng.integers(0, 5, (9, 3, 4)).astype(float)  # ties on purpose
    null[2, 0, 0] = null[5, 1, 2] = np.nan
    null[:, 2, 3] = np.nan
    obs = rng.integers(0, 5, (3, 4)).astype(float)
    obs[1, 1] = np.nan
    pct, p = null_percentile(obs, null), null_p_value(obs, null)
    for i in range(3):
        for j in range(4):
            draws = [x for x in null[:, i, j] if np.isfinite(x)]
            if not np.isfinite(obs[i, j]) or not draws:
                assert np.isnan(pct[i, j])
            else:
                mid = sum(x < obs[i, j] for x in draws) + 0.5 * sum(x == obs[i, j] for x in draws)
                assert pct[i, j] == pytest.approx(100 * mid / len(draws))
            if not np.isfinite(obs[i, j]) or not draws:  # a NaN head is not significant
                assert np.isnan(p[i, j])
            else:  # a NaN draw is no evidence: in neither count (it made p smaller)
                above = sum(x >= obs[i, j] for x in draws)
                assert p[i, j] == pytest.approx((1 + above) / (1 + len(draws)))
    assert float(null_percentile(2.0, np.array([1.0, 2.0, 3.0, np.nan]))) == 50.0


def test_perm_null_iid_noise_inside_null_and_same_seqs_fit(device):
    from poskernel_tl.reducers import TrackAReducer

    gen = torch.Generator().manual_seed(4)
    n, L = 5, 2
    q = torch.randn(n, T_, H_, D_, generator=gen, dtype=torch.float64)
    k = torch.randn(n, T_, HKV_, D_, generator=gen, dtype=torch.float64)
    red = PermNullReducer(masks(T_, L), H_, n_perm=24, max_seqs=3, seed=1, device=device)
    ref = TrackAReducer(3, masks(T_, L), H_, device)
    for layer in range(L):
        feed(red, q, k, device, layer=layer)
        feed(ref, q[:3], k[:3], device, layer=layer)
    res = red.result()
    assert res.n_seqs == 3
    # the identity draw is Track A's pooled fit of the same three sequences
    assert np.allclose(res.r2_same_seqs, ref.result().r2_pooled, atol=1e-5)
    z = (res.r2_same_seqs - res.r2_null.mean(0)) / res.r2_null.std(0)
    assert np.abs(z).max() < 4, z
    inside = (res.r2_same_seqs >= res.r2_null.min(0)) & (res.r2_same_seqs <= res.r2_null.max(0))
    assert inside.mean() >= 0.75
    assert abs(np.median(res.percentile(res.r2_same_seqs)) - 50) < 30
    # every permuted fit keeps the analytic scale of an unstructured matrix
    assert res.r2_null.mean() < 20 * N.analytic_null_mean(T_, 3)

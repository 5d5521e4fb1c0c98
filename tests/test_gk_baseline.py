"""Seed 000's positional baseline G_k and the four-term split of layer-0 scores."""

import numpy as np
import pandas as pd
import planted_gk as GP
import pytest
import torch
from matplotlib.figure import Figure
from tiny_models import SPECS, tiny_hf_model, tiny_loaded

from poskernel_tl.analyses import gk_baseline as G
from poskernel_tl.analyses.base import AnalysisInputs
from poskernel_tl.analyses.gk_baseline import split as GS
from poskernel_tl.data.sequences import build_sequences
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import lag_sums, r2_from_sums, shift_invariance_r2
from poskernel_tl.measurement.pe_kernel import (
    NoPositionTableError,
    head_projected_pe_kernel,
    head_projected_pe_kernels,
    position_ln_stats,
)
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe

T = 40
SPLIT_TOL = 1e-5


def perturbed_gpt2(tokenizer, compatibility_mode: bool) -> LoadedModel:
    """Tiny random GPT-2 with non-trivial LayerNorm affine maps and q/k biases."""
    hf = tiny_hf_model("gpt2")
    with torch.no_grad():
        for block in hf.transformer.h:
            block.ln_1.weight.uniform_(0.5, 1.5)
            block.ln_1.bias.normal_(0, 0.3)
            block.attn.c_attn.bias.normal_(0, 0.3)
    bridge = boot_bridge(hf, tokenizer, compatibility_mode=compatibility_mode)
    return LoadedModel(bridge, tokenizer, describe(hf, SPECS["gpt2"]), hf)


@pytest.fixture(scope="module")
def gpt2_models(tiny_tokenizer) -> dict[bool, LoadedModel]:
    return {cm: perturbed_gpt2(tiny_tokenizer, cm) for cm in (False, True)}


@pytest.fixture(scope="module")
def planted(tiny_tokenizer) -> LoadedModel:
    hf = GP.sinusoidal_gpt2(planted=True, seed=0)
    return LoadedModel.from_bridge(boot_bridge(hf, tiny_tokenizer), tiny_tokenizer)


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(3, 300, (6, T), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def planted_result(planted, tokens) -> G.GkBaselineResult:
    return G.gk_baseline(planted, tokens, batch_size=3, progress=False)


def layer0_scores(model: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        _, cache = model.bridge.run_with_cache(
            ids, names_filter=lambda n: n == "blocks.0.attn.hook_attn_scores")
    return cache["blocks.0.attn.hook_attn_scores"].double()


@pytest.mark.parametrize("compatibility_mode", [False, True])
def test_terms_sum_to_hooked_scores(gpt2_models, tokens, compatibility_mode):
    model = gpt2_models[compatibility_mode]
    terms = GS.split_layer0_scores(GS.block_parts(model, 0), tokens[:3])
    assert terms.shape == (len(GS.TERMS), 3, 4, T, T)
    lower = torch.ones(T, T, dtype=torch.bool).tril(-1)
    err = (terms.sum(0) - layer0_scores(model, tokens[:3]))[..., lower].abs().max().item()
    assert err < SPLIT_TOL, f"split vs hook_attn_scores: max diff {err:.2e}"
    # each term is non-trivial here (LayerNorm β and q/k biases are random)
    assert (terms[..., lower].abs().amax((1, 2, 3)) > 1e-4).all()
    # the bias terms depend on one side only
    kb, qb = terms[GS.TERMS.index("key_bias")], terms[GS.TERMS.index("query_bias")]
    assert torch.allclose(kb, kb[:, :, :1, :].expand_as(kb))
    assert torch.allclose(qb, qb[..., :1].expand_as(qb))


@pytest.mark.parametrize("compatibility_mode", [False, True])
def test_reducer_records_split_error_and_shares(gpt2_models, tokens, compatibility_mode):
    res = G.gk_baseline(gpt2_models[compatibility_mode], tokens, batch_size=4, progress=False)
    assert res.split_max_abs_err.max() < SPLIT_TOL, res.split_max_abs_err
    np.testing.assert_allclose(res.share.sum(0), 1.0, atol=1e-12)
    np.testing.assert_allclose(res.cov_share.sum(0), 1.0, atol=1e-4)
    # pooled R² of layer 0 equals shift_invariance_r2 on the hooked scores of all sequences
    A = layer0_scores(gpt2_models[compatibility_mode], tokens)
    s1, sq = lag_sums(torch.where(torch.ones(T, T, dtype=torch.bool).tril(-1), A, 0.0))
    r2, _ = r2_from_sums(s1.sum(0), sq.sum(0), lag_counts(T) * len(tokens))
    np.testing.assert_allclose(res.r2_scores[0], r2.numpy(), atol=1e-9)


def test_spe_matches_pe_kernel_and_projected_gram(gpt2_models):
    """S_PE from the bridge's weights equals pe_kernel's (unprocessed model), is the same
    with compatibility mode on, and is the trace of the head-projected G_k."""
    plain = GS.projected_pe_kernel(gpt2_models[False], T).numpy()
    ref = head_projected_pe_kernel(gpt2_models[False].hf_model, T)
    np.testing.assert_allclose(plain, ref, rtol=1e-9, atol=1e-12)
    folded = GS.projected_pe_kernel(gpt2_models[True], T).numpy()
    np.testing.assert_allclose(folded, ref, rtol=1e-6, atol=1e-9)
    for layer in (0, 1):
        for k in (1, 5, T - 1):
            pg = GS.projected_gram(gpt2_models[False], k, T, layer=layer)
            assert pg.shape == (4, 16, 16)
            trace = torch.diagonal(pg, dim1=-2, dim2=-1).sum(-1).numpy()
            np.testing.assert_allclose(trace, ref[layer, :, k - 1], rtol=1e-9, atol=1e-12)


def test_sinusoidal_table_and_model():
    pe = GP.sinusoidal_table(16, 8)
    t, i = 5, 1
    w = 10000.0 ** (-2 * i / 8)
    assert pe[t, 2 * i].item() == pytest.approx(np.sin(t * w), abs=1e-6)
    assert pe[t, 2 * i + 1].item() == pytest.approx(np.cos(t * w), abs=1e-6)
    hf = GP.sinusoidal_gpt2(n_positions=16, d_model=8, n_head=2)
    assert torch.equal(hf.transformer.wpe.weight.detach(), pe)


def test_planted_position_term_is_the_planted_kernel(planted, planted_result, tokens):
    res = planted_result
    assert res.split_max_abs_err.max() < SPLIT_TOL
    # the real pos→pos term is exactly Toeplitz with the planted kernel
    terms = GS.split_layer0_scores(GS.block_parts(planted, 0), tokens[:2])
    _, g = shift_invariance_r2(terms[GS.TERMS.index("pos_pos")])
    expect = GP.planted_pos_pos_kernel(planted.hf_model, T)
    # (the table and weights are stored in float32)
    np.testing.assert_allclose(g.numpy(), np.broadcast_to(expect, g.shape), atol=1e-6)
    np.testing.assert_allclose(res.r2_pos_pos, 1.0, atol=1e-9)
    # the cross terms vanish by construction, and so do the bias terms
    for term in ("tok_pos", "pos_tok", "key_bias", "query_bias"):
        assert res.share[GS.TERMS.index(term)].max() < 1e-12, term
    # LN(p) alone is normalised by σ_p² = 1/4, the real input by σ² = 1/2: gain 1/2
    np.testing.assert_allclose(res.pos_pos_gk_gain, 0.5, rtol=1e-4)


def test_planted_heads_r2_after_subtraction(planted_result):
    res = planted_result
    sem, pp = GS.TERMS.index("semantic"), GS.TERMS.index("pos_pos")
    # head 0 is mostly positional: Toeplitz until the position term is removed
    assert res.share[pp, 0] > 0.99
    assert res.r2_scores[0, 0] > 0.99
    assert res.r2_minus_pos_pos[0] < 0.05
    # head 1 is content only (tiny position amplitude): no shift-invariance either way
    assert res.share[sem, 1] > 0.99
    assert res.r2_scores[0, 1] < 0.05 and res.r2_minus_pos_pos[1] < 0.05
    # every head: removing the exact term leaves only chance-level Toeplitz structure
    assert (res.r2_minus_pos_pos < 0.05).all()
    # heads 0 and 2 read fast planted frequencies (head 3's are nearly constant over T)
    assert (res.r2_scores[0, [0, 2]] > res.r2_minus_pos_pos[[0, 2]] + 0.2).all()


def test_analyze_table_and_figure(planted, tokens):
    table = G.SPEC.run(AnalysisInputs(planted, None, tokens, batch_size=3, progress=False))
    assert len(table) == 2 * 4
    assert {"layer", "head", "R2_scores", "R2_minus_gk", "R2_minus_pos_pos",
            "share_pos_pos", "cov_share_semantic", "split_max_abs_err"} <= set(table.columns)
    zero = table[table.layer == 0]
    np.testing.assert_allclose(zero[[f"share_{t}" for t in GS.TERMS]].sum(1), 1.0, atol=1e-9)
    assert table.loc[table.layer == 1, "share_pos_pos"].isna().all()
    assert table["R2_scores"].notna().all() and table["spe_std"].notna().all()
    for column in ("share", "cov_share"):
        fig = G.plot_term_shares(table, column)
        assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 4 * len(GS.TERMS)


@pytest.mark.parametrize("arch", ["llama", "nope"])
def test_rotary_and_nope_models_raise(tiny_tokenizer, arch, tokens):
    model = tiny_loaded(arch, tiny_tokenizer)
    with pytest.raises(ValueError, match="no additive position table"):
        G.SPEC.run(AnalysisInputs(model, None, tokens, progress=False))
    with pytest.raises(NoPositionTableError):
        GS.block_parts(model, 0)


def test_gk_table_is_tidy(planted_result):
    table = G.gk_table(planted_result)
    assert isinstance(table, pd.DataFrame)
    assert list(table[["layer", "head"]].itertuples(index=False, name=None)) == [
        (layer, h) for layer in range(2) for h in range(4)]


# --------------------------------------------------------------------- BERT (post-LN)
@pytest.fixture(scope="module")
def bert(tiny_tokenizer) -> LoadedModel:
    """The tiny BERT with non-trivial LayerNorms, q/k biases and token-type row."""
    hf = tiny_hf_model("bert")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        ln = hf.bert.embeddings.LayerNorm
        ln.weight.copy_(0.5 + torch.rand(ln.weight.shape, generator=gen))
        ln.bias.normal_(0, 0.3, generator=gen)
        sa = hf.bert.encoder.layer[0].attention.self
        sa.query.bias.normal_(0, 0.3, generator=gen)
        sa.key.bias.normal_(0, 0.3, generator=gen)
        hf.bert.embeddings.token_type_embeddings.weight.normal_(0, 0.5, generator=gen)
    return LoadedModel(boot_bridge(hf, tiny_tokenizer), tiny_tokenizer,
                       describe(hf, SPECS["bert"]), hf)


@pytest.fixture(scope="module")
def planted_bert(tiny_tokenizer) -> LoadedModel:
    hf = GP.sinusoidal_bert(planted=True, seed=0, odd_heads=(2,))
    return LoadedModel.from_bridge(boot_bridge(hf, tiny_tokenizer), tiny_tokenizer)


def layer0_qk_scores(model: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """q·kᵀ/√d_head of layer 0 from the bridge's hook_q/hook_k (every entry)."""
    names = ("blocks.0.attn.hook_q", "blocks.0.attn.hook_k")
    with torch.no_grad():
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n in names)
    q, k = (cache[n].double() for n in names)
    return torch.einsum("bthd,bshd->bhts", q, k) / q.shape[-1] ** 0.5


def naive_two_sided_r2(A: np.ndarray) -> np.ndarray:
    """R² [head] of one g per signed lag Δ ≠ 0 over every off-diagonal entry of A
    [seq, head, T, T], by grouping entries lag by lag."""
    n, H, T, _ = A.shape
    t, s = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    out = np.zeros(H)
    for h in range(H):
        vals = A[:, h]
        off = vals[:, t != s]
        fitted = np.zeros_like(vals)
        for lag in range(-(T - 1), T):
            if lag:
                sel = (t - s) == lag
                fitted[:, sel] = vals[:, sel].mean()
        res = (vals - fitted)[:, t != s]
        out[h] = 1 - (res ** 2).sum() / ((off - off.mean()) ** 2).sum()
    return out


def test_bert_terms_sum_to_qk_scores_on_both_triangles(bert, tokens):
    terms = GS.split_layer0_scores(GS.block_parts(bert, 0), tokens[:3])
    err = (terms.sum(0) - layer0_qk_scores(bert, tokens[:3])).abs().max().item()
    assert err < SPLIT_TOL, f"split vs q·kᵀ: max diff {err:.2e}"
    assert (terms.abs().amax((1, 2, 3, 4)) > 1e-4).all()
    with pytest.raises(ValueError, match="layer 0 only"):
        GS.block_parts(bert, 1)


def test_bert_reducer_fits_both_triangles(bert, tokens):
    res = G.gk_baseline(bert, tokens, batch_size=4, progress=False)
    assert res.ln_stats == "data" and res.spe_back.shape == res.spe.shape == (2, 4, T - 1)
    assert res.split_max_abs_err.max() < SPLIT_TOL
    np.testing.assert_allclose(res.share.sum(0), 1.0, atol=1e-12)
    np.testing.assert_allclose(res.cov_share.sum(0), 1.0, atol=1e-4)
    ref = naive_two_sided_r2(layer0_qk_scores(bert, tokens).numpy())
    np.testing.assert_allclose(res.r2_scores[0], ref, atol=1e-6)  # float32 scores
    # S_PE on the data's statistics, both signs, is pe_kernel's with the measured factor
    spe = head_projected_pe_kernels(bert.hf_model, T, ln_scale=position_ln_stats(
        bert.hf_model, tokens))
    np.testing.assert_allclose(res.spe, spe[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.spe_back, spe[1], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="ln_stats"):
        G.gk_baseline(bert, tokens, progress=False, ln_stats="mean")


@pytest.mark.parametrize("ln_stats,gain", [("data", 1.0), ("own", 0.5)])
def test_bert_planted_two_sided_kernel(planted_bert, tokens, ln_stats, gain):
    """The planted BERT: the real pos→pos term is the planted kernel on both sides (odd
    for head 2), S_PE is it on the data's statistics (gain 1) and twice it on p's own
    (σ_p² = 1/4 against σ² = 1/2: gain 1/2)."""
    res = G.gk_baseline(planted_bert, tokens, batch_size=3, progress=False, ln_stats=ln_stats)
    assert res.split_max_abs_err.max() < SPLIT_TOL
    np.testing.assert_allclose(res.r2_pos_pos, 1.0, atol=1e-9)
    np.testing.assert_allclose(res.pos_pos_gk_gain, gain, rtol=1e-5)
    hf = planted_bert.hf_model
    expect = GP.planted_pos_pos_kernel(hf, T), GP.planted_pos_pos_kernel(hf, T, back=True)
    np.testing.assert_allclose(res.spe[0] * gain, expect[0], atol=1e-6)
    np.testing.assert_allclose(res.spe_back[0] * gain, expect[1], atol=1e-6)
    np.testing.assert_allclose(res.spe_back[0, 2], -res.spe[0, 2], atol=1e-6)
    for term in ("tok_pos", "pos_tok", "key_bias", "query_bias"):
        assert res.share[GS.TERMS.index(term)].max() < 1e-12, term
    assert (res.r2_minus_pos_pos < 0.05).all()
    table = G.gk_table(res)
    assert table["two_sided"].all() and (table["ln_stats"] == ln_stats).all()
    np.testing.assert_allclose(table["spe_back_lag1"], res.spe_back[..., 0].ravel())


def test_bert_projected_gram_both_signs(planted_bert, tokens):
    scale = GS.position_scale(planted_bert, tokens)
    spe, spe_back = GS.projected_pe_kernels(planted_bert, T, scale)
    for layer in (0, 1):
        for k in (1, 5, T - 1):
            for sign, ref in ((1, spe), (-1, spe_back)):
                pg = GS.projected_gram(planted_bert, sign * k, T, layer=layer, ln_scale=scale)
                trace = torch.diagonal(pg, dim1=-2, dim2=-1).sum(-1).numpy()
                np.testing.assert_allclose(trace, ref[layer, :, k - 1].numpy(), rtol=1e-9,
                                           atol=1e-12)


def test_analyze_options_reach_the_table(planted_bert, tokens):
    table = G.SPEC.run(AnalysisInputs(planted_bert, None, tokens, batch_size=3,
                                      progress=False), G.GkOptions(ln_stats="own"))
    assert (table["ln_stats"] == "own").all()
    np.testing.assert_allclose(table.loc[table.layer == 0, "pos_pos_gk_gain"], 0.5, rtol=1e-5)


@pytest.mark.minilm
def test_minilm_gk_baseline_real_weights(minilm):
    """MiniLM-L6: the split of layer 0 holds on real text, both triangles, and S_PE on the
    data's statistics tracks the real pos→pos term (gain near 1)."""
    ids = build_sequences(minilm.tokenizer, "prose", 64, 4, model_name="minilm-l6",
                          n_ctx=512)["input_ids"]
    res = G.gk_baseline(minilm, ids, batch_size=2, progress=False)
    assert res.ln_stats == "data" and res.spe_back.shape == (6, 12, 63)
    assert res.split_max_abs_err.max() < 1e-3
    np.testing.assert_allclose(res.share.sum(0), 1.0, atol=1e-9)
    np.testing.assert_allclose(res.cov_share.sum(0), 1.0, atol=1e-3)
    assert np.isfinite(res.r2_scores).all() and np.isfinite(res.gk_explained).all()
    assert np.all(np.abs(res.pos_pos_gk_gain - 1.0) < 0.2), res.pos_pos_gk_gain

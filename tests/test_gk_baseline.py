"""Seed 000's positional baseline G_k and the four-term split of layer-0 scores."""

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from tiny_models import SPECS, tiny_hf_model, tiny_loaded

from poskernel_tl.analyses import gk_baseline as G
from poskernel_tl.analyses import gk_baseline_planted as GP
from poskernel_tl.analyses.base import AnalysisInputs
from poskernel_tl.loading import LoadedModel, boot_bridge, describe
from poskernel_tl.pe_kernel import head_projected_pe_kernel

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
    terms = G.split_layer0_scores(G.block_parts(model, 0), tokens[:3])
    assert terms.shape == (len(G.TERMS), 3, 4, T, T)
    lower = torch.ones(T, T, dtype=torch.bool).tril(-1)
    err = (terms.sum(0) - layer0_scores(model, tokens[:3]))[..., lower].abs().max().item()
    assert err < SPLIT_TOL, f"split vs hook_attn_scores: max diff {err:.2e}"
    # each term is non-trivial here (LayerNorm β and q/k biases are random)
    assert (terms[..., lower].abs().amax((1, 2, 3)) > 1e-4).all()
    # the bias terms depend on one side only
    kb, qb = terms[G.TERMS.index("key_bias")], terms[G.TERMS.index("query_bias")]
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
    s1, sq = G.lag_sums(torch.where(torch.ones(T, T, dtype=torch.bool).tril(-1), A, 0.0))
    r2, _ = G.r2_from_sums(s1.sum(0), sq.sum(0), G.lag_counts(T) * len(tokens))
    np.testing.assert_allclose(res.r2_scores[0], r2.numpy(), atol=1e-9)


def test_spe_matches_pe_kernel_and_projected_gram(gpt2_models):
    """S_PE from the bridge's weights equals pe_kernel's (unprocessed model), is the same
    with compatibility mode on, and is the trace of the head-projected G_k."""
    plain = G.projected_pe_kernel(gpt2_models[False], T).numpy()
    ref = head_projected_pe_kernel(gpt2_models[False].hf_model, T)
    np.testing.assert_allclose(plain, ref, rtol=1e-9, atol=1e-12)
    folded = G.projected_pe_kernel(gpt2_models[True], T).numpy()
    np.testing.assert_allclose(folded, ref, rtol=1e-6, atol=1e-9)
    for layer in (0, 1):
        for k in (1, 5, T - 1):
            pg = G.projected_gram(gpt2_models[False], k, T, layer=layer)
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
    terms = G.split_layer0_scores(G.block_parts(planted, 0), tokens[:2])
    _, g = G.shift_invariance_r2(terms[G.TERMS.index("pos_pos")])
    expect = GP.planted_pos_pos_kernel(planted.hf_model, T)
    # (the table and weights are stored in float32)
    np.testing.assert_allclose(g.numpy(), np.broadcast_to(expect, g.shape), atol=1e-6)
    np.testing.assert_allclose(res.r2_pos_pos, 1.0, atol=1e-9)
    # the cross terms vanish by construction, and so do the bias terms
    for term in ("tok_pos", "pos_tok", "key_bias", "query_bias"):
        assert res.share[G.TERMS.index(term)].max() < 1e-12, term
    # LN(p) alone is normalised by σ_p² = 1/4, the real input by σ² = 1/2: gain 1/2
    np.testing.assert_allclose(res.pos_pos_gk_gain, 0.5, rtol=1e-4)


def test_planted_heads_r2_after_subtraction(planted_result):
    res = planted_result
    sem, pp = G.TERMS.index("semantic"), G.TERMS.index("pos_pos")
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
    np.testing.assert_allclose(zero[[f"share_{t}" for t in G.TERMS]].sum(1), 1.0, atol=1e-9)
    assert table.loc[table.layer == 1, "share_pos_pos"].isna().all()
    assert table["R2_scores"].notna().all() and table["spe_std"].notna().all()
    for column in ("share", "cov_share"):
        fig = G.plot_term_shares(table, column)
        assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 4 * len(G.TERMS)


@pytest.mark.parametrize("arch", ["llama", "nope"])
def test_rotary_and_nope_models_raise(tiny_tokenizer, arch, tokens):
    model = tiny_loaded(arch, tiny_tokenizer)
    with pytest.raises(ValueError, match="no additive position table"):
        G.SPEC.run(AnalysisInputs(model, None, tokens, progress=False))
    with pytest.raises(G.NoPositionTableError):
        G.block_parts(model, 0)


def test_gk_table_is_tidy(planted_result):
    table = G.gk_table(planted_result)
    assert isinstance(table, pd.DataFrame)
    assert list(table[["layer", "head"]].itertuples(index=False, name=None)) == [
        (layer, h) for layer in range(2) for h in range(4)]

"""Head-projected positional kernel S_PE of GPT-2 and BERT, and seed 000's positional Gram
G_k."""

import math

import numpy as np
import planted_gk as GP
import pytest
import torch
from decoder_configs import decoder_configs
from softmax_spy import softmax_inputs
from tiny_models import tiny_hf_model
from transformers import (
    AutoModelForCausalLM,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from poskernel_tl.data.sequences import build_sequences
from poskernel_tl.measurement.pe_kernel import (
    NoPositionTableError,
    PEKernel,
    head_projected_pe_kernel,
    head_projected_pe_kernels,
    layer_positions,
    pe_kernel_from_gram,
    pe_kernel_part,
    position_ln_stats,
    positional_gram,
)
from poskernel_tl.schema import SavedFiles

T = 40


@pytest.fixture(scope="module")
def gpt2() -> GPT2LMHeadModel:
    """Tiny random GPT-2 with non-trivial LayerNorm and q/k biases (the init makes them 1, 0)."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2,
                                       n_head=4)).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.ln_1.weight.uniform_(0.5, 1.5)
            block.ln_1.bias.normal_(0, 0.3)
            block.attn.c_attn.bias.normal_(0, 0.3)
    return model


def direct_s_pe(model: GPT2LMHeadModel, length: int, include_bias: bool) -> np.ndarray:
    """mean_t ⟨W_Q p̃(t), W_K p̃(t−Δ)⟩ / √d by explicit loops over the weights."""
    wpe = model.transformer.wpe.weight.detach().double()[:length]
    D, H = wpe.shape[1], model.config.n_head
    d = D // H
    out = np.zeros((len(model.transformer.h), H, length - 1))
    for layer, block in enumerate(model.transformer.h):
        ln, W = block.ln_1, block.attn.c_attn.weight.detach().double()
        b = block.attn.c_attn.bias.detach().double()
        x = (wpe - wpe.mean(-1, keepdim=True)) / torch.sqrt(wpe.var(-1, unbiased=False,
                                                                     keepdim=True) + ln.eps)
        x = x * ln.weight.detach().double() + (ln.bias.detach().double() if include_bias else 0)
        for h in range(H):
            q = x @ W[:, h * d:(h + 1) * d] + (b[h * d:(h + 1) * d] if include_bias else 0)
            k = x @ W[:, D + h * d: D + (h + 1) * d] + (
                b[D + h * d: D + (h + 1) * d] if include_bias else 0)
            for lag in range(1, length):
                vals = [float(q[t] @ k[t - lag]) for t in range(lag, length)]
                out[layer, h, lag - 1] = np.mean(vals) / math.sqrt(d)
    return out


def test_positional_gram_matches_seed_loop():
    P = np.random.default_rng(0).standard_normal((12, 5))
    for k in (0, 1, 7, 11):
        loop = sum(np.outer(P[i + k], P[i]) for i in range(12 - k)) / (12 - k)
        np.testing.assert_allclose(positional_gram(P, k), loop, atol=1e-12)
        np.testing.assert_allclose(positional_gram(torch.from_numpy(P), k).numpy(), loop,
                                   atol=1e-12)
    with pytest.raises(ValueError):
        positional_gram(P, 12)


@pytest.mark.parametrize("include_bias", [False, True])
def test_s_pe_equals_direct_computation(gpt2, include_bias):
    s_pe = head_projected_pe_kernel(gpt2, T, include_bias=include_bias)
    assert s_pe.shape == (2, 4, T - 1)
    ref = direct_s_pe(gpt2, T, include_bias)
    np.testing.assert_allclose(s_pe, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_s_pe_is_seed000_gram_projected(gpt2):
    """S_PE(Δ) = tr(W_Q,hᵀ G_Δ W_K,h)/√d with G_Δ = positional_gram(LN(wpe), Δ)."""
    s_pe = head_projected_pe_kernel(gpt2, T)
    wpe = gpt2.transformer.wpe.weight.detach().double()[:T]
    for layer, block in enumerate(gpt2.transformer.h):
        x = layer_positions(block.ln_1, wpe, include_bias=False)
        W = block.attn.c_attn.weight.detach().double()
        for h in range(4):
            W_Q, W_K = W[:, h * 8:(h + 1) * 8], W[:, 32 + h * 8: 32 + (h + 1) * 8]
            via_gram = [pe_kernel_from_gram(positional_gram(x, lag), W_Q, W_K)
                        for lag in range(1, T)]
            np.testing.assert_allclose(s_pe[layer, h], via_gram, rtol=1e-9, atol=1e-12)


def test_s_pe_matches_model_attention_on_positions_only(gpt2):
    """With token embeddings zeroed, layer 0's real q·kᵀ/√d averaged per lag is S_PE (biases
    included), which pins the head layout against Hugging Face's own split."""
    captured = {}

    def keep(module, inputs, output) -> None:
        captured["qkv"] = output.detach().double()

    hook = gpt2.transformer.h[0].attn.c_attn.register_forward_hook(keep)
    saved = gpt2.transformer.wte.weight.detach().clone()
    try:
        with torch.no_grad():
            gpt2.transformer.wte.weight.zero_()
            gpt2(torch.zeros(1, T, dtype=torch.long))
    finally:
        hook.remove()
        with torch.no_grad():
            gpt2.transformer.wte.weight.copy_(saved)
    q, k, _ = captured["qkv"][0].split(32, dim=-1)
    q, k = q.reshape(T, 4, 8).transpose(0, 1), k.reshape(T, 4, 8).transpose(0, 1)
    scores = q @ k.transpose(1, 2) / math.sqrt(8)
    lagged = np.stack([[torch.diagonal(scores[h], -lag).mean().item() for lag in range(1, T)]
                       for h in range(4)])
    s_pe = head_projected_pe_kernel(gpt2, T, include_bias=True)[0]
    np.testing.assert_allclose(s_pe, lagged, rtol=1e-5, atol=1e-5 * np.abs(lagged).max())


def test_errors_for_models_without_position_table(gpt2):
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(NoPositionTableError, match="learned position table"):
        head_projected_pe_kernel(llama, 16)
    with pytest.raises(ValueError):
        head_projected_pe_kernel(gpt2, 65)


# --------------------------------------------------------------------- BERT (post-LN)
def perturbed_bert(seed: int = 0) -> BertForMaskedLM:
    """The tiny random BERT with non-trivial LayerNorms, q/k biases and token types."""
    hf = tiny_hf_model("bert", seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=gen))
                module.bias.copy_(0.3 * torch.randn(module.bias.shape, generator=gen))
        for layer in hf.bert.encoder.layer:
            for lin in (layer.attention.self.query, layer.attention.self.key):
                lin.bias.copy_(0.3 * torch.randn(lin.bias.shape, generator=gen))
        hf.bert.embeddings.token_type_embeddings.weight.normal_(0, 0.5, generator=gen)
    return hf


@pytest.fixture(scope="module")
def bert() -> BertForMaskedLM:
    return perturbed_bert()


@pytest.fixture(scope="module")
def bert_ids() -> torch.Tensor:
    return torch.randint(3, 300, (5, T), generator=torch.Generator().manual_seed(1))


def bert_route(hf: BertForMaskedLM, layer: int) -> list[torch.nn.LayerNorm]:
    """The LayerNorms between the position table and ``layer``'s q/k, written out."""
    route = [hf.bert.embeddings.LayerNorm]
    for block in hf.bert.encoder.layer[:layer]:
        route += [block.attention.output.LayerNorm, block.output.LayerNorm]
    return route


def manual_inv_sigma(hf: BertForMaskedLM, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """1/σ of every LayerNorm's input [batch, pos] by a BERT forward written out in float64
    (embeddings with token type 0, eager attention, exact GELU)."""
    f = lambda t: t.detach().double()
    emb = hf.bert.embeddings
    T, H = ids.shape[1], hf.config.num_attention_heads
    out = {}

    def ln(module, x):
        var = x.var(-1, unbiased=False, keepdim=True)
        out[id(module)] = torch.rsqrt(var[..., 0] + module.eps)
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(var + module.eps) * f(
            module.weight) + f(module.bias)

    lin = lambda m, x: x @ f(m.weight).T + f(m.bias)
    x = ln(emb.LayerNorm, f(emb.word_embeddings.weight)[ids] + f(
        emb.position_embeddings.weight)[:T] + f(emb.token_type_embeddings.weight)[0])
    for block in hf.bert.encoder.layer:
        sa = block.attention.self
        split = lambda t: t.reshape(*t.shape[:2], H, -1).transpose(1, 2)
        q, k, v = split(lin(sa.query, x)), split(lin(sa.key, x)), split(lin(sa.value, x))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
        a = a.transpose(1, 2).reshape(x.shape)
        x = ln(block.attention.output.LayerNorm, x + lin(block.attention.output.dense, a))
        h = torch.nn.functional.gelu(lin(block.intermediate.dense, x))
        x = ln(block.output.LayerNorm, x + lin(block.output.dense, h))
    return out


def direct_s_pe_bert(hf: BertForMaskedLM, length: int, inv_sigma: dict | None,
                     include_bias: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, back, self) S_PE by explicit loops over t: p̃ along the written-out route,
    each LayerNorm on p's own statistics (``inv_sigma`` None) or times the mean over the
    sequences of the product of the real 1/σ (``inv_sigma`` from manual_inv_sigma)."""
    P = hf.bert.embeddings.position_embeddings.weight.detach().double()[:length]
    L, H = hf.config.num_hidden_layers, hf.config.num_attention_heads
    d = P.shape[1] // H
    fwd, back, diag = np.zeros((L, H, length - 1)), np.zeros((L, H, length - 1)), np.zeros((L, H))
    for layer in range(L):
        route, x = bert_route(hf, layer), P
        for ln in route:
            x = x - x.mean(-1, keepdim=True)
            if inv_sigma is None:
                x = x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)
            x = x * ln.weight.detach().double()
        if inv_sigma is not None:
            x = x * math.prod(inv_sigma[id(ln)] for ln in route).mean(0)[:length, None]
        if include_bias:
            x = x + route[-1].bias.detach().double()
        sa = hf.bert.encoder.layer[layer].attention.self
        Wq, Wk = sa.query.weight.detach().double(), sa.key.weight.detach().double()
        bq, bk = sa.query.bias.detach().double(), sa.key.bias.detach().double()
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            q = x @ Wq[cols].T + (bq[cols] if include_bias else 0)
            k = x @ Wk[cols].T + (bk[cols] if include_bias else 0)
            for lag in range(1, length):
                fwd[layer, h, lag - 1] = np.mean([float(q[t] @ k[t - lag])
                                                  for t in range(lag, length)]) / math.sqrt(d)
                back[layer, h, lag - 1] = np.mean([float(q[t] @ k[t + lag])
                                                   for t in range(length - lag)]) / math.sqrt(d)
            diag[layer, h] = np.mean([float(q[t] @ k[t]) for t in range(length)]) / math.sqrt(d)
    return fwd, back, diag


def test_position_ln_stats_match_a_written_out_forward(bert, bert_ids):
    inv = manual_inv_sigma(bert, bert_ids)
    stats = position_ln_stats(bert, bert_ids, batch_size=2)
    assert stats.shape == (2, T)
    for layer in range(2):
        ref = math.prod(inv[id(ln)] for ln in bert_route(bert, layer)).mean(0)
        np.testing.assert_allclose(stats[layer].numpy(), ref.numpy(), rtol=1e-5)


@pytest.mark.parametrize("real_stats", [False, True])
@pytest.mark.parametrize("include_bias", [False, True])
def test_bert_s_pe_both_signs_equal_direct_computation(bert, bert_ids, real_stats,
                                                       include_bias):
    scale = position_ln_stats(bert, bert_ids) if real_stats else None
    got = head_projected_pe_kernels(bert, T, include_bias, ln_scale=scale)
    ref = direct_s_pe_bert(bert, T, manual_inv_sigma(bert, bert_ids) if real_stats else None,
                           include_bias)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    np.testing.assert_array_equal(head_projected_pe_kernel(bert, T, include_bias,
                                                           ln_scale=scale), got[0])
    # a non-symmetric W_Q W_Kᵀ: the two signs differ beyond a constant (the biases' share)
    centred = [g - g.mean(-1, keepdims=True) for g in got[:2]]
    assert np.abs(centred[0] - centred[1]).max() > 0.1 * np.ptp(got[0], -1).max()


def test_bert_planted_kernel_both_signs(bert_ids):
    """Sinusoidal positions, W_Q W_Kᵀ reading sin/cos pairs: S_PE(Δ) is the planted cosine
    (sine for the odd head, so S_PE(−Δ) = −S_PE(Δ) there) with the real statistics
    (σ² = 1/2 for every token), and twice it on p's own (σ_p² = 1/4)."""
    hf = GP.sinusoidal_bert(planted=True, odd_heads=(2,))
    fwd, back, diag = head_projected_pe_kernels(hf, T, ln_scale=position_ln_stats(hf, bert_ids))
    expect, expect_back = GP.planted_pos_pos_kernel(hf, T), GP.planted_pos_pos_kernel(
        hf, T, back=True)
    tol = 1e-6 * np.abs(expect).max()
    np.testing.assert_allclose(fwd[0], expect, atol=tol)
    np.testing.assert_allclose(back[0], expect_back, atol=tol)
    np.testing.assert_allclose(back[0, 2], -fwd[0, 2], atol=tol)
    np.testing.assert_allclose(back[0, [0, 1, 3]], fwd[0, [0, 1, 3]], atol=tol)
    assert abs(diag[0, 2]) < tol and np.abs(fwd[0, 2]).max() > 0.5
    own = head_projected_pe_kernels(hf, T)
    np.testing.assert_allclose(own[0][0], 2 * expect, atol=2 * tol)
    np.testing.assert_allclose(own[1][0], 2 * expect_back, atol=2 * tol)


def test_bert_s_pe_matches_model_attention_on_positions_only(bert):
    """Word and token-type embeddings zeroed: layer 0's real q·kᵀ/√d averaged per signed
    lag is S_PE with biases, on p's own statistics and on the measured ones alike (the
    embeddings LayerNorm then sees p alone)."""
    hf = perturbed_bert()
    captured = {}
    sa = hf.bert.encoder.layer[0].attention.self
    hooks = [sa.query.register_forward_hook(lambda m, i, o: captured.update(q=o.double())),
             sa.key.register_forward_hook(lambda m, i, o: captured.update(k=o.double()))]
    with torch.no_grad():
        hf.bert.embeddings.word_embeddings.weight.zero_()
        hf.bert.embeddings.token_type_embeddings.weight.zero_()
        hf(torch.zeros(1, T, dtype=torch.long))
    for h in hooks:
        h.remove()
    q, k = (captured[n][0].reshape(T, 4, 16).transpose(0, 1) for n in "qk")
    scores = q @ k.transpose(1, 2) / 4.0
    fwd, back = (np.stack([[torch.diagonal(scores[h], sign * lag).mean().item()
                            for lag in range(1, T)] for h in range(4)]) for sign in (-1, 1))
    ids = torch.randint(0, 300, (2, T), generator=torch.Generator().manual_seed(2))
    for scale in (None, position_ln_stats(hf, ids)):
        got = head_projected_pe_kernels(hf, T, include_bias=True, ln_scale=scale)
        np.testing.assert_allclose(got[0][0], fwd, rtol=1e-5, atol=1e-5 * np.abs(fwd).max())
        np.testing.assert_allclose(got[1][0], back, rtol=1e-5, atol=1e-5 * np.abs(fwd).max())


def test_pe_kernel_part_and_its_files(gpt2, bert, bert_ids, tmp_path):
    """GPT-2: S_PE alone (own statistics, as before); BERT: both signs and Δ = 0, on the
    statistics measured on ``ids``; the optional arrays round-trip through pe_kernel.npz
    and are None when absent."""
    causal = pe_kernel_part(gpt2, T, bert_ids)
    assert causal.s_pe_back is None and causal.s_pe_self is None
    np.testing.assert_array_equal(causal.s_pe, head_projected_pe_kernel(gpt2, T))
    part = pe_kernel_part(bert, T, bert_ids)
    ref = head_projected_pe_kernels(bert, T, ln_scale=position_ln_stats(bert, bert_ids))
    for got, want in zip((part.s_pe, part.s_pe_back, part.s_pe_self), ref):
        np.testing.assert_array_equal(got, want)
    dims = {"layer": 2, "head_index": 4, "lag": T - 1}
    for name, p in (("bert", part), ("gpt2", causal)):
        folder = tmp_path / name
        folder.mkdir()
        for file, arrays in p.arrays().items():
            np.savez(folder / file, **arrays)
        loaded = PEKernel.load(SavedFiles(lambda f, folder=folder: folder / f), dict(dims))
        for f in ("s_pe", "s_pe_back", "s_pe_self"):
            want = getattr(p, f)
            assert (getattr(loaded, f) is None) if want is None else np.array_equal(
                getattr(loaded, f), want), (name, f)


@pytest.mark.minilm
@pytest.mark.slow  # the tiny BERT tests above take the same path; these are real weights
def test_minilm_real_statistics_and_both_signs(minilm):
    """MiniLM-L6 (real weights, post-LN): the measured LayerNorm factor equals the one read
    from the bridge's own LayerNorm scales (``hook_scale`` = σ of each LayerNorm's input),
    and S_PE has both signs, finite, and differs between them."""
    ids = build_sequences(minilm.tokenizer, "prose", 64, 4, model_name="minilm-l6",
                          n_ctx=512)["input_ids"]
    stats = position_ln_stats(minilm.hf_model, ids, batch_size=2)
    names = ["embed_ln.hook_scale"] + [f"blocks.{layer}.ln{i}.hook_scale"
                                       for layer in range(5) for i in (1, 2)]
    with torch.no_grad():
        _, cache = minilm.bridge.run_with_cache(ids.to(minilm.device), names_filter=names)
    inv = [1.0 / cache[n][..., 0].double().cpu() for n in names]
    for layer in range(6):
        ref = math.prod(inv[: 2 * layer + 1]).mean(0)
        np.testing.assert_allclose(stats[layer].numpy(), ref.numpy(), rtol=1e-4)
    part = pe_kernel_part(minilm.hf_model, 64, ids)
    assert part.s_pe.shape == part.s_pe_back.shape == (6, 12, 63)
    assert part.s_pe_self.shape == (6, 12)
    for a in (part.s_pe, part.s_pe_back, part.s_pe_self):
        assert np.isfinite(a).all()
    # the real statistics are not p's own: LN_emb's input holds the token too
    own = head_projected_pe_kernel(minilm.hf_model, 64)
    assert np.abs(own[0] - part.s_pe[0]).max() > 1e-3 * np.abs(own[0]).max()
    assert np.abs(part.s_pe - part.s_pe_back).max() > 1e-3 * np.abs(part.s_pe).max()


@pytest.mark.parametrize("arch", ["gpt_neo", "gpt_bigcode"])
def test_s_pe_of_other_learned_position_decoders_is_their_position_only_logits(arch):
    """GPT-Neo (separate q/k maps, scores unscaled) and GPT-BigCode (a fused nn.Linear
    with one key head shared by every query head): with token embeddings zeroed, layer 0's
    softmax input averaged per lag is S_PE (biases included)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(decoder_configs()[arch](),
                                             attn_implementation="eager").eval()
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
    A = softmax_inputs(model, torch.zeros(1, T, dtype=torch.long))[0][0][0]
    lagged = np.stack([[torch.diagonal(A[h], -lag).mean().item() for lag in range(1, T)]
                       for h in range(A.shape[0])])
    s_pe = head_projected_pe_kernel(model, T, include_bias=True)[0]
    np.testing.assert_allclose(s_pe, lagged, rtol=1e-5, atol=1e-5 * np.abs(lagged).max())

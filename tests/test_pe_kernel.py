"""Head-projected positional kernel S_PE of GPT-2 and seed 000's positional Gram G_k."""

import math

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from poskernel_tl.pe_kernel import (
    NoPositionTableError,
    head_projected_pe_kernel,
    layer_positions,
    pe_kernel_from_gram,
    positional_gram,
)

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

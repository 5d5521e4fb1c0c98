"""Planted ground truth for the G_k baseline (:mod:`poskernel_tl.analyses.gk_baseline`):
tiny GPT-2 models whose ``wpe`` is a sinusoidal table, one of them with a known layer-0
position→position term (:func:`sinusoidal_gpt2` with ``planted=True``,
:func:`planted_pos_pos_kernel`)."""

import math

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from transformers import GPT2Config, GPT2LMHeadModel


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0
                     ) -> Float[Tensor, "pos d_model"]:
    """The Transformer's table: PE[t, 2i] = sin(t·ω_i), PE[t, 2i+1] = cos(t·ω_i),
    ω_i = base^(−2i/d_model)."""
    t = torch.arange(n_positions, dtype=torch.float64)[:, None]
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(t * w), torch.cos(t * w)
    return pe.float()


def planted_frequencies(d_model: int, base: float = 10000.0) -> Float[Tensor, " freq"]:
    """ω_j = base^(−j/n) of the planted model's n = d_model/8 position frequencies."""
    n = d_model // 8
    return base ** (-torch.arange(n, dtype=torch.float64) / n)


def planted_head_frequencies(n_heads: int, d_model: int) -> list[list[int]]:
    """Which planted frequencies (indices into :func:`planted_frequencies`) head h reads."""
    n, per = d_model // 8, d_model // n_heads // 4
    return [[(h + i) % n for i in range(per)] for h in range(n_heads)]


# (content, position) amplitudes of the planted heads, cycled over heads
PLANTED_AMPLITUDES = ((0.2, 1.0), (1.0, 0.1), (1.0, 1.0), (1.0, 0.5))


def _plant_tables(model: GPT2LMHeadModel, base: float, gen: torch.Generator) -> None:
    """Token embeddings in the first half of the features (zero mean, |e|² = d_model/4),
    the planted sin/cos positions in the second half (:func:`sinusoidal_gpt2`)."""
    n_positions, d_model = model.transformer.wpe.weight.shape
    vocab_size, half = model.transformer.wte.weight.shape[0], d_model // 2
    w = planted_frequencies(d_model, base)
    t = torch.arange(n_positions, dtype=torch.float64)[:, None]
    s, c = torch.sin(t * w), torch.cos(t * w)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, half::4], pe[:, half + 1::4], pe[:, half + 2::4], pe[:, half + 3::4] = s, c, -s, -c
    e = torch.randn(vocab_size, half, generator=gen, dtype=torch.float64)
    e = e - e.mean(-1, keepdim=True)
    e = e / e.norm(dim=-1, keepdim=True) * math.sqrt(half / 2)  # |e|² = |p|² = half/2
    wte = torch.zeros(vocab_size, d_model, dtype=torch.float64)
    wte[:, :half] = e
    model.transformer.wte.weight.copy_(wte.float())
    model.transformer.wpe.weight.copy_(pe.float())


def _plant_qk(block, n_head: int, d_model: int, gen: torch.Generator) -> None:
    """Block 0: identity ln_1, no q/k bias, head h reading random content and the sin/cos
    pairs of its planted frequencies (:func:`sinusoidal_gpt2`)."""
    half, d = d_model // 2, d_model // n_head
    block.ln_1.weight.fill_(1.0)
    block.ln_1.bias.zero_()
    W = block.attn.c_attn.weight  # Conv1D [d_model, 3 d_model]
    W[:, :2 * d_model] = 0.0
    block.attn.c_attn.bias[:2 * d_model] = 0.0
    freqs = planted_head_frequencies(n_head, d_model)
    for h in range(n_head):
        amp_c, amp_p = PLANTED_AMPLITUDES[h % len(PLANTED_AMPLITUDES)]
        for off in (0, d_model):  # q columns, then k columns
            cols = slice(off + h * d, off + h * d + d // 2)
            W[:half, cols] = amp_c * torch.randn(half, d // 2, generator=gen) / math.sqrt(
                half)
            for i, j in enumerate(freqs[h]):
                col = off + h * d + d // 2 + 2 * i
                W[half + 4 * j, col] = amp_p  # the sin feature of ω_j
                W[half + 4 * j + 1, col + 1] = amp_p  # its cos feature


def sinusoidal_gpt2(*, vocab_size: int = 300, n_positions: int = 128, d_model: int = 64,
                    n_layer: int = 2, n_head: int = 4, base: float = 10000.0, seed: int = 0,
                    planted: bool = False) -> GPT2LMHeadModel:
    """A tiny random GPT-2 whose ``wpe`` is a sinusoidal table (eager attention).

    ``planted=True`` gives block 0 a known structure: token embeddings live in the first
    half of the features (zero mean, fixed norm), positions in the second half as
    [sin ω_j t, cos ω_j t, −sin ω_j t, −cos ω_j t] for the frequencies of
    :func:`planted_frequencies` (zero mean, the same norm), ln_1 is the identity affine
    map and q/k have no bias. Head h's first d_head/2 q/k dimensions read the content
    (random, amplitude c_h), the rest read the sin/cos pairs of the frequencies
    :func:`planted_head_frequencies` gives it (amplitude a_h, :data:`PLANTED_AMPLITUDES`).
    Then σ(t)² = 1/2 for every token, the cross terms vanish and the position→position
    term is exactly scale·2a_h²·Σ_j cos(ω_j Δ), Toeplitz.
    """
    if d_model % (8 * n_head) and planted:
        raise ValueError("planted=True needs d_model divisible by 8·n_head")
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=d_model,
                     n_layer=n_layer, n_head=n_head)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).eval()
    model.config.architectures = ["GPT2LMHeadModel"]
    model.config.planted_base = base
    with torch.no_grad():
        if not planted:
            model.transformer.wpe.weight.copy_(sinusoidal_table(n_positions, d_model, base))
            return model
        gen = torch.Generator().manual_seed(seed)
        _plant_tables(model, base, gen)
        _plant_qk(model.transformer.h[0], n_head, d_model, gen)
    return model


def planted_pos_pos_kernel(model: GPT2LMHeadModel, length: int
                           ) -> Float[np.ndarray, "head_index lag"]:
    """The planted model's exact layer-0 position→position term by lag Δ = 1..length−1:
    scale·a_h²/σ²·Σ_j cos(ω_j Δ), σ² = 1/2 + ε (see :func:`sinusoidal_gpt2`)."""
    cfg = model.config
    var = 0.5 + model.transformer.h[0].ln_1.eps
    w = planted_frequencies(cfg.n_embd, getattr(cfg, "planted_base", 10000.0)).numpy()
    lags = np.arange(1, length)
    scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_head)
    out = []
    for h, fs in enumerate(planted_head_frequencies(cfg.n_head, cfg.n_embd)):
        amp = PLANTED_AMPLITUDES[h % len(PLANTED_AMPLITUDES)][1]
        out.append(scale * amp ** 2 / var * np.cos(np.outer(lags, w[fs])).sum(-1))
    return np.stack(out)


__all__ = ["PLANTED_AMPLITUDES", "planted_frequencies", "planted_head_frequencies",
           "planted_pos_pos_kernel", "sinusoidal_gpt2", "sinusoidal_table"]

"""Planted ground truth for the G_k baseline (:mod:`poskernel_tl.analyses.gk_baseline`) and
S_PE (:mod:`poskernel_tl.measurement.pe_kernel`): tiny GPT-2 and BERT models whose position table is
sinusoidal, with a known layer-0 position→position term when planted
(:func:`sinusoidal_gpt2`, :func:`sinusoidal_bert` with ``planted=True``,
:func:`planted_pos_pos_kernel`; a BERT's kernel has both signs of Δ, and its odd heads
make the two differ)."""

import math

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel


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


def _planted_tables(n_positions: int, vocab_size: int, d_model: int, base: float,
                    gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(token table, position table), float32: token embeddings in the first half of the
    features (zero mean, |e|² = d_model/4), the planted sin/cos positions in the second
    half (:func:`sinusoidal_gpt2`)."""
    half = d_model // 2
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
    return wte.float(), pe.float()


def _planted_qk(n_head: int, d_model: int, gen: torch.Generator, odd_heads=()
                ) -> Float[Tensor, "d_model qk"]:
    """The planted q/k maps in ``x @ W`` layout [d_model, 2·d_model] (q columns, then k
    columns): head h reads random content (amplitude c_h) in its first d_head/2 columns
    and the sin/cos pairs of its planted frequencies (amplitude a_h) in the rest; the keys
    of ``odd_heads`` read (cos, −sin) instead of (sin, cos), so that their q·k is
    a_h²·sin(ω(t − s)) rather than a_h²·cos(ω(t − s))."""
    half, d = d_model // 2, d_model // n_head
    W = torch.zeros(d_model, 2 * d_model)
    freqs = planted_head_frequencies(n_head, d_model)
    for h in range(n_head):
        amp_c, amp_p = PLANTED_AMPLITUDES[h % len(PLANTED_AMPLITUDES)]
        for off in (0, d_model):  # q columns, then k columns
            cols = slice(off + h * d, off + h * d + d // 2)
            W[:half, cols] = amp_c * torch.randn(half, d // 2, generator=gen) / math.sqrt(
                half)
            rows = (1, 2) if off and h in odd_heads else (0, 1)  # (cos, −sin) or (sin, cos)
            for i, j in enumerate(freqs[h]):
                col = off + h * d + d // 2 + 2 * i
                W[half + 4 * j + rows[0], col] = amp_p
                W[half + 4 * j + rows[1], col + 1] = amp_p
    return W


def _plant_gpt2(model: GPT2LMHeadModel, base: float, gen: torch.Generator) -> None:
    """The planted tables, an identity ``ln_1`` and the planted q/k (no bias) in block 0."""
    cfg = model.config
    wte, wpe = _planted_tables(cfg.n_positions, cfg.vocab_size, cfg.n_embd, base, gen)
    model.transformer.wte.weight.copy_(wte)
    model.transformer.wpe.weight.copy_(wpe)
    block = model.transformer.h[0]
    block.ln_1.weight.fill_(1.0)
    block.ln_1.bias.zero_()
    block.attn.c_attn.weight[:, :2 * cfg.n_embd] = _planted_qk(cfg.n_head, cfg.n_embd, gen)
    block.attn.c_attn.bias[:2 * cfg.n_embd] = 0.0


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
        _plant_gpt2(model, base, torch.Generator().manual_seed(seed))
    return model


def _plant_bert(model: BertForMaskedLM, base: float, gen: torch.Generator,
                odd_heads) -> None:
    """The planted tables behind an identity embeddings LayerNorm (token types zero) and
    the planted q/k (no bias) in block 0 (:func:`sinusoidal_bert`)."""
    cfg, emb = model.config, model.bert.embeddings
    D = cfg.hidden_size
    wte, wpe = _planted_tables(cfg.max_position_embeddings, cfg.vocab_size, D, base, gen)
    emb.word_embeddings.weight.copy_(wte)
    emb.position_embeddings.weight.copy_(wpe)
    emb.token_type_embeddings.weight.zero_()
    emb.LayerNorm.weight.fill_(1.0)
    emb.LayerNorm.bias.zero_()
    W = _planted_qk(cfg.num_attention_heads, D, gen, odd_heads)
    attn = model.bert.encoder.layer[0].attention.self
    attn.query.weight.copy_(W[:, :D].T)
    attn.key.weight.copy_(W[:, D:].T)
    attn.query.bias.zero_()
    attn.key.bias.zero_()


def sinusoidal_bert(*, vocab_size: int = 300, n_positions: int = 128, d_model: int = 64,
                    n_layer: int = 2, n_head: int = 4, base: float = 10000.0, seed: int = 0,
                    planted: bool = False, odd_heads: tuple[int, ...] = (2,)
                    ) -> BertForMaskedLM:
    """A tiny random BERT (post-LN encoder, eager attention, no dropout) whose position
    table is sinusoidal.

    ``planted=True`` plants :func:`sinusoidal_gpt2`'s structure in the embeddings (the
    same token and position tables, token-type embeddings zero, an identity embeddings
    LayerNorm) and in block 0's query/key maps (no bias), except that the heads in
    ``odd_heads`` read their keys' position features as (cos, −sin): their layer-0
    position→position term is scale·a_h²/σ²·Σ_j sin(ω_j Δ), odd in Δ, the others'
    scale·a_h²/σ²·Σ_j cos(ω_j Δ) (:func:`planted_pos_pos_kernel`), with σ² = 1/2 + ε for
    every token.
    """
    if d_model % (8 * n_head) and planted:
        raise ValueError("planted=True needs d_model divisible by 8·n_head")
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=2 * d_model,
                     num_hidden_layers=n_layer, num_attention_heads=n_head,
                     max_position_embeddings=n_positions, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = BertForMaskedLM(cfg).eval()
    model.config.architectures = ["BertForMaskedLM"]
    model.config.planted_base = base
    model.config.planted_odd_heads = list(odd_heads) if planted else []
    with torch.no_grad():
        if not planted:
            model.bert.embeddings.position_embeddings.weight.copy_(
                sinusoidal_table(n_positions, d_model, base))
            return model
        _plant_bert(model, base, torch.Generator().manual_seed(seed), odd_heads)
    return model


def planted_pos_pos_kernel(model: GPT2LMHeadModel | BertForMaskedLM, length: int,
                           back: bool = False) -> Float[np.ndarray, "head_index lag"]:
    """The planted model's exact layer-0 position→position term by lag Δ = 1..length−1
    (``back``: Δ = −1..−(length−1)): scale·a_h²/σ²·Σ_j f_h(ω_j Δ), σ² = 1/2 + ε, f_h = cos,
    or sin for a BERT's odd heads (see :func:`sinusoidal_gpt2`, :func:`sinusoidal_bert`)."""
    cfg = model.config
    bert = cfg.model_type == "bert"
    d_model, n_head = (cfg.hidden_size, cfg.num_attention_heads) if bert else (cfg.n_embd,
                                                                              cfg.n_head)
    ln = model.bert.embeddings.LayerNorm if bert else model.transformer.h[0].ln_1
    var = 0.5 + ln.eps
    w = planted_frequencies(d_model, getattr(cfg, "planted_base", 10000.0)).numpy()
    lags = np.arange(1, length) * (-1 if back else 1)
    scale = 1.0 / math.sqrt(d_model // n_head)
    odd = getattr(cfg, "planted_odd_heads", [])
    out = []
    for h, fs in enumerate(planted_head_frequencies(n_head, d_model)):
        amp = PLANTED_AMPLITUDES[h % len(PLANTED_AMPLITUDES)][1]
        f = np.sin if h in odd else np.cos
        out.append(scale * amp ** 2 / var * f(np.outer(lags, w[fs])).sum(-1))
    return np.stack(out)


__all__ = ["PLANTED_AMPLITUDES", "planted_frequencies", "planted_head_frequencies",
           "planted_pos_pos_kernel", "sinusoidal_bert", "sinusoidal_gpt2", "sinusoidal_table"]

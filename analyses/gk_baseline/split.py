"""The weights behind seed 000's G_k baseline: one block's input LayerNorm and q/k maps,
the six-term split of layer-0 scores, and the head-projected positional kernel S_PE read
from them (:mod:`poskernel_tl.analyses.gk_baseline` explains the split and the baseline).

Two additive-position architectures. GPT-2 (pre-LN): block 0's input is
ln_1(wte[tok] + wpe[t]), and S_PE is read from the bridge's own weights, so that it also
holds under ``enable_compatibility_mode()``, which folds ln_1 into W_Q. BERT (post-LN):
layer 0's input is LN_emb(word[tok] + pos[t] + type[0]); the token-type row (every
sequence here is one segment, type 0) is a per-token embedding like the word's, so the
split counts it with the token: e(t) = word[tok] + type[0]. Its S_PE, for every layer and
both signs of Δ (bidirectional), comes from
:func:`poskernel_tl.measurement.pe_kernel.head_projected_pe_kernels` with p̃ along each
layer's LayerNorm route (the direct route; layers > 0 are the approximation that module
documents).

LayerNorm statistics (``ln_stats``): ``own`` normalises the position vector by its own
σ (GPT-2's definition so far); ``data`` uses the real per-position factor measured on the
analysed sequences (:func:`poskernel_tl.measurement.pe_kernel.position_ln_stats`); ``auto`` is
``data`` for a post-LN model and ``own`` for a pre-LN one.
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.errors import UserError
from poskernel_tl.measurement.pe_kernel import (
    NoPositionTableError,
    head_projected_pe_kernels,
    is_bidirectional,
    is_post_ln,
    lag_means,
    layer_position_vectors,
    layer_positions,
    position_ln_stats,
    positional_gram,
    qk_maps,
    unwrap,
)

TERMS = ("semantic", "tok_pos", "pos_tok", "pos_pos", "key_bias", "query_bias")
LN_STATS = ("auto", "own", "data")


@dataclass
class BlockParts:
    """One block's input LayerNorm and q/k maps plus the embedding tables (float64), as
    the bridge computes with them (with ``enable_compatibility_mode()`` the LayerNorm's
    affine map is folded into W_Q/b_Q, and the HF module's ``c_attn`` is then stale).
    ``wte`` is the per-token embedding (BERT: word + token type 0)."""

    wte: Float[Tensor, "d_vocab d_model"]
    wpe: Float[Tensor, "n_ctx d_model"]
    ln: torch.nn.Module
    W_Q: Float[Tensor, "head_index d_model d_head"]
    W_K: Float[Tensor, "head_index d_model d_head"]
    b_Q: Float[Tensor, "head_index d_head"]
    b_K: Float[Tensor, "head_index d_head"]
    scale: float

    @property
    def ln_weight(self) -> Tensor:
        return self.ln.weight.detach().to(self.W_Q)

    @property
    def ln_bias(self) -> Tensor:
        b = self.ln.bias
        return torch.zeros_like(self.ln_weight) if b is None else b.detach().to(self.W_Q)


def additive_kind(hf_model) -> str:
    """``"gpt2"`` or ``"bert"``: where the position table is added to the token
    embeddings; :class:`NoPositionTableError` (a ValueError) for any other model."""
    body = getattr(hf_model, "transformer", hf_model)
    if all(hasattr(body, n) for n in ("wte", "wpe", "h")) and hasattr(body.h[0], "ln_1"):
        return "gpt2"
    emb = getattr(getattr(hf_model, "bert", hf_model), "embeddings", None)
    if all(getattr(emb, n, None) is not None
           for n in ("word_embeddings", "position_embeddings", "LayerNorm")):
        return "bert"
    raise NoPositionTableError(
        f"{type(hf_model).__name__} has no additive position table (GPT-2's transformer.wpe "
        "or BERT's embeddings.position_embeddings added to the token embeddings): G_k and "
        "the four-term split apply to learned-absolute or sinusoidal tables, not to rotary "
        "or NoPE models")


def _bert_parts(model, device) -> BlockParts:
    """Layer 0 of a BERT, from the HF modules (the bridge runs them unchanged)."""
    hf = model.hf_model
    emb = getattr(hf, "bert", hf).embeddings
    f64 = dict(dtype=torch.float64, device=device)
    table = lambda m: unwrap(m).weight.detach().to(**f64)
    maps = qk_maps(hf, 0)
    D, H = maps.W_Q.shape[0], maps.n_heads
    heads = lambda W: W.reshape(D, H, -1).permute(1, 0, 2).to(**f64)
    bias = lambda b: (torch.zeros(maps.W_Q.shape[1], dtype=torch.float64) if b is None
                      else b).reshape(H, -1).to(**f64)
    return BlockParts(
        wte=table(emb.word_embeddings) + table(emb.token_type_embeddings)[0],
        wpe=table(emb.position_embeddings), ln=unwrap(emb.LayerNorm), W_Q=heads(maps.W_Q),
        W_K=heads(maps.W_K), b_Q=bias(maps.b_Q), b_K=bias(maps.b_K), scale=1.0 / maps.denom)


def block_parts(model, layer: int = 0, device=None) -> BlockParts:
    """The weights of ``layer`` that the split and S_PE need, read from the bridge of a
    :class:`poskernel_tl.LoadedModel` (raises :class:`NoPositionTableError`, a
    ValueError, for a model without an additive position table). A post-LN model (BERT)
    has them for layer 0 only: deeper layers do not read LN(token + position)."""
    kind = additive_kind(model.hf_model)
    device = device if device is not None else model.device
    if kind == "bert":
        if layer != 0:
            raise UserError(f"layer {layer}: a post-LN model's split exists for layer 0 only")
        return _bert_parts(model, device)
    br = model.bridge
    f64 = dict(dtype=torch.float64, device=device)
    attn = br.blocks[layer].attn
    cfg = model.hf_model.config
    d_head = attn.W_Q.shape[-1]
    scale = 1.0 / math.sqrt(d_head) if getattr(cfg, "scale_attn_weights", True) else 1.0
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        scale /= layer + 1
    get = lambda t: t.detach().to(**f64)
    return BlockParts(wte=get(br.W_E), wpe=get(br.W_pos),
                      ln=unwrap(br.blocks[layer].ln1), W_Q=get(attn.W_Q), W_K=get(attn.W_K),
                      b_Q=get(attn.b_Q), b_K=get(attn.b_K), scale=scale)


def split_layer0_scores(
    parts: BlockParts, ids: Int[Tensor, "batch pos"]
) -> Float[Tensor, "term batch head_index query_pos key_pos"]:
    """The six terms of layer 0's scores (order :data:`TERMS`) from block 0's
    :func:`block_parts`, float64, every entry (no causal mask: a causal model's fits read
    the strictly lower triangle, a bidirectional one's both)."""
    T = ids.shape[1]
    if T > parts.wpe.shape[0]:
        raise UserError(f"T={T} exceeds the position table ({parts.wpe.shape[0]} rows)")
    e = parts.wte[ids.to(parts.wte.device)]  # [b, t, D]
    p = parts.wpe[:T].expand_as(e)
    x = e + p
    inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + parts.ln.eps)  # 1/σ(t)
    e_n = (e - e.mean(-1, keepdim=True)) * inv * parts.ln_weight
    p_n = (p - p.mean(-1, keepdim=True)) * inv * parts.ln_weight
    proj = lambda v, W: torch.einsum("btm,hmd->bthd", v, W)
    q_e, q_p = proj(e_n, parts.W_Q), proj(p_n, parts.W_Q)  # [b, t, H, d]
    k_e, k_p = proj(e_n, parts.W_K), proj(p_n, parts.W_K)
    q_b = torch.einsum("m,hmd->hd", parts.ln_bias, parts.W_Q) + parts.b_Q  # [H, d]
    k_b = torch.einsum("m,hmd->hd", parts.ln_bias, parts.W_K) + parts.b_K
    qk = lambda q, k: torch.einsum("bthd,bshd->bhts", q, k)
    key_bias = torch.einsum("hd,bshd->bhs", q_b, k_e + k_p)[:, :, None, :].expand(-1, -1, T, -1)
    query_bias = torch.einsum("bthd,hd->bht", q_e + q_p + q_b, k_b)[..., None].expand(
        -1, -1, -1, T)
    terms = [qk(q_e, k_e), qk(q_e, k_p), qk(q_p, k_e), qk(q_p, k_p), key_bias, query_bias]
    return torch.stack(terms) * parts.scale


# ---------------------------------------------------------- S_PE from the weights
def position_scale(model, ids: Int[Tensor, "batch pos"], ln_stats: str = "auto",
                   batch_size: int = 8) -> Float[Tensor, "layer pos"] | None:
    """The real-statistics factor of :func:`poskernel_tl.measurement.pe_kernel.position_ln_stats` on
    ``ids`` when ``ln_stats`` asks for the data's statistics (module docstring), else None
    (own statistics)."""
    if ln_stats not in LN_STATS:
        raise UserError(f"ln_stats={ln_stats!r}: choose {', '.join(LN_STATS)}")
    data = ln_stats == "data" or (ln_stats == "auto" and is_post_ln(model.hf_model))
    return position_ln_stats(model.hf_model, ids, batch_size) if data else None


def _gpt2_positions(parts: BlockParts, length: int, scale: Tensor | None) -> Tensor:
    """p̃ = LN(p) without β: on p's own statistics, or centred, times γ and ``scale``."""
    P = parts.wpe[:length]
    if scale is None:
        return layer_positions(parts.ln, P.cpu(), include_bias=False).to(P)
    return (P - P.mean(-1, keepdim=True)) * parts.ln_weight * scale[:length, None].to(P)


def _positions(model, layer: int, length: int, ln_scale: Tensor | None
               ) -> tuple[Tensor, Tensor, Tensor, float]:
    """(P̃ [pos, d_model], W_Q, W_K [head_index, d_model, d_head], scale) of ``layer``."""
    if additive_kind(model.hf_model) == "bert":
        x = layer_position_vectors(model.hf_model, length, ln_scale=ln_scale)[layer]
        maps = qk_maps(model.hf_model, layer)
        D, H = maps.W_Q.shape[0], maps.n_heads
        heads = lambda W: W.reshape(D, H, -1).permute(1, 0, 2)
        return x, heads(maps.W_Q), heads(maps.W_K), 1.0 / maps.denom
    parts = block_parts(model, layer)
    if length > parts.wpe.shape[0]:
        raise UserError(f"T={length} exceeds the position table ({parts.wpe.shape[0]})")
    x = _gpt2_positions(parts, length, None if ln_scale is None else ln_scale[layer])
    return x, parts.W_Q, parts.W_K, parts.scale


def projected_gram(model, k: int, length: int, layer: int = 0,
                   ln_scale: Float[Tensor, "layer pos"] | None = None
                   ) -> Float[Tensor, "head_index d_head d_head"]:
    """Seed 000's G_k projected per head: W_Q,hᵀ G̃_k W_K,h · scale, with
    G̃_k = positional_gram(P̃_layer[:length], k) for k ≥ 0 and G̃_|k|ᵀ for k < 0 (a key
    |k| after the query; float64). Its trace is S_PE(k) (:func:`projected_pe_kernels`)."""
    x, W_Q, W_K, scale = _positions(model, layer, length, ln_scale)
    G = positional_gram(x, abs(k))
    G = G if k >= 0 else G.T
    return W_Q.transpose(1, 2) @ G.to(W_Q) @ W_K * scale


def projected_pe_kernels(model, length: int,
                         ln_scale: Float[Tensor, "layer pos"] | None = None
                         ) -> tuple[Float[Tensor, "layer head_index lag"],
                                    Float[Tensor, "layer head_index lag"] | None]:
    """(S_PE(Δ), S_PE(−Δ)) for Δ = 1..length−1: the lag means of the position-only logits
    scale·q_p(t)·k_p(s) (the traces of :func:`projected_gram`); the second is None for a
    causal model. GPT-2's are read from the bridge's weights, so they hold with or without
    compatibility mode (equal to :func:`poskernel_tl.measurement.pe_kernel.head_projected_pe_kernel`
    on an unprocessed model); BERT's are pe_kernel's."""
    hf = model.hf_model
    if additive_kind(hf) == "bert":
        fwd, back, _ = head_projected_pe_kernels(hf, length, ln_scale=ln_scale)
        return torch.from_numpy(fwd), torch.from_numpy(back) if is_bidirectional(hf) else None
    out = []
    for layer in range(model.bridge.cfg.n_layers):
        x, W_Q, W_K, scale = _positions(model, layer, length, ln_scale)
        q, k = torch.einsum("tm,hmd->htd", x, W_Q), torch.einsum("tm,hmd->htd", x, W_K)
        out.append(lag_means(q, k, scale)[0])
    return torch.stack(out), None


def projected_pe_kernel(model, length: int) -> Float[Tensor, "layer head_index lag"]:
    """S_PE[layer, head, Δ−1] (Δ = 1..length−1) on the positions' own statistics: the
    first of :func:`projected_pe_kernels`."""
    return projected_pe_kernels(model, length)[0]


__all__ = ["LN_STATS", "TERMS", "BlockParts", "additive_kind", "block_parts",
           "position_scale", "projected_gram", "projected_pe_kernel", "projected_pe_kernels",
           "split_layer0_scores"]

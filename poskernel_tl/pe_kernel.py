"""The head-projected positional kernel of learned-absolute-PE models (GPT-2).

Seed 000's average positional contribution at distance k is

    G_k = mean_i P(i+k) P(i)ᵀ          (i = 0 .. n−1−k)            [positional_gram]

and the position-position term of head h's logit between query t and key t−Δ is
p̃(t)ᵀ W_Q,h W_K,hᵀ p̃(t−Δ) / √d_head, with p̃(t) the position vector after the block's input
LayerNorm. Its average over query positions is the head-projected kernel

    S_PE(Δ) = mean_t ⟨W_Q,hᵀ p̃(t), W_K,hᵀ p̃(t−Δ)⟩ / √d_head
            = tr(W_Q,hᵀ G̃_Δ W_K,h) / √d_head = ⟨G̃_Δ, W_Q,h W_K,hᵀ⟩_F / √d_head,

where G̃_Δ = positional_gram(P̃, Δ) [pe_kernel_from_gram]. Forming G̃_Δ for every lag costs
T·d_model² per lag, so :func:`head_projected_pe_kernel` evaluates the same quantity as a
cross-correlation of the projected vectors with one FFT per layer (tests check it against
the gram identity and against a direct loop over t).

By default the kernel is the pure position-position term: the LayerNorm shift β and the
q/k biases are left out (under TransformerLens' LN folding β becomes part of b_Q, b_K, so
"no biases" means neither); ``include_bias=True`` keeps both.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.errors import UserError
from poskernel_tl.schema import Part, stored


@dataclass
class PEKernel(Part):
    """S_PE(Δ) of every head, for learned-absolute-position models."""

    NAME = "pe_kernel"
    s_pe: Float[np.ndarray, "layer head_index lag"] = stored("pe_kernel.npz", "s_pe",
                                                             finite=True)


class NoPositionTableError(UserError):
    """The model has no learned absolute position table (e.g. a rotary or NoPE model)."""


def positional_gram(
    P: Float[Tensor, "pos d_model"] | Float[np.ndarray, "pos d_model"], k: int
) -> Float[Tensor, "d_model d_model"] | Float[np.ndarray, "d_model d_model"]:
    """Seed 000's G_k = mean_i P(i+k) P(i)ᵀ over i = 0..n−1−k (row index = P(i+k) feature)."""
    n = P.shape[0]
    if not 0 <= k < n:
        raise UserError(f"lag k={k} must lie in [0, {n - 1}] for {n} positions")
    return P[k:].T @ P[: n - k] / (n - k)


def pe_kernel_from_gram(
    G: Float[Tensor, "d_model d_model"],
    W_Q: Float[Tensor, "d_model d_head"],
    W_K: Float[Tensor, "d_model d_head"],
) -> float:
    """S_PE(Δ) = tr(W_Qᵀ G_Δ W_K) / √d_head for G_Δ = positional_gram(P̃, Δ) (Conv1D layout:
    q = p̃ @ W_Q)."""
    return float(torch.trace(W_Q.T @ G @ W_K)) / math.sqrt(W_Q.shape[1])


def _blocks(hf_model):
    body = getattr(hf_model, "transformer", hf_model)
    wpe = getattr(body, "wpe", None)
    if wpe is None or not hasattr(body, "h"):
        raise NoPositionTableError(
            f"{type(hf_model).__name__} has no learned position table (transformer.wpe); "
            "S_PE is defined only for learned-absolute-PE models such as GPT-2"
        )
    return body, unwrap(wpe)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The HF module behind a TransformerBridge component (booting a bridge replaces the
    HF model's submodules with wrappers that keep the original)."""
    return getattr(module, "original_component", None) or module


def layer_positions(ln: torch.nn.Module, P: Tensor, include_bias: bool) -> Tensor:
    """p̃ = LN(p) in float64 on the CPU, with (``include_bias``) or without the shift β."""
    ln = unwrap(ln)
    x = P - P.mean(-1, keepdim=True)
    x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + ln.eps)
    x = x * ln.weight.detach().double().cpu()
    if include_bias and ln.bias is not None:
        x = x + ln.bias.detach().double().cpu()
    return x


def head_qk(attn, x: Tensor, n_heads: int, include_bias: bool) -> tuple[Tensor, Tensor]:
    """Per-head query/key vectors [head_index, pos, d_head] from a GPT-2 Conv1D c_attn."""
    c_attn = unwrap(attn.c_attn)
    W = c_attn.weight.detach().double().cpu()  # [d_model, 3 d_model]
    D = W.shape[0]
    q, k = x @ W[:, :D], x @ W[:, D: 2 * D]
    if include_bias and c_attn.bias is not None:
        b = c_attn.bias.detach().double().cpu()
        q, k = q + b[:D], k + b[D: 2 * D]
    T = x.shape[0]
    return (q.reshape(T, n_heads, -1).transpose(0, 1), k.reshape(T, n_heads, -1).transpose(0, 1))


def head_projected_pe_kernel(hf_model, T: int, include_bias: bool = False) -> np.ndarray:
    """S_PE[layer, head, Δ−1] for Δ = 1..T−1 (float64), for a GPT-2-style HF model.

    p(t) = wpe[t]; layer ℓ uses its own ``ln_1`` and ``attn.c_attn`` q/k columns (heads are
    contiguous blocks of d_head); scaled by 1/√d_head (and 1/(ℓ+1) when the config sets
    ``scale_attn_by_inverse_layer_idx``), as in the model's own attention scores. Computed
    in float64 on the CPU, whatever device the model is on.
    """
    body, wpe = _blocks(hf_model)
    cfg = hf_model.config
    if T < 2 or T > wpe.weight.shape[0]:
        raise UserError(f"T={T} must lie in [2, {wpe.weight.shape[0]}] (the position table)")
    n_heads = cfg.n_head
    P = wpe.weight.detach()[:T].double().cpu()
    counts = torch.arange(T - 1, 0, -1, dtype=torch.float64)  # T−Δ pairs for Δ = 1..T−1
    out = []
    with torch.no_grad():
        for layer, block in enumerate(body.h):
            x = layer_positions(block.ln_1, P, include_bias)
            q, k = head_qk(block.attn, x, n_heads, include_bias)  # [H, T, d]
            # Σ_t q(t)·k(t−Δ) = irfft(Q · conj(K))[Δ] (padding 2T: no circular wrap)
            qf = torch.fft.rfft(q, n=2 * T, dim=1)
            kf = torch.fft.rfft(k, n=2 * T, dim=1)
            xc = torch.fft.irfft(qf * kf.conj(), n=2 * T, dim=1).sum(-1)[:, 1:T]
            scale = math.sqrt(q.shape[-1]) if getattr(cfg, "scale_attn_weights", True) else 1.0
            if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
                scale *= layer + 1
            out.append(xc / counts / scale)
    return torch.stack(out).numpy()

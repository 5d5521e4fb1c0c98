"""The kernels of kernel patching (:mod:`poskernel_tl.analyses.kernel_patching`): the
shift-invariant part g(t − s) of score matrices on the causal triangle (the Track A fit,
with the diagonal fitted or kept and the first key columns optionally left out) and the
pooled kernels of ``mode="pooled"``."""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def causal_masks(T: int, device=None) -> tuple[Bool[Tensor, "query_pos key_pos"],
                                              Bool[Tensor, "query_pos key_pos"]]:
    """(s ≤ t, s < t): the causal triangle with and without its diagonal."""
    full = torch.ones(T, T, dtype=torch.bool, device=device)
    return full.tril(), full.tril(-1)


def lag_index(T: int, device=None) -> Int[Tensor, "query_pos key_pos"]:
    """Δ = t − s on the causal triangle, 0 above it."""
    pos = torch.arange(T, device=device)
    return (pos[:, None] - pos[None]).clamp(min=0)


def kernel_from_g(g: Float[Tensor, "*batch lag0"]) -> Float[Tensor, "*batch query_pos key_pos"]:
    """The Toeplitz matrix K(t, s) = g(t − s) from g over Δ = 0..T−1 (K[t, s] = g(0)
    above the diagonal: mask it)."""
    T = g.shape[-1]
    return g[..., lag_index(T, g.device)]


def replace_mask(T: int, diagonal: str = "fit", keep_keys: int = 0,
                 device=None) -> Bool[Tensor, "query_pos key_pos"]:
    """The entries a patch replaces: s ≤ t (s < t with ``diagonal="keep"``) and s ≥
    ``keep_keys``."""
    lower, strict = causal_masks(T, device)
    mask = lower if diagonal == "fit" else strict
    return mask & (torch.arange(T, device=device) >= keep_keys)[None]


def shift_invariant_part(
    scores: Float[Tensor, "*batch query_pos key_pos"], diagonal: str = "fit",
    keep_keys: int = 0,
) -> Float[Tensor, "*batch query_pos key_pos"]:
    """Each matrix's shift-invariant part on the causal triangle: A(t, s), s < t, replaced
    by the mean of its sub-diagonal g(t − s) (the Track A fit, float64 sums); the diagonal
    by its mean (``diagonal="fit"``) or kept (``"keep"``); the first ``keep_keys`` key
    columns kept and left out of the fit; entries above the diagonal keep their values
    (masked fills included)."""
    T = scores.shape[-1]
    fit = replace_mask(T, "fit", keep_keys, scores.device)
    z = torch.where(fit, scores.double(), 0.0).flatten(-2)
    idx = lag_index(T, scores.device).flatten().expand_as(z)
    sums = torch.zeros(*z.shape[:-1], T, dtype=torch.float64, device=scores.device)
    counts = (T - keep_keys - torch.arange(T, dtype=torch.float64, device=scores.device))
    g = sums.scatter_add_(-1, idx, z) / counts.clamp(min=1)
    keep = replace_mask(T, diagonal, keep_keys, scores.device)
    return torch.where(keep, kernel_from_g(g).to(scores.dtype), scores)


def pooled_kernels(g_pooled: Float[Tensor, "layer head_index lag"] | None,
                   mean_scores: Float[Tensor, "layer head_index query_pos key_pos"],
                   keep_keys: int = 0) -> Float[Tensor, "layer head_index query_pos key_pos"]:
    """K(t, s) = g_pooled(t − s) for Δ ≥ 1 and, for Δ = 0, the mean of the diagonal of the
    mean scores (the pooled diagonal mean over the evaluation sequences). Without
    ``g_pooled`` (or with ``keep_keys``) g is fitted to the mean scores themselves."""
    if g_pooled is None or keep_keys:
        return shift_invariant_part(mean_scores, "fit", keep_keys)
    g0 = torch.diagonal(mean_scores, dim1=-2, dim2=-1).double().mean(-1, keepdim=True)
    g = torch.cat([g0, g_pooled.to(g0)], dim=-1)
    return kernel_from_g(g).float()


__all__ = ["causal_masks", "kernel_from_g", "lag_index", "pooled_kernels", "replace_mask",
           "shift_invariant_part"]

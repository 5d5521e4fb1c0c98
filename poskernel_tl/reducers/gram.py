"""Track B, second pass: the averaged Gram matrix over the evaluation set (Phase 4).

It accumulates Σ_x A_x (A = q·kᵀ·scale, the matrices Track A forms anyway, summed over
the batch and added to a float64 total), Σ_x q and Σ_x k.
With centering means μ fixed in advance, the centered Gram needs no second product:

    mean_x q̃(t)·k̃(s) = mean_x q(t)·k(s) − μ_q(t)·k̄(s) − q̄(t)·μ_k(s) + μ_q(t)·μ_k(s),

with q̄, k̄ the evaluation means. The fit of g(Δ) is the Track A fit applied to Ḡ.
"""

import einops
import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.reducers.base import LayerBatch, Reducer
from poskernel_tl.toeplitz import shift_invariance_r2


class GramReducer(Reducer):
    name = "gram"

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, length: int,
                 d_head: int, scale: float, device: torch.device | str = "cpu"):
        f64 = dict(dtype=torch.float64, device=device)
        self.scale = scale
        self.group = n_heads // n_kv_heads
        self.gram_sum = torch.zeros(n_layers, n_heads, length, length, **f64)
        self.q_sum = torch.zeros(n_layers, n_heads, length, d_head, **f64)
        self.k_sum = torch.zeros(n_layers, n_kv_heads, length, d_head, **f64)
        self.count = torch.zeros(n_layers, **f64)

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        self.gram_sum[L] += batch.scores.sum(0)  # ≤ batch terms in float32, then float64
        self.q_sum[L] += batch.q.sum(0, dtype=torch.float64).permute(1, 0, 2)
        self.k_sum[L] += batch.k.sum(0, dtype=torch.float64).permute(1, 0, 2)
        self.count[L] += batch.q.shape[0]

    def _heads(self, k: Float[Tensor, "kv_head_index pos d_head"]
               ) -> Float[Tensor, "head_index pos d_head"]:
        return k.repeat_interleave(self.group, dim=0)

    def centered(self, layer: int, mean_q: Tensor, mean_k: Tensor
                 ) -> Float[Tensor, "head_index query_pos key_pos"]:
        """Ḡ of ``layer`` after subtracting the per-position means ``mean_q``/``mean_k``."""
        n = self.count[layer]
        q_bar = self.q_sum[layer] / n
        k_bar = self._heads(self.k_sum[layer] / n)
        mu_q, mu_k = mean_q.to(q_bar), self._heads(mean_k.to(k_bar))
        outer = lambda a, b: einops.einsum(a, b, "h t d, h s d -> h t s")
        correction = outer(mu_q, k_bar) + outer(q_bar, mu_k) - outer(mu_q, mu_k)
        return self.raw(layer) - self.scale * correction

    def raw(self, layer: int) -> Float[Tensor, "head_index query_pos key_pos"]:
        return self.gram_sum[layer] / self.count[layer]

    def result(self, centering: dict | None = None, keep_matrices: bool = False) -> dict:
        """R²/g for the raw Gram and, given the centering reducer's result, for the
        centered Gram (all centering sequences, and the first half only)."""
        n_layers = self.gram_sum.shape[0]
        out: dict = {"R2_gram_raw": [], "g_gram_raw": []}
        if centering is not None:
            out.update(R2_gram=[], g_gram=[], R2_gram_half=[])
        mats: dict = {"gram_raw": [], "gram_centered": []}
        for L in range(n_layers):
            raw = self.raw(L)
            r2, g = shift_invariance_r2(raw)
            out["R2_gram_raw"].append(r2)
            out["g_gram_raw"].append(g)
            if keep_matrices:
                mats["gram_raw"].append(raw.float().cpu())
            if centering is None:
                continue
            cen = self.centered(L, centering["mean_q"][L], centering["mean_k"][L])
            r2c, gc = shift_invariance_r2(cen)
            out["R2_gram"].append(r2c)
            out["g_gram"].append(gc)
            half = self.centered(L, centering["mean_q_half"][L], centering["mean_k_half"][L])
            out["R2_gram_half"].append(shift_invariance_r2(half)[0])
            if keep_matrices:
                mats["gram_centered"].append(cen.float().cpu())
        res = {k: torch.stack(v).cpu().numpy() for k, v in out.items()}
        for k in ("g_gram_raw", "g_gram"):
            if k in res:
                res[k] = res[k].astype(np.float32)
        if keep_matrices:
            res.update({k: torch.stack(v) for k, v in mats.items() if v})
        return res

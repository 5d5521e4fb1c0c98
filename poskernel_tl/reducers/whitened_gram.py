"""Track B diagnostic: the averaged Gram of centered *and whitened* queries and keys.

q̃ = (q − μ_q) W_q, k̃ = (k − μ_k) W_k with W = C^(-1/2) of the centering set's
covariance (:meth:`Moments.whitening`). The seed asks for it as an optional check: if
whitening changes R²_gram substantially, say so. It costs one more q·kᵀ per head, so it
runs only when asked for (``poskernel run --whiten``). For a bidirectional model
(``causal=False``) the fit reads both triangles, like Track B's.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.moments import Moments
from poskernel_tl.schema import Part, column
from poskernel_tl.toeplitz import shift_invariance_r2, shift_invariance_r2_two_sided


@dataclass
class WhitenedGramResult(Part):
    NAME = "whitened"
    r2_gram_whitened: Float[np.ndarray, "layer head_index"] = column("trackB",
                                                                      "R2_gram_whitened")


class WhitenedGramReducer:
    def __init__(self, centering: Moments, scale: float, causal: bool = True):
        white_q, white_k = centering.whitening()
        self.mean_q, self.mean_k = centering.mean_q.float(), centering.mean_k.float()
        self.white_q, self.white_k = white_q.float(), white_k.float()  # [L, H(kv), d, d]
        self.scale, self.causal = scale, causal
        L, H, T, _ = self.mean_q.shape
        self.gram_sum = torch.zeros(L, H, T, T, dtype=torch.float64, device=self.mean_q.device)
        self.count = [0] * L

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        q = batch.q.float().permute(0, 2, 1, 3) - self.mean_q[L]  # [b, H, T, d]
        k = batch.k.float().permute(0, 2, 1, 3) - self.mean_k[L]
        q = q @ self.white_q[L]
        k = (k @ self.white_k[L]).repeat_interleave(batch.group, dim=1)
        self.gram_sum[L] += (q @ k.transpose(-1, -2) * self.scale).sum(0, dtype=torch.float64)
        self.count[L] += q.shape[0]

    def result(self) -> WhitenedGramResult:
        fit = shift_invariance_r2 if self.causal else shift_invariance_r2_two_sided
        r2 = [fit(self.gram_sum[L] / self.count[L])[0] for L in range(self.gram_sum.shape[0])]
        return WhitenedGramResult(torch.stack(r2).cpu().numpy())

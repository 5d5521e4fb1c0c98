"""Track B diagnostic: the averaged Gram of centered *and whitened* queries and keys.

q̃ = (q − μ_q) W_q, k̃ = (k − μ_k) W_k with W = C^(-1/2) of the centering set's
covariance (:meth:`CenteringReducer.whitening`). The seed asks for it as an optional
check: if whitening changes R²_gram substantially, say so. It costs one more q·kᵀ per
head, so it runs only when asked for (``poskernel run --whiten``).
"""

import torch

from poskernel_tl.reducers.base import LayerBatch, Reducer
from poskernel_tl.toeplitz import shift_invariance_r2


class WhitenedGramReducer(Reducer):
    name = "whitened_gram"

    def __init__(self, mean_q: torch.Tensor, mean_k: torch.Tensor, white_q: torch.Tensor,
                 white_k: torch.Tensor, scale: float):
        self.mean_q, self.mean_k = mean_q.float(), mean_k.float()  # [L, H(kv), T, d]
        self.white_q, self.white_k = white_q.float(), white_k.float()  # [L, H(kv), d, d]
        self.scale = scale
        L, H, T, _ = mean_q.shape
        self.gram_sum = torch.zeros(L, H, T, T, dtype=torch.float64, device=mean_q.device)
        self.count = torch.zeros(L, dtype=torch.float64, device=mean_q.device)

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        q = batch.q.float().permute(0, 2, 1, 3) - self.mean_q[L]  # [b, H, T, d]
        k = batch.k.float().permute(0, 2, 1, 3) - self.mean_k[L]
        q = q @ self.white_q[L]
        k = (k @ self.white_k[L]).repeat_interleave(batch.group, dim=1)
        self.gram_sum[L] += (q @ k.transpose(-1, -2) * self.scale).sum(0, dtype=torch.float64)
        self.count[L] += q.shape[0]

    def result(self) -> dict:
        r2 = [shift_invariance_r2(self.gram_sum[L] / self.count[L])[0]
              for L in range(self.gram_sum.shape[0])]
        return {"R2_gram_whitened": torch.stack(r2).cpu().numpy()}

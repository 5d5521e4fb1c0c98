"""Track B, first pass: per-position means of q and k over the centering set.

The means μ_q[layer, head, pos, d_head] and μ_k[layer, kv_head, pos, d_head] are what
Track B subtracts; means over only the first half of the centering set are kept too,
for the seed's 50-vs-100 stability check. The second moments Σ q qᵀ (pooled over
positions) give the covariance of the centered vectors, from which the optional
whitening diagnostic builds C^(-1/2).
"""

import torch

from poskernel_tl.reducers.base import LayerBatch, Reducer


class CenteringReducer(Reducer):
    name = "centering"

    def __init__(self, n_seqs: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 length: int, d_head: int, device: torch.device | str = "cpu",
                 second_moments: bool = False):
        f64 = dict(dtype=torch.float64, device=device)
        self.half = n_seqs // 2
        self.q_sum = torch.zeros(n_layers, n_heads, length, d_head, **f64)
        self.k_sum = torch.zeros(n_layers, n_kv_heads, length, d_head, **f64)
        self.q_half = torch.zeros_like(self.q_sum)
        self.k_half = torch.zeros_like(self.k_sum)
        self.second_moments = second_moments  # only the whitening diagnostic needs them
        self.qq_sum = torch.zeros(n_layers, n_heads, d_head, d_head, **f64)
        self.kk_sum = torch.zeros(n_layers, n_kv_heads, d_head, d_head, **f64)
        self.count = torch.zeros(n_layers, **f64)
        self.count_half = torch.zeros(n_layers, **f64)

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        q = batch.q.double().permute(0, 2, 1, 3)  # [batch, head, pos, d]
        k = batch.k.double().permute(0, 2, 1, 3)
        first = batch.index < self.half
        self.q_sum[L] += q.sum(0)
        self.k_sum[L] += k.sum(0)
        self.q_half[L] += q[first].sum(0)
        self.k_half[L] += k[first].sum(0)
        if self.second_moments:
            self.qq_sum[L] += torch.einsum("bhtd,bhte->hde", q, q)
            self.kk_sum[L] += torch.einsum("bhtd,bhte->hde", k, k)
        self.count[L] += q.shape[0]
        self.count_half[L] += first.sum()

    def whitening(self, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
        """C^(-1/2) of the centered q and k, per (layer, head): C = E[q qᵀ] − mean_t μ_t μ_tᵀ
        over centering tokens; eigenvalues below eps·max are floored."""
        if not self.second_moments:
            raise ValueError("build the CenteringReducer with second_moments=True to whiten")
        out = []
        for second, total in ((self.qq_sum, self.q_sum), (self.kk_sum, self.k_sum)):
            n = self.count[:, None, None, None]
            T = total.shape[2]
            mu = total / n  # [L, H, T, d]
            cov = second / (n * T) - torch.einsum("lhtd,lhte->lhde", mu, mu) / T
            vals, vecs = torch.linalg.eigh(cov)
            vals = torch.clamp(vals, min=eps * vals.amax(-1, keepdim=True))
            out.append(vecs @ torch.diag_embed(vals.rsqrt()) @ vecs.transpose(-1, -2))
        return out[0], out[1]

    def result(self) -> dict:
        n = self.count[:, None, None, None]
        n_half = self.count_half[:, None, None, None]
        return {
            "mean_q": self.q_sum / n,
            "mean_k": self.k_sum / n,
            "mean_q_half": self.q_half / n_half,
            "mean_k_half": self.k_half / n_half,
            "n_centering": int(self.count[0]),
            "n_centering_half": int(self.count_half[0]),
        }

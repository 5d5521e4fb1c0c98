"""Per-position sums of q and k: the centering means of Track B (first pass) and the
evaluation means the Gram reducer needs (second pass) come from this one reducer.

Besides the means over all sequences it keeps the means over a seeded random half of
them (the seed's 50-vs-100 stability check of the centering means; a random half, so
that corpus order does not decide which half) and, on request, the second moments
Σ q qᵀ pooled over positions, from which the whitening diagnostic builds C^(-1/2).
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, SavedFiles, column, stored


@dataclass
class Moments:
    """Per-position means on the model's device. The centering means are float32 (summed
    in float64, rounded once: the values the condition saves), Track B's evaluation means
    (:meth:`GramReducer.eval_moments`) float64, the second moments float64."""

    mean_q: Float[Tensor, "layer head_index pos d_head"]
    mean_k: Float[Tensor, "layer kv_head_index pos d_head"]
    mean_q_half: Float[Tensor, "layer head_index pos d_head"] | None
    mean_k_half: Float[Tensor, "layer kv_head_index pos d_head"] | None
    n: int
    n_half: int
    cov_q: Float[Tensor, "layer head_index d_head d_head"] | None = None
    cov_k: Float[Tensor, "layer kv_head_index d_head d_head"] | None = None

    def whitening(self, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
        """C^(-1/2) of the centered q and k per (layer, head); eigenvalues below eps·max
        are floored."""
        if self.cov_q is None or self.cov_k is None:
            raise ValueError("build the MomentsReducer with second_moments=True to whiten")
        out = []
        for cov in (self.cov_q, self.cov_k):
            vals, vecs = torch.linalg.eigh(cov)
            vals = torch.clamp(vals, min=eps * vals.amax(-1, keepdim=True))
            out.append(vecs @ torch.diag_embed(vals.rsqrt()) @ vecs.transpose(-1, -2))
        return out[0], out[1]


@dataclass
class CenteringMeans(Part):
    """The centering means a condition saves (float32 on the host): Track B's reference,
    and its random half for the stability check. Absent (None) without centering."""

    NAME = "centering"
    mean_q: Float[np.ndarray, "layer head_index pos d_head"] | None = stored(
        "centering_means.pt", "mean_q", finite=True, default=None)
    mean_k: Float[np.ndarray, "layer kv_head_index pos d_head"] | None = stored(
        "centering_means.pt", "mean_k", finite=True, default=None)
    mean_q_half: Float[np.ndarray, "layer head_index pos d_head"] | None = stored(
        "centering_means.pt", "mean_q_half", finite=True, default=None)
    mean_k_half: Float[np.ndarray, "layer kv_head_index pos d_head"] | None = stored(
        "centering_means.pt", "mean_k_half", finite=True, default=None)
    n_centering: int = column("trackB", "n_centering", default=0)
    n_centering_half: int = column("trackB", "n_centering_half", default=0)

    @classmethod
    def from_moments(cls, m: Moments | None) -> "CenteringMeans":
        if m is None:
            return cls()
        f32 = lambda t: None if t is None else t.float().cpu().numpy()
        return cls(f32(m.mean_q), f32(m.mean_k), f32(m.mean_q_half), f32(m.mean_k_half),
                   m.n, m.n_half)

    @classmethod
    def present(cls, saved: SavedFiles) -> bool:
        return True  # its counts are columns of every Track B table


def means_in_place(count: list[int], *sums: Tensor, who: str) -> Tensor:
    """Divide per-layer sums [layer, ...] by each layer's count in place, so that the sums
    become the means with no second copy; the counts (float64). ``who`` names the reducer
    in the error raised when a layer saw no sequences."""
    n = torch.tensor(count, dtype=torch.float64, device=sums[0].device)
    if (n == 0).any():
        raise ValueError(f"{who}: some layer saw no sequences")
    for total in sums:
        total.div_(n.view(-1, *[1] * (total.dim() - 1)))
    return n


def random_half(n_seqs: int, seed: int) -> np.ndarray:
    """Indices of a seeded random half (⌊n/2⌋) of ``n_seqs`` sequences, sorted."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_seqs, size=n_seqs // 2, replace=False))


def means_bytes(model: LoadedModel, length: int) -> int:
    """One set of per-position means of q and k over every layer, float32 as they are kept
    (their float64 sums in the centering pass are twice this)."""
    s = model.spec
    return s.n_layers * (s.n_heads + s.n_kv_heads) * length * s.d_head * 4


class MomentsReducer:
    def __init__(self, n_seqs: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 length: int, d_head: int, device: torch.device | str = "cpu",
                 half_seed: int | None = 0, second_moments: bool = False):
        f64 = dict(dtype=torch.float64, device=device)
        self.q_sum = torch.zeros(n_layers, n_heads, length, d_head, **f64)
        self.k_sum = torch.zeros(n_layers, n_kv_heads, length, d_head, **f64)
        self.count = [0] * n_layers
        self.half_weight = self.q_half = self.k_half = None
        if half_seed is not None:
            self.half_weight = torch.zeros(n_seqs, **f64)
            self.half_weight[torch.as_tensor(random_half(n_seqs, half_seed))] = 1.0
            self.q_half = torch.zeros_like(self.q_sum)
            self.k_half = torch.zeros_like(self.k_sum)
            self.count_half = torch.zeros(n_layers, **f64)
        self.second_moments = second_moments
        self.means: Moments | None = None  # the result, once taken (no update after it)
        if second_moments:
            self.qq_sum = torch.zeros(n_layers, n_heads, d_head, d_head, **f64)
            self.kk_sum = torch.zeros(n_layers, n_kv_heads, d_head, d_head, **f64)

    def update(self, batch: LayerBatch) -> None:
        if self.means is not None:
            raise RuntimeError(f"{type(self).__name__}: update after the means were taken")
        L = batch.layer
        q, k = batch.q.double(), batch.k.double()  # [batch, pos, head, d]
        self.q_sum[L] += q.sum(0).transpose(0, 1)
        self.k_sum[L] += k.sum(0).transpose(0, 1)
        self.count[L] += q.shape[0]
        if self.half_weight is not None:
            w = self.half_weight[batch.index]  # 0/1 per sequence: no host sync
            self.q_half[L] += torch.einsum("b,bthd->htd", w, q)
            self.k_half[L] += torch.einsum("b,bthd->htd", w, k)
            self.count_half[L] += w.sum()
        if self.second_moments:
            self.qq_sum[L] += torch.einsum("bthd,bthe->hde", q, q)
            self.kk_sum[L] += torch.einsum("bthd,bthe->hde", k, k)

    def result(self) -> Moments:
        if self.means is not None:
            return self.means
        n = means_in_place(self.count, self.q_sum, self.k_sum, who="MomentsReducer.result")
        n_half = 0
        if self.half_weight is not None:
            nh = self.count_half.view(-1, 1, 1, 1)
            self.q_half.div_(nh)
            self.k_half.div_(nh)
            n_half = int(self.count_half[0])
        cov_q = cov_k = None
        if self.second_moments:
            T = self.q_sum.shape[2]
            cov = lambda second, mu: (second / (n.view(-1, 1, 1, 1) * T)
                                      - torch.einsum("lhtd,lhte->lhde", mu, mu) / T)
            cov_q, cov_k = cov(self.qq_sum, self.q_sum), cov(self.kk_sum, self.k_sum)
        self.means = Moments(self.rounded("q_sum"), self.rounded("k_sum"),
                             self.rounded("q_half"), self.rounded("k_half"),
                             int(n[0]), n_half, cov_q, cov_k)
        return self.means

    def rounded(self, name: str) -> Tensor | None:
        """The float64 means held in ``name``, rounded to float32 (as the condition saves
        them) and released, so that only one set is ever held twice."""
        mean = getattr(self, name)
        setattr(self, name, None)
        return None if mean is None else mean.float()

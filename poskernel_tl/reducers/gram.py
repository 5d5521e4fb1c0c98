"""Track B, second pass: the averaged Gram matrix over the evaluation set (Phase 4).

The accumulator holds Σ_x (q_x − m_q)(k_x − m_k)ᵀ·scale in float32, [layer, head, T, T],
where m is a fixed reference: the centering means when there are any, otherwise the
first batch's per-position means. One in-place batched matmul per layer and batch adds
a whole batch (the batch axis folded into the contraction), and because the reference
has removed the large mean term there is no cancellation to lose precision to. Every
Gram the fit needs then follows exactly, in float64, from the evaluation means q̄, k̄:

    mean_x (q − a)(k − b)ᵀ = C_m + (m_q − a)(k̄ − m_k)ᵀ + (q̄ − m_q)(m_k − b)ᵀ
                             + (m_q − a)(m_k − b)ᵀ,

with C_m the accumulator's mean: the raw Gram (a = b = 0), the centered Gram
(a, b = the centering means) and the half-centering check (a, b = means of a random
half of the centering set). The fit of g(Δ) is the Track A fit applied to Ḡ.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.errors import ResultFileError
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.moments import Moments, MomentsReducer
from poskernel_tl.schema import Part, column, stored
from poskernel_tl.toeplitz import shift_invariance_r2


@dataclass
class GramResult(Part):
    """Track B of one condition; where each field is saved is declared on it. The table's
    ``R2_gram`` is the centered fit, or the raw one where the condition is not centered
    (the protocol's CSV), so ``r2_gram`` is written and read by :meth:`columns`/:meth:`load`."""

    NAME = "track_b"
    r2_gram_raw: Float[np.ndarray, "layer head_index"] = column("trackB", "R2_gram_raw")
    g_gram_raw: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "gram_raw",
                                                                   finite=True)
    r2_gram: Float[np.ndarray, "layer head_index"]  # NaN without centering
    g_gram: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "gram_centered")
    r2_gram_half: Float[np.ndarray, "layer head_index"] = column("trackB", "R2_gram_half")
    gram_raw: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = stored(
        "gram_raw.pt", default=None)
    gram_centered: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = stored(
        "gram_centered.pt", default=None)
    centered: bool = column("trackB", "centered", default=False)
    eval_moments: Moments | None = None  # the evaluation means (not saved)

    def columns(self, table: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
        cols = super().columns(table, dims)
        if table == "trackB":
            shown = self.r2_gram if self.centered else self.r2_gram_raw
            cols = {"R2_gram": np.asarray(shown).ravel(), **cols}
        return cols

    @classmethod
    def load(cls, saved, dims: dict[str, int], **given):
        raw = saved.table_column("trackB", "R2_gram", dims, ("layer", "head_index"))
        r2 = raw if given.get("centered") else np.full(raw.shape, np.nan)
        part = super().load(saved, dims, r2_gram=r2, **given)
        if part.centered and not np.isfinite(part.g_gram).all():
            raise ResultFileError(f"{saved.path_of('g.npz')}: gram_centered holds NaN/inf")
        return part


class GramReducer:
    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, length: int,
                 d_head: int, scale: float, device: torch.device | str = "cpu",
                 reference: Moments | None = None):
        self.scale, self.group = scale, n_heads // n_kv_heads
        self.acc = torch.zeros(n_layers, n_heads, length, length, dtype=torch.float32,
                               device=device)
        self.sums = MomentsReducer(0, n_layers, n_heads, n_kv_heads, length, d_head, device,
                                   half_seed=None)
        self.ref_q: list[Tensor | None] = [None] * n_layers
        self.ref_k: list[Tensor | None] = [None] * n_layers
        if reference is not None:
            for L in range(n_layers):
                self.ref_q[L] = reference.mean_q[L].transpose(0, 1).float()  # [pos, head, d]
                self.ref_k[L] = reference.mean_k[L].transpose(0, 1).float()

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        self.sums.update(batch)
        q, k = batch.q.float(), batch.k.float()
        if self.ref_q[L] is None:  # no centering set: the first batch is the reference
            self.ref_q[L], self.ref_k[L] = q.mean(0), k.mean(0)
        b, T, H, d = q.shape
        kv = k.shape[2]
        # [kv, group·T, b·d] @ [kv, b·d, T] accumulates Σ_x q̃_x k̃_xᵀ for every query head
        qc = ((q - self.ref_q[L]) * self.scale).permute(2, 1, 0, 3)  # [H, T, b, d]
        qc = qc.reshape(kv, self.group * T, b * d)
        kc = (k - self.ref_k[L]).permute(2, 0, 3, 1).reshape(kv, b * d, T)
        self.acc[L].view(kv, self.group * T, T).baddbmm_(qc, kc)

    def _heads(self, x: Tensor) -> Tensor:
        """[kv_head_index, ...] → [head_index, ...] (each query head's key/value head)."""
        return x.repeat_interleave(self.group, dim=0)

    def gram(self, layer: int, mean_q: Tensor | None, mean_k: Tensor | None,
             ev: Moments) -> Float[Tensor, "head_index query_pos key_pos"]:
        """mean_x (q − a)(k − b)ᵀ·scale in float64, a/b = ``mean_q``/``mean_k`` (zero when
        None) in [head(kv), pos, d] layout."""
        n = ev.n
        m_q = self.ref_q[layer].transpose(0, 1).double()  # [H, T, d]
        m_k = self._heads(self.ref_k[layer].transpose(0, 1).double())
        a = torch.zeros_like(m_q) if mean_q is None else mean_q.double()
        b_ = torch.zeros_like(m_k) if mean_k is None else self._heads(mean_k.double())
        q_bar, k_bar = ev.mean_q[layer], self._heads(ev.mean_k[layer])
        outer = lambda x, y: torch.einsum("htd,hsd->hts", x, y)
        correction = (outer(m_q - a, k_bar - m_k) + outer(q_bar - m_q, m_k - b_)
                      + outer(m_q - a, m_k - b_))
        return self.acc[layer].double() / n + self.scale * correction

    def result(self, centering: Moments | None = None, keep_matrices: bool = False
               ) -> GramResult:
        """R²/g of the raw Gram and, given the centering means, of the centered Gram (all
        centering sequences, and the random half)."""
        ev = self.sums.result()
        n_layers, n_heads, T, _ = self.acc.shape
        nan = np.full((n_layers, n_heads), np.nan)
        out = {"r2_gram_raw": [], "g_gram_raw": [], "r2_gram": [], "g_gram": [],
               "r2_gram_half": []}
        mats: dict[str, list] = {"gram_raw": [], "gram_centered": []}
        for L in range(n_layers):
            raw = self.gram(L, None, None, ev)
            r2, g = shift_invariance_r2(raw)
            out["r2_gram_raw"].append(r2.cpu().numpy())
            out["g_gram_raw"].append(g.cpu().numpy())
            if keep_matrices:
                mats["gram_raw"].append(raw.float().cpu().numpy())
            if centering is None:
                continue
            cen = self.gram(L, centering.mean_q[L], centering.mean_k[L], ev)
            r2c, gc = shift_invariance_r2(cen)
            out["r2_gram"].append(r2c.cpu().numpy())
            out["g_gram"].append(gc.cpu().numpy())
            if centering.mean_q_half is not None:
                half = self.gram(L, centering.mean_q_half[L], centering.mean_k_half[L], ev)
                out["r2_gram_half"].append(shift_invariance_r2(half)[0].cpu().numpy())
            if keep_matrices:
                mats["gram_centered"].append(cen.float().cpu().numpy())
        stack = lambda key, fallback: np.stack(out[key]) if out[key] else fallback
        g_nan = np.full((n_layers, n_heads, T - 1), np.nan)
        return GramResult(
            r2_gram_raw=stack("r2_gram_raw", nan), g_gram_raw=stack("g_gram_raw", g_nan),
            r2_gram=stack("r2_gram", nan), g_gram=stack("g_gram", g_nan),
            r2_gram_half=stack("r2_gram_half", nan),
            gram_raw=np.stack(mats["gram_raw"]) if mats["gram_raw"] else None,
            gram_centered=np.stack(mats["gram_centered"]) if mats["gram_centered"] else None,
            centered=centering is not None, eval_moments=ev)

"""The fit of one Gram G = B + scale·U·Vᵀ from B's pieces
(:class:`~poskernel_tl.reducers.gram_fit.Pieces`: its per-lag sums, sum of squares and
B_low·X, formed once) and the rank-2·d_head correction U·Vᵀ of a centering: the identities
of :mod:`poskernel_tl.reducers.gram_fit`'s docstring, every variant of Track B (raw,
centred, random half) one call on the same pieces; both triangles of a two-sided layer,
each under the layer's mask (a two-sided window: the same rule mirrored)."""

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import r2_two_sided
from poskernel_tl.models.softmax_ops import chunk_qk
from poskernel_tl.models.softmax_terms import NONE
from poskernel_tl.reducers import gram_fit
from poskernel_tl.reducers.band_sums import band_is_cheaper
from poskernel_tl.reducers.gram_fit import Pieces
from poskernel_tl.reducers.lag_sums import lag_sums, lower_stats, lower_sum_squares, windowed


def variant_fit(pieces: Pieces, u: Float[Tensor, "head_index pos rank"] | None,
                v: Float[Tensor, "kv_head_index pos rank"] | None,
                w: Float[Tensor, "head_index pos rank"] | None, scale: float,
                w_up: Float[Tensor, "head_index pos rank"] | None = None,
                last: int | None = None, chunk: int | None = None
                ) -> tuple[Float[Tensor, " head_index"], Float[Tensor, "head_index lag"],
                           Float[Tensor, "head_index lag"] | None,
                           Float[Tensor, " head_index"] | None]:
    """R², g, and for two-sided pieces g_back and the diagonal's mean g_self (else None),
    of G = B + scale·U·Vᵀ, given W = B_low·V and W_up = B_up·V (from ``pieces.y``,
    ``pieces.y_up``); U, V, W None: G = B. ``last``: the fit over the offsets
    t − s ≤ last (a sliding window; the pieces must be the window's), and ``chunk``:
    a chunked mask's entries (the pieces must be its; U·Vᵀ spread by chunk)."""
    s1, sq = pieces.s1, pieces.sq
    s1_up, sq_up, diag = pieces.s1_up, pieces.sq_up, pieces.diag
    if v is not None and s1_up is not None:  # Gᵀ's queries are V's: one per query head
        v = v.repeat_interleave(u.shape[0] // v.shape[0], dim=0)
    if u is not None and kernels.takes(u, chunk):
        s1, sq, s1_up, sq_up, diag = _tile_corrected(pieces, u, v, w, w_up, scale, last)
    elif u is not None:
        ut, vt = u.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, T, heads, rank]
        if chunk is not None:  # U·Vᵀ's entries across chunks are 0
            ut, vt = chunk_qk(ut, vt, chunk)
        if band_is_cheaper(ut.shape[1], last, ut.shape[-1]):  # float64, on the band
            s1_uv, sq_uv, _ = lower_stats(ut, vt, 1.0, last=last)
        else:
            s1_uv = windowed(lag_sums(ut, vt, 1.0), last)
            sq_uv = lower_sum_squares(ut, vt, 1.0, last=last, dtype=gram_fit.FIT_DTYPE)
        s1 = s1 + scale * s1_uv[0]
        sq = sq + 2 * scale * (u * w).sum(dim=(1, 2)) + scale * scale * sq_uv[0]
        if s1_up is not None:  # Gᵀ = Bᵀ + scale·V·Uᵀ
            s1_up = s1_up + scale * windowed(lag_sums(vt, ut, 1.0), last)[0]
            sq_up = sq_up + 2 * scale * (u * w_up).sum(dim=(1, 2)) + \
                scale * scale * lower_sum_squares(vt, ut, 1.0, last=last)[0]
            diag = diag + scale * (u * v).sum(-1)
    T = s1.shape[-1] + 1
    counts = lag_counts(T, device=s1.device, last=last, chunk=chunk)
    back = None if s1_up is None else (s1_up, sq_up, counts)
    r2, g, g_back = r2_two_sided((s1, sq, counts), back)
    return r2, g, g_back, None if diag is None else diag.mean(-1)


def _tile_corrected(pieces: Pieces, u: Tensor, v: Tensor, w: Tensor, w_up: Tensor | None,
                    scale: float, last: int | None) -> tuple:
    """:func:`variant_fit`'s sums of G = B + scale·U·Vᵀ with the U·Vᵀ terms from the tiled
    kernels (:func:`~poskernel_tl.kernels.lag_tiles.lag_tile_sums`, the rank as d_head):
    (S1, Σ², S1_up, Σ²_up, diag)."""
    ut, vt = u.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, T, heads, rank]
    T = ut.shape[1]
    uv = kernels.lag_tile_sums(ut, vt, 1.0, NONE, last)[:, 0]
    s1 = pieces.s1 + scale * F.pad(uv[0], (0, T - 1 - uv.shape[-1]))
    sq = pieces.sq + 2 * scale * (u * w).sum(dim=(1, 2)) + scale * scale * uv[1].sum(-1)
    if pieces.s1_up is None:
        return s1, sq, None, None, None
    vu = kernels.lag_tile_sums(vt, ut, 1.0, NONE, last, transposed=True)[:, 0]
    return (s1, sq, pieces.s1_up + scale * F.pad(vu[0], (0, T - 1 - vu.shape[-1])),
            pieces.sq_up + 2 * scale * (u * w_up).sum(dim=(1, 2)) + scale * scale * vu[1].sum(-1),
            pieces.diag + scale * (u * v).sum(-1))


__all__ = ["variant_fit"]

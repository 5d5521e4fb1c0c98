"""Track A restricted to bands of offsets (:func:`~poskernel_tl.protocol.offset_bands`):
each band's g fitted on its entries alone, R² the share of their variance it explains,
from the per-lag sums and counts and Σ A² over each band of the partition — exact, no
T × T matrix (Σ A² by band: :func:`poskernel_tl.reducers.lag_sums.band_sum_squares` from
q/k, :func:`poskernel_tl.fit.toeplitz.lower_lag_stats` from materialised logits)."""

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.protocol import band_ends, offset_bands

Side = tuple[Float[Tensor, "*batch lag"], Float[Tensor, "... lag"], Float[Tensor, "*batch part"]]


def band_r2(front: Side, length: int, back: Side | None = None) -> Float[Tensor, "*batch band"]:
    """R² of the fit restricted to each offset band of
    :func:`~poskernel_tl.protocol.offset_bands` (g fitted on the band's entries alone, R² the
    share of their variance it explains), from ``front`` = (S1(Δ), n(Δ), Σ A² over each band
    of the partition :func:`~poskernel_tl.protocol.band_ends`); ``back``: the upper
    triangle's (a band then holds the offsets ±Δ). Every band's sums are one product with
    a [lag, band] indicator, so no per-band copy of the lag axis is made. NaN for a band
    with no entries or no variance."""
    bands = offset_bands(length)
    ends = band_ends(length)
    lags = torch.arange(1, length, dtype=torch.float64, device=front[0].device)
    lo, hi = (torch.tensor(x, dtype=torch.float64, device=lags.device) for x in zip(*bands))
    member = ((lags[:, None] >= lo) & (lags[:, None] <= hi)).double()  # [lag, band]
    part_end = torch.tensor(ends, dtype=torch.float64, device=lags.device)[:, None]
    part_lo = torch.tensor([1] + [e + 1 for e in ends[:-1]], dtype=torch.float64,
                           device=lags.device)[:, None]
    within = ((part_lo >= lo) & (part_end <= hi)).double()  # [part, band]
    total = expl = n = sq = 0
    for s1, counts, sq_parts in [front] + ([] if back is None else [back]):
        counts = counts.to(s1.device, torch.float64)
        inv = torch.where(counts > 0, 1 / counts.clamp(min=1), 0.0)
        s1 = s1.double() * (counts > 0)
        total = total + s1 @ member
        expl = expl + (s1 * s1 * inv) @ member
        n = n + counts @ member
        sq = sq + sq_parts.double() @ within
    ss_tot = sq - total * total / torch.where(n > 0, n, 1.0)
    ok = (n > 0) & (ss_tot > 1e-12 * torch.clamp(sq, min=torch.finfo(torch.float64).tiny))
    return torch.where(ok, 1 - (sq - expl) / torch.where(ok, ss_tot, 1.0), float("nan"))


def band_fits(s1: Float[Tensor, "n_seqs layer head_index lag"],
              bands: Float[Tensor, "n_seqs layer head_index part"],
              counts: Float[Tensor, "layer 1 lag"], length: int, back=None
              ) -> tuple[Float[Tensor, "band layer head_index"],
                         Float[Tensor, "band layer head_index"]]:
    """The pooled R² of each band over the sequences and its per-sequence mean, a layer at
    a time (no copy of the whole [n, layer, head, lag] state); ``back``: the upper
    triangle's (S1, n(Δ) per layer [layer, 1, lag], Σ A² by band) of a bidirectional
    model."""
    pooled, per_seq = [], []
    n = s1.shape[0]
    for L in range(s1.shape[1]):
        front = (s1[:, L], counts[L, 0], bands[:, L])
        side = None if back is None else (back[0][:, L], back[1][L, 0], back[2][:, L])
        per_seq.append(band_r2(front, length, side).nanmean(0))
        pool = lambda x: None if x is None else (x[0].sum(0), x[1] * n, x[2].sum(0))
        pooled.append(band_r2(pool(front), length, pool(side)))
    return torch.stack(pooled).permute(2, 0, 1), torch.stack(per_seq).permute(2, 0, 1)

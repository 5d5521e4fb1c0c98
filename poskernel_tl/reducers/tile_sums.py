"""Track A's and the null's sums from the tiled kernels (:mod:`poskernel_tl.kernels`):
what :mod:`poskernel_tl.reducers.lag_sums` and :mod:`poskernel_tl.reducers.two_sided`
give on a CPU, for a batch whose :attr:`~poskernel_tl.reducers.base.LayerBatch.on_kernels`
is set, in a fixed number of operations whatever the number of layers of a group.

The kernels read q and k as the model gave them and form what the softmax reads on each
tile (the temperature, ALiBi and the soft-cap included), so soft-capped layers stream here
too. From the per-lag sums S1(Δ), S2(Δ) of the whole triangle follow, by one product with
a fixed matrix of weights (:func:`lag_weights`), Σ A² of what the mask keeps, of each band
of offsets within it and of the whole triangle; the regions of the variants are summed by
one more kernel (:mod:`~poskernel_tl.kernels.strip_regions`).
"""

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.protocol import band_ends
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.track_a_result import STRIP
from poskernel_tl.reducers.two_sided import UpperStats, diagonal_sum, mirrored

_WEIGHTS: dict = {}


def lag_weights(length: int, last: int | None, device) -> Float[Tensor, "lag stat"]:
    """float64 [T − 1, 2 + bands]: S2 @ it gives, per (sequence, head), Σ A² over the lags
    Δ ≤ ``last`` (column 0), over each band of offsets within them
    (:func:`~poskernel_tl.protocol.band_ends`), and over every lag (the last column): the
    layout of Track A's per-sequence state after S1. Made once per (T, last, device)."""
    key = (length, last, str(device))
    if key not in _WEIGHTS:
        lag = torch.arange(1, length, dtype=torch.float64)
        kept = (lag <= (length - 1 if last is None else last)).double()
        lo = 0
        cols = [kept]
        for hi in band_ends(length):
            cols.append(kept * ((lag > lo) & (lag <= hi)).double())
            lo = hi
        cols.append(torch.ones_like(lag))
        _WEIGHTS[key] = torch.stack(cols, -1).to(device)
    return _WEIGHTS[key]


def lag_rows(sums: Float[Tensor, "stat batch head_index lag"], length: int,
             last: int | None) -> Float[Tensor, "batch head_index row"]:
    """Per (sequence, head): S1 of every lag, Σ A² kept, by band, of the whole triangle (the
    row of Track A's per-sequence state) from the lag sums (S1, S2) of Δ = 1..T−1."""
    return torch.cat([sums[0], sums[1] @ lag_weights(length, last, sums.device)], -1)


def track_a_tile_rows(batch: LayerBatch, last: int | None, regions
                      ) -> tuple[Float[Tensor, "batch head_index row"],
                                 Float[Tensor, "region batch head_index sums"]]:
    """(Track A's per-sequence rows of ``batch`` (:func:`lag_rows`), the sums of each of
    ``regions`` (S1 of every lag, then Σ A²)): two launches and a few operations for all
    the batch's layers."""
    T = batch.q.shape[1]
    rows = lag_rows(kernels.lag_tile_sums(batch.q, batch.k, batch.scale, batch.terms), T,
                    last)
    return rows, kernels.strip_region_sums(batch.q, batch.k, batch.scale, batch.terms,
                                           regions, STRIP, rows, last)


def upper_tile_stats(batch: LayerBatch, regions) -> tuple[UpperStats, Tensor]:
    """The upper triangle's sums of ``batch`` (the lower triangle of scale·k·qᵀ, grouped
    keys repeated to their query heads) and its regions' sums (as
    :func:`track_a_tile_rows`'s)."""
    T = batch.q.shape[1]
    sums = kernels.lag_tile_sums(*mirrored(batch.q, batch.k), batch.scale, batch.terms,
                                 transposed=True)
    rows = lag_rows(sums, T, None)
    fq, fk = batch.logit_qk
    n_bands = rows.shape[-1] - T - 1
    stats = UpperStats((sums[0], rows[..., T - 1]), None,
                       diagonal_sum(fq, fk, batch.scale, batch.terms),
                       rows[..., T:T + n_bands])
    return stats, kernels.strip_region_sums(batch.q, batch.k, batch.scale, batch.terms,
                                            regions, STRIP, rows, None, upper=True)


def null_tile_sums(batch: LayerBatch, q: Tensor, k: Tensor, perms: Tensor,
                   last: int | None, causal: bool
                   ) -> tuple[Float[Tensor, "stat draw head_index lag"],
                              Float[Tensor, "stat draw head_index lag"] | None]:
    """Per draw of ``perms`` [draw, T], summed over the sequences of ``q``/``k`` (the
    null's, as the model gave them): the lower triangle's (S1, S2) per lag of the permuted
    product over Δ ≤ ``last`` (0 past it), and (``causal`` false) its upper triangle's;
    each one launch for every draw."""
    lower = kernels.lag_tile_sums(q, k, batch.scale, batch.terms, last, perms,
                                  pooled=True, full=True)
    upper = None if causal else kernels.lag_tile_sums(
        *mirrored(q, k), batch.scale, batch.terms, None, perms, pooled=True, transposed=True)
    return lower, upper


__all__ = ["lag_rows", "lag_weights", "null_tile_sums", "track_a_tile_rows",
           "upper_tile_stats"]

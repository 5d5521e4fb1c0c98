"""Track A's and the null's sums from the tiled kernels (:mod:`poskernel_tl.kernels`):
what :mod:`poskernel_tl.reducers.lag_sums` and :mod:`poskernel_tl.reducers.two_sided`
give on a CPU, in the same structures, for a batch whose
:attr:`~poskernel_tl.reducers.base.LayerBatch.on_kernels` is set.

The kernels read q and k as the model gave them and form what the softmax reads on each
tile (the temperature, ALiBi and the soft-cap included), so soft-capped layers stream here
too. From the per-lag sums S1(Δ), S2(Δ) of the whole triangle follow Σ A² of the whole
triangle, of a window's offsets and of each band of offsets; the strip of the first keys
(the variants' regions) is one product, as on the CPU.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.models.softmax_ops import cap_scores
from poskernel_tl.reducers.band_sums import band_part_sums
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.lag_sums import LowerStats, key_strip, skew_keys
from poskernel_tl.reducers.track_a_result import STRIP
from poskernel_tl.reducers.two_sided import UpperStats, diagonal_sum, per_query_head

Triple = tuple[Float[Tensor, "out head_index lag"], Float[Tensor, "out head_index"],
               Float[Tensor, "out head_index part"]]


def kept_sums(sums: Float[Tensor, "stat out head_index window"], length: int,
              max_lag: int | None) -> Triple:
    """(S1 of every lag, zero past ``max_lag``; Σ A² over Δ ≤ max_lag; Σ A² by band) from
    the per-lag (S1, S2) of :func:`~poskernel_tl.kernels.lag_tiles.lag_tile_sums` over
    Δ = 1..W (W ≤ T − 1; lags past W are zero)."""
    W = sums.shape[-1] if max_lag is None else min(max_lag, sums.shape[-1])
    s1 = torch.nn.functional.pad(sums[0, ..., :W], (0, length - 1 - W))
    s2 = sums[1, ..., :W]
    return s1, s2.sum(-1), band_part_sums(s2, length)


def strip(batch: LayerBatch, swap: bool = False
          ) -> Float[Tensor, "batch head_index key_pos lag"]:
    """The first :data:`~poskernel_tl.reducers.track_a_result.STRIP` keys of what the softmax reads,
    skewed to [key, lag] (``swap``: of its transpose, the upper triangle's rows)."""
    q, k = batch.logit_qk
    if swap:
        q, k = per_query_head(k, q.shape[2]), q
    return skew_keys(cap_scores(key_strip(q, k, batch.scale, min(STRIP, q.shape[1])),
                                batch.terms))


def track_a_tile_stats(batch: LayerBatch, max_lag: int | None) -> LowerStats:
    """:func:`~poskernel_tl.reducers.lag_sums.track_a_stats` of ``batch`` from one launch:
    every lag of every sequence and head."""
    T = batch.q.shape[1]
    sums = kernels.lag_tile_sums(batch.q, batch.k, batch.scale, batch.terms)
    s1, kept, bands = kept_sums(sums, T, max_lag)
    return LowerStats(sums[0], kept, sums[1].sum(-1), bands, strip(batch))


def upper_tile_stats(batch: LayerBatch) -> UpperStats:
    """:func:`~poskernel_tl.reducers.two_sided.upper_stats` of ``batch``: the lower
    triangle of scale·k·qᵀ (grouped keys repeated to their query heads)."""
    q, k = batch.q, per_query_head(batch.k, batch.q.shape[2])
    T = q.shape[1]
    sums = kernels.lag_tile_sums(k, q, batch.scale, batch.terms, transposed=True)
    s1, sq, bands = kept_sums(sums, T, None)
    fq, fk = batch.logit_qk
    return UpperStats((s1, sq), strip(batch, swap=True),
                      diagonal_sum(fq, fk, batch.scale, batch.terms), bands)


def null_tile_stats(batch: LayerBatch, q: Tensor, k: Tensor, perms: Tensor,
                    max_lag: int | None, causal: bool) -> tuple[Triple, Triple | None]:
    """Per draw of ``perms`` [draw, T], summed over the sequences of ``q``/``k`` (the
    null's, as the model gave them): the lower triangle's (S1, Σ A², Σ A² by band) of the
    permuted product over Δ ≤ ``max_lag``, and (``causal`` false) its upper triangle's;
    each one launch for every draw."""
    T = q.shape[1]
    lower = kept_sums(kernels.lag_tile_sums(q, k, batch.scale, batch.terms, max_lag, perms,
                                    pooled=True), T, max_lag)
    upper = None if causal else kept_sums(
        kernels.lag_tile_sums(per_query_head(k, q.shape[2]), q, batch.scale, batch.terms,
                              None, perms, pooled=True,
                      transposed=True), T, None)
    return lower, upper


__all__ = ["kept_sums", "null_tile_stats", "strip", "track_a_tile_stats", "upper_tile_stats"]

"""How many entries a layer's mask keeps at each offset: n(Δ) of the strictly lower
triangle (Δ = 1..T−1), of its rows in a range, within a sliding window and within the
chunks of a chunked mask, and of the upper triangle — the counts every shift-invariant fit
divides by (:mod:`poskernel_tl.fit.toeplitz`), each O(T), no T × T mask formed."""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.mask import Mask, within


def chunk_rows(lo: Tensor | int, hi: Tensor | int, lag: Tensor, chunk: int) -> Tensor:
    """How many rows t in [lo, hi) keep their key t − Δ inside their own chunk of ``chunk``
    positions (t mod chunk ≥ Δ), per Δ in ``lag`` (O(1) each: no mask is formed)."""
    def below(x):  # rows t in [0, x) with t mod chunk ≥ Δ
        x = torch.as_tensor(x, device=lag.device).clamp(min=0)
        return (x // chunk) * (chunk - lag).clamp(min=0) + (x % chunk - lag).clamp(min=0)
    return (below(hi) - below(torch.minimum(torch.as_tensor(lo, device=lag.device),
                                            torch.as_tensor(hi, device=lag.device)))
            ).clamp(min=0)


def lag_counts(T: int, row_lo: int = 0, row_hi: int | None = None,
               device=None, last: int | None = None, chunk: int | None = None
               ) -> Float[Tensor, " lag"]:
    """n(Δ) for Δ = 1..T−1: how many query rows t in [row_lo, row_hi) have a key at t−Δ
    (0 past ``last``, the last offset a sliding window keeps; with ``chunk``, only the
    rows whose key lies in their own chunk: a chunked mask)."""
    row_hi = T if row_hi is None else min(row_hi, T)
    lags = torch.arange(1, T, device=device, dtype=torch.float64)
    if chunk is not None:
        counts = chunk_rows(row_lo, row_hi, lags.long(), chunk).double()
    else:
        counts = torch.clamp(row_hi - torch.clamp(lags, min=row_lo), min=0)
    return counts if last is None else counts * within(lags, last)


def layer_lag_counts(masks: Sequence[Mask], row_lo: int = 0, row_hi: int | None = None,
                     device=None) -> Float[Tensor, "layer 1 lag"]:
    """:func:`lag_counts` of every layer's mask (one per layer: its last kept offset and the
    chunk that binds), [layer, 1, lag] (broadcasts over heads)."""
    return torch.stack([lag_counts(m.length, row_lo, row_hi, device, m.window_last, m.chunk)
                        for m in masks])[:, None]


def upper_lag_counts(T: int, row_lo: int = 0, row_hi: int | None = None,
                     device=None) -> Float[Tensor, " lag"]:
    """n(Δ) for Δ = −1..−(T−1) (index j ↔ Δ = −(j+1)): how many query rows t in
    [row_lo, row_hi) have a key at t + j + 1 (the upper triangle)."""
    row_hi = T if row_hi is None else min(row_hi, T)
    last = T - torch.arange(1, T, device=device, dtype=torch.float64)  # rows t < T − m
    return torch.clamp(torch.clamp(last, max=row_hi) - row_lo, min=0)


__all__ = ["chunk_rows", "lag_counts", "layer_lag_counts", "upper_lag_counts"]

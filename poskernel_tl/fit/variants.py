"""Track A's variants as data: each is a region of the logit matrix — query rows
[rows[0], rows[1]) and keys [keys[0], keys[1]) (None: to the end), within the layer's
mask — fitted by one g(Δ) exactly as the whole triangle is. A variant is declared once,
on the result field that holds its R² (:func:`fitted`); the reducer finds the regions
there (:func:`variants_of`) and keeps, for each, its per-lag sums and Σ A².

Every region's sums come from the whole triangle's and one strip of the logits:

- the strip holds every entry with key s < K on the lower side (query row t < K on the
  upper side of a bidirectional model), K = :func:`strip_of` the declared regions (each
  region's :meth:`Variant.strip_keys`), skewed to [position, lag]
  (:func:`poskernel_tl.reducers.lag_sums.skew_keys`);
- a region with a finite end (of its rows or keys) lies inside the strip and is summed
  over it directly;
- a region open to the end of both rows and keys is the whole triangle less its
  complement (rows or keys below its start), which lies inside the strip.

So every region can be declared; a region far from the first keys widens the strip (its
bytes are in the memory plan: :func:`strip_bytes`).
"""

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.counts import chunk_rows
from poskernel_tl.fit.toeplitz import r2_two_sided, skew_lower
from poskernel_tl.mask import Mask, within

Block = tuple[Float[Tensor, "*batch lag"], Float[Tensor, "*batch"]]


@dataclass(frozen=True)
class Variant:
    """A region of the logits: query rows [rows[0], rows[1]), keys [keys[0], keys[1])."""

    rows: tuple[int, int | None] = (0, None)
    keys: tuple[int, int | None] = (0, None)

    def __post_init__(self):
        for lo, hi in (self.rows, self.keys):
            if lo < 0 or (hi is not None and hi <= lo):
                raise ValueError(f"{self}: a range [lo, hi) needs 0 ≤ lo < hi")

    def inside(self) -> bool:
        """Whether it is summed over the strip directly (a finite end of its rows or keys:
        every entry then has key < K, or row < K, K ≥ :meth:`strip_keys`); else the whole
        triangle less its complement."""
        return self.rows[1] is not None or self.keys[1] is not None

    def strip_keys(self) -> int:
        """The keys (rows, upper side) of the strip this region is read from: its nearest
        finite end, or (open to the end) the larger start, where its complement ends."""
        ends = [hi for hi in (self.rows[1], self.keys[1]) if hi is not None]
        return min(ends) if ends else max(self.rows[0], self.keys[0])

    def holds(self, t: Tensor, s: Tensor) -> Tensor:
        """Bool: whether entry (query t, key s) is in the region."""
        (r0, r1), (k0, k1) = self.rows, self.keys
        inside = (t >= r0) & (s >= k0)
        if r1 is not None:
            inside &= t < r1
        if k1 is not None:
            inside &= s < k1
        return inside

    def counts(self, T: int, last: int | None = None, upper: bool = False,
               device=None, chunk: int | None = None) -> Float[Tensor, " lag"]:
        """n(Δ) of the region, Δ = 1..T−1 (upper: Δ = −1..−(T−1)), within ``last``
        (and, lower side, ``chunk``: a chunked mask's): per Δ the rows t with t and its key
        s = t ∓ Δ both in range (O(T), no T×T mask)."""
        (r0, r1), (k0, k1) = self.rows, self.keys
        r1, k1 = T if r1 is None else min(r1, T), T if k1 is None else min(k1, T)
        lag = torch.arange(1, T, device=device, dtype=torch.int64)
        sign = -1 if upper else 1  # s = t − sign·Δ
        lo = torch.clamp(sign * lag + k0, min=max(r0, 0))  # s ≥ k0
        hi = torch.clamp(sign * lag + k1, max=r1)  # s < k1
        if upper:
            hi = torch.minimum(hi, T - lag)  # s < T
        else:
            lo = torch.maximum(lo, lag)  # s ≥ 0
        n = (hi - lo).clamp(min=0) if chunk is None or upper else chunk_rows(lo, hi, lag, chunk)
        return (n * within(lag, last)).double()


def fitted(field: Any, variant: Variant) -> Any:
    """``field`` (a :func:`~poskernel_tl.schema.column`) declared as the R² of the Track A
    fit over ``variant``'s region."""
    return dataclasses.field(default=field.default, metadata={**field.metadata,
                                                               "variant": variant})


def variants_of(cls) -> dict[str, Variant]:
    """The variant fields of a result dataclass, field name -> region."""
    return {f.name: f.metadata["variant"] for f in dataclasses.fields(cls)
            if "variant" in f.metadata}


def strip_of(regions) -> int:
    """K: the keys (rows, upper side) of the one strip every region of ``regions`` is read
    from (at least 1)."""
    return max([1, *(v.strip_keys() for v in regions)])


def strip_bytes(n_heads: int, length: int, strip: int) -> int:
    """Transient bytes of one sequence's strip for one side: the [head, T, K] logits and
    their skewed float64 copy [head, K, T + K]."""
    K = min(strip, length)
    return n_heads * K * (4 * length + 8 * (length + K))


def region_mask(variant: Variant, K: int, n_lag: int, last: int | None = None,
                upper: bool = False, device=None) -> Tensor:
    """Bool [K, n_lag]: the entries of the skewed strip :func:`region_sums` sums for
    ``variant`` — the region's own within ``last``, or (a region whose complement lies
    in the strip) the complement's."""
    p = torch.arange(K, device=device)[:, None]
    lag = torch.arange(1, n_lag + 1, device=device)[None]
    t, s = (p, p + lag) if upper else (p + lag, p)
    kept = within(lag, last)  # (every lag of the strip is ≤ n_lag)
    return (variant.holds(t, s) if variant.inside()  # or the complement, within the window
            else ~variant.holds(t, s)) & kept


def region_sums(skewed: Float[Tensor, "batch head_index pos lag"], variant: Variant,
                whole: Block, last: int | None = None, upper: bool = False) -> Block:
    """(S1(Δ), Σ A²) of ``variant``'s region from the skewed strip (entry (p, Δ−1) is
    A[p + Δ, p] with key p on the lower side, A[p, p + Δ] with row p on the upper) and the
    whole side's sums ``whole`` (S1 may hold lags past ``last``: they pass through);
    positions past the end of the sequence are zero in the strip."""
    K, n_lag = skewed.shape[-2], skewed.shape[-1]
    if K < min(variant.strip_keys(), n_lag + 1):
        raise ValueError(f"{variant} needs a strip of {variant.strip_keys()} keys, got {K}")
    mine = region_mask(variant, K, n_lag, last, upper, skewed.device)
    part = torch.where(mine, skewed, 0.0)
    s1, sq = part.sum(-2), torch.linalg.vector_norm(part, dim=(-2, -1)).square()
    return (s1, sq) if variant.inside() else (whole[0] - s1, whole[1] - sq)


def variant_r2(A: Float[Tensor, "query_pos key_pos"], variant: Variant, causal: bool = True,
               last: int | None = None, chunk: int | None = None) -> float:
    """R² of the shift-invariant fit over ``variant``'s region of one materialised matrix
    (the head view's; entry by entry): its strictly lower entries within ``last`` (and
    ``chunk``), and for a bidirectional model (``causal`` false) its upper ones too, one g
    per signed lag."""
    T = A.shape[-1]
    t = torch.arange(T, device=A.device)[:, None]
    s = torch.arange(T, device=A.device)[None]

    def side(M: Tensor, upper: bool) -> tuple[Tensor, Tensor, Tensor]:
        rows, keys = (s, t) if upper else (t, s)  # M's (i, j) is A's (rows, keys)
        # the lower side's mask; the upper side's, mirrored (its own chunks are not read)
        keep = Mask(T, True, last, None if upper else chunk).keeps(t, s) \
            & variant.holds(rows, keys)
        z = skew_lower(torch.where(keep, M.double(), 0.0))
        return z.sum(-2), (z * z).sum((-2, -1)), variant.counts(T, last, upper, A.device,
                                                                 chunk)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r2, _, _ = r2_two_sided(side(A, False), None if causal else side(A.T, True))
    return float(r2)


__all__ = ["Variant", "fitted", "region_mask", "region_sums", "strip_bytes",
           "strip_of", "variant_r2", "variants_of"]

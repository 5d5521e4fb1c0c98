"""Track A's sums of the upper triangle (bidirectional models: no causal mask).

The entries above the diagonal of A = scale·q·kᵀ, A[t, s] with s > t (lag Δ = t − s =
−1..−(T−1), key after query), are the strictly lower triangle of Aᵀ = scale·k·qᵀ, so the
identities of :mod:`poskernel_tl.reducers.lag_sums` give their sums with q and k swapped:
per-lag sums by FFT cross-correlation of k against q, the sum of squares by the running
moment of the queries, and the strip Aᵀ[:, :50] = A[:50, :]ᵀ (every key of query rows
t < 50) by one explicit product. Index j of a ``lag`` axis here is Δ = −(j+1).

Track A's variants read the upper part of their region
(:func:`poskernel_tl.fit.variants.region_sums` with ``upper=True``): the whole upper
triangle for the whole fits; for the no-sink fit too (it holds no key 0); query rows 1–20
from the strip; rows ≥ 50 and the interior A[50:, 50:] (whose upper part is that of rows
≥ 50, s > t ≥ 50) as the whole less the strip's rows below 50.

The diagonal A[t, t] (Δ = 0) is kept apart as its sum, never fitted. Swapping q and k
needs one key head per query head: with grouped-query attention (T5Gemma's encoder) the
keys are first repeated to every query head of their group (:func:`per_query_head`).
``source="scores"`` reads the same sums from the materialised logits (the reference
path): the upper triangle is the lower one of the transposed view, swept by
:func:`poskernel_tl.fit.toeplitz.lower_lag_stats`.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.toeplitz import Sums, lower_lag_stats, lower_mean_from_qk
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.models.softmax_ops import cap_scores
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms
from poskernel_tl.protocol import band_ends
from poskernel_tl.reducers.lag_sums import DEFAULT_CHUNK, skew_keys, track_a_stats
from poskernel_tl.reducers.track_a_result import STRIP

Block = tuple[Float[Tensor, "batch head_index lag"], Float[Tensor, "batch head_index"]]


@dataclass
class UpperStats:
    """Per (sequence, head), float64: (S1, Σ A²) of the whole upper triangle, index j ↔
    Δ = −(j+1); the strip of its first
    :data:`~poskernel_tl.reducers.track_a_result.STRIP` query rows skewed to [row, lag]
    (entry (t, j) = A[t, t + j + 1]); ``diag`` = Σ_t A[t, t]; ``bands``, Σ A² over each
    band of offsets (:func:`~poskernel_tl.protocol.band_ends`)."""

    whole: Block
    skewed: Float[Tensor, "batch head_index query_pos lag"] | None  # None: kernels' path
    diag: Float[Tensor, "batch head_index"]
    bands: Float[Tensor, "batch head_index part"]  # Σ A² of each band of offsets −Δ


def sides(model: LoadedModel) -> int:
    """Triangles every fit reads: 1 for a causal model, 2 for a bidirectional one."""
    return 1 if getattr(model.spec, "causal", True) else 2


def per_query_head(k: Float[Tensor, "batch pos kv_head_index d"], n_heads: int
                   ) -> Float[Tensor, "batch pos head_index d"]:
    """``k`` with one key head per query head (each repeated over its group: kv(h) =
    h // group), what a fit that swaps q and k reads; ``k`` itself where it already has
    one."""
    kv = k.shape[2]
    if n_heads % kv:
        raise ValueError(f"{n_heads} query heads do not split into {kv} key/value groups")
    return k if kv == n_heads else k.repeat_interleave(n_heads // kv, dim=2)


def mirrored(q: Float[Tensor, "batch pos head_index d"],
             k: Float[Tensor, "batch pos kv_head_index d"]
             ) -> tuple[Float[Tensor, "batch pos head_index d"],
                        Float[Tensor, "batch pos head_index d"]]:
    """The operands whose lower triangle is the upper triangle of q·kᵀ (Aᵀ's: the keys as
    queries, one per query head, the queries as keys): what every fit of a two-sided
    layer's upper side reads, under the same mask mirrored."""
    return per_query_head(k, q.shape[2]), q


def diagonal_sum(q: Float[Tensor, "batch pos head_index d_head"],
                 k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                 terms: SoftmaxTerms = NONE) -> Float[Tensor, "batch head_index"]:
    """Σ_t A[t, t] in float64 (the diagonal, Δ = 0): scale·q_t·k_t, grouped keys repeated
    to their query heads, soft-capped entry by entry where the layer caps (``terms``)."""
    products = q.double() * per_query_head(k, q.shape[2]).double()
    if terms.softcap is None:
        return products.sum(dim=(1, 3)) * scale
    return cap_scores(products.sum(-1) * scale, terms).sum(1)


def upper_stats(q: Float[Tensor, "batch pos head_index d_head"],
                k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                chunk: int = DEFAULT_CHUNK, last: int | None = None) -> UpperStats:
    """Every upper-triangle sum Track A keeps, from q/k (see the module docstring): the
    lower triangle's sums of Aᵀ (:func:`~poskernel_tl.reducers.lag_sums.track_a_stats`
    with q and k swapped, one key head per query head), within ``last`` (a two-sided
    window: the same rule mirrored). The strip of Aᵀ holds entry (s, t) = A[t, s] for
    query rows t < K; skewed: (t, j) = A[t, t+j+1]."""
    kh, _ = mirrored(q, k)
    st = track_a_stats(kh, q, scale, chunk, last)
    return UpperStats((st.s1, st.sq), st.skewed, diagonal_sum(q, kh, scale), st.bands)


def upper_stats_from_scores(scores: Float[Tensor, "batch head_index query_pos key_pos"],
                            q: Float[Tensor, "batch pos head_index d_head"],
                            k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                            work: Tensor | None = None, last: int | None = None
                            ) -> UpperStats:
    """:func:`upper_stats` from the materialised logits (every entry valid): rows of A are
    keys of Aᵀ, so rows < hi are the key block (hi, 0) of the transposed view."""
    T = scores.shape[-1]
    # the mean of the upper triangle
    shift = lower_mean_from_qk(*mirrored(q, k), scale)
    (*whole, bands), _ = lower_lag_stats(scores.transpose(-1, -2), shift, [], work,
                                         last=last, bands=True)
    sk = skew_keys(scores.transpose(-1, -2)[..., :min(STRIP, T)].double())
    diag = scores.diagonal(0, -2, -1).double().sum(-1)
    return UpperStats(tuple(whole), sk, diag, bands)


class UpperSums:
    """Track A's running upper-triangle state (on the reducer's device, float64): per
    sequence the whole triangle, its bands and the diagonal sum. Each ``*_sums`` method
    returns ``(S1, Σ A², n(Δ))`` for :func:`poskernel_tl.fit.toeplitz.r2_two_sided`."""

    def __init__(self, n_seqs: int, n_layers: int, n_heads: int, length: int, device,
                 counts: Float[Tensor, "layer 1 lag"]):
        """``counts``: per layer, n(Δ) of its lower side: a two-sided mask is symmetric,
        so the upper side's n(−Δ) are the same (0 past a window)."""
        f64 = dict(dtype=torch.float64, device=device)
        T = self.T = length
        self.counts = counts
        self.s1 = torch.zeros(n_seqs, n_layers, n_heads, T - 1, **f64)
        self.sq = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.diag = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.bands = torch.zeros(n_seqs, n_layers, n_heads, len(band_ends(T)), **f64)

    def store(self, batch, st: UpperStats) -> None:
        """Keep one :class:`~poskernel_tl.reducers.base.LayerBatch`'s sums."""
        for state, value in ((self.s1, st.whole[0]), (self.sq, st.whole[1]),
                             (self.diag, st.diag), (self.bands, st.bands)):
            batch.put(state, value)

    def per_seq_sums(self, sel: Tensor | slice, layer: int | None = None) -> Sums:
        """Per sequence (``sel``: sequences; ``layer``: that layer's only), the lags past a
        window zeroed."""
        if layer is None:
            return self.s1[sel] * (self.counts > 0), self.sq[sel], self.counts
        counts = self.counts[layer, 0]
        return self.s1[sel, layer] * (counts > 0), self.sq[sel, layer], counts

    def pooled_sums(self, sel: Tensor | slice, n: float) -> Sums:
        return self.s1[sel].sum(0) * (self.counts > 0), self.sq[sel].sum(0), self.counts * n

    def self_means(self, sel: Tensor | slice) -> tuple[Float[Tensor, "n_seqs layer head_index"],
                                                Float[Tensor, "layer head_index"]]:
        """The diagonal's mean (Δ = 0) per sequence and pooled over ``sel``."""
        per_seq = self.diag[sel] / self.T
        return per_seq, per_seq.mean(0)


__all__ = ["UpperStats", "UpperSums", "diagonal_sum", "mirrored", "per_query_head", "sides",
           "upper_stats", "upper_stats_from_scores"]

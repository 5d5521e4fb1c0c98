"""Track A: shift-invariance of the raw per-sequence logits (seed Phase 3).

Per evaluation sequence x and (layer, head) it keeps the per-lag sums S1_x(Δ) and the
total sum of squares of the strictly lower triangle of A_x = q·kᵀ·scale, in a few
passes over A (:func:`poskernel_tl.fit.toeplitz.lower_lag_stats`). From those:
per-sequence R²_x and g_x(Δ); the pooled R² (all sequences' entries fitted by one g);
five random 80/20 subsets of the pooled fit; the fit restricted to query rows 1–20 vs
50+ (boundary effect) and to the interior sub-matrix A[50:, 50:] (boundary keys left out
too); and every fit again with the key column s = 0 (the attention sink) left out.

Two sources of the same sums: ``source="lags"`` (default) forms them from q/k without the
T×T logits (:mod:`poskernel_tl.reducers.lag_sums`: FFT cross-correlation, running key
moment, the strip of keys s < 50) and never reads ``batch.scores``; ``source="scores"``
sweeps the materialised logits ``batch.scores`` (``hook_attn_scores`` or q·kᵀ).

``causal=False`` (bidirectional encoders) fits every off-diagonal entry instead: the upper
triangle's sums (:mod:`poskernel_tl.reducers.two_sided`) join the lower triangle's in
every fit, one g per signed lag. The lag arrays keep Δ = 1..T−1; the other side is in
``g_per_seq_back``/``g_pooled_back`` (index j ↔ Δ = −(j+1)) and the diagonal's mean
(Δ = 0, not fitted) in ``g_per_seq_self``/``g_pooled_self``. Every variant is two-sided:
no-sink leaves out key column 0 (lower triangle only: the upper one never holds key 0),
query rows 1–20 and ≥ 50 and the interior A[50:, 50:] take both triangles of their rows.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.errors import NonFiniteError, ResultFileError
from poskernel_tl.fit.bands import band_fits
from poskernel_tl.fit.toeplitz import (
    Sums,
    kept_finite,
    key_block_counts,
    lag_counts,
    lag_means,
    layer_lag_counts,
    lower_lag_stats,
    lower_mean_from_qk,
    r2_two_sided,
    sym_antisym,
    two_sided,
    upper_lag_counts,
)
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.protocol import (
    EARLY_ROWS,
    INTERIOR_FROM,
    N_SPLITS,
    SPLIT_FRACTION,
    band_ends,
    offset_bands,
)
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.lag_sums import DEFAULT_CHUNK, track_a_stats, windowed
from poskernel_tl.reducers.two_sided import (
    UpperSums,
    check_two_sided,
    sides,
    upper_stats,
    upper_stats_from_scores,
)
from poskernel_tl.schema import TABLE_ROWS, Part, column, stored


@dataclass
class TrackAResult(Part):
    """Track A of one condition; where each field is saved is declared on it."""

    NAME = "track_a"
    seq_index: Int[np.ndarray, " n_seqs"]  # positions within the pass (not saved)
    r2_per_seq: Float[np.ndarray, "n_seqs layer head_index"] = column("trackA", "R2_per_seq")
    r2_pooled: Float[np.ndarray, "layer head_index"] = column("trackA", "R2_pooled",
                                                               finite=True)
    r2_per_seq_nosink: Float[np.ndarray, "n_seqs layer head_index"] = column(
        "trackA", "R2_per_seq_nosink")
    g_per_seq: Float[np.ndarray, "n_seqs layer head_index lag"] = stored(  # float32
        "g.npz", "trackA_per_seq")
    r2_pooled_nosink: Float[np.ndarray, "layer head_index"] = column("trackA",
                                                                      "R2_pooled_nosink")
    # NaN past a sliding window's last kept offset (no entry there to fit)
    g_pooled: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "trackA_pooled")
    r2_pooled_early: Float[np.ndarray, "layer head_index"] = column("trackA",
                                                                     "R2_pooled_early")
    r2_pooled_interior: Float[np.ndarray, "layer head_index"] = column(
        "trackA", "R2_pooled_interior")
    r2_pooled_interior_keys: Float[np.ndarray, "layer head_index"] = column(
        "trackA", "R2_pooled_interior_keys")
    r2_split: Float[np.ndarray, "split layer head_index"] = stored("g.npz", "r2_split")
    # a model with sliding-window layers: the pooled fit over the whole causal triangle,
    # the logits the window removes included (a diagnostic; None without a window)
    r2_pooled_whole: Float[np.ndarray, "layer head_index"] | None = column(
        "trackA", "R2_pooled_whole", default=None)
    # bidirectional models only (None for causal ones): Δ = −1..−(T−1) and Δ = 0
    g_per_seq_back: Float[np.ndarray, "n_seqs layer head_index lag"] | None = stored(
        "g.npz", "trackA_per_seq_back", default=None)  # float32
    g_pooled_back: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "g.npz", "trackA_pooled_back", finite=True, default=None)
    g_per_seq_self: Float[np.ndarray, "n_seqs layer head_index"] | None = stored(
        "g.npz", "trackA_per_seq_self", default=None)
    g_pooled_self: Float[np.ndarray, "layer head_index"] | None = stored(
        "g.npz", "trackA_pooled_self", default=None)
    # the key column s = 0 (the attention sink) by query row t = Δ, pooled mean of A[Δ, 0]
    # (NaN past a window's last kept offset)
    g_sink: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "g.npz", "trackA_sink", default=None)
    # the fits restricted to offset bands (protocol.offset_bands; bounds inclusive; a band
    # past a layer's window is NaN, one that reaches past it holds the kept offsets only)
    band_lo: Int[np.ndarray, " band"] | None = column("bands", "band_lo", default=None)
    band_hi: Int[np.ndarray, " band"] | None = column("bands", "band_hi", default=None)
    r2_band_pooled: Float[np.ndarray, "band layer head_index"] | None = column(
        "bands", "R2_pooled", default=None)
    r2_band_per_seq: Float[np.ndarray, "band layer head_index"] | None = column(
        "bands", "R2_per_seq_mean", default=None)  # the mean over sequences

    @property
    def r2_split_mean(self) -> Float[np.ndarray, "layer head_index"]:
        return self.r2_split.mean(0)

    @property
    def r2_split_std(self) -> Float[np.ndarray, "layer head_index"]:
        return self.r2_split.std(0, ddof=1) if len(self.r2_split) > 1 else \
            np.full(self.r2_pooled.shape, np.nan)

    def columns(self, table: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
        """The saved columns and, per head, the per-sequence and split mean and std."""
        cols = super().columns(table, dims)
        if table == "trackA":
            n = len(self.r2_per_seq)
            shape = tuple(dims[a] for a in TABLE_ROWS["trackA"])
            each = lambda x: np.broadcast_to(x[None], shape).ravel()
            cols["R2_per_seq_mean"] = each(np.nanmean(self.r2_per_seq, axis=0))
            cols["R2_per_seq_std"] = each(np.nanstd(self.r2_per_seq, axis=0, ddof=1)) \
                if n > 1 else np.nan
            cols["R2_split_mean"] = each(self.r2_split_mean)
            cols["R2_split_std"] = each(self.r2_split_std)
            if self.g_pooled_back is not None:  # bidirectional: asymmetry of g
                cols["asym_A"] = each(self.asymmetry())
                cols["asym_A_per_seq"] = sym_antisym(two_sided(
                    self.g_per_seq, self.g_per_seq_back))[2].ravel()
        return cols

    def check(self, dims: dict[str, int], where: object = "", unchecked=()) -> dict[str, int]:
        dims = super().check(dims, where, unchecked)
        if not kept_finite(self.g_pooled):  # NaN only past a sliding window's last offset
            raise ResultFileError(f"{where}: g_pooled holds NaN/inf")
        return dims

    def asymmetry(self) -> Float[np.ndarray, "layer head_index"]:
        """Per head, the share of the pooled two-sided g's variance that is antisymmetric
        (:func:`~poskernel_tl.fit.toeplitz.sym_antisym`); NaN for a causal result."""
        if self.g_pooled_back is None:
            return np.full(self.r2_pooled.shape, np.nan)
        return sym_antisym(two_sided(self.g_pooled, self.g_pooled_back))[2]


# the memory plan's estimates (a test checks them against measured peaks at two lengths):
# float64 [head, T, d_head]-sized buffers of the lag-sum work per sequence of a batch
# (FFTs of q and k padded to 2T, their spectra, the chunked moments), and the
# [n_eval, layer, head, T] float64 arrays the result holds at once
LAG_COPIES = 12
RESULT_COPIES = 2


def state_bytes(model: LoadedModel, length: int, n_seqs: int) -> int:
    """Track A's per-sequence lag sums of ``n_seqs`` sequences (float64, per side a fit
    reads): what it holds through the pass, and its result a like array."""
    s = model.spec
    return sides(model) * n_seqs * s.n_layers * s.n_heads * length * 8


def work_bytes(model: LoadedModel, length: int) -> int:
    """Track A's transient bytes per sequence of a batch (:data:`LAG_COPIES`)."""
    s = model.spec
    return LAG_COPIES * s.n_heads * length * s.d_head * 8 * sides(model)


class TrackAReducer:
    def __init__(self, n_seqs: int, n_layers: int, n_heads: int, length: int,
                 device: torch.device | str = "cpu", seed: int = 0,
                 source: Literal["lags", "scores"] = "lags", chunk: int = DEFAULT_CHUNK,
                 causal: bool = True, max_lags: list[int] | None = None):
        """``max_lags``: per layer, the last offset Δ its mask keeps (a sliding window;
        None: every layer's whole triangle). Every fit of a layer then reads only the
        entries with Δ ≤ its max_lag, and its g is NaN past it."""
        if source not in ("lags", "scores"):
            raise ValueError(f"source={source!r}: choose 'lags' or 'scores'")
        if max_lags is not None and not causal:
            raise ValueError("a sliding window on a bidirectional model is not supported")
        T = length
        self.max_lags = [T - 1] * n_layers if max_lags is None else list(max_lags)
        self.counts = layer_lag_counts(T, max_lags, n_layers, device=device)
        self.kept = (self.counts > 0).double()  # [layer, 1, lag]: the lags a window keeps
        self.source, self.chunk = source, chunk
        f64 = dict(dtype=torch.float64, device=device)
        self.T, self.n_layers, self.n_heads, self.seed = T, n_layers, n_heads, seed
        # per sequence: the lag sums of every lag (subsets: splits, the null's sequences),
        # Σ A² over what each layer's mask keeps (and over the whole triangle, where a
        # window removes some), and the per-sequence R² with and without the sink
        self.s1 = torch.zeros(n_seqs, n_layers, n_heads, T - 1, **f64)
        self.sq = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.bands = torch.zeros(n_seqs, n_layers, n_heads, len(band_ends(T)), **f64)
        self.sq_whole = None if max_lags is None or min(max_lags) >= T - 1 else \
            torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.r2_seq = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.r2_seq_nosink = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.sink_s1 = torch.zeros(n_layers, n_heads, T - 1, **f64)  # Σ_x A_x[Δ, 0]
        self.sink_sq = torch.zeros(n_layers, n_heads, **f64)
        self.early_s1 = torch.zeros(n_layers, n_heads, T - 1, **f64)
        self.early_sq = torch.zeros(n_layers, n_heads, **f64)
        self.late_s1 = torch.zeros(n_layers, n_heads, T - 1, **f64)
        self.late_sq = torch.zeros(n_layers, n_heads, **f64)
        self.rect_s1 = torch.zeros(n_layers, n_heads, T - 1, **f64)  # keys < 50, rows ≥ 50
        self.rect_sq = torch.zeros(n_layers, n_heads, **f64)
        self.nonfinite = torch.zeros(n_seqs, n_layers, n_heads, dtype=torch.int64,
                                     device=device)
        self.seen = torch.zeros(n_seqs, dtype=torch.bool, device=device)
        # bidirectional: the upper triangle's sums too
        self.upper = None if causal else UpperSums(n_seqs, n_layers, n_heads, T, device)

    def update(self, batch: LayerBatch) -> None:
        L, idx = batch.layer, batch.index
        bad_k = (~torch.isfinite(batch.k)).sum(dim=(1, 3))  # [batch, kv_head_index]
        bad = (~torch.isfinite(batch.q)).sum(dim=(1, 3)) + \
            bad_k.repeat_interleave(batch.group, dim=1)
        self.nonfinite[idx, L] += bad
        if self.source == "lags" and batch.streams:
            self._update_from_lags(batch)
        else:  # the reference path, and logits that are no bilinear form of q and k
            self._update_from_scores(batch)
        self.seen[idx] = True

    def _update_from_lags(self, batch: LayerBatch) -> None:
        """The sums from q/k directly (:func:`~poskernel_tl.reducers.lag_sums.track_a_stats`)."""
        q, k = batch.logit_qk
        st = track_a_stats(q, k, batch.scale, self.chunk, self.max_lags[batch.layer])
        if self.upper is not None:
            self.upper.store(batch.layer, batch.index, upper_stats(q, k, batch.scale, self.chunk))
        if self.sq_whole is not None:
            self.sq_whole[batch.index, batch.layer] = st.sq_whole
        self._store(batch.layer, batch.index, (st.s1, st.sq), st.sink, st.early, st.middle,
                    st.corner, st.bands)

    def _store(self, L: int, idx: Tensor, whole: tuple[Tensor, Tensor], col0: Tensor,
               early: tuple[Tensor, Tensor], middle: tuple[Tensor, Tensor],
               corner: tuple[Tensor, Tensor], bands: Tensor) -> None:
        """Keep one batch's sums (the upper triangle's already stored): per sequence the
        whole triangle (``s1`` of every lag, ``sq`` of what the mask keeps) and its R²
        with and without the sink column (``col0[..., Δ−1] = A[Δ, 0]``); summed over the
        batch, the sink column, query rows [1, 21), rows ≥ 50 (whole − rows [1, 21) − rows
        [21, 50)) and rows ≥ 50 with keys < 50; per sequence Σ A² of each band of offsets."""
        (s1, sq), (e1, esq), (m1, msq) = whole, early, middle
        col0_sq = (col0 * col0).sum(-1)
        self.s1[idx, L], self.sq[idx, L], self.bands[idx, L] = s1, sq, bands
        s1 = s1 * self.kept[L, 0]  # the lags the window keeps
        counts = self.counts[L, 0]
        back = None if self.upper is None else self.upper.per_seq_sums((idx, L))
        self.r2_seq[idx, L] = r2_two_sided((s1, sq, counts), back, warn=False)[0]
        self.r2_seq_nosink[idx, L] = r2_two_sided((s1 - col0, sq - col0_sq,
                                                   (counts - 1).clamp(min=0)),
                                                  back, warn=False)[0]
        self.sink_s1[L] += col0.sum(0)
        self.sink_sq[L] += col0_sq.sum(0)
        self.early_s1[L] += e1.sum(0)
        self.early_sq[L] += esq.sum(0)
        self.late_s1[L] += (s1 - e1 - m1).sum(0)
        self.late_sq[L] += (sq - esq - msq).sum(0)
        self.rect_s1[L] += corner[0].sum(0)
        self.rect_sq[L] += corner[1].sum(0)

    def _update_from_scores(self, batch: LayerBatch) -> None:
        """The sums from the materialised logits ``batch.scores`` (the reference path)."""
        L, idx = batch.layer, batch.index
        # the whole lower triangle, plus query-row blocks [1, 21) and [21, 50); rows ≥ 50
        # are the rest (row 0 has no key before it)
        q, k = batch.logit_qk
        shift = lower_mean_from_qk(q, k, batch.scale)  # any shift is exact; near the mean
        A = batch.scores
        work = batch.workspace.get("track_a", (A.shape[0], A.shape[1], 2 * self.T, self.T),
                                   A, zero=True)  # lower half stays zero
        (s1, sq, bands), [(e1, esq), (m1, msq), (r1, rsq)] = lower_lag_stats(
            A, shift, [EARLY_ROWS, (EARLY_ROWS[1], INTERIOR_FROM)], work,
            key_block=(INTERIOR_FROM, INTERIOR_FROM), max_lag=self.max_lags[L], bands=True)
        if self.sq_whole is not None:  # every lag's sums, and Σ A² of the whole triangle
            (s1, self.sq_whole[idx, L]), _ = lower_lag_stats(A, shift, [], work)
        if self.upper is not None:
            check_two_sided(q.shape[2], k.shape[2])
            self.upper.store(L, idx, upper_stats_from_scores(A, q, k, batch.scale, work))
        # key s = 0 (the attention sink) for query rows t = 1..T-1, i.e. lag Δ = t
        self._store(L, idx, (s1, sq), windowed(A[:, :, 1:, 0].double(), self.max_lags[L]),
                    (e1, esq), (m1, msq), (r1, rsq), bands)

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteError` naming the first bad (sequence, layer, head).
        One host sync; the runner calls it once per batch."""
        if int(self.nonfinite.sum()) == 0:
            return
        seq, layer, head = (int(i) for i in torch.nonzero(self.nonfinite)[0])
        raise NonFiniteError(
            f"non-finite q/k at layer {layer}, head {head}, eval sequence {seq}: "
            "run in float32 (--dtype float32) instead of half precision"
        )

    # ----------------------------------------------------------------- results

    @staticmethod
    def _block_r2(front: Sums, back: Sums | None, n: int) -> Tensor:
        """Pooled R² of a block of entries over ``n`` sequences (both sides' sums, n(Δ) of
        one sequence); NaN when T is too short to have it."""
        counts = front[2] if back is None else torch.cat(
            torch.broadcast_tensors(front[2], back[2].to(front[2].device)), -1)
        if (counts > 0).sum() < 2 or counts.sum() < 3:
            return torch.full(front[1].shape, float("nan"), dtype=torch.float64)
        times = lambda x: None if x is None else (x[0], x[1], x[2] * n)
        return r2_two_sided(times(front), times(back))[0]

    def _selection(self, rows: Tensor | None) -> tuple[Tensor | slice, float]:
        """The sequences to read: ``rows``, else every one seen — as a slice when all were
        seen, so that reading [n, layer, head, lag] state makes a view, not a copy."""
        if rows is None:
            return self._seen_sel(), float(self.seen.sum())
        return rows, float(rows.sum()) if rows.dtype == torch.bool else float(len(rows))

    def _seen_sel(self) -> Tensor | slice:
        return slice(None) if bool(self.seen.all()) else self.seen

    def pooled_fit(self, rows: Tensor | None = None, sink: bool = True):
        """Pooled R², g and (bidirectional; else None) g_back over the sequences ``rows``
        (default: all seen; ``sink=False``, key column 0 left out: all seen only)."""
        if not sink and rows is not None:
            raise ValueError("the no-sink fit is kept for all sequences seen, not subsets")
        sel, n = self._selection(rows)
        s1 = self.s1[sel].sum(0) * self.kept
        sq = self.sq[sel].sum(0)
        counts = self.counts
        if not sink:  # key 0 holds one entry of each kept lag
            s1, sq, counts = s1 - self.sink_s1, sq - self.sink_sq, (counts - 1).clamp(min=0)
        back = None if self.upper is None else self.upper.pooled_sums(sel, n)
        return r2_two_sided((s1, sq, counts * n), back)

    def pooled(self, rows: Tensor | None = None, sink: bool = True):
        """Pooled R² and g (Δ = 1..T−1) over the sequences ``rows`` (default: all seen);
        two-sided R² for a bidirectional reducer (:meth:`pooled_fit` has its g_back)."""
        return self.pooled_fit(rows, sink)[:2]

    def _row_fits(self, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """Pooled R² of query rows [1, 21), rows ≥ 50 and the interior A[50:, 50:]."""
        T, up, L = self.T, self.upper, self.n_layers
        dev = self.s1.device
        early = (self.early_s1, self.early_sq,
                 layer_lag_counts(T, self.max_lags, L, *EARLY_ROWS, device=dev))
        late_counts = layer_lag_counts(T, self.max_lags, L, INTERIOR_FROM, device=dev)
        late = (self.late_s1, self.late_sq, late_counts)
        corner = torch.stack([key_block_counts(T, INTERIOR_FROM, INTERIOR_FROM, dev, m)
                              for m in self.max_lags])[:, None]
        inner = (self.late_s1 - self.rect_s1, self.late_sq - self.rect_sq,
                 late_counts - corner)
        late_back = None if up is None else up.late_sums()
        return (self._block_r2(early, None if up is None else up.early_sums(), n),
                self._block_r2(late, late_back, n), self._block_r2(inner, late_back, n))

    @staticmethod
    def _per_seq_g(s1: Tensor, seen: Tensor | slice, counts: Tensor
                   ) -> Float[np.ndarray, "n_seqs layer head_index lag"]:
        """Per-sequence g = S1 / n(Δ) as float32 (as saved), one layer at a time, so no
        float64 copy of the [n, layer, head, lag] state is made."""
        first = s1[seen, 0]
        out = np.empty((first.shape[0], *s1.shape[1:]), dtype=np.float32)
        for L in range(s1.shape[1]):  # one layer's copy at a time, also for a mask
            out[:, L] = lag_means(s1[seen, L], counts[L, 0]).float().cpu().numpy()
        return out

    def result(self) -> TrackAResult:
        seen, T, up = self._seen_sel(), self.T, self.upper
        dev = self.s1.device
        g_seq = self._per_seq_g(self.s1, seen, self.counts)
        r2_pool, g_pool, g_pool_back = self.pooled_fit()
        r2_pool_ns, _ = self.pooled(sink=False)
        r2_early, r2_late, r2_inner = self._row_fits(int(self.seen.sum()))
        rng = np.random.default_rng(self.seed)
        seen_idx = torch.nonzero(self.seen).flatten().cpu().numpy()
        k = max(1, int(round(SPLIT_FRACTION * len(seen_idx))))
        splits = []
        for _ in range(N_SPLITS):
            rows = torch.as_tensor(np.sort(rng.choice(seen_idx, size=k, replace=False)),
                                   device=dev)
            splits.append(self.pooled(rows)[0])
        cpu = lambda t: None if t is None else t.detach().cpu().numpy()
        whole = None
        if self.sq_whole is not None:  # every lag, over every entry of the causal triangle
            whole = r2_two_sided((self.s1[seen].sum(0), self.sq_whole[seen].sum(0),
                                  lag_counts(T, device=dev) * int(self.seen.sum())), None)[0]
        sides = {}
        if up is not None:
            g_self, g_pool_self = up.self_means(seen)
            g_back = self._per_seq_g(up.s1, seen, upper_lag_counts(T, device=dev).expand(
                self.n_layers, 1, -1))
            sides = dict(g_per_seq_back=g_back, g_pooled_back=cpu(g_pool_back),
                         g_per_seq_self=cpu(g_self), g_pooled_self=cpu(g_pool_self))
        back = None if up is None else (up.s1[seen], up.per_seq_sums(seen)[2], up.bands[seen])
        band_pooled, band_per_seq = band_fits(self.s1[seen], self.bands[seen], self.counts,
                                              T, back)
        n_seen = int(self.seen.sum())
        g_sink = torch.where(self.counts > 0, self.sink_s1 / max(n_seen, 1), float("nan"))
        lo, hi = zip(*offset_bands(T))
        return TrackAResult(
            band_lo=np.array(lo), band_hi=np.array(hi), r2_band_pooled=cpu(band_pooled),
            r2_band_per_seq=cpu(band_per_seq), g_sink=cpu(g_sink), seq_index=seen_idx,
            r2_per_seq=cpu(self.r2_seq[seen]),
            r2_per_seq_nosink=cpu(self.r2_seq_nosink[seen]), g_per_seq=g_seq,
            r2_pooled=cpu(r2_pool),
            r2_pooled_nosink=cpu(r2_pool_ns), g_pooled=cpu(g_pool),
            r2_pooled_early=cpu(r2_early), r2_pooled_interior=cpu(r2_late),
            r2_pooled_interior_keys=cpu(r2_inner), r2_split=cpu(torch.stack(splits)),
            r2_pooled_whole=cpu(whole), **sides)

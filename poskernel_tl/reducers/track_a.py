"""Track A: shift-invariance of the raw per-sequence logits (seed Phase 3).

Per evaluation sequence x and (layer, head) it keeps the per-lag sums S1_x(Δ) and the
total sum of squares of the strictly lower triangle of A_x = q·kᵀ·scale. From those:
per-sequence R²_x and g_x(Δ); the pooled R² (all sequences' entries fitted by one g);
five random 80/20 subsets of the pooled fit. Its variants — the same fit over a region
of the logits: query rows 1–20 vs 50+ (boundary effect), the interior sub-matrix
A[50:, 50:] (boundary keys left out too), the key column s = 0 (the attention sink) left
out — are declared on :class:`~poskernel_tl.reducers.track_a_result.TrackAResult`'s fields (a
field and its region, the one place a variant is defined); the reducer keeps
each region's sums (:func:`~poskernel_tl.fit.variants.region_sums`), pooled over the
sequences, and per sequence for a per-sequence field.

Two sources of the same sums: ``source="lags"`` (default) forms them from q/k without the
T×T logits (:mod:`poskernel_tl.reducers.lag_sums`: FFT cross-correlation, running key
moment, the strip of keys s < 50) and never reads ``batch.scores``; ``source="scores"``
sweeps the materialised logits ``batch.scores`` (``hook_attn_scores`` or q·kᵀ).

``causal=False`` (bidirectional encoders) fits every off-diagonal entry instead: the upper
triangle's sums (:mod:`poskernel_tl.reducers.two_sided`) join the lower triangle's in
every fit, one g per signed lag. The lag arrays keep Δ = 1..T−1; the other side is in
``g_per_seq_back``/``g_pooled_back`` (index j ↔ Δ = −(j+1)) and the diagonal's mean
(Δ = 0, not fitted) in ``g_per_seq_self``/``g_pooled_self``. Every variant is two-sided:
a region takes both triangles' entries in it (no-sink: the upper triangle never holds key
0; rows 1–20 and ≥ 50 and the interior A[50:, 50:] take both triangles of their rows).
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.errors import NonFiniteError
from poskernel_tl.fit.bands import band_fits
from poskernel_tl.fit.counts import lag_counts, layer_lag_counts
from poskernel_tl.fit.toeplitz import lag_means, lower_lag_stats, lower_mean_from_qk, r2_two_sided
from poskernel_tl.fit.variants import (
    Variant,
    region_sums,
    strip_bytes,
)
from poskernel_tl.mask import Mask, shared
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.protocol import (
    N_SPLITS,
    SPLIT_FRACTION,
    band_ends,
    offset_bands,
)
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.lag_sums import DEFAULT_CHUNK, skew_keys, track_a_stats
from poskernel_tl.reducers.tile_sums import track_a_tile_rows, upper_tile_stats
from poskernel_tl.reducers.track_a_result import (
    PER_SEQ,
    REGIONS,
    SINK_COLUMN,
    STRIP,
    VARIANTS,
    TrackAResult,
)
from poskernel_tl.reducers.two_sided import (
    UpperStats,
    UpperSums,
    sides,
    upper_stats,
    upper_stats_from_scores,
)

# the memory plan's estimates (a test checks them against measured peaks at two lengths):
# float64 [head, T, d_head]-sized buffers of the lag-sum work per sequence of a batch
# (FFTs of q and k padded to 2T, their spectra, the chunked moments), and the
# [n_eval, layer, head, T] float64 arrays the result holds at once
LAG_COPIES = 10  # measured ≈ 4.8 (SmolLM2-shaped heads, T = 1024 and 2048; the strip apart)
RESULT_COPIES = 2


def state_bytes(model: LoadedModel, length: int, n_seqs: int) -> int:
    """Track A's per-sequence lag sums of ``n_seqs`` sequences (float64, per side a fit
    reads), and those of each region a per-sequence variant reads: what it holds through
    the pass, and its result a like array."""
    s = model.spec
    regions = len(dict.fromkeys(VARIANTS[f] for f in PER_SEQ))
    return (1 + regions) * sides(model) * n_seqs * s.n_layers * s.n_heads * length * 8


def work_bytes(model: LoadedModel, length: int) -> int:
    """Track A's transient bytes per sequence of a batch (:data:`LAG_COPIES`), and the
    strip its regions are read from (:data:`~poskernel_tl.reducers.track_a_result.STRIP`
    keys: :func:`~poskernel_tl.fit.variants.strip_bytes`), per side; q and k widened by
    a chunked mask that binds (:attr:`~poskernel_tl.models.geometry.Geometry.widening`)."""
    s = model.spec
    wide = Geometry.of(s, length).widening
    return (LAG_COPIES * s.n_heads * length * s.d_head * wide * 8 +
            strip_bytes(s.n_heads, length, STRIP)) * sides(model)


class TrackAReducer:
    def __init__(self, n_seqs: int, masks: Sequence[Mask], n_heads: int,
                 device: torch.device | str = "cpu", seed: int = 0,
                 source: Literal["lags", "scores"] = "lags", chunk: int = DEFAULT_CHUNK):
        """``masks``: per layer, the entries its softmax keeps
        (:attr:`~poskernel_tl.models.geometry.Geometry.masks`; the length and side they
        share are the reducer's). Every fit of a layer reads only the offsets Δ ≤ its
        mask's ``last`` (its g is NaN past it); where a chunk binds, its counts are the
        mask's, its sums are read from :attr:`~poskernel_tl.reducers.base.LayerBatch.kept_qk`,
        and its whole-triangle R² is NaN (the logits across chunks are not read)."""
        if source not in ("lags", "scores"):
            raise ValueError(f"source={source!r}: choose 'lags' or 'scores'")
        T, causal = shared(masks)
        self.masks, n_layers = list(masks), len(masks)
        self.counts = layer_lag_counts(self.masks, device=device)
        self.kept = (self.counts > 0).double()  # [layer, 1, lag]: the lags a window keeps
        self.source, self.chunk = source, chunk
        f64 = dict(dtype=torch.float64, device=device)
        self.T, self.n_layers, self.n_heads, self.seed = T, n_layers, n_heads, seed
        # per sequence: the lag sums of every lag (subsets: splits, the null's sequences),
        # Σ A² over what each layer's mask keeps (and over the whole triangle, where a
        # window removes some), Σ A² per band of offsets (each its own tensor: the pooled
        # sums over the sequences read them contiguous)
        self.s1 = torch.zeros(n_seqs, n_layers, n_heads, T - 1, **f64)
        self.sq = torch.zeros(n_seqs, n_layers, n_heads, **f64)
        self.bands = torch.zeros(n_seqs, n_layers, n_heads, len(band_ends(T)), **f64)
        self.sq_whole = None if all(m.window_last is None for m in self.masks) else \
            torch.zeros(n_seqs, n_layers, n_heads, **f64)
        # every region a variant (or g_sink) reads: its sums pooled over the sequences
        # (lower side, and upper for a bidirectional model), its n(Δ) per layer; one
        # tensor [region, side, layer, head, S1 of every lag then Σ A²]
        self.regions = list(REGIONS)
        self.region_stack = torch.zeros(len(self.regions), 2, n_layers, n_heads, T, **f64)
        self.region_s1 = {v: self.region_stack[r, ..., :T - 1]
                          for r, v in enumerate(self.regions)}
        self.region_sq = {v: self.region_stack[r, ..., T - 1]
                          for r, v in enumerate(self.regions)}
        self.region_counts = {v: torch.stack([v.counts(T, m.last, device=device,
                                                        chunk=m.chunk) for m in self.masks]
                                             )[:, None]
                              for v in self.regions}
        self.upper_counts = {v: torch.stack([v.counts(T, m.last, upper=True, device=device)
                                             for m in self.masks])[:, None]
                             for v in self.regions}
        # the regions of the per-sequence variants: their sums per sequence and side
        # (S1 of every lag, Σ A²), fitted after the pass
        self.seq_regions = list(dict.fromkeys(VARIANTS[f] for f in PER_SEQ))
        self.seq_region_rows = {(v, side): torch.zeros(n_seqs, n_layers, n_heads, T, **f64)
                                for v in self.seq_regions for side in range(1 if causal else 2)}
        self.seq_region_sums = {key: (x[..., :T - 1], x[..., T - 1])
                                for key, x in self.seq_region_rows.items()}
        self._seen = np.zeros(n_seqs, dtype=bool)  # on the host: no device work per batch
        # bidirectional: the upper triangle's sums too
        self.upper = None if causal else UpperSums(n_seqs, n_layers, n_heads, T, device,
                                                   self.counts)

    GROUPED = True  # the tiles' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        path = batch.path(self.source)
        if batch.n_layers > 1 and path != "tiles":
            for one in batch.split():
                self.update(one)
            return
        {"tiles": self._update_from_tiles, "streamed": self._update_from_lags,
         "scores": self._update_from_scores}[path](batch)
        self._seen[list(batch.rows)] = True

    @property
    def seen(self) -> Tensor:
        """Which sequences of the pass were fed (bool, on the state's device)."""
        return torch.as_tensor(self._seen, device=self.s1.device)

    def _update_from_lags(self, batch: LayerBatch) -> None:
        """The sums from q/k directly (:func:`~poskernel_tl.reducers.lag_sums.track_a_stats`)."""
        q, k = batch.kept_qk
        last = self.masks[batch.layer].last
        st = track_a_stats(q, k, batch.scale, self.chunk, last)
        upper = None if self.upper is None else upper_stats(q, k, batch.scale, self.chunk,
                                                            last)
        self._store(batch, (st.s1, st.sq), st.bands, st.skewed, upper, st.sq_whole)

    def _update_from_tiles(self, batch: LayerBatch) -> None:
        """The same sums from the tiled kernels (:mod:`~poskernel_tl.reducers.tile_sums`;
        soft-capped layers too: the cap is applied on the tiles), every layer of a group
        at once, in a fixed number of operations: the rows of the per-sequence state and
        the regions' sums, each stored by one operation."""
        mask = self.masks[batch.layers[0]]  # (a group's layers share their mask)
        rows, regions = track_a_tile_rows(batch, mask.window_last, self.regions)
        T, n_bands = self.T, self.bands.shape[-1]
        batch.put(self.s1, rows[..., :T - 1])
        batch.put(self.sq, rows[..., T - 1])
        batch.put(self.bands, rows[..., T:T + n_bands])
        if self.sq_whole is not None:
            batch.put(self.sq_whole, rows[..., T + n_bands])
        self._store_regions(batch, 0, regions)
        if self.upper is not None:
            upper, regions = upper_tile_stats(batch, self.regions)
            self.upper.store(batch, upper)
            self._store_regions(batch, 1, regions)

    def _store_regions(self, batch: LayerBatch, side: int,
                       regions: Float[Tensor, "region batch head_index sums"]) -> None:
        """Every region's sums of one side (S1 of every lag, then Σ A²): summed over the
        batch into the pooled state, and per sequence for a per-sequence variant's."""
        batch.add(self.region_stack[:, side], regions.sum(1), lead=1)
        for v in self.seq_regions:
            batch.put(self.seq_region_rows[v, side], regions[self.regions.index(v)])

    def _update_from_scores(self, batch: LayerBatch) -> None:
        """The sums from the materialised logits ``batch.scores`` (the reference path)."""
        L = batch.layer
        q, k = batch.kept_qk
        shift = lower_mean_from_qk(q, k, batch.scale)  # any shift is exact; near the mean
        A = batch.scores
        work = batch.workspace.get("track_a", (A.shape[0], A.shape[1], 2 * self.T, self.T),
                                   A, zero=True)  # lower half stays zero
        (s1, sq, bands), _ = lower_lag_stats(A, shift, [], work, last=self.masks[L].last,
                                             bands=True)
        sq_whole = None
        if self.sq_whole is not None:  # every lag's sums, and Σ A² of the whole triangle
            (s1, sq_whole), _ = lower_lag_stats(A, shift, [], work)
        upper = None
        if self.upper is not None:
            upper = upper_stats_from_scores(A, q, k, batch.scale, work,
                                            self.masks[L].last)
        skewed = skew_keys(A[..., :min(STRIP, self.T)].double())
        self._store(batch, (s1, sq), bands, skewed, upper, sq_whole)

    def _store(self, batch: LayerBatch, whole: tuple[Tensor, Tensor], bands: Tensor,
               skewed: Tensor, upper: UpperStats | None, sq_whole: Tensor | None) -> None:
        """Keep one batch's sums (one layer: the CPU's and the reference paths): per
        sequence the whole triangle (``s1`` of every lag, ``sq`` of what the mask keeps,
        ``sq_whole`` of the whole triangle where a window removes some), its bands, and the
        sums of the per-sequence variants' regions; per region, its sums from the skewed
        strip summed over the batch. Every fit is made after the pass (:meth:`result`)."""
        L = batch.layer
        s1, sq = whole
        batch.put(self.s1, s1)
        batch.put(self.sq, sq)
        batch.put(self.bands, bands)
        if self.sq_whole is not None:  # a chunk's q·k across chunks is never read
            batch.put(self.sq_whole, torch.full_like(sq, float("nan"))
                      if self.masks[L].chunk is not None else sq_whole)
        if upper is not None:
            self.upper.store(batch, upper)
        kept = self.kept[L, 0]  # the lags the window keeps (on each side it keeps)
        sides = [(skewed, (s1 * kept, sq), False)] + ([] if upper is None else [
            (upper.skewed, (upper.whole[0] * kept, upper.whole[1]), True)])
        for side, (strip, sums, up) in enumerate(sides):
            for v in self.regions:
                r_s1, r_sq = region_sums(strip, v, sums, self.masks[L].last, upper=up)
                batch.add(self.region_s1[v][side], r_s1.sum(0))
                batch.add(self.region_sq[v][side], r_sq.sum(0))
                if v in self.seq_regions:
                    for state, value in zip(self.seq_region_sums[v, side], (r_s1, r_sq)):
                        batch.put(state, value)

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteError` naming the first (sequence, layer, head) whose sums
        are not finite: a non-finite q or k entered the logits the fits read. Reads the
        state once (a host sync): the measurement calls it after the pass, not per batch."""
        bad = ~torch.isfinite(self.sq)
        if self.upper is not None:
            bad |= ~torch.isfinite(self.upper.sq)
        if not bool(bad.any()):
            return
        seq, layer, head = (int(i) for i in torch.nonzero(bad)[0])
        raise NonFiniteError(
            f"non-finite q/k at layer {layer}, head {head}, eval sequence {seq}: "
            "run in float32 (--dtype float32) instead of half precision"
        )

    def per_seq_r2(self, seen: Tensor | slice) -> tuple[Tensor, dict[str, Tensor]]:
        """Each sequence's R² of the whole fit and of every per-sequence variant, from the
        kept sums, one layer at a time (float64 [n, layer, head_index])."""
        up = self.upper
        n = self.s1[seen].shape[0] if isinstance(seen, slice) else int(seen.sum())
        shape = (n, self.n_layers, self.n_heads)
        whole = torch.empty(shape, dtype=torch.float64)
        variants = {f: torch.empty(shape, dtype=torch.float64) for f in PER_SEQ}
        for L in range(self.n_layers):
            back = None if up is None else up.per_seq_sums(seen, L)
            whole[:, L] = r2_two_sided((self.s1[seen, L] * self.kept[L, 0], self.sq[seen, L],
                                        self.counts[L, 0]), back, warn=False)[0].cpu()
            for field in PER_SEQ:
                v = VARIANTS[field]
                front = self.seq_region_sums[v, 0]
                back = None if up is None else (*(x[seen, L] for x in self.seq_region_sums[v, 1]),
                                                self.upper_counts[v][L, 0])
                variants[field][:, L] = r2_two_sided(
                    (front[0][seen, L], front[1][seen, L], self.region_counts[v][L, 0]), back,
                    warn=False)[0].cpu()
        return whole, variants

    # ----------------------------------------------------------------- results

    def region_r2(self, v: Variant, n: int) -> Tensor:
        """Pooled R² of region ``v`` over the ``n`` sequences seen (both sides' sums);
        NaN when T is too short to have it."""
        front = (self.region_s1[v][0], self.region_sq[v][0], self.region_counts[v])
        back = None if self.upper is None else (self.region_s1[v][1], self.region_sq[v][1],
                                                self.upper_counts[v])
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

    def pooled_fit(self, rows: Tensor | None = None):
        """Pooled R², g and (bidirectional; else None) g_back over the sequences ``rows``
        (default: all seen)."""
        sel, n = self._selection(rows)
        s1 = self.s1[sel].sum(0) * self.kept
        sq = self.sq[sel].sum(0)
        back = None if self.upper is None else self.upper.pooled_sums(sel, n)
        return r2_two_sided((s1, sq, self.counts * n), back)

    def pooled(self, rows: Tensor | None = None):
        """Pooled R² and g (Δ = 1..T−1) over the sequences ``rows`` (default: all seen);
        two-sided R² for a bidirectional reducer (:meth:`pooled_fit` has its g_back)."""
        return self.pooled_fit(rows)[:2]

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
        dev, n_seen = self.s1.device, int(self.seen.sum())
        cpu = lambda t: None if t is None else t.detach().cpu().numpy()
        r2_pool, g_pool, g_pool_back = self.pooled_fit()
        r2_seq, per_seq = self.per_seq_r2(seen)
        variants = {f: cpu(per_seq[f]) if f in PER_SEQ else
                    cpu(self.region_r2(v, n_seen)) for f, v in VARIANTS.items()}
        seen_idx = np.flatnonzero(self._seen)
        whole = None
        if self.sq_whole is not None:  # every lag, over every entry of the causal triangle
            whole = r2_two_sided((self.s1[seen].sum(0), self.sq_whole[seen].sum(0),
                                  lag_counts(T, device=dev) * n_seen), None)[0]
        sides = {}
        if up is not None:
            g_self, g_pool_self = up.self_means(seen)
            g_back = self._per_seq_g(up.s1, seen, up.counts)
            sides = dict(g_per_seq_back=g_back, g_pooled_back=cpu(g_pool_back),
                         g_per_seq_self=cpu(g_self), g_pooled_self=cpu(g_pool_self))
        back = None if up is None else (up.s1[seen], up.counts, up.bands[seen])
        band_pooled, band_per_seq = band_fits(self.s1[seen], self.bands[seen], self.counts,
                                              T, back)
        g_sink = torch.where(self.counts > 0, self.region_s1[SINK_COLUMN][0] / max(n_seen, 1),
                             float("nan"))
        lo, hi = zip(*offset_bands(T))
        return TrackAResult(
            band_lo=np.array(lo), band_hi=np.array(hi), r2_band_pooled=cpu(band_pooled),
            r2_band_per_seq=cpu(band_per_seq), g_sink=cpu(g_sink), seq_index=seen_idx,
            r2_per_seq=cpu(r2_seq), g_per_seq=self._per_seq_g(
                self.s1, seen, self.counts), r2_pooled=cpu(r2_pool), g_pooled=cpu(g_pool),
            r2_split=cpu(self._splits(seen_idx)), r2_pooled_whole=cpu(whole), **variants,
            **sides)

    def _splits(self, seen_idx: np.ndarray) -> Tensor:
        """Pooled R² of :data:`~poskernel_tl.protocol.N_SPLITS` seeded random subsets of
        :data:`~poskernel_tl.protocol.SPLIT_FRACTION` of the sequences seen."""
        rng = np.random.default_rng(self.seed)
        k = max(1, int(round(SPLIT_FRACTION * len(seen_idx))))
        return torch.stack([self.pooled(torch.as_tensor(np.sort(
            rng.choice(seen_idx, size=k, replace=False)), device=self.s1.device))[0]
            for _ in range(N_SPLITS)])

"""Track A's within-row R²: the share of each row's variation that a lag kernel explains,
per sequence and pooled (:mod:`poskernel_tl.fit.within_row`).

Track A's R² fits the raw logits and so depends on a constant per row that the softmax
ignores (a query's norm, a content bias of the query, ALiBi's key-position form against
its offset form, a row maximum subtracted before the softmax). The within-row R² fits
A_x(t, s) ≈ g(Δ) + c_x(t) over the same kept entries — the whole kept triangle, both
sides of an encoder, a sliding window's offsets — and answers the question the softmax
asks: is what the head attends to, within each row, a function of the offset?

Per sequence and layer the reducer keeps, beside Track A's per-lag sums, the rows' kept
sums R(t) folded onto the offsets (u(Δ) = Σ_{t ∋ Δ} R(t)/m_t) and Σ_t R(t)²/m_t. R(t) is
scale·q_t·Σ_{s kept} k_s from running sums of the keys (the layer's additive terms folded
in as for Track A), or the materialised logits' rows on the reference path and for
soft-capped layers. The fit itself is solved once, after the pass (:func:`finish`).
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.within_row import RowLayout, match_mean, within_fit
from poskernel_tl.panels import KERNEL_SECTION, ORANGE, Panel
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, column, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec, mean_of


@dataclass
class WithinRow(Part):
    NAME = "within_row"
    PANELS = (Panel("number", "Track A within-row R² (pooled)", "r2_within_pooled"),
              Panel("curve", KERNEL_SECTION, "g_within", back="g_within_back",
                    plot="Track A g(Δ)", color=ORANGE,
                    name="within rows (a constant per row removed)"))
    r2_within_per_seq: Float[np.ndarray, "n_seqs layer head_index"] = column(
        "trackA", "R2_within_row_per_seq")
    r2_within_pooled: Float[np.ndarray, "layer head_index"] = column(
        "trackA", "R2_within_row_pooled")
    # the pooled within-row kernel g(Δ), Δ = 1..T−1, on the raw g's mean level (NaN past a
    # window); an encoder's other side, Δ = −1..−(T−1), in ``g_within_back``
    g_within: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "within_row.npz", "g_within", default=None)
    g_within_back: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "within_row.npz", "g_within_back", default=None)

    @property
    def R2_within_row_pooled(self) -> Float[np.ndarray, "layer head_index"]:  # noqa: N802
        return self.r2_within_pooled

    @property
    def R2_within_row_per_seq(self) -> Float[np.ndarray, "layer head_index"]:  # noqa: N802
        """The mean over sequences (``trackA.csv`` holds each sequence's)."""
        x = self.r2_within_per_seq
        n = np.isfinite(x).sum(0)
        return np.where(n > 0, np.nansum(x, axis=0) / np.maximum(n, 1), np.nan)


ROW_BLOCK = 256  # rows of the materialised logits masked at a time (a copy of that size)


def layouts(run: StatisticContext) -> list[RowLayout]:
    """Each layer's :class:`RowLayout` at the run's length."""
    g = run.geometry
    return [RowLayout.of(g.mask(L)) for L in range(g.n_layers)]


def row_sums(batch: LayerBatch, layout: RowLayout, source: str
             ) -> Float[Tensor, "batch head_index query_pos"]:
    """R(t): each row's sum over the entries its mask keeps, float64 (``source``: the run's,
    "lags" or "scores": :meth:`~poskernel_tl.reducers.base.LayerBatch.path`)."""
    T, W = layout.T, layout.last
    if batch.path(source, tiles=False) == "scores":  # the materialised logits, in blocks
        A, t, mask = batch.scores, torch.arange(T, device=batch.q.device), layout.mask
        out = torch.empty(*A.shape[:2], T, dtype=torch.float64, device=A.device)
        for lo in range(0, T, ROW_BLOCK):
            keep = mask.kept(t[lo:lo + ROW_BLOCK], t)
            out[..., lo:lo + ROW_BLOCK] = torch.where(keep, A[..., lo:lo + ROW_BLOCK, :], 0
                                                      ).sum(-1, dtype=torch.float64)
        return out
    q, k = batch.kept_qk  # (0 across a chunked mask's chunks)
    keys = torch.cumsum(k, 1, dtype=torch.float64)  # Σ_{s ≤ t} k_s
    if layout.two_sided and layout.windowed:  # Σ_{t − W ≤ s ≤ t + W, s ≠ t} k_s
        t = torch.arange(T, device=k.device)
        before = F.pad(keys, (0, 0, 0, 0, 1, 0))[:, torch.clamp(t - W, min=0)]
        keys = keys[:, torch.clamp(t + W, max=T - 1)] - before - k
    elif layout.two_sided:
        keys = keys[:, -1:] - k  # every key but t's own
    else:
        keys -= k  # Σ_{s < t} k_s
        if W < T - 1:
            keys[:, W:] -= keys[:, :T - W].clone()
    b, _, kv, d = k.shape
    rows = torch.matmul(q.reshape(b, T, kv, -1, d).to(keys.dtype), keys[..., None])
    return rows.reshape(b, T, -1).transpose(1, 2) * batch.scale


class WithinRowReducer:
    GROUPED = True  # a group of layers of one kind is one batch

    def __init__(self, run: StatisticContext):
        s = run.spec
        self.layouts = layouts(run)
        self.source = run.source
        n_lags = self.layouts[0].n_lags
        f64 = dict(dtype=torch.float64, device=run.device)
        self.u = torch.zeros(run.n_eval, s.n_layers, s.n_heads, n_lags, **f64)
        self.row_sq = torch.zeros(run.n_eval, s.n_layers, s.n_heads, **f64)

    def update(self, batch: LayerBatch) -> None:
        layout = self.layouts[batch.layers[0]]  # (a group's layers share their mask)
        if batch.n_layers > 1 and batch.path(self.source, tiles=False) == "scores":
            for one in batch.split():
                self.update(one)
            return
        u, row_sq = layout.row_terms(row_sums(batch, layout, self.source))
        batch.put(self.u, u)
        batch.put(self.row_sq, row_sq)

    def result(self) -> WithinRow:  # completed by :func:`finish` from Track A's sums
        return WithinRow(np.zeros((0, *self.row_sq.shape[1:])),
                         np.full(self.row_sq.shape[1:], np.nan))


def finish(part: WithinRow, reducers, run: StatisticContext) -> WithinRow:
    """Both R² from Track A's per-lag sums and Σ A² (its sequences seen) and the rows':
    each sequence's fit and the pooled one solved together, layer by layer; the pooled
    fit's g on the raw g's level."""
    track_a, mine = reducers["track_a"], reducers["within_row"]
    seen = track_a.seen
    n = int(seen.sum())
    out = torch.full((n + 1, *mine.row_sq.shape[1:]), float("nan"), dtype=torch.float64)
    g = torch.full(mine.u.shape[1:], float("nan"), dtype=torch.float64)
    counts = torch.ones(n + 1, 1, dtype=torch.float64, device=mine.u.device)
    counts[n] = n  # the last fit pools every sequence
    for L, layout in enumerate(mine.layouts):
        s1, sq = track_a.s1[seen, L] * track_a.kept[L], track_a.sq[seen, L]
        if track_a.upper is not None:
            s1 = torch.cat([s1, track_a.upper.s1[seen, L]], -1)
            sq = sq + track_a.upper.sq[seen, L]
        rhs, within = s1 - mine.u[seen, L], sq - mine.row_sq[seen, L]
        rhs, within = torch.cat([rhs, rhs.sum(0, keepdim=True)]), \
            torch.cat([within, within.sum(0, keepdim=True)])
        r2, fits = within_fit(rhs, within, layout, counts.expand_as(within))
        out[:, L] = r2.cpu()
        g[L] = match_mean(fits[n], s1.sum(0), layout, n).cpu()
    T = run.length
    back = None if track_a.upper is None else g[..., T - 1:].numpy()
    return WithinRow(out[:n].numpy(), out[n].numpy(), g[..., :T - 1].numpy(), back)


STATISTIC = StatisticSpec(
    "within_row", WithinRow, WithinRowReducer,
    "Track A's within-row R²: the share of the variance within each query row (what the "
    "softmax reads; a constant per row changes nothing) that one lag kernel g(Δ) explains, "
    "with a free constant per row of each sequence",
    state_bytes=lambda model, work: (work.n_eval * model.spec.n_layers * model.spec.n_heads
                                     * (work.length * (1 if model.spec.causal else 2) + 1)
                                     * 8),
    head_columns={"R2_within_row_pooled": "Track A within-row R², pooled (a per-row "
                                          "constant removed: what the softmax sees)",
                  "R2_within_row_per_seq": "Track A within-row R², mean over sequences"},
    condition_values=mean_of("R2_within_row_pooled", "R2_within_row"),
    condition_labels={"R2_within_row": "Track A within-row R² (pooled), mean over heads"},
    finish=finish)

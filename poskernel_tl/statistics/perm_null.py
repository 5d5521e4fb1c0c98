"""The per-head joint position-permutation null of the pooled Track A R².

For each of ``n_perm`` seeded permutations π of the positions 0..T−1 (one π per draw,
the same for every sequence), the queries and keys are permuted *together*,
q' = q[:, π], k' = k[:, π], giving the product A' = scale · q'·k'ᵀ (no causal mask:
A'[t, s] = A[π(t), π(s)] reads logits on both sides of the diagonal). Every logit value
q_i·k_j survives; only which offset t − s it sits at changes. The strictly lower triangle
of A' is then fitted by a shift-invariant g(Δ) exactly as Track A fits the real logits,
pooled over the sequences, from the same sufficient statistics (per-lag sums and the
sum of squares). Row and column effects (a key that every query likes, such as an
attention sink) stay row and column effects under π, so the null measures how much of
the variance a Toeplitz fit captures by chance for this head's own logit values and
structure, not for i.i.d. noise.

The sums come from q[π], k[π] directly by default (``source="lags"``): the strictly lower
triangle of q'·k'ᵀ is that of a product of two position sequences, so the FFT
cross-correlation and running key moment of :mod:`poskernel_tl.reducers.lag_sums` give
its per-lag sums and sum of squares exactly (nothing there assumes causality; that A'
reads both triangles of A only means no mask is involved), formed in float32 with float64
totals by default. ``source="scores"`` forms the
permuted product explicitly and sweeps it (the reference path).

To bound the cost (each draw is one more pass over q/k, or one more q·kᵀ with
``source="scores"``, per sequence and head) only the first ``max_seqs`` sequences of the
pass enter. The unpermuted fit of those same sequences is kept as ``r2_same_seqs``, so a
head's pooled R² can be compared with its null on exactly the data the null was drawn from.

For a bidirectional model (``causal=False``) the null fits every off-diagonal entry of
A' (both triangles, one g per signed lag), as Track A then fits the real logits: the upper
triangle is the lower one of A'ᵀ = scale · k'·q'ᵀ, so the same identities apply with q'
and k' swapped.

Reads the post-rotary ``hook_rot_q``/``hook_rot_k`` (``hook_q``/``hook_k`` without rotary)
through :class:`~poskernel_tl.reducers.base.LayerBatch`; GQA keys are broadcast, not copied.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.fit.bands import band_r2
from poskernel_tl.fit.counts import layer_lag_counts
from poskernel_tl.fit.toeplitz import lower_lag_stats, lower_mean_from_qk, r2_two_sided
from poskernel_tl.mask import Mask, shared
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.models.softmax_ops import chunk_qk, entry_offsets, finish_scores, qk_scores
from poskernel_tl.protocol import band_ends
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.lag_sums import DEFAULT_CHUNK, lower_stats
from poskernel_tl.reducers.tile_sums import lag_weights, null_tile_sums
from poskernel_tl.reducers.two_sided import mirrored, sides
from poskernel_tl.schema import Part, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec


@dataclass
class PermNull(Part):
    """``r2_null[p, layer, head]``: pooled Toeplitz R² after permutation ``p``;
    ``r2_same_seqs``: the unpermuted pooled R² of the same ``n_seqs`` sequences (read on
    a result as ``r2_perm_null`` and ``r2_perm_same_seqs``)."""

    NAME = "perm_null"
    r2_null: Float[np.ndarray, "perm layer head_index"] = stored("perm_null.npz",
                                                                  "r2_perm_null")
    r2_same_seqs: Float[np.ndarray, "layer head_index"] | None = stored(
        "perm_null.npz", "r2_perm_same_seqs")
    # the same fits restricted to each offset band (protocol.offset_bands)
    r2_band_null: Float[np.ndarray, "perm band layer head_index"] | None = stored(
        "perm_null.npz", "r2_perm_null_bands", default=None)
    perms: Int[np.ndarray, "perm pos"] | None = None  # not saved
    n_seqs: int = 0
    seed: int = 0

    def columns(self, table: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
        """The band table's column of the largest null R² of each band."""
        cols = super().columns(table, dims)
        if table == "bands" and self.r2_band_null is not None:
            cols["R2_null_max"] = self.r2_band_null.max(0).ravel()
        return cols

    def percentile(self, r2: Float[np.ndarray, "layer head_index"]
                   ) -> Float[np.ndarray, "layer head_index"]:
        """Mid-rank percentile (0–100) of each head's ``r2`` within its own null."""
        return null_percentile(r2, self.r2_null)

    def p_value(self, r2: Float[np.ndarray, "layer head_index"]
                ) -> Float[np.ndarray, "layer head_index"]:
        """One-sided permutation p-value of each head's ``r2`` within its own null."""
        return null_p_value(r2, self.r2_null)


def null_percentile(r2, null):
    """Mid-rank percentile (0–100) of ``r2[...]`` within the finite draws of
    ``null[draw, ...]``: the share below it, ties counted half. NaN where ``r2`` is not
    finite or no draw is. Takes numpy arrays, torch tensors or floats; returns numpy."""
    r2, null = np.asarray(r2, np.float64), np.asarray(null, np.float64)
    n = np.isfinite(null).sum(0)
    share = (null < r2[None]).sum(0) + 0.5 * (null == r2[None]).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(r2) & (n > 0), 100.0 * share / n, np.nan)


def null_p_value(r2, null):
    """One-sided permutation p-value (1 + #{draws ≥ r2}) / (1 + #draws) of ``r2[...]``
    over the finite draws of ``null[draw, ...]`` (a failed draw is no evidence either
    way: counted in neither). NaN where ``r2`` is not finite or no draw is (numpy arrays
    or torch tensors; returns numpy)."""
    r2, null = np.asarray(r2, np.float64), np.asarray(null, np.float64)
    n = np.isfinite(null).sum(0)
    with np.errstate(invalid="ignore"):
        p = (1.0 + (null >= r2[None]).sum(0)) / (1.0 + n)
    return np.where(np.isfinite(r2) & (n > 0), p, np.nan)


def joint_permutations(length: int, n_perm: int, seed: int = 0) -> Int[Tensor, "perm pos"]:
    """The seeded permutations of the positions (CPU generator, device-independent)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(length, generator=g) for _ in range(n_perm)])


def null_bytes(model: LoadedModel, length: int, draws: int) -> int:
    """The null's per-draw lag sums and squares (and the unpermuted ones), float64, per
    side."""
    s = model.spec
    return 3 * (draws + 1) * s.n_layers * s.n_heads * length * 8 * sides(model)


class PermNullReducer:
    """Streams the joint position-permutation null (see the module docstring)."""

    def __init__(self, masks: Sequence[Mask], n_heads: int, *, n_perm: int = 8,
                 max_seqs: int = 16, seed: int = 0, device: torch.device | str = "cpu",
                 include_identity: bool = True,
                 source: Literal["lags", "scores"] = "lags", chunk: int = DEFAULT_CHUNK,
                 dtype: torch.dtype = torch.float32):
        """``masks``: per layer, the entries its softmax keeps
        (:attr:`~poskernel_tl.models.geometry.Geometry.masks`): the permuted product of a
        layer is fitted on the same offsets Δ ≤ its ``last`` as the real one, so the null
        holds as many entries per lag as the fit it judges; where a chunk binds, on the
        entries that mask keeps (q', k' spread by chunk after the permutation,
        :func:`~poskernel_tl.models.softmax_ops.chunk_qk`). ``dtype``: what the
        ``"lags"`` sums are formed in, with float64 totals; float32 (~1e-7 relative, far
        below the spread between draws) takes under half the CPU time of float64."""
        if source not in ("lags", "scores"):
            raise ValueError(f"source={source!r}: choose 'lags' or 'scores'")
        if n_perm < 1 or max_seqs < 1:
            raise ValueError(f"n_perm and max_seqs must be >= 1, got {n_perm}, {max_seqs}")
        T, causal = shared(masks)
        if T < 3:
            raise ValueError(f"length must be >= 3, got {T}")
        n_layers = len(masks)
        self.source, self.chunk, self.dtype = source, chunk, dtype
        self.T, self.n_perm, self.max_seqs, self.seed = T, n_perm, max_seqs, seed
        self.n_layers, self.n_heads = n_layers, n_heads
        self.masks = list(masks)
        self.perms_cpu = joint_permutations(T, n_perm, seed)
        # with include_identity, draw 0 is the unpermuted fit of the same sequences (a
        # caller that runs Track A on them already, like measure, can take it from there)
        self.include_identity = include_identity
        ident = torch.arange(T)[None] if include_identity else torch.zeros(0, T, dtype=torch.long)
        self.perms = torch.cat([ident, self.perms_cpu]).to(device)
        self.perms32 = self.perms.to(torch.int32)  # the kernels' positions
        f64 = dict(dtype=torch.float64, device=device)
        n_draws = len(self.perms)
        # per draw, layer and head: S1 and S2 of every lag (S2 from the kernels' path,
        # whose sums of squares are read from it after the pass), Σ A², Σ A² by band
        self.lag_sums = torch.zeros(2, n_draws, n_layers, n_heads, T - 1, **f64)
        self.s1, self.s2 = self.lag_sums
        self.sq = torch.zeros(n_draws, n_layers, n_heads, **f64)
        self.bands = torch.zeros(n_draws, n_layers, n_heads, len(band_ends(T)), **f64)
        # bidirectional: the upper triangle of each permuted product too
        self.causal = causal
        self.lag_sums_back = None if causal else torch.zeros_like(self.lag_sums)
        self.s1_back = None if causal else self.lag_sums_back[0]
        self.sq_back = None if causal else torch.zeros_like(self.sq)
        self.bands_back = None if causal else torch.zeros_like(self.bands)
        self.n_seen = [0] * n_layers  # host counts: no device sync

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        keep = [i for i, row in enumerate(batch.rows) if row < self.max_seqs]
        if not keep:
            return
        path = batch.path(self.source)
        if batch.n_layers > 1 and path != "tiles":
            for one in batch.split():
                self.update(one)
            return
        if path == "tiles":  # every draw and layer in one launch, added by one operation
            # (q and k as the model gave them: the kernels apply the softmax's terms)
            lower, upper = null_tile_sums(batch, *self._select(batch.q, batch.k, keep),
                                          self.perms32, self.masks[batch.layers[0]].last,
                                          self.causal)
            batch.add(self.lag_sums, lower, lead=2)
            if upper is not None:
                batch.add(self.lag_sums_back, upper, lead=2)
            for L in batch.layers:
                self.n_seen[L] += len(keep)
            return
        L = batch.layer
        if path == "streamed":
            # what the softmax reads (an ALiBi ramp permuted with q, k)
            q, k = self._select(*batch.logit_qk, keep)
            for p in range(len(self.perms)):
                pi = self.perms[p]
                qp, kp = self._permuted(q, k, pi, L)
                last = self.masks[L].last
                self._add(p, L, lower_stats(qp, kp, batch.scale, self.chunk, last,
                                            self.dtype),
                          None if self.causal else lower_stats(
                              *mirrored(qp, kp), batch.scale, self.chunk, last, self.dtype))
        else:
            q, k = self._select(*batch.logit_qk, keep)
            self._update_from_scores(q.float(), k.float(), batch)
        self.n_seen[L] += len(keep)

    @staticmethod
    def _select(q: Tensor, k: Tensor, keep: list[int]) -> tuple[Tensor, Tensor]:
        """q and k of the batch's sequences ``keep`` (a slice where they are
        consecutive)."""
        if len(keep) < q.shape[0]:
            if keep == list(range(keep[0], keep[-1] + 1)):
                return q[keep[0]:keep[-1] + 1], k[keep[0]:keep[-1] + 1]
            idx = torch.as_tensor(keep, device=q.device)
            q, k = q.index_select(0, idx), k.index_select(0, idx)
        return q, k

    def _permuted(self, q: Tensor, k: Tensor, pi: Tensor, L: int) -> tuple[Tensor, Tensor]:
        """q[:, π], k[:, π], spread by layer ``L``'s chunk where one binds."""
        qp, kp = q.index_select(1, pi), k.index_select(1, pi)
        chunk = self.masks[L].chunk
        return (qp, kp) if chunk is None else chunk_qk(qp, kp, chunk)

    def _update_from_scores(self, q: Tensor, k: Tensor, batch: LayerBatch) -> None:
        """The reference path: form each permuted product and sweep its lower triangle."""
        b, T, h, _ = q.shape
        L = batch.layer
        work = batch.workspace.get("perm_null_work", (b, h, 2 * T, T), q, zero=True)
        for p in range(len(self.perms)):
            pi = self.perms[p]
            qp, kp = self._permuted(q, k, pi, L)
            shift = lower_mean_from_qk(qp, kp, batch.scale)
            A = finish_scores(qk_scores(qp, kp, batch.scale,
                                        partial(batch.workspace.get, "perm_null_scores")),
                              batch.terms, partial(entry_offsets, pi, pi), T)  # offsets permuted
            lower, _ = lower_lag_stats(A, shift, [], work, last=self.masks[L].last,
                                       bands=True)
            upper = None
            if not self.causal:  # the lower triangle of A'ᵀ
                upper, _ = lower_lag_stats(A.transpose(-1, -2),
                                           lower_mean_from_qk(*mirrored(qp, kp),
                                                              batch.scale), [], work,
                                           last=self.masks[L].last, bands=True)
            self._add(p, L, lower, upper)

    def _add(self, p: int, L: int, lower: tuple[Tensor, Tensor, Tensor],
             upper: tuple[Tensor, Tensor, Tensor] | None) -> None:
        """Add one batch's (S1, Σ A², Σ A² by band) of draw ``p``, summed over its
        sequences (and of its upper triangle)."""
        for state, sums in ((self.s1, lower[0]), (self.sq, lower[1]), (self.bands, lower[2])):
            state[p, L] += sums.sum(0)
        if upper is not None:
            for state, sums in ((self.s1_back, upper[0]), (self.sq_back, upper[1]),
                                (self.bands_back, upper[2])):
                state[p, L] += sums.sum(0)

    def _sums_of_squares(self) -> None:
        """Move what the kernels' path kept as S2 per lag into Σ A² and its bands."""
        weights = lag_weights(self.T, None, self.s1.device)
        n_bands = self.bands.shape[-1]
        for s2, sq, bands in ((self.s2, self.sq, self.bands),
                              (None if self.causal else self.lag_sums_back[1], self.sq_back,
                               self.bands_back)):
            if s2 is not None:
                rows = s2 @ weights
                sq += rows[..., 0]
                bands += rows[..., 1:1 + n_bands]
                s2.zero_()

    def result(self) -> PermNull:
        n = self.n_seen
        if min(n) != max(n):
            raise RuntimeError(f"layers saw different numbers of sequences: {n}")
        if n[0] == 0:
            raise RuntimeError("no sequences were fed to the permutation null")
        self._sums_of_squares()
        counts = layer_lag_counts(self.masks, device=self.s1.device) * n[0]
        back = None if self.causal else (self.s1_back, self.sq_back, counts)
        r2, *_ = r2_two_sided((self.s1, self.sq, counts), back)
        r2 = r2.detach().cpu().numpy()
        side = lambda s1, bands: None if s1 is None else (s1, counts, bands)
        r2_bands = band_r2(side(self.s1, self.bands), self.T,
                           side(self.s1_back, self.bands_back)).permute(0, 3, 1, 2)
        first = 1 if self.include_identity else 0
        return PermNull(r2_null=r2[first:], r2_same_seqs=r2[0] if first else None,
                        r2_band_null=r2_bands[first:].cpu().numpy(),
                        perms=self.perms_cpu.numpy(), n_seqs=n[0], seed=self.seed)


def build(run: StatisticContext) -> PermNullReducer | None:
    """``null_perms`` draws over the first ``null_seqs`` sequences (None: no draws)."""
    o, s = run.options, run.spec
    if o.null_perms <= 0:
        return None
    return PermNullReducer(run.masks, s.n_heads, n_perm=o.null_perms,
                           max_seqs=o.null_seqs, seed=o.seed, device=run.device,
                           include_identity=False, source=run.source)


def with_same_seqs(part: PermNull, reducers, run: StatisticContext) -> PermNull:
    """The unpermuted pooled R² of the null's sequences, from Track A's sums."""
    track_a = reducers["track_a"]
    same, _ = track_a.pooled(torch.arange(part.n_seqs, device=run.device))
    return dataclasses.replace(part, r2_same_seqs=same.cpu().numpy())


STATISTIC = StatisticSpec(
    "perm_null", PermNull, build,
    "the joint position-permutation null of the pooled Track A R²",
    state_bytes=lambda model, work: null_bytes(model, work.length, work.null_draws),
    finish=with_same_seqs)

__all__ = ["STATISTIC", "PermNull", "PermNullReducer", "joint_permutations", "null_bytes",
           "null_p_value", "null_percentile"]

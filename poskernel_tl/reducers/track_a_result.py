"""Track A's result part: :class:`TrackAResult`, every field saying where it is saved, and
each variant — the same fit over a region of the logits — declared on the field holding
its R² (:func:`~poskernel_tl.fit.variants.fitted`): adding a variant is one field here.
The reducer (:mod:`poskernel_tl.reducers.track_a`) reads the regions from these fields.
"""

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float, Int

from poskernel_tl.errors import ResultFileError
from poskernel_tl.fit.toeplitz import kept_finite, sym_antisym, two_sided
from poskernel_tl.fit.variants import Variant, fitted, strip_of, variants_of
from poskernel_tl.panels import KERNEL_NOTE, KERNEL_SECTION, Panel
from poskernel_tl.protocol import EARLY_ROWS, INTERIOR_FROM
from poskernel_tl.schema import TABLE_ROWS, Part, axes, column, stored

NO_SINK = Variant(keys=(1, None))  # the key column s = 0 (the attention sink) left out
SINK_COLUMN = Variant(keys=(0, 1))  # the sink column alone: its mean by row is g_sink


@dataclass
class TrackAResult(Part):
    """Track A of one condition; where each field is saved is declared on it."""

    NAME = "track_a"
    PANELS = (Panel("number", "Track A pooled R²", "r2_pooled"),
              Panel("number", "Track A pooled R², sink column left out", "r2_pooled_nosink"),
              Panel("curve", KERNEL_SECTION, "g_pooled", back="g_pooled_back", log_x=True,
                    plot="Track A g(Δ)", name="raw logits", x="lag Δ = t − s",
                    y="g(Δ)", note=KERNEL_NOTE),
              Panel("histogram", "Per-sequence R²", "r2_per_seq", x="R² per sequence",
                    y="sequences", marker="r2_pooled",
                    note="Track A R² of each evaluation sequence; the line is the pooled fit."),)
    seq_index: Int[np.ndarray, " n_seqs"]  # positions within the pass (not saved)
    r2_per_seq: Float[np.ndarray, "n_seqs layer head_index"] = column("trackA", "R2_per_seq")
    r2_pooled: Float[np.ndarray, "layer head_index"] = column("trackA", "R2_pooled",
                                                               finite=True)
    r2_per_seq_nosink: Float[np.ndarray, "n_seqs layer head_index"] = fitted(column(
        "trackA", "R2_per_seq_nosink"), NO_SINK)
    g_per_seq: Float[np.ndarray, "n_seqs layer head_index lag"] = stored(  # float32
        "g.npz", "trackA_per_seq")
    r2_pooled_nosink: Float[np.ndarray, "layer head_index"] = fitted(column(
        "trackA", "R2_pooled_nosink"), NO_SINK)
    # NaN past a sliding window's last kept offset (no entry there to fit)
    g_pooled: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "trackA_pooled")
    # the variants over query rows 1–20, rows ≥ 50 and the interior A[50:, 50:]
    r2_pooled_early: Float[np.ndarray, "layer head_index"] = fitted(column(
        "trackA", "R2_pooled_early"), Variant(rows=EARLY_ROWS))
    r2_pooled_interior: Float[np.ndarray, "layer head_index"] = fitted(column(
        "trackA", "R2_pooled_interior"), Variant(rows=(INTERIOR_FROM, None)))
    r2_pooled_interior_keys: Float[np.ndarray, "layer head_index"] = fitted(column(
        "trackA", "R2_pooled_interior_keys"), Variant(rows=(INTERIOR_FROM, None),
                                                      keys=(INTERIOR_FROM, None)))
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
    r2_pooled_rows_21_100: Float[np.ndarray, "layer head_index"] | None = fitted(column("trackA",
        "R2_pooled_rows_21_100", head="Track A R², query rows 21–100", default=None), Variant(
        rows=(21, 101)))  # query rows 21–100, ends included

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


VARIANTS = variants_of(TrackAResult)  # field -> region: every Track A variant
PER_SEQ = tuple(f for f in VARIANTS  # the variants kept per sequence
                if axes(TrackAResult.__annotations__[f])[0] == "n_seqs")
REGIONS = tuple(dict.fromkeys([*VARIANTS.values(), SINK_COLUMN]))  # every region read
STRIP = strip_of(REGIONS)  # keys (rows, upper side) of the strip they are read from

__all__ = ["NO_SINK", "PER_SEQ", "REGIONS", "SINK_COLUMN", "STRIP", "VARIANTS", "TrackAResult"]

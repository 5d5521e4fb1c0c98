"""Track B's result part: :class:`GramResult`, every field saying where it is saved, and
what a head view draws of it (its g(Δ): the centered Gram's, or the raw one where the
condition is not centered). The reducer is :mod:`poskernel_tl.reducers.gram`."""

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float

from poskernel_tl.errors import ResultFileError
from poskernel_tl.fit.toeplitz import kept_finite, sym_antisym, two_sided
from poskernel_tl.panels import KERNEL_SECTION, Panel
from poskernel_tl.reducers.moments import Moments
from poskernel_tl.schema import Part, column, stored


@dataclass
class GramResult(Part):
    """Track B of one condition; where each field is saved is declared on it. The table's
    ``R2_gram`` is the centered fit, or the raw one where the condition is not centered
    (the protocol's CSV), so ``r2_gram`` is written and read by :meth:`columns`/:meth:`load`."""

    NAME = "track_b"
    PANELS = (Panel("number", "Track B R²", "r2_shown", name_of="g_source"),
              Panel("number", "Track B raw R²", "r2_gram_raw"),
              Panel("curve", KERNEL_SECTION, "g_shown", back="g_shown_back", log_x=True,
                    plot="Track B g(Δ)", name_of="g_source", x="lag Δ = t − s", y="g(Δ)"),)
    r2_gram_raw: Float[np.ndarray, "layer head_index"] = column("trackB", "R2_gram_raw")
    # g is NaN past a sliding window's last kept offset (checked by :func:`kept_finite`)
    g_gram_raw: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "gram_raw")
    r2_gram: Float[np.ndarray, "layer head_index"]  # NaN without centering
    g_gram: Float[np.ndarray, "layer head_index lag"] = stored("g.npz", "gram_centered")
    r2_gram_half: Float[np.ndarray, "layer head_index"] = column("trackB", "R2_gram_half")
    gram_raw: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = stored(
        "gram_raw.pt", default=None)
    gram_centered: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = stored(
        "gram_centered.pt", default=None)
    centered: bool = column("trackB", "centered", default=False)
    eval_moments: Moments | None = None  # the evaluation means (not saved)
    # bidirectional models only (None for causal ones): Δ = −1..−(T−1) and Δ = 0
    g_gram_raw_back: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "g.npz", "gram_raw_back", finite=True, default=None)
    g_gram_back: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "g.npz", "gram_centered_back", default=None)
    g_gram_raw_self: Float[np.ndarray, "layer head_index"] | None = stored(
        "g.npz", "gram_raw_self", default=None)
    g_gram_self: Float[np.ndarray, "layer head_index"] | None = stored(
        "g.npz", "gram_centered_self", default=None)

    @property
    def g_source(self) -> str:
        """Which Gram the spectral analysis and the head view read: ``gram_centered``, or
        ``gram_raw`` where the condition is not centered."""
        return "gram_centered" if self.centered else "gram_raw"

    @property
    def r2_shown(self) -> Float[np.ndarray, "layer head_index"]:
        return self.r2_gram if self.centered else self.r2_gram_raw

    @property
    def g_shown(self) -> Float[np.ndarray, "layer head_index lag"]:
        return self.g_gram if self.centered else self.g_gram_raw

    @property
    def g_shown_back(self) -> Float[np.ndarray, "layer head_index lag"] | None:
        return self.g_gram_back if self.centered else self.g_gram_raw_back

    def columns(self, table: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
        """The saved columns; ``R2_gram`` first; for a bidirectional model the asymmetry
        of g (``asym_gram``: of the fit ``R2_gram`` shows; ``asym_gram_raw``)."""
        cols = super().columns(table, dims)
        if table == "trackB":
            shown = self.r2_gram if self.centered else self.r2_gram_raw
            cols = {"R2_gram": np.asarray(shown).ravel(), **cols}
            if self.g_gram_raw_back is not None:
                raw = self.asymmetry(centered=False)
                cols["asym_gram"] = (self.asymmetry() if self.centered else raw).ravel()
                cols["asym_gram_raw"] = raw.ravel()
        return cols

    def asymmetry(self, centered: bool = True) -> Float[np.ndarray, "layer head_index"]:
        """Per head, the share of the two-sided g's variance that is antisymmetric
        (:func:`~poskernel_tl.fit.toeplitz.sym_antisym`) for the centered (NaN where not
        centered) or raw Gram; NaN for a causal result."""
        g, back = (self.g_gram, self.g_gram_back) if centered else \
            (self.g_gram_raw, self.g_gram_raw_back)
        if back is None:
            return np.full(self.r2_gram_raw.shape, np.nan)
        return sym_antisym(two_sided(g, back))[2]

    @classmethod
    def load(cls, saved, dims: dict[str, int], **given):
        raw = saved.table_column("trackB", "R2_gram", dims, ("layer", "head_index"))
        r2 = raw if given.get("centered") else np.full(raw.shape, np.nan)
        part = super().load(saved, dims, r2_gram=r2, **given)
        for key, g in (("gram_centered", part.g_gram), ("gram_centered_back", part.g_gram_back),
                       ("gram_raw", part.g_gram_raw)):
            if (part.centered or key == "gram_raw") and g is not None and not kept_finite(g):
                raise ResultFileError(f"{saved.path_of('g.npz')}: {key} holds NaN/inf")
        return part


__all__ = ["GramResult"]

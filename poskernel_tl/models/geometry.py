"""One run's geometry: the length, whether the mask is causal, and per layer the entries
(t, s) its softmax keeps — made once from the model's spec (:meth:`Geometry.checked`, the
one place a length is checked against a model) and handed to every reducer, fit and
view that needs it (:class:`~poskernel_tl.statistics.statistic.StatisticContext`,
``ConditionResult.geometry``).

A layer keeps the offsets Δ = t − s = 1..``lags[layer]`` below the diagonal (T − 1: the
whole triangle; a sliding window of W positions: W − 1), and an encoder the same above it
(a two-sided sliding window, T5Gemma's encoder's: every fit reads the upper triangle as
the lower one of the mirrored mask, Aᵀ under the same rule).
A chunked mask of C positions (Llama 4) keeps query t's keys s ≤ t of its own chunk
(⌊s / C⌋ = ⌊t / C⌋): every causal entry up to T = C; past it the offsets Δ ≤ C − 1 (its
``lags``), each counted where it lies inside a chunk (:meth:`Geometry.chunk` says where one
binds; the counts are :func:`~poskernel_tl.fit.counts.lag_counts`' with that chunk, the
logits across chunks are never read: :func:`~poskernel_tl.models.softmax_ops.chunk_qk`).
"""

from dataclasses import dataclass

from poskernel_tl.errors import UserError
from poskernel_tl.mask import Mask
from poskernel_tl.models.registry import ModelSpec


@dataclass(frozen=True)
class Geometry:
    """See the module docstring. ``lags``: per layer, the last offset its mask keeps;
    ``chunks``: per layer, the chunk of a chunked mask (None: not chunked)."""

    length: int
    causal: bool
    lags: tuple[int, ...]
    chunks: tuple[int | None, ...] = ()

    @classmethod
    def of(cls, spec: ModelSpec, length: int) -> "Geometry":
        """The geometry of ``spec`` at ``length``, unchecked (a saved result's, or the
        registry's before loading; :meth:`checked` for a run)."""
        layers = spec.layers or [None] * spec.n_layers
        chunks = tuple(None if s is None else s.terms.chunk for s in layers)
        lags = tuple(min(length, c or length, length if s is None or s.last is None
                         else s.last + 1) - 1 for s, c in zip(layers, chunks))
        return cls(length, spec.causal, lags, chunks)

    @classmethod
    def checked(cls, spec: ModelSpec, length: int, what: str = "--length") -> "Geometry":
        """:meth:`of`, or a UserError naming ``what`` unless 3 ≤ length ≤ the model's
        context (an unknown context, 0, is not checked)."""
        if length < 3:
            raise UserError(f"{what} {length}: the fit needs at least 3 tokens")
        if spec.n_ctx and length > spec.n_ctx:
            raise UserError(f"{what} {length} exceeds {spec.name}'s context of "
                            f"{spec.n_ctx} tokens")
        return cls.of(spec, length)

    @property
    def n_layers(self) -> int:
        return len(self.lags)

    @property
    def windowed(self) -> bool:
        """Whether some layer keeps fewer offsets than the whole triangle."""
        return any(m < self.length - 1 for m in self.lags)

    def chunk(self, layer: int) -> int | None:
        """The chunk of layer ``layer``'s mask where it binds (T > chunk), else None."""
        c = self.chunks[layer] if self.chunks else None
        return c if c is not None and c < self.length else None

    @property
    def widening(self) -> int:
        """How many times wider a binding chunk makes q and k where the fits read them
        (⌈T / chunk⌉ slots of d_head: :func:`~poskernel_tl.models.softmax_ops.chunk_qk`);
        1 when none binds."""
        return max([1] + [-(-self.length // m.chunk) for m in self.masks if m.chunk])

    def mask(self, layer: int) -> Mask:
        """The entries layer ``layer``'s softmax keeps (:class:`~poskernel_tl.mask.Mask`)."""
        return Mask(self.length, self.causal, self.lags[layer], self.chunk(layer))

    @property
    def masks(self) -> tuple[Mask, ...]:
        """:meth:`mask` of every layer: what the reducers and fits are built from."""
        return tuple(self.mask(L) for L in range(self.n_layers))

    def require_whole(self, what: str) -> None:
        """A UserError, in one line, naming ``what`` (a method defined on whole triangles
        only) and the first layer whose softmax keeps fewer entries at this length."""
        for L in range(self.n_layers):
            mask = self.mask(L)
            if not mask.whole:
                kept = (f"offsets ≤ {mask.last} (a sliding window)" if mask.chunk is None
                        else f"chunks of {mask.chunk} positions")
                most = min(mask.last + 1, mask.chunk or self.length)
                raise UserError(f"{what} reads every entry of each layer's triangle; layer "
                                f"{L} keeps {kept} at T = {self.length}: not measured; "
                                f"choose a length ≤ {most}")


__all__ = ["Geometry"]

"""One run's geometry: the length, whether the mask is causal, and per layer the entries
(t, s) its softmax keeps — made once from the model's spec (:meth:`Geometry.checked`, the
one place a length is checked against a model) and handed to every reducer, fit and
view that needs it (:class:`~poskernel_tl.statistics.statistic.StatisticContext`,
``ConditionResult.geometry``).

A layer keeps the offsets Δ = t − s = 1..``lags[layer]`` below the diagonal (T − 1: the
whole triangle; a sliding window of W positions: W − 1), and an encoder the same above it.
A chunked mask (Llama 4) keeps every causal entry up to its chunk's length, and is refused
past it: its kept entries are then no function of the offset alone.
"""

from dataclasses import dataclass

from poskernel_tl.errors import UserError
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
        lags = tuple(length - 1 if s is None or s.max_lag is None else min(length - 1, s.max_lag)
                     for s in layers)
        return cls(length, spec.causal, lags,
                   tuple(None if s is None else s.terms.chunk for s in layers))

    @classmethod
    def checked(cls, spec: ModelSpec, length: int, what: str = "--length") -> "Geometry":
        """:meth:`of`, or a UserError naming ``what`` unless 3 ≤ length ≤ the model's
        context (an unknown context, 0, is not checked) and every layer's mask is one the
        fits read at this length."""
        if length < 3:
            raise UserError(f"{what} {length}: the fit needs at least 3 tokens")
        if spec.n_ctx and length > spec.n_ctx:
            raise UserError(f"{what} {length} exceeds {spec.name}'s context of "
                            f"{spec.n_ctx} tokens")
        geometry = cls.of(spec, length)
        for layer, chunk in enumerate(geometry.chunks):
            if chunk is not None and length > chunk:
                raise UserError(f"{what} {length}: {spec.name}: layer {layer} masks in chunks "
                                f"of {chunk} positions: lengths up to {chunk} keep every "
                                f"causal entry and are supported; T = {length} is not")
        return geometry

    @property
    def n_layers(self) -> int:
        return len(self.lags)

    @property
    def windowed(self) -> bool:
        """Whether some layer keeps fewer offsets than the whole triangle."""
        return any(m < self.length - 1 for m in self.lags)

    @property
    def max_lags(self) -> list[int] | None:
        """Per layer, the last offset kept; None when every layer keeps the whole triangle
        (the reducers' and fits' argument)."""
        return list(self.lags) if self.windowed else None

    def max_lag(self, layer: int) -> int:
        return self.lags[layer]

    def window(self, layer: int) -> int | None:
        """The last offset layer ``layer`` keeps where a window cuts its triangle, else None."""
        return self.lags[layer] if self.lags[layer] < self.length - 1 else None


__all__ = ["Geometry"]

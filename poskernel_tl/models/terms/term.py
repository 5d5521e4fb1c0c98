"""One positional term of a layer's softmax: what it adds to scale·q·k (or how it changes
it), read from the model itself. Every term is a frozen :class:`Term` with one ``value``
(what a result records of it: ``cfg.json``'s ``softmax`` entry, ``provenance``) and says

- how it enters the logits, its :data:`KINDS` entry: a known function of the offset added
  to the logits (``"offset"``: ALiBi's ramp, a learned table of bucketed offsets), a
  per-row factor of the query (``"row
  factor"``: a temperature), a nonlinearity on the scores (``"nonlinear"``: a soft-cap), a
  term of each row's normaliser (``"normaliser"``: learned sinks), or which entries the
  softmax reads (``"mask"``: a chunk);
- how it is read (:meth:`Term.read`: from the layer's config and Hugging Face attention
  module, or None where the layer has no such term), labelled (:meth:`Term.label`) and
  described (:meth:`Term.describe`: ``poskernel models``, the report);
- its known kernel, where it is one (:meth:`Term.known_kernel`: a function of the offset
  the report can draw beside g(Δ), ALiBi's −m_h·Δ).

The tensor side is :mod:`~poskernel_tl.models.softmax_ops` and the reducers: a term with
``FOLDS`` set is folded into q and k (ALiBi's ramp, a temperature), so every fit that
streams sums of q and k reads it; an offset term without it (a learned table) is added,
as its :meth:`Term.known_kernel` at each entry's offset, to every materialised score the
fits read (the streamed paths are then not taken for that layer). Nothing else is edited
to add a term. This package imports no torch (the command line checks a run against the
registry before it pays for torch).
"""

from dataclasses import dataclass
from typing import Any, ClassVar

KINDS = ("offset", "row factor", "nonlinear", "normaliser", "mask")


@dataclass(frozen=True)
class LayerContext:
    """What a term is read from, for one layer: the model's config, the layer's Hugging
    Face attention module (None where the layers could not be matched to modules), its
    ``layer_type`` (``config.layer_types``' entry, or ``"full_attention"``), the query
    heads, the ALiBi slopes the caller read from the whole model (None: no ALiBi), and the
    whole Hugging Face model (where a term lives outside the layer: a table of biases
    read in a stack's first layer and shared by all of them)."""

    cfg: Any
    attn: Any
    layer_type: str
    n_heads: int
    slopes: tuple[float, ...] | None = None
    model: Any = None


@dataclass(frozen=True)
class Term:
    """A positional term (module docstring); subclasses set the class attributes."""

    NAME: ClassVar[str]  # its key in a result's ``softmax`` record
    KIND: ClassVar[str]  # one of KINDS
    ORDER: ClassVar[int]  # where it is listed among a layer's terms
    FOLDS: ClassVar[bool] = False  # folded into q and k (softmax_ops.fold_qk)
    PER_HEAD: ClassVar[bool] = False  # ``value`` holds one entry per query head

    value: Any

    @classmethod
    def read(cls, ctx: LayerContext) -> "Term | None":
        """This term of the layer ``ctx`` describes, or None; a ValueError names what is
        missing or inconsistent."""
        raise NotImplementedError

    @classmethod
    def from_value(cls, value: Any) -> "Term":
        """The term from its recorded ``value`` (lists back to tuples)."""
        return cls(tuple(float(x) for x in value) if isinstance(value, list) else value)

    def recorded(self) -> Any:
        """``value`` as a result records it (tuples as lists)."""
        return list(self.value) if isinstance(self.value, tuple) else self.value

    def label(self) -> str:
        return self.NAME

    def repeated(self, n: int) -> "Term":
        """The term of ``n`` layers' heads side by side (a group of layers of one kind,
        :mod:`poskernel_tl.plan.groups`): a per-head value repeated ``n`` times."""
        if not self.PER_HEAD or n == 1:
            return self
        return type(self)(tuple(self.value) * n)

    def describe(self, values: bool = True) -> str:
        """One clause of what the softmax adds; ``values=False`` leaves out what differs
        from layer to layer."""
        raise NotImplementedError

    def known_kernel(self, lags, scale: float = 1.0):
        """Per query head, the term's function of the offset Δ = t − s at ``lags`` (a
        sequence of offsets, negative ones above the diagonal) on the logits' scale, or
        None where it is none. An offset term that does not fold must give one: it is
        what the fits add to the scores."""
        return None


__all__ = ["KINDS", "LayerContext", "Term"]

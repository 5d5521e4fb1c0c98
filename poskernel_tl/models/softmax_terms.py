"""What a layer's attention softmax reads beyond ``scale·q·k`` plus a mask.

Many models add something to the product of a query and a key before the softmax, or
transform it; the fit of a head must read exactly what its softmax reads. A
:class:`SoftmaxTerms` holds, for one layer, each positional term its softmax reads — one
registered :class:`~poskernel_tl.models.terms.term.Term` per kind of term, read from the
model itself (:data:`~poskernel_tl.models.terms.registry.TERMS`: ALiBi's slopes, a
soft-cap, a query temperature, learned sinks, a chunked mask; each term's module says what
it is and how it is read). A term's value is read as an attribute named after it
(``terms.slopes``, ``terms.softcap``, ``terms.temperature``, ``terms.sinks``,
``terms.chunk``; None where the layer has none), and a result records the values by those
names (:meth:`SoftmaxTerms.to_dict`).

The tensor side (folding the terms into q and k, the cap, the pattern with sinks, the
chunk) is :mod:`~poskernel_tl.models.softmax_ops`; reading them from a model is
:mod:`~poskernel_tl.models.scheme_reader`. This module imports no torch: the command line
checks a run against the registry before it pays for torch.
"""

from collections.abc import Iterable
from typing import Any

from poskernel_tl.models.terms.registry import TERMS
from poskernel_tl.models.terms.term import LayerContext, Term


class SoftmaxTerms:
    """What one layer's softmax reads beyond scale·q·k plus its mask (module docstring).
    ``SoftmaxTerms(name=value, …)`` from recorded values (None: absent), or
    :meth:`of` the terms themselves; immutable, equal by its terms."""

    __slots__ = ("_terms",)

    def __init__(self, **values: Any):
        unknown = set(values) - set(TERMS)
        if unknown:
            raise TypeError(f"unknown softmax terms {sorted(unknown)}; known: {list(TERMS)}")
        terms = {n: TERMS[n].from_value(v) for n, v in values.items() if v is not None}
        object.__setattr__(self, "_terms", tuple(terms[n] for n in TERMS if n in terms))

    @classmethod
    def of(cls, terms: Iterable[Term | None]) -> "SoftmaxTerms":
        """The terms given (Nones skipped), in the registry's order."""
        out = cls()
        given = {t.NAME: t for t in terms if t is not None}
        object.__setattr__(out, "_terms", tuple(given[n] for n in TERMS if n in given))
        return out

    @classmethod
    def read(cls, ctx: LayerContext) -> "SoftmaxTerms":
        """Every registered term of the layer ``ctx`` describes (a ValueError names what
        is missing or inconsistent)."""
        return cls.of(term.read(ctx) for term in TERMS.values())

    @property
    def terms(self) -> tuple[Term, ...]:
        return self._terms

    def __getattr__(self, name: str) -> Any:
        if name in TERMS:
            return next((t.value for t in self._terms if t.NAME == name), None)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise AttributeError("SoftmaxTerms is immutable: replace(...) makes a changed copy")

    def replace(self, **values: Any) -> "SoftmaxTerms":
        """A copy with the values of ``values`` (None removes a term)."""
        return SoftmaxTerms(**{**self.to_dict(), **values})

    def __copy__(self) -> "SoftmaxTerms":
        return self  # immutable

    def __deepcopy__(self, memo) -> "SoftmaxTerms":
        return self

    def __reduce__(self):
        return SoftmaxTerms.from_dict, (self.to_dict(),)

    def __eq__(self, other) -> bool:
        return isinstance(other, SoftmaxTerms) and self._terms == other._terms

    def __hash__(self) -> int:
        return hash(self._terms)

    def __repr__(self) -> str:
        inner = ", ".join(f"{t.NAME}={t.value!r}" for t in self._terms)
        return f"SoftmaxTerms({inner})"

    def repeated(self, n: int) -> "SoftmaxTerms":
        """The terms of ``n`` layers of one kind side by side along the head axis (every
        per-head value repeated ``n`` times; :meth:`Term.repeated`)."""
        return self if n == 1 else SoftmaxTerms.of(t.repeated(n) for t in self._terms)

    def kinds(self) -> set[str]:
        return {t.KIND for t in self._terms}

    @property
    def additive(self) -> bool:
        """Whether q and k change before their product (a term that folds into them: an
        ALiBi ramp, a row factor)."""
        return any(t.FOLDS for t in self._terms)

    @property
    def offsets(self) -> tuple[Term, ...]:
        """The offset terms that do not fold into q and k (a learned table b_h(Δ)): the
        fits add their known kernels to the materialised scores."""
        return tuple(t for t in self._terms if t.KIND == "offset" and not t.FOLDS)

    @property
    def nonlinear(self) -> bool:
        """Whether the logits are a nonlinear function of q·k (fitted on the materialised
        scores)."""
        return "nonlinear" in self.kinds()

    @property
    def bilinear(self) -> bool:
        """Whether the logits are scale·q'·k' of the folded q and k (:attr:`additive`), so
        that fits may stream sums of q and k: no cap and no offset table."""
        return not self.nonlinear and not self.offsets

    def __bool__(self) -> bool:
        return bool(self._terms)

    def labels(self) -> list[str]:
        """Short labels, e.g. ``["alibi", "soft-cap 50"]``."""
        return [t.label() for t in self._terms]

    def describe(self, values: bool = True) -> str:
        """One line of what the softmax adds (empty when nothing); ``values=False`` leaves
        out what differs from layer to layer (the learned sink logits' range)."""
        return "; ".join(t.describe(values) for t in self._terms)

    def to_dict(self) -> dict:
        """Every registered term's recorded value by name (None where absent)."""
        mine = {t.NAME: t.recorded() for t in self._terms}
        return {name: mine.get(name) for name in TERMS}

    @classmethod
    def from_dict(cls, d: dict | None) -> "SoftmaxTerms":
        return cls(**{k: v for k, v in (d or {}).items() if v is not None})


NONE = SoftmaxTerms()

__all__ = ["NONE", "SoftmaxTerms"]

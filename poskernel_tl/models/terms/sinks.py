"""Learned sink logits (gpt-oss): one per query head, joining each row's normaliser as one
more column. They are no entry of the logits among tokens, so no fit sees them; the
attention pattern (the previous-token score, Sink₁, the head view) divides by them
(:func:`~poskernel_tl.models.softmax_ops.logsumexp_with_sinks`)."""

from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term


@dataclass(frozen=True)
class Sinks(Term):
    NAME = "sinks"
    KIND = "normaliser"
    ORDER = 3
    PER_HEAD = True

    @classmethod
    def read(cls, ctx: LayerContext) -> "Sinks | None":
        """From the module's ``sinks`` parameter."""
        sinks = getattr(ctx.attn, "sinks", None)
        if sinks is None:
            return None
        values = tuple(float(x) for x in sinks.detach().double().cpu().flatten().tolist())
        if len(values) != ctx.n_heads:
            raise ValueError(f"{len(values)} sink logits for {ctx.n_heads} query heads")
        return cls(values)

    def label(self) -> str:
        return "sinks"

    def describe(self, values: bool = True) -> str:
        span = f" ({min(self.value):.3g} … {max(self.value):.3g})" if values else ""
        return f"learned sink logits{span} in the normaliser"


TERM = Sinks

"""Soft-capping (Gemma 2): the logits become ``cap·tanh(scale·q·k / cap)`` before the
mask, a nonlinear function of q·k, so the fits read the materialised scores, capped
(:func:`~poskernel_tl.models.softmax_ops.cap_scores`; on a GPU the tiles are capped)."""

from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term


@dataclass(frozen=True)
class Softcap(Term):
    NAME = "softcap"
    KIND = "nonlinear"
    ORDER = 1

    @classmethod
    def read(cls, ctx: LayerContext) -> "Softcap | None":
        """From ``attn_logit_softcapping`` of the module, else of the config."""
        cap = getattr(ctx.attn, "attn_logit_softcapping", None)
        cap = cap if cap is not None else getattr(ctx.cfg, "attn_logit_softcapping", None)
        return cls(float(cap)) if cap else None

    @classmethod
    def from_value(cls, value) -> "Softcap":
        return cls(float(value))

    def label(self) -> str:
        return f"soft-cap {self.value:g}"

    def describe(self, values: bool = True) -> str:
        return f"soft-cap {self.value:g}·tanh(x / {self.value:g})"


TERM = Softcap

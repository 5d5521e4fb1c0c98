"""A per-position query temperature (Llama 4's NoPE layers): the query of position t is
multiplied by ``τ_t = 1 + attn_scale·log(1 + ⌊(t + 1) / floor_scale⌋)``, read where the
layer's module tunes it and skips RoPE; folded into q
(:func:`~poskernel_tl.models.softmax_ops.fold_qk`). ``value``: (floor_scale, attn_scale)."""

from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term


@dataclass(frozen=True)
class Temperature(Term):
    NAME = "temperature"
    KIND = "row factor"
    ORDER = 2
    FOLDS = True

    @classmethod
    def read(cls, ctx: LayerContext) -> "Temperature | None":
        attn = ctx.attn
        if getattr(attn, "attn_temperature_tuning", False) and not getattr(attn, "use_rope",
                                                                           True):
            return cls((float(attn.floor_scale), float(attn.attn_scale)))
        if attn is None and getattr(ctx.cfg, "attn_temperature_tuning", False):
            raise ValueError("attn_temperature_tuning is set, but the layers' attention "
                             "modules (which say where it applies) were not found")
        return None

    def label(self) -> str:
        return "temperature"

    def describe(self, values: bool = True) -> str:
        floor, scale = self.value
        return f"query temperature 1 + {scale:g}·log(1 + ⌊(t + 1) / {floor:g}⌋)"


TERM = Temperature

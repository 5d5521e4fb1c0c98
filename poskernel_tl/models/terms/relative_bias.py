"""A learned table of per-head biases over bucketed offsets, added to the logits: T5's
``relative_attention_bias`` (Raffel et al., 2020; LongT5, Switch and T5Gemma keep it) and
MPNet's (Song et al., 2020). Buckets are exact up to a few offsets and logarithmic up to a
maximum distance, past which every offset shares the last bucket; two-sided in an encoder,
one-sided in a decoder. It is computed once, in a stack's first layer (T5) or by the
encoder (MPNet), and every layer of the stack adds the same b_h(t − s) (a layer that keeps
a table of its own reads its own).

Read by calling the model's own function at a probe length (T5's ``compute_bias`` of the
stack's first attention module, MPNet's ``compute_position_bias`` of its encoder): the
bias matrix it returns is checked to be a function of the offset alone, and b_h(Δ) is read
off it. ``value``: (bounds, table): the bias is constant on runs of offsets, the offsets
where it changes ascending in ``bounds`` (run r + 1 starting at Δ = bounds[r]; the first
run extends to −∞, the last to +∞: past the maximum distance nothing changes), and
``table[r][h]`` is run r's bias for query head h.
It does not fold into q and k: the fits add b_h(t − s) to the scores
(:meth:`known_kernel`)."""

import bisect
from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term

PROBE = 1024  # positions the model's bias function is read at (≥ twice the max distance)


def _owner(ctx: LayerContext):
    """The model's own function giving the layer's [1, head, n, n] bias at length n, or
    None where the layer has no relative bias."""
    attn, model = ctx.attn, ctx.model
    if getattr(attn, "has_relative_attention_bias", None) is not None and model is not None:
        first = attn if attn.has_relative_attention_bias else next(
            (m for m in model.modules() if type(m) is type(attn)
             and m.has_relative_attention_bias and m.is_decoder == attn.is_decoder), None)
        if first is None:
            raise ValueError(f"no {type(attn).__name__} of this stack holds the relative "
                             "attention bias")
        return lambda n: first.compute_bias(n, n)
    encoder = next((m for m in (model.modules() if model is not None else ())
                    if hasattr(m, "compute_position_bias")
                    and hasattr(m, "relative_attention_bias")), None)
    if encoder is not None and attn is not None:
        weight = encoder.relative_attention_bias.weight
        return lambda n: encoder.compute_position_bias(weight.new_zeros(1, n, 1))
    return None


def _runs(bias, n_heads: int) -> tuple[tuple[int, ...], tuple[tuple[float, ...], ...]]:
    """(bounds, table) of a [head, n, n] bias that is a function of t − s alone: the
    offsets where its value changes, and each run's value per head."""
    n = bias.shape[-1]
    b = bias.double().cpu().numpy().reshape(n_heads, n, n)
    for d in (1, n // 2, n - 1):  # every diagonal holds one value
        for diag in (b.diagonal(-d, 1, 2), b.diagonal(d, 1, 2)):
            if (diag != diag[:, :1]).any():
                raise ValueError("the relative attention bias is no function of the offset "
                                 "alone")
    column = lambda d: b[:, d, 0] if d >= 0 else b[:, 0, -d]  # b_h(Δ = d)
    bounds = [d for d in range(2 - n, n) if (column(d) != column(d - 1)).any()]
    if bounds and (bounds[-1] >= n // 2 or bounds[0] <= -n // 2):
        raise ValueError(f"the relative attention bias still changes past offset {n // 2}: "
                         "no table that ends at a maximum distance")
    runs = [1 - n, *bounds]
    return tuple(bounds), tuple(tuple(float(x) for x in column(d)) for d in runs)


@dataclass(frozen=True)
class RelativeBias(Term):
    NAME = "relative_bias"
    KIND = "offset"
    ORDER = 5

    @classmethod
    def read(cls, ctx: LayerContext) -> "RelativeBias | None":
        found = _owner(ctx)
        if found is None:
            return None
        return cls(_runs(found(PROBE).detach(), ctx.n_heads))

    @classmethod
    def from_value(cls, value) -> "RelativeBias":
        bounds, table = value
        return cls((tuple(int(x) for x in bounds),
                    tuple(tuple(float(x) for x in run) for run in table)))

    def recorded(self):
        bounds, table = self.value
        return [list(bounds), [list(run) for run in table]]

    def label(self) -> str:
        return "relative bias"

    def describe(self, values: bool = True) -> str:
        bounds, table = self.value
        sides = "two-sided" if bounds and bounds[0] <= 0 else "one-sided"
        far = max((abs(d) for d in bounds), default=0)
        text = (f"learned relative-position bias b_h(t − s): {len(table)} buckets, {sides}, "
                f"constant past |Δ| = {far}")
        if values:
            text += f", b = {min(map(min, table)):.3g} … {max(map(max, table)):.3g}"
        return text

    def known_kernel(self, lags, scale: float = 1.0):
        """b_h(Δ) per query head: the bias of the run each offset falls in (on the logits'
        scale)."""
        bounds, table = self.value
        runs = [table[bisect.bisect_right(bounds, int(d))] for d in lags]
        return [[run[h] for run in runs] for h in range(len(table[0]))]


TERM = RelativeBias

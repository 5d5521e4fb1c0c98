"""ALiBi (Press et al., 2022): an additive bias per query head in the paper's form
``scale·q_t·k_s − m_h·(t − s)``. Hugging Face's BLOOM, MPT and Falcon code adds a bias of
the key position alone (``m_h·s``, ``m_h·(s − T + 1)``, Falcon's before its 1/√d
scaling): it differs from the paper's form by a per-row constant, which the softmax
ignores and a Toeplitz fit does not, so the paper's form is what is fitted. ``m_h`` is the
slope on the softmax's own scale (Falcon's already multiplied by its 1/√d); the slopes are
read by calling each model's own builder (:mod:`poskernel_tl.models.alibi`). Folded into q
and k as two more dimensions (:func:`~poskernel_tl.models.softmax_ops.fold_qk`)."""

import math
from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term


@dataclass(frozen=True)
class Alibi(Term):
    NAME = "slopes"
    KIND = "offset"
    ORDER = 0
    PER_HEAD = True
    FOLDS = True

    @classmethod
    def read(cls, ctx: LayerContext) -> "Alibi | None":
        m = ctx.slopes
        if m is None:
            return None
        if len(m) != ctx.n_heads or not all(map(math.isfinite, m)):
            raise ValueError(f"ALiBi slopes {m} do not give one finite slope per query head")
        return cls(tuple(float(x) for x in m))

    def label(self) -> str:
        return "alibi"

    def describe(self, values: bool = True) -> str:
        m = self.value
        return f"ALiBi −m·(t − s), m = {max(m):.3g} … {min(m):.3g} over {len(m)} heads"

    def known_kernel(self, lags, scale: float = 1.0):
        """−m_h·Δ per query head (the slopes are on the softmax's own scale)."""
        return [[-m * float(d) for d in lags] for m in self.value]


TERM = Alibi

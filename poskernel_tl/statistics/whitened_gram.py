"""Track B diagnostic: the averaged Gram of centered *and whitened* queries and keys.

q̃ = (q − μ_q) W_q, k̃ = (k − μ_k) W_k with W = C^(-1/2) of the centering set's
covariance (:meth:`Moments.whitening`). The seed asks for it as an optional check: if
whitening changes R²_gram substantially, say so. It is Track B's Gram of the whitened
vectors, so it is kept and fitted by the same :class:`~poskernel_tl.reducers.gram.
GramReducer` (a float32 accumulator of the lower triangle, never a float64 T×T matrix;
its raw fit is the whitened Gram's, the centering having been applied before whitening).
It costs one more q·kᵀ per head and its own accumulator, so it runs only when asked for
(``poskernel run --whiten``). For a bidirectional model (``causal=False``) the fit reads
both triangles, like Track B's.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from jaxtyping import Float

from poskernel_tl.mask import Mask
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.gram import GramReducer
from poskernel_tl.reducers.gram_cost import accumulator_bytes
from poskernel_tl.reducers.moments import Moments
from poskernel_tl.schema import Part, column
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec


def whitened_layer_bytes(model: LoadedModel, length: int) -> int:
    """``--whiten``'s state for one layer: its Track B accumulator and the float64 sums of
    the whitened q and k."""
    s = model.spec
    vectors = (s.n_heads + s.n_kv_heads) * length * s.d_head
    return accumulator_bytes(model, length, False) + vectors * 8


@dataclass
class WhitenedGramResult(Part):
    NAME = "whitened"
    r2_gram_whitened: Float[np.ndarray, "layer head_index"] = column("trackB",
                                                                      "R2_gram_whitened")


class WhitenedGramReducer:
    def __init__(self, centering: Moments, scale: float, masks: Sequence[Mask]):
        """``masks``: per layer, the entries its softmax keeps, as Track B's."""
        white_q, white_k = centering.whitening()
        self.mean_q, self.mean_k = centering.mean_q, centering.mean_k  # float32
        self.white_q, self.white_k = white_q.float(), white_k.float()  # [L, H(kv), d, d]
        L, H, T, d = self.mean_q.shape
        if (len(masks), masks[0].length) != (L, T):
            raise ValueError(f"{len(masks)} masks of length {masks[0].length} for the "
                             f"centering's {L} layers of {T} positions")
        self.gram = GramReducer(masks, H, self.mean_k.shape[1], d, scale, self.mean_q.device,
                                full=False)

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        # [b, T, H, d]: centered per position, then each head's whitening on the right
        q = (batch.q.float() - self.mean_q[L].transpose(0, 1)).transpose(1, 2)
        k = (batch.k.float() - self.mean_k[L].transpose(0, 1)).transpose(1, 2)
        self.gram.update(LayerBatch(L, (q @ self.white_q[L]).transpose(1, 2),
                                    (k @ self.white_k[L]).transpose(1, 2),
                                    batch.index, batch.scale, batch.rows))

    def result(self) -> WhitenedGramResult:
        return WhitenedGramResult(self.gram.result().r2_gram_raw)


def build(run: StatisticContext) -> WhitenedGramReducer | None:
    """Only with ``--whiten`` (which needs centering sequences)."""
    if not run.options.whiten:
        return None
    return WhitenedGramReducer(run.centering, run.model.logit_scale, run.masks)


STATISTIC = StatisticSpec(
    "whitened", WhitenedGramResult, build,
    "Track B's Gram of the centered and whitened q and k (--whiten)",
    state_bytes=lambda model, work: (model.spec.n_layers * whitened_layer_bytes(
        model, work.length) if work.whiten else 0))

__all__ = ["STATISTIC", "WhitenedGramReducer", "WhitenedGramResult", "whitened_layer_bytes"]

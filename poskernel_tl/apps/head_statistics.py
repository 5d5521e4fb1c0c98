"""Every registered per-head statistic of one head on one sequence: the head view's rows
from the statistic registry (:data:`~poskernel_tl.reducers.registry.STATISTICS`), each
statistic's own reducer fed the layer's q and k of the view's forward, as ``pk.measure``
feeds it."""

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.plan.config import MeasureConfig
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.registry import STATISTICS
from poskernel_tl.reducers.statistic import Run


def head_statistics(model: LoadedModel, layer: int, head: int,
                    q: Float[Tensor, "pos head_index d_head"],
                    k: Float[Tensor, "pos kv_head_index d_head"]) -> dict[str, float]:
    """Label -> value of every per-head column the registered statistics declare, for
    ``head`` of ``layer`` on the one sequence whose q and k (every head of the layer)
    are given."""
    T = q.shape[0]
    run = Run(model, T, 1, MeasureConfig(null_seqs=1, null_perms=0))
    batch = LayerBatch(layer, q[None], k[None], torch.zeros(1, dtype=torch.long,
                                                            device=q.device),
                       model.logit_scale, rows=(0,), terms=model.spec.layer_terms(layer))
    out = {}
    for stat in STATISTICS.values():
        if not stat.head_columns or (red := stat.build(run)) is None:
            continue
        red.update(batch)
        part = red.result()
        out.update({label: float(np.asarray(getattr(part, col))[layer, head])
                    for col, label in stat.head_columns.items()})
    return out


__all__ = ["head_statistics"]

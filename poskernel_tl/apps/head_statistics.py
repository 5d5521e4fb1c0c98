"""Every registered statistic on one sequence, for the head view: each statistic's own
reducer (:data:`~poskernel_tl.statistics.registry.STATISTICS`) fed the layer's q and k of
the view's forward, as ``pk.measure`` feeds it, and completed as it completes it
(``finish``, with Track A's reducer of the same batch beside it). The view shows their
per-head columns (:func:`statistic_values`) and their declared panels."""

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.plan.config import MeasureConfig
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.track_a import TrackAReducer
from poskernel_tl.schema import Part
from poskernel_tl.statistics.registry import STATISTICS
from poskernel_tl.statistics.statistic import StatisticContext


def head_statistics(model: LoadedModel, geometry: Geometry, layer: int,
                    q: Float[Tensor, "pos head_index d_head"],
                    k: Float[Tensor, "pos kv_head_index d_head"]) -> dict[str, Part]:
    """Name -> part of every registered statistic that shows something per head (columns
    or panels), for ``layer`` on the one sequence whose q and k (every head of the layer)
    are given (``geometry``: that sequence's); the parts' other layers are not measured."""
    run = StatisticContext(model, geometry, 1, MeasureConfig(null_seqs=1, null_perms=0))
    batch = LayerBatch(layer, q[None], k[None], torch.zeros(1, dtype=torch.long,
                                                            device=q.device),
                       model.logit_scale, rows=(0,), terms=model.spec.layer_terms(layer))
    track_a = TrackAReducer(1, geometry.masks, model.spec.n_heads, q.device)
    track_a.update(batch)
    out = {}
    for stat in STATISTICS.values():
        if not (stat.head_columns or stat.part.PANELS) or (red := stat.build(run)) is None:
            continue
        red.update(batch)
        part = red.result()
        if stat.finish is not None:
            part = stat.finish(part, {"track_a": track_a, stat.name: red}, run)
        out[stat.name] = part
    return out


def statistic_values(parts: dict[str, Part], layer: int, head: int) -> dict[str, float]:
    """Label -> value of every per-head column the statistics of ``parts`` declare."""
    return {label: float(np.asarray(getattr(parts[stat.name], col))[layer, head])
            for stat in STATISTICS.values() if stat.name in parts
            for col, label in stat.head_columns.items()}


__all__ = ["head_statistics", "statistic_values"]

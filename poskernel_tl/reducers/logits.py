"""The full logit matrices of a few evaluation sequences, for heatmaps and head pages
(the seed's visualization subset: evaluation indices 0, 11, …, 99 at T = 256)."""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.reducers.base import LayerBatch


@dataclass
class SavedLogits:
    """seq_id → logits [layer, head_index, query_pos, key_pos] (float32; NaN on and above
    the diagonal, which the causal mask removes)."""

    logits: dict[int, Float[np.ndarray, "layer head_index query_pos key_pos"]]


class LogitSaver:
    def __init__(self, wanted: dict[int, int], n_layers: int):
        self.wanted = wanted  # position within the pass -> seq_id
        self.layers: dict[int, list] = {i: [None] * n_layers for i in wanted}

    def update(self, batch: LayerBatch) -> None:
        for row, i in enumerate(batch.rows):
            if i in self.wanted:  # copies only the ≤ 10 wanted sequences to the host
                A = batch.scores[row].float()
                T = A.shape[-1]
                upper = torch.ones(T, T, dtype=torch.bool, device=A.device).triu()
                self.layers[i][batch.layer] = A.masked_fill(upper, float("nan")).cpu().numpy()

    def result(self) -> SavedLogits:
        return SavedLogits({self.wanted[i]: np.stack(v) for i, v in self.layers.items()
                            if all(x is not None for x in v)})

"""The pooled attention-sink mass: per head, the mean post-softmax weight on key 0 over
query rows t ≥ 1 and sequences, α_h = mean_t p[t, 0]; per condition, the share of heads
with α_h > 0.3. A pooled variant of Gu et al.'s metric (ICLR 2025), not theirs: they
threshold each sequence's α (row 0 included, divided by T) and average the indicator —
:mod:`poskernel_tl.statistics.sink_first` computes that, as released.

Read on the attention pattern of the measured forward (what the softmax reads under the
layer's mask, learned sink logits in the normaliser where the model has them): the rows'
normalisers come from :mod:`poskernel_tl.reducers.pattern`, formed once per layer and batch
for this metric and TransformerLens's previous-token score together, on the same first
``null_seqs`` sequences and (causal models) first MAX_POS positions. A row whose window no
longer holds key 0 puts no weight on it.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.pattern import PatternReader
from poskernel_tl.schema import Part, column
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec

EPSILON = 0.3  # the threshold on a head's pooled weight on the first token (Gu et al.'s ε)


@dataclass
class SinkMass(Part):
    NAME = "sink"
    sink_mass: Float[np.ndarray, "layer head_index"] = column("trackB", "sink_mass")


class SinkMassReducer:
    def __init__(self, run: StatisticContext):
        s = run.spec
        self.reader = PatternReader.of(run)
        self.total = torch.zeros(s.n_layers, s.n_heads, dtype=torch.float64, device=run.device)
        self.n_seen = np.zeros(s.n_layers, dtype=int)

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        if batch.on_kernels:  # one pass for every pattern statistic and layer of a group
            sums = self.reader.sums(batch)
            if sums is not None:
                batch.add(self.total, sums.first.sum(0) / (sums.positions - 1))
                for L in batch.layers:
                    self.n_seen[L] += len(sums.keep)
            return
        for one in batch.split():
            self._update_layer(one)

    def _update_layer(self, batch: LayerBatch) -> None:
        L = batch.layer
        rows = self.reader.rows(batch)
        if rows is None:
            return
        T = rows.positions
        first = torch.zeros(T - 1, dtype=torch.long, device=rows.q.device)  # key 0
        self.total[L] += rows.weight(batch.scale, batch.terms, slice(1, T), first).mean(
            -1).sum(0).to(self.total)
        self.n_seen[L] += len(rows.keep)

    def result(self) -> SinkMass:
        return SinkMass(self.total.cpu().numpy() / np.maximum(self.n_seen, 1)[:, None])


def share_above(heads: pd.DataFrame) -> dict[str, float]:
    return {"sink_heads": float((heads["sink_mass"] > EPSILON).mean())}


STATISTIC = StatisticSpec(
    "sink", SinkMass, SinkMassReducer,
    "the pooled sink mass: a head's mean attention weight on key 0 over rows t ≥ 1 and "
    "sequences, and the share of heads above 0.3 (a pooled variant of Gu et al.'s metric; "
    "theirs, as released, is Sink₁)",
    state_bytes=lambda model, work: model.spec.n_layers * model.spec.n_heads * 8,
    head_columns={"sink_mass": "attention-sink mass (mean weight on key 0, rows t ≥ 1)"},
    condition_values=share_above,
    condition_labels={"sink_heads": f"share of heads with pooled sink mass > {EPSILON}"})

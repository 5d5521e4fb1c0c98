"""Mean attention distance: per query row t, d(t) = Σ_s p(t, s)·|t − s| (for a causal
model the mean offset Σ_s p(t, s)·(t − s) of the keys the row attends to), averaged over
sequences; per head, its mean over query rows (``attn_distance`` in ``heads.csv``) and the
curve d(t) in the head view.

Read on the attention pattern of the measured forward, as the sink mass is, on the first
``null_seqs`` sequences and (causal models) the first 2048 positions (rows past them are
NaN): each row's d(t) comes with its normaliser from :mod:`poskernel_tl.reducers.pattern`
(one pass over the rows' logits for both; on the kernels' path one launch for every layer
of a group). Learned sinks take their share of a row and add no distance.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.panels import Panel
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.pattern import PatternReader
from poskernel_tl.schema import Part, column, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec, mean_of


@dataclass
class AttnDistance(Part):
    NAME = "attn_distance"
    PANELS = (Panel("curve", "Attention distance by query row", "attn_distance_rows",
                    x="query row t", y="Σ_s p(t, s)·|t − s| (tokens)", first=0,
                    note="Mean over the measured sequences of each row's attention-weighted "
                         "offset to its keys; the head's attn_distance is its mean over "
                         "rows."),)
    attn_distance: Float[np.ndarray, "layer head_index"] = column("trackB", "attn_distance")
    attn_distance_rows: Float[np.ndarray, "layer head_index query_pos"] = stored(
        "attn_distance.npz", "rows")


class AttnDistanceReducer:
    def __init__(self, run: StatisticContext):
        s = run.spec
        self.reader = PatternReader.of(run)
        self.total = torch.zeros(s.n_layers, s.n_heads, run.length, dtype=torch.float64,
                                 device=run.device)
        self.n_seen = np.zeros(s.n_layers, dtype=int)
        self.positions = run.length

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        if batch.on_kernels:  # one pass for every pattern statistic and layer of a group
            sums = self.reader.sums(batch)
            if sums is not None:
                self.positions = sums.positions
                batch.add(self.total[..., :sums.positions], sums.distance.sum(0))
                for L in batch.layers:
                    self.n_seen[L] += len(sums.keep)
            return
        for one in batch.split():
            rows = self.reader.rows(one)
            if rows is None:
                continue
            self.positions = rows.positions
            self.total[one.layer, :, :rows.positions] += rows.offset_mean.sum(0).to(self.total)
            self.n_seen[one.layer] += len(rows.keep)

    def result(self) -> AttnDistance:
        per_row = self.total.cpu().numpy() / np.maximum(self.n_seen, 1)[:, None, None]
        per_row[..., self.positions:] = np.nan  # rows the pattern statistics do not read
        return AttnDistance(per_row[..., :self.positions].mean(-1), per_row)


STATISTIC = StatisticSpec(
    "attn_distance", AttnDistance, AttnDistanceReducer,
    "mean attention distance: per query row Σ_s p(t, s)·|t − s|, its mean over rows per head",
    state_bytes=lambda model, work: model.spec.n_layers * model.spec.n_heads * work.length * 8,
    head_columns={"attn_distance": "mean attention distance Σ_s p(t, s)·|t − s| (tokens)"},
    condition_values=mean_of("attn_distance", "attn_distance"),
    condition_labels={"attn_distance": "mean attention distance (tokens), mean over heads"})

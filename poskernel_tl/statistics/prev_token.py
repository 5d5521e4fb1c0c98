"""TransformerLens's previous-token-head score of every head, on the evaluation sequences.

``transformer_lens.head_detector.detect_head(model, seqs, "previous_token_head")`` runs its
own cached forward on text; here the same score — TransformerLens's detection pattern
(``get_previous_token_head_detection_pattern``: ones at key t − 1) and similarity
(``compute_head_attention_similarity_score``, ``"mul"``: Σ pattern · detection / Σ pattern,
BOS and the current token included) — is taken on the attention pattern of the measured
forward (:mod:`poskernel_tl.reducers.pattern`: what the softmax reads under the layer's
mask, its rows' normalisers shared with the other pattern statistics), for the first
``null_seqs`` evaluation sequences and, for a causal model, the first
:data:`~poskernel_tl.reducers.pattern.MAX_POS` positions (exactly TransformerLens's score
of the sequences cut to that length). Each row of a pattern sums to 1 (less what learned
sinks take), so the score is Σ_t pattern[t, t − 1] / Σ_t Σ_s pattern[t, s]. The kernel
classes are checked against it (the report's atlas).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.mask import Mask
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.pattern import MAX_POS, PatternReader
from poskernel_tl.schema import Part, column
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec


@dataclass
class PrevTokenScore(Part):
    NAME = "prev_token"
    tl_prev_token: Float[np.ndarray, "layer head_index"] = column("trackB", "tl_prev_token")


class PrevTokenReducer:
    def __init__(self, masks: Sequence[Mask], n_heads: int, max_seqs: int = 8,
                 max_pos: int = MAX_POS, device="cpu"):
        """``masks``: per layer, the entries its softmax keeps (the pattern's keys)."""
        self.reader = PatternReader(max_seqs, masks, max_pos)
        self.total = torch.zeros(len(masks), n_heads, dtype=torch.float64, device=device)
        self.n_seen = np.zeros(len(masks), dtype=int)

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        if batch.on_kernels:  # one pass for every pattern statistic and layer of a group
            sums = self.reader.sums(batch)
            if sums is not None:
                batch.add(self.total, (sums.prev / sums.share).sum(0))
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
        prev = rows.weight(batch.scale, batch.terms, slice(1, T),
                           torch.arange(T - 1, device=rows.q.device))  # key t − 1
        mass = T if rows.token_mass is None else rows.token_mass.sum(-1)
        self.total[L] += (prev.sum(-1) / mass).sum(0).to(self.total)
        self.n_seen[L] += len(rows.keep)

    def result(self) -> PrevTokenScore:
        n = np.maximum(self.n_seen, 1)[:, None]
        return PrevTokenScore(tl_prev_token=self.total.cpu().numpy() / n)


def build(run: StatisticContext) -> PrevTokenReducer:
    return PrevTokenReducer(run.masks, run.spec.n_heads, max_seqs=run.options.null_seqs,
                            device=run.device)


STATISTIC = StatisticSpec(
    "prev_token", PrevTokenScore, build,
    "TransformerLens's previous-token-head score on the measured attention pattern",
    state_bytes=lambda model, work: model.spec.n_layers * model.spec.n_heads * 8,
    head_columns={"tl_prev_token": "TransformerLens previous-token score"})


__all__ = ["STATISTIC", "PrevTokenReducer", "PrevTokenScore"]

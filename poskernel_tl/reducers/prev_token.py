"""TransformerLens's previous-token-head score of every head, on the evaluation sequences.

``transformer_lens.head_detector.detect_head(model, seqs, "previous_token_head")`` runs its
own cached forward on text; here the same score — TransformerLens's detection pattern
(``get_previous_token_head_detection_pattern``: ones at key t − 1) and similarity
(``compute_head_attention_similarity_score``, ``"mul"``: Σ pattern · detection / Σ pattern,
BOS and the current token included) — is taken on the attention pattern of the measured
forward: softmax of scale·q·kᵀ under the layer's mask (causal, and a sliding window where
the layer has one; none for a bidirectional model), for the first ``max_seqs`` evaluation
sequences. Each row of a pattern sums to 1, so the score is the mean over rows of
pattern[t, t − 1] = exp(A[t, t − 1] − logsumexp_s A[t, s]): one [T, T] product and one
log-sum-exp per head, no pattern kept. A causal model's score is taken on the first
``MAX_POS`` positions: exactly TransformerLens's score of the sequences cut to that length
(a causal row sees no later token), at (MAX_POS / T)² of the cost at long T. The kernel
classes are checked against it (:mod:`poskernel_tl.fit.kernel_class`); nothing else reads it.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.hooks.masks import band
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, column


@dataclass
class PrevTokenScore(Part):
    NAME = "prev_token"
    tl_prev_token: Float[np.ndarray, "layer head_index"] = column("trackB", "tl_prev_token")


MAX_POS = 2048


class PrevTokenReducer:
    def __init__(self, n_layers: int, n_heads: int, length: int, max_seqs: int = 8,
                 causal: bool = True, max_lags: list[int] | None = None,
                 max_pos: int = MAX_POS):
        self.max_seqs, self.causal, self.max_lags = max_seqs, causal, max_lags
        self.positions = min(length, max_pos) if causal else length
        self.total = np.zeros((n_layers, n_heads))
        self.n_seen = np.zeros(n_layers, dtype=int)

    def update(self, batch: LayerBatch) -> None:
        keep = [i for i, row in enumerate(batch.rows) if row < self.max_seqs]
        if not keep:
            return
        T = self.positions
        masked = None  # a bidirectional model's pattern reads every key
        if self.causal:  # the layer's causal mask, or its window of Δ ≤ max_lag
            last = T - 1 if self.max_lags is None else min(self.max_lags[batch.layer], T - 1)
            masked = ~band(T, last + 1, batch.q.device)
        group = batch.q.shape[2] // batch.k.shape[2]
        for x in keep:  # one [T, T] matrix of logits at a time
            for h in range(batch.q.shape[2]):
                A = batch.q[x, :T, h].float() @ batch.k[x, :T, h // group].float().T
                A = A.mul_(batch.scale)
                if masked is not None:
                    A.masked_fill_(masked, float("-inf"))
                prev = (A.diagonal(-1) - torch.logsumexp(A[1:], -1)).exp_().sum()
                self.total[batch.layer, h] += prev.item() / T
        self.n_seen[batch.layer] += len(keep)

    def result(self) -> PrevTokenScore:
        return PrevTokenScore(tl_prev_token=self.total / np.maximum(self.n_seen, 1)[:, None])

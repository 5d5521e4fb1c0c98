"""TransformerLens's previous-token-head score of every head, on the evaluation sequences.

``transformer_lens.head_detector.detect_head(model, seqs, "previous_token_head")`` runs its
own cached forward on text; here the same score — TransformerLens's detection pattern
(``get_previous_token_head_detection_pattern``: ones at key t − 1) and similarity
(``compute_head_attention_similarity_score``, ``"mul"``: Σ pattern · detection / Σ pattern,
BOS and the current token included) — is taken on the attention pattern of the measured
forward: softmax of scale·q·kᵀ under the layer's mask (causal, and a sliding window where
the layer has one; none for a bidirectional model), for the first ``max_seqs`` evaluation
sequences. Each row of a pattern sums to 1, so the score is the mean over rows of
pattern[t, t − 1] = exp(A[t, t − 1] − logsumexp_s A[t, s]): A[t, t − 1] = scale·q_t·k_{t−1}
(plus what the layer's softmax adds: an ALiBi ramp, a temperature, a soft-cap) and one
log-sum-exp per row over the keys its mask keeps (and the layer's learned sink logits,
gpt-oss, which join every row's normaliser), formed in blocks of rows (a
causal block reads only the keys up to its last row), no pattern kept. A causal model's
score is taken on the first ``MAX_POS`` positions: exactly TransformerLens's score of the
sequences cut to that length (a causal row sees no later token), at (MAX_POS / T)² of the
cost at long T. The kernel
classes are checked against it (:mod:`poskernel_tl.fit.kernel_class`); nothing else reads it.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.hooks.masks import band
from poskernel_tl.models.softmax_terms import (
    NONE,
    SoftmaxTerms,
    cap_scores,
    logsumexp_with_sinks,
    sink_logits,
)
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, column


@dataclass
class PrevTokenScore(Part):
    NAME = "prev_token"
    tl_prev_token: Float[np.ndarray, "layer head_index"] = column("trackB", "tl_prev_token")


MAX_POS = 2048
ROWS = 256  # query rows per block of logits


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
        T, (bq, bk), terms = self.positions, batch.logit_qk, batch.terms
        kv = bk.shape[2]
        # the keys each row reads: every key (bidirectional), or Δ = t − s in [0, last]
        last = None if not self.causal else T - 1 if self.max_lags is None else \
            min(self.max_lags[batch.layer], T - 1)
        g = bq.shape[2] // kv
        sinks = sink_logits(terms, bq.device)
        for x in keep:  # a kv head's query heads together, ROWS query rows at a time
            for j in range(kv):
                # float32, or float64 where an ALiBi ramp is folded in (its terms cancel)
                dtype = torch.float64 if bq.dtype == torch.float64 else torch.float32
                q = bq[x, :T, j * g:(j + 1) * g].to(dtype).transpose(0, 1)  # [g, T, d]
                k = bk[x, :T, j].to(dtype)
                prev = cap_scores((q[:, 1:] * k[:-1]).sum(-1).mul_(batch.scale), terms)
                tokens = self._row_logsumexp(q, k, batch.scale, last, terms)
                lse = logsumexp_with_sinks(tokens, None if sinks is None
                                           else sinks[j * g:(j + 1) * g])
                # TL's Σ pattern·detection / Σ pattern: a row's mass on tokens is 1 less
                # what its sink takes
                mass = T if sinks is None else (tokens - lse).exp().sum(-1)
                score = (prev - lse[:, 1:]).exp_().sum(-1) / mass
                self.total[batch.layer, j * g:(j + 1) * g] += score.cpu().numpy()
        self.n_seen[batch.layer] += len(keep)

    @staticmethod
    def _row_logsumexp(q: Float[torch.Tensor, "head pos d_head"],
                       k: Float[torch.Tensor, "pos d_head"], scale: float, last: int | None,
                       terms: SoftmaxTerms = NONE) -> Float[torch.Tensor, "head pos"]:
        """logsumexp_s A[t, s] over the keys row t reads (``last`` None: all of them),
        formed ROWS rows at a time over those keys only (a causal row block reads about
        half the keys of the whole matrix)."""
        T = q.shape[1]
        out = q.new_empty(q.shape[:2])
        for r0 in range(0, T, ROWS):
            r1 = min(T, r0 + ROWS)
            lo, hi = (0, T) if last is None else (max(0, r0 - last), r1)
            A = cap_scores(torch.matmul(q[:, r0:r1], k[lo:hi].T).mul_(scale), terms)
            if last is not None:
                A.masked_fill_(~band(T, last + 1, q.device)[r0:r1, lo:hi], float("-inf"))
            out[:, r0:r1] = torch.logsumexp(A, -1)
        return out

    def result(self) -> PrevTokenScore:
        return PrevTokenScore(tl_prev_token=self.total / np.maximum(self.n_seen, 1)[:, None])

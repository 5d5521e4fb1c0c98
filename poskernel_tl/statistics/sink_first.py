"""Gu et al.'s attention-sink metric Sink₁ (ICLR 2025, "When attention sink emerges in
language models") as their released evaluation computes it.

Per sequence x and head, the importance of key k is α_k(x) = Σ_i p_x[i, k] / (T − k): the
attention weight on key k summed over every row that reads it (rows i ≥ k of a causal
model, the row i = k included) over the number of those rows. A head is a sink head on a
sequence when α_0(x) > ε = 0.3, and Sink₁ is the mean of that indicator over sequences,
layers and heads. Per head this module keeps the share of sequences on which it is a sink
head (``sink1_share``; Sink₁ of the condition is its mean over heads, every head seeing the
same sequences) and α_k for k < :data:`KEYS` averaged over the sequences (``sink1.npz``).
For an encoder every row reads every key: α_k is its mean weight over the T rows.

Read on the attention pattern of the measured forward (what the softmax reads under the
layer's mask, learned sink logits in the normaliser where the model has them, so rows sum
to less than 1 there): the rows' normalisers of :mod:`poskernel_tl.reducers.pattern`, on
the first ``null_seqs`` evaluation sequences and, for a causal model, the first
:data:`~poskernel_tl.reducers.pattern.MAX_POS` positions (Gu et al. use T = 64; past
MAX_POS tokens α is that of the sequences cut to it). A sliding window's row that no
longer holds key k puts no weight on it (and still counts among the T − k rows).

:mod:`poskernel_tl.statistics.sink_mass` keeps the earlier, pooled statistic (the mean weight
on key 0 over rows t ≥ 1 and sequences), which is not Gu et al.'s.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.pattern import PatternReader
from poskernel_tl.schema import Part, column, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec, mean_of

EPSILON = 0.3  # Gu et al.'s ε
KEYS = 5  # α_k kept for k = 0 … KEYS − 1


@dataclass
class SinkFirst(Part):
    NAME = "sink1"
    sink1_share: Float[np.ndarray, "layer head_index"] = column("trackB", "sink1_share")
    alpha: Float[np.ndarray, "layer head_index first_key"] = stored("sink1.npz", "alpha")


class SinkFirstReducer:
    def __init__(self, run: StatisticContext):
        s = run.spec
        self.reader = PatternReader.of(run)
        self.alpha = torch.zeros(s.n_layers, s.n_heads, KEYS, dtype=torch.float64,
                                 device=run.device)
        self.sinks = torch.zeros(s.n_layers, s.n_heads, dtype=torch.float64, device=run.device)
        self.n_seen = np.zeros(s.n_layers, dtype=int)

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        if batch.on_kernels:  # one pass for every pattern statistic and layer of a group
            sums = self.reader.sums(batch)
            if sums is not None:
                n = sums.alpha.shape[-1]
                batch.add(self.alpha[..., :n], sums.alpha.sum(0))
                batch.add(self.sinks, (sums.alpha[..., 0] > EPSILON).sum(0, dtype=torch.float64))
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
        P = rows.positions
        n = min(KEYS, P)
        keys = torch.arange(n, dtype=torch.float64, device=self.alpha.device)
        readers = P - keys if self.reader.causal else torch.full_like(keys, P)  # rows reading k
        alpha = rows.first_keys(batch.scale, batch.terms, n).double().sum(2).to(
            self.alpha) / readers
        self.alpha[L, :, :n] += alpha.sum(0)
        self.sinks[L] += (alpha[..., 0] > EPSILON).double().sum(0)
        self.n_seen[L] += len(rows.keep)

    def result(self) -> SinkFirst:
        n = np.maximum(self.n_seen, 1)
        return SinkFirst(self.sinks.cpu().numpy() / n[:, None],
                         self.alpha.cpu().numpy() / n[:, None, None])


STATISTIC = StatisticSpec(
    "sink1", SinkFirst, SinkFirstReducer,
    "Gu et al.'s Sink₁ as released: a head is a sink head on a sequence when its weight on "
    "key 0 summed over the rows and divided by T exceeds 0.3; Sink₁ is the share of "
    "(sequence, layer, head) that are (their Table 1, T = 64: 92–99 % on natural text for "
    "7–8 B RoPE models, 75–91 % on random tokens, 0 % on repeated ones)",
    state_bytes=lambda model, work: model.spec.n_layers * model.spec.n_heads * (KEYS + 1) * 8,
    head_columns={"sink1_share": "Sink₁: share of sequences with α₀ > 0.3 (Gu et al.)"},
    condition_values=mean_of("sink1_share", "Sink1"),
    condition_labels={"Sink1": "Sink₁ (Gu et al.): share of sequence × head with α₀ > 0.3"})

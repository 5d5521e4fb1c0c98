"""What the statistics on the attention pattern read (TransformerLens's previous-token
score, the attention-sink mass and Sink₁, the attention distance), formed once per batch
for all of them.

The pattern of row t is p[t, s] = exp(A[t, s] − lse_t), with A = scale·q·kᵀ plus what
the layer's softmax adds (an ALiBi ramp or a temperature folded into q and k, an offset
table added, a soft-cap;
:mod:`poskernel_tl.models.softmax_terms`) and lse_t the log-sum-exp over the keys the
layer's mask keeps (causal, a sliding window, or every key for a bidirectional model)
and, where the model has them (gpt-oss), its learned sink logits. A statistic that needs
a few entries of the pattern forms those entries from q and k and reads lse from here: no
pattern is kept. On a CPU the log-sum-exp is formed in blocks of :data:`ROWS` rows over
the keys they read (a causal block reads the keys up to its last row only:
:class:`PatternRows`, per layer); on the kernels' path one tiled kernel forms, for every
layer of a group, each row's normaliser and from it the sums every pattern statistic
reads (:class:`PatternSums`, :mod:`poskernel_tl.kernels.pattern_pass`).

Taken on the first ``max_seqs`` sequences of the pass and, for a causal model, the first
:data:`MAX_POS` positions: a causal row sees no later token, so this is exactly the
pattern of the sequences cut to that length, at (MAX_POS / T)² of the cost at long T.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.mask import Mask
from poskernel_tl.models.softmax_ops import (
    entry_offsets,
    finish_scores,
    logsumexp_with_sinks,
    sink_logits,
)
from poskernel_tl.reducers.base import LayerBatch

MAX_POS = 2048
ROWS = 256  # query rows per block of logits


@dataclass(frozen=True)
class PatternRows:
    """The rows' normalisers of the batch's sequences at positions < ``max_seqs``.

    ``keep``: their rows in the batch; ``q``/``k``: their logit q/k over ``positions``
    (float32, or float64 where an ALiBi ramp is folded in); ``lse``: log of each row's
    normaliser (its keys and any sink logits); ``token_mass``: the share of each row on
    tokens (1 less what the learned sinks take; None without sinks); ``mask``: the keys a
    row reads (:class:`~poskernel_tl.mask.Mask` over ``positions``);
    ``offset_mean``: each row's Σ_s p(t, s)·|t − s|, formed in the same pass as its
    normaliser."""

    keep: list[int]
    q: Float[Tensor, "seq pos head_index d_logit"]
    k: Float[Tensor, "seq pos kv_head_index d_logit"]
    lse: Float[Tensor, "seq head_index pos"]
    token_mass: Float[Tensor, "seq head_index pos"] | None
    mask: Mask
    offset_mean: Float[Tensor, "seq head_index pos"] | None = None

    @property
    def positions(self) -> int:
        return self.q.shape[1]

    def entries(self, scale: float, terms, rows: slice, keys: Tensor
                ) -> Float[Tensor, "seq head_index pos"]:
        """A[t, keys[t]] (what the softmax reads) for query rows ``rows``: one key per row,
        formed from q and k (GQA keys broadcast)."""
        q, k = self.q[:, rows], self.k[:, keys]  # [b, n, H, d], [b, n, kv, d]
        group = q.shape[2] // k.shape[2]
        a = (q * k.repeat_interleave(group, dim=2)).sum(-1).mul_(scale).transpose(1, 2)
        T = self.positions
        return finish_scores(a, terms, lambda: torch.arange(T, device=a.device)[rows] -
                             keys.to(a.device), T)

    def first_keys(self, scale: float, terms, n: int
                   ) -> Float[Tensor, "seq head_index pos key"]:
        """The pattern p[t, s] of every row on the first ``n`` keys s < n (0 where the mask
        removes the key: s > t, or t − s past the window), formed in one product."""
        q, k = self.q, self.k[:, :n]
        group = q.shape[2] // k.shape[2]
        a = torch.einsum("bthd,bshd->bhts", q, k.repeat_interleave(group, dim=2)).mul_(scale)
        T = self.positions
        delta = lambda: entry_offsets(torch.arange(T, device=a.device),
                                      torch.arange(n, device=a.device))
        p = (finish_scores(a, terms, delta, T) - self.lse[..., None]).exp_()
        if not self.mask.every_key:
            p = p * self.mask.kept(torch.arange(T, device=p.device),
                                   torch.arange(n, device=p.device), diagonal=True)
        return p

    def weight(self, scale: float, terms, rows: slice, keys: Tensor
               ) -> Float[Tensor, "seq head_index pos"]:
        """The pattern p[t, keys[t]] of rows ``rows`` (0 where the mask removes the key)."""
        p = (self.entries(scale, terms, rows, keys) - self.lse[..., rows]).exp_()
        if not self.mask.every_key:
            t = torch.arange(self.positions, device=p.device)[rows]
            p = p * self.mask.keeps(t, keys.to(t.device), diagonal=True)
        return p


@dataclass(frozen=True)
class PatternReader:
    """What a statistic on the pattern reads of every batch: the rows of the first
    ``max_seqs`` sequences, under each layer's mask (``masks``: one per layer, causal or
    two-sided, its window and chunk), on the first ``max_pos`` positions of a causal
    model. :meth:`of` a statistic's run: its ``null_seqs`` sequences."""

    max_seqs: int
    masks: Sequence[Mask]
    max_pos: int = MAX_POS

    @classmethod
    def of(cls, run) -> "PatternReader":
        """The reader of a :class:`~poskernel_tl.statistics.statistic.StatisticContext`."""
        return cls(run.options.null_seqs, run.masks)

    @property
    def causal(self) -> bool:
        """Whether the layers' masks are causal (else two-sided)."""
        return self.masks[0].causal

    def mask(self, batch: LayerBatch) -> Mask:
        """The keys each row of ``batch``'s first layer reads, over the positions read."""
        mask = self.masks[batch.layers[0]].cut(batch.q.shape[1])
        return mask.cut(min(mask.length, self.max_pos)) if mask.causal else mask

    def rows(self, batch: LayerBatch) -> PatternRows | None:
        """:func:`pattern_rows` of ``batch`` (None: none of its sequences is read)."""
        return pattern_rows(batch, self.max_seqs, self.mask(batch))

    def sums(self, batch: LayerBatch) -> "PatternSums | None":
        """:func:`pattern_sums` of ``batch``, a group of layers on the kernels' path (None:
        none of its sequences is read)."""
        return pattern_sums(batch, self.max_seqs, self.mask(batch))


@dataclass(frozen=True)
class PatternSums:
    """What the pattern statistics read of the batch's sequences at positions below
    ``max_pos`` on the kernels' path, formed in one pass over their logits
    (:mod:`poskernel_tl.kernels.pattern_pass`): ``keep`` their rows in the batch,
    ``positions`` the rows read; ``distance`` each row's Σ_s p(t, s)·|t − s|; per
    (sequence, head) ``alpha`` (Σ_t p(t, k) over the rows reading key k, k <
    :data:`ALPHA_KEYS`), ``prev`` (Σ_t p(t, t − 1)), ``first`` (Σ_{t ≥ 1} p(t, 0)) and
    ``share`` (Σ_t the row's share on tokens: the rows, less what learned sinks take)."""

    keep: list[int]
    positions: int
    distance: Float[Tensor, "seq head_index pos"]
    alpha: Float[Tensor, "seq head_index key"]
    prev: Float[Tensor, "seq head_index"]
    first: Float[Tensor, "seq head_index"]
    share: Float[Tensor, "seq head_index"]


ALPHA_KEYS = 5  # the first keys whose α_k the pass sums (Sink₁ reads α_0..α_4)


def pattern_sums(batch: LayerBatch, max_seqs: int, mask: Mask) -> PatternSums | None:
    """The :class:`PatternSums` of ``batch`` (None when none of its sequences is among the
    first ``max_seqs``) over ``mask``'s positions, formed on first use and shared through
    ``batch.shared``."""
    key = ("pattern_sums", max_seqs, mask.length)
    if key not in batch.shared:
        keep = [i for i, row in enumerate(batch.rows) if row < max_seqs]
        batch.shared[key] = None
        if keep:
            if not mask.kernels:
                raise ValueError(f"pattern_sums: the kernels do not take {mask}")
            T, last = mask.length, None if mask.every_key else mask.last
            sel = slice(keep[0], keep[-1] + 1)  # (the first rows of a pass: consecutive)
            dist, sums = kernels.pattern_sums(
                batch.q[sel, :T], batch.k[sel, :T], batch.scale, last, batch.terms,
                min(ALPHA_KEYS, T), sink_logits(batch.terms, batch.q.device))
            n = min(ALPHA_KEYS, T)
            batch.shared[key] = PatternSums(keep, T, dist, sums[..., :n], sums[..., n],
                                            sums[..., n + 1], sums[..., n + 2])
    return batch.shared[key]


def pattern_rows(batch: LayerBatch, max_seqs: int, mask: Mask) -> PatternRows | None:
    """The :class:`PatternRows` of ``batch`` (None when none of its sequences is among the
    first ``max_seqs``) over ``mask``'s positions, formed on first use and shared through
    ``batch.shared``."""
    key = ("pattern_rows", max_seqs, mask.length)
    if key not in batch.shared:
        batch.shared[key] = _pattern_rows(batch, max_seqs, mask)
    return batch.shared[key]


def _pattern_rows(batch: LayerBatch, max_seqs: int, mask: Mask) -> PatternRows | None:
    keep = [i for i, row in enumerate(batch.rows) if row < max_seqs]
    if not keep:
        return None
    bq, bk = batch.logit_qk
    T = mask.length
    dtype = torch.float64 if bq.dtype == torch.float64 else torch.float32
    sel = slice(keep[0], keep[-1] + 1) if keep == list(range(keep[0], keep[-1] + 1)) \
        else torch.as_tensor(keep, device=bq.device)
    q, k = bq[sel, :T].to(dtype), bk[sel, :T].to(dtype)
    tokens, offsets = row_logsumexp(q, k, batch.scale, mask, batch.terms, offsets=True)
    sinks = sink_logits(batch.terms, q.device)
    lse = logsumexp_with_sinks(tokens, None if sinks is None else sinks.expand(len(keep), -1))
    mass = None if sinks is None else (tokens - lse).exp()
    if offsets is not None and mass is not None:  # the sinks' share adds no offset
        offsets = offsets * mass
    return PatternRows(keep, q, k, lse, mass, mask, offsets)


def block_offsets(r0: int, r1: int, lo: int, hi: int, device=None
                  ) -> Int[Tensor, "query_pos key_pos"]:
    """The offsets t − s of query rows [r0, r1) against keys [lo, hi)."""
    return entry_offsets(torch.arange(r0, r1, device=device), torch.arange(lo, hi, device=device))


def score_blocks(q: Float[Tensor, "seq pos head_index d_logit"],
                 k: Float[Tensor, "seq pos kv_head_index d_logit"], scale: float,
                 mask: Mask, terms, rows: int = ROWS, align: int = 1):
    """Yield (r0, r1, lo, A) per block of ``rows`` query rows: A [seq, kv, group, r1 − r0,
    hi − lo] what the softmax reads of the keys [lo, hi) the block's rows read
    (:meth:`~poskernel_tl.mask.Mask.keys`, lo a multiple of ``align``), −inf where
    ``mask`` removes them."""
    b, T, H, d = q.shape
    kv = k.shape[2]
    qg = q.permute(0, 2, 1, 3).reshape(b, kv, H // kv, T, d)
    kt = k.permute(0, 2, 3, 1).unsqueeze(2)  # [b, kv, 1, d, T]
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        lo, hi = mask.keys(r0, r1, align)
        A = torch.matmul(qg[..., r0:r1, :], kt[..., lo:hi]).mul_(scale)
        finish_scores(A.view(b, H, r1 - r0, hi - lo), terms,
                      partial(block_offsets, r0, r1, lo, hi, q.device), T)
        if not mask.every_key:  # the block's own mask
            kept = mask.kept(torch.arange(r0, r1, device=q.device),
                             torch.arange(lo, hi, device=q.device), diagonal=True)
            A.masked_fill_(~kept, float("-inf"))
        yield r0, r1, lo, A


def row_logsumexp(q: Float[Tensor, "seq pos head_index d_logit"],
                  k: Float[Tensor, "seq pos kv_head_index d_logit"], scale: float,
                  mask: Mask, terms, offsets: bool = False):
    """logsumexp_s A[t, s] over the keys row t reads (``mask``), in blocks of
    :data:`ROWS` rows over those keys only, a key/value head's query heads together;
    ``offsets``: also each row's Σ_s p(t, s)·|t − s| under the tokens' own normaliser, from
    the same block (returns both)."""
    b, T, H, _ = q.shape
    out = q.new_empty(b, k.shape[2], H // k.shape[2], T)
    mean = out.new_empty(out.shape) if offsets else None
    for r0, r1, lo, A in score_blocks(q, k, scale, mask, terms):
        if not offsets:
            out[..., r0:r1] = torch.logsumexp(A, -1)
            continue
        top = A.amax(-1, keepdim=True)
        e = A.sub_(top).exp_()  # the block's own copy: A is not read again
        z = e.sum(-1)
        out[..., r0:r1] = top[..., 0] + z.log()
        offset = block_offsets(r0, r1, lo, lo + A.shape[-1], A.device).abs().to(A)
        mean[..., r0:r1] = (e * offset).sum(-1) / z
    lse = out.reshape(b, H, T)
    return (lse, mean.reshape(b, H, T)) if offsets else lse


__all__ = ["ALPHA_KEYS", "MAX_POS", "ROWS", "PatternReader", "PatternRows", "PatternSums",
           "block_offsets", "pattern_rows", "pattern_sums", "row_logsumexp", "score_blocks"]

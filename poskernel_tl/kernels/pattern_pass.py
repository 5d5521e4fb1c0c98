"""What the pattern statistics read of a batch, every one in one pass over the logits: the
tiled kernel of :mod:`poskernel_tl.reducers.pattern`'s sums.

One program per block of BM query rows of one (sequence, head) runs over the key tiles its
rows read — every key of a bidirectional model; for a causal one the keys up to the
block's last row from ⌊(r0 − last) / BN⌋·BN on — forming what the layer's softmax reads
(:mod:`~poskernel_tl.kernels.tile_logits`), entries the mask removes counting nothing,
and keeps per row, online (rescaled as its running maximum grows, in float32): the sum of
exponentials (the normaliser), the exponentials weighted by the offset |t − s|, and the
logits at key t − 1 and at key 0. Then, with the row's log-normaliser (learned sink logits
joined to it where the layer has them), it writes each row's attention distance
d(t) = Σ_s p(t, s)·|t − s| (the sinks' share adding none) and the block's sums over its
rows of p(t, t − 1), of p(t, 0) for t ≥ 1 and of the share of the row on tokens; and, by
one more tile over the first keys, of p(t, k) / (rows reading k) for k < ``n_alpha``
(Gu et al.'s α_k). One launch for every layer of a group; the blocks' sums are added by
the caller (float64).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.kernels.dispatch import launch
from poskernel_tl.kernels.tile_logits import (
    chunk_of,
    dot_flags,
    kept_offset,
    logits_tile,
    operand,
    qk_tile,
    term_args,
)
from poskernel_tl.models.softmax_terms import SoftmaxTerms

ROWS = 32  # BM
KEYS = 32  # BN
ALPHA = 16  # the keys of the α tile (at least n_alpha)
STATS = 3  # after the α columns: Σ p(t, t − 1), Σ_{t ≥ 1} p(t, 0), Σ token share


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _row_sums(Q, K, TAU, SLOPES, q_off, k_base, rows, rok, rpos, h, lo, hi, T, last, skt,
              scale, cap, CAUSAL: tl.constexpr, D_HEAD: tl.constexpr, BK: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, HAS_TAU: tl.constexpr,
              HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST: tl.constexpr,
              IEEE: tl.constexpr):
    """Per row of the block, over the key tiles [lo, hi): the running maximum, the sum of
    exponentials and of exponentials times |t − s|, the logits at keys t − 1 and 0 and
    whether the mask keeps them."""
    m = tl.full([BM], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BM], dtype=tl.float32)
    weighted = tl.zeros([BM], dtype=tl.float32)
    prev = tl.zeros([BM], dtype=tl.float32)
    first = tl.zeros([BM], dtype=tl.float32)
    has_prev = tl.zeros([BM], dtype=tl.int32)
    has_first = tl.zeros([BM], dtype=tl.int32)
    for s0 in range(lo, hi, BN):
        keys = s0 + tl.arange(0, BN)
        kok = keys < T
        kpos = tl.where(kok, keys, 0)
        s = qk_tile(Q, K, q_off, k_base + kpos * skt, rok, kok, BM, BN, D_HEAD, BK, UPCAST,
                    IEEE)
        s = logits_tile(s, rpos, kpos, h, scale, cap, TAU, SLOPES, HAS_TAU, HAS_ALIBI,
                        HAS_CAP, False)
        lag = rows[:, None] - keys[None, :]
        keep = rok[:, None] & kok[None, :]
        if CAUSAL:
            keep = keep & kept_offset(lag, last, True)
        at_prev = keep & (lag == 1)
        at_first = keep & (keys[None, :] == 0)
        prev += tl.sum(tl.where(at_prev, s, 0.0), 1)
        first += tl.sum(tl.where(at_first, s, 0.0), 1)
        has_prev += tl.sum(at_prev.to(tl.int32), 1)
        has_first += tl.sum(at_first.to(tl.int32), 1)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        grow = tl.exp(m - base)
        e = tl.exp(s - base[:, None])
        total = total * grow + tl.sum(e, 1)
        weighted = weighted * grow + tl.sum(e * tl.abs(lag).to(tl.float32), 1)
        m = m_new
    return m, total, weighted, prev, first, has_prev, has_first


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _normaliser(SINKS, h, m, total, rok, HAS_SINKS: tl.constexpr):
    """Each row's log-normaliser and its share on tokens: the sink logit joins the
    normaliser and takes its share of the row where the layer has sinks."""
    base = tl.where(m == float("-inf"), 0.0, m)
    share = tl.where(rok, 1.0, 0.0)
    if HAS_SINKS:
        sink = tl.load(SINKS + h)
        top = tl.maximum(base, sink)
        tokens = total * tl.exp(base - top)
        norm = tokens + tl.exp(sink - top)
        share = tl.where(rok, tokens / norm, 0.0)
        lse = top + tl.log(norm)
    else:
        lse = base + tl.log(tl.where(total > 0, total, 1.0))
    return lse, share


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _pattern(Q, K, TAU, SLOPES, SINKS, DIST, PART, T, H, G, last, n_alpha, n_blocks,
             sqb, sqt, sqh, skb, skt, skh, scale, cap, CAUSAL: tl.constexpr,
             HAS_SINKS: tl.constexpr, D_HEAD: tl.constexpr, BK: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BA: tl.constexpr, HAS_TAU: tl.constexpr,
             HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST: tl.constexpr,
             IEEE: tl.constexpr):
    rb = tl.program_id(0)
    z = tl.program_id(1).to(tl.int64)  # sequence · H + head
    h = z % H
    seq = z // H
    k_base = seq * skb + (h // G) * skh
    rows = rb * BM + tl.arange(0, BM)
    rok = rows < T
    rpos = tl.where(rok, rows, 0)
    q_off = seq * sqb + rpos * sqt + h * sqh
    lo = 0
    hi = T
    if CAUSAL:
        lo = tl.maximum(0, rb * BM - last) // BN * BN
        hi = tl.minimum(T, rb * BM + BM)
    m, total, weighted, prev, first, has_prev, has_first = _row_sums(
        Q, K, TAU, SLOPES, q_off, k_base, rows, rok, rpos, h, lo, hi, T, last, skt, scale,
        cap, CAUSAL, D_HEAD, BK, BM, BN, HAS_TAU, HAS_ALIBI, HAS_CAP, UPCAST, IEEE)
    lse, share = _normaliser(SINKS, h, m, total, rok, HAS_SINKS)
    dist = tl.where(total > 0, weighted / tl.where(total > 0, total, 1.0), 0.0) * share
    tl.store(DIST + z * T + rows, dist, mask=rok)
    later = rok & (rows >= 1)
    p_prev = tl.where(later & (has_prev > 0), tl.exp(prev - lse), 0.0)
    p_first = tl.where(later & (has_first > 0), tl.exp(first - lse), 0.0)
    out = PART + (z * n_blocks + rb) * (n_alpha + 3)
    # α: the first keys' weights over this block's rows, per key over the rows reading it
    keys = tl.arange(0, BA)
    kok = keys < n_alpha
    kpos = tl.where(kok, keys, 0)
    s = qk_tile(Q, K, q_off, k_base + kpos * skt, rok, kok, BM, BA, D_HEAD, BK, UPCAST, IEEE)
    s = logits_tile(s, rpos, kpos, h, scale, cap, TAU, SLOPES, HAS_TAU, HAS_ALIBI, HAS_CAP,
                    False)
    lag = rows[:, None] - keys[None, :]
    keep = rok[:, None] & kok[None, :]
    readers = T + tl.zeros([BA], dtype=tl.float32)
    if CAUSAL:
        keep = keep & kept_offset(lag, last, True)
        readers = (T - keys).to(tl.float32)
    p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
    tl.store(out + keys, tl.sum(p, 0) / readers, mask=kok)
    tl.store(out + n_alpha, tl.sum(p_prev, 0))
    tl.store(out + n_alpha + 1, tl.sum(p_first, 0))
    tl.store(out + n_alpha + 2, tl.sum(share, 0))


def pattern_sums(q: Float[Tensor, "batch pos head_index d_head"],
                 k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                 last: int | None, terms: SoftmaxTerms, n_alpha: int,
                 sinks: Float[Tensor, " head_index"] | None = None
                 ) -> tuple[Float[Tensor, "batch head_index pos"],
                            Float[Tensor, "batch head_index stat"]]:
    """(d(t) of every row, float32 [b, H, T]; per (sequence, head), float64: α_k for
    k < ``n_alpha``, Σ_t p(t, t − 1), Σ_{t ≥ 1} p(t, 0), Σ_t the row's share on tokens).
    ``last`` None: every key (bidirectional); else the keys t − last ≤ s ≤ t. ``sinks``:
    the layer's sink logit of each query head (None: none)."""
    b, T, H, d = q.shape
    if n_alpha > ALPHA:
        raise ValueError(f"pattern_sums: at most {ALPHA} α columns, asked {n_alpha}")
    q, k = operand(q), operand(k)
    (cap, tau, slopes), flags = term_args(terms, T, q.device)
    n_blocks = -(-T // ROWS)
    dist = q.new_empty(b, H, T, dtype=torch.float32)
    part = q.new_empty(b * H, n_blocks, n_alpha + STATS, dtype=torch.float32)
    launch(_pattern, (n_blocks, b * H), q, k, tau, slopes, tau if sinks is None else sinks,
           dist, part, T, H, H // k.shape[2], 0 if last is None else last, n_alpha, n_blocks,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           float(scale), cap, CAUSAL=last is not None, HAS_SINKS=sinks is not None,
           D_HEAD=d, BK=chunk_of(d), BM=ROWS, BN=KEYS, BA=ALPHA, **flags, **dot_flags(q.dtype))
    return dist, part.sum(1, dtype=torch.float64).view(b, H, n_alpha + STATS)


__all__ = ["ALPHA", "STATS", "pattern_sums"]

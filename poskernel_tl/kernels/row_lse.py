"""Each query row's log-sum-exp of what the softmax reads under the layer's mask, from
tiles (the pattern statistics' row normalisers,
:mod:`poskernel_tl.reducers.pattern`).

One program per block of BM query rows of one (sequence, head) runs over the key tiles
its rows read — every key of a bidirectional model; for a causal one the keys up to the
block's last row from ⌊(r0 − last) / BN⌋·BN on (a window's last offset ``last``) — and
keeps the running maximum and the sum of exponentials below it (the online log-sum-exp),
in float32. Entries the mask removes (s > t, t − s > last) and positions past T count
nothing. One launch per layer and batch.
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
    logits_tile,
    operand,
    qk_tile,
    term_args,
)
from poskernel_tl.models.softmax_terms import SoftmaxTerms

ROWS = 32  # BM
KEYS = 32  # BN


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _row_lse(Q, K, TAU, SLOPES, OUT, T, H, G, last, sqb, sqt, sqh, skb, skt, skh, scale,
             cap, CAUSAL: tl.constexpr, D_HEAD: tl.constexpr, BK: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, HAS_TAU: tl.constexpr,
             HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST: tl.constexpr,
             IEEE: tl.constexpr):
    rb = tl.program_id(0)
    z = tl.program_id(1).to(tl.int64)  # sequence · H + head
    h = z % H
    seq = z // H
    kvh = h // G
    rows = rb * BM + tl.arange(0, BM)
    rok = rows < T
    rpos = tl.where(rok, rows, 0)
    m = tl.full([BM], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BM], dtype=tl.float32)
    lo = 0
    hi = T
    if CAUSAL:
        lo = tl.maximum(0, rb * BM - last) // BN * BN
        hi = tl.minimum(T, rb * BM + BM)
    for s0 in range(lo, hi, BN):
        keys = s0 + tl.arange(0, BN)
        kok = keys < T
        kpos = tl.where(kok, keys, 0)
        s = qk_tile(Q, K, seq * sqb + rpos * sqt + h * sqh, seq * skb + kpos * skt + kvh * skh,
                    rok, kok, BM, BN, D_HEAD, BK, UPCAST, IEEE)
        s = logits_tile(s, rpos, kpos, h, scale, cap, TAU, SLOPES, HAS_TAU, HAS_ALIBI,
                        HAS_CAP, False)
        keep = rok[:, None] & kok[None, :]
        if CAUSAL:
            lag = rows[:, None] - keys[None, :]
            keep = keep & (lag >= 0) & (lag <= last)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        total = total * tl.exp(m - base) + tl.sum(tl.exp(s - base[:, None]), 1)
        m = m_new
    lse = tl.where(total > 0, m + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(OUT + z * T + rows, lse, mask=rok)


def row_lse_tiles(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                  last: int | None, terms: SoftmaxTerms
                  ) -> Float[Tensor, "batch head_index pos"]:
    """logsumexp over the keys row t reads of what the softmax reads (``last`` None: every
    key; else the keys t − last ≤ s ≤ t), float32 [b, H, T]."""
    b, T, H, d = q.shape
    q, k = operand(q), operand(k)
    (cap, tau, slopes), flags = term_args(terms, T, q.device)
    out = q.new_empty(b, H, T, dtype=torch.float32)
    launch(_row_lse, (-(-T // ROWS), b * H), q, k, tau, slopes, out, T, H, H // k.shape[2],
           0 if last is None else last, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
           k.stride(1), k.stride(2), float(scale), cap, CAUSAL=last is not None, D_HEAD=d,
           BK=chunk_of(d), BM=ROWS, BN=KEYS, **flags, **dot_flags(q.dtype))
    return out


__all__ = ["row_lse_tiles"]

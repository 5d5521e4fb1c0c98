"""Track A's regions, every one of a batch in one launch: the per-lag sums and the sum of
squares of each region of the logits (:class:`~poskernel_tl.fit.variants.Variant`: query
rows [r0, r1) and keys [k0, k1)) over the strip of the first K keys (the upper side: the
first K query rows), which is where every region Track A fits differs from the whole side.

One program per (sequence, head) runs over the lags in blocks of BL and, for BP keys p
of the strip at a time, forms the BP × BL entries A[p + Δ, p] (upper side: A[p, p + Δ]),
each an elementwise product of q and k summed over d_head, as the layer's
softmax reads them (:mod:`~poskernel_tl.kernels.tile_logits`: the scale, a temperature,
ALiBi, the soft-cap) in float32, and adds each, in float64, to the regions that hold it.
A region given as a *complement* (one open to the end of the rows and keys, whose part
outside the strip cannot be summed there) holds the strip's entries it does not hold, and
its sums are the whole side's less those (``WHOLE``: each (sequence, head)'s row of S1 of
every lag then Σ A² of what the mask keeps, the lags past ``last`` read as 0). What
:func:`~poskernel_tl.fit.variants.region_sums` forms from the skewed strip, without the
strip.
"""

from collections.abc import Sequence
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.kernels.dispatch import launch
from poskernel_tl.kernels.tile_logits import (
    chunk_of,
    kept_offset,
    logits_at,
    operand,
    term_args,
)
from poskernel_tl.models.softmax_terms import SoftmaxTerms

LAGS = 64  # BL: lags per block
KEYS = 8  # BP: keys of the strip per step


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _strip_regions(Q, K, TAU, SLOPES, REG, WHOLE, OUT, T, H, G, W, last, n_reg, n_out,
                   whole_row, K_STRIP, sqb, sqt, sqh, skb, skt, skh, scale, cap,
                   UPPER: tl.constexpr, D_HEAD: tl.constexpr, BK: tl.constexpr,
                   BL: tl.constexpr, BP: tl.constexpr, RP: tl.constexpr,
                   HAS_TAU: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr):
    z = tl.program_id(0).to(tl.int64)  # sequence · H + head
    h = z % H
    seq = z // H
    kvh = h // G
    rr = tl.arange(0, RP)
    rok = rr < n_reg
    r0 = tl.load(REG + rr * 5, mask=rok, other=0)[:, None, None]
    r1 = tl.load(REG + rr * 5 + 1, mask=rok, other=0)[:, None, None]
    k0 = tl.load(REG + rr * 5 + 2, mask=rok, other=0)[:, None, None]
    k1 = tl.load(REG + rr * 5 + 3, mask=rok, other=0)[:, None, None]
    comp = tl.load(REG + rr * 5 + 4, mask=rok, other=0) != 0
    acc2 = tl.zeros([RP, BL], dtype=tl.float64)
    for l0 in range(0, W, BL):
        lag = l0 + 1 + tl.arange(0, BL)
        lok = lag <= W
        acc1 = tl.zeros([RP, BL], dtype=tl.float64)
        for p0 in range(0, K_STRIP, BP):  # BP keys of the strip (rows, upper side) at once
            p = p0 + tl.arange(0, BP)
            if UPPER:
                t = p[:, None] + 0 * lag[None, :]
                s = p[:, None] + lag[None, :]
            else:
                t = p[:, None] + lag[None, :]
                s = p[:, None] + 0 * lag[None, :]
            ok = (p < K_STRIP)[:, None] & lok[None, :] & (t < T) & (s < T)
            tt = tl.where(ok, t, 0)
            ss = tl.where(ok, s, 0)
            val = tl.zeros([BP, BL], dtype=tl.float32)
            for d0 in range(0, D_HEAD, BK):
                dd = d0 + tl.arange(0, BK)
                keep = ok[:, :, None] & (dd < D_HEAD)[None, None, :]
                qv = tl.load(Q + seq * sqb + tt[:, :, None] * sqt + h * sqh + dd[None, None, :],
                             mask=keep, other=0.0)
                kv = tl.load(K + seq * skb + ss[:, :, None] * skt + kvh * skh
                             + dd[None, None, :], mask=keep, other=0.0)
                val += tl.sum(qv.to(tl.float32) * kv.to(tl.float32), 2)
            val = logits_at(val, tt, ss, h, scale, cap, TAU, SLOPES, HAS_TAU, HAS_ALIBI,
                            HAS_CAP, False)
            hold = (tt[None] >= r0) & (tt[None] < r1) & (ss[None] >= k0) & (ss[None] < k1)
            hold = tl.where(comp[:, None, None], hold == 0, hold) & \
                kept_offset(lag, last, False)[None, None, :] & ok[None] & rok[:, None, None]
            v = tl.where(hold, val.to(tl.float64)[None], 0.0)
            acc1 += tl.sum(v, 1)
            acc2 += tl.sum(v * v, 1)
        whole = tl.load(WHOLE + z * whole_row + lag - 1,
                        mask=lok & kept_offset(lag, last, False), other=0.0)
        out1 = tl.where(comp[:, None], whole[None, :] - acc1, acc1)
        tl.store(OUT + rr[:, None] * n_out + z * (W + 1) + (lag - 1)[None, :], out1,
                 mask=rok[:, None] & lok[None, :])
    sq = tl.sum(acc2, 1)
    whole_sq = tl.load(WHOLE + z * whole_row + W)
    tl.store(OUT + rr * n_out + z * (W + 1) + W, tl.where(comp, whole_sq - sq, sq), mask=rok)


_TABLES: dict = {}


def region_table(regions: Sequence, length: int, device) -> Tensor:
    """int64 [region, 5]: each region's rows [r0, r1), keys [k0, k1) (an open end as the
    length) and whether it is summed as a complement; made once per (regions, device)."""
    key = (tuple(regions), length, str(device))
    if key not in _TABLES:
        rows = [(v.rows[0], length if v.rows[1] is None else v.rows[1], v.keys[0],
                 length if v.keys[1] is None else v.keys[1], 0 if v.inside() else 1)
                for v in regions]
        _TABLES[key] = torch.tensor(rows, dtype=torch.int64, device=device)
    return _TABLES[key]


def strip_region_sums(q: Float[Tensor, "batch pos head_index d_head"],
                      k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                      terms: SoftmaxTerms, regions: Sequence, strip: int,
                      whole: Float[Tensor, "batch head_index stat"], last: int | None = None,
                      upper: bool = False) -> Float[Tensor, "region batch head_index sums"]:
    """Per region, sequence and head: S1 of Δ = 1..T−1 (zero past ``last``) then Σ A²,
    float64 [region, b, H, T]; ``whole``: each (sequence, head)'s S1 of every lag at
    columns 0..T−2 and Σ A² of the kept entries at column T−1 (further columns ignored).
    ``upper``: the upper side's regions (A[t, t + Δ], rows t < ``strip``)."""
    b, T, H, d = q.shape
    W = T - 1
    q, k = operand(q), operand(k)
    (cap, tau, slopes), flags = term_args(terms, T, q.device)
    whole = whole.reshape(b * H, whole.shape[-1])
    if whole.stride(-1) != 1:
        whole = whole.contiguous()
    table = region_table(regions, T, q.device)
    out = torch.empty(len(regions), b, H, T, dtype=torch.float64, device=q.device)
    launch(_strip_regions, (b * H,), q, k, tau, slopes, table, whole, out, T, H,
           H // k.shape[2], W, W if last is None else min(last, W), len(regions), b * H * T,
           whole.stride(0), min(strip, T), q.stride(0), q.stride(1), q.stride(2),
           k.stride(0), k.stride(1), k.stride(2), float(scale), cap, UPPER=upper, D_HEAD=d,
           BK=min(16, chunk_of(d)), BL=LAGS, BP=KEYS,
           RP=max(2, triton.next_power_of_2(len(regions))), **flags)
    return out


__all__ = ["LAGS", "region_table", "strip_region_sums"]

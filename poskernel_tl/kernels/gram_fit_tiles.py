"""Track B's fit pieces from the stored accumulator, by tiles: what
:func:`~poskernel_tl.reducers.gram_fit.dense_pieces` forms one row block at a time on a CPU.

The accumulator B (:mod:`~poskernel_tl.kernels.gram_tiles`: row blocks of R query rows,
each holding keys [k0, k0 + width), stored one after the other in a flat float32 buffer,
head-major within a block) is read tile by tile, the entries a block does not hold read
as zero:

- :func:`stored_lag_sums`: per head and offset Δ = 1..W, Σ B[t, t−Δ] and Σ B[t, t−Δ]² of
  the strictly lower triangle (``upper``: of the strictly upper one, Δ = s − t), summed
  along block diagonals exactly as :mod:`~poskernel_tl.kernels.lag_tiles` sums logits
  (float64 across tiles, deterministic);
- :func:`stored_apply`: Y = B_low·X (``upper``: B_up·X), the lower triangle within the
  window's last offset, one program per (row tile, head, chunk of X's columns) running
  over the key tiles its rows read, float32 products (no TF32) and accumulation.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.kernels.dispatch import launch
from poskernel_tl.kernels.lag_tiles import TILE, Diagonals, diagonal_at, split_for
from poskernel_tl.kernels.tile_logits import kept_offset

COLUMNS = 64  # columns of X per program


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def stored_tile(ACC, BLOCKS, h, t_idx, s_idx, T, R):
    """B[h, t_idx, s_idx] (broadcast shapes) from the flat accumulator, 0 where no block
    holds the entry."""
    blk = tl.where(t_idx < T, t_idx, 0) // R
    r0 = tl.load(BLOCKS + blk * 5)
    n_rows = tl.load(BLOCKS + blk * 5 + 1)
    k0 = tl.load(BLOCKS + blk * 5 + 2)
    width = tl.load(BLOCKS + blk * 5 + 3)
    start = tl.load(BLOCKS + blk * 5 + 4)
    held = (t_idx < T) & (s_idx < T) & (s_idx >= k0) & (s_idx < k0 + width)
    at = start + h * n_rows * width + (t_idx - r0) * width + (s_idx - k0)
    return tl.load(ACC + tl.where(held, at, 0), mask=held, other=0.0)


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _stored_lag_tiles(ACC, BLOCKS, OUT, T, R, span, n_split, out_split, out_stat,
                      B: tl.constexpr, UPPER: tl.constexpr):
    diag = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    part = tl.program_id(2)
    nb = tl.cdiv(T, B)
    per = tl.cdiv(nb - diag, n_split)
    first = diag + part * per
    last = tl.minimum(first + per, nb)
    r = tl.arange(0, B)
    acc1 = tl.zeros([B, B], dtype=tl.float64)
    acc2 = tl.zeros([B, B], dtype=tl.float64)
    for i in range(first, last):
        rows = (i * B + r).to(tl.int64)
        keys = ((i - diag) * B + r).to(tl.int64)
        if UPPER:  # the tile of Bᵀ: entry (a, c) is B[keys[c], rows[a]]
            v = stored_tile(ACC, BLOCKS, h, keys[None, :], rows[:, None], T, R)
        else:
            v = stored_tile(ACC, BLOCKS, h, rows[:, None], keys[None, :], T, R)
        v = v.to(tl.float64)
        acc1 += v
        acc2 += v * v
    at = diagonal_at(OUT + part * out_split + h * B * span, diag, span, r, B)
    tl.store(at, acc1)
    tl.store(at + out_stat, acc2)


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _stored_apply(ACC, BLOCKS, X, Y, T, R, G, m, last, sxk, sxt, syh, syt,
                  BM: tl.constexpr, BN: tl.constexpr, BX: tl.constexpr, UPPER: tl.constexpr):
    rt = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2)
    kvh = h // G
    rows = (rt * BM + tl.arange(0, BM)).to(tl.int64)
    rok = rows < T
    cols = cb * BX + tl.arange(0, BX)
    cok = cols < m
    acc = tl.zeros([BM, BX], dtype=tl.float32)
    if UPPER:  # the lower triangle's rule mirrored: 0 < s − t ≤ last
        lo = rt * BM
        hi = tl.minimum(T, rt * BM + BM + last)
    else:
        lo = tl.maximum(0, rt * BM - last) // BN * BN
        hi = tl.minimum(T, rt * BM + BM)
    for s0 in range(lo, hi, BN):
        keys = (s0 + tl.arange(0, BN)).to(tl.int64)
        kok = keys < T
        b = stored_tile(ACC, BLOCKS, h, rows[:, None], keys[None, :], T, R)
        if UPPER:
            side = kept_offset(keys[None, :] - rows[:, None], last, False)
        else:
            side = kept_offset(rows[:, None] - keys[None, :], last, False)
        b = tl.where(side & rok[:, None] & kok[None, :], b, 0.0)
        x = tl.load(X + kvh * sxk + tl.where(kok, keys, 0)[:, None] * sxt + cols[None, :],
                    mask=kok[:, None] & cok[None, :], other=0.0)
        acc += tl.dot(b, x, input_precision="ieee")
    tl.store(Y + h * syh + rows[:, None] * syt + cols[None, :], acc,
             mask=rok[:, None] & cok[None, :])


def block_table(blocks: list[tuple[int, int, int, int]], n_heads: int, device
                ) -> Int[Tensor, "block five"]:
    """Per row block (r0, rows, k0, keys, offset in the flat buffer), int64."""
    out, start = [], 0
    for r0, r1, k0, k1 in blocks:
        out.append((r0, r1 - r0, k0, k1 - k0, start))
        start += n_heads * (r1 - r0) * (k1 - k0)
    return torch.tensor(out, dtype=torch.int64, device=device)


def stored_lag_sums(acc: Float[Tensor, " entries"], table: Int[Tensor, "block five"],
                    n_heads: int, length: int, rows: int, last: int | None = None,
                    upper: bool = False) -> Float[Tensor, "stat head_index lag"]:
    """(S1, S2) of Δ = 1..W of the stored B's strictly lower (``upper``: upper)
    triangle, float64 [2, H, W]; ``rows``: the blocks' rows (a multiple of the tile)."""
    grid = Diagonals(length, length - 1 if last is None else min(last, length - 1),
                     TILE)
    splits = split_for(grid.nb, grid.n_diag * n_heads)
    out = acc.new_empty(2, splits, n_heads, grid.B, grid.span, dtype=torch.float64)
    launch(_stored_lag_tiles, (grid.n_diag, n_heads, splits), acc, table, out, length, rows,
           grid.span, splits, n_heads * grid.B * grid.span,
           splits * n_heads * grid.B * grid.span, B=grid.B, UPPER=upper)
    return grid.read(out)


def stored_apply(acc: Float[Tensor, " entries"], table: Int[Tensor, "block five"],
                 x: Float[Tensor, "kv_head_index pos width"], n_heads: int, rows: int,
                 last: int | None = None, upper: bool = False
                 ) -> Float[Tensor, "head_index pos width"]:
    """Y = B_low·X over t − s ≤ ``last`` (``upper``: B_up·X), float32 [H, T, m]; a key
    head's X serves its query heads."""
    kv, T, m = x.shape
    x = x.float().contiguous()
    y = x.new_empty(n_heads, T, m)
    end = T - 1 if last is None else min(last, T - 1)
    launch(_stored_apply, (-(-T // TILE), n_heads, -(-m // COLUMNS)), acc, table, x, y, T,
           rows, n_heads // kv, m, end, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
           BM=TILE, BN=TILE, BX=COLUMNS, UPPER=upper)
    return y


__all__ = ["block_table", "stored_apply", "stored_lag_sums"]

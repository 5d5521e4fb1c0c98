"""Track B's accumulator update, every row block of a layer in one launch.

The accumulator of :class:`~poskernel_tl.reducers.gram.GramReducer` is a list of row
blocks (:func:`~poskernel_tl.reducers.gram_cost.gram_row_blocks`): block (r0, r1, k0, k1)
holds Σ_x q̃_x[r0:r1] k̃_x[k0:k1]ᵀ per query head, [head, rows, keys], each block stored
contiguously in one flat float32 buffer per layer (:func:`gram_layout`). The update adds one
batch: one program per (tile of a block's keys, query head) forms its [rows, BN] tile as
Σ over the batch's sequences of q̃·k̃ᵀ (float32 products and accumulation, no TF32) and
adds it to the stored tile. Every entry is written by one program: deterministic, no
atomics.
"""

from collections.abc import Sequence
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.kernels.dispatch import interpreting, launch
from poskernel_tl.kernels.tile_logits import chunk_of, qk_tile

KEYS = 64  # BN: keys per tile


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _gram_tiles(Q, K, ACC, TABLE, n_seqs, H, G, sqb, sqt, sqh, skb, skt, skh,
                D_HEAD: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    r0 = tl.load(TABLE + t * 6)
    n_rows = tl.load(TABLE + t * 6 + 1)
    k0 = tl.load(TABLE + t * 6 + 2)  # the block's first key
    c0 = tl.load(TABLE + t * 6 + 3)  # the tile's first column within the block
    width = tl.load(TABLE + t * 6 + 4)  # the block's keys
    start = tl.load(TABLE + t * 6 + 5)  # the block's offset in the flat buffer
    rr = tl.arange(0, BM)
    cc = c0 + tl.arange(0, BN)
    rok = rr < n_rows
    cok = cc < width
    rows = tl.where(rok, r0 + rr, 0)
    keys = tl.where(cok, k0 + cc, 0)
    kvh = h // G
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for x in range(0, n_seqs):
        acc += qk_tile(Q, K, x * sqb + rows * sqt + h * sqh, x * skb + keys * skt + kvh * skh,
                       rok, cok, BM, BN, D_HEAD, BK, False, True)
    at = ACC + start + h * n_rows * width + rr[:, None] * width + cc[None, :]
    keep = rok[:, None] & cok[None, :]
    tl.store(at, tl.load(at, mask=keep, other=0.0) + acc, mask=keep)


def gram_layout(blocks: Sequence[tuple[int, int, int, int]], n_heads: int, device
           ) -> tuple[Float[Tensor, " entries"], list[Tensor], Int[Tensor, "tile six"]]:
    """One layer's accumulator as a zeroed flat float32 buffer, its blocks as views
    [head, rows, keys] of it, and the update's tile table (r0, rows, k0, first column,
    keys, offset; int64) per tile of :data:`KEYS` keys, on ``device``."""
    sizes = [n_heads * (r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in blocks]
    flat = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
    views, rows, start = [], [], 0
    for (r0, r1, k0, k1), size in zip(blocks, sizes):
        views.append(flat[start:start + size].view(n_heads, r1 - r0, k1 - k0))
        rows += [(r0, r1 - r0, k0, c, k1 - k0, start) for c in range(0, k1 - k0, KEYS)]
        start += size
    return flat, views, torch.tensor(rows, dtype=torch.int64, device=device)


def gram_tile_update(acc: Float[Tensor, " entries"], table: Int[Tensor, "tile six"],
                     rows: int, q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos kv_head_index d_head"]) -> None:
    """Add Σ_x q_x k_xᵀ of the batch to every block of the layer's accumulator ``acc``
    (:func:`gram_layout`; blocks of at most ``rows`` query rows); q/k float32."""
    b, T, H, d = q.shape
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    BM = max(16, triton.next_power_of_2(rows))
    launch(_gram_tiles, (table.shape[0], H), q, k, acc, table, b, H, H // k.shape[2],
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           D_HEAD=d, BK=chunk_of(d), BM=BM, BN=KEYS,
           **({} if interpreting() else {"num_warps": 8}))


__all__ = ["KEYS", "gram_layout", "gram_tile_update"]

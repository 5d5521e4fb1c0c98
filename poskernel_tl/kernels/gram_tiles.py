"""Track B's accumulator update, every row block of a layer in one launch.

The accumulator of :class:`~poskernel_tl.reducers.gram.GramReducer` is a list of row
blocks (:func:`~poskernel_tl.reducers.gram_cost.gram_row_blocks`): block (r0, r1, k0, k1)
holds Σ_x q̃_x[r0:r1] k̃_x[k0:k1]ᵀ per query head, [head, rows, keys], each block stored
contiguously in one flat float32 buffer per layer (:func:`gram_layout`; layers with the
same blocks as parts of one buffer). The update adds one batch of every layer of a
group: one program per (tile of a block's keys, query head of the group) forms its
[rows, BN] tile as Σ over the batch's sequences of q̃·k̃ᵀ — q̃ = (q − m_q)·scale and
k̃ = k − m_k centered on the fly in float64 as the model's q and k are read, then float32
products and accumulation, no TF32 — and adds it to the stored tile. Every entry is
written by one program: deterministic, no atomics.
"""

from collections.abc import Sequence
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.kernels.dispatch import interpreting, launch
from poskernel_tl.kernels.tile_logits import chunk_of

KEYS = 64  # BN: keys per tile


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def centered(X, REF, x_off, ref_off, ok, dd, dm, scale, CENTER: tl.constexpr):
    """Rows of q or k [rows, BK] as the accumulator reads them, float32: as stored, or
    (``CENTER``) (x − ref)·scale formed in float64 (the reference removed before the
    product, so its large mean never enters it), then float32."""
    keep = ok[:, None] & dm[None, :]
    x = tl.load(X + x_off[:, None] + dd[None, :], mask=keep, other=0.0)
    if CENTER:
        ref = tl.load(REF + ref_off[:, None] + dd[None, :], mask=keep, other=0.0)
        return ((x.to(tl.float64) - ref.to(tl.float64)) * scale).to(tl.float32)
    return x.to(tl.float32)


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _gram_tiles(Q, K, RQ, RK, ACC, TABLE, SLOTS, n_seqs, HL, G, layer_size, sqb, sqt, sqh, skb,
                skt, skh, rqt, rqh, rkt, rkh, scale, D_HEAD: tl.constexpr, BK: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, CENTER: tl.constexpr):
    t = tl.program_id(0)
    hz = tl.program_id(1)  # the group's head: layer hz // HL, head hz % HL of that layer
    layer = hz // HL
    h = hz % HL
    r0 = tl.load(TABLE + t * 6)
    n_rows = tl.load(TABLE + t * 6 + 1)
    k0 = tl.load(TABLE + t * 6 + 2)  # the block's first key
    c0 = tl.load(TABLE + t * 6 + 3)  # the tile's first column within the block
    width = tl.load(TABLE + t * 6 + 4)  # the block's keys
    start = tl.load(TABLE + t * 6 + 5)  # the block's offset in the layer's flat buffer
    rr = tl.arange(0, BM)
    cc = c0 + tl.arange(0, BN)
    rok = rr < n_rows
    cok = cc < width
    rows = tl.where(rok, r0 + rr, 0)
    keys = tl.where(cok, k0 + cc, 0)
    kvh = hz // G
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for x in range(0, n_seqs):
        for d0 in range(0, D_HEAD, BK):
            dd = d0 + tl.arange(0, BK)
            dm = dd < D_HEAD
            q = centered(Q, RQ, x * sqb + rows * sqt + hz * sqh, rows * rqt + hz * rqh, rok,
                         dd, dm, scale, CENTER)
            k = centered(K, RK, x * skb + keys * skt + kvh * skh, keys * rkt + kvh * rkh, cok,
                         dd, dm, 1.0, CENTER)
            acc += tl.dot(q, tl.trans(k), input_precision="ieee")
    part = tl.load(SLOTS + layer) * layer_size  # the layer's part of the buffer
    at = ACC + part + start + h * n_rows * width + rr[:, None] * width + cc[None, :]
    keep = rok[:, None] & cok[None, :]
    tl.store(at, tl.load(at, mask=keep, other=0.0) + acc, mask=keep)


def gram_layout(blocks: Sequence[tuple[int, int, int, int]], n_heads: int, device,
                n_layers: int = 1
                ) -> tuple[Float[Tensor, " entries"], list[Tensor], Int[Tensor, "tile six"]]:
    """The accumulator of ``n_layers`` layers with the same ``blocks``, one after the other
    in one zeroed flat float32 buffer (each layer's part: its blocks, each [head, rows,
    keys], contiguous), the first layer's blocks as views of it (:func:`layer_views` for
    the others), and the update's tile table (r0, rows, k0, first column, keys, offset
    within a layer's part; int64) per tile of :data:`KEYS` keys, on ``device``."""
    sizes = [n_heads * (r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in blocks]
    flat = torch.zeros(n_layers * sum(sizes), dtype=torch.float32, device=device)
    rows, start = [], 0
    for (r0, r1, k0, k1), size in zip(blocks, sizes):
        rows += [(r0, r1 - r0, k0, c, k1 - k0, start) for c in range(0, k1 - k0, KEYS)]
        start += size
    table = torch.tensor(rows, dtype=torch.int64, device=device)
    return flat, layer_views(flat, blocks, n_heads, 0)[1], table


def layer_views(flat: Float[Tensor, " entries"], blocks: Sequence[tuple[int, int, int, int]],
                n_heads: int, layer: int) -> tuple[Float[Tensor, " part"], list[Tensor]]:
    """Layer ``layer``'s part of a :func:`gram_layout` buffer and its blocks as views."""
    sizes = [n_heads * (r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in blocks]
    part = flat[layer * sum(sizes):(layer + 1) * sum(sizes)]
    views, start = [], 0
    for (r0, r1, k0, k1), size in zip(blocks, sizes):
        views.append(part[start:start + size].view(n_heads, r1 - r0, k1 - k0))
        start += size
    return part, views


def gram_tile_update(acc: Float[Tensor, " entries"], table: Int[Tensor, "tile six"],
                     rows: int, q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos kv_head_index d_head"],
                     reference: tuple[Tensor, Tensor] | None = None, scale: float = 1.0,
                     heads: int | None = None, layer_size: int = 0,
                     slots: Int[Tensor, " layer"] | None = None) -> None:
    """Add Σ_x q_x k_xᵀ of the batch to every block of the accumulator ``acc``
    (:func:`gram_layout`; blocks of at most ``rows`` query rows). ``reference``: the
    float32 means (m_q [pos, head_index, d_head], m_k [pos, kv_head_index, d_head]) removed
    from q and k (any dtype) in float64 first, q times ``scale`` (else q/k float32, used as
    they are). ``heads``: query heads per layer, where q holds a group of layers side by
    side (:mod:`poskernel_tl.plan.groups`): the group's j-th layer adds to part
    ``slots[j]`` of ``acc`` (parts ``layer_size`` entries long; int64 on the device;
    None: part 0 for a single layer)."""
    b, T, H, d = q.shape
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    rq, rk = (q.new_zeros(1), k.new_zeros(1)) if reference is None else reference
    BM = max(16, triton.next_power_of_2(rows))
    if slots is None:
        slots = table.new_zeros(1)
    launch(_gram_tiles, (table.shape[0], H), q, k, rq, rk, acc, table, slots, b,
           H if heads is None else heads, H // k.shape[2], layer_size, q.stride(0),
           q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           rq.stride(0) if reference else 0, rq.stride(1) if reference else 0,
           rk.stride(0) if reference else 0, rk.stride(1) if reference else 0, float(scale),
           D_HEAD=d, BK=chunk_of(d), BM=BM, BN=KEYS, CENTER=reference is not None,
           **({} if interpreting() else {"num_warps": 8}))


__all__ = ["KEYS", "gram_layout", "gram_tile_update", "layer_views"]

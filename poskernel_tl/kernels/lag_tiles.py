"""Per-lag sums of the logits over the strictly lower triangle, from tiles.

For each head (query head h reads key/value head h // (H / H_kv)) and offset Δ = 1..W:
S1(Δ) = Σ_t A[t, t−Δ] and S2(Δ) = Σ_t A[t, t−Δ]², A what the layer's softmax reads
(:mod:`~poskernel_tl.kernels.tile_logits`). From S2 every sum of squares Track A and the
null fit follows: the whole triangle, a window's, each band of offsets.

The triangle is cut into B × B tiles; tile (i, j) of query block i and key block j holds
the offsets (i − j)·B + r − c. The tiles of one block diagonal D = i − j share those
offsets, so one program per (D, head, sequence group) sums its tiles *elementwise* into a
B × B accumulator — each tile's values formed in float32 and added in float64, tile by
tile in a fixed order (deterministic, no atomics) — and writes it, reversed in both axes,
into columns [D·B, D·B + B) of a [B, P + B] matrix per head, P = B·⌈W / B⌉: every entry
of one line of that matrix (one row and one column further per step) then holds one lag,
so S1 and S2 of Δ = 1..W are its first W lines, read as strided views (:class:`Diagonals`).
Offsets past W and at or above the diagonal land on lines that are not read.

Positions may be read through a permutation (the null: A'[t, s] = A[π(t), π(s)], every
draw in one launch), and the sums of a group of sequences taken together (the null's
pooled sums). Long block diagonals are split over several programs (``splits``), each
writing its own partial matrix, summed in a fixed order after.
"""

from dataclasses import dataclass
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.fit.diagonals import diagonal_lines
from poskernel_tl.kernels.dispatch import interpreting, launch
from poskernel_tl.kernels.tile_logits import (
    chunk_of,
    dot_flags,
    logits_tile,
    operand,
    qk_tile,
    term_args,
)
from poskernel_tl.models.softmax_terms import SoftmaxTerms

TILE = 32  # B: query rows and keys per tile
PROGRAMS = 2048  # at least this many programs per launch where the work allows


@dataclass(frozen=True)
class Diagonals:
    """Where per-lag sums of Δ = 1..W over a T × T triangle in B × B tiles go: ``nb``
    query blocks, ``n_diag`` block diagonals (P = B·⌈W / B⌉, D = 0..P / B), each program's
    B × B sums, entry (r, c) of lag D·B + r − c, written at row B − 1 − r and column
    D·B + B − 1 − c of a [B, ``span``] matrix (span = P + B): the line starting at column
    1 + j of row 0 and stepping one row and one column holds lag j + 1 only, so the per-lag
    sums are the matrix's lines 0..W − 1 in order (:meth:`read`)."""

    length: int
    W: int
    B: int = TILE

    @property
    def nb(self) -> int:
        return -(-self.length // self.B)

    @property
    def P(self) -> int:
        return -(-self.W // self.B) * self.B

    @property
    def n_diag(self) -> int:
        return self.P // self.B + 1

    @property
    def span(self) -> int:
        return self.P + self.B

    def read(self, out: Float[Tensor, "stat split out rows keys"]
             ) -> Float[Tensor, "stat out lag"]:
        """The per-lag sums (float64) from the programs' matrices, the splits summed in
        a fixed order."""
        summed = out[:, 0] if out.shape[1] == 1 else out.sum(1)
        return diagonal_lines(summed.contiguous(), 1, self.W).sum(-1, dtype=torch.float64)


def split_for(blocks: int, programs: int) -> int:
    """Programs per block diagonal so that a launch has at least :data:`PROGRAMS` (one
    under Triton's interpreter, where each program costs host time)."""
    return 1 if interpreting() else max(1, min(blocks, -(-PROGRAMS // programs)))


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def diagonal_at(base, diag, span, r, B: tl.constexpr):
    """Where block diagonal ``diag``'s B × B sums go in a :class:`Diagonals` matrix at
    ``base`` (``r`` = arange(B)): entry (r, c) at row B − 1 − r, column D·B + B − 1 − c."""
    back = B - 1 - r
    return base + back[:, None] * span + diag * B + back[None, :]


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def _lag_tiles(Q, K, PERM, TAU, SLOPES, OUT, T, H, G, n_groups, seqs, span, n_split,
               out_split, out_stat, sqb, sqt, sqh, skb, skt, skh, scale, cap,
               D_HEAD: tl.constexpr, BK: tl.constexpr, B: tl.constexpr,
               HAS_PERM: tl.constexpr, HAS_TAU: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_CAP: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
               TRANSPOSED: tl.constexpr):
    diag = tl.program_id(0)
    z = tl.program_id(1).to(tl.int64)  # ((draw · n_groups) + group) · H + head
    part = tl.program_id(2)
    h = z % H
    group = (z // H) % n_groups
    draw = z // (H * n_groups)
    kvh = h // G
    nb = tl.cdiv(T, B)
    per = tl.cdiv(nb - diag, n_split)  # query blocks of this program's share
    first = diag + part * per
    last = tl.minimum(first + per, nb)
    r = tl.arange(0, B)
    acc1 = tl.zeros([B, B], dtype=tl.float64)
    acc2 = tl.zeros([B, B], dtype=tl.float64)
    for j in range(0, seqs):
        seq = group * seqs + j
        for i in range(first, last):
            rows = i * B + r
            keys = (i - diag) * B + r
            rok = rows < T
            kok = keys < T
            if HAS_PERM:
                rpos = tl.load(PERM + draw * T + rows, mask=rok, other=0)
                kpos = tl.load(PERM + draw * T + keys, mask=kok, other=0)
            else:  # (rows past T read position 0: masked below)
                rpos = tl.where(rok, rows, 0)
                kpos = tl.where(kok, keys, 0)
            s = qk_tile(Q, K, seq * sqb + rpos * sqt + h * sqh, seq * skb + kpos * skt
                        + kvh * skh, rok, kok, B, B, D_HEAD, BK, UPCAST, IEEE)
            s = logits_tile(s, rpos, kpos, h, scale, cap, TAU, SLOPES, HAS_TAU, HAS_ALIBI,
                            HAS_CAP, TRANSPOSED)
            s = tl.where(rok[:, None] & kok[None, :], s, 0.0).to(tl.float64)
            acc1 += s
            acc2 += s * s
    at = diagonal_at(OUT + part * out_split + z * B * span, diag, span, r, B)
    tl.store(at, acc1)
    tl.store(at + out_stat, acc2)


_NO_PERM: dict = {}


def lag_tile_sums(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                  terms: SoftmaxTerms, last: int | None = None,
                  perms: Int[Tensor, "draw pos"] | None = None, pooled: bool = False,
                  splits: int | None = None, transposed: bool = False, full: bool = False
                  ) -> Float[Tensor, "stat out head_index lag"]:
    """(S1, S2) of Δ = 1..W (W = ``last``, default T − 1), float64 [2, out, H, W]:
    ``out`` the sequences, or with ``perms`` [draw, T] (positions read through each
    permutation) the draws; ``pooled``: summed over the sequences (then ``out`` is 1, or
    the draws). ``splits``: programs per block diagonal (default: enough for
    :data:`PROGRAMS` programs). ``transposed``: q and k are passed swapped, for the upper
    triangle of A (the lower one of Aᵀ; one key head per query head), and the softmax's
    terms are read accordingly. ``full``: every lag Δ = 1..T−1, zero past W."""
    b, T, H, d = q.shape
    kv = k.shape[2]
    grid = Diagonals(T, T - 1 if last is None else min(last, T - 1), TILE)
    W, B, span = grid.W, grid.B, grid.span
    draws = 1 if perms is None else perms.shape[0]
    n_groups, seqs = (1, b) if pooled else (b, 1)
    Z = draws * n_groups * H
    if splits is None:
        splits = split_for(grid.nb, grid.n_diag * Z)
    q, k = operand(q), operand(k)
    (cap, tau, slopes), flags = term_args(terms, T, q.device)
    if perms is None:  # (a placeholder the kernel never reads: made once per device)
        if str(q.device) not in _NO_PERM:
            _NO_PERM[str(q.device)] = torch.zeros(1, dtype=torch.int32, device=q.device)
        perm = _NO_PERM[str(q.device)]
    else:
        perm = perms if perms.dtype == torch.int32 else perms.to(torch.int32)
    # every entry is written: program (D, z, part) writes columns [D·B, D·B + B)
    out = q.new_empty(2, splits, Z, B, span, dtype=torch.float64)
    launch(_lag_tiles, (grid.n_diag, Z, splits), q, k, perm, tau, slopes, out, T, H, H // kv,
           n_groups, seqs, span, splits, Z * B * span, splits * Z * B * span,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           float(scale), cap, D_HEAD=d, BK=chunk_of(d), B=B, HAS_PERM=perms is not None,
           TRANSPOSED=transposed, **flags, **dot_flags(q.dtype))
    sums = grid.read(out).view(2, draws * n_groups, H, W)
    return torch.nn.functional.pad(sums, (0, T - 1 - W)) if full and W < T - 1 else sums


__all__ = ["PROGRAMS", "TILE", "Diagonals", "diagonal_at", "lag_tile_sums", "split_for"]

"""Track B's fit from sufficient statistics: no float64 T×T matrix, no float64 copy of the
accumulator beyond one block of rows.

Every Gram Track B fits is G = B + scale·U·Vᵀ: B the mean of the products about the
reference (the accumulator, or the kept products' factors), U (per query head) and V (per
key/value head) the rank-2·d_head correction to a given centering (see
:mod:`poskernel_tl.reducers.gram`). The fit of g(Δ) on the strictly lower triangle needs
the per-lag sums and the sum of squares (:mod:`poskernel_tl.fit.toeplitz`), and both split:

    S1_G(Δ) = S1_B(Δ) + scale·S1_UVᵀ(Δ),
    Σ G²    = Σ B² + 2·scale·Σ_t U_t·(B_low V)_t + scale²·Σ (U·Vᵀ)²,

over the strictly lower triangle (B_low: B with the entries s ≥ t zeroed). The U·Vᵀ terms
are the identities Track A uses for q·kᵀ (:mod:`poskernel_tl.reducers.lag_sums`: an FFT
cross-correlation, a running key moment; under a window of a few times the rank, the
band's entries, :mod:`poskernel_tl.reducers.band_sums`). B_low·V is linear in
V = [k̄ − b, m_k − b], so ``Y = B_low·X`` with X the distinct vectors among k̄, m_k and the
centerings b serves every variant. B's own pieces (S1_B, Σ B², Y) come

- from the accumulator (:func:`dense_pieces`), one block of query rows at a time: the
  block in float64, its sub-diagonals read as strided lines, one matmul for Y;
- from the factors q̃, k̃ of the evaluation sequences when those are kept instead
  (:func:`factor_pieces`): B = Q·Kᵀ with Q, K the per-sequence factors side by side, so
  S1_B and Σ B² are again the lag-sum identities and Y a chunked running product
  (:func:`lower_apply`), O(T·(n·d)²) instead of O(T²); above a rank n·d of
  :data:`~poskernel_tl.reducers.gram_cost.FACTOR_RANK_MAX` the running moments would
  outgrow the accumulator's blocks, so the blocks themselves are formed from the factors
  one at a time (:func:`factor_blocks`) and read as the accumulator's are: the
  accumulator's work, deferred to the fit, in n·T·d memory (the triangle of Gemma 3's
  global layers at T = 32,768).

Bidirectional models (``upper=True``) fit both triangles: the upper triangle of G is the
lower one of Gᵀ = Bᵀ + scale·V·Uᵀ, so its pieces are the same with the roles swapped —
S1 and Σ² of B's strictly upper triangle (super-diagonals read as strided lines of the
accumulator's rows, which then hold every key; or the lag-sum identities of the factors
with q̃ and k̃ swapped), Y_up = B_up·X (from the factors: :func:`lower_apply` on positions
reversed), the U·Vᵀ terms with U and V swapped, and B's diagonal for the mean at Δ = 0.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.fit.diagonals import diagonal_lines
from poskernel_tl.mask import Mask
from poskernel_tl.models.softmax_ops import chunk_qk
from poskernel_tl.reducers.gram_cost import FACTOR_RANK_MAX, GRAM_ROWS, gram_row_blocks
from poskernel_tl.reducers.lag_sums import (
    DEFAULT_CHUNK,
    before,
    cast_permuted,
    lag_sums,
    lower_sum_squares,
    windowed,
)
from poskernel_tl.reducers.two_sided import mirrored

ACC = torch.float64
FIT_DTYPE = torch.float32


@dataclass
class Pieces:
    """S1(Δ) and Σ² of B's strictly lower triangle per query head, and Y = B_low·X; for a
    two-sided fit also those of the strictly upper triangle (index j ↔ Δ = −(j+1)),
    Y_up = B_up·X and B's diagonal (None otherwise)."""

    s1: Float[Tensor, "head_index lag"]
    sq: Float[Tensor, " head_index"]
    y: Float[Tensor, "head_index pos rank"]
    s1_up: Float[Tensor, "head_index lag"] | None = field(default=None)
    sq_up: Float[Tensor, " head_index"] | None = field(default=None)
    y_up: Float[Tensor, "head_index pos rank"] | None = field(default=None)
    diag: Float[Tensor, "head_index pos"] | None = field(default=None)

    def divided(self, n: int) -> "Pieces":
        """The pieces of B / n, in place: sums and products over n, squares over n²."""
        for t in (self.s1, self.y, self.s1_up, self.y_up, self.diag):
            if t is not None:
                t.div_(n)
        for t in (self.sq, self.sq_up):
            if t is not None:
                t.div_(n * n)
        return self


def lower_block_sums(buf: Float[Tensor, "head_index rows padded_key_pos"], r0: int,
                     length: int) -> tuple[Float[Tensor, "head_index lag"],
                                           Float[Tensor, " head_index"]]:
    """Per-lag sums S1(Δ), Δ = 1..T−1, and Σ G² of the query rows [r0, r0 + rows) of a
    matrix held in ``buf[:, :, rows:]`` (keys from 0; entries on and above the diagonal
    already zeroed) behind ``rows`` zero columns. The sub-diagonal Δ of the block is the
    strided line buf[i, rows + r0 + i − Δ], read straight from the buffer (the zero
    columns stand in for keys s < 0). Sums in the buffer's dtype."""
    H, rows, W = buf.shape
    r1 = r0 + rows
    sq = torch.linalg.vector_norm(buf[:, :, rows:], dim=(-2, -1), dtype=ACC).square()
    # line e = r1 − 1 − Δ starts at column e + 1 of row 0
    s1 = buf.new_zeros(H, length - 1)
    s1[:, :r1 - 1] = diagonal_lines(buf, 1, r1 - 1).sum(-1).flip(-1)
    return s1, sq


def upper_block_sums(buf: Float[Tensor, "head_index rows padded_key_pos"], length: int
                     ) -> tuple[Float[Tensor, "head_index lag"], Float[Tensor, " head_index"]]:
    """Per-lag sums (index j ↔ Δ = −(j+1)) and Σ G² of the query rows [r0, r0 + rows) of
    a matrix held in ``buf[:, :, :T − r0]`` (keys from r0 = T − (width − rows); entries on
    and below the diagonal already zeroed) before ``rows`` zero columns. The
    super-diagonal m is the strided line buf[i, i + m] (the zero columns stand in for
    keys s ≥ T). Sums in the buffer's dtype."""
    H, rows, W = buf.shape
    n_lines = W - rows - 1  # m = 1..T − 1 − r0
    sq = torch.linalg.vector_norm(buf, dim=(-2, -1), dtype=ACC).square()
    s1 = buf.new_zeros(H, length - 1)
    if n_lines > 0:
        s1[:, :n_lines] = diagonal_lines(buf, 1, n_lines).sum(-1)
    return s1, sq


@lru_cache(maxsize=64)
def _band_mask(rows: int, width: int, diagonal: int, upper: bool, device: str) -> Tensor:
    """Bool [rows, width]: entries with c − i ≥ ``diagonal`` (``upper``) or ≤ it."""
    ones = torch.ones(rows, width, dtype=torch.bool, device=device)
    return ones.triu(diagonal) if upper else ones.tril(diagonal)


def _add(out: Pieces, upper: bool, r0: int, G: Tensor, x: Tensor,
         sums: tuple[Tensor, Tensor]) -> None:
    """Add one row block's float32 sums and B_side·X (``G``: the block's kept keys, the
    rest zeroed; ``x``: X at those keys) to ``out``'s float64 totals."""
    H, rows, keys = G.shape
    kv, m = x.shape[0], x.shape[-1]
    prod = torch.matmul(G.reshape(kv, H // kv * rows, keys), x).view(H, rows, m)
    s1, sq, y = (out.s1_up, out.sq_up, out.y_up) if upper else (out.s1, out.sq, out.y)
    s1 += sums[0]
    sq += sums[1]
    y[:, r0:r0 + rows] = prod


Block = tuple[tuple[int, int, int, int], Tensor]  # (r0, r1, k0, k1), rows × keys [k0, k1)


def dense_pieces(blocks: Iterable[Block], n: int,
                 x: Float[Tensor, "kv_head_index pos rank"], keep=None,
                 upper: bool = False, last: int | None = None,
                 chunk: int | None = None) -> Pieces:
    """B = acc / n from the accumulator's row blocks ``((r0, r1, k0, k1), block)`` (the
    block holding keys [k0, k1) of rows [r0, r1)), read once: each block's kept keys
    copied into a float32 buffer with the excluded entries zeroed, their sums and
    B_low·X formed in float32 and added up in float64 (the division by n applied to the
    totals). ``keep(r0, r1, block)``, if given, sees each block whole (float32, divided
    by n). ``upper``: the upper triangle's pieces too (the blocks must hold every key).
    ``last``: B_low keeps only the offsets t − s ≤ last (a sliding window): the
    keys before the window are never read (a block may start at the window's first).
    ``chunk``: B_low keeps only the entries within one chunk (a chunked mask)."""
    T, dev, out, flat = x.shape[1], str(x.device), None, None
    x32 = x.float()
    for (r0, r1, k0, k1), a in blocks:
        rows, H = r1 - r0, a.shape[0]
        if out is None:
            flat = torch.empty(H * rows * (rows + T), dtype=torch.float32, device=x.device)
            out = _empty_pieces(H, x, upper)
        if upper and (k0, k1) != (0, T):
            raise ValueError(f"dense_pieces(upper=True): block [{r0}, {r1}) holds keys "
                             f"[{k0}, {k1}) of {T}")
        if keep is not None:
            keep(r0, r1, a / n)
        # the lower side: keys [lo, r1) behind ``rows`` zero columns, s ≥ t zeroed
        lo = 0 if last is None else max(0, r0 - last)
        if lo < k0:
            raise ValueError(f"dense_pieces: block [{r0}, {r1}) starts at key {k0} > {lo}")
        buf = flat[:H * rows * (r1 - lo + rows)].view(H, rows, r1 - lo + rows)
        buf[:, :, :rows].zero_()
        G = buf[:, :, rows:]
        G.copy_(a[:, :, lo - k0:r1 - k0])
        G[:, :, r0 - lo:].masked_fill_(_band_mask(rows, rows, 0, True, dev), 0.0)
        if last is not None and r1 - 1 - lo > last:  # t − s > last zeroed
            G.masked_fill_(_band_mask(rows, r1 - lo, r0 - lo - last - 1, False, dev), 0.0)
        if chunk is not None:  # entries across chunks zeroed
            G.masked_fill_(~Mask(T, chunk=chunk).same_chunk(
                torch.arange(r0, r1, device=dev)[:, None], torch.arange(lo, r1, device=dev)[None]),
                0.0)
        _add(out, False, r0, G, x32[:, lo:r1], lower_block_sums(buf, r0 - lo, T))
        if upper:  # keys [r0, T) before ``rows`` zero columns, s ≤ t zeroed
            out.diag[:, r0:r1] = a.diagonal(r0, 1, 2)
            buf = flat[:H * rows * (T - r0 + rows)].view(H, rows, T - r0 + rows)
            buf[:, :, T - r0:].zero_()
            G = buf[:, :, :T - r0]
            G.copy_(a[:, :, r0:]).masked_fill_(_band_mask(rows, T - r0, 0, False, dev), 0.0)
            if last is not None and T - 1 - r0 > last:  # s − t > last zeroed
                G.masked_fill_(_band_mask(rows, T - r0, last + 1, True, dev), 0.0)
            _add(out, True, r0, G, x32[:, r0:], upper_block_sums(buf, T))
    return out.divided(n)


def _empty_pieces(H: int, x: Tensor, upper: bool) -> Pieces:
    """Zero totals for :func:`dense_pieces` (float64, like ``x``)."""
    T, m = x.shape[1], x.shape[-1]
    out = Pieces(x.new_zeros(H, T - 1), x.new_zeros(H), x.new_zeros(H, T, m))
    if upper:
        out.s1_up, out.sq_up = x.new_zeros(H, T - 1), x.new_zeros(H)
        out.y_up, out.diag = x.new_zeros(H, T, m), x.new_zeros(H, T)
    return out


def factor_blocks(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"],
                  blocks: list[tuple[int, int, int, int]]) -> Iterator[Block]:
    """The accumulator's row blocks Σ_x q̃_x k̃_xᵀ formed from the factors, one at a time
    (float32, the batch folded into the contraction as in the accumulator's update)."""
    n, T, H, d = q.shape
    kv = k.shape[2]
    qc = q.permute(2, 1, 0, 3)  # [H, T, n, d]
    kc = k.permute(2, 0, 3, 1).reshape(kv, n * d, T)
    for r0, r1, k0, k1 in blocks:
        rows = qc[:, r0:r1].reshape(kv, H // kv * (r1 - r0), n * d)
        yield (r0, r1, k0, k1), torch.bmm(rows, kc[:, :, k0:k1]).view(H, r1 - r0, k1 - k0)


def lower_apply(q: Float[Tensor, "pos head_index rank"],
                k: Float[Tensor, "pos kv_head_index rank"],
                x: Float[Tensor, "pos kv_head_index width"], chunk: int = DEFAULT_CHUNK,
                last: int | None = None, dtype: torch.dtype = ACC
                ) -> Float[Tensor, "head_index pos width"]:
    """Y[h, t] = Σ_{s<t} (q_t·k_s)·x_s (query head h reads key/value head h // group), in
    chunks of positions: the chunk's own strictly lower C × C products, plus q_t against
    the running Σ k_s x_sᵀ of the chunks before (products in ``dtype``, the running sums
    and the result in float64). ``last``: only the keys t − s ≤ last, i.e. less the
    same product of q[w−1:] against k[:T−w+1] (w = last + 1) placed at rows
    t ≥ w − 1."""
    T = q.shape[0]
    out = _lower_apply(q, k, x, chunk, dtype)
    if last is not None and last < T - 1:
        w = last + 1
        out[:, w - 1:] -= _lower_apply(q[w - 1:], k[:T - w + 1], x[:T - w + 1], chunk, dtype)
    return out


def _lower_apply(q: Float[Tensor, "pos head_index rank"],
                 k: Float[Tensor, "pos kv_head_index rank"],
                 x: Float[Tensor, "pos kv_head_index width"], chunk: int,
                 dtype: torch.dtype = ACC) -> Float[Tensor, "head_index pos width"]:
    T, H, r = q.shape
    kv, w = k.shape[1], x.shape[-1]
    g, C = H // kv, max(1, min(chunk, T))
    nc = -(-T // C)
    pad = lambda t: F.pad(t, (0, 0, 0, 0, 0, nc * C - T)) if nc * C > T else t
    # chunk-major, each cast and laid out in one copy: [kv, chunk, (group·)C, ·]
    qc = cast_permuted(pad(q).view(nc, C, kv, g, r), (2, 0, 3, 1, 4), dtype).view(kv, nc, g * C, r)
    kc = cast_permuted(pad(k).view(nc, C, kv, r), (2, 0, 1, 3), dtype)
    xc = cast_permuted(pad(x).view(nc, C, kv, w), (2, 0, 1, 3), dtype)
    inner = torch.matmul(qc, kc.transpose(-1, -2)).view(kv, nc, g, C, C)
    inner.mul_(torch.ones(C, C, dtype=dtype, device=q.device).tril(-1))
    out = torch.matmul(inner.view(kv, nc, g * C, C), xc)
    prior = before(torch.matmul(kc.transpose(-1, -2), xc).to(ACC), 1)  # [kv, chunk, r, w]
    out.view(-1, g * C, w).baddbmm_(qc.view(-1, g * C, r), prior.to(dtype).view(-1, r, w))
    out = cast_permuted(out.view(kv, nc, g, C, w), (0, 2, 1, 3, 4)).view(H, nc * C, w)
    return out[:, :T]


def tile_pieces(acc: Float[Tensor, " entries"], blocks: list[tuple[int, int, int, int]],
                n_heads: int, n: int, x: Float[Tensor, "kv_head_index pos rank"], keep=None,
                views: list[Tensor] | None = None, upper: bool = False,
                last: int | None = None) -> Pieces:
    """:func:`dense_pieces` on the tiled kernels' path: the accumulator ``acc`` is one flat
    buffer of ``blocks`` (:mod:`poskernel_tl.kernels.gram_tiles`), read by tiles
    (:mod:`poskernel_tl.kernels.gram_fit_tiles`: the per-lag sums and squares, Y = B_low·X,
    each one launch per layer and side). ``views``: the blocks, for ``keep``."""
    T = x.shape[1]
    table = kernels.block_table(blocks, n_heads, acc.device)
    read = dict(n_heads=n_heads, length=T, rows=GRAM_ROWS)

    def side(up: bool, lag: int | None) -> tuple[Tensor, Tensor, Tensor]:
        sums = kernels.stored_lag_sums(acc, table, last=lag, upper=up, **read)
        y = kernels.stored_apply(acc, table, x, n_heads, GRAM_ROWS, lag, up).double()
        return F.pad(sums[0], (0, T - 1 - sums.shape[-1])), sums[1].sum(-1), y

    out = Pieces(*side(False, last))
    if upper:  # every key of every row is held: B's diagonal from its rows' offsets
        out.s1_up, out.sq_up, out.y_up = side(True, last)
        t = torch.arange(T, device=acc.device)
        at = table[t // GRAM_ROWS]  # (r0, rows, k0, keys, offset) of each row's block
        h = torch.arange(n_heads, device=acc.device)[:, None]
        out.diag = acc[at[:, 4] + h * at[:, 1] * at[:, 3] + (t - at[:, 0]) * at[:, 3]
                       + t - at[:, 2]].double()
    if keep is not None:  # (kept only up to T = 256: a few blocks)
        for (r0, r1, _, _), view in zip(blocks, views):
            keep(r0, r1, view / n)
    return out.divided(n)


def factor_pieces(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"],
                  x: Float[Tensor, "kv_head_index pos rank"], upper: bool = False,
                  last: int | None = None, chunk: int | None = None) -> Pieces:
    """B = mean_x q̃_x·k̃_xᵀ from the factors (``q`` already carries the scale). ``upper``:
    the upper triangle's pieces too (Bᵀ's lower ones, grouped keys repeated to their
    query heads). ``last``: the pieces of the offsets t − s ≤ last only (a sliding
    window). Above a rank n·d_head of :data:`FACTOR_RANK_MAX`, from the blocks
    (:func:`factor_blocks`). ``chunk``: a chunked mask's entries only (the factors spread by chunk,
    :func:`~poskernel_tl.models.softmax_ops.chunk_qk`: 0 across chunks)."""
    if chunk is not None:
        q, k = chunk_qk(q, k, chunk)
    n, T, H, d = q.shape
    if kernels.takes(q, chunk):  # the accumulator from the factors, then read
        blocks = gram_row_blocks(T, upper, last=last)
        flat, _, table = kernels.gram_layout(blocks, H, q.device)
        kernels.gram_tile_update(flat, table, GRAM_ROWS, q, k)
        return tile_pieces(flat, blocks, H, n, x, upper=upper, last=last)
    if n * d > FACTOR_RANK_MAX:  # the moments would outgrow the blocks: form the blocks
        blocks = gram_row_blocks(T, upper, last=last)
        return dense_pieces(factor_blocks(q, k, blocks), n, x, upper=upper, last=last,
                            chunk=chunk)
    s1 = windowed(lag_sums(q, k, 1.0).sum(0), last)  # (lag_sums bounds its FFTs)
    # the factors side by side, [1, T, heads, n·d] in FIT_DTYPE (one copy each): n·B = qs·ksᵀ
    side = lambda t: cast_permuted(t, (1, 2, 0, 3), FIT_DTYPE).view(1, T, t.shape[2], n * d)
    qs, ks = side(q), side(k)
    xs = x.transpose(0, 1)
    out = Pieces(s1, lower_sum_squares(qs, ks, 1.0, last=last, dtype=FIT_DTYPE)[0],
                 lower_apply(qs[0], ks[0], xs, last=last, dtype=FIT_DTYPE))
    if upper:  # Bᵀ's lower triangle: keys as queries, one per query head
        kh, _ = mirrored(q, k)
        khs = side(kh)
        out.s1_up = windowed(lag_sums(kh, q, 1.0).sum(0), last)
        out.sq_up = lower_sum_squares(khs, qs, 1.0, last=last)[0]
        # Y_up[t] = Σ_{s>t} B[t, s]·x_s: the lower product with positions reversed
        out.y_up = lower_apply(qs[0].flip(0), ks[0].flip(0), xs.flip(0),
                               last=last).flip(1)
        out.diag = (qs[0].double() * khs[0].double()).sum(-1).transpose(0, 1)
    return out.divided(n)


__all__ = ["Pieces", "dense_pieces", "factor_blocks", "factor_pieces", "lower_apply",
           "lower_block_sums", "tile_pieces", "upper_block_sums"]

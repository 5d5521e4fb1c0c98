"""The shift-invariant (Toeplitz) fit on the strictly lower triangle, from sufficient
statistics.

For a score matrix A[t, s] restricted to s < t (lag Δ = t − s = 1..T−1), the best
shift-invariant fit is g(Δ) = mean of the Δ-th sub-diagonal, and

    SS_res = Σ_{s<t} A² − Σ_Δ S1(Δ)² / n(Δ),     SS_tot = Σ_{s<t} A² − (Σ_Δ S1(Δ))² / N,
    R² = 1 − SS_res / SS_tot,

with S1(Δ) the sum and n(Δ) the count of sub-diagonal Δ, N = Σ n(Δ). Sums add across
sequences, so pooled fits, subsets and subsets of query rows all come from the same
three numbers per lag: count, sum, and the total sum of squares.

**Both triangles** (bidirectional encoders, no causal mask). The entries above the
diagonal are the lags Δ = −1..−(T−1) (key after query). The upper triangle of A is the
lower triangle of Aᵀ, so every identity above applies to Aᵀ unchanged; a two-sided fit
concatenates the two sides' per-lag sums and counts (one g per signed lag, R² over every
off-diagonal entry: :func:`r2_two_sided`). Arrays keep Δ = 1..T−1 on the ``lag`` axis; the
other side sits in a parallel ``*_back`` array (index j ↔ Δ = −(j+1)), the diagonal
(Δ = 0, never fitted) in ``*_self``. :func:`two_sided` joins them along signed lags
Δ = −(T−1)..T−1, and :func:`sym_antisym` splits a two-sided g into its symmetric and
antisymmetric parts.
"""

import warnings
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.errors import UserError
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.mask import Mask, within
from poskernel_tl.protocol import band_ends


def skew_lower(
    scores: Float[Tensor, "*batch query_pos key_pos"],
) -> Float[Tensor, "*batch query_pos lag"]:
    """View of the strictly lower triangle indexed by lag: out[..., t, Δ−1] = A[t, t−Δ]
    for Δ = 1..T−1, and 0 where t < Δ (no such key). One padded copy of A."""
    T = scores.shape[-1]
    batch = scores.shape[:-2]
    padded = F.pad(scores.flip(-1), (0, T))  # [..., T, 2T]: padded[t, j] = A[t, T-1-j]
    sheared = padded.reshape(*batch, 2 * T * T)[..., : T * (2 * T - 1)]
    sheared = sheared.reshape(*batch, T, 2 * T - 1)  # sheared[t, c] = padded[t, c - t]
    return sheared[..., T:]  # c = T-1+Δ, i.e. s = t - Δ


def lag_sums(
    scores: Float[Tensor, "*batch query_pos key_pos"],
    row_lo: int = 0,
    row_hi: int | None = None,
    last: int | None = None,
) -> tuple[Float[Tensor, "*batch lag"], Float[Tensor, "*batch"]]:
    """Per-lag sums S1(Δ) and the total sum of squares over the strictly lower triangle
    (optionally only query rows in [row_lo, row_hi), only offsets Δ ≤ ``last``), all
    in float64; lags past ``last`` sum to 0. This is the reference path of
    :func:`shift_invariance_r2`; the streaming reducers use :func:`lower_lag_stats`."""
    z = skew_lower(scores)[..., row_lo:row_hi, :].double()
    if last is not None:
        z = z * within(torch.arange(1, scores.shape[-1], device=z.device), last)
    return z.sum(dim=-2), (z * z).sum(dim=(-2, -1))


def band_part_sums(x: Float[Tensor, "*batch lag"]) -> Float[Tensor, "*batch part"]:
    """Sums of ``x`` over Δ = 1..T−1 within each band of the partition
    :func:`~poskernel_tl.protocol.band_ends`."""
    ends = band_ends(x.shape[-1] + 1)
    return torch.stack([x[..., a:b].sum(-1) for a, b in zip([0] + ends[:-1], ends)], -1)


def lag_means(s1: Float[Tensor, "*batch lag"], counts: Float[Tensor, "... lag"]
              ) -> Float[Tensor, "*batch lag"]:
    """g(Δ) = S1(Δ) / n(Δ) in float64; NaN at lags with no entries."""
    counts = counts.to(s1.device, torch.float64)
    has = counts > 0
    return torch.where(has, s1.double() / torch.where(has, counts, 1.0), float("nan"))


def r2_from_sums(
    s1: Float[Tensor, "*batch lag"],
    sq: Float[Tensor, "*batch"],
    counts: Float[Tensor, "... lag"],
    warn: bool = True,
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"]]:
    """R² and g(Δ) from per-lag sums, total sum of squares and per-lag counts.
    Lags with no entries get g = NaN; a constant input (SS_tot = 0) gives R² = NaN, with
    a warning unless ``warn`` is false (a streaming reducer: the check waits for the
    device)."""
    counts = counts.to(s1.device, torch.float64)
    s1 = s1.double()
    sq = sq.double()
    has = counts > 0
    safe = torch.where(has, counts, torch.ones_like(counts))
    g = lag_means(s1, counts)
    n_total = counts.sum(-1)
    explained = torch.where(has, s1 * s1 / safe, torch.zeros_like(s1)).sum(-1)
    total = s1.sum(-1)
    ss_tot = sq - total * total / n_total
    ss_res = sq - explained
    # relative floor: SS_tot at rounding level of Σ A² is a constant matrix
    degenerate = ss_tot <= 1e-12 * torch.clamp(sq, min=torch.finfo(torch.float64).tiny)
    if warn and bool(degenerate.any()):
        warnings.warn("shift_invariance_r2: constant input (zero variance); R² is NaN",
                      RuntimeWarning, stacklevel=2)
    r2 = torch.where(degenerate, torch.full_like(ss_tot, float("nan")),
                     1.0 - ss_res / torch.where(degenerate, torch.ones_like(ss_tot), ss_tot))
    return r2, g


def kept_finite(g: Float[np.ndarray, "*batch lag"]) -> bool:
    """Whether g is finite over the offsets its fit kept: along the lag axis finite from
    Δ = 1 up to some last offset (a sliding window's, or T − 1) and NaN after it, never
    NaN first nor finite again."""
    ok = np.isfinite(g)
    return bool(ok[..., 0].all() and (ok[..., :-1] >= ok[..., 1:]).all()
                and not np.isinf(g).any())


def shift_invariance_r2(
    scores: Float[Tensor, "*batch query_pos key_pos"], last: int | None = None,
    chunk: int | None = None,
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"]]:
    """Fit g(Δ) to the strictly lower triangle of ``scores`` and return ``(r2, g)``.

    ``g[..., Δ−1]`` is the mean of sub-diagonal Δ (Δ = 1..T−1); R² = 1 − SS_res/SS_tot
    over all entries with s < t, accumulated in float64. Entries on or above the
    diagonal are ignored whatever they hold (masked fills included). ``last``: fit
    only the entries with t − s ≤ last (what a sliding window keeps; g is NaN past it).
    ``chunk``: only the entries with t and s in one chunk of that many positions (a
    chunked mask).
    """
    T = scores.shape[-1]
    if scores.shape[-2] != T or T < 3:
        raise UserError(f"need square score matrices with T >= 3, got {tuple(scores.shape)}")
    if chunk is not None:
        pos = torch.arange(T, device=scores.device)
        scores = torch.where(Mask(T, chunk=chunk).same_chunk(pos[:, None], pos[None]), scores,
                             0.0)
    s1, sq = lag_sums(scores, last=last)
    return r2_from_sums(s1, sq, lag_counts(T, device=scores.device, last=last,
                                           chunk=chunk))


# ------------------------------------------------------------- both triangles
Sums = tuple[Float[Tensor, "*batch lag"], Float[Tensor, "*batch"], Float[Tensor, "... lag"]]


def r2_two_sided(front: Sums, back: Sums | None, warn: bool = True
                 ) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"],
                            Float[Tensor, "*batch lag"] | None]:
    """R², g(Δ) for Δ = 1..T−1 and g(−Δ) (None without ``back``) from ``(S1, Σ A², n)``
    of each side: one g per signed lag, R² over the entries of both sides together
    (``warn``: as :func:`r2_from_sums`)."""
    s1, sq, counts = front
    if back is None:
        return (*r2_from_sums(s1, sq, counts, warn), None)
    s1_b, sq_b, counts_b = back
    counts = torch.cat(torch.broadcast_tensors(counts.to(s1.device), counts_b.to(s1.device)),
                       -1)
    r2, g = r2_from_sums(torch.cat([s1.double(), s1_b.double()], -1),
                         sq.double() + sq_b.double(), counts, warn)
    n = s1.shape[-1]
    return r2, g[..., :n], g[..., n:]


def shift_invariance_r2_two_sided(
    scores: Float[Tensor, "*batch query_pos key_pos"], last: int | None = None,
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"], Float[Tensor, "*batch lag"],
           Float[Tensor, "*batch"]]:
    """:func:`shift_invariance_r2` over every off-diagonal entry (bidirectional models):
    ``(r2, g, g_back, g_self)`` with ``g[..., Δ−1]`` the mean of sub-diagonal Δ,
    ``g_back[..., Δ−1]`` that of super-diagonal Δ (lag −Δ), ``g_self`` the diagonal's mean
    (Δ = 0, not fitted). ``last``: the entries with |t − s| ≤ last only (a two-sided
    window: the lower triangle's rule on each side; g, g_back NaN past it)."""
    T = scores.shape[-1]
    if scores.shape[-2] != T or T < 3:
        raise UserError(f"need square score matrices with T >= 3, got {tuple(scores.shape)}")
    counts = lag_counts(T, device=scores.device, last=last)
    side = lambda x: (*lag_sums(x, last=last), counts)
    r2, g, g_back = r2_two_sided(side(scores), side(scores.transpose(-1, -2)))
    return r2, g, g_back, scores.diagonal(0, -2, -1).double().mean(-1)


def two_sided(forward: Float[np.ndarray, "*batch lag"], back: Float[np.ndarray, "*batch lag"],
              self_: Float[np.ndarray, "*batch"] | float | None = None
              ) -> Float[np.ndarray, "*batch signed_lag"]:
    """g over signed lags Δ = −(T−1)..0..T−1 (index Δ + T − 1), from ``forward``
    (Δ = 1..T−1), ``back`` (index j ↔ Δ = −(j+1)) and ``self_`` (Δ = 0; NaN when None)."""
    forward, back = np.asarray(forward, np.float64), np.asarray(back, np.float64)
    if forward.shape != back.shape:
        raise UserError(f"two_sided: forward {forward.shape} and back {back.shape} differ")
    mid = np.full(forward.shape[:-1], np.nan) if self_ is None else \
        np.broadcast_to(np.asarray(self_, np.float64), forward.shape[:-1])
    return np.concatenate([back[..., ::-1], mid[..., None], forward], -1)


def sym_antisym(g: Float[np.ndarray, "*batch signed_lag"]
                ) -> tuple[Float[np.ndarray, "*batch signed_lag"],
                           Float[np.ndarray, "*batch signed_lag"], Float[np.ndarray, "*batch"]]:
    """``(sym, anti, asym)`` of a two-sided g (:func:`two_sided` order): sym(Δ) =
    (g(Δ) + g(−Δ))/2, anti(Δ) = (g(Δ) − g(−Δ))/2 (0 at Δ = 0), and the asymmetry score
    Σ anti² / Σ (g − ḡ)² over Δ ≠ 0: the share of g's variance about its mean that is
    antisymmetric (the two parts are orthogonal there, so it lies in [0, 1]: 0 for a
    symmetric g, 1 for an antisymmetric one; NaN for a constant g). Δ = 0, the diagonal
    where a token meets itself, is left out of the score."""
    g = np.asarray(g, np.float64)
    n = g.shape[-1]
    if n % 2 == 0 or n < 3:
        raise UserError(f"sym_antisym: a two-sided g has an odd length >= 3, got {n}")
    flip = g[..., ::-1]
    sym, anti = (g + flip) / 2, (g - flip) / 2
    anti[..., n // 2] = 0.0
    off = np.delete(g, n // 2, axis=-1)
    var = ((off - off.mean(-1, keepdims=True)) ** 2).sum(-1)
    share = (np.delete(anti, n // 2, axis=-1) ** 2).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        asym = np.where(var > 1e-24 * np.maximum((off ** 2).sum(-1), 1e-300),
                        share / np.where(var > 0, var, 1.0), np.nan)
    return sym, anti, asym


# ---------------------------------------------------------- the streaming fast path
def lower_mean_from_qk(
    q: Float[Tensor, "batch pos head_index d_head"],
    k: Float[Tensor, "batch pos kv_head_index d_head"],
    scale: float,
) -> Float[Tensor, "batch head_index"]:
    """Mean of the strictly lower triangle of A = scale·q·kᵀ in O(T·d), without A:
    Σ_{s<t} q_t·k_s = Σ_t q_t·(Σ_{s<t} k_s). Computed in the input precision: it only
    serves as the shift that keeps sums of squares well conditioned."""
    T = q.shape[1]
    before = (k.cumsum(dim=1) - k).repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    total = (q * before).sum(dim=(1, 3))
    return total.double() * scale / (T * (T - 1) / 2)


_MASKS: dict = {}


def _upper_mask(T: int, device) -> Tensor:
    """Bool [T, T], True on and above the diagonal (the entries a fit never reads)."""
    key = (T, str(device))
    if key not in _MASKS:
        _MASKS[key] = torch.ones(T, T, dtype=torch.bool, device=device).triu()
    return _MASKS[key]


def key_block_index(T: int, key_hi: int, row_lo: int, device=None,
                    last: int | None = None) -> tuple[Tensor, Tensor]:
    """For the entries with key s < ``key_hi`` and query row t ≥ ``row_lo`` (and s < t,
    t − s ≤ ``last``): ``rows[s, Δ−1] = s + Δ`` (clamped into range) and
    ``valid[s, Δ−1]``, Δ = 1..T−1."""
    s = torch.arange(key_hi, device=device)[:, None]
    lags = torch.arange(1, T, device=device)[None]
    t = s + lags
    valid = (t < T) & (t >= row_lo) & (lags <= (T if last is None else last))
    return t.clamp(max=T - 1), valid


def key_block_counts(T: int, key_hi: int, row_lo: int, device=None,
                     last: int | None = None) -> Float[Tensor, " lag"]:
    """n(Δ) of the entries with key s < ``key_hi`` and query row t ≥ ``row_lo`` (and
    t − s ≤ ``last``)."""
    return key_block_index(T, key_hi, row_lo, device, last)[1].sum(0).double()


def _unshift(s1p: Tensor, sqp: Tensor, counts: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Raw (S1, Σ A²) from the sums of A − c (``c`` [batch, head_index], float64)."""
    counts = counts.to(s1p.device)
    s1 = s1p + c[..., None] * counts
    sq = sqp + 2 * c * s1p.sum(-1) + c * c * counts.sum()
    return s1, sq


def _row_block_stats(top: Tensor, c: Tensor, lo: int, hi: int, last: int | None = None
                     ) -> tuple[Tensor, Tensor]:
    """(S1, Σ A²) of query rows [lo, hi) from ``top`` = A − c, zero on and above the
    diagonal (and past the window, ``last``)."""
    b, h, T, _ = top.shape
    hi = min(hi, T)
    if hi <= lo:
        zero = torch.zeros(b, h, T - 1, dtype=torch.float64, device=top.device)
        return zero, zero.sum(-1)
    lags = torch.arange(1, T, device=top.device)
    rows = torch.arange(lo, hi, device=top.device)[:, None]
    keys = rows - lags[None]  # [rows, lag]
    valid = ((keys >= 0) & (lags[None] <= (T if last is None else last))).to(top.dtype)
    g = top[:, :, lo:hi].gather(-1, keys.clamp(min=0).expand(b, h, -1, -1)) * valid
    return _unshift(g.sum(-2).double(), (g * g).sum((-2, -1)).double(),
                    lag_counts(T, lo, hi, last=last), c)


def _key_block_stats(top: Tensor, c: Tensor, key_hi: int, row_lo: int,
                     last: int | None = None) -> tuple[Tensor, Tensor]:
    """(S1, Σ A²) of the keys s < ``key_hi`` in query rows t ≥ ``row_lo``, from ``top``
    as in :func:`_row_block_stats`."""
    b, h, T, _ = top.shape
    key_hi = min(key_hi, T)
    rows, valid = key_block_index(T, key_hi, row_lo, top.device, last)
    cols = top.transpose(-1, -2)[:, :, :key_hi]  # [b, h, key, query]
    g = cols.gather(-1, rows.expand(b, h, -1, -1)) * valid.to(top.dtype)
    return _unshift(g.sum(-2).double(), (g * g).sum((-2, -1)).double(),
                    key_block_counts(T, key_hi, row_lo, last=last), c)


def shifted_lower(scores: Float[Tensor, "batch head_index query_pos key_pos"],
                  shift: Float[Tensor, "batch head_index"], work: Tensor | None = None,
                  last: int | None = None
                  ) -> tuple[Float[Tensor, "batch head_index query_pos key_pos"],
                             Float[Tensor, "batch head_index lag key_pos"]]:
    """``(top, diag)``: the strictly lower triangle of scores − shift (the rest zeroed, and
    the offsets past ``last``) in the top half of ``work`` [batch, head_index, 2T, T]
    (lower half zero; made when None or of another shape), and its sub-diagonals Δ =
    1..T−1 as strided rows of the buffer (element (Δ, j) is work[Δ + j, j], running past
    row T − 1 into the zero half)."""
    b, h, T, _ = scores.shape
    if work is None or work.shape != (b, h, 2 * T, T):
        work = torch.zeros(b, h, 2 * T, T, dtype=scores.dtype, device=scores.device)
    top = work[:, :, :T]
    torch.sub(scores, shift[..., None, None], out=top)
    top.masked_fill_(_upper_mask(T, top.device), 0.0)
    if last is not None and last < T - 1:
        top.triu_(-last)
    diag = work.as_strided((b, h, T - 1, T), (work.stride(0), work.stride(1), T, T + 1),
                           work.storage_offset() + T)
    return top, diag


def lower_lag_stats(
    scores: Float[Tensor, "batch head_index query_pos key_pos"],
    shift: Float[Tensor, "batch head_index"],
    small_blocks: list[tuple[int, int]],
    work: Tensor | None = None,
    key_block: tuple[int, int] | None = None,
    key_blocks: Sequence[tuple[int, int]] = (),
    last: int | None = None,
    bands: bool = False,
) -> tuple[tuple[Tensor, ...], list[tuple[Tensor, Tensor]]]:
    """Per-lag sums S1(Δ) and sums of squares of the strictly lower triangle, for the
    whole triangle, for a few small blocks of query rows [lo, hi), and optionally for the
    block of keys s < key_hi in query rows t ≥ row_lo (``key_block = (key_hi, row_lo)``,
    appended after the row blocks, then one block per ``key_blocks`` entry alike), in a
    handful of passes over ``scores`` (left untouched, and may be a transposed view;
    entries on and above the diagonal may hold anything, masked fills included).

    Sums are formed on A − shift (choose the shift near the mean, e.g.
    :func:`lower_mean_from_qk`, so sums of squares do not cancel), within one lag or
    one row in the input dtype, and converted back to raw float64 statistics exactly.
    ``work`` is an optional reusable buffer [batch, head_index, 2T, T] whose lower half
    is zero. ``last``: every sum over the entries with t − s ≤ last only (those a
    sliding window keeps). ``bands``: the whole triangle's sums also hold Σ A² over each
    band of offsets of :func:`~poskernel_tl.protocol.band_ends` (:func:`band_part_sums`
    of the per-lag sums of squares, one more pass over the lags). Returns ``((s1, sq[,
    bands]), [(s1_block, sq_block), ...])``.
    """
    T = scores.shape[-1]
    c = shift.to(torch.float64)
    top, diag = shifted_lower(scores, c.to(scores.dtype), work, last)
    s1_shift = diag.sum(-1).double()
    sq_shift = torch.linalg.vector_norm(top, dim=-1).double().pow(2).sum(-1)
    counts = lag_counts(T, last=last, device=c.device)
    total = _unshift(s1_shift, sq_shift, counts, c)
    if bands:  # Σ (a − c)² per lag, unshifted lag by lag
        sq_lag = torch.linalg.vector_norm(diag, dim=-1).double().pow(2)
        sq_lag = sq_lag + c[..., None] * (2 * s1_shift + c[..., None] * counts)
        total = (*total, band_part_sums(sq_lag))
    blocks = [_row_block_stats(top, c, lo, hi, last) for lo, hi in small_blocks]
    for block in ([key_block] if key_block is not None else []) + list(key_blocks):
        blocks.append(_key_block_stats(top, c, *block, last=last))
    return total, blocks

"""The separable baseline's fits from sufficient statistics (the analysis: the package's
``__init__``): the row, column and lag sums of the entries a layer keeps
(:class:`SeparableStats`), and R² of the Toeplitz, separable and Toeplitz + separable
linear models from them by the normal equations (:func:`separable_r2_from_stats`).

The design is over the strictly lower triangle's entries the layer's mask keeps
(:class:`~poskernel_tl.mask.Mask`: the whole triangle, a sliding window's band or a
chunked mask's blocks). On the whole triangle XᵀX's null space is known in closed form
(the module docstring of the package); on a band or blocks the solve is XᵀX's
pseudo-inverse, from its eigenvalues, cached per mask.
"""

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.toeplitz import shifted_lower
from poskernel_tl.mask import Mask

FITS = ("R2_toeplitz", "R2_separable", "R2_toeplitz_separable")


@dataclass
class SeparableStats:
    """Sufficient statistics of the strictly lower triangle, float64.

    ``row[..., t−1]`` = Σ_{s<t} A[t, s] (t = 1..T−1); ``col[..., s]`` = Σ_{t>s} A[t, s]
    (s = 0..T−2); ``lag[..., Δ−1]`` = Σ_t A[t, t−Δ] (Δ = 1..T−1); ``sq`` = Σ A²;
    ``total`` = Σ A (the grand sum). All add across sequences."""

    row: Float[Tensor, "*batch T_minus_1"]
    col: Float[Tensor, "*batch T_minus_1"]
    lag: Float[Tensor, "*batch T_minus_1"]
    sq: Float[Tensor, "*batch"]
    total: Float[Tensor, "*batch"]

    def map(self, fn) -> "SeparableStats":
        """``fn`` applied to each statistic."""
        return SeparableStats(*(fn(x) for x in vars(self).values()))

    def sum(self, dim: int = 0) -> "SeparableStats":
        """Statistics summed over one batch axis (pooling sequences)."""
        return self.map(lambda x: x.sum(dim))

    def __getitem__(self, idx) -> "SeparableStats":
        return self.map(lambda x: x[idx])


# ------------------------------------------------------------------- statistics
def _counts(mask: Mask, device=None) -> tuple[Tensor, Tensor, Tensor]:
    """Kept entries per lag Δ = 1..T−1, per query row t = 1..T−1 and per key column
    s = 0..T−2 (float64)."""
    T = mask.length
    if mask.whole:
        i = torch.arange(1, T, dtype=torch.float64, device=device)
        return T - i, i, T - i  # lag Δ: T−Δ; row t: t; column s = i−1: T−1−s
    return tuple(x.to(device) for x in _masked_counts(mask))


@functools.lru_cache(maxsize=8)
def _masked_counts(mask: Mask) -> tuple[Tensor, Tensor, Tensor]:
    keep = mask.lower().double()
    return _lag_row(keep).sum(1), keep[1:].sum(-1), keep[:, :-1].sum(0)


def _lag_row(keep: Tensor) -> Tensor:
    """[lag Δ = 1..T−1, row t = 1..T−1]: whether row t keeps its key at t − Δ."""
    T = keep.shape[-1]
    d, t = torch.arange(1, T)[:, None], torch.arange(1, T)[None]
    return keep[t.expand(T - 1, -1), (t - d).clamp(min=0)] * (t >= d)


def lower_stats_into(
    scores: Float[Tensor, "batch query_pos key_pos"],
    work: Float[Tensor, "batch double_pos key_pos"], mask: Mask | None = None,
) -> SeparableStats:
    """Statistics of ``scores`` [B, T, T] using ``work`` [B, 2T, T] (lower half zero),
    over the entries ``mask`` keeps (None: the whole strict lower triangle)."""
    B, T, _ = scores.shape
    mask = mask or Mask(T)
    keep = mask.lower(scores.device)
    # shift by an approximate mean so that sums of squares do not cancel in float32
    n_lag, n_row, n_col = _counts(mask, scores.device)
    n_lower = T * (T - 1) / 2 if mask.whole else float(n_row.sum())
    approx = torch.where(keep, scores, 0).sum((-2, -1)).double() / n_lower
    c = approx.to(scores.dtype)  # the shift actually subtracted, exactly
    top, diag = shifted_lower(scores[:, None], c[:, None], work[:, None])
    top, diag = top[:, 0], diag[:, 0]
    if not mask.whole:
        top.masked_fill_(~keep, 0.0)
    lag = diag.sum(-1).double()
    row = top.sum(-1)[:, 1:].double()
    col = top.sum(-2)[:, :-1].double()
    sq = torch.linalg.vector_norm(top, dim=-1).double().pow(2).sum(-1)
    total = row.sum(-1)
    c = c.double()
    return SeparableStats(
        row=row + c[:, None] * n_row,
        col=col + c[:, None] * n_col,
        lag=lag + c[:, None] * n_lag,
        sq=sq + 2 * c * total + c * c * n_lower,
        total=total + c * n_lower,
    )


def separable_stats(scores: Float[Tensor, "*batch query_pos key_pos"],
                    mask: Mask | None = None) -> SeparableStats:
    """Row, column and lag sums, sum of squares and grand sum of the strictly lower
    triangle of ``scores`` (float64), over the entries ``mask`` keeps (None: all). Entries
    on or above the diagonal, or not kept, are ignored whatever they hold."""
    T = scores.shape[-1]
    if scores.shape[-2] != T or T < 3:
        raise ValueError(f"need square score matrices with T >= 3, got {tuple(scores.shape)}")
    batch = scores.shape[:-2]
    flat = scores.reshape(-1, T, T)
    work = torch.zeros(flat.shape[0], 2 * T, T, dtype=flat.dtype, device=flat.device)
    return lower_stats_into(flat, work, mask).map(lambda x: x.reshape(batch + x.shape[1:]))


# --------------------------------------------------------------- normal equations
@dataclass(frozen=True)
class _Basis:
    """Per-T solve: ``explained = ‖(b − N Nᵀ b) W‖²`` with W = L⁻ᵀ, L Lᵀ = XᵀX + N Nᵀ."""

    counts: Tensor  # Xᵀ1 for (lag, row, col) stacked: [3(T−1)]
    w_sep: Tensor  # [2(T−1), 2(T−1)]
    null_sep: Tensor  # [2(T−1), 1]
    w_full: Tensor  # [3(T−1), 3(T−1)]
    null_full: Tensor  # [3(T−1), 3]


def gram(T: int, mask: Mask | None = None) -> Float[Tensor, "n_params n_params"]:
    """XᵀX of the Toeplitz + row + column design on the entries of one T×T strictly lower
    triangle that ``mask`` keeps (None: all), parameters ordered (lag Δ = 1..T−1, row
    t = 1..T−1, column s = 0..T−2)."""
    m = T - 1
    keep = (mask or Mask(T)).lower().double()
    n_lag, n_row, n_col = _counts(mask or Mask(T))
    lag_row = _lag_row(keep)  # row t holds lag Δ iff it keeps s = t − Δ
    s = torch.arange(0, T - 1)
    d = torch.arange(1, T)[:, None]
    lag_col = keep[(s[None] + d).clamp(max=T - 1), s[None].expand(T - 1, -1)] \
        * (s[None] + d <= T - 1)  # column s holds lag Δ iff row s + Δ keeps it
    row_col = keep[1:, :-1]
    g = torch.zeros(3 * m, 3 * m, dtype=torch.float64)
    g[:m, :m] = torch.diag(n_lag)
    g[m:2 * m, m:2 * m] = torch.diag(n_row)
    g[2 * m:, 2 * m:] = torch.diag(n_col)
    g[:m, m:2 * m], g[m:2 * m, :m] = lag_row, lag_row.T
    g[:m, 2 * m:], g[2 * m:, :m] = lag_col, lag_col.T
    g[m:2 * m, 2 * m:], g[2 * m:, m:2 * m] = row_col, row_col.T
    return g


def _whitener(g: Tensor, null: Tensor) -> Tensor:
    chol = torch.linalg.cholesky(g + null @ null.T)
    eye = torch.eye(len(g), dtype=g.dtype)
    return torch.linalg.solve_triangular(chol, eye, upper=False).T.contiguous()


def _pseudo_whitener(g: Tensor) -> tuple[Tensor, Tensor]:
    """(W, N) with ‖b W‖² = bᵀ g⁺ b for b in g's range (N empty): g's eigenvectors over
    the square roots of its eigenvalues, those above rounding only."""
    vals, vecs = torch.linalg.eigh(g)
    keep = vals > vals.max() * len(g) * torch.finfo(g.dtype).eps * 8
    return (vecs[:, keep] / vals[keep].sqrt()).contiguous(), g.new_zeros(len(g), 0)


@functools.lru_cache(maxsize=4)
def _basis_cpu(mask: Mask) -> _Basis:
    """The solve of ``mask``'s design: closed-form null spaces for the whole triangle; on
    a window's band or a chunk's blocks (whose null space the mask shapes: the constant
    moves between the rows and columns of each chunk) the pseudo-inverse, from XᵀX's
    eigenvalues."""
    T = mask.length
    m = T - 1
    g = gram(T, mask)
    counts = torch.cat(_counts(mask))
    if not mask.whole:
        return _Basis(counts, *_pseudo_whitener(g[m:, m:]), *_pseudo_whitener(g))
    one, zero = torch.ones(m, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
    idx = torch.arange(1, T, dtype=torch.float64)
    null_sep = torch.cat([one, -one])[:, None] / np.sqrt(2 * m)
    # X v = 0 for: constant lag ↔ row, constant lag ↔ column, Δ·lag = t·row − s·column
    raw = torch.stack([torch.cat([one, -one, zero]), torch.cat([one, zero, -one]),
                       torch.cat([idx, -idx, idx - 1])], dim=1)
    null_full = torch.linalg.qr(raw).Q
    return _Basis(counts, _whitener(g[m:, m:], null_sep), null_sep,
                  _whitener(g, null_full), null_full)


_DEVICE_CACHE: dict = {}


def _basis(mask: Mask, device) -> _Basis:
    key = (mask, str(device))
    if key not in _DEVICE_CACHE:
        if len(_DEVICE_CACHE) >= 4:
            _DEVICE_CACHE.pop(next(iter(_DEVICE_CACHE)))
        b = _basis_cpu(mask)
        _DEVICE_CACHE[key] = _Basis(*(x.to(device) for x in vars(b).values()))
    return _DEVICE_CACHE[key]


def _explained(b: Tensor, w: Tensor, null: Tensor, chunk: int = 4096) -> Tensor:
    """‖(b − N Nᵀ b) W‖² over the last axis, in row chunks to bound memory."""
    flat = b.reshape(-1, b.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float64, device=b.device)
    for i in range(0, flat.shape[0], chunk):
        x = flat[i:i + chunk]
        x = x - (x @ null) @ null.T
        out[i:i + chunk] = (x @ w).pow(2).sum(-1)
    return out.reshape(b.shape[:-1])


def separable_r2_from_stats(stats: SeparableStats, T: int, n: int = 1,
                            mask: Mask | None = None) -> dict[str, Tensor]:
    """R² of the three fits from statistics summed over ``n`` sequences of length ``T``,
    over the entries ``mask`` keeps (None: the whole strict lower triangle).

    Returns ``{"R2_toeplitz", "R2_separable", "R2_toeplitz_separable"}``, each shaped like
    ``stats.sq``. A constant input (zero variance) gives NaN, with a warning."""
    dev = stats.sq.device
    mask = mask or Mask(T)
    basis = _basis(mask, dev)
    m = T - 1
    n_lower = n * T * (T - 1) / 2 if mask.whole else n * float(basis.counts[m:2 * m].sum())
    mean = stats.total / n_lower
    ss_tot = stats.sq - stats.total * mean
    b = torch.cat([stats.lag, stats.row, stats.col], dim=-1)
    b = b - mean[..., None] * (n * basis.counts)  # Xᵀ(y − ȳ)
    held = basis.counts[:m] > 0  # (a lag past a window: no entry, no parameter)
    exp_toep = torch.where(held, b[..., :m].pow(2) / (n * basis.counts[:m]), 0.0).sum(-1)
    exp_sep = _explained(b[..., m:], basis.w_sep, basis.null_sep) / n
    exp_full = _explained(b, basis.w_full, basis.null_full) / n
    degenerate = ss_tot <= 1e-12 * torch.clamp(stats.sq, min=torch.finfo(torch.float64).tiny)
    if bool(degenerate.any()):
        warnings.warn("separable_r2: constant input (zero variance); R² is NaN",
                      RuntimeWarning, stacklevel=2)
    safe = torch.where(degenerate, torch.ones_like(ss_tot), ss_tot)
    nan = torch.full_like(ss_tot, float("nan"))
    return {name: torch.where(degenerate, nan, e / safe)
            for name, e in zip(FITS, (exp_toep, exp_sep, exp_full))}


def separable_r2(scores: Float[Tensor, "*batch query_pos key_pos"],
                 mask: Mask | None = None) -> dict[str, Tensor]:
    """Per-matrix R² of the Toeplitz, separable and Toeplitz + separable fits on the
    strictly lower triangle's entries ``mask`` keeps (None: all): ``{"R2_toeplitz",
    "R2_separable", "R2_toeplitz_separable"}``, each ``Float[Tensor, "*batch"]``."""
    return separable_r2_from_stats(separable_stats(scores, mask), scores.shape[-1], 1, mask)


__all__ = ["FITS", "SeparableStats", "gram", "lower_stats_into", "separable_r2",
           "separable_r2_from_stats", "separable_stats"]

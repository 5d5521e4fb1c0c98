"""Causal-mask separable baseline (Kim et al. 2025, "Behind RoPE: how does the causal mask
encode positional information?").

On the strictly lower triangle s < t of a score matrix A[t, s], three linear models are
fitted by exact least squares:

- Toeplitz: A ≈ g(t − s), one parameter per lag Δ = 1..T−1 (the Track A fit);
- separable: A ≈ r(t) + c(s), a row effect plus a column effect (what a causal mask alone
  can produce: the number of visible keys depends on t, the key's age on s);
- Toeplitz + separable: A ≈ g(t − s) + r(t) + c(s).

Each is a regression on indicator columns, so its design matrix X depends only on T and
the data enter only through the sufficient statistics Xᵀy = (row sums, column sums, lag
sums) and yᵀy. With y centred (every model holds the constant), the explained sum of
squares is b_cᵀ (XᵀX)⁺ b_c with b_c = Xᵀy − ȳ·Xᵀ1, and R² = b_cᵀ (XᵀX)⁺ b_c / SS_tot.
XᵀX is rank-deficient with a null space known in closed form (separable: the constant
moved between rows and columns; Toeplitz + separable: additionally the constant and the
linear trend Δ = t − s moved between lags, rows and columns), so
(XᵀX)⁺ b = (XᵀX + N Nᵀ)⁻¹ b for b ⊥ N (N an orthonormal null-space basis): one Cholesky
factor per T, well conditioned (cond ≈ 2T), cached, and applied to every head as a matrix
product. Pooling n sequences sums the statistics and scales XᵀX by n.

The difference R²(Toeplitz + separable) − R²(separable) is what shift-invariance adds
beyond the causal mask's row/column structure; R²(Toeplitz + separable) − R²(Toeplitz)
is the reverse.
"""

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.fit.toeplitz import shifted_lower
from poskernel_tl.measurement.measure import choose_scores_path, forward_pass
from poskernel_tl.schema import head_index_columns

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
def _counts(T: int, device=None) -> tuple[Tensor, Tensor, Tensor]:
    """Entries per lag Δ, per query row t ≥ 1 and per key column s ≤ T−2 (float64)."""
    i = torch.arange(1, T, dtype=torch.float64, device=device)
    return T - i, i, T - i  # lag Δ: T−Δ; row t: t; column s = i−1: T−1−s


def _lower_stats_into(
    scores: Float[Tensor, "batch query_pos key_pos"],
    work: Float[Tensor, "batch double_pos key_pos"],
) -> SeparableStats:
    """Statistics of ``scores`` [B, T, T] using ``work`` [B, 2T, T] (lower half zero)."""
    B, T, _ = scores.shape
    mask = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril(-1)
    # shift by an approximate mean so that sums of squares do not cancel in float32
    n_lower = T * (T - 1) / 2
    approx = torch.where(mask, scores, 0).sum((-2, -1)).double() / n_lower
    c = approx.to(scores.dtype)  # the shift actually subtracted, exactly
    top, diag = shifted_lower(scores[:, None], c[:, None], work[:, None])
    top, diag = top[:, 0], diag[:, 0]
    lag = diag.sum(-1).double()
    row = top.sum(-1)[:, 1:].double()
    col = top.sum(-2)[:, :-1].double()
    sq = torch.linalg.vector_norm(top, dim=-1).double().pow(2).sum(-1)
    total = row.sum(-1)
    c = c.double()
    n_lag, n_row, n_col = _counts(T, scores.device)
    return SeparableStats(
        row=row + c[:, None] * n_row,
        col=col + c[:, None] * n_col,
        lag=lag + c[:, None] * n_lag,
        sq=sq + 2 * c * total + c * c * n_lower,
        total=total + c * n_lower,
    )


def separable_stats(scores: Float[Tensor, "*batch query_pos key_pos"]) -> SeparableStats:
    """Row, column and lag sums, sum of squares and grand sum of the strictly lower
    triangle of ``scores`` (float64). Entries on or above the diagonal are ignored
    whatever they hold (masked fills included)."""
    T = scores.shape[-1]
    if scores.shape[-2] != T or T < 3:
        raise ValueError(f"need square score matrices with T >= 3, got {tuple(scores.shape)}")
    batch = scores.shape[:-2]
    flat = scores.reshape(-1, T, T)
    work = torch.zeros(flat.shape[0], 2 * T, T, dtype=flat.dtype, device=flat.device)
    return _lower_stats_into(flat, work).map(lambda x: x.reshape(batch + x.shape[1:]))


# --------------------------------------------------------------- normal equations
@dataclass(frozen=True)
class _Basis:
    """Per-T solve: ``explained = ‖(b − N Nᵀ b) W‖²`` with W = L⁻ᵀ, L Lᵀ = XᵀX + N Nᵀ."""

    counts: Tensor  # Xᵀ1 for (lag, row, col) stacked: [3(T−1)]
    w_sep: Tensor  # [2(T−1), 2(T−1)]
    null_sep: Tensor  # [2(T−1), 1]
    w_full: Tensor  # [3(T−1), 3(T−1)]
    null_full: Tensor  # [3(T−1), 3]


def gram(T: int) -> Float[Tensor, "n_params n_params"]:
    """XᵀX of the Toeplitz + row + column design on one T×T strictly lower triangle,
    parameters ordered (lag Δ = 1..T−1, row t = 1..T−1, column s = 0..T−2)."""
    m = T - 1
    n_lag, n_row, n_col = _counts(T)
    d = torch.arange(1, T)[:, None]  # lag Δ
    t = torch.arange(1, T)  # row
    s = torch.arange(0, T - 1)  # column
    lag_row = (d <= t[None]).double()  # row t holds lag Δ iff t − Δ ≥ 0
    lag_col = (s[None] + d <= T - 1).double()  # column s holds lag Δ iff s + Δ ≤ T−1
    row_col = (s[None] < t[:, None]).double()
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


@functools.lru_cache(maxsize=4)
def _basis_cpu(T: int) -> _Basis:
    m = T - 1
    g = gram(T)
    one, zero = torch.ones(m, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
    idx = torch.arange(1, T, dtype=torch.float64)
    null_sep = torch.cat([one, -one])[:, None] / np.sqrt(2 * m)
    # X v = 0 for: constant lag ↔ row, constant lag ↔ column, Δ·lag = t·row − s·column
    raw = torch.stack([torch.cat([one, -one, zero]), torch.cat([one, zero, -one]),
                       torch.cat([idx, -idx, idx - 1])], dim=1)
    null_full = torch.linalg.qr(raw).Q
    counts = torch.cat(_counts(T))
    return _Basis(counts, _whitener(g[m:, m:], null_sep), null_sep,
                  _whitener(g, null_full), null_full)


_DEVICE_CACHE: dict = {}


def _basis(T: int, device) -> _Basis:
    key = (T, str(device))
    if key not in _DEVICE_CACHE:
        if len(_DEVICE_CACHE) >= 4:
            _DEVICE_CACHE.pop(next(iter(_DEVICE_CACHE)))
        b = _basis_cpu(T)
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


def separable_r2_from_stats(stats: SeparableStats, T: int, n: int = 1) -> dict[str, Tensor]:
    """R² of the three fits from statistics summed over ``n`` sequences of length ``T``.

    Returns ``{"R2_toeplitz", "R2_separable", "R2_toeplitz_separable"}``, each shaped like
    ``stats.sq``. A constant input (zero variance) gives NaN, with a warning."""
    dev = stats.sq.device
    basis = _basis(T, dev)
    m = T - 1
    n_lower = n * T * (T - 1) / 2
    mean = stats.total / n_lower
    ss_tot = stats.sq - stats.total * mean
    b = torch.cat([stats.lag, stats.row, stats.col], dim=-1)
    b = b - mean[..., None] * (n * basis.counts)  # Xᵀ(y − ȳ)
    exp_toep = (b[..., :m].pow(2) / (n * basis.counts[:m])).sum(-1)
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


def separable_r2(scores: Float[Tensor, "*batch query_pos key_pos"]) -> dict[str, Tensor]:
    """Per-matrix R² of the Toeplitz, separable and Toeplitz + separable fits on the
    strictly lower triangle: ``{"R2_toeplitz", "R2_separable", "R2_toeplitz_separable"}``,
    each ``Float[Tensor, "*batch"]``."""
    return separable_r2_from_stats(separable_stats(scores), scores.shape[-1])


# --------------------------------------------------------------------- reducer
@dataclass
class SeparableResult:
    """Per-sequence and pooled R² of the three fits, as numpy arrays.

    ``*_per_seq`` are [n_seqs, layer, head_index] over the sequences seen (in
    ``seq_index`` order); the pooled ones are [layer, head_index]."""

    seq_index: np.ndarray
    length: int
    R2_toeplitz: np.ndarray
    R2_separable: np.ndarray
    R2_toeplitz_separable: np.ndarray
    R2_toeplitz_per_seq: np.ndarray
    R2_separable_per_seq: np.ndarray
    R2_toeplitz_separable_per_seq: np.ndarray


class SeparableReducer:
    """Streaming reducer: per evaluation sequence and (layer, head), the float64 row,
    column and lag sums, sum of squares and grand sum of the strictly lower triangle of
    ``batch.scores`` (q·kᵀ times the logit scale, read from the layer batch). Reads only
    ``batch.layer``, ``batch.index`` and ``batch.scores``; never syncs with the host in
    :meth:`update`."""

    name = "separable"

    def __init__(self, n_seqs: int, n_layers: int, n_heads: int, length: int,
                 device: torch.device | str = "cpu"):
        T = length
        f64 = dict(dtype=torch.float64, device=device)
        self.T, self.n_layers, self.n_heads = T, n_layers, n_heads
        zeros = lambda *lag: torch.zeros(n_seqs, n_layers, n_heads, *lag, **f64)
        self.acc = SeparableStats(zeros(T - 1), zeros(T - 1), zeros(T - 1), zeros(), zeros())
        self.seen = torch.zeros(n_seqs, dtype=torch.bool, device=device)
        self._work: Tensor | None = None  # reusable [batch·head, 2T, T] buffer

    def update(self, batch) -> None:
        """Accumulate one layer's batch; ``batch.scores``:
        ``Float[Tensor, "batch head_index query_pos key_pos"]``."""
        A: Float[Tensor, "batch head_index query_pos key_pos"] = batch.scores
        b, h, T, _ = A.shape
        if T != self.T:
            raise ValueError(f"reducer built for T={self.T}, got scores of length {T}")
        shape = (b * h, 2 * T, T)
        if self._work is None or self._work.shape != shape or self._work.dtype != A.dtype:
            self._work = torch.zeros(shape, dtype=A.dtype, device=A.device)
        st = _lower_stats_into(A.reshape(b * h, T, T), self._work)
        idx, L = batch.index, batch.layer
        for kept, new in zip(vars(self.acc).values(), vars(st).values()):
            kept[idx, L] = new.reshape(b, h, *new.shape[1:])
        self.seen[idx] = True

    def stats(self) -> SeparableStats:
        """The per-sequence statistics of the sequences seen, [n, layer, head_index, ...]."""
        return self.acc[self.seen]

    def result(self) -> SeparableResult:
        st = self.stats()
        n = int(self.seen.sum())
        per_seq = separable_r2_from_stats(st, self.T)
        pooled = separable_r2_from_stats(st.sum(0), self.T, n=n)
        cpu = lambda t: t.detach().cpu().numpy()
        return SeparableResult(
            seq_index=cpu(torch.nonzero(self.seen).flatten()), length=self.T,
            **{k: cpu(v) for k, v in pooled.items()},
            **{f"{k}_per_seq": cpu(v) for k, v in per_seq.items()},
        )


# ----------------------------------------------------------------- table, figure
def separable_table(result: SeparableResult, model: str, dataset: str,
                    length: int) -> pd.DataFrame:
    """One row per (layer, head): the three R² pooled over the evaluation sequences,
    their per-sequence means, and the gains ``dR2_toeplitz_beyond_separable`` =
    R²(T+S) − R²(S) and ``dR2_separable_beyond_toeplitz`` = R²(T+S) − R²(T)."""
    L, H = result.R2_toeplitz.shape
    cols = {"model": model, "dataset": dataset, "length": length, **head_index_columns(L, H),
            "n_seqs": len(result.seq_index)}
    for name in FITS:
        cols[name] = getattr(result, name).ravel()
    for name in FITS:
        per_seq = getattr(result, f"{name}_per_seq")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN heads stay NaN
            cols[f"{name}_seq_mean"] = np.nanmean(per_seq, axis=0).ravel()
    cols["dR2_toeplitz_beyond_separable"] = (result.R2_toeplitz_separable
                                             - result.R2_separable).ravel()
    cols["dR2_separable_beyond_toeplitz"] = (result.R2_toeplitz_separable
                                             - result.R2_toeplitz).ravel()
    return pd.DataFrame(cols)


def plot_separable(table: pd.DataFrame, title: str = "") -> Figure:
    """Mean pooled R² per layer (over heads) of the Toeplitz, separable (row + column)
    and Toeplitz + separable fits. Returns a figure; the matplotlib backend is not
    touched."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    means = table.groupby("layer")[list(FITS)].mean()
    labels = {"R2_toeplitz": "Toeplitz g(t−s)", "R2_separable": "separable r(t) + c(s)",
              "R2_toeplitz_separable": "Toeplitz + separable"}
    styles = {"R2_toeplitz": "-o", "R2_separable": "-s", "R2_toeplitz_separable": "--^"}
    for name in FITS:
        ax.plot(means.index, means[name], styles[name], ms=4, label=labels[name])
    ax.set_xlabel("layer")
    ax.set_ylabel("mean R² over heads (pooled)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "shift-invariance vs the causal mask's row + column structure")
    fig.tight_layout()
    return fig


# ------------------------------------------------------- poskernel analyze separable


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """The three fits for every head, pooled over the evaluation tokens (one forward)."""
    model, eval_tokens = inputs.model, inputs.eval_tokens
    batch_size, progress = inputs.batch_size, inputs.progress
    spec, T = model.spec, eval_tokens.shape[1]
    (red,) = forward_pass(
        model, eval_tokens,
        lambda: [SeparableReducer(len(eval_tokens), spec.n_layers, spec.n_heads, T,
                                  model.device)],
        batch_size, "separable fits", progress, choose_scores_path(model, "auto"))
    table = separable_table(red.result(), spec.name, "", T)
    return table.drop(columns=["model", "dataset", "length"])


SPEC = AnalysisSpec(
    name="separable", title="Separable baseline", compute=analyze, figure=plot_separable,
    columns=("R2_toeplitz", "R2_separable", "R2_toeplitz_separable"),
    layer_means=(("R2_toeplitz", "R² Toeplitz"), ("R2_separable", "R² separable"),
                 ("R2_toeplitz_separable", "R² T + S")),
    head_rows=(("R2_toeplitz", "R² Toeplitz g(t − s)"),
               ("R2_separable", "R² separable r(t) + c(s)"),
               ("R2_toeplitz_separable", "R² Toeplitz + separable")),
    guide="Toeplitz g(t − s) against the row + column structure r(t) + c(s) that a causal "
          "mask alone can produce: R²(Toeplitz + separable) − R²(separable) is what shift "
          "invariance adds beyond the mask.")

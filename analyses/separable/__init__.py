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

A layer whose softmax keeps fewer entries — a sliding window's band, a chunked mask's
blocks — is fitted on those entries only (its :class:`~poskernel_tl.mask.Mask`, read
from the model: the same three models, each parameter fitted over the kept entries that
hold it, :mod:`poskernel_tl.analyses.separable.fit`).

The difference R²(Toeplitz + separable) − R²(separable) is what shift-invariance adds
beyond the causal mask's row/column structure; R²(Toeplitz + separable) − R²(Toeplitz)
is the reverse.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.analyses.separable.fit import (
    FITS,
    SeparableStats,
    gram,
    lower_stats_into,
    separable_r2,
    separable_r2_from_stats,
    separable_stats,
)
from poskernel_tl.mask import Mask, shared
from poskernel_tl.measurement.measure import choose_scores_path, forward_pass
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.schema import head_index_columns


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

    def __init__(self, n_seqs: int, masks: Sequence[Mask], n_heads: int,
                 device: torch.device | str = "cpu"):
        """``masks``: per layer, the entries its softmax keeps (the fits read only those)."""
        T, _ = shared(masks)
        self.masks, n_layers = list(masks), len(masks)
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
        st = lower_stats_into(A.reshape(b * h, T, T), self._work, self.masks[batch.layer])
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
        pooled, per_seq = {}, {}
        for mask in dict.fromkeys(self.masks):  # the layers of each mask together
            layers = [L for L, m in enumerate(self.masks) if m == mask]
            sel = slice(None) if len(layers) == self.n_layers else layers
            for out, x, k in ((per_seq, st[:, sel], 1), (pooled, st.sum(0)[sel], n)):
                for name, r2 in separable_r2_from_stats(x, self.T, k, mask).items():
                    out.setdefault(name, torch.full(x.sq.shape[:-2] + (self.n_layers,
                                                                     self.n_heads), torch.nan,
                                                    dtype=r2.dtype, device=r2.device))
                    out[name][..., layers, :] = r2
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
    geometry = Geometry.checked(spec, T)
    (red,) = forward_pass(
        model, eval_tokens,
        lambda: [SeparableReducer(len(eval_tokens), geometry.masks, spec.n_heads,
                                  model.device)],
        batch_size, "separable fits", progress, choose_scores_path(model, "auto"))
    table = separable_table(red.result(), spec.name, "", T)
    return table.drop(columns=["model", "dataset", "length"])


SPEC = AnalysisSpec(
    order=70,  # (where it is listed)
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

__all__ = ["FITS", "SPEC", "SeparableReducer", "SeparableResult", "SeparableStats", "analyze",
           "gram", "plot_separable", "separable_r2", "separable_r2_from_stats",
           "separable_stats", "separable_table"]

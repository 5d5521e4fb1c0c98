"""Nulls for the Toeplitz R², from theory and from the data itself.

The protocol's thresholds (0.40, 0.80) are uncalibrated; three reference distributions put
them on a scale:

1. **Analytic i.i.d. null.** If the N = n·T(T−1)/2 lower-triangle entries of n sequences
   are i.i.d. Gaussian, the fit by T−1 lag means is a one-way ANOVA, R² = SS_between /
   SS_total ~ Beta((k−1)/2, (N−k)/2) with k = T−1 groups, so E[R²] = (T−2)/(N−1)
   (per sequence n = 1, N = T(T−1)/2).
2. **Joint position-permutation null** (per head, measured during the run by
   :class:`~poskernel_tl.statistics.perm_null.PermNullReducer`; read as
   ``result.r2_perm_null`` [perm, layer, head_index] when present): the head's own
   logits with q and k positions permuted together.
3. **Empirical NoPE distribution** (when a model without positional encoding is in the
   folder): every NoPE head's pooled R², the anchor the protocol's calibration note asks for.
"""

import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy import stats

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.schema import head_index_columns
from poskernel_tl.statistics.perm_null import null_p_value, null_percentile

THRESHOLDS = (0.40, 0.80)


def n_entries(length: int, n_seqs: int = 1) -> int:
    """N: strictly-lower-triangle entries of ``n_seqs`` T×T matrices."""
    return n_seqs * length * (length - 1) // 2


def analytic_null_mean(length: int, n_seqs: int = 1) -> float:
    """E[R²] of the Toeplitz fit on i.i.d. entries: (T−2)/(N−1)."""
    return (length - 2) / (n_entries(length, n_seqs) - 1)


def analytic_null(length: int, n_seqs: int = 1):
    """The i.i.d. Gaussian null distribution of R² (a frozen ``scipy.stats.beta``)."""
    k, N = length - 1, n_entries(length, n_seqs)
    return stats.beta((k - 1) / 2, (N - k) / 2)


def perm_null_of(result: ConditionResult) -> Float[np.ndarray, "perm layer head_index"] | None:
    """The condition's joint permutation null, or None when it was not measured."""
    null = getattr(result, "r2_perm_null", None)
    if null is None:
        return None
    null = np.asarray(null, np.float64)
    return null if null.ndim == 3 and null.shape[1:] == result.r2_pooled.shape else None


def perm_observed(result: ConditionResult) -> Float[np.ndarray, "layer head_index"]:
    """The R² to compare with the permutation null: the unpermuted fit of the null's own
    sequences when the run kept it (``r2_perm_same_seqs``), else the pooled R²."""
    same = getattr(result, "r2_perm_same_seqs", None)
    if same is not None and np.shape(same) == result.r2_pooled.shape:
        return np.asarray(same, np.float64)
    return np.asarray(result.r2_pooled, np.float64)


def head_null_table(result: ConditionResult) -> pd.DataFrame | None:
    """One row per head: pooled R², its permutation null (mean, 95th percentile, max),
    the head's mid-rank percentile in it and the one-sided p-value; None without a null."""
    null = perm_null_of(result)
    if null is None:
        return None
    obs = perm_observed(result)
    L, H = obs.shape
    return pd.DataFrame({
        "model": result.model, "dataset": result.dataset, "length": result.length,
        **head_index_columns(L, H), "R2_pooled": result.r2_pooled.ravel(),
        "R2_compared": obs.ravel(), "null_mean": null.mean(0).ravel(),
        "null_q95": np.quantile(null, 0.95, axis=0).ravel(), "null_max": null.max(0).ravel(),
        "percentile": null_percentile(obs, null).ravel(),
        "p_value": null_p_value(obs, null).ravel()})


def nope_r2(results: list[ConditionResult], early_only: bool = False,
            dataset: str | None = None, length: int | None = None) -> np.ndarray:
    """Pooled R² of every head of every NoPE condition (optionally layers 0–1 only, one
    dataset or length); empty when no NoPE model is present."""
    vals = [r.r2_pooled[:2] if early_only else r.r2_pooled for r in results
            if r.spec.pe == "none" and (dataset is None or r.dataset == dataset)
            and (length is None or r.length == length)]
    out = np.concatenate([v.ravel() for v in vals]) if vals else np.zeros(0)
    return out[np.isfinite(out)]


def threshold_table(results: list[ConditionResult],
                    thresholds: tuple[float, ...] = THRESHOLDS) -> pd.DataFrame:
    """Where each threshold falls within each null, per condition: ``percentile`` is the
    share of the null below the threshold (100 = the threshold is above all of it).
    Nulls: analytic i.i.d. per sequence and pooled; the condition's permutation null over
    all its heads (if measured); the NoPE heads of the same dataset and length (if any)."""
    rows = []
    for r in results:
        n = len(r.seq_id)
        nulls: list[tuple[str, object]] = [
            ("i.i.d. analytic, one sequence", analytic_null(r.length, 1)),
            (f"i.i.d. analytic, pooled over {n} sequences", analytic_null(r.length, n))]
        perm = perm_null_of(r)
        if perm is not None:
            nulls.append(("joint permutation, all heads", perm.ravel()))
        nope = nope_r2(results, dataset=r.dataset, length=r.length)
        if nope.size and r.spec.pe != "none":
            nulls.append(("NoPE heads, same dataset and length", nope))
        for name, null in nulls:
            if isinstance(null, np.ndarray):
                mean, q95, top = float(null.mean()), float(np.quantile(null, 0.95)), \
                    float(null.max())
            else:
                mean, q95, top = float(null.mean()), float(null.ppf(0.95)), float("nan")
            for t in thresholds:
                pct = float(null_percentile(t, null.ravel())) if isinstance(null, np.ndarray) else \
                    float(100.0 * null.cdf(t))
                rows.append({"model": r.model, "dataset": r.dataset, "length": r.length,
                             "null": name, "threshold": t, "percentile": pct,
                             "null_mean": mean, "null_q95": q95, "null_max": top})
    return pd.DataFrame(rows, columns=["model", "dataset", "length", "null", "threshold",
                                       "percentile", "null_mean", "null_q95", "null_max"])


def head_null_summary(result: ConditionResult) -> dict:
    """How many heads exceed their own permutation null (above its max; p < 0.05 needs
    n_perm ≥ 20), with the largest null value seen; empty dict without a null."""
    table = head_null_table(result)
    if table is None:
        return {}
    return {"n_heads": len(table), "n_above_null_max": int((table.R2_compared >
                                                            table.null_max).sum()),
            "null_max_overall": float(table.null_max.max()),
            "null_mean_overall": float(table.null_mean.mean()),
            "median_percentile": float(table.percentile.median()),
            "n_perm": int(perm_null_of(result).shape[0])}


__all__ = ["THRESHOLDS", "analytic_null", "analytic_null_mean", "head_null_summary",
           "head_null_table", "n_entries", "nope_r2", "perm_null_of",
           "perm_observed", "threshold_table"]

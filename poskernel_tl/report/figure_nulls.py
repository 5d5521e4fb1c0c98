"""The nulls' figure of one condition: each head's R² against its permutation null and
the reference nulls (:func:`fig_nulls`)."""

import numpy as np
from matplotlib.figure import Figure

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import nulls
from poskernel_tl.report.figures import condition_label
from poskernel_tl.statistics.perm_null import null_percentile


def fig_nulls(r: ConditionResult, nope: np.ndarray | None = None) -> Figure:
    """(a) every head's Track A R² (sorted) against its joint position-permutation null
    (range over permutations, grey) on a log axis; (b) the distributions: this
    condition's heads, its permutation null, the NoPE heads (``nope``, if given), the
    analytic i.i.d. null mean, and the thresholds 0.40 and 0.80 with their percentile in
    each null."""
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax_a, ax_b = fig.subplots(1, 2)
    obs = nulls.perm_observed(r).ravel()
    null = nulls.perm_null_of(r)
    order = np.argsort(obs)
    x = np.arange(len(obs))
    iid = nulls.analytic_null_mean(r.length, len(r.seq_id))
    pools = [obs, [iid]] + ([null.ravel()] if null is not None else []) + \
        ([nope] if nope is not None and len(nope) else [])
    allv = np.concatenate([np.asarray(p, float).ravel() for p in pools])
    allv = allv[np.isfinite(allv) & (allv > 0)]
    floor = max(float(allv.min()) / 2 if allv.size else 1e-6, 1e-9)
    if null is not None:
        flat = null.reshape(len(null), -1)[:, order]
        ax_a.fill_between(x, np.maximum(flat.min(0), floor), np.maximum(flat.max(0), floor),
                          color="0.6", alpha=0.6, step="mid",
                          label=f"permutation null (min–max of {len(null)})")
    else:
        ax_a.text(0.02, 0.5, "joint permutation null not measured for this condition",
                  transform=ax_a.transAxes, fontsize=8, color="C3")
    ax_a.plot(x, np.maximum(obs[order], floor), ".", color="C0", ms=4,
              label="head R² (same sequences as the null)" if null is not None
              else "head pooled R²")
    ax_a.axhline(iid, color="C4", lw=1, label=f"i.i.d. analytic mean {iid:.1e}")
    styles = dict(zip(nulls.THRESHOLDS, ("--", ":")))
    for t in nulls.THRESHOLDS:
        ax_a.axhline(t, color="0.3", ls=styles.get(t, "--"), lw=0.9)
    ax_a.set(yscale="log", xlabel="heads, sorted by R²", ylabel="R²", ylim=(floor, 1.5),
             title="(a) each head against its permutation null")
    ax_a.legend(fontsize=7, loc="lower right")
    bins = np.logspace(np.log10(floor), np.log10(1.0), 50)
    ax_b.hist(np.maximum(obs, floor), bins=bins, alpha=0.6, color="C0", label="heads")
    if null is not None:
        ax_b.hist(np.maximum(null.ravel(), floor), bins=bins, alpha=0.5, color="0.5",
                  label="permutation null")
    if nope is not None and len(nope):
        ax_b.hist(np.maximum(nope, floor), bins=bins, alpha=0.5, color="C3",
                  label=f"NoPE heads ({len(nope)})")
    ax_b.axvline(iid, color="C4", lw=1, label="i.i.d. analytic mean")
    for t in nulls.THRESHOLDS:
        parts = [f"i.i.d. pct {100 * nulls.analytic_null(r.length, len(r.seq_id)).cdf(t):.0f}"]
        if null is not None:
            parts.append(f"perm pct {float(null_percentile(t, null.ravel())):.0f}")
        if nope is not None and len(nope):
            parts.append(f"NoPE pct {float(null_percentile(t, nope)):.0f}")
        ax_b.axvline(t, color="0.3", ls=styles.get(t, "--"), lw=0.9,
                     label=f"R² = {t:.2f}: " + ", ".join(parts))
    ax_b.set(xscale="log", xlabel="R²", ylabel="heads / draws",
             title="(b) distributions and where 0.40 / 0.80 fall")
    ax_b.legend(fontsize=7, loc="upper left")
    fig.suptitle(condition_label(r), fontsize=10)
    return fig


__all__ = ["fig_nulls"]

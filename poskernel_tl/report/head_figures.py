"""One function per head-page figure, each returning a ``matplotlib.figure.Figure``
(created directly, so the global pyplot backend is never touched)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from matplotlib.figure import Figure

from poskernel_tl.toeplitz import shift_invariance_r2


@dataclass(frozen=True)
class ToeplitzFit:
    """The shift-invariant fit of one logit matrix on its strictly lower triangle."""

    r2: float
    g: np.ndarray         # [lag] g(Δ) for Δ = 1..T−1
    fitted: np.ndarray    # [query_pos key_pos] g(t−s) for s < t, NaN elsewhere
    residual: np.ndarray  # [query_pos key_pos] A − g(t−s) for s < t, NaN elsewhere


def toeplitz_fit(logits: Float[np.ndarray, "query_pos key_pos"]) -> ToeplitzFit:
    """Fit g(Δ) to A[t, s], s < t, with :func:`poskernel_tl.shift_invariance_r2`.
    Entries on or above the diagonal are ignored (masked fills included)."""
    T = logits.shape[0]
    lower = np.tril(np.ones((T, T), dtype=bool), k=-1)
    clean = np.where(lower, logits.astype(np.float64), 0.0)
    r2, g = shift_invariance_r2(torch.from_numpy(clean))
    g = g.numpy()
    lag = np.subtract.outer(np.arange(T), np.arange(T))  # t − s
    fitted = np.full((T, T), np.nan)
    fitted[lower] = g[lag[lower] - 1]
    residual = np.where(lower, clean - np.nan_to_num(fitted), np.nan)
    return ToeplitzFit(float(r2), g, fitted, residual)


def _lower(values: np.ndarray) -> np.ndarray:
    T = values.shape[0]
    return np.where(np.tril(np.ones((T, T), dtype=bool), k=-1), values, np.nan)


def fig_logits_fit(
    logits: Float[np.ndarray, "query_pos key_pos"],
    fit: ToeplitzFit | None = None,
) -> Figure:
    """Three panels on the strictly lower triangle: the logits A(t, s), the Toeplitz
    fit g(t−s), and the residual A − g(t−s). A and the fit share one colour scale,
    clipped to the 0.5–99.5th percentile of A; the residual uses a symmetric scale."""
    fit = fit if fit is not None else toeplitz_fit(logits)
    A = _lower(logits.astype(np.float64))
    finite = A[np.isfinite(A)]
    lo, hi = np.percentile(finite, [0.5, 99.5]) if finite.size else (0.0, 1.0)
    res = fit.residual[np.isfinite(fit.residual)]
    r = float(np.percentile(np.abs(res), 99.5)) if res.size else 1.0
    r = r if r > 0 else 1.0
    fig = Figure(figsize=(13.5, 4.3))
    axes = fig.subplots(1, 3)
    panels = [
        (A, "logits A(t, s)", "viridis", lo, hi),
        (fit.fitted, f"Toeplitz fit g(t−s)   R² = {fit.r2:.3f}", "viridis", lo, hi),
        (fit.residual, "residual A − g(t−s)", "RdBu_r", -r, r),
    ]
    for ax, (values, title, cmap, vmin, vmax) in zip(axes, panels):
        im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                       aspect="equal")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key position s")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    axes[0].set_ylabel("query position t")
    fig.tight_layout()
    return fig


def fig_kernel(
    g_trackA: Float[np.ndarray, " lag"] | None,
    g_trackB: Float[np.ndarray, " lag"] | None = None,
) -> Figure:
    """g(Δ) against the lag Δ = t − s for Track A (raw logits) and Track B (centered
    Gram), on a linear and a logarithmic lag axis."""
    fig = Figure(figsize=(11, 3.6))
    axes = fig.subplots(1, 2)
    curves = [(g, label, color) for g, label, color in (
        (g_trackA, "Track A (raw logits)", "C0"),
        (g_trackB, "Track B (centered Gram)", "C3")) if g is not None]
    for ax, xscale in zip(axes, ("linear", "log")):
        for g, label, color in curves:
            ax.plot(np.arange(1, len(g) + 1), g, color=color, lw=1.2, label=label)
        ax.set_xscale(xscale)
        ax.set_xlabel("lag Δ = t − s" + (" (log scale)" if xscale == "log" else ""))
        ax.set_ylabel("g(Δ)")
        ax.grid(alpha=0.3)
    if curves:
        axes[0].legend(fontsize=8)
    else:
        axes[0].text(0.5, 0.5, "no kernel available", ha="center", transform=axes[0].transAxes)
    fig.tight_layout()
    return fig


def fig_spectrum(
    omega: Float[np.ndarray, " freq"],
    power: Float[np.ndarray, " freq"],
    thetas: Float[np.ndarray, " n_theta"] | None = None,
) -> Figure:
    """The power spectrum of g(Δ) against angular frequency ω (rad/token, log–log),
    with the positional-encoding frequencies θᵢ marked as dashed lines."""
    fig = Figure(figsize=(11, 3.6))
    ax = fig.subplots()
    keep = (omega > 0) & np.isfinite(power) & (power > 0)
    ax.plot(omega[keep], power[keep], color="C0", lw=1.2, label="power spectrum of g(Δ)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if thetas is not None and keep.any():
        lo, hi = omega[keep].min(), omega[keep].max()
        shown = [t for t in np.asarray(thetas, dtype=float) if lo <= t <= hi]
        for i, t in enumerate(shown):
            ax.axvline(t, color="C1", ls="--", lw=0.8, alpha=0.7,
                       label=f"θᵢ ({len(shown)} of {len(thetas)} in range)" if i == 0 else None)
    ax.set_xlabel("ω (rad / token)")
    ax.set_ylabel("power")
    ax.grid(alpha=0.3, which="both")
    if keep.any():
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no positive power to show", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def fig_r2_distribution(
    per_seq_r2: Float[np.ndarray, " n_seqs"],
    r2_values: Mapping[str, float] | None = None,
    marked: Sequence[str] = (),
) -> Figure:
    """Histogram of per-sequence R² (Track A), with a rug of the individual sequences
    and vertical lines for the named pooled values in ``r2_values`` (all, or ``marked``)."""
    fig = Figure(figsize=(7, 3.4))
    ax = fig.subplots()
    vals = per_seq_r2[np.isfinite(per_seq_r2)]
    if vals.size:
        ax.hist(vals, bins=min(30, max(5, vals.size // 2)), color="C0", alpha=0.75)
        ax.plot(vals, np.zeros_like(vals), "|", color="k", ms=12, alpha=0.5)
    names = list(marked) or list(r2_values or {})
    for i, name in enumerate(names):
        value = (r2_values or {}).get(name)
        if value is not None and np.isfinite(value):
            label = f"{name} = {value:.3f}".replace("$", r"\$")
            ax.axvline(value, color=f"C{(i + 1) % 10}", lw=1.5, label=label)
    ax.set_xlabel("per-sequence R²")
    ax.set_ylabel("sequences")
    ax.set_title(f"{vals.size} sequences" + (f", median {np.median(vals):.3f}"
                                             if vals.size else ""), fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

"""Fourier relative-position kernel (seed 001): cosine-series fits of g(Δ) and the seed's
kernelized attention with a Fourier relative kernel, in quadratic and linear form.

**(a) Cosine-series fit of a head's kernel.** g(Δ), Δ = 1..T−1 (``g[..., Δ−1]``, the
toolkit's lag convention), is fitted by

    g(Δ) ≈ offset + Σ_{k=1..K} c_k cos(a_k Δ + b_k),   a_k ∈ [π/T, π] rad/token, c_k ≥ 0,

by nonlinear least squares (``scipy.optimize.least_squares``; variable projection: for
fixed a_k the rest is linear and solved exactly). Initial frequencies are peaks of the
zero-padded (N_fft = 4T), demeaned spectrum: by default one at a time, the largest peak of
what the current fit leaves, refitting all after each addition (a small cosine beside a
large one's sidelobes is still found). Neighbouring a_k are kept ≥ π/T apart, so R² can only
grow with K; a component on the floor π/T models a trend (e.g. a recency decay). Components
are reported largest amplitude first; R² = 1 − SS_res/SS_tot over the fitted lags. This
one-kernel fit (:func:`fit_cosine_series`, :class:`CosineFit`) lives in
:mod:`.fit`.

:func:`cosine_fit_table` fits every head of g [layer, head_index, lag] for several K and
returns two tidy tables (:class:`CosineFitTables`): ``fits``, one row per (layer, head, K),
and ``components``, one row per fitted cosine. Given the model's rotary frequencies θ_i
(rad/token), each a_k gets its nearest θ_i, the relative error and ``matched`` (relative
error < 10 % or closer than 2π/N_fft, the spectral analysis' criterion). Frequencies below
~4π/T (under two periods in the window) are not separable from the offset or each other.

**(b) Kernelized attention with a Fourier relative kernel (seed 001).** With kernel feature
maps Q̄, K̄ (already applied: these functions take the feature-mapped tensors as given),

    A_id = Σ_k Σ_j Q̄_ik K̄_jk ΔP_ijk V_jd,   ΔP_ijk = c_k cos(b_k + Σ_n a_kn (p_in − p_jn)),

summed over j ≤ i (causal, diagonal included) or over all j; there is no normaliser, as in
the seed. The quadratic form materialises ΔP [batch, head_index, query_pos, key_pos,
feature]. The linear form uses p̂_ik = b_k + Σ_n a_kn p_in (the query side carries b_k),
p̂_jk = Σ_n a_kn p_jn and cos(p̂_i − p̂_j) = cos p̂_i cos p̂_j + sin p̂_i sin p̂_j, so that

    A_id = Σ_k c_k Q̄_ik [cos p̂_ik Σ_j K̄_jk cos p̂_jk V_jd + sin p̂_ik Σ_j K̄_jk sin p̂_jk V_jd]

with the j-sums as prefix sums (causal) or full sums: time and memory linear in T. Shapes
(TransformerLens order, one set of a, b, c per head): Q̄, K̄ ``[batch pos head_index
feature]``, V ``[batch pos head_index d_head]``, a ``[head_index feature pos_dim]``, b, c
``[head_index feature]``, positions ``[pos]`` (scalar, pos_dim = 1), ``[pos pos_dim]`` or
``[batch pos pos_dim]``. Phases p̂ are formed in float64 in the linear form (they grow like
a·p); ΔP in the quadratic form is built in the inputs' dtype.
"""

import math
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.analyses.fourier_kernel.fit import (
    CosineFit,
    fit_cosine_series,
    prepare_lags,
    residual_path,
)
from poskernel_tl.analyses.spectral.null import TAU_REL, match_peaks
from poskernel_tl.analyses.spectral.processing import n_fft_for

DEFAULT_KS = (1, 2, 3, 5, 8)
THETA_FIT_COLS = ["n_matched", "frac_matched", "median_rel_error"]
THETA_COMP_COLS = ["nearest_theta", "theta_index", "rel_error", "matched"]


# ----------------------------------------------------------------------------- (a) fit


class CosineFitTables(NamedTuple):
    """``fits``: one row per (layer, head, K) with ``R2_fit``; ``components``: one row per
    (layer, head, K, component) with the fitted a_k (``freq``) and, given θ, the nearest θ_i."""

    fits: pd.DataFrame
    components: pd.DataFrame


def cosine_fit_table(
    g: Float[np.ndarray, "layer head_index lag"],
    Ks: tuple[int, ...] = DEFAULT_KS,
    thetas: Float[np.ndarray, " theta"] | None = None,
    *,
    init: Literal["residual", "peaks"] = "residual",
    max_lag: int | None = None,
    tau_rel: float = TAU_REL,
    min_freq: float | None = None,
    max_nfev: int = 100,
) -> CosineFitTables:
    """Cosine-series fits of every head's g(Δ) for each K in ``Ks``.

    ``fits`` columns: layer, head, K, R2_fit, offset, n_lags, success, nfev and, with
    ``thetas`` (rad/token), n_matched, frac_matched, median_rel_error. ``components``
    columns: layer, head, K, component (1 = largest amplitude), freq (a_k), amplitude (c_k),
    phase (b_k ∈ (−π, π]), amplitude_share (c_k / Σ c), period (2π/a_k), at_min_freq (a_k on
    the lower bound: a trend the window cannot resolve as a cosine) and, with ``thetas``,
    nearest_theta, theta_index, rel_error, matched (the spectral analysis' criterion, τ_rel =
    ``tau_rel``). When K exceeds the number of cosines g really holds, the extra components
    have tiny ``amplitude_share`` and arbitrary frequencies: filter on it before reading a_k.
    Heads whose g is not finite get NaN rows."""
    g = np.asarray(g, np.float64)
    Ks = tuple(sorted({int(k) for k in Ks}))
    thetas = None if thetas is None else np.asarray(thetas, np.float64)
    n_fft = n_fft_for(g.shape[-1] + 1)  # the spectral analysis' N_fft
    fit_rows, comp_rows = [], []
    for layer in range(g.shape[0]):
        for head in range(g.shape[1]):
            gh, lags, n_fit = prepare_lags(g[layer, head], max_lag)
            floor = math.pi / n_fit if min_freq is None else min_freq
            if init == "residual" and np.isfinite(gh[:n_fit]).all():
                head_fits = residual_path(gh, lags, n_fit, Ks, max_nfev, min_freq)
            else:
                head_fits = {k: fit_cosine_series(gh, K=k, init=init, max_lag=max_lag,
                                                  min_freq=min_freq, max_nfev=max_nfev)
                             for k in Ks}
            for k, fit in head_fits.items():
                key = {"layer": layer, "head": head, "K": k}
                match = None
                if thetas is not None and len(thetas) and k and np.isfinite(fit.freqs).all():
                    match = match_peaks(fit.freqs, thetas, n_fft, tau_rel)
                fit_rows.append(_fit_row(key, fit, n_fit, match))
                comp_rows.extend(_component_rows(key, fit, floor, match))
    fits, comps = pd.DataFrame(fit_rows), pd.DataFrame(comp_rows)
    if thetas is not None:  # the θ columns exist even when no head could be matched
        fits = fits.reindex(columns=[*fits.columns.drop(THETA_FIT_COLS, errors="ignore"),
                                     *THETA_FIT_COLS])
        comps = comps.reindex(columns=[*comps.columns.drop(THETA_COMP_COLS, errors="ignore"),
                                       *THETA_COMP_COLS])
    return CosineFitTables(fits, comps)


def _fit_row(key: dict, fit: CosineFit, n_fit: int, match: dict | None) -> dict:
    """The ``fits`` row of one (layer, head, K) fit; the θ columns with a ``match``."""
    row = {**key, "R2_fit": fit.r2, "offset": fit.offset, "n_lags": n_fit,
           "success": fit.success, "nfev": fit.nfev}
    if match is not None:
        row.update(n_matched=int(match["matched"].sum()),
                   frac_matched=float(match["matched"].mean()),
                   median_rel_error=float(np.median(match["rel_error"])))
    return row


def _component_rows(key: dict, fit: CosineFit, floor: float, match: dict | None
                    ) -> list[dict]:
    """The ``components`` rows of one (layer, head, K) fit, largest amplitude first;
    ``floor``: the lowest frequency allowed (components on it are flagged)."""
    k = key["K"]
    total = float(np.sum(fit.amplitudes)) if k else 0.0
    rows = []
    for c in range(k):
        a = fit.freqs[c]
        comp = {**key, "component": c + 1,
                "freq": a, "amplitude": fit.amplitudes[c], "phase": fit.phases[c],
                "amplitude_share": fit.amplitudes[c] / total if total > 0 else np.nan,
                "period": 2 * math.pi / a if a > 0 else np.inf,
                "at_min_freq": bool(a <= floor * (1 + 1e-3))}
        if match is not None:
            comp.update(nearest_theta=match["nearest_theta"][c],
                        theta_index=int(match["theta_index"][c]),
                        rel_error=match["rel_error"][c],
                        matched=bool(match["matched"][c]))
        rows.append(comp)
    return rows


def plot_cosine_fit(
    tables: CosineFitTables | tuple[pd.DataFrame, pd.DataFrame],
    *,
    thetas: Float[np.ndarray, " theta"] | None = None,
    K: int | None = None,
    highlight: tuple[int, int] | None = None,
    title: str | None = None,
):
    """Left: R² of the fit against K (one thin line per head, the median in black, the
    ``highlight`` (layer, head) in red). Right: the fitted a_k at ``K`` (default: the
    largest) per head on a log frequency axis, marker area ∝ c_k / max c_k, beside the θ_i
    (grey lines). Returns a ``matplotlib.figure.Figure`` (the backend is left alone)."""
    from matplotlib.figure import Figure

    fits, comps = tables  # a CosineFitTables or a (fits, components) pair
    fig = Figure(figsize=(10, 4))
    ax_r2, ax_f = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    wide = fits.pivot_table(index=["layer", "head"], columns="K", values="R2_fit",
                            dropna=False)
    ks = wide.columns.to_numpy()
    if len(wide) <= 400:
        for row in wide.to_numpy():
            ax_r2.plot(ks, row, color="0.75", lw=0.6)
    ax_r2.plot(ks, np.nanmedian(wide.to_numpy(), axis=0), "k-o", ms=3, lw=1.5,
               label=f"median over {len(wide)} heads")
    if highlight is not None and tuple(highlight) in wide.index:
        ax_r2.plot(ks, wide.loc[tuple(highlight)].to_numpy(), "r-o", ms=3,
                   label=f"L{highlight[0]}H{highlight[1]}")
    ax_r2.set(xlabel="K (cosines)", ylabel="R² of the fit", xticks=ks, ylim=(None, 1.02),
              title="cosine-series fit of g(Δ)")
    ax_r2.legend(fontsize=7, loc="lower right")

    K = int(max(ks)) if K is None else K
    sel = comps[(comps["K"] == K) & (comps["freq"] > 0)].copy()
    heads = list(wide.index)
    row_of = {h: i for i, h in enumerate(heads)}
    sel["row"] = [row_of[(la, he)] for la, he in zip(sel["layer"], sel["head"])]
    top = sel.groupby("row")["amplitude"].transform("max").replace(0, np.nan)
    colors = np.where(sel["matched"] == True, "C0", "C1") if "matched" in sel else "C0"  # noqa: E712
    ax_f.scatter(sel["freq"], sel["row"], s=8 + 40 * (sel["amplitude"] / top).fillna(0),
                 c=colors, alpha=0.8, lw=0)
    for theta in [] if thetas is None else np.asarray(thetas):
        ax_f.axvline(theta, color="0.85", lw=0.6, zorder=0)
    if len(sel):  # θ_i far below what the window resolves would only squeeze the axis
        ax_f.set_xlim(0.7 * sel["freq"].min(), 1.3 * math.pi)
    matched_note = " (blue: matched θ_i)" if "matched" in sel else ""
    ax_f.set(xscale="log", xlabel="a_k (rad/token); grey: θ_i", ylabel="head",
             title=f"fitted frequencies, K={K}{matched_note}")
    if len(heads) <= 40:
        ax_f.set_yticks(range(len(heads)), [f"L{la}H{he}" for la, he in heads], fontsize=6)
    ax_f.invert_yaxis()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- (b) attention

# scalar positions [pos] (pos_dim = 1), shared [pos pos_dim] or per sequence
Positions = (Float[Tensor, " pos"] | Float[Tensor, "pos pos_dim"]
             | Float[Tensor, "batch pos pos_dim"])


def _positions(positions: Tensor, batch: int) -> Float[Tensor, "batch pos pos_dim"]:
    p = positions[:, None] if positions.ndim == 1 else positions
    p = p[None] if p.ndim == 2 else p
    if p.ndim != 3 or p.shape[0] not in (1, batch):
        raise ValueError(f"positions must be [pos], [pos pos_dim] or [batch pos pos_dim]; "
                         f"got {tuple(positions.shape)}")
    return p.expand(batch, -1, -1)


def _check(q, k, v, a, b, c, p):
    if q.shape != k.shape or q.shape[:3] != v.shape[:3]:
        raise ValueError(f"q̄ {tuple(q.shape)}, k̄ {tuple(k.shape)}, v {tuple(v.shape)} "
                         "must share [batch pos head_index]; q̄ and k̄ [.. feature]")
    if a.shape != (q.shape[2], q.shape[3], p.shape[-1]) or b.shape != a.shape[:2] \
            or c.shape != a.shape[:2]:
        raise ValueError(f"a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)} must be "
                         f"[head_index feature pos_dim] = {(q.shape[2], q.shape[3], p.shape[-1])}"
                         " and [head_index feature]")


def fourier_delta_p(
    a: Float[Tensor, "head_index feature pos_dim"],
    b: Float[Tensor, "head_index feature"],
    c: Float[Tensor, "head_index feature"],
    positions: Positions,
) -> Float[Tensor, "batch head_index query_pos key_pos feature"]:
    """ΔP_ijk = c_k cos(b_k + Σ_n a_kn (p_in − p_jn)), materialised (batch = 1 for shared
    positions)."""
    p = _positions(positions, positions.shape[0] if positions.ndim == 3 else 1).to(a.dtype)
    dp = p[:, :, None, :] - p[:, None, :, :]                       # [batch, i, j, pos_dim]
    phase = torch.einsum("bijn,hkn->bhijk", dp, a).add_(b[None, :, None, None, :])
    return phase.cos_().mul_(c[None, :, None, None, :])


def fourier_kernel_scores(
    q_feat: Float[Tensor, "batch pos head_index feature"],
    k_feat: Float[Tensor, "batch pos head_index feature"],
    a: Float[Tensor, "head_index feature pos_dim"],
    b: Float[Tensor, "head_index feature"],
    c: Float[Tensor, "head_index feature"],
    positions: Positions,
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """Scores S_ij = Σ_k Q̄_ik K̄_jk ΔP_ijk (unmasked). With constant features and scalar
    positions t, S depends on t_i − t_j only: a cosine series in Δ, what (a) fits."""
    dP = fourier_delta_p(a, b, c, positions)
    return torch.einsum("bihk,bjhk,bhijk->bhij", q_feat, k_feat, dP)


def fourier_kernel_attention_quadratic(
    q_feat: Float[Tensor, "batch pos head_index feature"],
    k_feat: Float[Tensor, "batch pos head_index feature"],
    v: Float[Tensor, "batch pos head_index d_head"],
    a: Float[Tensor, "head_index feature pos_dim"],
    b: Float[Tensor, "head_index feature"],
    c: Float[Tensor, "head_index feature"],
    positions: Positions,
    causal: bool = True,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """A_id = Σ_k Σ_j Q̄_ik K̄_jk ΔP_ijk V_jd with ΔP materialised: O(T²·K) memory and time.
    ``causal``: j ≤ i (diagonal included); otherwise all j."""
    p = _positions(positions, q_feat.shape[0])
    _check(q_feat, k_feat, v, a, b, c, p)
    scores = fourier_kernel_scores(q_feat, k_feat, a, b, c, positions)
    if causal:
        scores = scores.tril()
    return torch.einsum("bhij,bjhd->bihd", scores, v)


def fourier_kernel_attention_linear(
    q_feat: Float[Tensor, "batch pos head_index feature"],
    k_feat: Float[Tensor, "batch pos head_index feature"],
    v: Float[Tensor, "batch pos head_index d_head"],
    a: Float[Tensor, "head_index feature pos_dim"],
    b: Float[Tensor, "head_index feature"],
    c: Float[Tensor, "head_index feature"],
    positions: Positions,
    causal: bool = True,
    chunk_size: int | None = None,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """The same A_id via cos(p̂_i − p̂_j) = cos p̂_i cos p̂_j + sin p̂_i sin p̂_j: no T×T
    tensor. Causal: prefix sums over j ≤ i of K̄_jk [cos|sin] p̂_jk V_jd, an intermediate
    of [batch, pos, head_index, 2·feature, d_head] (or [batch, chunk_size, …] with a running
    state when ``chunk_size`` is set); non-causal: full sums, [batch, head_index, 2·feature,
    d_head]."""
    p = _positions(positions, q_feat.shape[0])
    _check(q_feat, k_feat, v, a, b, c, p)
    p_hat_j = torch.einsum("bjn,hkn->bjhk", p.double(), a.double())       # Σ_n a_kn p_jn
    p_hat_i = p_hat_j + b.double()                                       # + b_k (query side)
    dtype = q_feat.dtype
    phi_q = torch.cat([p_hat_i.cos().to(dtype), p_hat_i.sin().to(dtype)], -1)
    phi_q = phi_q * (c.repeat(1, 2) * q_feat.repeat(1, 1, 1, 2))
    phi_k = torch.cat([p_hat_j.cos().to(dtype), p_hat_j.sin().to(dtype)], -1)
    phi_k = phi_k * k_feat.repeat(1, 1, 1, 2)
    del p_hat_i, p_hat_j
    if not causal:
        state = torch.einsum("bjhk,bjhd->bhkd", phi_k, v)
        return torch.einsum("bihk,bhkd->bihd", phi_q, state)
    T = q_feat.shape[1]
    step = T if chunk_size is None else max(1, int(chunk_size))
    out, carry = [], None
    for start in range(0, T, step):
        sl = slice(start, start + step)
        kv = torch.einsum("bjhk,bjhd->bjhkd", phi_k[:, sl], v[:, sl]).cumsum_(1)
        if carry is not None:
            kv += carry[:, None]
        out.append(torch.einsum("bihk,bihkd->bihd", phi_q[:, sl], kv))
        carry = kv[:, -1]
    return torch.cat(out, 1)


# -------------------------------------------------- poskernel analyze fourier-kernel


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """Cosine-series fits of every head's pooled Track A g(Δ) for K = 1, 2, 3, 5, 8, with
    the fitted frequencies matched to the model's θ_i (one row per layer, head, K)."""
    result = inputs.result
    return cosine_fit_table(result.g_pooled, thetas=result.thetas).fits


SPEC = AnalysisSpec(
    order=30,  # (where it is listed)
    name="fourier-kernel", title="Cosine-series kernel fit", compute=analyze,
    needs_model=False, needs_result=True, columns=("K", "R2_fit"),
    guide="Each head's pooled Track A g(Δ) fitted by K = 1, 2, 3, 5, 8 cosines with free "
          "frequencies; the fitted frequencies are matched to the model's θᵢ.")

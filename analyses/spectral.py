"""Spectral analysis of g(Δ) against the positional-encoding frequencies (seed 004, Step 2).

The science is in array functions that read no files: :func:`spectral_alignment` (one head),
:func:`pe_spectrum_correlations` (GPT-2) and :func:`spectral_table` (one condition);
:func:`run_spectral` only loads and writes. Matching and the null: :mod:`.spectral_null`.

**What is removed before the FFT, and why.** g(Δ), Δ = 1..T−1, is zero-padded to N_fft = 4T,
ĝ(ω_m) = FFT[m], ω_m = 2πm/N_fft, as the seed writes. Taken literally, that spectrum is
mostly not about periodicity: a constant g has a Dirichlet spectrum whose side lobes, about
one bin (2π/T) apart, pass as peaks, and any decay puts its power at low ω, where the rotary
frequencies are dense. By default therefore:

1. the weighted least-squares quadratic in Δ (weights = the taper) is subtracted: offset and
   slow drifts go (a constant g leaves nothing, and then no peaks);
2. the residual is tapered by a one-sided Hann window, w(Δ) = sin²(πΔ/T), so the edges at
   Δ = 1 and T−1 do not ring: side lobes start at −31 dB and fall as ω⁻³; the main lobe is
   ±2 bins wide;
3. peaks are local maxima of |ĝ| at least 2π/T apart (the seed's separation), with a
   prominence ≥ 5% of the largest |ĝ| above ω_min = 4·(2π/T), and above ω_min only: below it
   what a quadratic leaves of a smooth decay (peaking at up to ≈ 3.5 bins after the taper)
   cannot be told from an oscillation. Positions are refined by parabolic interpolation of
   ln|ĝ| over the three grid points around each maximum;
4. a peak is *significant* if its power exceeds 10× the running median power over ±8 bins
   (its local background; a white-noise bin passes with probability 2⁻¹⁰) and its magnitude
   5× the most that the window's side lobes of the rest of the spectrum can put there (so
   the side lobes of a strong low-frequency hump are no evidence). Smooth kernels (flat,
   exponential, power-law, Gaussian, sigmoid, step) leave none (checked for T = 128–4096).
   Only significant peaks enter the alignment statistic.

``raw_spectrum=True`` keeps the seed's literal procedure for comparison: mean kept (unless
``demean``), no taper, ``find_peaks(distance = 4 bins)`` on the grid, no interpolation; a flat
kernel then meets the seed's "≥ 50% of top-5 peaks matched".

**Reference spectrum.** Per head, Σ_i w_i cos(θ_i Δ) with w_i the head's frequency usage
(mean |q| × mean |k| of rotary pair i; equal weights without it), processed like g.
``ref_peak_r``: Pearson's r of ln power minus the ln of its local background (peak shape,
not spectral slope) above ω_min (2π/T raw). ``ref_log_r``: r of ln power above 2π/T (powers
floored at 10⁻⁶ of their maximum); it still follows the overall slope (a pure decay scores
≈ 0.8), so read ``ref_peak_r``. ``pearson_seed``: the seed's score (equal weights, linear
power, literal spectrum, all m), secondary.

**NoPE** (no θ): no matching; ``n_above_3x_median`` counts top peaks whose power exceeds 3×
the median power (the seed's check); ``top_peak_to_median`` is the largest ratio.

**Gate.** The caller passes ``gate_met`` (the seed's gate is over the early-layer heads of the
rotary models of a grid; :func:`gate_value` gives one condition's value). Heads with pooled
R² > 0.40 are analysed when the gate is met or none applies; ``force`` analyses all, and the
rows no met gate licenses are labelled ``ungated``.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy.signal import find_peaks

from poskernel_tl import constants as C
from poskernel_tl.analyses.spectral_null import (
    ALPHA,
    N_NULL,
    PAD_FACTOR,
    PRECISION_BINS,
    TAU_REL,
    local_background,
    log_distance,
    match_peaks,
    peak_significance,
    rotation_null,
)
from poskernel_tl.io import save_csv

N_PEAKS = 5
DETREND_DEGREE = 2
OMEGA_MIN_BINS = 4.0
PROMINENCE_REL = 0.05
LOG_POWER_FLOOR = 1e-6
NOISE_FACTOR = 3.0
GATE_THRESHOLD = 0.60
HEAD_THRESHOLD = 0.40
EARLY_LAYERS = (0, 1)


def n_fft_for(length: int) -> int:
    return PAD_FACTOR * length


def frequency_grid(length: int) -> Float[np.ndarray, " freq"]:
    """ω_m = 2πm/N_fft for m = 0..N_fft/2 (radians per token)."""
    n_fft = n_fft_for(length)
    return 2 * np.pi * np.arange(n_fft // 2 + 1) / n_fft


def lag_window(length: int) -> Float[np.ndarray, " lag"]:
    """One-sided Hann taper over the lags: w(Δ) = sin²(πΔ/T), Δ = 1..T−1."""
    return np.sin(np.pi * np.arange(1, length) / length) ** 2


def prepare(
    g: Float[np.ndarray, "*batch lag"], length: int, *, raw_spectrum: bool = False,
    demean: bool = False, detrend_degree: int = DETREND_DEGREE,
) -> Float[np.ndarray, "*batch lag"]:
    """What is Fourier-transformed: w·(g − weighted LS polynomial trend) by default; g as
    given (minus its mean with ``demean``) with ``raw_spectrum``."""
    g = np.asarray(g, dtype=np.float64)
    if g.shape[-1] != length - 1:
        raise ValueError(f"g has {g.shape[-1]} lags; expected T−1 = {length - 1}")
    if raw_spectrum:
        return g - g.mean(-1, keepdims=True) if demean else g
    w = lag_window(length)
    x = (np.arange(1, length) - length / 2) / (length / 2)
    basis = np.vander(x, detrend_degree + 1) * np.sqrt(w)[:, None]
    coef = (g * np.sqrt(w)) @ np.linalg.pinv(basis).T
    resid = g - coef @ np.vander(x, detrend_degree + 1).T
    tiny = np.linalg.norm(resid, axis=-1, keepdims=True) <= 1e-9 * np.linalg.norm(
        g, axis=-1, keepdims=True)
    return np.where(tiny, 0.0, resid) * w


def spectrum(
    g: Float[np.ndarray, "*batch lag"], length: int, *, raw_spectrum: bool = False,
    demean: bool = False, detrend_degree: int = DETREND_DEGREE,
) -> Float[np.ndarray, "*batch freq"]:
    """|ĝ(ω_m)| of :func:`prepare`'s output, zero-padded to N_fft = 4T, on
    :func:`frequency_grid` (g(1) sits at index 0; |ĝ| does not depend on that offset)."""
    h = prepare(g, length, raw_spectrum=raw_spectrum, demean=demean,
                detrend_degree=detrend_degree)
    return np.abs(np.fft.rfft(h, n=n_fft_for(length), axis=-1))


def pick_peaks(
    mag: Float[np.ndarray, " freq"], length: int, *, n_peaks: int = N_PEAKS,
    raw_spectrum: bool = False, omega_min: float | None = None,
) -> tuple[np.ndarray, Float[np.ndarray, " peak"], Float[np.ndarray, " peak"]]:
    """(grid index, ω, |ĝ| at ω) of the ``n_peaks`` largest peaks, largest first; ω and |ĝ|
    interpolated (default) or on the grid (``raw_spectrum``). See the module docstring."""
    mag = np.asarray(mag, np.float64)
    n_fft = n_fft_for(length)
    omega = frequency_grid(length)
    empty = (np.zeros(0, int), np.zeros(0), np.zeros(0))
    if raw_spectrum:
        idx, _ = find_peaks(mag, distance=n_fft // length)
        idx = idx[np.argsort(-mag[idx], kind="stable")[:n_peaks]]
        return idx, omega[idx], mag[idx]
    lo = OMEGA_MIN_BINS * 2 * np.pi / length if omega_min is None else omega_min
    above = omega >= lo
    if not above.any() or mag[above].max() <= 0:
        return empty
    floor = PROMINENCE_REL * mag[above].max()  # a peak's prominence never exceeds its height
    idx, _ = find_peaks(mag, height=floor, distance=n_fft // length, prominence=floor)
    idx = idx[omega[idx] >= lo]
    idx = idx[np.argsort(-mag[idx], kind="stable")[:n_peaks]]
    if len(idx) == 0:
        return empty
    a, b, c = (np.log(np.maximum(mag[idx + k], 1e-300)) for k in (-1, 0, 1))
    curv = a - 2 * b + c
    off = np.where(curv < 0, 0.5 * (a - c) / np.where(curv < 0, curv, -1.0), 0.0)
    off = np.clip(off, -0.5, 0.5)
    return idx, 2 * np.pi * (idx + off) / n_fft, np.exp(b - 0.25 * (a - c) * off)


def reference_kernel(
    thetas: Float[np.ndarray, " pair"], length: int,
    usage: Float[np.ndarray, " pair"] | None = None,
) -> Float[np.ndarray, " lag"]:
    """Σ_i w_i cos(θ_i Δ) for Δ = 1..T−1; w = ``usage`` (equal weights when None)."""
    thetas = np.asarray(thetas, np.float64)
    w = np.ones(len(thetas)) if usage is None else np.asarray(usage, np.float64)
    return np.cos(np.outer(np.arange(1, length, dtype=np.float64), thetas)) @ w


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def log_power(power: Float[np.ndarray, " freq"], length: int, *, relative: bool = False
              ) -> Float[np.ndarray, " freq"]:
    """ln power floored at 10⁻⁶ of its maximum; ``relative`` subtracts the ln of the
    :func:`local_background` (what is left is peak shape, not spectral slope)."""
    power = np.asarray(power, np.float64)
    floor = LOG_POWER_FLOOR * max(float(power.max()), 1e-300)
    out = np.log(power + floor)
    return out - np.log(local_background(power, length) + floor) if relative else out


def log_power_r(p: np.ndarray, q: np.ndarray, length: int, keep: np.ndarray, *,
                relative: bool = False) -> float:
    """Pearson's r of :func:`log_power` of two power spectra over the grid points ``keep``."""
    if np.asarray(p).max() <= 0 or np.asarray(q).max() <= 0:
        return float("nan")
    return pearson(log_power(p, length, relative=relative)[keep],
                   log_power(q, length, relative=relative)[keep])


def spectral_alignment(
    g: Float[np.ndarray, " lag"], thetas: Float[np.ndarray, " pair"] | None, *,
    length: int | None = None, usage: Float[np.ndarray, " pair"] | None = None,
    raw_spectrum: bool = False, demean: bool = False, n_peaks: int = N_PEAKS,
    tau_rel: float = TAU_REL, n_null: int = N_NULL, seed: int = 0, alpha: float = ALPHA,
    precision_bins: float = PRECISION_BINS, references: bool = True,
    keep_spectrum: bool = True,
) -> dict:
    """Spectral analysis of one head's g(Δ) (lag Δ = 1..T−1, so T = len(g) + 1 by default)
    against rotary frequencies ``thetas`` (radians/token; None or empty for models without
    rotary PE). ``usage`` weights the reference kernel, one value per θ_i, same order.

    Keys: ``peaks`` (ω of the top peaks, largest first), ``peak_magnitude``,
    ``significant``, ``n_peaks_found``, ``n_significant``; per peak ``matched``,
    ``nearest_theta``, ``theta_index``, ``rel_error``, ``marginal`` (the seed's criterion) and
    ``log_dist``; ``n_matched``, ``frac_matched`` (out of ``n_peaks``), ``seed_criterion_met``
    (frac_matched ≥ 0.5), ``chance``, ``p_value``, ``statistic``, ``log_dist_gmean``,
    ``null_spacing``, ``aligned``; ``ref_peak_r``, ``ref_log_r``, ``pearson_seed``;
    ``n_above_3x_median``,
    ``top_peak_to_median``; settings; and ``omega``/``spectrum`` (the processed |ĝ|).
    ``references=False`` skips the reference scores (NaN), ``keep_spectrum=False`` the arrays.
    """
    g = np.asarray(g, np.float64)
    length = len(g) + 1 if length is None else int(length)
    if not np.isfinite(g).all():
        raise ValueError("g contains non-finite values")
    th = np.zeros(0) if thetas is None else np.asarray(thetas, np.float64).ravel()
    ok_theta = np.isfinite(th) & (th > 0)
    th, use = th[ok_theta], None if usage is None else np.asarray(usage, np.float64)[ok_theta]
    n_fft, omega_grid = n_fft_for(length), frequency_grid(length)
    mag = spectrum(g, length, raw_spectrum=raw_spectrum, demean=demean)
    power = mag ** 2
    idx, peaks, peak_mag = pick_peaks(mag, length, n_peaks=n_peaks, raw_spectrum=raw_spectrum)
    k, nan = len(peaks), float("nan")
    significant = peak_significance(mag, idx, peaks, peak_mag, length, raw_spectrum)
    med = float(np.median(power))
    out = {
        "peaks": peaks, "peak_magnitude": peak_mag, "significant": significant,
        "n_peaks_found": k, "n_significant": int(significant.sum()),
        "n_above_3x_median": int(np.sum(peak_mag ** 2 > NOISE_FACTOR * med)),
        "top_peak_to_median": float(peak_mag[0] ** 2 / med) if k and med > 0 else nan,
        "raw_spectrum": raw_spectrum, "length": length, "n_fft": n_fft, "tau_rel": tau_rel,
        "n_null": n_null, "alpha": alpha, "n_peaks": n_peaks, "n_thetas": len(th),
    }
    rotary = len(th) > 0
    if rotary and k:
        m = match_peaks(peaks, th, n_fft, tau_rel)
        null = rotation_null(peaks, significant, th, length, n_fft, tau_rel=tau_rel,
                             n_null=n_null, seed=seed, precision_bins=precision_bins)
        out.update({key: m[key] for key in ("matched", "nearest_theta", "theta_index",
                                            "rel_error", "marginal")})
        out["log_dist"] = log_distance(peaks, th)
        out.update({key: null[key] for key in ("chance", "p_value", "statistic",
                                               "log_dist_gmean")})
        out["null_spacing"] = null["spacing"]
    else:
        out.update(matched=np.zeros(k, bool), nearest_theta=np.full(k, nan),
                   theta_index=np.full(k, -1), rel_error=np.full(k, nan),
                   marginal=np.zeros(k, bool), log_dist=np.full(k, nan), chance=nan,
                   p_value=nan, statistic=nan, log_dist_gmean=nan, null_spacing=nan)
    n_matched = int(np.sum(out["matched"]))
    out["n_matched"] = n_matched if rotary else nan
    out["frac_matched"] = n_matched / n_peaks if rotary else nan
    out["seed_criterion_met"] = bool(rotary and n_matched / n_peaks >= 0.5)
    p = out["p_value"]
    out["aligned"] = bool(rotary and out["n_significant"] > 0 and np.isfinite(p) and p < alpha)
    out["ref_peak_r"] = out["ref_log_r"] = out["pearson_seed"] = nan
    if rotary and references:
        ref = spectrum(reference_kernel(th, length, use), length, raw_spectrum=raw_spectrum,
                       demean=demean) ** 2
        lo = 2 * np.pi / length if raw_spectrum else OMEGA_MIN_BINS * 2 * np.pi / length
        out["ref_peak_r"] = log_power_r(power, ref, length, omega_grid >= lo, relative=True)
        out["ref_log_r"] = log_power_r(power, ref, length, omega_grid >= 2 * np.pi / length)
        seed_ref = spectrum(reference_kernel(th, length), length, raw_spectrum=True) ** 2
        out["pearson_seed"] = pearson(spectrum(g, length, raw_spectrum=True) ** 2, seed_ref)
    if keep_spectrum:
        out["omega"], out["spectrum"] = omega_grid, mag
    return out


def pe_spectrum_correlations(
    s_pe: Float[np.ndarray, " lag"], g_sources: dict[str, np.ndarray],
    length: int | None = None, *, raw_spectrum: bool = False,
) -> dict[str, float]:
    """Learned absolute PE (GPT-2), descriptive: Pearson's r between the power spectrum of the
    head-projected positional kernel S_PE(Δ) and that of each g source (e.g. ``trackA_pooled``,
    ``gram_raw``, ``gram_centered``; lag 1..T−1 each), processed like
    :func:`spectral_alignment` and compared on linear power above 2π/T (all m with
    ``raw_spectrum``, as the seed writes it). Returns ``{"r_pe_<source>": r}``.

    Centering per position (Track B) removes the shared ``wpe`` term of the logits, which is
    S_PE itself, so a low r for ``gram_centered`` beside a high r for the raw sources is the
    expected signature of a positional kernel carried by the PE table."""
    length = len(s_pe) + 1 if length is None else int(length)
    keep = frequency_grid(length) >= (0.0 if raw_spectrum else 2 * np.pi / length)
    ref = spectrum(s_pe, length, raw_spectrum=raw_spectrum)[keep] ** 2
    out = {}
    for name, g in g_sources.items():
        g = np.asarray(g, np.float64)
        ok = g.shape == np.shape(s_pe) and np.isfinite(g).all()
        out[f"r_pe_{name}"] = pearson(spectrum(g, length, raw_spectrum=raw_spectrum)[keep] ** 2,
                                      ref) if ok else float("nan")
    return out


def gate_value(r2: Float[np.ndarray, "layer head_index"],
               early_layers: tuple[int, ...] = EARLY_LAYERS) -> float:
    """Mean pooled R² over the heads of the early layers of one condition (NaN-aware)."""
    r2 = np.asarray(r2, np.float64)
    early = r2[[layer for layer in early_layers if layer < len(r2)]]
    return float(np.nanmean(early)) if np.isfinite(early).any() else float("nan")


HEAD_COLUMNS = [
    "model", "dataset", "length", "layer", "head", "pe", "source", "R2_pooled", "gate_met",
    "forced", "analysed", "status", "raw_spectrum", "n_peaks_found", "n_significant",
    "n_matched", "frac_matched", "seed_criterion_met", "chance", "p_value", "aligned",
    "statistic", "log_dist_gmean", "null_spacing", "ref_peak_r", "ref_log_r", "pearson_seed",
    "n_above_3x_median", "top_peak_to_median", "n_fft", "tau_rel", "n_null",
    "r_pe_trackA_pooled", "r_pe_gram_raw", "r_pe_gram_centered"]
PEAK_COLUMNS = ["model", "dataset", "length", "layer", "head", "rank", "omega", "magnitude",
                "significant", "nearest_theta", "theta_index", "rel_error", "log_dist",
                "matched", "marginal"]


def spectral_table(
    g: Float[np.ndarray, "layer head_index lag"], r2_pooled: Float[np.ndarray, "layer head_index"],
    thetas: Float[np.ndarray, " pair"] | None, length: int, *,
    usage: Float[np.ndarray, "layer head_index pair"] | None = None,
    gate_met: bool | None = None, force: bool = False, raw_spectrum: bool = False,
    demean: bool = False, s_pe: Float[np.ndarray, "layer head_index lag"] | None = None,
    g_sources: dict[str, np.ndarray] | None = None, model: str = "", dataset: str = "",
    pe: str = "", source: str = "", n_null: int = N_NULL, seed: int = 0,
    alpha: float = ALPHA, tau_rel: float = TAU_REL,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One condition: (heads table, one row per layer × head; peaks table, one row per peak).

    ``gate_met`` is the caller's gate (True/False; None = no gate applies). Heads are analysed
    when the gate is met or None and their pooled R² > 0.40; ``force`` analyses all. ``status``:
    ``gated`` (licensed by a met gate), ``ungated`` (analysed although no met gate licenses it:
    forced, or no gate given), ``skipped: gate not met``, ``skipped: R2 <= 0.40``, ``skipped:
    non-finite g``. With ``s_pe`` (learned absolute PE) each analysed head also gets
    :func:`pe_spectrum_correlations` against ``g_sources`` ([layer, head_index, lag] each).
    Every head is analysed on its own (per-head null, same seed)."""
    g = np.asarray(g, np.float64)
    r2 = np.asarray(r2_pooled, np.float64)
    n_layers, n_heads = g.shape[:2]
    heads, peak_rows = [], []
    for layer in range(n_layers):
        for head in range(n_heads):
            passes = bool(np.nan_to_num(r2[layer, head], nan=-np.inf) > HEAD_THRESHOLD)
            licensed = gate_met is True and passes
            if not np.isfinite(g[layer, head]).all():
                status = "skipped: non-finite g"
            elif licensed:
                status = "gated"
            elif force or (gate_met is None and passes):
                status = "ungated"
            else:
                status = "skipped: gate not met" if gate_met is False else "skipped: R2 <= 0.40"
            row = {"model": model, "dataset": dataset, "length": length, "layer": layer,
                   "head": head, "pe": pe, "source": source, "R2_pooled": r2[layer, head],
                   "gate_met": gate_met, "forced": force, "status": status,
                   "analysed": status in ("gated", "ungated"), "raw_spectrum": raw_spectrum}
            if row["analysed"]:
                res = spectral_alignment(
                    g[layer, head], thetas, length=length, raw_spectrum=raw_spectrum,
                    demean=demean, usage=None if usage is None else usage[layer, head],
                    n_null=n_null, seed=seed, alpha=alpha, tau_rel=tau_rel,
                    keep_spectrum=False)
                row.update({key: res[key] for key in HEAD_COLUMNS if key in res})
                if s_pe is not None:
                    row.update(pe_spectrum_correlations(
                        s_pe[layer, head], {k: np.asarray(v)[layer, head]
                                            for k, v in (g_sources or {}).items()},
                        length, raw_spectrum=raw_spectrum))
                for rank in range(res["n_peaks_found"]):
                    peak_rows.append({
                        "model": model, "dataset": dataset, "length": length, "layer": layer,
                        "head": head, "rank": rank + 1, "omega": res["peaks"][rank],
                        "magnitude": res["peak_magnitude"][rank],
                        **{key: res[key][rank] for key in
                           ("significant", "nearest_theta", "theta_index", "rel_error",
                            "log_dist", "matched", "marginal")}})
            heads.append(row)
    table = pd.DataFrame(heads).reindex(columns=HEAD_COLUMNS)
    for col in ("aligned", "seed_criterion_met"):
        table[col] = table[col].astype("boolean")
    table["aligned"] = table["aligned"].where(table["analysed"], pd.NA)
    return table, pd.DataFrame(peak_rows, columns=PEAK_COLUMNS)


# ---------------------------------------------------------------- file layer (one condition)
def condition_inputs(result) -> dict:
    """What the spectral stage reads from a :class:`~poskernel_tl.result.ConditionResult`:
    Track B's g (centered, or raw where uncentered) and its name, the GPT-2 g sources,
    pooled R², S_PE and the frequency usage |q|·|k| per rotary pair in θ order."""
    g, source = result.g_trackB
    sources = {"trackA_pooled": result.g_pooled, "gram_raw": result.g_gram_raw,
               "gram_centered": result.g_gram}
    usage = result.usage
    if usage is not None and (result.thetas is None or len(result.thetas) != usage.shape[-1]):
        usage = None
    return {"spec": result.spec, "g": np.asarray(g, np.float64), "source": source,
            "g_sources": sources, "r2": result.r2_pooled, "s_pe": result.s_pe,
            "usage": usage}


def grid_gate(results) -> bool | None:
    """The seed's gate over a grid: mean pooled Track A R² of the early-layer heads of
    all rotary models present > 0.60 (None without rotary models). GPT-2 and NoPE
    conditions follow this gate."""
    early = [r.r2_pooled[: len(EARLY_LAYERS)].ravel() for r in results if r.spec.pe == "rope"]
    if not early:
        return None
    return bool(np.nanmean(np.concatenate(early)) > GATE_THRESHOLD)


def run_spectral(result, out: Path | None = None, *, force: bool = False,
                 demean: bool = False, raw_spectrum: bool = False, gate_met: bool | None = None,
                 n_null: int = N_NULL, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Spectral analysis of one condition (a ConditionResult). Returns the per-head table,
    the per-peak table and a summary; with ``out`` also writes ``spectral.csv`` and
    ``spectral_peaks.csv`` there. ``gate_met``: the grid's gate (:func:`grid_gate`);
    default: this condition's own gate (rotary models only). ``demean`` only matters with
    ``raw_spectrum`` (the default processing removes the mean anyway)."""
    cond = condition_inputs(result)
    spec, g, r2, length = cond["spec"], cond["g"], cond["r2"], result.length
    model, dataset = result.model, result.dataset
    gate = gate_value(r2)
    if gate_met is None and spec.pe == "rope":
        gate_met = bool(gate > GATE_THRESHOLD)
    table, peaks = spectral_table(
        g, r2, spec.rotary_frequencies(), length, usage=cond["usage"], gate_met=gate_met,
        force=force, raw_spectrum=raw_spectrum, demean=demean, s_pe=cond["s_pe"],
        g_sources=cond["g_sources"] if cond["s_pe"] is not None else None, model=model,
        dataset=dataset, pe=spec.pe, source=cond["source"], n_null=n_null, seed=seed)
    table.insert(table.columns.get_loc("gate_met"), "gate_value", gate)
    if out is not None:
        save_csv(table, C.result_path(out, model, dataset, length, C.SPECTRAL_CSV))
        save_csv(peaks, C.result_path(out, model, dataset, length, C.SPECTRAL_PEAKS_CSV))
    done = table[table["analysed"]]
    early = done[done["layer"].isin(EARLY_LAYERS)]

    def mean(col: pd.Series) -> float:
        col = pd.to_numeric(col, errors="coerce").dropna()
        return float(col.mean()) if len(col) else float("nan")

    summary = {"model": model, "dataset": dataset, "length": length, "pe": spec.pe,
               "gate_value": gate, "gate_met": gate_met, "forced": force,
               "raw_spectrum": raw_spectrum, "n_analysed": len(done),
               "frac_aligned": mean(done["aligned"].astype(float)),
               "frac_aligned_early": mean(early["aligned"].astype(float)),
               "mean_frac_matched": mean(done["frac_matched"]),
               "mean_frac_matched_early": mean(early["frac_matched"]),
               "mean_chance": mean(done["chance"]), "mean_ref_peak_r": mean(done["ref_peak_r"])}
    return table, peaks, summary


def plot_head_spectrum(result, layer: int, head: int, raw_spectrum: bool = False):
    """|ĝ|² of one head (as analysed) over the reference power spectrum (usage-weighted rotary
    kernel or GPT-2's S_PE, each scaled to maximum 1), top peaks (filled: significant) and θ_i.
    Returns the matplotlib Figure."""
    from matplotlib.figure import Figure

    cond = condition_inputs(result)
    model, dataset, length = result.model, result.dataset, result.length
    thetas = cond["spec"].rotary_frequencies()
    usage = None if cond["usage"] is None else cond["usage"][layer, head]
    res = spectral_alignment(cond["g"][layer, head], thetas, length=length, usage=usage,
                             raw_spectrum=raw_spectrum, n_null=200)
    omega, power = res["omega"], res["spectrum"] ** 2 / max(res["spectrum"].max() ** 2, 1e-300)
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    ax.plot(omega, power, lw=1, label=f"|ĝ|² ({cond['source']})")
    ref, label = None, "S_PE"
    if thetas is not None:
        ref, label = reference_kernel(thetas, length, usage), "Σ w_i cos(θ_i Δ)"
    elif cond["s_pe"] is not None:
        ref = cond["s_pe"][layer, head]
    if ref is not None:
        ref = spectrum(ref, length, raw_spectrum=raw_spectrum) ** 2
        ax.plot(omega, ref / max(ref.max(), 1e-300), lw=1, alpha=0.7, label=f"reference {label}")
    top, sig = res["peak_magnitude"] ** 2 / max(res["spectrum"].max() ** 2, 1e-300), res[
        "significant"]
    ax.plot(res["peaks"][sig], top[sig], "kv", ms=5, label="significant peaks")
    ax.plot(res["peaks"][~sig], top[~sig], "v", mfc="none", mec="k", ms=5, label="other peaks")
    for theta in thetas if thetas is not None else []:
        ax.axvline(theta, color="0.8", lw=0.5, zorder=0)
    verdict = f"aligned={res['aligned']} p={res['p_value']:.3g}" if thetas is not None else ""
    ax.set(xlabel="ω (rad/token)", ylabel="power (max = 1)", xlim=(0, np.pi),
           title=f"{model} {dataset} T={length}  L{layer}H{head}  {verdict}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

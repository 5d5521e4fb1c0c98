"""One head's spectral alignment: :func:`spectral_alignment` on g(Δ), or
:func:`align_spectrum` on an already processed |ĝ| (the condition table computes every
head's spectrum in one batch). See :mod:`poskernel_tl.analyses.spectral` for what is
computed and why; the null is :mod:`.null`."""

import numpy as np
from jaxtyping import Float

from poskernel_tl.analyses.spectral.null import (
    ALPHA,
    N_NULL,
    PRECISION_BINS,
    TAU_REL,
    log_distance,
    match_peaks,
    peak_significance,
    rotation_null,
)
from poskernel_tl.analyses.spectral.processing import (
    N_PEAKS,
    OMEGA_MIN_BINS,
    frequency_grid,
    log_power_r,
    n_fft_for,
    pearson,
    pick_peaks,
    reference_kernel,
    span,
    spectrum,
)

NOISE_FACTOR = 3.0
PER_PEAK = ("matched", "nearest_theta", "theta_index", "rel_error", "marginal", "log_dist")


def reference_scores(power, ref_power, literal_power, literal_ref, length, raw_spectrum) -> dict:
    """ref_peak_r, ref_log_r and pearson_literal of one head (see the module docstring):
    ``power``/``ref_power`` as analysed, ``literal_*`` from the literal spectrum."""
    omega_grid = frequency_grid(length)
    lo = 2 * np.pi / length if raw_spectrum else OMEGA_MIN_BINS * 2 * np.pi / length
    return {"ref_peak_r": log_power_r(power, ref_power, length, omega_grid >= lo,
                                      relative=True),
            "ref_log_r": log_power_r(power, ref_power, length,
                                     omega_grid >= 2 * np.pi / length),
            "pearson_literal": pearson(literal_power, literal_ref)}


def align_spectrum(mag: np.ndarray, th: np.ndarray, length: int, *, raw_spectrum: bool,
           n_peaks: int, tau_rel: float, n_null: int, seed: int, alpha: float,
           precision_bins: float) -> dict:
    """Peaks, significance, matching and the null of one head's processed |ĝ|."""
    n_fft = n_fft_for(length)
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
                             n_null=n_null, seed=seed, precision_bins=precision_bins,
                             alpha=alpha)
        out.update({key: m[key] for key in PER_PEAK if key in m})
        out["log_dist"] = log_distance(peaks, th)
        out.update({key: null[key] for key in ("chance", "p_value", "statistic",
                                               "log_dist_gmean", "fpr")})
        out["null_spacing"] = null["spacing"]
    else:
        out.update(matched=np.zeros(k, bool), nearest_theta=np.full(k, nan),
                   theta_index=np.full(k, -1), rel_error=np.full(k, nan),
                   marginal=np.zeros(k, bool), log_dist=np.full(k, nan), chance=nan,
                   p_value=nan, statistic=nan, log_dist_gmean=nan, null_spacing=nan,
                   fpr=0.0 if rotary else nan)
    n_matched = int(np.sum(out["matched"]))
    out["n_matched"] = n_matched if rotary else nan
    out["frac_matched"] = n_matched / n_peaks if rotary else nan
    out["criterion_met"] = bool(rotary and n_matched / n_peaks >= 0.5)
    p = out["p_value"]
    out["aligned"] = bool(rotary and out["n_significant"] > 0 and np.isfinite(p) and p < alpha)
    out["ref_peak_r"] = out["ref_log_r"] = out["pearson_literal"] = nan
    return out


def usable_thetas(thetas, usage) -> tuple[np.ndarray, np.ndarray | None]:
    th = np.zeros(0) if thetas is None else np.asarray(thetas, np.float64).ravel()
    ok = np.isfinite(th) & (th > 0)
    return th[ok], None if usage is None else np.asarray(usage, np.float64)[..., ok]


def spectral_alignment(
    g: Float[np.ndarray, " lag"], thetas: Float[np.ndarray, " pair"] | None, *,
    length: int | None = None, usage: Float[np.ndarray, " pair"] | None = None,
    raw_spectrum: bool = False, demean: bool = False, n_peaks: int = N_PEAKS,
    tau_rel: float = TAU_REL, n_null: int = N_NULL, seed: int = 0, alpha: float = ALPHA,
    precision_bins: float = PRECISION_BINS, references: bool = True,
    keep_spectrum: bool = True, two_sided: bool = False,
) -> dict:
    """Spectral analysis of one head's g(Δ) (lag Δ = 1..T−1, so T = len(g) + 1 by default)
    against rotary frequencies ``thetas`` (radians/token; None or empty for models without
    rotary PE). ``usage`` weights the reference kernel, one value per θ_i, same order.
    ``two_sided``: g runs over Δ = −(T−1)..T−1 (a bidirectional model; T = (len(g) + 1)/2
    by default) and is processed over that whole span
    (:func:`~poskernel_tl.analyses.spectral.processing.span`).

    Keys: ``peaks`` (ω of the top peaks, largest first), ``peak_magnitude``,
    ``significant``, ``n_peaks_found``, ``n_significant``; per peak ``matched``,
    ``nearest_theta``, ``theta_index``, ``rel_error``, ``marginal`` (the pre-registered
    ±10% criterion) and ``log_dist``; ``n_matched``, ``frac_matched`` (out of ``n_peaks``),
    ``criterion_met`` (frac_matched ≥ 0.5), ``chance``, ``p_value``, ``statistic``,
    ``log_dist_gmean``, ``null_spacing``, ``aligned``, ``fpr`` (the test's false-positive
    rate for these peaks); ``ref_peak_r``, ``ref_log_r``, ``pearson_literal``;
    ``n_above_3x_median``, ``top_peak_to_median``; settings; and ``omega``/``spectrum`` (the
    processed |ĝ|). ``references=False`` skips the reference scores (NaN),
    ``keep_spectrum=False`` the arrays."""
    g = np.asarray(g, np.float64)
    length = (len(g) + 1) // (2 if two_sided else 1) if length is None else int(length)
    n = span(length, two_sided)
    if not np.isfinite(g).all():
        raise ValueError("g contains non-finite values")
    th, use = usable_thetas(thetas, usage)
    mag = spectrum(g, n, raw_spectrum=raw_spectrum, demean=demean)
    out = align_spectrum(mag, th, n, raw_spectrum=raw_spectrum, n_peaks=n_peaks,
                         tau_rel=tau_rel, n_null=n_null, seed=seed, alpha=alpha,
                         precision_bins=precision_bins)
    if two_sided:  # settings: the condition's T (the spectra span 2T)
        out.update(length=length, two_sided=True)
    if len(th) and references:
        ref = spectrum(reference_kernel(th, length, use, two_sided), n,
                       raw_spectrum=raw_spectrum, demean=demean) ** 2
        literal = spectrum(reference_kernel(th, length, two_sided=two_sided), n,
                           raw_spectrum=True) ** 2
        out.update(reference_scores(mag ** 2, ref, spectrum(g, n, raw_spectrum=True) ** 2,
                                    literal, n, raw_spectrum))
    if keep_spectrum:
        out["omega"], out["spectrum"] = frequency_grid(n), mag
    return out


def pe_spectrum_correlations(
    s_pe: Float[np.ndarray, " lag"], g_sources: dict[str, np.ndarray],
    length: int | None = None, *, raw_spectrum: bool = False,
) -> dict[str, float]:
    """Learned absolute PE (GPT-2), descriptive: Pearson's r between the power spectrum of the
    head-projected positional kernel S_PE(Δ) and that of each g source (e.g. ``trackA_pooled``,
    ``gram_raw``, ``gram_centered``; lag 1..T−1 each), processed like
    :func:`spectral_alignment` and compared on linear power above 2π/T (all m with
    ``raw_spectrum``). Returns ``{"r_pe_<source>": r}``.

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


__all__ = ["NOISE_FACTOR", "PER_PEAK", "align_spectrum", "pe_spectrum_correlations",
           "reference_scores", "spectral_alignment", "usable_thetas"]

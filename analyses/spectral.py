"""Spectral analysis of g(Δ) against the positional-encoding frequencies (seed 004, Step 2).

**Spectrum.** g(Δ) for Δ = 1..T−1 comes from Track B's centered Gram (the raw Gram for
random tokens, where centering is undefined; column ``source``), is zero-padded to
N_fft = 4T and ĝ(ω_m) = FFT(pad(g))[m], ω_m = 2πm/N_fft, m = 0..N_fft/2. g(1) sits at index
0; |ĝ| does not depend on that offset (a shift only changes the phase). By default the mean
is kept, as the seed writes it; ``demean=True`` subtracts g's mean first (and the reference
kernel's mean too), recorded in the ``demean`` column.

**Peaks.** ``scipy.signal.find_peaks`` on |ĝ| with a minimum separation of 2π/T (N_fft/T = 4
bins); the end bins ω = 0 and ω = π are never peaks (a DC "peak" would match the lowest θ_i
through the absolute floor for free). The ``n_peaks`` largest are kept, rank 1 = largest.

**Matching (rotary models).** θ_i = ``spec.rotary_frequencies()``: the loaded model's own
``inv_freq`` (so Llama-3 scaling is included). A peak ω matches θ_i iff
|ω − θ_i|/θ_i < τ_rel (0.10) or |ω − θ_i| < 2π/N_fft. Per peak: the nearest θ by relative
error (among the matching θ if any match), that relative error, matched, and marginal
(matched with relative error > 0.05). ``frac_matched`` = matched peaks / peaks found;
``frac_expected_hit`` = distinct θ assigned to matched peaks / (d_head/2).

**Expected PE spectrum.** For a rotary model the reference kernel is
g_PE(Δ) = Σ_i cos(θ_i Δ), Δ = 1..T−1, with equal weights (every rotary pair carrying the
same energy with aligned query/key phases); its power spectrum |ĝ_PE|² is built exactly like
|ĝ|² (same padding, same demean option). ``pearson`` is Pearson's r between |ĝ|² and
|ĝ_PE|² over m = 0..N_fft/2. For learned-absolute models (GPT-2) the reference is the
head-projected positional kernel S_PE(Δ) of :mod:`poskernel_tl.analyses.pe_kernel`, read from
``pe_kernel.npz``; nothing is matched there (descriptive only). NoPE models have no reference.

**Chance level.** The fraction of grid frequencies ω_m (m ≥ 1, ω_m ≤ π) inside a band that
satisfy the criterion for some θ_i: the probability that a peak at a random grid frequency
matches. ``chance_full`` uses (0, π]; ``chance_band`` uses [band_lo, band_hi] = the lowest and
highest observed peak over the analysed heads of the condition. ``perm_p``: draw as many
frequencies as the head has peaks, uniformly without replacement from the band's grid points,
``n_perm`` times (seeded); p = (1 + #{null matches ≥ observed}) / (1 + n_perm).

**Peaks above noise.** ``n_peaks_above_3x_median`` counts top peaks whose power |ĝ|² exceeds
3× the median power over the grid (the seed's NoPE check, reported for every model). For white
noise |ĝ|² is ~exponential, so one bin passes with probability 2⁻³ = 1/8 and the top five of
~T/2 independent bins pass almost always: this count alone does not separate structure from
noise. ``top_peak_to_median`` gives the continuous power ratio of the largest peak.

**Gate.** Mean Track A pooled R² over the heads of layers 0–1 of the condition; met if > 0.60
(rotary models only; elsewhere not applicable and ``gate_met`` is empty). Heads are analysed
if their pooled R² > 0.40 (gate met, or a non-rotary model); ``force=True`` analyses every head
regardless and is recorded in ``forced``.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy.signal import find_peaks

from poskernel_tl.constants import (
    CFG,
    G_ARRAYS,
    PE_KERNEL,
    SPECTRAL_CSV,
    SPECTRAL_PEAKS_CSV,
    TRACK_A_CSV,
    result_path,
)
from poskernel_tl.io import save_csv
from poskernel_tl.registry import ModelSpec

PAD_FACTOR = 4
N_PEAKS = 5
TAU_REL = 0.10
MARGINAL_REL = 0.05
GATE_THRESHOLD = 0.60
HEAD_THRESHOLD = 0.40
EARLY_LAYERS = (0, 1)
NOISE_FACTOR = 3.0
N_PERM = 2000
PEAK_COLUMNS = ["model", "dataset", "length", "layer", "head", "rank", "omega", "magnitude",
                "nearest_theta", "theta_index", "rel_error", "matched", "marginal"]


def n_fft_for(length: int) -> int:
    return PAD_FACTOR * length


def frequency_grid(length: int) -> Float[np.ndarray, " freq"]:
    """ω_m = 2πm/N_fft for m = 0..N_fft/2 (radians per token)."""
    n_fft = n_fft_for(length)
    return 2 * np.pi * np.arange(n_fft // 2 + 1) / n_fft


def spectrum(
    g: Float[np.ndarray, "*batch lag"], length: int, demean: bool = False
) -> Float[np.ndarray, "*batch freq"]:
    """|ĝ(ω_m)| of g(Δ), Δ = 1..T−1, zero-padded to N_fft = 4T, on :func:`frequency_grid`."""
    g = np.asarray(g, dtype=np.float64)
    if g.shape[-1] != length - 1:
        raise ValueError(f"g has {g.shape[-1]} lags; expected T−1 = {length - 1}")
    if demean:
        g = g - g.mean(-1, keepdims=True)
    return np.abs(np.fft.rfft(g, n=n_fft_for(length), axis=-1))


def top_peaks(mag: Float[np.ndarray, " freq"], length: int, n_peaks: int = N_PEAKS) -> np.ndarray:
    """Grid indices of the ``n_peaks`` largest local maxima of |ĝ|, at least 2π/T apart,
    largest first."""
    idx, _ = find_peaks(mag, distance=n_fft_for(length) // length)
    order = np.argsort(-mag[idx], kind="stable")[:n_peaks]
    return idx[order]


def criterion(omega: np.ndarray, thetas: np.ndarray, n_fft: int, tau_rel: float = TAU_REL
              ) -> tuple[np.ndarray, np.ndarray]:
    """(relative error, matched) for every (ω, θ_i) pair, each [n_omega, n_theta]."""
    diff = np.abs(np.asarray(omega, np.float64)[:, None] - np.asarray(thetas, np.float64)[None])
    rel = diff / np.asarray(thetas, np.float64)[None]
    return rel, (rel < tau_rel) | (diff < 2 * np.pi / n_fft)


def match_peaks(omega: np.ndarray, thetas: np.ndarray, n_fft: int, tau_rel: float = TAU_REL
                ) -> dict[str, np.ndarray]:
    """Per peak: nearest θ (by relative error, among matching θ when any match), its index,
    the relative error, matched, and marginal (matched with relative error > 0.05)."""
    rel, ok = criterion(omega, thetas, n_fft, tau_rel)
    matched = ok.any(1)
    key = np.where(matched[:, None] & ~ok, np.inf, rel)
    index = key.argmin(1)
    rel_error = rel[np.arange(len(rel)), index]
    return {"nearest_theta": np.asarray(thetas)[index], "theta_index": index,
            "rel_error": rel_error, "matched": matched,
            "marginal": matched & (rel_error > MARGINAL_REL)}


def band_mask(length: int, band: tuple[float, float] | None = None) -> np.ndarray:
    """Grid points m ≥ 1 with band_lo ≤ ω_m ≤ band_hi (all of (0, π] without a band)."""
    omega = frequency_grid(length)
    keep = np.arange(len(omega)) >= 1
    if band is not None:
        keep &= (omega >= band[0]) & (omega <= band[1])
    return keep


def chance_level(thetas: np.ndarray, length: int, band: tuple[float, float] | None = None,
                 tau_rel: float = TAU_REL) -> float:
    """Fraction of grid frequencies in ``band`` (default (0, π]) that match some θ_i."""
    keep = band_mask(length, band)
    if not keep.any() or len(thetas) == 0:
        return float("nan")
    _, ok = criterion(frequency_grid(length)[keep], thetas, n_fft_for(length), tau_rel)
    return float(ok.any(1).mean())


def permutation_null(hits: np.ndarray, k: int, n_perm: int = N_PERM, seed: int = 0
                     ) -> np.ndarray:
    """Matches among ``k`` grid points drawn without replacement from a band whose points
    match or not as in ``hits`` (bool), ``n_perm`` seeded draws."""
    hits = np.asarray(hits, bool)
    k = min(k, len(hits))
    if k == 0:
        return np.zeros(n_perm, int)
    keys = np.random.default_rng(seed).random((n_perm, len(hits)))
    pick = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return hits[pick].sum(1)


def perm_pvalue(observed: int, null: np.ndarray) -> float:
    return float((1 + np.sum(null >= observed)) / (1 + len(null)))


def expected_pe_kernel(thetas: np.ndarray, length: int) -> Float[np.ndarray, " lag"]:
    """g_PE(Δ) = Σ_i cos(θ_i Δ) for Δ = 1..T−1 (equal weights)."""
    lags = np.arange(1, length, dtype=np.float64)
    return np.cos(np.outer(lags, np.asarray(thetas, np.float64))).sum(1)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.std() == 0 or b.std() == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def noise_check(mag: np.ndarray, peaks: np.ndarray, factor: float = NOISE_FACTOR
                ) -> tuple[int, float]:
    """(top peaks with power > factor × median power, largest peak power / median power)."""
    power = np.asarray(mag, np.float64) ** 2
    med = np.median(power)
    if len(peaks) == 0 or med <= 0:
        return 0, float("nan")
    return int(np.sum(power[peaks] > factor * med)), float(power[peaks].max() / med)


def pooled_r2(track_a: pd.DataFrame, n_layers: int, n_heads: int) -> np.ndarray:
    """Track A pooled R² as [layer, head] (NaN where a head has no rows)."""
    r2 = np.full((n_layers, n_heads), np.nan)
    first = track_a.groupby(["layer", "head"])["R2_pooled"].first()
    for (layer, head), value in first.items():
        if 0 <= layer < n_layers and 0 <= head < n_heads:
            r2[int(layer), int(head)] = value
    return r2


def gate_value(r2: np.ndarray, early_layers: tuple[int, ...] = EARLY_LAYERS) -> float:
    """Mean pooled R² over the heads of the early layers (NaN-aware)."""
    early = r2[[layer for layer in early_layers if layer < len(r2)]]
    return float(np.nanmean(early)) if np.isfinite(early).any() else float("nan")


def spec_from_cfg(cfg: dict) -> ModelSpec:
    """Rebuild the run's ModelSpec from ``cfg.json`` (``inv_freq`` list → tuple)."""
    d = dict(cfg["spec"])
    if d.get("inv_freq") is not None:
        d["inv_freq"] = tuple(float(x) for x in d["inv_freq"])
    names = {f.name for f in dataclasses.fields(ModelSpec)}
    return ModelSpec(**{k: v for k, v in d.items() if k in names})


def load_condition(out_dir: Path, model: str, dataset: str, length: int) -> dict:
    """cfg, spec, g [layer, head, lag] with its source, pooled R² and S_PE (or None)."""
    def path(suffix: str) -> Path:
        return result_path(out_dir, model, dataset, length, suffix)

    cfg = json.loads(path(CFG).read_text())
    spec = spec_from_cfg(cfg)
    with np.load(path(G_ARRAYS)) as z:
        g, source = z["gram_centered"], "gram_centered"
        if not cfg.get("centered", True) or np.isnan(g).all():
            g, source = z["gram_raw"], "gram_raw"
        g = g.astype(np.float64)
    s_pe = None
    if spec.pe == "learned-absolute" and path(PE_KERNEL).exists():
        with np.load(path(PE_KERNEL)) as z:
            s_pe = z["s_pe"].astype(np.float64)
    r2 = pooled_r2(pd.read_csv(path(TRACK_A_CSV)), g.shape[0], g.shape[1])
    return {"cfg": cfg, "spec": spec, "g": g, "source": source, "r2": r2, "s_pe": s_pe}


def reference_power(spec: ModelSpec, s_pe: np.ndarray | None, length: int, demean: bool
                    ) -> np.ndarray | None:
    """Reference power spectrum: [freq] for rotary, [layer, head, freq] for S_PE, or None."""
    if spec.pe == "rope":
        return spectrum(expected_pe_kernel(spec.rotary_frequencies(), length), length, demean) ** 2
    if s_pe is not None:
        return spectrum(s_pe, length, demean) ** 2
    return None


def _mean(values: pd.Series) -> float:
    values = values.astype(float).dropna()
    return float(values.mean()) if len(values) else float("nan")


def run_spectral(out_dir: Path, model: str, dataset: str, length: int, *, force: bool = False,
                 demean: bool = False, tau_rel: float = TAU_REL, n_peaks: int = N_PEAKS,
                 n_perm: int = N_PERM, seed: int = 0) -> dict:
    """Spectral analysis of one condition: writes ``spectral.csv`` (one row per head) and
    ``spectral_peaks.csv`` (one row per peak); returns a summary dict."""
    cond = load_condition(out_dir, model, dataset, length)
    spec, g, r2 = cond["spec"], cond["g"], cond["r2"]
    if g.shape[-1] != length - 1:
        raise ValueError(f"g.npz has {g.shape[-1]} lags; expected {length - 1} for T={length}")
    n_layers, n_heads = g.shape[:2]
    rotary = spec.pe == "rope"
    thetas = spec.rotary_frequencies() if rotary else np.zeros(0)
    n_fft, omega = n_fft_for(length), frequency_grid(length)
    gate = gate_value(r2)
    gate_met = bool(gate > GATE_THRESHOLD) if rotary else None
    if force:
        analysed = np.ones_like(r2, bool)
    elif rotary and not gate_met:
        analysed = np.zeros_like(r2, bool)
    else:
        analysed = np.nan_to_num(r2, nan=-np.inf) > HEAD_THRESHOLD
    notes = [] if rotary else [f"gate not applicable (pe={spec.pe})"]
    if force:
        notes.append("forced: all heads analysed regardless of gate and R²")
    note = "; ".join(notes)
    ref = reference_power(spec, cond["s_pe"], length, demean)
    mags = spectrum(g, length, demean)

    heads: dict[tuple[int, int], dict] = {}
    for layer, head in zip(*np.nonzero(analysed)):
        if not np.isfinite(g[layer, head]).all():
            continue
        mag = mags[layer, head]
        peaks = top_peaks(mag, length, n_peaks)
        above, ratio = noise_check(mag, peaks)
        h = {"peaks": peaks, "above": above, "ratio": ratio, "pearson": float("nan")}
        if ref is not None:
            h["pearson"] = pearson(mag ** 2, ref if ref.ndim == 1 else ref[layer, head])
        if rotary:
            h["match"] = match_peaks(omega[peaks], thetas, n_fft, tau_rel)
        heads[(int(layer), int(head))] = h

    all_peaks = np.concatenate([omega[h["peaks"]] for h in heads.values()] or [np.zeros(0)])
    band = (float(all_peaks.min()), float(all_peaks.max())) if len(all_peaks) else None
    chance_full = chance_band = float("nan")
    nulls: dict[int, np.ndarray] = {}
    if rotary:
        chance_full = chance_level(thetas, length, None, tau_rel)
        if band is not None:
            chance_band = chance_level(thetas, length, band, tau_rel)
            keep = band_mask(length, band)
            _, ok = criterion(omega[keep], thetas, n_fft, tau_rel)
            band_hits = ok.any(1)

    rows, peak_rows = [], []
    nan = float("nan")
    for layer in range(n_layers):
        for head in range(n_heads):
            h = heads.get((layer, head))
            row = {"model": model, "dataset": dataset, "length": length, "layer": layer,
                   "head": head, "pe": spec.pe, "R2_pooled": r2[layer, head],
                   "gate_value": gate, "gate_met": gate_met, "gate_applicable": rotary,
                   "gate_note": note, "forced": force, "analysed": h is not None,
                   "n_peaks": nan, "n_matched": nan, "frac_matched": nan,
                   "frac_expected_hit": nan, "n_expected": len(thetas) if rotary else nan,
                   "chance_full": chance_full, "chance_band": chance_band,
                   "band_lo": band[0] if band else nan, "band_hi": band[1] if band else nan,
                   "perm_p": nan, "pearson": nan, "n_peaks_above_3x_median": nan,
                   "top_peak_to_median": nan, "demean": demean, "source": cond["source"],
                   "n_fft": n_fft, "tau_rel": tau_rel}
            if h is not None:
                k = len(h["peaks"])
                row.update(n_peaks=k, pearson=h["pearson"], n_peaks_above_3x_median=h["above"],
                           top_peak_to_median=h["ratio"])
                m = h.get("match")
                if m is not None and k:
                    n_matched = int(m["matched"].sum())
                    if k not in nulls:
                        nulls[k] = permutation_null(band_hits, k, n_perm, seed + k)
                    row.update(n_matched=n_matched, frac_matched=n_matched / k,
                               frac_expected_hit=len(set(m["theta_index"][m["matched"]]))
                               / len(thetas),
                               perm_p=perm_pvalue(n_matched, nulls[k]))
                for rank, idx in enumerate(h["peaks"], start=1):
                    peak_rows.append({
                        "model": model, "dataset": dataset, "length": length, "layer": layer,
                        "head": head, "rank": rank, "omega": omega[idx],
                        "magnitude": mags[layer, head, idx],
                        **({key: m[key][rank - 1] for key in
                            ("nearest_theta", "theta_index", "rel_error", "matched", "marginal")}
                           if m is not None else {}),
                    })
            rows.append(row)
    table = pd.DataFrame(rows)
    save_csv(table, result_path(out_dir, model, dataset, length, SPECTRAL_CSV))
    save_csv(pd.DataFrame(peak_rows, columns=PEAK_COLUMNS),
              result_path(out_dir, model, dataset, length, SPECTRAL_PEAKS_CSV))

    done = table[table["analysed"]]
    early = done[done["layer"].isin(EARLY_LAYERS)]
    frac = done["frac_matched"].dropna()
    return {"model": model, "dataset": dataset, "length": length, "pe": spec.pe,
            "gate_value": gate, "gate_met": gate_met, "forced": force, "demean": demean,
            "n_analysed": len(done), "mean_frac_matched_early": _mean(early["frac_matched"]),
            "mean_frac_matched": _mean(frac), "frac_heads_ge_half_matched": _mean(frac >= 0.5),
            "chance_full": chance_full, "chance_band": chance_band, "band": band,
            "mean_pearson": _mean(done["pearson"])}


def plot_head_spectrum(out_dir: Path, model: str, dataset: str, length: int, layer: int,
                       head: int, demean: bool = False):
    """|ĝ|² of one head overlaid on the reference power spectrum (rotary g_PE or GPT-2 S_PE,
    each scaled to the same maximum), with the top peaks and the θ_i marked."""
    import matplotlib.pyplot as plt

    cond = load_condition(out_dir, model, dataset, length)
    spec, omega = cond["spec"], frequency_grid(length)
    power = spectrum(cond["g"][layer, head], length, demean) ** 2
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(omega, power / power.max(), lw=1, label=f"|ĝ|² ({cond['source']})")
    ref = reference_power(spec, cond["s_pe"], length, demean)
    if ref is not None:
        ref = ref if ref.ndim == 1 else ref[layer, head]
        label = "Σ cos(θ_i Δ)" if spec.pe == "rope" else "S_PE"
        ax.plot(omega, ref / ref.max(), lw=1, alpha=0.7, label=f"reference {label}")
    peaks = top_peaks(np.sqrt(power), length)
    ax.plot(omega[peaks], power[peaks] / power.max(), "kv", ms=5, label="top peaks")
    for theta in (spec.rotary_frequencies() if spec.pe == "rope" else []):
        ax.axvline(theta, color="0.8", lw=0.5, zorder=0)
    ax.set(xlabel="ω (rad/token)", ylabel="power (max = 1)", xlim=(0, np.pi),
           title=f"{model} {dataset} T={length}  L{layer}H{head}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

"""Spectral analysis of g(Δ) against the positional-encoding frequencies (Experiment 1,
Step 2), for two sources of g: Track B's centered Gram (the pre-registered analysis) and
Track A's pooled fit (exploratory).

The science is in array functions that read no files: ``spectral_alignment`` (one head)
and ``pe_spectrum_correlations`` (GPT-2) in :mod:`.align`, ``spectral_table`` (one
condition, one g source) in :mod:`.table`; :func:`run_spectral` analyses both sources of one
condition and writes them (:mod:`.io`). Processing: :mod:`.processing`; matching and the
null: :mod:`.null`; summaries for people: :mod:`.summary`. :data:`SPEC` is the analysis
as the registry lists it (``poskernel analyze spectral``).

**What is removed before the FFT, and why.** Taken literally (zero-padded FFT of g), the
spectrum is mostly not about periodicity: a constant g has a Dirichlet spectrum whose side
lobes, about one bin (2π/T) apart, pass as peaks, and any decay puts its power at low ω,
where the rotary frequencies are dense. By default therefore:

1. the weighted least-squares quadratic in Δ (weights = the taper) is subtracted;
2. the residual is tapered by a one-sided Hann window, w(Δ) = sin²(πΔ/T): side lobes start
   at −31 dB and fall as ω⁻³; the main lobe is ±2 bins wide;
3. peaks are local maxima of |ĝ| at least 2π/T apart with a prominence ≥ 5% of the largest
   |ĝ| above ω_min = 4·(2π/T), and above ω_min only; positions are refined by parabolic
   interpolation of ln|ĝ|;
4. a peak is *significant* if its power exceeds 10× its local background and its magnitude
   5× the most the window's side lobes of the rest of the spectrum can put there. Smooth
   kernels leave none. Only significant peaks enter the alignment statistic.

**Bidirectional models** (no causal mask) have g on both sides of the diagonal; every g is
then analysed over its signed lags Δ = −(T−1)..T−1 (the forward g, Δ = 1..T−1, and the
``*_back`` g, Δ = −1..−(T−1), joined with Δ = 0 bridged by the mean of g(±1)), tapered by a
Hann window over that whole span, so spectra have 4T + 1 points on a grid of bins 2π/2T;
table columns keep ``length`` = T. Causal models are analysed exactly as before.

``raw_spectrum=True`` keeps the literal procedure for comparison; a flat kernel then meets the
pre-registered "≥ 50% of top-5 peaks matched".

**Reference spectrum.** Per head, Σ_i w_i cos(θ_i Δ) with w_i the head's frequency usage
(mean |q| × mean |k| of rotary pair i; equal weights without it), processed like g.
``ref_peak_r``: Pearson's r of ln power minus the ln of its local background above ω_min.
``ref_log_r``: r of ln power above 2π/T. ``pearson_literal``: the protocol's literal score
(equal weights, linear power, literal spectrum), secondary.

**NoPE** (no θ): no matching; ``n_above_3x_median`` counts top peaks whose power exceeds 3×
the median power; ``top_peak_to_median`` is the largest ratio.

**Gate.** The caller passes ``gate_met`` (the protocol's gate is over the early-layer heads of
the rotary models of a grid: :func:`grid_gate`). A head is in the pre-registered analysis
(status ``gated``) when the gate is met and its pooled R² > 0.40. Every other head with a
finite g is analysed too and labelled (``ungated``: no met gate licenses it but R² > 0.40 or
``force``; ``exploratory: gate not met`` / ``exploratory: R2 <= 0.40``), so that every head
has its peaks; verdicts read only ``preregistered`` rows. Track A's rows are all
``exploratory``.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.spectral import io as SIO
from poskernel_tl.analyses.spectral.align import spectral_alignment
from poskernel_tl.analyses.spectral.null import N_NULL
from poskernel_tl.analyses.spectral.processing import (
    frequency_grid,
    reference_kernel,
    span,
    spectrum,
    two_sided_for_spectrum,
)
from poskernel_tl.analyses.spectral.table import layer_groups, spectral_table_by_layers
from poskernel_tl.analyses.spectral.view import SpectrumPanels
from poskernel_tl.errors import ResultFileError
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.plan.config import option
from poskernel_tl.protocol import EARLY_LAYERS, GATE_THRESHOLD


def gate_value(r2: Float[np.ndarray, "layer head_index"],
               early_layers: tuple[int, ...] = EARLY_LAYERS) -> float:
    """Mean pooled R² over the heads of the early layers of one condition (NaN-aware)."""
    r2 = np.asarray(r2, np.float64)
    early = r2[[layer for layer in early_layers if layer < len(r2)]]
    return float(np.nanmean(early)) if np.isfinite(early).any() else float("nan")


# ---------------------------------------------------------------- file layer (one condition)
def condition_inputs(result) -> dict:
    """What the spectral stage reads from a
    :class:`~poskernel_tl.measurement.result.ConditionResult`: Track B's g (centered, or
    raw where uncentered) and its name, Track A's pooled g, the GPT-2 g sources, pooled R²,
    S_PE and the frequency usage |q|·|k| per rotary pair in θ order. For a bidirectional
    model every g is two-sided (``two_sided`` true: signed lags Δ = −(T−1)..T−1, Δ = 0
    bridged by :func:`two_sided_for_spectrum`)."""
    two = not getattr(result.spec, "causal", True)
    side = lambda fwd, back: two_sided_for_spectrum(fwd, back) if two else fwd
    g, source = result.g_trackB
    g_back = result.g_gram_back if result.centered else result.g_gram_raw_back
    sources = {"trackA_pooled": side(result.g_pooled, result.g_pooled_back),
               "gram_raw": side(result.g_gram_raw, result.g_gram_raw_back),
               "gram_centered": side(result.g_gram, result.g_gram_back)}
    usage = result.usage
    if usage is not None and (result.thetas is None or len(result.thetas) != usage.shape[-1]):
        usage = None
    s_pe, s_pe_back = result.s_pe, result.s_pe_back
    if two and s_pe is not None and s_pe_back is not None:
        s_pe = two_sided_for_spectrum(s_pe, s_pe_back)
    return {"spec": result.spec, "g": np.asarray(side(g, g_back), np.float64),
            "source": source, "two_sided": two, "g_sources": sources,
            "g_trackA": np.asarray(side(result.g_pooled, result.g_pooled_back), np.float64),
            "r2": result.r2_pooled, "s_pe": s_pe, "usage": usage}


def grid_gate(results) -> bool | None:
    """The protocol's gate over a grid: mean pooled Track A R² of the early-layer heads of
    all rotary models present > 0.60 (None without rotary models). GPT-2 and NoPE
    conditions follow this gate."""
    return protocol.gate_met([r.r2_pooled[protocol.early_layers(r.n_layers)]
                              for r in results if r.spec.pe == "rope"])


def _mean(col: pd.Series) -> float:
    col = pd.to_numeric(col, errors="coerce").dropna()
    return float(col.mean()) if len(col) else float("nan")


def source_summary(table: pd.DataFrame, prefix: str = "") -> dict:
    """Per-condition numbers of one source's table: analysed heads, the share aligned (all
    and early-layer heads) and the test's false-positive rate over the same heads."""
    done = table[table["analysed"].astype(bool)]
    early = done[done["layer"].isin(EARLY_LAYERS)]
    pre = done[done["preregistered"].astype(bool)]
    return {f"{prefix}n_analysed": len(done), f"{prefix}n_preregistered": len(pre),
            f"{prefix}frac_aligned": _mean(done["aligned"].astype(float)),
            f"{prefix}frac_aligned_early": _mean(early["aligned"].astype(float)),
            f"{prefix}fpr_early": _mean(early["fpr"]),
            f"{prefix}n_early": len(early),
            f"{prefix}mean_frac_matched": _mean(done["frac_matched"]),
            f"{prefix}mean_frac_matched_early": _mean(early["frac_matched"]),
            f"{prefix}mean_chance": _mean(done["chance"]),
            f"{prefix}mean_ref_peak_r": _mean(done["ref_peak_r"])}


def run_spectral(result, out: Path | None = None, *, force: bool = False,
                 demean: bool = False, raw_spectrum: bool = False, gate_met: bool | None = None,
                 n_null: int = N_NULL, seed: int = 0, explore: bool = True
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Spectral analysis of one condition (a ConditionResult), for Track B's g (the
    pre-registered analysis) and Track A's pooled g (exploratory). Returns Track B's per-head
    table, its per-peak table and a summary of both sources (Track A's keys prefixed
    ``trackA_``); with ``out`` also writes every table and the spectra there
    (:func:`poskernel_tl.analyses.spectral.io.write_spectral`). ``gate_met``: the grid's gate
    (:func:`grid_gate`); default: this condition's own gate (rotary models only)."""
    cond = condition_inputs(result)
    spec, r2, length = cond["spec"], cond["r2"], result.length
    gate = gate_value(r2)
    if gate_met is None and spec.pe == "rope":
        gate_met = bool(gate > GATE_THRESHOLD)
    common = dict(usage=cond["usage"], force=force, raw_spectrum=raw_spectrum, demean=demean,
                  model=result.model, dataset=result.dataset, pe=spec.pe, n_null=n_null,
                  seed=seed, explore=explore, two_sided=cond["two_sided"])
    mags_b, mags_a = {}, {}
    table, peaks = spectral_table_by_layers(
        cond["g"], r2, spec, length, gate_met=gate_met,
        s_pe=cond["s_pe"], g_sources=cond["g_sources"] if cond["s_pe"] is not None else None,
        source=cond["source"], magnitudes=mags_b, **common)
    table_a, peaks_a = spectral_table_by_layers(cond["g_trackA"], r2, spec, length,
                                                gate_met=gate_met, source="trackA_pooled",
                                                magnitudes=mags_a, **common)
    table_a.loc[table_a["analysed"], "status"] = "exploratory"
    table_a["preregistered"] = False
    for t in (table, table_a):
        t.insert(t.columns.get_loc("gate_met"), "gate_value", gate)
    if out is not None:
        SIO.write_spectral(out, result.model, result.dataset, length, {
            "trackB": (table, peaks, mags_b["spectrum"]),
            "trackA": (table_a, peaks_a, mags_a["spectrum"])}, mags_b["omega"],
            spec.rotary_frequencies())
    summary = {"model": result.model, "dataset": result.dataset, "length": length,
               "pe": spec.pe, "gate_value": gate, "gate_met": gate_met, "forced": force,
               "raw_spectrum": raw_spectrum, **source_summary(table),
               **source_summary(table_a, "trackA_")}
    return table, peaks, summary


def plot_head_spectrum(result, layer: int, head: int, raw_spectrum: bool = False):
    """|ĝ|² of one head's Track B g (as analysed) over the reference power spectrum
    (usage-weighted rotary kernel or GPT-2's S_PE, each scaled to maximum 1), top peaks
    (filled: significant) and θ_i. Returns the matplotlib Figure."""
    from matplotlib.figure import Figure

    cond = condition_inputs(result)
    model, dataset, length, two = result.model, result.dataset, result.length, cond["two_sided"]
    thetas = cond["spec"].rotary_frequencies(layer)
    usage = None if cond["usage"] is None else cond["usage"][layer, head]
    g = cond["g"][layer, head]
    if not two:  # a sliding window's kept offsets
        length = next(n for layers, _, n, _ in layer_groups(cond["spec"], length)
                      if layer in layers)
        g = g[:length - 1]
    res = spectral_alignment(g, thetas, length=length, usage=usage,
                             raw_spectrum=raw_spectrum, n_null=200, two_sided=two)
    omega, power = res["omega"], res["spectrum"] ** 2 / max(res["spectrum"].max() ** 2, 1e-300)
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    ax.plot(omega, power, lw=1, label=f"|ĝ|² ({cond['source']})")
    ref, label = None, "S_PE"
    if thetas is not None:
        ref, label = reference_kernel(thetas, length, usage, two), "Σ w_i cos(θ_i Δ)"
    elif cond["s_pe"] is not None:
        ref = cond["s_pe"][layer, head]
    if ref is not None:  # a one-sided S_PE of a two-sided g: its own span
        ref = spectrum(ref, span(length, two and len(ref) > length - 1),
                       raw_spectrum=raw_spectrum) ** 2
        if len(ref) != len(omega):
            ref = np.interp(omega, frequency_grid(length), ref)
        ax.plot(omega, ref / max(ref.max(), 1e-300), lw=1, alpha=0.7, label=f"reference {label}")
    top = res["peak_magnitude"] ** 2 / max(res["spectrum"].max() ** 2, 1e-300)
    sig = res["significant"]
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


# ---------------------------------------------------------------- the analysis (registry)
def folder_gate(out: str | Path | None, result: ConditionResult) -> bool | None:
    """The protocol's gate over every rotary condition saved under ``out`` (and
    ``result``): mean pooled Track A R² of the early-layer heads > the gate threshold.
    None without rotary conditions. Reads only the other conditions' spec and pooled
    R² column, so it stays cheap on a large grid."""
    early = [result.r2_pooled[protocol.early_layers(result.n_layers)]] \
        if result.spec.pe == "rope" else []
    for model, dataset, length in ConditionResult.conditions(out) if out else []:
        if (model, dataset, length) == (result.model, result.dataset, result.length):
            continue
        path = C.result_path(out, model, dataset, length, C.TRACK_A_CSV)
        try:
            spec = ConditionResult.saved_spec(out, model, dataset, length)
            if spec.pe != "rope":
                continue
            a = pd.read_csv(path, usecols=["layer", "head", "R2_pooled"])
        except (OSError, ValueError) as err:
            raise ResultFileError(f"{path}: unreadable ({err})") from err
        a = a.drop_duplicates(["layer", "head"])
        early.append(a.loc[a["layer"].isin(protocol.EARLY_LAYERS), "R2_pooled"].to_numpy())
    return protocol.gate_met(early)


@dataclass(frozen=True)
class SpectralOptions:
    force: bool = option(False, "analyse all heads, ignoring the gate (labelled ungated)")
    raw_spectrum: bool = option(False, "the literal spectrum (mean kept, no taper) instead "
                                       "of the detrended, tapered one; for comparison only")
    demean: bool = option(False, "with --raw-spectrum: remove g's mean before the FFT")


def analyze(inputs: AnalysisInputs, options: SpectralOptions) -> dict[str, pd.DataFrame]:
    """``poskernel analyze spectral``: spectral alignment of g(Δ) with the
    positional-encoding frequencies for both g sources, gated over every rotary condition
    saved beside this one (:func:`folder_gate`); :func:`run_spectral` writes its tables and
    spectra itself (:mod:`.io`), so none is returned."""
    run_spectral(
        inputs.result, Path(inputs.out) if inputs.out is not None else None,
        force=options.force, raw_spectrum=options.raw_spectrum,
        demean=options.demean, gate_met=folder_gate(inputs.out, inputs.result))
    return {}


SPEC = AnalysisSpec(
    order=0,  # (where it is listed)
    bidirectional=True,
    name="spectral", title="Spectral alignment", compute=analyze, options=SpectralOptions,
    needs_model=False, needs_result=True, file=C.SPECTRAL_CSV,
    columns=("analysed", "aligned", "frac_matched"),
    head_rows=(("frac_matched", "fraction of top peaks matched to a θᵢ"),
               ("p_value", "alignment p-value")),
    guide="The DFT of g(Δ) against the positional-encoding frequencies θᵢ: peaks that are "
          "significant and lie within the matching tolerance of a θᵢ.",
    head_panels=SpectrumPanels)

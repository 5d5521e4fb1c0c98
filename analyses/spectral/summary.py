"""Spectral summaries of one g(Δ) for people: its power spectrum with the alignment
against the rotary frequencies (:func:`kernel_spectrum`), as small tables
(:func:`alignment_frames`) or one sentence (:func:`alignment_line`). Used by the head
view, the report and the command line."""

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.analyses.spectral.align import spectral_alignment
from poskernel_tl.analyses.spectral.processing import frequency_grid, spectrum


def kernel_spectrum(
    g: Float[np.ndarray, " lag"],
    thetas: Float[np.ndarray, " pair"] | None = None,
    *,
    usage: Float[np.ndarray, " pair"] | None = None, two_sided: bool = False,
) -> tuple[Float[np.ndarray, " freq"], Float[np.ndarray, " freq"], dict | None, str]:
    """``(omega, power, alignment, note)`` for one g(Δ), Δ = 1..T−1 (``two_sided``: over
    Δ = −(T−1)..T−1, a bidirectional model's g).

    The power spectrum is the spectral analysis' own (``analyses.spectral.processing.spectrum``,
    squared: detrended, tapered, zero-padded to 4T, or 8T two-sided); ``alignment`` is
    ``spectral_alignment(g, thetas, usage=usage)`` for rotary models (``thetas`` given),
    else None; ``note`` is kept empty (for callers that show one)."""
    g = np.asarray(g, dtype=np.float64)
    n = len(g) + 1  # the span: T, or 2T for a two-sided g
    omega = np.asarray(frequency_grid(n), dtype=np.float64)
    power = np.asarray(spectrum(g, n), dtype=np.float64) ** 2
    alignment = None
    if thetas is not None and len(thetas):
        alignment = spectral_alignment(g, thetas, usage=usage, two_sided=two_sided)
    return omega, power, alignment, ""


def dict_value(d: dict, key: str, default=float("nan")):
    value = d.get(key, default)
    return value.item() if isinstance(value, np.generic) else value


def alignment_frames(alignment: dict | None, label: str = "g(Δ)") -> dict[str, pd.DataFrame]:
    """The spectral alignment of ``label`` as two small tables: a one-row summary and one
    row per top peak of |ĝ(ω)| (empty dict when there is no alignment)."""
    if not alignment:
        return {}
    summary = pd.DataFrame([{k: dict_value(alignment, k) for k in (
        "n_peaks_found", "n_significant", "n_matched", "frac_matched", "chance", "p_value",
        "aligned", "ref_peak_r")}])
    peaks = np.asarray(alignment.get("peaks", []), dtype=np.float64)
    rows = []
    for i, w in enumerate(peaks):
        row = {"rank": i + 1, "omega": w, "period (tokens)": 2 * np.pi / w if w > 0 else np.inf}
        for key in ("peak_magnitude", "significant", "nearest_theta", "theta_index",
                    "rel_error", "matched"):
            values = alignment.get(key)
            if values is not None and len(values) > i:
                row[key] = np.asarray(values)[i].item()
        rows.append(row)
    out = {f"Spectral alignment with the rotary frequencies: {label}": summary}
    if rows:
        out[f"Top spectral peaks: {label}"] = pd.DataFrame(rows)
    return out


def alignment_line(alignment: dict | None, label: str = "") -> str:
    """One sentence summarising a spectral alignment (for the CLI and page notes)."""
    head = f"Spectral alignment{f' ({label})' if label else ''}: "
    if not alignment:
        return head + "not computed (no rotary frequencies)."
    n, k = dict_value(alignment, "n_matched"), dict_value(alignment, "n_peaks", 5)
    n_sig = dict_value(alignment, "n_significant", 0)
    if not n_sig:
        return head + (f"no significant peak ({n} of {k} top peaks near a θᵢ, chance "
                       f"{dict_value(alignment, 'chance'):.2f}): not aligned.")
    verdict = "aligned" if alignment.get("aligned") else "not aligned"
    chance, p = dict_value(alignment, "chance"), dict_value(alignment, "p_value")
    return head + (f"{n} of {k} top peaks match a θᵢ, {n_sig} significant (chance "
                   f"{chance:.2f}, p = {p:.3g}): {verdict}.")

"""One condition's spectral tables: every head's alignment of g(Δ) with its layer's own
rotary frequencies (see :mod:`poskernel_tl.analyses.spectral` for the method), one table
row per head and one per peak, each group of layers that shares a positional scheme
analysed on its own θ and over the offsets its mask keeps."""

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.analyses.spectral.align import (
    PER_PEAK,
    align_spectrum,
    pe_spectrum_correlations,
    reference_scores,
    usable_thetas,
)
from poskernel_tl.analyses.spectral.null import ALPHA, N_NULL, PRECISION_BINS, TAU_REL
from poskernel_tl.analyses.spectral.processing import (
    N_PEAKS,
    frequency_grid,
    signed_lags,
    span,
    spectrum,
)
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.protocol import HEAD_THRESHOLD

HEAD_COLUMNS = [
    "model", "dataset", "length", "layer", "head", "pe", "source", "R2_pooled", "gate_met",
    "forced", "analysed", "preregistered", "status", "raw_spectrum", "n_peaks_found",
    "n_significant", "n_matched", "frac_matched", "criterion_met", "chance", "p_value",
    "aligned", "fpr", "statistic", "log_dist_gmean", "null_spacing", "ref_peak_r", "ref_log_r",
    "pearson_literal", "n_above_3x_median", "top_peak_to_median", "n_fft", "tau_rel", "n_null",
    "r_pe_trackA_pooled", "r_pe_gram_raw", "r_pe_gram_centered"]
PEAK_COLUMNS = ["model", "dataset", "length", "layer", "head", "rank", "omega", "magnitude",
                "significant", "nearest_theta", "theta_index", "rel_error", "log_dist",
                "matched", "marginal"]


def head_status(r2: float, finite: bool, gate_met: bool | None, force: bool,
                explore: bool) -> str:
    """The status of one head (see the module docstring); ``skipped: …`` when not analysed."""
    passes = bool(np.nan_to_num(r2, nan=-np.inf) > HEAD_THRESHOLD)
    if not finite:
        return "skipped: non-finite g"
    if gate_met is True and passes:
        return "gated"
    if force or (gate_met is None and passes):
        return "ungated"
    why = "gate not met" if gate_met is False else "R2 <= 0.40"
    return f"exploratory: {why}" if explore else f"skipped: {why}"


def _batch_references(g, th, usage, length, raw_spectrum, demean, two_sided=False):
    """Per-head reference power [layer, head_index, freq], the literal power of g and the
    literal equal-weight reference, each computed once for the whole condition (over the
    lags g is given at: :func:`signed_lags`)."""
    if not len(th):
        return None
    L, H = g.shape[:2]
    n = span(length, two_sided)
    basis = np.cos(np.outer(signed_lags(length, two_sided), th))  # [lag, pair]
    use = np.ones((L, H, len(th))) if usage is None else np.asarray(usage, np.float64)
    ref = spectrum(use @ basis.T, n, raw_spectrum=raw_spectrum, demean=demean) ** 2
    raw = spectrum(np.nan_to_num(g), n, raw_spectrum=True) ** 2
    literal = spectrum(basis.sum(1), n, raw_spectrum=True) ** 2
    return ref, raw, literal


def _pe_inputs(s_pe, g_sources, length: int, two_sided: bool):
    """(S_PE, the g sources, their span) as :func:`pe_spectrum_correlations` compares them:
    a one-sided S_PE of a two-sided condition against the sources' Δ = 1..T−1 halves."""
    s_pe = np.asarray(s_pe, np.float64)
    sources = {k: np.asarray(v, np.float64) for k, v in (g_sources or {}).items()}
    if two_sided and s_pe.shape[-1] == length - 1:
        return s_pe, {k: v[..., length:] for k, v in sources.items()}, length
    return s_pe, sources, span(length, two_sided)


def _head_scores(res: dict, mags, refs, pe_in, layer: int, head: int, n: int,
                 raw_spectrum: bool) -> dict:
    """One analysed head's table columns: its alignment ``res`` (updated with the
    reference scores when there are references) and the S_PE correlations (``pe_in`` from
    :func:`_pe_inputs`)."""
    if refs is not None:
        res.update(reference_scores(mags[layer, head] ** 2, refs[0][layer, head],
                                    refs[1][layer, head], refs[2], n, raw_spectrum))
    row = {key: res[key] for key in HEAD_COLUMNS if key in res and key != "length"}
    if pe_in is not None:
        s_pe, sources, pe_span = pe_in
        row.update(pe_spectrum_correlations(
            s_pe[layer, head], {k: v[layer, head] for k, v in sources.items()},
            pe_span, raw_spectrum=raw_spectrum))
    return row


def _peak_rows(base: dict, res: dict) -> list[dict]:
    return [{**base, "rank": rank + 1, "omega": res["peaks"][rank],
             "magnitude": res["peak_magnitude"][rank],
             **{key: res[key][rank] for key in ("significant", *PER_PEAK)}}
            for rank in range(res["n_peaks_found"])]


def spectral_table(
    g: Float[np.ndarray, "layer head_index lag"], r2_pooled: Float[np.ndarray, "layer head_index"],
    thetas: Float[np.ndarray, " pair"] | None, length: int, *,
    usage: Float[np.ndarray, "layer head_index pair"] | None = None,
    gate_met: bool | None = None, force: bool = False, raw_spectrum: bool = False,
    demean: bool = False, s_pe: Float[np.ndarray, "layer head_index pe_lag"] | None = None,
    g_sources: dict[str, np.ndarray] | None = None, model: str = "", dataset: str = "",
    pe: str = "", source: str = "", n_null: int = N_NULL, seed: int = 0,
    alpha: float = ALPHA, tau_rel: float = TAU_REL, explore: bool = True,
    magnitudes: dict | None = None, two_sided: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One condition, one g source: (heads table, one row per layer × head; peaks table, one
    row per peak). ``gate_met`` is the caller's gate (True/False; None = no gate applies);
    statuses as in the module docstring (``explore=False``: heads outside the pre-registered
    analysis are skipped instead of analysed). With ``s_pe`` (learned absolute PE) each
    analysed head also gets :func:`pe_spectrum_correlations` against ``g_sources``. Every head
    is analysed on its own (per-head null, same seed). ``magnitudes``, when given a dict,
    receives ``"spectrum"`` (the processed |ĝ| [layer, head_index, freq], NaN for non-finite
    g) and ``"omega"``. ``two_sided``: g and ``g_sources`` run over signed lags
    Δ = −(T−1)..T−1 (a bidirectional model; ``length`` stays T), processed over their whole
    span; so does ``s_pe`` where it is two-sided, and an ``s_pe`` over Δ = 1..T−1 only is
    compared with the sources' Δ = 1..T−1 halves."""
    g = np.asarray(g, np.float64)
    r2 = np.asarray(r2_pooled, np.float64)
    L, H = g.shape[:2]
    n = span(length, two_sided)
    th, use = usable_thetas(thetas, usage)
    finite = np.isfinite(g).all(-1)
    mags = spectrum(np.where(finite[..., None], g, 0.0), n, raw_spectrum=raw_spectrum,
                    demean=demean)
    refs = _batch_references(g, th, use, length, raw_spectrum, demean, two_sided)
    pe_in = None if s_pe is None else _pe_inputs(s_pe, g_sources, length, two_sided)
    heads, peak_rows = [], []
    for layer in range(L):
        for head in range(H):
            base = {"model": model, "dataset": dataset, "length": length, "layer": layer,
                    "head": head}
            status = head_status(r2[layer, head], bool(finite[layer, head]), gate_met, force,
                                 explore)
            row = {**base, "pe": pe, "source": source, "R2_pooled": r2[layer, head],
                   "gate_met": gate_met, "forced": force, "status": status,
                   "analysed": not status.startswith("skipped"),
                   "preregistered": status == "gated", "raw_spectrum": raw_spectrum}
            if row["analysed"]:
                res = align_spectrum(mags[layer, head], th, n, raw_spectrum=raw_spectrum,
                                     n_peaks=N_PEAKS, tau_rel=tau_rel, n_null=n_null,
                                     seed=seed, alpha=alpha, precision_bins=PRECISION_BINS)
                row.update(_head_scores(res, mags, refs, pe_in, layer, head, n,
                                        raw_spectrum))
                peak_rows += _peak_rows(base, res)
            heads.append(row)
    if magnitudes is not None:
        magnitudes.update(spectrum=np.where(finite[..., None], mags, np.nan),
                          omega=frequency_grid(n))
    return _tables(heads, peak_rows)


def layer_groups(spec, length: int) -> list[tuple[list[int], np.ndarray | None, int, str]]:
    """The layers that share a positional scheme, as the spectral analysis takes them:
    ``(layers, θ, span, pe)`` with θ the group's own rotary frequencies (None for NoPE
    layers, which get the NoPE criterion), span the offsets its mask keeps plus one (T, or
    a sliding window's width) and pe its scheme. One group for a model whose layers agree
    (and for a result saved before layers were described)."""
    if spec.layers is None:
        return [(list(range(spec.n_layers)), spec.rotary_frequencies(), length, spec.pe or "")]
    lags = Geometry.of(spec, length).lags
    groups: dict = {}
    for layer, (s, m) in enumerate(zip(spec.layers, lags)):
        groups.setdefault((s.inv_freq, m + 1, s.pe), []).append(layer)
    return [(layers, None if f is None else np.asarray(f, np.float64), n, pe)
            for (f, n, pe), layers in groups.items()]


def spectral_table_by_layers(g, r2_pooled, spec, length: int, *, usage=None, s_pe=None,
                             g_sources: dict | None = None, magnitudes: dict | None = None,
                             **kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`spectral_table` for each of :func:`layer_groups` on its own θ and over the
    offsets its mask keeps (a sliding-window layer of width w is analysed as g(1..w−1),
    like a condition of length w), the rows joined in layer order with ``length`` = T.
    ``magnitudes`` receives every layer's spectrum on the condition's grid (a window's
    spectrum interpolated onto it, for display)."""
    tables, peaks, spectra = [], [], {}
    omega = frequency_grid(span(length, kwargs.get("two_sided", False)))
    for layers, theta, n, pe in layer_groups(spec, length):
        def part(x, layers=layers, n=n):  # the group's layers (and kept lags) of an array
            if x is None:
                return None
            x = np.asarray(x)[layers]
            return x if n == length or x.ndim < 3 else x[..., :n - 1]

        mags: dict = {}
        t, p = spectral_table(part(g), part(r2_pooled), theta, n, usage=part(usage),
                              s_pe=part(s_pe), magnitudes=mags,
                              g_sources=None if g_sources is None else
                              {k: part(v) for k, v in g_sources.items()},
                              **{**kwargs, "pe": pe or kwargs.get("pe", "")})
        for frame in (t, p):
            frame["layer"] = np.asarray(layers)[frame["layer"].to_numpy(int)]
            frame["length"] = length
        tables.append(t)
        peaks.append(p)
        for i, layer in enumerate(layers):
            row = mags["spectrum"][i]
            spectra[layer] = row if n == length else np.stack(
                [np.interp(omega, mags["omega"], r) for r in row])
    if magnitudes is not None:
        magnitudes.update(spectrum=np.stack([spectra[L] for L in sorted(spectra)]),
                          omega=omega)
    join = lambda frames: pd.concat(frames, ignore_index=True).sort_values(
        ["layer", "head"], kind="stable", ignore_index=True)
    return join(tables), join(peaks)


def _tables(heads: list[dict], peak_rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    table = pd.DataFrame(heads).reindex(columns=HEAD_COLUMNS)
    for col in ("aligned", "criterion_met"):
        table[col] = table[col].astype("boolean")
    table["aligned"] = table["aligned"].where(table["analysed"], pd.NA)
    return table, pd.DataFrame(peak_rows, columns=PEAK_COLUMNS)

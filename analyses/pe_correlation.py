"""S_PE against the measured g(Δ): per head, the head-projected positional kernel
(:mod:`poskernel_tl.measurement.pe_kernel`) against Track A's pooled g, the raw Gram's g and the
centered Gram's g, over both signs of Δ for a bidirectional model.

Two numbers per g source:

* ``r_pe_<source>``: Pearson's r between the power spectra, processed as
  :func:`poskernel_tl.analyses.spectral.align.pe_spectrum_correlations` does (detrended,
  tapered, compared above 2π/span): the number the spectral table reports for an analysed
  head, here for every head;
* ``corr_pe_<source>``: Pearson's r between S_PE(Δ) and g(Δ) themselves, over the lags
  the fits read.

For a causal model both run over Δ = 1..T−1. For a bidirectional one (``s_pe_back``
given, and the source's g on the other side too) they run over both signs: the spectra
over Δ = −(T−1)..T−1 with Δ = 0 bridged by the mean of the values at ±1, as the spectral
analysis does (:func:`~poskernel_tl.analyses.spectral.processing.two_sided_for_spectrum`;
the diagonal, where a token meets itself, is no shift-invariant value), the direct r over
the 2T − 2 lags Δ ≠ 0 (:func:`signed_lags`). Where the g of the other side is missing (a
result saved before both triangles were fitted) the source falls back to Δ > 0, and
``two_sided_<source>`` says so.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.spectral.align import pe_spectrum_correlations
from poskernel_tl.analyses.spectral.processing import pearson, span, two_sided_for_spectrum
from poskernel_tl.errors import UserError
from poskernel_tl.plan.config import option
from poskernel_tl.schema import head_index_columns

# g source → the ConditionResult fields of its forward and back arrays
SOURCES = {"trackA_pooled": ("g_pooled", "g_pooled_back"),
           "gram_raw": ("g_gram_raw", "g_gram_raw_back"),
           "gram_centered": ("g_gram", "g_gram_back")}


def signed_lags(forward: Float[np.ndarray, "*batch lag"],
                back: Float[np.ndarray, "*batch lag"] | None = None
                ) -> Float[np.ndarray, "*batch signed_lag"]:
    """``forward`` (Δ = 1..T−1) alone, or preceded by ``back`` reversed
    (Δ = −(T−1)..−1): the lags Δ ≠ 0."""
    forward = np.asarray(forward, np.float64)
    if back is None:
        return forward
    back = np.asarray(back, np.float64)
    if back.shape != forward.shape:
        raise UserError(f"back {back.shape} and forward {forward.shape} arrays differ")
    return np.concatenate([back[..., ::-1], forward], -1)


def pe_correlations(
    s_pe: Float[np.ndarray, "layer head_index lag"], g_sources: dict[str, np.ndarray], *,
    s_pe_back: Float[np.ndarray, "layer head_index lag"] | None = None,
    g_back: dict[str, np.ndarray | None] | None = None, raw_spectrum: bool = False,
) -> dict[str, Float[np.ndarray, "layer head_index"]]:
    """Per head, ``r_pe_<source>`` and ``corr_pe_<source>`` (module docstring) for each
    g source [layer, head_index, lag], plus ``two_sided_<source>`` (1.0 where both signs
    of Δ were used)."""
    g_back = g_back or {}
    L, H, lags = s_pe.shape
    out = {}
    for name, g in g_sources.items():
        back = g_back.get(name) if s_pe_back is not None else None
        both = back is not None
        g = np.asarray(g, np.float64)
        if g.shape != s_pe.shape:
            raise UserError(f"g source {name!r} has shape {g.shape}; S_PE has {s_pe.shape}")
        ref, arr = signed_lags(s_pe, s_pe_back if both else None), signed_lags(g, back)
        spec_ref, spec_arr = (two_sided_for_spectrum(s_pe, s_pe_back),
                              two_sided_for_spectrum(g, back)) if both else (s_pe, g)
        n = span(lags + 1, both)
        r_spec, r_lag = np.full((L, H), np.nan), np.full((L, H), np.nan)
        for layer in range(L):
            for head in range(H):
                r_spec[layer, head] = pe_spectrum_correlations(
                    spec_ref[layer, head], {name: spec_arr[layer, head]}, n,
                    raw_spectrum=raw_spectrum)[f"r_pe_{name}"]
                r_lag[layer, head] = pearson(ref[layer, head], arr[layer, head])
        out[f"r_pe_{name}"], out[f"corr_pe_{name}"] = r_spec, r_lag
        out[f"two_sided_{name}"] = np.full((L, H), float(both))
    return out


def pe_correlation_table(result, *, raw_spectrum: bool = False) -> pd.DataFrame:
    """:func:`pe_correlations` of a :class:`~poskernel_tl.measurement.result.ConditionResult` with
    S_PE (learned absolute positions): one row per (layer, head)."""
    if getattr(result, "s_pe", None) is None:
        raise UserError(f"{result.model}: no S_PE in this condition (learned absolute "
                        "positions only, measured without compatibility mode)")
    field = lambda name: getattr(result, name, None)
    corr = pe_correlations(
        result.s_pe, {k: field(v[0]) for k, v in SOURCES.items()},
        s_pe_back=field("s_pe_back"), g_back={k: field(v[1]) for k, v in SOURCES.items()},
        raw_spectrum=raw_spectrum)
    L, H = result.s_pe.shape[:2]
    table = pd.DataFrame(head_index_columns(L, H))
    for name, values in corr.items():
        table[name] = values.ravel().astype(bool) if name.startswith("two_sided") \
            else values.ravel()
    return table


@dataclass(frozen=True)
class PECorrelationOptions:
    raw_spectrum: bool = option(False, "the literal spectra (mean kept, no taper) instead of "
                                       "the detrended, tapered ones")


SPEC = AnalysisSpec(
    order=90,  # (where it is listed)
    bidirectional=True,
    name="pe-correlation", title="S_PE against g(Δ)", options=PECorrelationOptions,
    compute=lambda inputs, options: pe_correlation_table(
        inputs.result, raw_spectrum=options.raw_spectrum),
    needs_model=False, needs_result=True,
    columns=tuple(f"{kind}_pe_{s}" for s in SOURCES for kind in ("r", "corr")),
    head_rows=(("corr_pe_trackA_pooled", "r(S_PE, Track A g)"),
               ("corr_pe_gram_centered", "r(S_PE, centered Gram g)")),
    guide="For a learned-absolute-PE model, how closely each head's g(Δ) follows its "
          "head-projected position table S_PE(Δ), over both signs of Δ for an encoder.")


__all__ = ["SOURCES", "SPEC", "PECorrelationOptions", "pe_correlation_table",
           "pe_correlations", "signed_lags"]

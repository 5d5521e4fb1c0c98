"""The analysis registry: every analysis's :class:`~poskernel_tl.analyses.base.AnalysisSpec`
by name. ``poskernel analyze NAME`` (its subcommands and flags), the grid's
``--analyses`` and the report iterate over :data:`REGISTRY`.

Adding an analysis: write ``analyses/my_analysis.py`` with a compute function and a
``SPEC`` (see ``base.py``), and add it to :data:`REGISTRY` below.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.analyses import (
    fourier_kernel,
    freq_usage,
    gk_baseline,
    kernel_patching,
    mean_field,
    pe_correlation,
    qig_kernel,
    separable,
    sequence_pca,
    spectral,
)
from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.config import option
from poskernel_tl.errors import ResultFileError, UnknownNameError
from poskernel_tl.result import ConditionResult


def folder_gate(out: str | Path | None, result: ConditionResult) -> bool | None:
    """The protocol's gate over every rotary condition saved under ``out`` (and
    ``result``): mean pooled Track A R² of the early-layer heads > the gate threshold.
    None without rotary conditions. Reads only the other conditions' spec and pooled
    R² column, so it stays cheap on a large grid."""
    early = [result.r2_pooled[protocol.early_layers(result.n_layers)].ravel()] \
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
    if not early:
        return None
    return bool(np.nanmean(np.concatenate(early)) > protocol.GATE_THRESHOLD)


@dataclass(frozen=True)
class SpectralOptions:
    force: bool = option(False, "analyse all heads, ignoring the gate (labelled ungated)")
    raw_spectrum: bool = option(False, "the literal spectrum (mean kept, no taper) instead "
                                       "of the detrended, tapered one; for comparison only")
    demean: bool = option(False, "with --raw-spectrum: remove g's mean before the FFT")


def _spectral(inputs: AnalysisInputs, options: SpectralOptions) -> dict[str, pd.DataFrame]:
    """Spectral alignment of g(Δ) with the positional-encoding frequencies for both g
    sources, gated over every rotary condition saved beside this one; the spectral
    module writes its tables and spectra itself (``spectral_io``), so none is returned."""
    spectral.run_spectral(
        inputs.result, Path(inputs.out) if inputs.out is not None else None,
        force=options.force, raw_spectrum=options.raw_spectrum,
        demean=options.demean, gate_met=folder_gate(inputs.out, inputs.result))
    return {}


SPECTRAL = AnalysisSpec(
    bidirectional=True,
    name="spectral", title="Spectral alignment", compute=_spectral, options=SpectralOptions,
    needs_model=False, needs_result=True, file=C.SPECTRAL_CSV,
    columns=("analysed", "aligned", "frac_matched"),
    head_rows=(("frac_matched", "fraction of top peaks matched to a θᵢ"),
               ("p_value", "alignment p-value")),
    guide="The DFT of g(Δ) against the positional-encoding frequencies θᵢ: peaks that are "
          "significant and lie within the matching tolerance of a θᵢ.")

REGISTRY: dict[str, AnalysisSpec] = {s.name: s for s in (
    SPECTRAL, freq_usage.SPEC, gk_baseline.SPEC, fourier_kernel.SPEC, sequence_pca.SPEC,
    qig_kernel.SPEC, kernel_patching.SPEC, separable.SPEC, mean_field.SPEC,
    pe_correlation.SPEC)}


def get(name: str) -> AnalysisSpec:
    """The spec of analysis ``name`` (an UnknownNameError lists the valid names)."""
    if name not in REGISTRY:
        raise UnknownNameError(f"unknown analysis {name!r}; choose one of "
                               f"{', '.join(REGISTRY)}")
    return REGISTRY[name]


def read_table(spec: AnalysisSpec, out: str | Path, model: str, dataset: str,
               length: int) -> pd.DataFrame | None:
    """The saved table of ``spec`` for a condition, None when it was not run; a
    ResultFileError names the file when it cannot be read or lacks the spec's columns."""
    path = C.result_path(out, model, dataset, length, spec.suffix)
    if not path.exists():
        return None
    try:
        table = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ResultFileError(f"{path}: unreadable ({err})") from err
    missing = [c for c in spec.columns if c not in table.columns]
    if missing:
        raise ResultFileError(f"{path}: lacks columns {missing}")
    return table

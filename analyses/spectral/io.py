"""The spectral analysis' files, written once per condition and read by the report.

Under ``DIR/results/`` (``{stem}`` = ``{model}_{dataset}_{T}``):

- ``{stem}_spectral.csv`` / ``{stem}_spectral_peaks.csv``: Track B's g (the pre-registered
  analysis), one row per head / per peak;
- ``{stem}_spectral_trackA.csv`` / ``{stem}_spectral_trackA_peaks.csv``: Track A's pooled g
  (exploratory), same columns;
- ``{stem}_spectral_spectra.npz``: ``omega`` [freq], ``trackB`` and ``trackA`` [layer,
  head_index, freq] (|ĝ| as analysed, float32, NaN where g was not finite) and ``thetas``
  (empty without rotary PE). Written last: its presence marks a complete analysis. For a
  bidirectional model g is two-sided and the spectra have 4T + 1 frequencies (``omega``
  says which grid), else 2T + 1.

:func:`read_spectral` reads them back and checks them; it never raises for a missing or
damaged file: it says which source is missing and what is wrong with which file.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl import constants as C
from poskernel_tl.io import csv_flag, read_csv_checked, save_csv, save_npz

SOURCES = ("trackB", "trackA")
FILES = {"trackB": (C.SPECTRAL_CSV, C.SPECTRAL_PEAKS_CSV),
         "trackA": ("spectral_trackA.csv", "spectral_trackA_peaks.csv")}
SPECTRA = "spectral_spectra.npz"
LABELS = {"trackB": "Track B centered g (pre-registered)",
          "trackA": "Track A pooled g (exploratory)"}
NEEDED = ("layer", "head", "status", "analysed", "preregistered", "aligned", "fpr",
          "n_significant", "n_matched", "frac_matched", "chance", "p_value", "gate_met",
          "source")
PEAK_NEEDED = ("layer", "head", "rank", "omega", "magnitude", "significant", "matched",
               "nearest_theta", "rel_error")


def paths(out, model: str, dataset: str, length: int) -> dict[str, Path]:
    """Every file of the analysis, by role (``trackB``, ``trackB_peaks``, …, ``spectra``)."""
    path = lambda suffix: C.result_path(out, model, dataset, length, suffix)
    found = {}
    for source, (table, peaks) in FILES.items():
        found[source], found[f"{source}_peaks"] = path(table), path(peaks)
    found["spectra"] = path(SPECTRA)
    return found


def write_spectral(out, model: str, dataset: str, length: int, sources: dict,
                   omega: Float[np.ndarray, " freq"], thetas: Float[np.ndarray, " pair"] | None
                   ) -> dict[str, Path]:
    """Write ``sources`` (``{"trackB": (table, peaks, spectra), "trackA": …}``) and the
    spectra file (last)."""
    where = paths(out, model, dataset, length)
    written = {}
    for source, (table, peaks, _) in sources.items():
        written[source] = save_csv(table, where[source])
        written[f"{source}_peaks"] = save_csv(peaks, where[f"{source}_peaks"])
    arrays = {source: np.asarray(mags, np.float32) for source, (_, _, mags) in sources.items()}
    written["spectra"] = save_npz(where["spectra"], omega=np.asarray(omega, np.float64),
                                  thetas=np.zeros(0) if thetas is None else
                                  np.asarray(thetas, np.float64), **arrays)
    return written


@dataclass
class SavedSpectral:
    """One condition's spectral files as read: per source (``trackB``, ``trackA``) the head
    table, the peak table and the spectra [layer, head_index, freq]; ``omega`` the
    frequency grid. ``missing``: sources whose files do not exist (not run);
    ``problems``: ``(file name, reason)`` for files that exist but cannot be used."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    peaks: dict[str, pd.DataFrame] = field(default_factory=dict)
    spectra: dict[str, np.ndarray] = field(default_factory=dict)
    omega: np.ndarray | None = None
    missing: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def has(self, source: str) -> bool:
        return source in self.tables and source in self.spectra

    def head(self, source: str, layer: int, head: int) -> dict | None:
        """One head's row of ``source`` as a dict (None when not available)."""
        if source not in self.tables:
            return None
        t = self.tables[source]
        row = t[(t["layer"] == layer) & (t["head"] == head)]
        return None if row.empty else row.iloc[0].to_dict()


def _read_csv(path: Path, needed: tuple[str, ...], n_rows: int | None):
    df, why = read_csv_checked(path, needed,
                               " (written by an older version: rerun poskernel spectral)")
    if df is None:
        return None, why
    if n_rows is not None and len(df) != n_rows:
        return None, f"has {len(df)} rows, expected {n_rows}"
    return df, ""


def _read_source(saved: SavedSpectral, where: dict, source: str, L: int, H: int) -> None:
    table_path, peaks_path = where[source], where[f"{source}_peaks"]
    if not table_path.exists():
        saved.missing.append(source)
        return
    table, why = _read_csv(table_path, NEEDED, L * H)
    if table is None:
        saved.problems.append((table_path.name, why))
        return
    if not peaks_path.exists():
        saved.problems.append((peaks_path.name, "missing"))
        return
    peaks, why = _read_csv(peaks_path, PEAK_NEEDED, None)
    if peaks is None:
        saved.problems.append((peaks_path.name, why))
        return
    for col in ("analysed", "preregistered", "aligned", "criterion_met"):
        if col in table:
            table[col] = csv_flag(table[col])
    for col in ("significant", "matched", "marginal"):
        if col in peaks:
            peaks[col] = csv_flag(peaks[col]).fillna(0.0).astype(bool)
    saved.tables[source] = table.sort_values(["layer", "head"]).reset_index(drop=True)
    saved.peaks[source] = peaks.sort_values(["layer", "head", "rank"]).reset_index(drop=True)


def _read_spectra(saved: SavedSpectral, path: Path, L: int, H: int, length: int) -> None:
    if not path.exists():
        if saved.tables:
            saved.problems.append((path.name, "missing (the analysis did not finish: rerun "
                                              "poskernel spectral)"))
        return
    grids = (2 * length + 1, 4 * length + 1)  # g over Δ = 1..T−1, or two-sided
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as err:
        saved.problems.append((path.name, f"unreadable ({type(err).__name__})"))
        return
    omega = arrays.get("omega")
    if omega is None or omega.ndim != 1 or len(omega) not in grids:
        saved.problems.append((path.name, f"omega missing or not of length {grids[0]} "
                                          f"(or {grids[1]}: two-sided g)"))
        return
    n_freq = len(omega)
    saved.omega = omega
    for source in list(saved.tables):
        mags = arrays.get(source)
        if mags is None or mags.shape != (L, H, n_freq):
            saved.problems.append((path.name, f"{source} missing or not [{L}, {H}, {n_freq}]"))
            saved.tables.pop(source)
            continue
        saved.spectra[source] = mags


def read_spectral(out, model: str, dataset: str, length: int, n_layers: int,
                  n_heads: int) -> SavedSpectral:
    """The condition's spectral files (see :class:`SavedSpectral`); never raises for a file."""
    where = paths(out, model, dataset, length)
    saved = SavedSpectral()
    for source in SOURCES:
        _read_source(saved, where, source, n_layers, n_heads)
    _read_spectra(saved, where["spectra"], n_layers, n_heads, length)
    return saved


__all__ = ["FILES", "LABELS", "SOURCES", "SPECTRA", "SavedSpectral", "paths", "read_spectral",
           "write_spectral"]

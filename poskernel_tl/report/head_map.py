"""The head map: every head of every condition as one row of one table, and the report's
scatter of it (``data/head_map.js``, drawn by ``static/headmap.js``).

The table is assembled from the per-head numbers the report already reads, nothing is
refitted: the condition's R² grids (the values of ``trackA.csv``/``trackB.csv``), its
``heads.csv`` (kernel descriptors and class, TransformerLens's previous-token score),
``bands.csv`` (R² by offset band, one column per band), the spectral tables (per source:
alignment, p-value, fraction of peaks matched), the permutation null's per-head percentile
and the further analyses' per-head columns. Missing files leave their columns empty (NaN)
for that condition. Numeric columns can be chosen for the axes and the colour; categorical
ones (model, dataset, length, layer kind, kernel class) for the colour and the filters.
"""

import os
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.analyses.spectral.io import read_spectral
from poskernel_tl.encode import typed
from poskernel_tl.measurement.parts import head_labels
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import extras, nulls
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.html import json_for_script, write_page
from poskernel_tl.report.tables import dataset_label
from poskernel_tl.report.viewer_data import DATA_DIR, condition_key

MAP_FILE = "head_map.js"
GLOBAL = "PK_HEAD_MAP"
KEYS = ["model", "dataset", "length", "layer", "head"]
CATEGORICAL = ("model", "dataset", "length", "kind", "kernel_class")
FILTERS = ("model", "dataset", "length", "kind")  # the map's filters
LABELS = {"R2_pooled": "Track A pooled R²", "R2_nosink": "Track A R², sink column left out",
          "R2_gram": "Track B R² (centered)", "R2_gram_raw": "Track B R² (raw Gram)",
          "depth": "relative depth (layer / (layers − 1))", "kind": "layer kind",
          "kernel_class": "kernel class", "null_percentile": "percentile in the permutation null",
          "prev_share": "previous-token share", "sink_share": "sink share",
          "null_max": "R² of the null (max)", "peak_lag": "peak lag Δ", "width": "local width",
          "decay_slope": "decay slope over ln Δ", "periodic_share": "periodic share",
          **head_labels()}  # every declared per-head column
SPECTRAL_COLS = ("aligned", "p_value", "frac_matched")


def _base(r: ConditionResult) -> pd.DataFrame:
    L, H = r.n_layers, r.n_heads
    kinds = [s.kind for s in r.spec.layers or ()] or [r.spec.pe or ""] * L
    layer, head = np.repeat(np.arange(L), H), np.tile(np.arange(H), L)
    gram = r.r2_gram if r.centered else np.full((L, H), np.nan)
    return pd.DataFrame({
        "model": r.model, "dataset": r.dataset, "length": int(r.length), "layer": layer,
        "head": head, "kind": np.repeat(kinds, H), "depth": layer / max(L - 1, 1),
        "R2_pooled": np.ravel(r.r2_pooled), "R2_nosink": np.ravel(r.r2_pooled_nosink),
        "R2_gram": np.ravel(gram), "R2_gram_raw": np.ravel(r.r2_gram_raw)})


def _bands(bands: pd.DataFrame | None) -> pd.DataFrame | None:
    if bands is None or bands.empty:
        return None
    b = bands.assign(band=[f"R2_band_{lo}-{hi}" for lo, hi in
                           zip(bands["band_lo"], bands["band_hi"])])
    return b.pivot_table(index=["layer", "head"], columns="band", values="R2_pooled",
                         sort=False).reset_index()


def condition_heads(r: ConditionResult, heads: pd.DataFrame | None = None,
                    bands: pd.DataFrame | None = None, spectral: dict | None = None,
                    extras: dict | None = None) -> pd.DataFrame:
    """One row per head of one condition (see the module docstring): ``heads`` and
    ``bands`` the condition's tables, ``spectral`` source → head table, ``extras``
    analysis name → :class:`~poskernel_tl.report.extras.Loaded`."""
    out = _base(r)
    parts = []
    if heads is not None and not heads.empty:
        parts.append(heads.drop(columns=[c for c in ("model", "dataset", "length", "R2_pooled")
                                         if c in heads.columns]))
    if (b := _bands(bands)) is not None:
        parts.append(b)
    null = nulls.head_null_table(r)
    if null is not None:
        parts.append(null[["layer", "head", "percentile"]].rename(
            columns={"percentile": "null_percentile"}))
    for source, t in (spectral or {}).items():
        cols = [c for c in SPECTRAL_COLS if c in t.columns]
        parts.append(t[["layer", "head", *cols]].rename(
            columns={c: f"spectral_{source}_{c}" for c in cols}))
    for name, item in (extras or {}).items():
        t = getattr(item, "table", None)
        if t is None:
            continue
        cols = [c for c, _ in item.analysis.head_rows if c in t.columns]
        parts.append(t[["layer", "head", *cols]].rename(columns={c: f"{name}:{c}" for c in cols}))
    for p in parts:
        p = p.drop_duplicates(["layer", "head"]).astype({"layer": int, "head": int})
        out = out.merge(p, on=["layer", "head"], how="left", suffixes=("", "_dup"))
    return out[[c for c in out.columns if not c.endswith("_dup")]]


def _read(results_dir: Path, r: ConditionResult, suffix: str) -> pd.DataFrame | None:
    path = C.result_path(results_dir, r.model, r.dataset, r.length, suffix)
    try:
        return pd.read_csv(path) if path.is_file() else None
    except (OSError, ValueError):
        return None


def head_table(results_dir: str | os.PathLike, conds) -> pd.DataFrame:
    """The table of every head of the report's conditions (each a
    :class:`~poskernel_tl.report.collect.SavedCondition`), read from their saved tables."""
    frames = []
    for c in conds:
        r = c.result
        frames.append(condition_heads(
            r, _read(Path(results_dir), r, C.HEADS_CSV), _read(Path(results_dir), r, C.BANDS_CSV),
            dict(c.spectral.tables), c.extras))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=KEYS)


def results_table(results) -> pd.DataFrame:
    """The head table of ``results``: a results folder (its saved tables, as the report
    reads them), a list of :class:`ConditionResult` (their tables in memory), one of
    them, or a table made earlier (returned as it is)."""
    if isinstance(results, pd.DataFrame):
        return results
    if isinstance(results, str | os.PathLike):  # the files, as the report reads them
        folder = ConditionResult.folder(results)
        conds = []
        for key in ConditionResult.conditions(folder):
            r = ConditionResult.load(folder, *key, lazy=True)
            conds.append(SavedCondition(r, read_spectral(folder, *key, r.n_layers, r.n_heads),
                                   extras.load_condition(folder, *key, r.n_layers, r.n_heads)))
        return head_table(folder, conds)
    if isinstance(results, ConditionResult):
        results = [results]
    frames = [condition_heads(r, r.kernels(), r.tables().get("bands")) for r in results]
    return pd.concat(frames, ignore_index=True)


def columns(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(numeric columns, categorical columns) of the table a map can choose from."""
    cat = [c for c in CATEGORICAL if c in table.columns]
    num = [c for c in table.columns if c not in cat and c not in KEYS[:3]
           and (pd.api.types.is_numeric_dtype(table[c]) or _flags(table[c]) is not None)]
    return num, cat


def _flags(col: pd.Series) -> pd.Series | None:
    """A column of True/False (and missing) values as 1.0/0.0/NaN; None for any other."""
    values = set(col.dropna().unique().tolist())
    if not values or not values <= {True, False, "True", "False"}:
        return None
    return col.map(lambda v: np.nan if pd.isna(v) else float(v in (True, "True")))


def _floats(col: pd.Series) -> np.ndarray:
    flags = None if pd.api.types.is_numeric_dtype(col) else _flags(col)
    return (col if flags is None else flags).to_numpy(np.float32, na_value=np.nan)


def map_payload(table: pd.DataFrame) -> dict:
    """The map's data: numeric columns as float32 arrays, categorical ones as levels and
    codes, each head's permalink anchor (condition key, layer, head) by condition code."""
    num, cat = columns(table)
    keys = [condition_key(m, d, t) for m, d, t in
            zip(table["model"], table["dataset"], table["length"])]
    cond_levels, cond_codes = np.unique(np.array(keys, dtype=object), return_inverse=True)
    cats = {}
    for c in cat:
        values = table[c].map(dataset_label if c == "dataset" else str)
        levels, codes = np.unique(values.to_numpy(dtype=str), return_inverse=True)
        cats[c] = {"levels": [str(v) for v in levels], "codes": typed(codes, "u2")}
    return {"n": len(table), "labels": {c: LABELS.get(c, c) for c in num + cat},
            "numeric": {c: typed(_floats(table[c]), "f4") for c in num},
            "categorical": cats, "filters": [c for c in FILTERS if c in cats],
            "conditions": [str(k) for k in cond_levels], "cond": typed(cond_codes, "u2"),
            "layer": typed(table["layer"].to_numpy(np.int64), "u2"),
            "head": typed(table["head"].to_numpy(np.int64), "u2")}


def write_map_data(out: str | os.PathLike, table: pd.DataFrame) -> Path:
    """Write ``data/head_map.js`` under the report folder ``out`` and return its path."""
    text = f"window.{GLOBAL} = {json_for_script(map_payload(table))};\n"
    return write_page(Path(out) / DATA_DIR / MAP_FILE, text)


def map_html() -> str:
    """The report's head-map block (the page loads ``data/head_map.js`` itself)."""
    return (f'<div id="pk-map" class="pk-viewer pk-map"></div>\n'
            f'<script src="{DATA_DIR}/{MAP_FILE}"></script>\n'
            '<script>PK.headMap("pk-map", window.PK_HEAD_MAP, true);</script>')


def section(results_dir: str | os.PathLike, conds, out: str | os.PathLike) -> str:
    """The report's head-map section; writes ``data/head_map.js`` and ``head_map.csv``
    (the table) under ``out``."""
    table = head_table(results_dir, conds)
    write_map_data(out, table)
    table.to_csv(Path(out) / "head_map.csv", index=False)
    return ("<h2>Head map — every head of every condition</h2>"
            f'<p class="pk-note">{len(table)} heads. Choose any per-head column for x, y and '
            "the colour, filter by model, dataset, length and layer kind; hover names the "
            "head, a click opens its view. The address keeps the axes and filters. Built "
            "from the per-head tables (Track A/B R², heads.csv, bands.csv, the spectral "
            "tables, the permutation null, the further analyses): "
            '<a href="head_map.csv">head_map.csv</a>.</p>' + map_html())


__all__ = ["GLOBAL", "MAP_FILE", "columns", "condition_heads", "head_table", "map_html",
           "map_payload", "results_table", "section", "write_map_data"]

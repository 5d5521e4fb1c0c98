"""Table 1 (Phase 6 of the protocol) and the per-condition summary the verdicts are computed from.

:func:`condition_summary` turns each :class:`~poskernel_tl.measurement.result.ConditionResult`
into one row of numbers (early-layer means, depth slope, Track A vs B, per-sequence spread, the
spectral outcome); :func:`table1` keeps the protocol's columns; :func:`write_table` writes any
such frame as CSV and Markdown. "Early" is layers 0–1, "late" layers 4+ (the protocol's
expected-results table); the depth slope is the least-squares slope of the per-layer mean
of Track A pooled R² over layer index, with its standard error.
"""

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy.stats import linregress

from poskernel_tl.data.datasets import TOKEN_DATASETS
from poskernel_tl.io import atomic_write, save_csv
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.protocol import EARLY_LAYERS, GATE_THRESHOLD, LATE_FROM
from poskernel_tl.report.html import cell_text

NATURAL_EXCLUDE = TOKEN_DATASETS  # datasets that are not natural text

Key = tuple[str, str, int]


def dataset_label(dataset: str) -> str:
    """A short dataset name for titles: ``text:PATH`` becomes ``text: <file name>``."""
    if dataset.startswith("text:"):
        name = Path(dataset[len("text:"):].rstrip("/\\")).name or "text"
        return f"text: {name if len(name) <= 32 else name[:31] + '…'}"
    return dataset if len(dataset) <= 40 else dataset[:39] + "…"


def key_of(r: ConditionResult) -> Key:
    return (r.model, r.dataset, int(r.length))


def _nanmean(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def _nanstd(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.nanstd(x, ddof=1)) if np.isfinite(x).sum() > 1 else float("nan")


def depth_slope(r2: Float[np.ndarray, "layer head_index"]) -> tuple[float, float, float]:
    """(slope, standard error, intercept) of the least-squares line through the per-layer
    mean R² against layer index; NaN with fewer than 3 layers."""
    y = np.array([_nanmean(row) for row in np.asarray(r2, np.float64)])
    x = np.arange(len(y), dtype=np.float64)
    ok = np.isfinite(y)
    if ok.sum() < 3:
        return float("nan"), float("nan"), float("nan")
    fit = linregress(x[ok], y[ok])
    return float(fit.slope), float(fit.stderr), float(fit.intercept)


def early(a: np.ndarray) -> np.ndarray:
    """The early layers (0–1) of an array with a leading layer axis."""
    return np.asarray(a)[[layer for layer in EARLY_LAYERS if layer < len(a)]]


def bucking_heads(r2: Float[np.ndarray, "layer head_index"], limit: int = 8
                  ) -> tuple[int, str]:
    """Heads past the early layers whose R² exceeds the early-layer mean: the protocol's
    heads that buck the depth decay (count, and the top ``limit`` as 'L5H2=0.71')."""
    ref = _nanmean(early(r2))
    later = np.asarray(r2, np.float64)[len(EARLY_LAYERS):]
    if not np.isfinite(ref) or not later.size:
        return 0, ""
    layers, heads = np.nonzero(np.nan_to_num(later, nan=-np.inf) > ref)
    vals = later[layers, heads]
    order = np.argsort(-vals)[:limit]
    text = ", ".join(f"L{layers[i] + len(EARLY_LAYERS)}H{heads[i]}={vals[i]:.2f}"
                     for i in order)
    return int(len(vals)), text


SPEC_EMPTY = {"spec_status": "not computed", "spec_n_analysed": 0, "spec_n_criterion_met": 0,
              "spec_n_aligned": 0, "spec_frac_matched_mean": float("nan"),
              "spec_chance_mean": float("nan"), "spec_gate_saved": None}
SOURCE_PREFIX = {"trackB": "specB_", "trackA": "specA_"}


def _flags(col: pd.Series) -> pd.Series:
    return pd.to_numeric(col, errors="coerce")


def source_numbers(table: pd.DataFrame | None, prefix: str) -> dict:
    """Exploratory numbers of one g source over the early-layer heads analysed: how many,
    the share aligned and the test's false-positive rate over the same heads."""
    out = {f"{prefix}n_early": 0, f"{prefix}aligned_early": float("nan"),
           f"{prefix}fpr_early": float("nan")}
    if table is None or not len(table):
        return out
    done = table[_flags(table["analysed"]).fillna(0).astype(bool)]
    early = done[done["layer"].isin(EARLY_LAYERS)]
    out[f"{prefix}n_early"] = len(early)
    out[f"{prefix}aligned_early"] = _nanmean(_flags(early["aligned"])) if len(early) else \
        float("nan")
    out[f"{prefix}fpr_early"] = _nanmean(_flags(early["fpr"])) if len(early) else float("nan")
    return out


def spectral_summary(tables: Mapping[str, pd.DataFrame] | None, pe: str | None) -> dict:
    """Per-condition spectral outcome from the saved per-head tables of each g source
    (``{"trackB": …, "trackA": …}``; None: not run): the pre-registered analysis (Track B
    rows with ``preregistered``) and, for both sources, the exploratory numbers
    (:func:`source_numbers`)."""
    out = dict(SPEC_EMPTY)
    tables = dict(tables or {})
    for source, prefix in SOURCE_PREFIX.items():
        out.update(source_numbers(tables.get(source), prefix))
    if pe != "rope":
        out["spec_status"] = "no rotary PE" if pe == "learned-absolute" else \
            "no PE frequencies" if pe == "none" else "not computed"
    table = tables.get("trackB")
    if table is None or not len(table):
        if pe == "rope":
            out["spec_status"] = "not run"
        return out
    gate = table["gate_met"].iloc[0] if "gate_met" in table else None
    out["spec_gate_saved"] = None if pd.isna(gate) else str(gate).strip().lower() == "true"
    done = table[_flags(table["preregistered"]).fillna(0).astype(bool)]
    if pe == "rope":
        out["spec_status"] = "computed" if len(done) else "not computed (gate)" \
            if out["spec_gate_saved"] is False else "no head with R2 > 0.40"
    if len(done):
        out.update(spec_n_analysed=len(done),
                   spec_n_criterion_met=int(_flags(done["criterion_met"]).fillna(0).sum()),
                   spec_n_aligned=int(_flags(done["aligned"]).fillna(0).sum()),
                   spec_frac_matched_mean=_nanmean(_flags(done["frac_matched"])),
                   spec_chance_mean=_nanmean(_flags(done["chance"])))
    return out


def condition_summary(results: Sequence[ConditionResult],
                      spectral: Mapping[Key, Mapping[str, pd.DataFrame]] | None = None
                      ) -> pd.DataFrame:
    """One row of numbers per condition (see the module docstring); ``spectral``: each
    condition's saved spectral tables by source (:func:`spectral_summary`)."""
    rows = []
    for r in results:
        r2 = np.asarray(r.r2_pooled, np.float64)
        slope, se, _ = depth_slope(r2)
        b = r.r2_gram if r.centered else np.full(r2.shape, np.nan)
        seq_std = np.nanstd(r.r2_per_seq, axis=0, ddof=1) if len(r.r2_per_seq) > 1 else \
            np.full(r2.shape, np.nan)
        n_buck, buck = bucking_heads(r2)
        e = early(r2)
        high = [(layer, h) for layer, h in zip(*np.nonzero(np.nan_to_num(e) >= 0.40))]
        rows.append({
            "model": r.model, "dataset": r.dataset, "length": int(r.length),
            "dataset_label": dataset_label(r.dataset), "pe": r.spec.pe, "norm": r.spec.norm,
            "loader": r.spec.loader, "causal": r.causal,
            "weights": str(r.provenance.get("weights", "")), "centered": bool(r.centered),
            "natural": r.dataset not in NATURAL_EXCLUDE, "n_seqs": len(r.seq_id),
            "n_layers": r.n_layers, "n_heads": r.n_heads, "n_kv_heads": r.spec.n_kv_heads,
            "A_early_mean": _nanmean(e), "A_early_std": _nanstd(e),
            "A_early_n": int(np.isfinite(e).sum()),
            "A_late_mean": _nanmean(r2[LATE_FROM:]) if r.n_layers > LATE_FROM else np.nan,
            "A_slope": slope, "A_slope_se": se,
            "B_centered_early": _nanmean(early(b)),
            "B_raw_early": _nanmean(early(r.r2_gram_raw)),
            "AB_diff_early": abs(_nanmean(e) - _nanmean(early(b))),
            "AB_absdiff_heads": _nanmean(np.abs(e - early(b))),
            "AB_raw_diff_early": abs(_nanmean(e) - _nanmean(early(r.r2_gram_raw))),
            "seq_std_early": _nanmean(early(seq_std)),
            "B_half_absdiff": _nanmean(np.abs(b - r.r2_gram_half)) if r.centered
            else float("nan"),
            "n_centering": int(r.n_centering), "n_centering_half": int(r.n_centering_half),
            "A_nosink_early": _nanmean(early(r.r2_pooled_nosink)),
            "A_nosink_all": _nanmean(r.r2_pooled_nosink), "A_all": _nanmean(r2),
            "A_rows_1_20": _nanmean(r.r2_pooled_early),
            "A_rows_50plus": _nanmean(r.r2_pooled_interior),
            "A_interior_keys": _nanmean(r.r2_pooled_interior_keys),
            "n_bucking": n_buck, "bucking_heads": buck,
            "n_early_ge_040": len(high),
            "early_ge_040": ", ".join(f"L{a}H{b_}={e[a, b_]:.2f}" for a, b_ in high[:8]),
            **spectral_summary(None if spectral is None else spectral.get(key_of(r)),
                               r.spec.pe)})
    return pd.DataFrame(rows)


def spectral_gate(summary: pd.DataFrame) -> tuple[float, bool | None]:
    """The protocol's gate: mean Track A pooled R² over every early-layer head of the rotary
    conditions (weighted by head count); (NaN, None) when no rotary model is present."""
    rope = summary[summary["pe"] == "rope"] if len(summary) else summary
    if not len(rope):
        return float("nan"), None
    w = rope["A_early_n"].to_numpy(np.float64) if "A_early_n" in rope else np.ones(len(rope))
    v = rope["A_early_mean"].to_numpy(np.float64)
    ok = np.isfinite(v) & (w > 0)
    if not ok.any():
        return float("nan"), None
    value = float((v[ok] * w[ok]).sum() / w[ok].sum())
    return value, bool(value > GATE_THRESHOLD)


def _pct(x) -> str:
    try:
        return "–" if not np.isfinite(float(x)) else f"{100 * float(x):.0f}%"
    except (TypeError, ValueError):
        return "–"


def spectral_cell(row: Mapping) -> str:
    status = row.get("spec_status", "not computed")
    explore = ""
    if row.get("specB_n_early") or row.get("specA_n_early"):
        b, a = (_pct(row.get(f"spec{x}_aligned_early")) for x in "BA")
        fb, fa = (_pct(row.get(f"spec{x}_fpr_early")) for x in "BA")
        explore = (f"; exploratory: early heads aligned, Track B {b} / Track A {a} "
                   f"(false-positive rate {fb} / {fa})")
    if status != "computed":
        return status + explore
    return (f"{row['spec_frac_matched_mean']:.2f} of top-5 peaks matched "
            f"(chance {row['spec_chance_mean']:.2f}); {row['spec_n_criterion_met']}/"
            f"{row['spec_n_analysed']} heads ≥ 50%, {row['spec_n_aligned']} aligned vs null"
            + explore)


TABLE1_COLUMNS = ["model", "dataset", "length", "A_early_mean", "A_early_std", "A_late_mean",
                  "A_slope", "A_slope_se", "B_centered_early", "AB_diff_early",
                  "spectral_alignment"]


def table1(summary: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the protocol: rows (model, dataset, length); Track A early-layer R² mean and std
    (across early-layer heads), late-layer (4+) mean, depth-decay slope ± SE, Track B
    centered early-layer mean (NaN for uncentered conditions), |A − B| at early layers,
    and the spectral alignment score or why it was not computed."""
    df = summary.copy()
    df["spectral_alignment"] = [spectral_cell(row) for row in df.to_dict("records")]
    return df.reindex(columns=TABLE1_COLUMNS).sort_values(
        ["model", "dataset", "length"], kind="stable").reset_index(drop=True)


def _f(x, fmt: str = "{:.3f}") -> str:
    try:
        return "–" if x is None or not np.isfinite(float(x)) else fmt.format(float(x))
    except (TypeError, ValueError):
        return str(x)


def table1_display(t1: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Table 1 with formatted cells (mean ± std, slope ± SE, uncentered rows noted)."""
    raw = {} if summary is None else {
        (s["model"], s["dataset"], s["length"]): s for s in summary.to_dict("records")}
    rows = []
    for r in t1.to_dict("records"):
        s = raw.get((r["model"], r["dataset"], r["length"]), {})
        b, ab = _f(r["B_centered_early"]), _f(r["AB_diff_early"])
        if s and not s.get("centered", True):
            b = f"uncentered (raw {_f(s['B_raw_early'])})"
            ab = f"– (vs raw {_f(s['AB_raw_diff_early'])})"
        two_sided = s and not s.get("causal", True)
        rows.append({
            "model": r["model"] + (" (bidirectional: both triangles)" if two_sided else ""),
            "dataset": dataset_label(r["dataset"]), "T": r["length"],
            "Track A early R² (mean ± std)": f"{_f(r['A_early_mean'])} ± "
                                            f"{_f(r['A_early_std'])}",
            f"Track A late R² (layers {LATE_FROM}+)": _f(r["A_late_mean"]),
            "depth slope (per layer ± SE)": f"{_f(r['A_slope'], '{:+.4f}')} ± "
                                            f"{_f(r['A_slope_se'], '{:.4f}')}",
            "Track B centered early R²": b, "|A − B| early": ab,
            "spectral alignment": r["spectral_alignment"]})
    return pd.DataFrame(rows)


def markdown_table(df: pd.DataFrame, floatfmt: str = "{:.4g}") -> str:
    """A pipe table (GitHub Markdown); '|' escaped, a '<' that could open a tag written as
    '&lt;' (no markup from a dataset name is ever rendered), newlines flattened."""
    def cell(v) -> str:
        return re.sub(r"<(?=[A-Za-z/!?])", "&lt;",
                      cell_text(v, floatfmt).replace("|", "\\|").replace("\n", " "))

    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(False)]
    return "\n".join([head, sep, *body]) + "\n"


def write_table(df: pd.DataFrame, stem: str | Path, display: pd.DataFrame | None = None,
                title: str = "") -> tuple[Path, Path]:
    """``stem.csv`` (the numbers) and ``stem.md`` (``display`` if given, else ``df``)."""
    stem = Path(stem)
    csv = save_csv(df, stem.parent / f"{stem.name}.csv")
    text = (f"# {title}\n\n" if title else "") + markdown_table(
        df if display is None else display)
    md = atomic_write(stem.parent / f"{stem.name}.md",
                      lambda p: p.write_text(text, encoding="utf-8"))
    return csv, md


__all__ = ["TABLE1_COLUMNS", "bucking_heads",
           "condition_summary", "dataset_label", "depth_slope", "early", "key_of",
           "markdown_table", "source_numbers", "spectral_gate", "spectral_summary", "table1",
           "table1_display", "write_table"]

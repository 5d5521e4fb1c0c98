"""Further analyses: the per-head tables of the registered analyses that declare per-layer
means (``AnalysisSpec.layer_means``) in the report and in the head views.

Each analysis writes ``results/{model}_{dataset}_{T}_{NAME}.csv`` (one row per layer and
head; see :func:`poskernel_tl.run.analyze.run_analysis`). For one condition,
:func:`load_condition` finds which of them exist and reads them; the columns this
module shows are checked, and a file that lacks them (or cannot be parsed, or names heads
the condition does not have) is kept as a note instead of a table. From there:

- :func:`report_section`: the report's section, per condition with any of the files each
  analysis' own figure (written through the caller's figure writer), a per-layer table of
  means and a status line per analysis (read / not run with the command / unreadable);
- :func:`viewer_tables`: every head's values from each file, or "not run" with the command
  that makes the file, as JSON-ready data for the head views (the "Further analyses" rows).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.registry import REGISTRY
from poskernel_tl.io import csv_flag, read_csv_checked
from poskernel_tl.report.figures import model_label
from poskernel_tl.report.html import esc, finite, number

OK, NOT_RUN, UNREADABLE = "ok", "not run", "unreadable"  # a file's status

def shown() -> tuple[AnalysisSpec, ...]:
    """The analyses this section shows: the registered ones with per-layer means (spectral
    has its own), read from the registry at each call."""
    return tuple(s for s in REGISTRY.values() if s.layer_means)


def section_title() -> str:
    return "Further analyses: " + ", ".join(a.title[:1].lower() + a.title[1:]
                                            for a in shown())


# --------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    """One analysis' CSV for one condition: ``table`` when it was read and has the needed
    columns; otherwise ``problem`` says why not ("" when the file does not exist)."""

    analysis: AnalysisSpec
    path: Path
    table: pd.DataFrame | None = None
    problem: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.table is not None:
            return OK
        return UNREADABLE if self.problem else NOT_RUN

    @property
    def exists(self) -> bool:
        return self.status != NOT_RUN


def read_table(analysis: AnalysisSpec, path: Path, n_layers: int | None = None,
               n_heads: int | None = None) -> Loaded:
    """Read and check one CSV (see :class:`Loaded`); never raises for a bad file."""
    out = Loaded(analysis, path)
    if not path.is_file():
        return out
    needed = ("layer", "head", *analysis.columns)
    df, out.problem = read_csv_checked(path, needed)
    if df is None:
        return out
    if df.empty:
        out.problem = "no rows"
        return out
    for col in needed:
        values = pd.to_numeric(df[col], errors="coerce")
        if (values.isna() & df[col].notna()).any():
            out.problem = f"column {col} is not numeric"
            return out
        df[col] = values.astype(np.float64)
    idx = df[["layer", "head"]].to_numpy()
    if not (np.isfinite(idx).all() and (idx >= 0).all() and (idx == np.round(idx)).all()):
        out.problem = "layer and head must be non-negative integers"
        return out
    df["layer"], df["head"] = df["layer"].astype(int), df["head"].astype(int)
    if (n_layers is not None and df["layer"].max() >= n_layers) or \
            (n_heads is not None and df["head"].max() >= n_heads):
        out.problem = (f"rows for heads this condition does not have (it has {n_layers} "
                       f"layers × {n_heads} heads)")
        return out
    dup = df.duplicated(["layer", "head"])
    if dup.any():
        out.notes.append(f"{int(dup.sum())} duplicate (layer, head) rows: the first is used")
        df = df[~dup].copy()
    if analysis.valid and analysis.valid[0] in df.columns:
        df[analysis.valid[0]] = csv_flag(df[analysis.valid[0]]).fillna(0.0).astype(bool)
    if "note" in df.columns:
        text = df["note"].fillna("").astype(str).str.strip()
        out.notes += sorted({t for t in text if t})
    out.table = df.sort_values(["layer", "head"]).reset_index(drop=True)
    return out


def load_condition(results_dir: str | Path, model: str, dataset: str, length: int,
                   n_layers: int | None = None, n_heads: int | None = None
                   ) -> dict[str, Loaded]:
    """The analyses' CSVs of one condition, by CLI name (missing ones included,
    with status "not run")."""
    return {a.name: read_table(a, C.result_path(results_dir, model, dataset, length,
                                                a.suffix), n_layers, n_heads)
            for a in shown()}


def _load(results_dir, r) -> dict[str, Loaded]:
    return load_condition(results_dir, r.model, r.dataset, r.length, r.n_layers, r.n_heads)


# ------------------------------------------------------------------- head views
def _head_notes(a: AnalysisSpec, t: pd.DataFrame) -> list[str]:
    """Per row: the table's own ``note``, or the spec's note where its ``valid`` is False."""
    notes = [n.strip() if isinstance(n, str) else "" for n in t["note"]] \
        if "note" in t.columns else [""] * len(t)
    if a.valid and a.valid[0] in t.columns:
        notes = [n if ok else a.valid[1] for n, ok in zip(notes, t[a.valid[0]])]
    return notes


def viewer_tables(loaded: dict[str, Loaded], model: str, dataset: str, length: int,
                  n_layers: int, n_heads: int) -> list[dict]:
    """Every head's rows of each analysis for the head views, JSON-ready: per analysis its
    ``title``, ``status`` (ok / not run / unreadable), ``message`` (the command that writes
    the file, or what is wrong with it), the quantity ``labels`` and, per head (index
    layer × n_heads + head; None where the file has no row), the ``values``, the 95%
    ``intervals`` (None where the file has none) and a ``note``."""
    out = []
    for a in shown():
        item = loaded.get(a.name) or Loaded(a, Path())
        entry = {"name": a.name, "title": a.title, "status": item.status,
                 "message": a.command(model, dataset, length, "DIR") if item.status == NOT_RUN
                 else f"{item.path.name}: {item.problem}" if item.status == UNREADABLE else ""}
        if item.table is not None:
            t = item.table
            cols = [(c, label) for c, label in a.head_rows if c in t.columns]
            entry["labels"] = [label for _, label in cols]
            values: list = [None] * (n_layers * n_heads)
            intervals: list = [None] * (n_layers * n_heads)
            notes = _head_notes(a, t)
            for i, row in enumerate(t.to_dict("records")):
                at = int(row["layer"]) * n_heads + int(row["head"])
                values[at] = [finite(row[c]) for c, _ in cols] + [notes[i]]
                intervals[at] = [[finite(row.get(f"{c}_lo")), finite(row.get(f"{c}_hi"))]
                                 if f"{c}_lo" in row and f"{c}_hi" in row else None
                                 for c, _ in cols]
            entry.update(values=values, intervals=intervals)
        out.append(entry)
    return out


# ---------------------------------------------------------------------- the report
def _layer_means(loaded: dict[str, Loaded]) -> tuple[list[tuple[str, list[str]]], pd.DataFrame]:
    """Per-layer means over heads of each readable table: ([(analysis title, column
    labels)], frame indexed by layer). A label ending in "*" is averaged over the heads
    where the spec's ``valid`` column holds (all heads where the table lacks it), and
    that column's count per layer is added."""
    groups, cols = [], []
    for a in shown():
        t = loaded[a.name].table
        if t is None:
            continue
        valid = a.valid[0] if a.valid and a.valid[0] in t.columns else None
        labels = []
        for col, label in a.layer_means:
            values = t[col].where(t[valid]) if valid and label.endswith("*") else t[col]
            cols.append(values.groupby(t["layer"]).mean().rename(label))
            labels.append(label)
        if valid:
            n = t.groupby("layer")[valid]
            label = valid.replace("_", " ")
            cols.append((n.sum().astype(int).astype(str) + "/" + n.size().astype(str))
                        .rename(label))
            labels.append(label)
        groups.append((a.title, labels))
    frame = pd.concat(cols, axis=1).sort_index() if cols else pd.DataFrame()
    return groups, frame


def _layer_table_html(groups, frame: pd.DataFrame) -> str:
    top = '<tr><th rowspan="2">layer</th>' + "".join(
        f'<th colspan="{len(labels)}">{esc(title)}</th>' for title, labels in groups) + "</tr>"
    sub = "<tr>" + "".join(f"<th>{esc(label)}</th>" for _, labels in groups
                           for label in labels) + "</tr>"
    order = [label for _, labels in groups for label in labels]
    rows = []
    for layer, row in frame[order].iterrows():
        cells = "".join(f"<td>{esc(v if isinstance(v, str) else number(v, '{:.4g}'))}</td>"
                        for v in row.to_numpy(dtype=object))
        rows.append(f"<tr><th>L{int(layer)}</th>{cells}</tr>")
    return f'<table class="pk-table pk-further-layers">{top}{sub}{"".join(rows)}</table>'


def _status_html(item: Loaded, r) -> str:
    a = item.analysis
    if item.status == NOT_RUN:
        return (f"<li><b>{esc(a.title)}</b>: not run — "
                f"<code>{esc(a.command(r.model, r.dataset, r.length, 'DIR'))}</code></li>")
    if item.status == UNREADABLE:
        return (f"<li><b>{esc(a.title)}</b>: <code>{esc(item.path.name)}</code> is "
                f"unreadable — {esc(item.problem)}; it is left out.</li>")
    n = len(item.table)
    extra = "".join(f" {esc(note)}." for note in item.notes)
    return (f"<li><b>{esc(a.title)}</b>: <code>{esc(item.path.name)}</code>, {n} of "
            f"{r.n_layers * r.n_heads} heads.{extra}</li>")


def _fig_label(r) -> str:
    """A short condition label for a figure title ('$' escaped for matplotlib)."""
    dataset = r.dataset if len(r.dataset) <= 32 else r.dataset[:31] + "…"
    return f"{r.model} · {dataset} · T={r.length}".replace("$", r"\$")


def _figure(item: Loaded, r) -> tuple[object | None, str]:
    """The analysis' own figure of its table, or (None, why not)."""
    a = item.analysis
    t = item.table
    title = f"{_fig_label(r)} — {a.title.lower()}"
    try:
        return a.figure(t, title), ""
    except Exception as err:  # a table the figure cannot draw: say so, keep the report
        return None, f"{type(err).__name__}: {err}"


def report_section(results_dir: str | Path, results: Sequence,
                   figure: Callable[[object, str, str], str],
                   loaded: dict[str, dict[str, Loaded]] | None = None) -> str:
    """The report's "Further analyses" section as HTML, or "" when no condition in
    ``results`` has any of their CSVs. ``figure(fig, name, alt)`` writes a figure
    next to the report and returns its HTML (the report's own figure writer); ``loaded``:
    the files already read (:func:`load_condition` by stem), read here otherwise."""
    loaded = {r.stem(): (loaded or {}).get(r.stem()) or _load(results_dir, r)
              for r in results}
    if not any(item.exists for per in loaded.values() for item in per.values()):
        return ""
    guides = "".join(f"<li><b>{esc(a.title)}</b> (<code>poskernel analyze {a.name}</code>)"
                     f": {esc(a.guide)}</li>" for a in shown())
    parts = [f"<h2>{esc(section_title())}</h2>",
             '<p class="pk-note">Per-head analyses beyond the pre-registered protocol, '
             "read from <code>results/{model}_{dataset}_{T}_{NAME}.csv</code> where they were "
             "run (<code>DIR</code> in the commands: the folder this report reads). Each "
             "head's own values are in its head view.</p>",
             f"<ul>{guides}</ul>"]
    without = []
    for r in results:
        per = loaded[r.stem()]
        label = f"{model_label(r)} · {r.dataset} · T={r.length}"
        if not any(item.exists for item in per.values()):
            without.append(label)
            continue
        body = [f"<h3>{esc(label)}</h3>",
                "<ul>" + "".join(_status_html(item, r) for item in per.values()) + "</ul>"]
        for item in per.values():
            if item.table is None:
                continue
            fig, why = _figure(item, r)
            if fig is None:
                body.append(f'<p class="pk-note">{esc(item.analysis.title)}: figure not '
                            f"drawn ({esc(why)}).</p>")
            else:
                body.append(figure(fig, f"further_{r.stem()}_{item.analysis.name}",
                                   f"{item.analysis.title}, {r.stem()}"))
        groups, frame = _layer_means(per)
        if groups:
            body.append("<p>Mean over heads per layer.</p>" + _layer_table_html(groups, frame))
            body += [f'<p class="pk-note">* {esc(a.title)}: over the heads where '
                     f"{esc(a.valid[0].replace('_', ' '))}.</p>" for a in shown()
                     if a.valid and per[a.name].table is not None
                     and any(label.endswith("*") for _, label in a.layer_means)]
        parts.append("\n".join(body))
    if without:
        parts.append('<p class="pk-note">None of these analyses was run for: '
                     + "; ".join(esc(w) for w in without) + ".</p>")
    return "\n".join(parts)


__all__ = ["Loaded", "load_condition", "read_table",
           "report_section", "section_title", "shown", "viewer_tables"]

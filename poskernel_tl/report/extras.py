"""Beyond the seeds: the per-head tables of ``poskernel analyze kernel-patching``,
``separable`` and ``mean-field`` in the report and on the head pages.

Each analysis writes ``results/{model}_{dataset}_{T}_{NAME}.csv`` (one row per layer and
head; see :func:`poskernel_tl.analyze.run_analysis`). For one condition,
:func:`load_condition` finds which of the three exist and reads them; the columns this
module shows are checked, and a file that lacks them (or cannot be parsed, or names heads
the condition does not have) is kept as a note instead of a table. From there:

- :func:`report_section`: the report's section, per condition with any of the files each
  analysis' own figure (written through the caller's figure writer), a per-layer table of
  means and a status line per analysis (read / not run with the command / unreadable);
- :func:`head_rows`, :func:`head_frame`: one head's values from each file, or "not run"
  with the command that makes the file, as a tidy frame (the head-page tables route it
  to :func:`head_rows_html`, the "Beyond the seeds" section of a head page).
"""

import importlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.report.html import escape

SECTION_TITLE = "Beyond the seeds: kernel patching, separable baseline, mean field"
HEAD_TABLE = "Beyond the seeds"  # caption of the head-page table (see head_page.py)
KEYS = ("model", "dataset", "length", "layer", "head")
# the text columns first: a page that shows the frame as a plain table reads left to right
HEAD_COLUMNS = ("analysis", "quantity", "value", "95% interval", "note", *KEYS)
# a file's status; a head row whose quantity is one of the last three carries a message
OK, NOT_RUN, UNREADABLE, NO_ROW = "ok", "not run", "unreadable", "no row"
MESSAGES = (NOT_RUN, UNREADABLE, NO_ROW)


@dataclass(frozen=True)
class Analysis:
    name: str  # the CLI name, also the CSV suffix
    title: str
    module: str  # under poskernel_tl.analyses
    plot: str  # figure function of that module: plot(table, title) -> Figure
    needs: tuple[str, ...]  # columns besides layer and head
    guide: str  # one sentence on how to read it


ANALYSES = (
    Analysis("kernel-patching", "Kernel patching", "kernel_patching", "plot_kernel_patching",
             ("dloss_patched", "dloss_ablated", "dloss_ratio"),
             "Each head's scores are replaced by its pooled kernel g(t − s) and the loss "
             "change is divided by that of mean-ablating the head: 0 means the kernel is "
             "all the head contributes, 1 means it does no better than the mean (the ratio "
             "means something only where ablation costs loss; grey cells in the figure)."),
    Analysis("separable", "Separable baseline", "separable", "plot_separable",
             ("R2_toeplitz", "R2_separable", "R2_toeplitz_separable"),
             "Toeplitz g(t − s) against the row + column structure r(t) + c(s) that a "
             "causal mask alone can produce: R²(Toeplitz + separable) − R²(separable) is "
             "what shift invariance adds beyond the mask."),
    Analysis("mean-field", "Mean field", "mean_field", "plot_mean_field",
             ("R2_meanfield", "share_meanfield", "share_cross", "share_centered"),
             "The raw averaged Gram split into the mean field μ_q μ_kᵀ (content-free), "
             "the centered Gram (content) and a cross term: a large mean-field share with "
             "a high R²_meanfield says the kernel lives in the mean query and key."),
)
BY_NAME = {a.name: a for a in ANALYSES}

# (column, label) of the head-page rows; an interval is shown where _lo/_hi exist
HEAD_QUANTITIES = {
    "kernel-patching": (("dloss_patched", "Δloss, kernel patched (nats)"),
                        ("dloss_patched_sink", "Δloss, kernel patched, sink kept (nats)"),
                        ("dloss_ablated", "Δloss, mean-ablated (nats)"),
                        ("dloss_ratio", "kernel / ablation (normalised loss)"),
                        ("dloss_ratio_sink", "kernel + sink / ablation")),
    "separable": (("R2_toeplitz", "R² Toeplitz g(t − s)"),
                  ("R2_separable", "R² separable r(t) + c(s)"),
                  ("R2_toeplitz_separable", "R² Toeplitz + separable")),
    "mean-field": (("R2_meanfield", "R² of the mean field μ_q μ_kᵀ"),
                   ("share_meanfield", "share: mean field"),
                   ("share_cross", "share: cross"),
                   ("share_centered", "share: centered")),
}
# (column, label) of the per-layer means in the report
LAYER_MEANS = {
    "kernel-patching": (("dloss_patched", "Δloss kernel"), ("dloss_ablated", "Δloss ablated"),
                        ("dloss_ratio", "kernel / ablation")),
    "separable": (("R2_toeplitz", "R² Toeplitz"), ("R2_separable", "R² separable"),
                  ("R2_toeplitz_separable", "R² T + S")),
    "mean-field": (("R2_meanfield", "R² mean field"), ("share_meanfield", "share MF"),
                   ("share_cross", "share cross"), ("share_centered", "share centered")),
}


def _esc(text: object) -> str:
    """Escaped text, '://' as an entity (no network URL in a page's source)."""
    return escape(text).replace("://", ":&#47;&#47;")


def _num(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return f"{x:.4g}" if np.isfinite(x) else "–"


def command(name: str, model: str, dataset: str, length: int) -> str:
    """The command that writes analysis ``name``'s CSV for one condition (``DIR``: the
    folder the report reads)."""
    return (f"poskernel analyze {name} --model {shlex.quote(model)} "
            f"--dataset {shlex.quote(dataset)} --length {int(length)} --out DIR")


# --------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    """One analysis' CSV for one condition: ``table`` when it was read and has the needed
    columns; otherwise ``problem`` says why not ("" when the file does not exist)."""

    analysis: Analysis
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


def _as_bool(s: pd.Series) -> pd.Series:
    if s.dtype == bool:
        return s
    text = s.astype(str).str.strip().str.lower()
    return text.isin(("true", "1", "1.0", "yes"))


def read_table(analysis: Analysis, path: Path, n_layers: int | None = None,
               n_heads: int | None = None) -> Loaded:
    """Read and check one CSV (see :class:`Loaded`); never raises for a bad file."""
    out = Loaded(analysis, path)
    if not path.is_file():
        return out
    try:
        df = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err  # no path
        out.problem = f"could not be parsed ({type(err).__name__}: {why})"
        return out
    needed = ("layer", "head", *analysis.needs)
    missing = [c for c in needed if c not in df.columns]
    if missing:
        out.problem = (f"missing column{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)}")
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
    if "ablation_matters" in df.columns:
        df["ablation_matters"] = _as_bool(df["ablation_matters"])
    if "note" in df.columns:
        text = df["note"].fillna("").astype(str).str.strip()
        out.notes += sorted({t for t in text if t})
    out.table = df.sort_values(["layer", "head"]).reset_index(drop=True)
    return out


def load_condition(results_dir: str | Path, model: str, dataset: str, length: int,
                   n_layers: int | None = None, n_heads: int | None = None
                   ) -> dict[str, Loaded]:
    """The three analyses' CSVs of one condition, by CLI name (missing ones included,
    with status "not run")."""
    return {a.name: read_table(a, C.result_path(results_dir, model, dataset, length,
                                                f"{a.name}.csv"), n_layers, n_heads)
            for a in ANALYSES}


def _load(results_dir, r) -> dict[str, Loaded]:
    return load_condition(results_dir, r.model, r.dataset, r.length, r.n_layers, r.n_heads)


# ------------------------------------------------------------------------ head rows
def head_rows(loaded: dict[str, Loaded], model: str, dataset: str, length: int,
              layer: int, head: int) -> pd.DataFrame:
    """One head's values from each analysis (columns :data:`HEAD_COLUMNS`; values as
    text). An analysis without a file gives one row with quantity "not run" whose value
    is the command; an unreadable file or a head missing from it gives one row
    ("unreadable", "no row") whose value says why."""
    rows = []
    key = dict(model=model, dataset=dataset, length=int(length), layer=int(layer),
               head=int(head))

    def add(a: Analysis, quantity: str, value: str, interval: str = "",
            note: str = "") -> None:
        rows.append({**key, "analysis": a.title, "quantity": quantity, "value": value,
                     "95% interval": interval, "note": note})

    for a in ANALYSES:
        item = loaded.get(a.name) or Loaded(a, Path())
        if item.status == NOT_RUN:
            add(a, NOT_RUN, command(a.name, model, dataset, length))
            continue
        if item.status == UNREADABLE:
            add(a, UNREADABLE, f"{item.path.name}: {item.problem}")
            continue
        t = item.table
        match = t[(t["layer"] == layer) & (t["head"] == head)]
        if match.empty:
            add(a, NO_ROW, f"{item.path.name} has no row for L{layer}H{head}")
            continue
        row = match.iloc[0]
        for col, label in HEAD_QUANTITIES[a.name]:
            if col not in row.index:
                continue
            lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
            interval = (f"[{_num(lo)}, {_num(hi)}]" if lo is not None and hi is not None
                        and _num(lo) != "–" and _num(hi) != "–" else "")
            note = ""
            if col.startswith("dloss_ratio") and "ablation_matters" in row.index \
                    and not bool(row["ablation_matters"]):
                note = "ablation's interval reaches 0: the ratio means little"
            if a.name == "mean-field" and col == "R2_meanfield" and "note" in row.index \
                    and isinstance(row["note"], str) and row["note"].strip():
                note = row["note"].strip()
            add(a, label, _num(row[col]), interval, note)
    return pd.DataFrame(rows, columns=list(HEAD_COLUMNS))


def head_frame(results_dir: str | Path, results: Sequence) -> pd.DataFrame:
    """:func:`head_rows` of every head of every condition in ``results``
    (ConditionResults), one frame: the head pages' "Beyond the seeds" table."""
    frames = []
    for r in results:
        loaded = _load(results_dir, r)
        for layer in range(r.n_layers):
            for head in range(r.n_heads):
                frames.append(head_rows(loaded, r.model, r.dataset, r.length, layer, head))
    return (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=list(HEAD_COLUMNS)))


def head_rows_html(df: pd.DataFrame) -> str:
    """A head's rows (:func:`head_rows`) as a table, one block of rows per analysis (the
    note column only where a row has a note)."""
    columns = ["quantity", "value", "95% interval", "note"]
    is_msg = df["quantity"].isin(MESSAGES)
    if not df.loc[~is_msg, "note"].fillna("").astype(str).str.strip().any():
        columns.pop()
    width = f' colspan="{len(columns)}"'
    body = []
    for analysis, group in df.groupby("analysis", sort=False):
        records = group.to_dict("records")
        span = f' rowspan="{len(records)}"' if len(records) > 1 else ""
        for i, row in enumerate(records):
            first = f"<th{span}>{_esc(analysis)}</th>" if i == 0 else ""
            status = row["quantity"] if row["quantity"] in MESSAGES else OK
            if status == NOT_RUN:
                cells = f"<td{width}>not run — <code>{_esc(row['value'])}</code></td>"
            elif status != OK:
                cells = f"<td{width}>{_esc(status)} — {_esc(row['value'])}</td>"
            else:
                cells = "".join(f'<td class="pk-value">{_esc(row[c])}</td>' if c == "value"
                                else f"<td>{_esc(row[c])}</td>" for c in columns)
            body.append(f'<tr class="pk-beyond-{status.replace(" ", "-")}">{first}{cells}</tr>')
    head = "<tr><th>analysis</th>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    return f'<table class="pk-table pk-beyond">{head}{"".join(body)}</table>'


# ---------------------------------------------------------------------- the report
def _layer_means(loaded: dict[str, Loaded]) -> tuple[list[tuple[str, list[str]]], pd.DataFrame]:
    """Per-layer means over heads of each readable table: ([(analysis title, column
    labels)], frame indexed by layer). The ratio is averaged over the heads where
    ablation matters (all heads where the table does not say)."""
    groups, cols = [], []
    for a in ANALYSES:
        item = loaded[a.name]
        if item.table is None:
            continue
        t = item.table
        labels = []
        for col, label in LAYER_MEANS[a.name]:
            values = t[col]
            if col == "dloss_ratio" and "ablation_matters" in t.columns:
                values = values.where(t["ablation_matters"])
                label += "*"
            cols.append(values.groupby(t["layer"]).mean().rename(label))
            labels.append(label)
        if a.name == "kernel-patching" and "ablation_matters" in t.columns:
            n = t.groupby("layer")["ablation_matters"]
            cols.append((n.sum().astype(int).astype(str) + "/" + n.size().astype(str))
                        .rename("ablation matters"))
            labels.append("ablation matters")
        groups.append((a.title, labels))
    frame = pd.concat(cols, axis=1).sort_index() if cols else pd.DataFrame()
    return groups, frame


def _layer_table_html(groups, frame: pd.DataFrame) -> str:
    top = '<tr><th rowspan="2">layer</th>' + "".join(
        f'<th colspan="{len(labels)}">{_esc(title)}</th>' for title, labels in groups) + "</tr>"
    sub = "<tr>" + "".join(f"<th>{_esc(label)}</th>" for _, labels in groups
                           for label in labels) + "</tr>"
    order = [label for _, labels in groups for label in labels]
    rows = []
    for layer, row in frame[order].iterrows():
        cells = "".join(f"<td>{_esc(v if isinstance(v, str) else _num(v))}</td>"
                        for v in row.to_numpy(dtype=object))
        rows.append(f"<tr><th>L{int(layer)}</th>{cells}</tr>")
    return f'<table class="pk-table pk-beyond-layers">{top}{sub}{"".join(rows)}</table>'


def _status_html(item: Loaded, r) -> str:
    a = item.analysis
    if item.status == NOT_RUN:
        return (f"<li><b>{_esc(a.title)}</b>: not run — "
                f"<code>{_esc(command(a.name, r.model, r.dataset, r.length))}</code></li>")
    if item.status == UNREADABLE:
        return (f"<li><b>{_esc(a.title)}</b>: <code>{_esc(item.path.name)}</code> is "
                f"unreadable — {_esc(item.problem)}; it is left out.</li>")
    n = len(item.table)
    extra = "".join(f" {_esc(note)}." for note in item.notes)
    return (f"<li><b>{_esc(a.title)}</b>: <code>{_esc(item.path.name)}</code>, {n} of "
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
    if a.name == "kernel-patching":
        mode = t["mode"].iloc[0] if "mode" in t.columns else "pooled"
        n = f", {int(t['n_seqs'].iloc[0])} sequences" if "n_seqs" in t.columns else ""
        title += f" ({mode} g{n}; grey: ablation not significant)"
    try:
        plot = getattr(importlib.import_module(f"poskernel_tl.analyses.{a.module}"), a.plot)
        return plot(t, title), ""
    except Exception as err:  # a table the figure cannot draw: say so, keep the report
        return None, f"{type(err).__name__}: {err}"


def report_section(results_dir: str | Path, results: Sequence,
                   figure: Callable[[object, str, str], str]) -> str:
    """The report's "Beyond the seeds" section as HTML, or "" when no condition in
    ``results`` has any of the three CSVs. ``figure(fig, name, alt)`` writes a figure
    next to the report and returns its HTML (the report's own figure writer)."""
    from poskernel_tl.report.figures import model_label

    loaded = {r.stem(): _load(results_dir, r) for r in results}
    if not any(item.exists for per in loaded.values() for item in per.values()):
        return ""
    guides = "".join(f"<li><b>{_esc(a.title)}</b> (<code>poskernel analyze {a.name}</code>)"
                     f": {_esc(a.guide)}</li>" for a in ANALYSES)
    parts = [f"<h2>{_esc(SECTION_TITLE)}</h2>",
             '<p class="pk-note">Three per-head analyses beyond the seed, read from '
             "<code>results/{model}_{dataset}_{T}_{NAME}.csv</code> where they were run "
             "(<code>DIR</code> in the commands: the folder this report reads). Each head's "
             "own values are on its head page, where head pages were written.</p>",
             f"<ul>{guides}</ul>"]
    without = []
    for r in results:
        per = loaded[r.stem()]
        label = f"{model_label(r)} · {r.dataset} · T={r.length}"
        if not any(item.exists for item in per.values()):
            without.append(label)
            continue
        body = [f"<h3>{_esc(label)}</h3>",
                "<ul>" + "".join(_status_html(item, r) for item in per.values()) + "</ul>"]
        for item in per.values():
            if item.table is None:
                continue
            fig, why = _figure(item, r)
            if fig is None:
                body.append(f'<p class="pk-note">{_esc(item.analysis.title)}: figure not '
                            f"drawn ({_esc(why)}).</p>")
            else:
                body.append(figure(fig, f"beyond_{r.stem()}_{item.analysis.name}",
                                   f"{item.analysis.title}, {r.stem()}"))
        groups, frame = _layer_means(per)
        if groups:
            body.append("<p>Mean over heads per layer.</p>" + _layer_table_html(groups, frame))
            if any(label.endswith("*") for _, labels in groups for label in labels):
                body.append('<p class="pk-note">* over the heads whose ablation interval '
                            "lies above 0 (ablation matters).</p>")
        parts.append("\n".join(body))
    if without:
        parts.append('<p class="pk-note">None of the three analyses was run for: '
                     + "; ".join(_esc(w) for w in without) + ".</p>")
    return "\n".join(parts)


__all__ = ["ANALYSES", "HEAD_TABLE", "SECTION_TITLE", "Loaded", "command", "head_frame",
           "head_rows", "head_rows_html", "load_condition", "read_table", "report_section"]

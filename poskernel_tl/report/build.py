"""``build_report``: every condition under a folder → figures, Table 1, verdicts, nulls, one
data file per condition for the head views, and one ``report.html`` that opens offline.

The report only reads. Every number comes from the files written when the condition and
its analyses ran: the condition itself (``ConditionResult.load``, once per condition), the
spectral tables and spectra (``poskernel spectral DIR``, ``poskernel run --spectral`` or the
grid) and the further analyses' CSVs. A missing analysis is shown as "not run" with its
command. A condition that cannot be read is listed at the top with the file and the reason;
the report is written for the others and :class:`ReportIncomplete` is raised afterwards.

Layout under ``out`` (default ``DIR/report``): ``report.html``; ``assets/`` (Plotly,
circuitsvis, the viewer); ``data/{stem}.js`` (one per condition); ``figures/*.png|pdf``;
``table1.csv|md``, ``verdicts.csv|md``, ``summary.csv``, ``nulls_thresholds.csv|md`` and
``nulls/{stem}_perm_null.csv`` where the run measured the permutation null. Every head is
at ``report.html#{model}/{dataset}_{T}/L{layer}H{head}``.
"""

import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from poskernel_tl import constants as C
from poskernel_tl.errors import NoConditionError, ResultFileError
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.plan.allocator import release_freed_memory
from poskernel_tl.progress import tqdm
from poskernel_tl.report import (
    atlas,
    extras,
    figure_nulls,
    figures,
    head_map,
    nulls,
    reproductions,
    softmax_reads,
    tables,
    verdicts,
)
from poskernel_tl.report.collect import Damaged, SavedCondition, iter_conditions, slim
from poskernel_tl.report.html import esc, page_html, report_block, write_page
from poskernel_tl.report.layout import PageParts, page_body
from poskernel_tl.report.long_files import write_long_views
from poskernel_tl.report.sections import cond_text
from poskernel_tl.report.tables import dataset_label
from poskernel_tl.report.tokens import Decoder
from poskernel_tl.report.viewer import asset_tags, write_assets
from poskernel_tl.report.viewer_data import (
    DATA_DIR,
    condition_key,
    data_path,
    write_data,
)

REPORT_DIR = "report"
FIG_DIR = "figures"
OLD_LAYOUT = ("heads", "spectral")  # folders of earlier versions of the report
CSS = """<style>
.pk-v-met { background: #d7f0d2; } .pk-v-partial { background: #fbeec1; }
.pk-v-failed { background: #f6cfcf; } .pk-v-na { background: #e6e6e6; }
.pk-report .pk-verdicts td, .pk-report .pk-verdicts th { text-align: left;
  vertical-align: top; }
.pk-report img.pk-file { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.pk-explore { display: block; margin-top: 4px; color: #35506b; }
.pk-report .pk-lead li { margin: 6px 0; line-height: 1.45; }
.pk-report details.pk-fold > summary { cursor: pointer; }
.pk-report details.pk-fold[open] > summary { margin-bottom: 4px; }
</style>"""


class ReportIncomplete(ResultFileError):
    """The report was written, but some conditions could not be read (``damaged``, each
    with its file and reason); ``page`` is the report that was written."""

    def __init__(self, page: Path, damaged: list[Damaged]):
        self.page, self.damaged = page, list(damaged)
        names = "; ".join(f"{d.condition} ({d.file or '?'}: {d.reason})" for d in damaged)
        super().__init__(f"report written to {page}, but {len(damaged)} condition"
                         f"{'s' if len(damaged) > 1 else ''} could not be read: {names}")


def _read(results_dir: Path, out: Path, decoders, progress: bool
          ) -> tuple[list[SavedCondition], list[Damaged]]:
    """Every condition once: its data file is written, then its large arrays dropped."""
    conds, damaged, written = [], [], set()
    items = iter_conditions(results_dir, decoders)
    if progress:
        items = tqdm(items, desc="report", unit="cond")
    for item in items:
        if isinstance(item, Damaged):
            damaged.append(item)
            continue
        written.add(write_data(out, item, write_long_views(out, item)).name)
        top = figures.top_early_heads(item.result, 1)
        ramps = softmax_reads.alibi_frame(item.result)  # before its g(Δ) are dropped
        known = softmax_reads.known_frame(item.result)
        conds.append(slim(item, top[0] if top else None))
        conds[-1].kept[softmax_reads.KEPT] = ramps
        conds[-1].kept[softmax_reads.KNOWN] = known
        release_freed_memory()
    for old in (out / DATA_DIR).glob("*"):  # conditions no longer in the results
        if old.is_dir() and f"{old.name}.js" not in written:
            shutil.rmtree(old)
        elif old.suffix == ".js" and old.name not in written:
            old.unlink()
    return conds, damaged


def _figure(fig, out: Path, name: str, alt: str, pdf: bool = True) -> str:
    """Save ``fig`` (PNG, and PDF for the numbered figures) and return its HTML."""
    png, pdf_path = figures.save_figure(fig, out / FIG_DIR / name, pdf=pdf)
    rel = png.relative_to(out).as_posix()
    links = f'<a href="{esc(rel)}">PNG</a>' + (
        f' · <a href="{esc(pdf_path.relative_to(out).as_posix())}">PDF</a>' if pdf_path else "")
    return (f'<img class="pk-file" src="{esc(rel)}" alt="{esc(alt)}">'
            f'<p class="pk-note">Files: {links}</p>')


def _fig4(conds: list[SavedCondition], out: Path, gate_met) -> tuple[str, str]:
    """Figure 4 from the saved Track B spectrum of the chosen head, and its sentence."""
    results = [c.result for c in conds]
    try:
        r, layer, head = figures.pick_spectral_head(results)
    except ValueError as err:
        return f"<p>Figure 4 not drawn: {esc(err)}.</p>", ""
    c = conds[results.index(r)]
    row = c.spectral.head("trackB", layer, head)
    if row is None or not c.spectral.has("trackB"):
        return ("<p>Figure 4 not drawn: the spectral analysis was not run for "
                f"{esc(cond_text(r))} — <code>poskernel spectral DIR</code>.</p>"), ""
    pk = c.spectral.peaks["trackB"]
    pk = pk[(pk["layer"] == layer) & (pk["head"] == head)]
    if c.kept_head != (layer, head):  # slim keeps the head Figure 4 picks: never here
        raise RuntimeError(f"Figure 4 picked L{layer}H{head}, not the kept {c.kept_head}")
    spec = {"omega": c.spectral.omega, "spectrum": c.kept["spectrum_trackB"],
            "peaks": pk["omega"].to_numpy(), "matched": pk["matched"].to_numpy(bool),
            "rel_error": pk["rel_error"].to_numpy(float),
            **{k: float(row[k]) for k in ("frac_matched", "p_value", "chance")}}
    fig = figures.fig4_spectral(r, layer, head, spec, gate_met=gate_met,
                          kept=c.kept)
    p = spec["p_value"]
    note = (f"Figure 4 head: {r.model}/{dataset_label(r.dataset)}/T={r.length} L{layer}H{head}"
            f", {int(spec['matched'].sum())} of its {len(pk)} top peaks matched a θᵢ " +
            (f"(p = {p:.3g} against the rescaled-θ null)." if np.isfinite(p) else
             "(no significant peak, so no p-value against the rescaled-θ null)."))
    return _figure(fig, out, "fig4", "Figure 4"), note


_JOBS: list = []  # the figure jobs of the running build, read by forked workers


def _run_job(i: int):
    return _JOBS[i]()


def _quiet_worker() -> None:
    """A worker ends at once when the pool closes it (SIGTERM), without the command's own
    handler (which reports an interrupted run)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_all(jobs: list, workers: int) -> list:
    """Call every job, in forked worker processes when there are several cores (each
    job draws and saves its figures; only the returned HTML comes back)."""
    import multiprocessing as mp

    if workers < 2 or len(jobs) < 2 or "fork" not in mp.get_all_start_methods():
        return [job() for job in jobs]
    _JOBS[:] = jobs
    try:
        with mp.get_context("fork").Pool(min(workers, len(jobs)), _quiet_worker) as pool:
            return pool.map(_run_job, range(len(jobs)), chunksize=1)
    finally:
        _JOBS.clear()


def _figures(conds: list[SavedCondition], out: Path, gate_met, workers: int) -> tuple[dict, str]:
    """Figures 1–4 and the nulls, drawn by ``workers`` processes; (HTML by figure, the
    sentence on Figure 4's head)."""
    import matplotlib

    matplotlib.rcParams["figure.max_open_warning"] = 0
    results = [c.result for c in conds]
    jobs: list[tuple[str, object]] = []

    def add(key: str, make, name: str, alt: str) -> None:  # PDF for Figures 1–4 only
        jobs.append((key, lambda: _figure(make(), out, name, alt, pdf=key != "null")))

    jobs.append(("4", lambda: _fig4(conds, out, gate_met)))  # the longest first
    for r in results:
        nope = nulls.nope_r2(results, dataset=r.dataset, length=r.length)
        nope = nope if nope.size and r.spec.pe != "none" else None
        add("null", lambda r=r, nope=nope: figure_nulls.fig_nulls(r, nope), f"nulls_{r.stem()}",
            f"nulls, {r.stem()}")
        head_null = nulls.head_null_table(r)
        if head_null is not None:
            tables.write_table(head_null, out / "nulls" / f"{r.stem()}_perm_null")
    by_model: dict[str, list] = {}
    for r in results:
        by_model.setdefault(r.model, []).append(r)
    for model, rs in by_model.items():
        slug = C.model_slug(model)
        add("1", lambda rs=rs: figures.fig1_heatmaps(rs), f"fig1_{slug}", f"Figure 1, {model}")
        add("2", lambda rs=rs: figures.fig2_depth(rs), f"fig2_{slug}", f"Figure 2, {model}")
    by_cond: dict[tuple, list] = {}
    for r in results:
        by_cond.setdefault((r.dataset, r.length), []).append(r)
    for (dataset, length), rs in sorted(by_cond.items()):
        add("3", lambda rs=rs: figures.fig3_violins(rs), f"fig3_{C.dataset_slug(dataset)}_{length}",
            f"Figure 3, {dataset_label(dataset)}, T={length}")
    figs: dict[str, list[str]] = {k: [] for k in ("1", "2", "3", "4", "null")}
    note4 = ""
    for (key, _), html in zip(jobs, _run_all([job for _, job in jobs], workers)):
        if key == "4":
            html, note4 = html
        figs[key].append(html)
    return figs, note4


def _index(conds: list[SavedCondition]) -> list[dict]:
    out = []
    for c in conds:
        r = c.result
        out.append({"key": condition_key(r.model, r.dataset, r.length), "model": r.model,
                    "label": cond_text(r), "dataset_label": dataset_label(r.dataset),
                    "length": int(r.length), "n_layers": r.n_layers, "n_heads": r.n_heads,
                    "group_size": int(r.spec.group_size),
                    "kinds": [s.kind for s in r.spec.layers or ()],
                    "r2": [[None if not np.isfinite(v) else float(v) for v in row]
                           for row in np.asarray(r.r2_pooled, np.float64)],
                    "data": f"{DATA_DIR}/{data_path('.', r).name}"})
    return out


def _gate_notes(summary, gate) -> str:
    """Where a condition's spectral files were written under another gate than the
    folder's (e.g. conditions were added since): say so and how to refresh them."""
    if gate[1] is None or "spec_gate_saved" not in summary:
        return ""
    stale = [f"{r['model']}/{dataset_label(r['dataset'])}/T={r['length']}"
             for r in summary.to_dict("records")
             if r["spec_gate_saved"] is not None and r["spec_gate_saved"] != gate[1]]
    return (f"The spectral files of {', '.join(stale)} were written under a different gate "
            "than this folder's (conditions were added or changed since): rerun "
            "poskernel spectral DIR.") if stale else ""


def build_report(results_dir: str | Path, out: str | Path | None = None, *,
                 progress: bool = False, token_decoders: Mapping[str, Decoder] | None = None,
                 workers: int | None = None) -> Path:
    """Read every condition under ``results_dir`` and write the report (see the module
    docstring); returns the path of ``report.html``. ``token_decoders``: model name →
    ``ids -> token strings`` (default: read from the model's vocabulary where it is on this
    machine). ``workers``: processes drawing the figures (default: up to 2, one per core).
    Raises :class:`ReportIncomplete` after
    writing when some condition could not be read, :class:`NoConditionError` (a user error)
    when the folder does not exist or holds no condition."""
    results_dir = ConditionResult.folder(results_dir)
    out = Path(out) if out is not None else results_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for old in OLD_LAYOUT:
        shutil.rmtree(out / old, ignore_errors=True)
    conds, damaged = _read(results_dir, out, token_decoders, progress)
    if not conds and not damaged:
        raise NoConditionError(f"no complete condition under {results_dir}: run `poskernel "
                               "run` or `poskernel grid` with --out there first")
    results = [c.result for c in conds]
    summary = tables.condition_summary(results, {c.key: c.spectral.tables for c in conds})
    gate = tables.spectral_gate(summary) if len(summary) else (float("nan"), None)
    verdict = verdicts.evaluate(summary)
    t1 = tables.table1(summary) if len(summary) else summary
    if len(summary):
        tables.write_table(summary, out / "summary")
        tables.write_table(t1, out / "table1", tables.table1_display(t1, summary), "Table 1")
    verdicts.write_verdicts(verdict, out / "verdicts")
    thresholds = nulls.threshold_table(results)
    tables.write_table(thresholds, out / "nulls_thresholds", title="Thresholds within the nulls")
    workers = min(2, os.cpu_count() or 1) if workers is None else int(workers)
    figs, note4 = _figures(conds, out, gate[1], workers) if conds else ({}, "")
    figs["map"] = [head_map.section(results_dir, conds, out)] if conds else []
    further = extras.report_section(results_dir, results,
                                lambda fig, name, alt: _figure(fig, out, name, alt),
                                {c.result.stem(): c.extras for c in conds})
    further = atlas.section(results_dir, results, out,
                            lambda fig, name, alt: _figure(fig, out, name, alt)) + \
        reproductions.section(atlas.per_condition_of(results_dir, results), results, out) + \
        further
    ramps = softmax_reads.alibi_table(conds)
    if len(ramps):
        tables.write_table(ramps, out / "alibi_ramp", title="ALiBi heads against their ramp")
    known = softmax_reads.known_table(conds)
    if len(known):
        tables.write_table(known, out / "known_kernels",
                           title="Heads against their learned offset table")
    further = softmax_reads.softmax_html(conds) + further
    write_assets(out)
    body = page_body(PageParts(results_dir, conds, damaged, summary, verdict, t1, thresholds,
                               gate, figs, note4 + " " + _gate_notes(summary, gate), further,
                               _index(conds)))
    page = write_page(out / "report.html", page_html(
        "Positional-kernel report", report_block(body, include_style=False),
        head=CSS + "\n" + asset_tags("assets")))
    if damaged:
        raise ReportIncomplete(page, damaged)
    return page


__all__ = ["REPORT_DIR", "ReportIncomplete", "build_report"]

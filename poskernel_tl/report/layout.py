"""The order of ``report.html``: what a reader sees first.

The page opens with the answer (two lines per condition, :mod:`~poskernel_tl.report.lead`)
and the picture a researcher looks at first (Figure 1, each head clickable into its view),
then the verdicts, each with its reading shown and its numbers folded, the questions
(a)–(f) folded under their verdicts, and the rest of the report (the head map, Table 1,
Figures 2–4, the nulls, the boundary table, further analyses, limitations). The protocol's
description and the list of conditions are folded near the top. Pure assembly of blocks the
other modules wrote; every piece is escaped HTML.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl.report import figures, nulls, sections, tables
from poskernel_tl.report.collect import Damaged, SavedCondition
from poskernel_tl.report.html import esc
from poskernel_tl.report.lead import lead_html
from poskernel_tl.report.sections import fmt, table_html
from poskernel_tl.report.tables import dataset_label
from poskernel_tl.report.viewer import viewer_html
from poskernel_tl.report.viewer_data import head_href
from poskernel_tl.statistics.perm_null import null_percentile


@dataclass
class PageParts:
    """What the report read and drew, as :func:`page_body` lays it out."""

    results_dir: Path
    conds: list[SavedCondition]
    damaged: list[Damaged]
    summary: pd.DataFrame
    verdict: pd.DataFrame
    t1: pd.DataFrame
    thresholds: pd.DataFrame
    gate: tuple
    figs: dict
    note4: str  # the sentence on Figure 4's head (and stale spectral files)
    further: str  # the further analyses' sections
    index: list[dict]  # Figure 1's viewer index, one entry per condition

    @property
    def results(self) -> list:
        return [c.result for c in self.conds]

    def fig(self, key: str) -> str:
        return "".join(self.figs.get(key, []))


def _opening(p: PageParts) -> list[str]:
    listed = "".join(f"<li>{esc(sections.condition_line(r))}</li>" for r in p.results)
    return ["<h1>Positional-kernel report</h1>",
            sections.damaged_html(p.damaged, p.results_dir),
            lead_html(p.results, p.summary), sections.PROTOCOL_HTML,
            sections.folded(f"<b>Conditions read from <code>{esc(p.results_dir.name)}</code>"
                            f"</b>: {len(p.results)}", f"<ul>{listed}</ul>")]


def _figure1(p: PageParts) -> str:
    r = p.results[0] if p.results else None
    example = (head_href(r.model, r.dataset, r.length, 0, 0) if r is not None
               else "report.html#model/dataset_T/L0H0")
    return ("<h2>Figure 1 — Track A pooled R² per head</h2>"
            '<p class="pk-note">Choose a condition and click a head to open its view; each '
            f"head's view has its own address (e.g. <code>{esc(example)}</code>).</p>"
            + viewer_html(p.index) + p.fig("1"))


def _verdicts(p: PageParts) -> list[str]:
    banner, note = sections.design_banner(p.results)
    out = ["<h2>Pre-registration verdicts</h2>" + banner
           + sections.verdict_html(p.verdict, note)
           + '<p class="pk-note">Files: <a href="verdicts.csv">CSV</a> · '
           '<a href="verdicts.md">Markdown</a>. The thresholds are uncalibrated (the '
           "protocol's calibration note); see the nulls below.</p>"]
    if len(p.summary):
        out.append("<h2>Results, question by question</h2><ul>" + "".join(sections.answers(
            p.summary, p.verdict, p.gate, p.note4.strip(), sections.calibration(p.results)))
            + "</ul>")
    return out


def _nulls(p: PageParts) -> str:
    results = p.results
    perm_lines = "".join(
        f"<li>{esc(r.stem())}: {s['n_above_null_max']}/{s['n_heads']} heads above the "
        f"largest of their {s['n_perm']} permuted R² (null mean {s['null_mean_overall']:.2g}"
        f", max {s['null_max_overall']:.2g})</li>"
        for r in results if nulls.perm_null_of(r) is not None
        for s in [nulls.head_null_summary(r)])
    nope = nulls.nope_r2(results)
    nope_txt = (f"Empirical NoPE null: {len(nope)} heads, median {np.median(nope):.3f}; "
                f"0.40 is at its {fmt(float(null_percentile(0.40, nope)), '{:.0f}')}th and 0.80 at "
                f"its {fmt(float(null_percentile(0.80, nope)), '{:.0f}')}th percentile."
                if nope.size else "No NoPE model in this folder: the empirical NoPE null "
                "the protocol asks for cannot be formed; the analytic and permutation nulls "
                "stand in.")
    return ("<h2>Nulls</h2><p>Analytic i.i.d. null: E[R²] = (T−2)/(N−1) with N the number of "
            "strictly-lower-triangle entries fitted. Joint position-permutation null: q and k "
            "positions permuted together, every logit kept, offsets destroyed.</p>"
            + (f"<ul>{perm_lines}</ul>" if perm_lines else
               "<p>Permutation null not measured in these runs.</p>")
            + f"<p>{esc(nope_txt)}</p>" + table_html(p.thresholds.assign(
                dataset=[dataset_label(d) for d in p.thresholds["dataset"]])) + p.fig("null"))


def _tables_and_figures(p: PageParts) -> list[str]:
    t1 = (table_html(tables.table1_display(p.t1, p.summary)) if len(p.t1) else "")
    return [
        p.fig("map"),
        "<h2>Table 1</h2>" + t1 + '<p class="pk-note">Files: <a href="table1.csv">CSV</a> · '
        '<a href="table1.md">Markdown</a> · <a href="summary.csv">all summary numbers</a></p>',
        sections.layer_kinds_html(p.results),
        "<h2>Figure 2 — mean R² per layer</h2>"
        f'<p class="pk-note">{esc(figures.TRACK_A_QUESTIONS)}</p>' + p.fig("2"),
        "<h2>Figure 3 — per-sequence R² of the top early-layer heads</h2>" + p.fig("3"),
        "<h2>Figure 4 — spectrum of one early rotary head</h2>" + p.fig("4"),
        _nulls(p)]


def page_body(p: PageParts) -> str:
    """The report's body: the answer and Figure 1 first, then the verdicts, then the rest."""
    blocks = [*_opening(p), _figure1(p), *_verdicts(p), *_tables_and_figures(p)]
    if len(p.summary):
        blocks.append("<h2>Early positions and the sink column</h2>"
                      + sections.boundary_html(p.summary, p.results))
    blocks += [p.further, "<h2>Limitations</h2><ul>" + "".join(
        f"<li>{esc(t)}</li>" for t in sections.limitations(p.results)) + "</ul>"]
    return "\n".join(s for s in blocks if s)


__all__ = ["PageParts", "page_body"]

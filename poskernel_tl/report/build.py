"""``build_report``: every condition under a folder → figures, Table 1, verdicts, nulls
and one ``report.html`` that opens offline.

Layout under ``out`` (default ``DIR/report``): ``report.html``; ``figures/*.png|pdf``;
``table1.csv|md``, ``verdicts.csv|md``, ``summary.csv``, ``nulls_thresholds.csv|md``;
``spectral/{stem}_spectral.csv`` (+ ``_peaks.csv``); ``nulls/{stem}_perm_null.csv`` where the
run measured the permutation null; ``figures/beyond_{stem}_{NAME}.png|pdf`` where the
kernel-patching, separable or mean-field CSV exists (see ``extras.py``). Every Figure 1
cell links to the head's page ``heads/{model}/{dataset}_{T}/L{layer}H{head}.html``
(written by the head-page step).
"""

import importlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.report import extras as EX
from poskernel_tl.report import figures as F
from poskernel_tl.report import nulls as N
from poskernel_tl.report import tables as TB
from poskernel_tl.report import verdicts as V
from poskernel_tl.report.html import escape, page_html, report_block, write_page
from poskernel_tl.result import ConditionResult

REPORT_DIR = "report"
PERM_ATTRS = ("r2_perm_null", "r2_perm_same_seqs")
FIG_DIR = "figures"


def head_page_href(model: str, dataset: str, length: int, layer: int, head: int) -> str:
    """Relative link from ``report.html`` to one head's page."""
    return (f"heads/{C.model_slug(model)}/{C.dataset_slug(dataset)}_{int(length)}/"
            f"L{int(layer)}H{int(head)}.html")


def cond_text(r: ConditionResult) -> str:
    return f"{F.model_label(r)} · {r.dataset} · T={r.length}"


def esc(text: object) -> str:
    """HTML-escaped text; '://' is written as an entity so no network URL appears in the
    page source even when a dataset name or path contains one."""
    return escape(text).replace("://", ":&#47;&#47;")


def _spectral_module():
    return importlib.import_module("poskernel_tl.analyses.spectral")


def _slim(r: ConditionResult) -> ConditionResult:
    """The condition without the arrays the report does not read (centering means, full
    Gram and logit matrices; per-sequence kernels replaced by a zero-cost view)."""
    slim = r.replace(mean_q=None, mean_k=None, mean_q_half=None, mean_k_half=None,
                     gram_raw=None, gram_centered=None, logits={},
                     g_per_seq=np.broadcast_to(np.zeros((), np.float32), r.g_per_seq.shape))
    for name in PERM_ATTRS:  # the permutation null, while it is not yet a field
        if hasattr(r, name) and not hasattr(slim, name):
            setattr(slim, name, getattr(r, name))
    return slim


def run_spectral(r: ConditionResult, gate_met: bool | None, n_null: int = 2000
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The spectral module's per-condition tables (:func:`poskernel_tl.analyses.spectral.
    run_spectral`), every condition following the grid's gate as the seed asks."""
    table, peaks, _ = _spectral_module().run_spectral(r, None, gate_met=gate_met,
                                                      n_null=n_null)
    return table, peaks


def _percent(x: float) -> str:
    return "–" if not np.isfinite(x) else f"{x:.0f}"


# --------------------------------------------------------------------- HTML pieces
CSS = """<style>
.pk-heat { border-collapse: collapse; font-size: 0.72em; margin: 4px 0 12px; }
.pk-heat td, .pk-heat th { padding: 0; text-align: center; min-width: 2.4em; height: 1.5em; }
.pk-heat th { font-weight: normal; color: #555; padding: 0 4px; }
.pk-heat td a { display: block; text-decoration: none; line-height: 1.5em; }
.pk-heat td.kvb { border-left: 3px solid #fff; }
.pk-v-met { background: #d7f0d2; } .pk-v-partial { background: #fbeec1; }
.pk-v-failed { background: #f6cfcf; } .pk-v-na { background: #e6e6e6; }
.pk-report .pk-verdicts td, .pk-report .pk-verdicts th { text-align: left;
  vertical-align: top; }
.pk-report img.pk-file { max-width: 100%; height: auto; display: block; margin: 8px 0; }
</style>"""


def _hex(value: float) -> tuple[str, str]:
    from matplotlib import colormaps

    if not np.isfinite(value):
        return "#bfbfbf", "#000"
    r, g, b, _ = colormaps["viridis"](float(np.clip(value, 0, 1)))
    lum = 0.299 * r + 0.587 * g + 0.114 * b
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}", \
        "#000" if lum > 0.5 else "#fff"


def heatmap_table(r: ConditionResult, linked: bool = True) -> str:
    """Figure 1 as an HTML table: one coloured cell per (layer, head), each a link to the
    head's page (when ``linked``), kv-group boundaries drawn as white rules."""
    g = r.spec.group_size
    kvb = [' class="kvb"' if g > 1 and h and h % g == 0 else "" for h in range(r.n_heads)]
    head_row = "".join(f"<th{kvb[h]}>H{h}</th>" for h in range(r.n_heads))
    rows = [f"<tr><th></th>{head_row}</tr>"]
    for layer in range(r.n_layers):
        cells = []
        for h in range(r.n_heads):
            v = float(r.r2_pooled[layer, h])
            bg, fg = _hex(v)
            cls = kvb[h]
            href = esc(head_page_href(r.model, r.dataset, r.length, layer, h))
            text = "–" if not np.isfinite(v) else f"{v:.2f}"
            inner = (f'<a href="{href}" style="color:{fg}" title="L{layer}H{h} R²={text}">'
                     f'{text}</a>' if linked else
                     f'<span style="color:{fg}" title="L{layer}H{h} R²={text}">{text}</span>')
            cells.append(f'<td{cls} style="background:{bg}">{inner}</td>')
        rows.append(f"<tr><th>L{layer}</th>{''.join(cells)}</tr>")
    return f'<table class="pk-heat">{"".join(rows)}</table>'


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table, every header and cell escaped (quotes included)."""
    def cell(v) -> str:
        if isinstance(v, float | np.floating):
            return "–" if not np.isfinite(v) else f"{v:.4g}"
        return "–" if v is None or v is pd.NA else esc(v)

    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f'<table class="pk-table"><tr>{head}</tr>{body}</table>'


def _img(path: Path, out: Path, alt: str) -> str:
    rel = path.relative_to(out).as_posix()
    pdf = rel[:-4] + ".pdf"
    return (f'<img class="pk-file" src="{esc(rel)}" alt="{esc(alt)}">'
            f'<p class="pk-note">Files: <a href="{esc(rel)}">PNG</a> · '
            f'<a href="{esc(pdf)}">PDF</a></p>')


def _verdict_html(v: pd.DataFrame) -> str:
    cls = {V.MET: "pk-v-met", V.PARTIAL: "pk-v-partial", V.FAILED: "pk-v-failed",
           V.NA: "pk-v-na"}
    rows = ["<tr><th>criterion</th><th>track</th><th>threshold</th><th>verdict</th>"
            "<th>value</th><th>reading</th><th>numbers / reason</th></tr>"]
    for row in v.to_dict("records"):
        val = row["value"]
        val = "–" if not isinstance(val, float | int) or not np.isfinite(val) else f"{val:.3g}"
        detail = row["reason"] if row["verdict"] == V.NA else row["numbers"]
        rows.append(f"<tr><td>{esc(row['criterion'])}</td><td>{esc(row['track'])}</td>"
                    f"<td>{esc(row['threshold'])}</td><td class=\"{cls[row['verdict']]}\">"
                    f"{esc(row['verdict'])}</td><td>{esc(val)}</td>"
                    f"<td>{esc(row['reading'])}</td><td>{esc(detail)}</td></tr>")
    return f'<table class="pk-table pk-verdicts">{"".join(rows)}</table>'


def _fmt(x, fmt: str = "{:.3f}") -> str:
    return "nan" if x is None or not np.isfinite(float(x)) else fmt.format(float(x))


def _answers(summary: pd.DataFrame, v: pd.DataFrame, gate: tuple, fig4: str,
             calibration: str = "") -> list[str]:
    """The seed's Phase 7 questions (a)–(f), answered from the numbers (escaped HTML)."""
    by = {row["id"]: row for row in v.to_dict("records")}

    def say(cid: str) -> str:
        row = by[cid]
        if row["verdict"] == V.NA:
            return f"<b>not computable</b>: {esc(row['reason'])}."
        return (f"<b>{esc(row['verdict'])}</b>: {esc(row['reading'])}. "
                f"<span class=\"pk-note\">{esc(row['numbers'])}.</span>")

    s = summary
    out = [f"<li><b>(a) Shift-invariance at early layers, Track A, RoPE models.</b> "
           f"{say('early_r2')} {esc(calibration)}</li>"]
    half = "".join(
        f" Centering-noise check (seed: 50 vs 100 centering sequences), {row['model']}/"
        f"{row['dataset']}/T={row['length']}: centering on {row['n_centering_half']} instead "
        f"of {row['n_centering']} sequences changes Track B R² by {_fmt(row['B_half_absdiff'])}"
        " per head on average."
        for row in s[s.centered].to_dict("records") if np.isfinite(row["B_half_absdiff"]))
    rnd = s[~s.natural]
    art = ""
    for row in rnd.to_dict("records"):
        txt = s[(s.model == row["model"]) & (s.length == row["length"]) & s.natural & s.centered]
        for t in txt.to_dict("records"):
            art += (f" {row['model']}/T={row['length']}: Track B raw on random tokens "
                    f"{_fmt(row['B_raw_early'])} vs centered on {t['dataset']} "
                    f"{_fmt(t['B_centered_early'])}.")
    art = art or (" No model has both a random-token and a centered natural-text "
                  "condition, so the seed’s centering-artifact comparison cannot be made.")
    out.append(f"<li><b>(b) Track A vs Track B; is centering creating stationarity?</b> "
               f"{say('agreement')}{esc(art)}{esc(half)}</li>")
    out.append(f"<li><b>(c) NoPE models: low R²?</b> {say('nope')}</li>")
    out.append(f"<li><b>(d) Per-sequence R² spread (content stability).</b> "
               f"{say('seq_std')}</li>")
    out.append(f"<li><b>(e) Decay with depth.</b> {say('depth_decay')}</li>")
    value, met = gate
    gtxt = ("no RoPE model: the gate does not apply" if met is None else
            f"gate value {_fmt(value)} ({'met' if met else 'not met'}, threshold 0.60)")
    out.append(f"<li><b>(f) Spectral alignment with the PE frequencies.</b> {esc(gtxt)}. "
               f"{say('spectral')} {esc(fig4)}</li>")
    out.append(f"<li><b>Random tokens vs natural text.</b> {say('random_vs_text')}</li>")
    return out


def _calibration(results: Sequence[ConditionResult]) -> str:
    """One sentence per rotary condition: its early-layer R² against its nulls."""
    out = []
    for r in results:
        if r.spec.pe != "rope":
            continue
        e = float(np.nanmean(TB.early(r.r2_pooled)))
        iid = N.analytic_null_mean(r.length, len(r.seq_id))
        text = (f"Calibration, {r.model}/{r.dataset}/T={r.length}: early-layer mean {e:.3f} "
                f"vs an i.i.d. null mean of {iid:.1e}")
        s = N.head_null_summary(r)
        if s:
            text += (f" and a permutation null whose largest draw over all heads is "
                     f"{s['null_max_overall']:.3g}; {s['n_above_null_max']}/{s['n_heads']} "
                     "heads lie above every draw of their own null")
        out.append(text + ".")
    return " ".join(out)


def _boundary_html(summary: pd.DataFrame, results: Sequence[ConditionResult]) -> str:
    cols = ["model", "dataset", "length", "A_all", "A_rows_1_20", "A_rows_50plus",
            "A_interior_keys", "A_nosink_all", "A_early_mean", "A_nosink_early"]
    df = summary.reindex(columns=cols).rename(columns={
        "A_all": "pooled R² (all rows)", "A_rows_1_20": "rows 1–20",
        "A_rows_50plus": "rows 50+", "A_interior_keys": "rows and keys 50+",
        "A_nosink_all": "sink column left out", "A_early_mean": "layers 0–1",
        "A_nosink_early": "layers 0–1, sink left out"})
    notes = []
    for r, row in zip(results, summary.to_dict("records")):
        gap = row["A_rows_1_20"] - row["A_rows_50plus"]
        if np.isfinite(gap) and abs(gap) > 0.10:
            notes.append(f"{r.model}/{r.dataset}/T={r.length}: query rows 1–20 differ from "
                         f"rows 50+ by {gap:+.3f} (mean over heads) — a boundary effect.")
        d = np.asarray(r.r2_pooled_nosink) - np.asarray(r.r2_pooled)
        if np.isfinite(d).any():
            i = np.unravel_index(np.nanargmax(np.abs(d)), d.shape)
            notes.append(f"{r.model}/{r.dataset}/T={r.length}: leaving out key 0 (the sink "
                         f"column) changes pooled R² by {np.nanmean(d):+.3f} on average; "
                         f"largest for L{i[0]}H{i[1]} ({d[i]:+.3f}).")
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return (table_html(df) + (f"<ul>{items}</ul>" if items else
                              "<p>No condition shows a rows 1–20 vs 50+ gap above 0.10.</p>"))


def _limitations(results: Sequence[ConditionResult]) -> list[str]:
    models = sorted({r.model for r in results})
    out = []
    if len(models) > 1:
        out.append(f"Tokenizer confound: the models here ({', '.join(models)}) tokenize the "
                   "same text differently, so cross-model differences on natural text mix PE "
                   "scheme with vocabulary size and subword granularity; random tokens "
                   "sidestep this.")
    else:
        out.append("Tokenizer confound: with more than one model, cross-model differences "
                   "on natural text would mix PE scheme with tokenization; only one model is "
                   "in this folder.")
    for r in {r.model: r for r in results if r.spec.loader == "gguf"}.values():
        out.append(f"{F.model_label(r)}: the embedded checkpoint is quantized; its weights "
                   "were dequantized to float for the forward pass, so numbers may differ "
                   "slightly from the original float weights.")
    out.append("Empty cells of the seed's PE × norm grid: NoPE + LayerNorm (no public "
               "pretrained decoder-only model; the public NoPE models use RMSNorm-style "
               "norms) and absolute PE + RMSNorm (no mainstream model combines them: "
               "absolute PE predates RMSNorm's adoption alongside RoPE).")
    present = {F.cell_of(r)[1] for r in results}
    missing = [name for _, name in F.CELLS if name not in present]
    if missing:
        out.append("Cells with no model in this folder: " + ", ".join(missing) +
                   "; criteria that need them are marked not computable.")
    out.append("Causal masking restricts every fit to the strictly lower triangle: the "
               "experiment tests one-sided shift-invariance (Δ > 0) only.")
    perm = [N.perm_null_of(r) for r in results]
    n_perm = sorted({len(p) for p in perm if p is not None})
    if n_perm:
        out.append(f"The joint permutation null uses {', '.join(map(str, n_perm))} "
                   "permutations of the first evaluation sequences only (16 by default): a "
                   "head's percentile in it moves in steps of 100/n_perm.")
    else:
        out.append("The joint permutation null was not measured in these runs; only the "
                   "analytic and (where present) NoPE nulls calibrate the thresholds.")
    return out


def _write_figure(fig, out: Path, name: str) -> Path:
    png, _ = F.save_figure(fig, out / FIG_DIR / name)
    return png


def build_report(results_dir: str | Path, out: str | Path | None = None, *,
                 n_null: int = 2000, head_pages: bool | str = False,
                 progress: bool = False) -> Path:
    """Read every complete condition under ``results_dir`` and write the report (see the
    module docstring); returns the path of ``report.html``. ``head_pages``: also write a
    page per head and per layer under ``heads/`` (the targets of Figure 1's links; about
    a second per head page, mostly matplotlib)."""
    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / REPORT_DIR
    conds = ConditionResult.conditions(results_dir)
    if not conds:
        raise FileNotFoundError(f"no complete condition under {results_dir}")
    results = [_slim(ConditionResult.load(results_dir, *c)) for c in conds]
    out.mkdir(parents=True, exist_ok=True)

    gate = TB.spectral_gate(TB.condition_summary(results))
    spectral: dict = {}
    for r in results:
        table, peaks = run_spectral(r, gate[1], n_null)
        spectral[TB.key_of(r)] = table
        stem = out / "spectral" / r.stem()
        TB.write_table(table, f"{stem}_spectral")
        TB.write_table(peaks, f"{stem}_spectral_peaks")
    summary = TB.condition_summary(results, spectral)
    verdict = V.evaluate(summary)
    t1 = TB.table1(summary)
    TB.write_table(summary, out / "summary")
    TB.write_table(t1, out / "table1", TB.table1_display(t1, summary), "Table 1")
    V.write_verdicts(verdict, out / "verdicts")
    thresholds = N.threshold_table(results)
    TB.write_table(thresholds, out / "nulls_thresholds", title="Thresholds within the nulls")

    import matplotlib

    matplotlib.rcParams["figure.max_open_warning"] = 0
    figs: dict[str, list[str]] = {k: [] for k in ("1", "2", "3", "4", "null")}
    by_model: dict[str, list[ConditionResult]] = {}
    for r in results:
        by_model.setdefault(r.model, []).append(r)
    for model, rs in by_model.items():
        slug = C.model_slug(model)
        figs["1"].append(_img(_write_figure(F.fig1_heatmaps(rs), out, f"fig1_{slug}"), out,
                              f"Figure 1, {model}"))
        figs["2"].append(_img(_write_figure(F.fig2_depth(rs), out, f"fig2_{slug}"), out,
                              f"Figure 2, {model}"))
    by_cond: dict[tuple, list[ConditionResult]] = {}
    for r in results:
        by_cond.setdefault((r.dataset, r.length), []).append(r)
    for (dataset, length), rs in sorted(by_cond.items()):
        name = f"fig3_{C.dataset_slug(dataset)}_{length}"
        figs["3"].append(_img(_write_figure(F.fig3_violins(rs), out, name), out,
                              f"Figure 3, {dataset}, T={length}"))
    fig4_note = ""
    try:
        r4, l4, h4 = F.pick_spectral_head(results)
    except ValueError as err:
        figs["4"].append(f"<p>Figure 4 not drawn: {esc(err)}.</p>")
    else:
        full = ConditionResult.load(results_dir, r4.model, r4.dataset, r4.length)
        g, _ = full.g_trackB
        res = _spectral_module().spectral_alignment(g[l4, h4], full.thetas, length=full.length,
                                                    usage=None if full.usage is None
                                                    else full.usage[l4, h4], n_null=n_null)
        fig = F.fig4_spectral(full, l4, h4, res, gate_met=gate[1])
        figs["4"].append(_img(_write_figure(fig, out, "fig4"), out, "Figure 4"))
        p = res.get("p_value", np.nan)
        fig4_note = (f"Figure 4 head: {r4.model}/{r4.dataset}/T={r4.length} L{l4}H{h4}, "
                     f"{int(np.sum(res.get('matched', [])))} of its "
                     f"{len(res.get('peaks', []))} top peaks matched a θᵢ " +
                     (f"(p = {p:.3g} against the rescaled-θ null)." if np.isfinite(p) else
                      "(no significant peak, so no p-value against the rescaled-θ null)."))
        del full
    for r in results:
        nope = N.nope_r2(results, dataset=r.dataset, length=r.length)
        fig = F.fig_nulls(r, nope if nope.size and r.spec.pe != "none" else None)
        figs["null"].append(_img(_write_figure(fig, out, f"nulls_{r.stem()}"), out,
                                 f"nulls, {r.stem()}"))
        head_null = N.head_null_table(r)
        if head_null is not None:
            TB.write_table(head_null, out / "nulls" / f"{r.stem()}_perm_null")

    beyond = EX.report_section(results_dir, results, lambda fig, name, alt: _img(
        _write_figure(fig, out, name), out, alt))
    paged = _paged(results, head_pages)
    html = _page(results_dir, out, results, summary, verdict, t1, thresholds, gate, figs,
                 fig4_note, paged, beyond)
    page = write_page(out / "report.html", html)
    if paged:
        _write_head_pages(results_dir, out, [r for r in results if r.stem() in paged],
                          spectral, progress)
    return page


def _paged(results, head_pages: bool | str) -> set[str]:
    """The conditions (stems) that get head pages."""
    if head_pages in (False, None, "none"):
        return set()
    if head_pages in (True, "all"):
        return {r.stem() for r in results}
    if head_pages == "first":
        centered = [r for r in results if r.centered] or list(results)
        return {centered[0].stem()}
    raise ValueError(f"head_pages={head_pages!r}: choose all, first or none")


def _write_head_pages(results_dir: Path, out: Path, results, spectral: dict,
                      progress: bool) -> None:
    """A page per head and per layer under ``out/heads/`` (the link targets of Figure 1),
    with token strings when the model's tokenizer can be loaded here."""
    from poskernel_tl.report.pages import sequence_tokens, write_head_pages

    decode = None
    names = {r.model for r in results}
    if len(names) == 1:
        try:
            from poskernel_tl.loading import load_tokenizer

            decode = sequence_tokens(results_dir, load_tokenizer(next(iter(names))))
        except Exception:  # no tokenizer here: positions are labelled by index
            decode = None
    with_logits = []
    for r in results:
        full = ConditionResult.load(results_dir, r.model, r.dataset, r.length)
        first = {k: full.logits[k] for k in sorted(full.logits)[:1]}
        with_logits.append(r.replace(logits=first))
        del full
    tables = {"spectral": pd.concat(list(spectral.values()), ignore_index=True)} \
        if spectral else {}
    tables[EX.HEAD_TABLE] = EX.head_frame(results_dir, results)
    write_head_pages(with_logits, out, tokenizer_decode=decode, tables=tables,
                     progress=progress)


def _page(results_dir, out, results, summary, verdict, t1, thresholds, gate, figs,
          fig4_note, paged: set[str] | None = None, beyond: str = "") -> str:
    heat = []
    for r in results:
        table = heatmap_table(r, r.stem() in (paged or set()))
        heat.append(f"<details{' open' if not heat else ''}><summary>"
                    f"{esc(cond_text(r))}</summary>{table}</details>")
    perm = [r for r in results if N.perm_null_of(r) is not None]
    perm_lines = "".join(
        f"<li>{esc(r.stem())}: {s['n_above_null_max']}/{s['n_heads']} heads above the "
        f"largest of their {s['n_perm']} permuted R² (null mean {s['null_mean_overall']:.2g}"
        f", max {s['null_max_overall']:.2g})</li>"
        for r in perm for s in [N.head_null_summary(r)])
    nope = N.nope_r2(results)
    nope_txt = (f"Empirical NoPE null: {len(nope)} heads, median {np.median(nope):.3f}; "
                f"0.40 is at its {_percent(N.percentile_of(0.40, nope))}th and 0.80 at its "
                f"{_percent(N.percentile_of(0.80, nope))}th percentile."
                if nope.size else "No NoPE model in this folder: the empirical NoPE null "
                "the seed asks for cannot be formed; the analytic and permutation nulls "
                "stand in.")
    conds = "".join(f"<li>{esc(cond_text(r))} — "
                    f"{len(r.seq_id)} evaluation sequences, "
                    f"{'centered' if r.centered else 'uncentered'} Track B, "
                    f"{esc(r.provenance.get('weights', 'weights not recorded'))}</li>"
                    for r in results)
    sections = [
        CSS, "<h1>Positional-kernel report</h1>",
        f"<p class=\"pk-note\">Conditions read from <code>{esc(results_dir.name)}</code>: "
        f"{len(results)}.</p><ul>{conds}</ul>",
        "<h2>Results</h2><ul>" + "".join(_answers(summary, verdict, gate, fig4_note,
                                                  _calibration(results))) +
        "</ul>",
        "<h2>Pre-registration verdicts</h2>" + _verdict_html(verdict) +
        '<p class="pk-note">Files: <a href="verdicts.csv">CSV</a> · '
        '<a href="verdicts.md">Markdown</a>. The thresholds are uncalibrated (seed '
        "calibration note); see the nulls below.</p>",
        "<h2>Table 1</h2>" + table_html(TB.table1_display(t1, summary)) +
        '<p class="pk-note">Files: <a href="table1.csv">CSV</a> · '
        '<a href="table1.md">Markdown</a> · <a href="summary.csv">all summary numbers</a>'
        "</p>",
        "<h2>Figure 1 — Track A pooled R² per head</h2>"
        '<p class="pk-note">Click a cell for the head’s page.</p>' + "".join(heat)
        + "".join(figs["1"]),
        "<h2>Figure 2 — mean R² per layer</h2>" + "".join(figs["2"]),
        "<h2>Figure 3 — per-sequence R² of the top early-layer heads</h2>"
        + "".join(figs["3"]),
        "<h2>Figure 4 — spectrum of one early rotary head</h2>" + "".join(figs["4"]),
        "<h2>Nulls</h2><p>Analytic i.i.d. null: E[R²] = (T−2)/(N−1) with N the number of "
        "strictly-lower-triangle entries fitted. Joint position-permutation null: q and k "
        "positions permuted together, every logit kept, offsets destroyed.</p>"
        + (f"<ul>{perm_lines}</ul>" if perm_lines else
           "<p>Permutation null not measured in these runs.</p>")
        + f"<p>{esc(nope_txt)}</p>" + table_html(thresholds) + "".join(figs["null"]),
        "<h2>Early positions and the sink column</h2>" + _boundary_html(summary, results),
        beyond,
        "<h2>Limitations</h2><ul>" + "".join(f"<li>{esc(t)}</li>"
                                             for t in _limitations(results)) + "</ul>",
    ]
    return page_html("Positional-kernel report", report_block("\n".join(sections),
                                                                include_style=False))


__all__ = ["build_report", "head_page_href", "heatmap_table", "run_spectral"]

"""The report's words: what the protocol is, the results section (the protocol's questions
(a)–(f) answered from the numbers), the verdict table, the boundary-effect table, the
limitations and the list of damaged conditions. Pure functions of numbers already read;
every piece returns escaped HTML."""

import shlex
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import figures, nulls, tables, verdicts
from poskernel_tl.report.collect import Damaged
from poskernel_tl.report.html import cell_text, esc, number
from poskernel_tl.report.tables import dataset_label

PROTOCOL = "the pre-registered protocol (Experiment 1)"
PROTOCOL_HTML = (
    '<details class="pk-fold"><summary><b>What this report tests</b>: the protocol, its two '
    "tracks and its criteria</summary><p>The report follows <b>the pre-registered protocol "
    "(Experiment 1: Estimating the Positional Kernel From Queries and Keys)</b>. It asks "
    "whether each attention head's pre-softmax logits A(t, s) depend on position only "
    "through the offset Δ = t − s, that is, whether they are a shift-invariant kernel "
    "g(Δ). <b>Track A</b> fits g(Δ) to the raw logits of each sequence and pooled over "
    "sequences; <b>Track B</b> fits it to the averaged Gram matrix of queries and keys, "
    "centered by per-position means; both report R² on the strictly lower (causal) "
    "triangle (for a bidirectional encoder, on every entry off the diagonal, one g per "
    "signed offset)."
    " Its criteria were fixed before any data were seen: early-layer R² above "
    "0.80 supports the claim and below 0.40 falsifies it, the two tracks should agree within "
    "0.10, and the spectral analysis (do the peaks of g's spectrum sit at the rotary "
    "frequencies θᵢ?) runs on Track B only if the early-layer Track A R² exceeds 0.60 (the "
    "gate). The verdicts apply those rules as written; anything beyond them is labelled "
    "exploratory or listed under further analyses.</p></details>")


def cond_text(r: ConditionResult) -> str:
    return f"{figures.model_label(r)} · {dataset_label(r.dataset)} · T={r.length}"


def condition_line(r: ConditionResult) -> str:
    """One condition as the report lists it: sequences, centering, weights, and its
    layers' schemes where they differ."""
    layers = r.provenance.get("layers", "")
    return (f"{cond_text(r)} — {len(r.seq_id)} evaluation sequences, "
            f"{'centered' if r.centered else 'uncentered'} Track B, "
            f"{r.provenance.get('weights', 'weights not recorded')}"
            + (f"; layers: {layers}" if ";" in layers else ""))


def fmt(x, spec: str = "{:.3f}") -> str:
    return number(x, spec, "nan")


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table, every header and cell escaped (quotes included)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(cell_text(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f'<table class="pk-table"><tr>{head}</tr>{body}</table>'


def damaged_html(damaged: Sequence[Damaged], folder: Path) -> str:
    """The conditions left out, at the top of the report ("" when none), with what to run
    again: the grid that made ``folder`` (it keeps a manifest; the grid redoes damaged
    conditions) or ``poskernel run`` for a run's folder, on the folder's real path."""
    if not damaged:
        return ""
    items = "".join(f"<li><code>{esc(d.condition)}</code>: <code>{esc(d.file or '?')}</code>"
                    f" — {esc(d.reason)}</li>" for d in damaged)
    many = len(damaged) > 1
    real = shlex.quote(str(Path(folder).resolve()))
    again = (f"Rerun the grid that made this folder (<code>poskernel grid … --out {esc(real)}"
             "</code>: it redoes damaged conditions)" if (Path(folder) / C.MANIFEST).exists()
             else f"Rerun <code>poskernel run</code> for {'them' if many else 'it'} with "
             f"<code>--out {esc(real)} --overwrite</code>")
    return (f'<div class="pk-damaged"><p><b>{len(damaged)} condition{"s" if many else ""} '
            f'could not be read and {"are" if many else "is"} left out of this report:</b></p>'
            f"<ul>{items}</ul><p>{again}, then <code>poskernel report {esc(real)}</code>."
            "</p></div>")


def design_banner(results: Sequence[ConditionResult]) -> tuple[str, str]:
    """(a banner naming each way the report's conditions differ from seed 004's design, a
    note for every verdict cell such as "(exploratory: n = 4, T = 32)"); ("", "") for a
    report of the design's own conditions."""
    rows = []
    for r in results:
        n = len(r.seq_id) + int(r.n_centering)
        for diff in protocol.design_differences(n, r.length, bool(r.centered),
                                                r.dataset != "random"):
            rows.append((cond_text(r), diff))
    if not rows:
        return "", ""
    ns = sorted({len(r.seq_id) + int(r.n_centering) for r in results})
    ts = sorted({r.length for r in results})
    span = lambda xs: str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}"  # noqa: E731
    items = "".join(f"<li><code>{esc(c)}</code>: {esc(d)}</li>" for c, d in rows)
    banner = ('<div class="pk-damaged"><details><summary><b>Exploratory: these conditions '
              "are not the protocol's design, so the verdicts below describe these data, not "
              f"the pre-registered test</b> ({len(rows)} differences)</summary><ul>{items}</ul>"
              "</details></div>")
    return banner, f"(exploratory: n = {span(ns)}, T = {span(ts)})"


def folded(summary: str, body: str) -> str:
    """``summary`` shown, ``body`` folded under it (both already HTML)."""
    return (f'<details class="pk-fold"><summary>{summary}</summary>{body}</details>'
            if body else summary)


def verdict_html(v: pd.DataFrame, note: str = "") -> str:
    """The verdict table; each row's reading shown and the numbers behind it (or, when not
    computable, the reason) folded under it."""
    cls = {verdicts.MET: "pk-v-met", verdicts.PARTIAL: "pk-v-partial",
           verdicts.FAILED: "pk-v-failed", verdicts.NA: "pk-v-na"}
    rows = ["<tr><th>criterion</th><th>track</th><th>threshold</th><th>verdict</th>"
            "<th>value</th><th>reading (click for the numbers)</th></tr>"]
    for row in v.to_dict("records"):
        val = row["value"]
        val = "–" if not isinstance(val, float | int) or not np.isfinite(val) else f"{val:.3g}"
        detail = row["reason"] if row["verdict"] == verdicts.NA else row["numbers"]
        reading = folded(esc(row["reading"]), esc(detail) if detail != row["reading"] else "")
        rows.append(f"<tr><td>{esc(row['criterion'])}</td><td>{esc(row['track'])}</td>"
                    f"<td>{esc(row['threshold'])}</td><td class=\"{cls[row['verdict']]}\">"
                    f"{esc(row['verdict'])}{' ' + esc(note) if note else ''}</td>"
                    f"<td>{esc(val)}</td>"
                    f"<td>{reading}</td></tr>")
    return f'<table class="pk-table pk-verdicts">{"".join(rows)}</table>'


def exploratory_sentence(summary: pd.DataFrame, gate_met: bool | None) -> str:
    """Both g sources' share of aligned early-layer heads over the rotary conditions, with
    the test's false-positive rate on the same heads ("" without spectral results)."""
    rope = summary[summary["pe"] == "rope"] if len(summary) else summary
    parts = []
    sources = (("specB_", "a Track B g(Δ) (centered Gram; raw where a condition is "
                          "uncentered)"), ("specA_", "a Track A pooled g(Δ)"))
    for prefix, name in sources:
        n = rope[f"{prefix}n_early"].to_numpy(np.float64) if len(rope) else np.zeros(0)
        share = rope[f"{prefix}aligned_early"].to_numpy(np.float64) if len(rope) else n
        fpr = rope[f"{prefix}fpr_early"].to_numpy(np.float64) if len(rope) else n
        ok = np.isfinite(share) & (n > 0)
        if not ok.any():
            return ""
        k, total = int(round((share[ok] * n[ok]).sum())), int(n[ok].sum())
        rate = float((fpr[ok] * n[ok]).sum() / total)
        parts.append((name, k, total, rate))
    label = "Exploratory, ungated" if gate_met is False else "Exploratory"
    (nb, kb, tb, fb), (na, ka, ta, fa) = parts
    return (f"{label}: over the early-layer heads (layers 0–1) of the rotary conditions, "
            f"{kb} of {tb} ({100 * kb / tb:.0f}%) have {nb} aligned with the rotary "
            f"frequencies and {ka} of {ta} ({100 * ka / ta:.0f}%) {na}; the test's "
            f"false-positive rate on these heads is {100 * fb:.1f}% and {100 * fa:.1f}%. "
            "Per condition: Table 1.")


def answers(summary: pd.DataFrame, v: pd.DataFrame, gate: tuple, fig4: str,
            calibration: str = "") -> list[str]:
    """The protocol's questions (a)–(f), answered from the numbers (escaped HTML items)."""
    by = {row["id"]: row for row in v.to_dict("records")}

    def item(question: str, cid: str, before: str = "", after: str = "") -> str:
        """A question with its verdict shown and the reading and numbers folded."""
        row = by[cid]
        body = (f"not computable: {esc(row['reason'])}." if row["verdict"] == verdicts.NA
                else f"{esc(row['reading'])}. <span class=\"pk-note\">"
                     f"{esc(row['numbers'])}.</span>")
        head = f"<b>{esc(question)}</b> — <b>{esc(row['verdict'])}</b>"
        return f"<li>{folded(head, before + body + after)}</li>"

    s = summary
    half = "".join(
        f" Centering-noise check (the protocol's 50 vs 100 centering sequences), {r['model']}/"
        f"{r['dataset_label']}/T={r['length']}: centering on {r['n_centering_half']} instead "
        f"of {r['n_centering']} sequences changes Track B R² by {fmt(r['B_half_absdiff'])}"
        " per head on average." for r in s[s.centered].to_dict("records")
        if np.isfinite(r["B_half_absdiff"]))
    art = ""
    for r in s[~s.natural].to_dict("records"):
        same = s[(s.model == r["model"]) & (s.length == r["length"]) & s.natural & s.centered]
        for t in same.to_dict("records"):
            art += (f" {r['model']}/T={r['length']}: Track B raw on random tokens "
                    f"{fmt(r['B_raw_early'])} vs centered on {t['dataset_label']} "
                    f"{fmt(t['B_centered_early'])}.")
    art = art or (" No model has both a random-token and a centered natural-text "
                  "condition, so the protocol's centering-artifact comparison cannot be made.")
    value, met = gate
    gtxt = ("no RoPE model: the gate does not apply" if met is None else
            f"gate value {fmt(value)} ({'met' if met else 'not met'}, threshold 0.60)")
    explore = exploratory_sentence(s, met)
    return [
        item("(a) Shift-invariance at early layers, Track A, RoPE models.", "early_r2",
             after=f" {esc(calibration)}"),
        item("(b) Track A vs Track B; is centering creating stationarity?", "agreement",
             after=esc(art) + esc(half)),
        item("(c) NoPE models: low R²?", "nope"),
        item("(d) Per-sequence R² spread (content stability).", "seq_std"),
        item("(e) Decay with depth.", "depth_decay"),
        item("(f) Spectral alignment with the PE frequencies.", "spectral",
             before=f"{esc(gtxt)}. ", after=f" {esc(fig4)}" + (
                 f' <span class="pk-explore">{esc(explore)}</span>' if explore else "")),
        item("Random tokens vs natural text.", "random_vs_text")]


def calibration(results: Sequence[ConditionResult]) -> str:
    """One sentence per rotary condition: its early-layer R² against its nulls."""
    out = []
    for r in results:
        if r.spec.pe != "rope":
            continue
        e = float(np.nanmean(tables.early(r.r2_pooled)))
        iid = nulls.analytic_null_mean(r.length, len(r.seq_id))
        text = (f"Calibration, {r.model}/{dataset_label(r.dataset)}/T={r.length}: early-layer "
                f"mean {e:.3f} vs an i.i.d. null mean of {iid:.1e}")
        s = nulls.head_null_summary(r)
        if s:
            text += (f" and a permutation null whose largest draw over all heads is "
                     f"{s['null_max_overall']:.3g}; {s['n_above_null_max']}/{s['n_heads']} "
                     "heads lie above every draw of their own null")
        out.append(text + ".")
    return " ".join(out)


def boundary_html(summary: pd.DataFrame, results: Sequence[ConditionResult]) -> str:
    cols = ["model", "dataset", "length", "A_all", "A_rows_1_20", "A_rows_50plus",
            "A_interior_keys", "A_nosink_all", "A_early_mean", "A_nosink_early"]
    df = summary.reindex(columns=cols).rename(columns={
        "A_all": "pooled R² (all rows)", "A_rows_1_20": "rows 1–20",
        "A_rows_50plus": "rows 50+", "A_interior_keys": "rows and keys 50+",
        "A_nosink_all": "sink column left out", "A_early_mean": "layers 0–1",
        "A_nosink_early": "layers 0–1, sink left out"})
    df["dataset"] = [dataset_label(d) for d in df["dataset"]]
    notes = []
    for r, row in zip(results, summary.to_dict("records")):
        name = f"{r.model}/{dataset_label(r.dataset)}/T={r.length}"
        gap = row["A_rows_1_20"] - row["A_rows_50plus"]
        if np.isfinite(gap) and abs(gap) > 0.10:
            notes.append(f"{name}: query rows 1–20 differ from rows 50+ by {gap:+.3f} (mean "
                         "over heads) — a boundary effect.")
        d = np.asarray(r.r2_pooled_nosink) - np.asarray(r.r2_pooled)
        if np.isfinite(d).any():
            i = np.unravel_index(np.nanargmax(np.abs(d)), d.shape)
            notes.append(f"{name}: leaving out key 0 (the sink column) changes pooled R² by "
                         f"{np.nanmean(d):+.3f} on average; largest for L{i[0]}H{i[1]} "
                         f"({d[i]:+.3f}).")
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return table_html(df) + (f"<ul>{items}</ul>" if items else
                             "<p>No condition shows a rows 1–20 vs 50+ gap above 0.10.</p>")


def limitations(results: Sequence[ConditionResult]) -> list[str]:
    models = sorted({r.model for r in results})
    out = [f"Tokenizer confound: the models here ({', '.join(models)}) tokenize the same text "
           "differently, so cross-model differences on natural text mix PE scheme with "
           "vocabulary size and subword granularity; random tokens sidestep this."
           if len(models) > 1 else
           "Tokenizer confound: with more than one model, cross-model differences on natural "
           "text would mix PE scheme with tokenization; only one model is in this folder."]
    for r in {r.model: r for r in results if r.spec.loader == "gguf"}.values():
        out.append(f"{figures.model_label(r)}: the embedded checkpoint is quantized; its weights "
                   "were dequantized to float for the forward pass, so numbers may differ "
                   "slightly from the original float weights.")
    out.append("Empty cells of the protocol's PE × norm grid: NoPE + LayerNorm (no public "
               "pretrained decoder-only model; the public NoPE models use RMSNorm-style "
               "norms) and absolute PE + RMSNorm (no mainstream model combines them).")
    present = {figures.cell_of(r)[1] for r in results}
    missing = [name for _, name in figures.CELLS if name not in present]
    if missing:
        out.append("Cells with no model in this folder: " + ", ".join(missing) +
                   "; criteria that need them are marked not computable.")
    out.append("Causal masking restricts every fit to the strictly lower triangle: the "
               "experiment tests one-sided shift-invariance (Δ > 0) only.")
    n_perm = sorted({len(p) for p in (nulls.perm_null_of(r) for r in results) if p is not None})
    out.append(f"The joint permutation null uses {', '.join(map(str, n_perm))} permutations "
               "of the first evaluation sequences only: a head's percentile in it moves in "
               "steps of 100/n_perm." if n_perm else
               "The joint permutation null was not measured in these runs; only the analytic "
               "and (where present) NoPE nulls calibrate the thresholds.")
    return out


__all__ = ["PROTOCOL", "PROTOCOL_HTML", "answers", "boundary_html", "calibration",
           "cond_text", "damaged_html", "design_banner", "esc", "exploratory_sentence", "fmt",
           "folded", "limitations", "table_html", "verdict_html"]


def layer_kinds_html(results: Sequence[ConditionResult]) -> str:
    """For each condition whose layers differ in positional scheme (Gemma 3's local and
    global layers, SmolLM3's RoPE and NoPE layers): Track A's pooled R² per kind of layer,
    on what each layer's mask keeps and, where a window removes entries, over the whole
    causal triangle (the diagnostic). Exploratory: the protocol pre-registers no split by
    layer kind. Empty when every condition's layers agree."""
    rows = []
    for r in results:
        layers = r.spec.layers
        if not layers or len({s.kind for s in layers}) < 2:
            continue
        whole = getattr(r, "r2_pooled_whole", None)
        for kind in dict.fromkeys(s.kind for s in layers):
            ix = [i for i, s in enumerate(layers) if s.kind == kind]
            rows.append({"condition": cond_text(r), "layer kind": kind,
                         "layers": ", ".join(map(str, ix)),
                         "mean pooled R² (kept entries)": fmt(np.nanmean(r.r2_pooled[ix])),
                         "… over the whole triangle": "—" if whole is None or not
                         np.isfinite(whole[ix]).any() else fmt(np.nanmean(whole[ix]))})
    if not rows:
        return ""
    return ("<h2>Layer kinds (exploratory)</h2><p>Each layer is fitted on the entries its "
            "own mask keeps (a sliding-window layer: offsets below its window); the whole "
            "triangle, logits the window removes included, is shown for contrast (— for a "
            "chunked layer past its chunk: its logits across chunks are not read). Not "
            "pre-registered: read as description.</p>" + table_html(pd.DataFrame(rows)))


"""The atlas (exploratory): which kind of positional kernel each head implements, per
layer, for every condition side by side (Figure 5), Track A's R² by offset band per layer,
and the kernel classes against TransformerLens's previous-token-head score.

Reads the tables each condition saved beside its Track A and Track B tables
(``{stem}_heads.csv``: :mod:`poskernel_tl.fit.kernel_class`; ``{stem}_bands.csv``: the band
fits); a condition saved without them is left out of the atlas and named.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from poskernel_tl import constants as C
from poskernel_tl.fit.kernel_class import CLASSES
from poskernel_tl.measurement.parts import condition_entries, condition_values
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report.figures import condition_label
from poskernel_tl.report.html import esc
from poskernel_tl.report.sections import table_html
from poskernel_tl.report.tables import write_table

COLORS = {"content": "#bbbbbb", "previous-token": "#d62728", "sink": "#9467bd",
          "local": "#ff7f0e", "periodic": "#2ca02c", "decay": "#1f77b4", "other": "#8c564b"}
TL_ABOVE, TL_BELOW = 0.4, 0.2  # TL score that a previous-token head must reach / never miss


def read_tables(results_dir: Path, results: list[ConditionResult]
                ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Every condition's heads and bands tables, and the stems that lack them."""
    heads, bands, missing = [], [], []
    for r in results:
        paths = [C.result_path(results_dir, r.model, r.dataset, r.length, s)
                 for s in (C.HEADS_CSV, C.BANDS_CSV)]
        if not all(p.exists() for p in paths):
            missing.append(r.stem())
            continue
        heads.append(pd.read_csv(paths[0]).assign(condition=condition_label(r)))
        bands.append(pd.read_csv(paths[1]).assign(condition=condition_label(r)))
    cat = lambda x: pd.concat(x, ignore_index=True) if x else pd.DataFrame()
    return cat(heads), cat(bands), missing


def per_condition(heads: pd.DataFrame) -> pd.DataFrame:
    """Per condition (the index), its model, dataset and length and every registered
    statistic's per-condition values (a column each)."""
    rows = [{"condition": cond, **{k: part[k].iloc[0] for k in ("model", "dataset", "length")},
             **condition_values(part)} for cond, part in heads.groupby("condition", sort=False)]
    return pd.DataFrame(rows).set_index("condition")


def per_condition_of(results_dir: Path, results: list[ConditionResult]) -> pd.DataFrame:
    """:func:`per_condition` of the conditions' saved heads tables (empty without any)."""
    heads = read_tables(results_dir, results)[0]
    return pd.DataFrame() if heads.empty else per_condition(heads)


def statistics_html(per: pd.DataFrame, out: Path) -> str:
    """Each registered statistic's per-condition values as a model × (dataset, T) table
    (``atlas_{value}``: CSV and Markdown), labelled exploratory, with its description."""
    html = []
    for key, label, description in condition_entries():
        if key not in per or per[key].isna().all():
            continue
        table = per.pivot_table(index="model", columns=["dataset", "length"], values=key)
        table.columns = [f"{d}, T = {t}" for d, t in table.columns]
        write_table(table.round(3).reset_index(), out / f"atlas_{key}")
        html += [f"<h3>{esc(label[:1].upper() + label[1:])} (exploratory)</h3>",
                 f'<p class="pk-note">{esc(description)}.</p>',
                 table_html(table.round(3).reset_index()),
                 f'<p class="pk-note">File: <a href="atlas_{key}.csv">atlas_{key}.csv</a></p>']
    return "".join(html)


def class_counts(heads: pd.DataFrame) -> pd.DataFrame:
    """Heads of each class per (condition, layer)."""
    counts = pd.crosstab([heads["condition"], heads["layer"]], heads["kernel_class"])
    return counts.reindex(columns=[c for c in CLASSES if c in counts.columns] or None,
                          fill_value=0).reset_index()


def band_table(bands: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads of the pooled band R², per (condition, layer), one column per band."""
    b = bands.assign(band=[f"{lo}-{hi}" for lo, hi in zip(bands["band_lo"], bands["band_hi"])])
    order = list(dict.fromkeys(b["band"]))
    table = b.pivot_table(index=["condition", "layer"], columns="band", values="R2_pooled",
                          aggfunc="mean", sort=False)
    return table[order].reset_index()


def tl_disagreements(heads: pd.DataFrame) -> pd.DataFrame:
    """Heads TransformerLens scores above 0.4 that are not classed previous-token, and
    heads classed previous-token that it scores below 0.2."""
    if "tl_prev_token" not in heads:
        return pd.DataFrame()
    prev = heads["kernel_class"] == "previous-token"
    bad = (heads["tl_prev_token"] > TL_ABOVE) & ~prev | prev & (heads["tl_prev_token"] < TL_BELOW)
    return heads.loc[bad, ["condition", "layer", "head", "kernel_class", "prev_share",
                           "tl_prev_token", "R2_pooled"]]


def fig5_classes(counts: pd.DataFrame) -> Figure:
    """One panel per condition (of one model): heads of each class, stacked, per layer."""
    conds = list(dict.fromkeys(counts["condition"]))
    fig = Figure(figsize=(7, 1.9 * len(conds) + 0.6), layout="constrained")
    axes = fig.subplots(len(conds), 1, squeeze=False, sharex=True)[:, 0]
    for ax, cond in zip(axes, conds):
        part = counts[counts["condition"] == cond]
        bottom = np.zeros(len(part))
        for cls in CLASSES:
            if cls in part:
                ax.bar(part["layer"], part[cls], bottom=bottom, color=COLORS[cls], label=cls)
                bottom += part[cls].to_numpy()
        ax.set_title(cond, fontsize=9)
        ax.set_ylabel("heads")
    axes[-1].set_xlabel("layer")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=len(labels), fontsize=8)
    return fig


def fig5_bands(bands: pd.DataFrame) -> Figure:
    """Mean pooled R² per layer of each partition band, one panel per condition."""
    conds = list(dict.fromkeys(bands["condition"]))
    fig = Figure(figsize=(7, 1.9 * len(conds) + 0.3), layout="constrained")
    axes = fig.subplots(len(conds), 1, squeeze=False, sharex=True)[:, 0]
    for ax, cond in zip(axes, conds):
        part = bands[(bands["condition"] == cond) &
                     ((bands["band_lo"] > 1) | (bands["band_hi"] == bands["band_hi"].min()))]
        for (lo, hi), rows in part.groupby(["band_lo", "band_hi"], sort=True):
            mean = rows.groupby("layer")["R2_pooled"].mean()
            ax.plot(mean.index, mean.to_numpy(), marker=".", label=f"Δ {lo}–{hi}")
        ax.set_title(cond, fontsize=9)
        ax.set_ylabel("R², band")
        ax.legend(fontsize=7, ncols=3)
    axes[-1].set_xlabel("layer")
    return fig


def section(results_dir: Path, results: list[ConditionResult], out: Path, figure) -> str:
    """The atlas's HTML, its tables written under ``out`` (``atlas_classes``,
    ``atlas_bands``, ``atlas_tl_disagreements``: CSV and Markdown); ``figure(fig, name,
    alt)`` saves a figure and returns its HTML."""
    heads, bands, missing = read_tables(results_dir, results)
    if heads.empty:
        return ""
    counts, band_means, tl = class_counts(heads), band_table(bands), tl_disagreements(heads)
    for df, name in ((counts, "atlas_classes"), (band_means, "atlas_bands"),
                     (tl, "atlas_tl_disagreements")):
        write_table(df, out / name)
    n_tl = int((heads.get("tl_prev_token", pd.Series(dtype=float)) > TL_ABOVE).sum())
    tl_text = (f"TransformerLens's previous-token-head score (its own detection pattern, on "
               f"the measured attention of the first evaluation sequences) is above "
               f"{TL_ABOVE} for {n_tl} heads; {len(tl)} heads disagree with the kernel class "
               f"(scored above {TL_ABOVE} but not classed previous-token, or classed "
               f"previous-token but scored below {TL_BELOW})." if "tl_prev_token" in heads
               else "No TransformerLens score was saved with these conditions.")
    totals = heads.groupby("condition")["kernel_class"].value_counts().unstack(fill_value=0)
    per = per_condition(heads)
    totals = totals.join(per.drop(columns=["model", "dataset", "length"]).rename(
        columns={key: label for key, label, _ in condition_entries()}))
    return "".join([
        "<h2>Figure 5 — the atlas: which kernel each head implements (exploratory)</h2>",
        '<p class="pk-note">Exploratory: not part of the pre-registered protocol. Each '
        "head's class comes from its pooled g(Δ), its sink column and its permutation null "
        "(rules in the docs, <i>Kernel classes and the atlas</i>); the band R² is Track A fitted "
        "on the entries of one band of offsets alone.</p>",
        table_html(totals.reset_index()),
        *(figure(fig5_classes(counts[counts["condition"].isin(conds)]),
                 f"fig5_classes_{C.model_slug(model)}", f"Figure 5, kernel classes, {model}")
          + figure(fig5_bands(bands[bands["model"] == model]), f"fig5_bands_{C.model_slug(model)}",
                   f"Figure 5, R² by offset band, {model}")
          for model, conds in heads.groupby("model", sort=False)["condition"]),
        f"<p>{esc(tl_text)}</p>", table_html(tl.head(40)) if len(tl) else "",
        statistics_html(per, out),
        '<p class="pk-note">Files: <a href="atlas_classes.csv">classes per layer</a> · '
        '<a href="atlas_bands.csv">band R² per layer</a> · <a href="atlas_tl_disagreements.csv">'
        "disagreements with TransformerLens</a>"
        + (f"; left out (saved without the atlas tables): {esc(', '.join(missing))}"
           if missing else "") + "</p>"])

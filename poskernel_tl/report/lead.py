"""The report's opening answer: two lines per condition, read before any figure.

The first line answers the protocol's question for the condition (is an early-layer head's
logit a function of the offset Δ?): Track A's pooled R² over layers 0–1, what that value
means under the pre-registered bands (for rotary models; a NoPE model is expected below
0.40) and Track B's R² beside it. The second line says where that leaves the rest of the
model: the late layers, how many heads are above 0.80, the best head (a link into its view)
and the spectral outcome. Pure functions of numbers the report already read; escaped HTML.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.protocol import LATE_FROM
from poskernel_tl.report.html import esc, number
from poskernel_tl.report.tables import dataset_label, key_of
from poskernel_tl.report.viewer_data import head_anchor

STRONG, WEAK = 0.80, 0.40  # the protocol's bands for the early-layer R²


def _f(x) -> str:
    return number(x, "{:.2f}", "–")


def band(pe: str | None, value: float) -> str:
    """What an early-layer R² means under the protocol, for a model of this PE."""
    if not np.isfinite(value):
        return "not computable"
    if pe == "none":
        return ("below 0.40, as the protocol expects of a NoPE model" if value < WEAK else
                "0.40 or above: position leaks in without a PE")
    if pe != "rope":
        return "the protocol's bands are set for rotary models"
    return ("strong support (> 0.80)" if value > STRONG else
            "partial support (0.40–0.80)" if value >= WEAK else "falsified (< 0.40)")


def _best(r: ConditionResult) -> str:
    r2 = np.asarray(r.r2_pooled, np.float64)
    if not np.isfinite(r2).any():
        return ""
    layer, head = np.unravel_index(np.nanargmax(r2), r2.shape)
    href = "report.html#" + head_anchor(r.model, r.dataset, r.length, int(layer), int(head))
    return (f'; best <a href="{esc(href)}">L{layer}H{head}</a> '
            f"({_f(r2[layer, head])})")


def first_line(r: ConditionResult, s: Mapping) -> str:
    a = float(s["A_early_mean"])
    b, which = ((s["B_centered_early"], "centered") if s["centered"]
                else (s["B_raw_early"], "raw Gram, uncentered"))
    return (f"Early layers (0–1): Track A pooled R² <b>{_f(a)}</b> — "
            f"{esc(band(r.spec.pe, a))}; Track B {_f(b)} ({which}).")


def spectral_words(s: Mapping) -> str:
    """The pre-registered spectral outcome in a few words."""
    if s.get("spec_status") != "computed":
        return f"spectral alignment {s.get('spec_status', 'not computed')}"
    return (f"{s['spec_n_criterion_met']} of {s['spec_n_analysed']} analysed heads have half "
            "their top-5 spectral peaks at a rotary frequency")


def second_line(r: ConditionResult, s: Mapping) -> str:
    r2 = np.asarray(r.r2_pooled, np.float64)
    n_ok = int(np.isfinite(r2).sum())
    late = (f"mean R² {_f(s['A_late_mean'])} at layers {LATE_FROM}+; "
            if r.n_layers > LATE_FROM else "")
    return (f"Whole model: {late}{int((r2 > STRONG).sum())} of {n_ok} heads above "
            f"{STRONG:.2f}{_best(r)}; {esc(spectral_words(s))}.")


def lead_html(results: Sequence[ConditionResult], summary: pd.DataFrame) -> str:
    """The opening block: a heading and two lines per condition ("" without conditions)."""
    if not len(summary):
        return ""
    rows = {(s["model"], s["dataset"], s["length"]): s for s in summary.to_dict("records")}
    items = []
    for r in results:
        s = rows.get(key_of(r))
        if s is None:
            continue
        title = (f"{r.model} · {dataset_label(r.dataset)} · T={r.length}, "
                 f"{len(r.seq_id)} sequences")
        items.append(f"<li><b>{esc(title)}</b><br>{first_line(r, s)}<br>"
                     f"{second_line(r, s)}</li>")
    return ('<h2>In short</h2><ul class="pk-lead">' + "".join(items) + "</ul>"
            '<p class="pk-note">R² of a shift-invariant kernel g(Δ) fitted to each head\'s '
            "pre-softmax logits (1 = a function of the offset only). The verdicts, with "
            "the protocol's reasoning, follow Figure 1.</p>")


__all__ = ["band", "first_line", "lead_html", "second_line", "spectral_words"]

"""The report's section on what each model's softmax reads beyond scale·q·k, and, for ALiBi
models, every head's g(Δ) against its known kernel, the ramp −m_h·Δ.

Track A and the null fit what the softmax reads (ALiBi in the paper's form
scale·q·k − m_h·(t − s); Hugging Face's BLOOM, MPT and Falcon add a bias of the key position
alone, which differs from it by a per-row constant that the softmax ignores and a Toeplitz
fit does not). Track B stays the Gram of q and k: what content contributes, beside the
known bias. For an ALiBi head the spectral comparison with rotary frequencies does not
apply; its g(Δ) is compared with the ramp instead: the slope of the least-squares line
through g over the kept offsets, its ratio to m_h, and the R² of that line (exploratory).
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.html import esc
from poskernel_tl.report.sections import cond_text, fmt, table_html

KEPT = "alibi_ramp"  # where a condition keeps its alibi_frame through the report


def ramp_fit(g: np.ndarray) -> tuple[float, float]:
    """(slope, R²) of the least-squares line through g(Δ), Δ = 1.., over its finite lags."""
    lags = np.arange(1, len(g) + 1, dtype=np.float64)
    ok = np.isfinite(g)
    if ok.sum() < 3 or np.var(g[ok]) == 0:
        return float("nan"), float("nan")
    slope, icpt = np.polyfit(lags[ok], g[ok], 1)
    resid = g[ok] - (icpt + slope * lags[ok])
    return float(slope), float(1 - resid.var() / g[ok].var())


def alibi_frame(r: ConditionResult) -> pd.DataFrame:
    """One row per head of an ALiBi model's layers: m_h, Track A's and Track B's (raw Gram,
    the content part) g(Δ) slopes, the Track A slope over −m_h and the line's R²."""
    rows = []
    for layer, scheme in enumerate(r.spec.layers or ()):
        slopes = scheme.terms.slopes
        if slopes is None:
            continue
        for head, m in enumerate(slopes):
            a, a_r2 = ramp_fit(r.g_pooled[layer, head])
            b, _ = ramp_fit(r.track_b.g_gram_raw[layer, head])
            rows.append({"layer": layer, "head": head, "m": m, "slope_A": a,
                         "slope_over_minus_m": a / -m if m else np.nan, "R2_line_A": a_r2,
                         "slope_B_content": b})
    return pd.DataFrame(rows)


def softmax_html(conds: Sequence[SavedCondition]) -> str:
    """The section (empty when no condition's softmax adds anything); each condition's
    :func:`alibi_frame` kept under :data:`KEPT` before its g(Δ) were dropped."""
    said = [(c, c.result.spec.softmax_terms()) for c in conds if c.result.spec.layers]
    said = [(c, s) for c, s in said if s]
    if not said:
        return ""
    items = "".join(f"<li>{esc(cond_text(c.result))}: {esc(s)}</li>" for c, s in said)
    out = ("<h2>What the softmax reads</h2><p>These models' attention softmax reads more "
           "than scale·q·k plus a mask. Track A, the permutation null, the saved logits and "
           "the previous-token score fit exactly what it reads; Track B stays the Gram of q "
           "and k, what content contributes beside it. ALiBi is fitted in the paper's form "
           "scale·q·k − m_h·(t − s): Hugging Face's code adds a bias of the key position "
           "alone, which differs from it by a per-row constant that the softmax ignores and "
           "a Toeplitz fit does not.</p><ul>" + items + "</ul>")
    for c, _ in said:
        df = c.kept.get(KEPT)
        if df is None or df.empty:
            continue
        by_layer = df.groupby("layer").agg(
            heads=("head", "size"), median_slope_over_minus_m=("slope_over_minus_m", "median"),
            median_R2_line_A=("R2_line_A", "median")).reset_index()
        out += (f"<h3>{esc(cond_text(c.result))}: g(Δ) against the known ALiBi kernel −m_h·Δ "
                "(exploratory)</h3><p>Per layer, the median over heads of the slope of "
                "Track A's g(Δ) over −m_h (1: the head's kernel is its bias alone) and of the "
                "R² of that line; the per-head table is alibi_ramp.csv. The rotary spectral "
                "comparison does not apply to ALiBi heads.</p>"
                + table_html(by_layer.map(lambda x: fmt(x) if isinstance(x, float) else x)))
    return out


def alibi_table(conds: Sequence[SavedCondition]) -> pd.DataFrame:
    """Every ALiBi head of every condition (the report's alibi_ramp.csv)."""
    frames = [c.kept[KEPT].assign(model=c.result.model, dataset=c.result.dataset,
                                  length=c.result.length)
              for c in conds if c.kept.get(KEPT) is not None and not c.kept[KEPT].empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


__all__ = ["KEPT", "alibi_frame", "alibi_table", "ramp_fit", "softmax_html"]

"""The report's section on what each model's softmax reads beyond scale·q·k, and every
head's g(Δ) against its known kernel: for ALiBi models the ramp −m_h·Δ, for a learned
offset table (T5's, MPNet's relative-position bias) the table b_h(Δ).

Track A and the null fit what the softmax reads (ALiBi in the paper's form
scale·q·k − m_h·(t − s); Hugging Face's BLOOM, MPT and Falcon add a bias of the key position
alone, which differs from it by a per-row constant that the softmax ignores and a Toeplitz
fit does not). Track B stays the Gram of q and k: what content contributes, beside the
known bias. For an ALiBi head the spectral comparison with rotary frequencies does not
apply; its g(Δ) is compared with the ramp instead: the slope of the least-squares line
through g over the kept offsets, its ratio to m_h, and the R² of that line (exploratory).
A head of a layer whose softmax adds a learned table is compared with its table the same
way (:func:`known_frame`): the least-squares line g ≈ a·b_h(Δ) + c over every offset
Track A fits (both sides of an encoder), its slope a (1: the head's kernel moves as its
table does) and R², the share of g's variance over the offsets that the table explains
(exploratory; the rest is what q·k adds as a function of the offset).
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.html import esc
from poskernel_tl.report.sections import cond_text, fmt, table_html

KEPT = "alibi_ramp"  # where a condition keeps its alibi_frame through the report
KNOWN = "known_kernels"  # and its known_frame


def known_fit(g: np.ndarray, k: np.ndarray) -> tuple[float, float]:
    """(a, R²) of the least-squares line g ≈ a·k + c over the entries where both are
    finite (NaN where fewer than 3, or g or k constant there)."""
    g, k = np.asarray(g, dtype=np.float64), np.asarray(k, dtype=np.float64)
    ok = np.isfinite(g) & np.isfinite(k)
    if ok.sum() < 3 or np.var(g[ok]) == 0 or np.var(k[ok]) == 0:
        return float("nan"), float("nan")
    slope, icpt = np.polyfit(k[ok], g[ok], 1)
    resid = g[ok] - (icpt + slope * k[ok])
    return float(slope), float(1 - resid.var() / g[ok].var())


def ramp_fit(g: np.ndarray) -> tuple[float, float]:
    """(slope, R²) of the least-squares line through g(Δ), Δ = 1.., over its finite lags."""
    return known_fit(g, np.arange(1, len(g) + 1, dtype=np.float64))


def known_frame(r: ConditionResult) -> pd.DataFrame:
    """One row per head of every layer whose softmax adds a learned offset table (a term
    that does not fold into q and k): the term, Track A's and Track B's (raw Gram, the
    content part) slope over the table and Track A's R² against it (module docstring)."""
    T, rows = r.length, []
    lags = np.arange(1, T)
    two = r.g_pooled_back is not None  # an encoder: both sides, one g per signed offset
    offsets = np.concatenate([lags, -lags]) if two else lags
    for layer, scheme in enumerate(r.spec.layers or ()):
        g_a = _sides(r.g_pooled, r.g_pooled_back, layer)
        g_b = _sides(r.track_b.g_gram_raw, r.track_b.g_gram_raw_back, layer)
        for term in scheme.terms.offsets:
            k = np.asarray(term.known_kernel(offsets.tolist()))
            for head in range(len(k)):
                a, r2 = known_fit(g_a[head], k[head])
                b, _ = known_fit(g_b[head], k[head])
                rows.append({"layer": layer, "head": head, "term": term.label(),
                             "slope_A_over_known": a, "R2_A_known": r2,
                             "slope_B_content_over_known": b})
    return pd.DataFrame(rows)


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
    known = [_known_html(c) for c, _ in said]
    out += (KNOWN_TEXT if any(known) else "") + "".join(known)
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


def _sides(g: np.ndarray, g_back: np.ndarray | None, layer: int) -> np.ndarray:
    """[head, offset] of ``layer``: g over Δ = 1.., then (an encoder) over Δ = −1, −2, …"""
    return g[layer] if g_back is None else np.concatenate([g[layer], g_back[layer]], -1)


def _known_html(c: SavedCondition) -> str:
    """One condition's learned tables against its heads' g(Δ): per layer, the median over
    heads (empty without such a table)."""
    df = c.kept.get(KNOWN)
    if df is None or df.empty:
        return ""
    by_layer = df.groupby(["layer", "term"]).agg(
        heads=("head", "size"), median_slope_A_over_known=("slope_A_over_known", "median"),
        median_R2_A_known=("R2_A_known", "median"),
        median_slope_B_content=("slope_B_content_over_known", "median")).reset_index()
    return (f"<h3>{esc(cond_text(c.result))}: g(Δ) against each head's learned offset "
            "table (exploratory)</h3>"
            + table_html(by_layer.map(lambda x: fmt(x) if isinstance(x, float) else x)))


KNOWN_TEXT = ("<p>A layer that adds a learned offset table (T5's, MPNet's relative-position "
              "bias) is read against it head by head: per layer, the median over heads of the "
              "slope of the least-squares line of Track A's g(Δ) on the head's table b_h(Δ) "
              "(1: the kernel moves as its table does), of that line's R² (the share of g's "
              "variance over the offsets that the table explains; the rest is what q·k adds "
              "as a function of the offset), and of Track B's content Gram's slope on the "
              "table. The per-head table is known_kernels.csv; every head page draws its "
              "table beside g(Δ).</p>")


def _every(conds: Sequence[SavedCondition], key: str) -> pd.DataFrame:
    frames = [c.kept[key].assign(model=c.result.model, dataset=c.result.dataset,
                                 length=c.result.length)
              for c in conds if c.kept.get(key) is not None and not c.kept[key].empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def alibi_table(conds: Sequence[SavedCondition]) -> pd.DataFrame:
    """Every ALiBi head of every condition (the report's alibi_ramp.csv)."""
    return _every(conds, KEPT)


def known_table(conds: Sequence[SavedCondition]) -> pd.DataFrame:
    """Every head with a learned offset table, of every condition (known_kernels.csv)."""
    return _every(conds, KNOWN)


__all__ = ["KEPT", "KNOWN", "alibi_frame", "alibi_table", "known_fit", "known_frame",
           "known_table", "ramp_fit", "softmax_html"]

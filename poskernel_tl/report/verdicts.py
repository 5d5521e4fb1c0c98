"""The protocol's Pre-Registration Summary, row by row, evaluated on the conditions present.

:func:`evaluate` is a pure function of the per-condition summary
(:func:`poskernel_tl.report.tables.condition_summary`, or a hand-built frame with the same
columns); :func:`verdicts` runs it on a list of
:class:`~poskernel_tl.measurement.result.ConditionResult`. Each criterion gets one of ``met``,
``partial``, ``failed`` or ``not computable``, the value it was judged on, the numbers
behind it (per condition) and, when not computable, why.

Where a criterion spans several conditions, ``partial`` means the threshold holds for
some conditions and not for others (the protocol's own "partial" band applies to the
early-layer R² row: 0.40–0.80). The protocol's thresholds are uncalibrated
(its calibration note); the report's nulls put them on a scale.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from poskernel_tl.protocol import GATE_THRESHOLD
from poskernel_tl.report.html import finite
from poskernel_tl.report.tables import (
    Key,
    condition_summary,
    spectral_gate,
    write_table,
)

MET, PARTIAL, FAILED, NA = "met", "partial", "failed", "not computable"

CRITERIA = [  # (id, criterion, track, threshold) as the protocol's Pre-Registration Summary
    ("early_r2", "Early-layer pooled R² (layers 0–1), RoPE models", "A",
     "> 0.80 strong support; 0.40–0.80 partial; < 0.40 falsified"),
    ("falsification", "Falsification threshold, RoPE models", "A",
     "< 0.40 even after centering (Track B)"),
    ("agreement", "Track A vs. Track B agreement, early layers", "Both", "|R²_A − R²_B| < 0.10"),
    ("depth_decay", "Depth-decay slope, RoPE models only", "A",
     "negative on average; non-monotone heads flagged"),
    ("gate", "Gate condition for spectral analysis", "A", "mean early-layer R² > 0.60"),
    ("spectral", "Spectral alignment (top-5 peaks), if gated", "B",
     "≥ 50% of top-5 peaks within normalized tolerance"),
    ("nope", "NoPE model R², early layers", "A", "< 0.40"),
    ("random_vs_text", "Random-token R² vs. natural-text R², early layers", "A",
     "difference < 0.10"),
    ("seq_std", "Per-sequence R² std, early-layer RoPE heads", "A",
     "< 0.15 content-stable; > 0.15 content-dependent"),
]
COLUMNS = ["criterion", "track", "threshold", "verdict", "value", "reading", "numbers",
           "reason"]
READINGS = {  # what each verdict means for each criterion
    "early_r2": {MET: "strong support (> 0.80)", PARTIAL: "partial / exploratory (0.40–0.80)",
                 FAILED: "falsified (< 0.40)"},
    "falsification": {MET: "not falsified: Track A early R² ≥ 0.40",
                      PARTIAL: "mixed: one of Track A / centered Track B is below 0.40",
                      FAILED: "falsified: below 0.40 even after centering"},
    "agreement": {MET: "tracks agree within 0.10 in every centered condition: no sign that "
                       "centering creates stationarity",
                  PARTIAL: "tracks agree within 0.10 in some conditions only",
                  FAILED: "tracks differ by ≥ 0.10 in every centered condition"},
    "depth_decay": {MET: "R² falls with depth in every RoPE condition (slope more than "
                         "2 SE below zero)",
                    PARTIAL: "R² falls with depth on average, but not significantly (within "
                             "2 SE of zero) or not in every condition",
                    FAILED: "R² does not fall with depth on average"},
    "gate": {MET: "gate met in every RoPE condition: spectral analysis runs",
             PARTIAL: "gate met in some RoPE conditions only (the grid-wide mean decides)",
             FAILED: "gate not met: spectral analysis deferred"},
    "spectral": {MET: "most analysed heads have ≥ 50% of their top-5 peaks at a θᵢ",
                 PARTIAL: "some analysed heads meet the 50% criterion, most do not",
                 FAILED: "no analysed head meets the 50% criterion"},
    "nope": {MET: "NoPE early-layer R² stays below 0.40: the structure is PE-specific",
             PARTIAL: "some NoPE conditions reach 0.40: possible leakage via the causal mask",
             FAILED: "NoPE early-layer R² ≥ 0.40: implicit position leakage via the causal "
                     "mask, a finding that takes priority"},
    "random_vs_text": {MET: "random tokens within 0.10 of natural text: architectural origin",
                       PARTIAL: "random tokens within 0.10 of natural text for some pairs only",
                       FAILED: "random tokens and natural text differ by ≥ 0.10: reported as "
                               "a finding"},
    "seq_std": {MET: "content-stable (std < 0.15)", PARTIAL: "content-stable in some "
                "conditions only", FAILED: "content-dependent (std ≥ 0.15)"},
}


def _name(row: Mapping) -> str:
    return f"{row['model']}/{row.get('dataset_label', row['dataset'])}/T={int(row['length'])}"


def _fin(x) -> bool:
    return finite(x) is not None


def _share(flags: Sequence[bool]) -> str:
    """met when all conditions pass, failed when none does, partial otherwise."""
    return MET if all(flags) else FAILED if not any(flags) else PARTIAL


def _numbers(rows: list[Mapping], col: str, fmt: str = "{:.3f}") -> str:
    return "; ".join(f"{_name(r)}: {fmt.format(r[col]) if _fin(r[col]) else 'nan'}"
                     for r in rows)


def _rows(summary: pd.DataFrame, **where) -> list[dict]:
    df = summary
    for col, val in where.items():
        if col not in df:
            return []
        df = df[df[col] == val]
    return df.to_dict("records")


def _mean(rows: list[Mapping], col: str) -> float:
    vals = [float(r[col]) for r in rows if _fin(r.get(col))]
    return float(np.mean(vals)) if vals else float("nan")


def _early_r2(s: pd.DataFrame) -> tuple:
    rope = [r for r in _rows(s, pe="rope") if _fin(r["A_early_mean"])]
    if not rope:
        return NA, np.nan, "", "no RoPE model in this folder"
    v = _mean(rope, "A_early_mean")
    verdict = MET if v > 0.80 else PARTIAL if v >= 0.40 else FAILED
    return verdict, v, "mean over conditions; " + _numbers(rope, "A_early_mean"), ""


def _falsification(s: pd.DataFrame) -> tuple:
    rope = [r for r in _rows(s, pe="rope") if _fin(r["A_early_mean"])]
    if not rope:
        return NA, np.nan, "", "no RoPE model in this folder"
    a = _mean(rope, "A_early_mean")
    b = _mean([r for r in rope if r.get("centered")], "B_centered_early")
    nums = (f"Track A early {a:.3f}; Track B centered early "
            f"{b:.3f}" if _fin(b) else f"Track A early {a:.3f}; no centered Track B")
    if a >= 0.40:
        verdict = PARTIAL if _fin(b) and b < 0.40 else MET
        return verdict, a, nums + " (met = not falsified)", ""
    if not _fin(b):
        return NA, a, nums, ("Track A is below 0.40 but no RoPE condition is centered "
                             "(random tokens only): 'even after centering' cannot be judged")
    return (PARTIAL if b >= 0.40 else FAILED), a, nums + " (failed = falsified)", ""


def _agreement(s: pd.DataFrame) -> tuple:
    rows = [r for r in _rows(s, centered=True) if _fin(r["AB_diff_early"])]
    if not rows:
        return NA, np.nan, "", ("no centered condition (Track B is uncentered for random "
                                "tokens by the protocol's rule)")
    flags = [r["AB_diff_early"] < 0.10 for r in rows]
    return _share(flags), max(r["AB_diff_early"] for r in rows), \
        "largest |A − B| shown; " + _numbers(rows, "AB_diff_early"), ""


def _depth(s: pd.DataFrame) -> tuple:
    rope = [r for r in _rows(s, pe="rope") if _fin(r["A_slope"])]
    other = [r for r in _rows(s, pe="learned-absolute") if _fin(r["A_slope"])]
    desc = ("; GPT-2-style (descriptive, no pre-registered direction): " +
            _numbers(other, "A_slope", "{:+.4f}")) if other else ""
    if not rope:
        return NA, np.nan, desc.lstrip("; "), \
            "no RoPE model with at least 3 layers in this folder"
    v = _mean(rope, "A_slope")
    # significantly negative: slope + 2·SE < 0 (SE unknown: the sign alone)
    flags = [r["A_slope"] + 2 * (r["A_slope_se"] if _fin(r.get("A_slope_se")) else 0) < 0
             for r in rope]
    verdict = MET if all(flags) else PARTIAL if v < 0 else FAILED
    buck = "; ".join(f"{_name(r)}: {int(r['n_bucking'])} heads above the early mean"
                     + (f" ({r['bucking_heads']})" if r.get("bucking_heads") else "")
                     for r in rope if _fin(r.get("n_bucking")) and r["n_bucking"] > 0)
    nums = "slope per layer ± SE; " + "; ".join(
        f"{_name(r)}: {r['A_slope']:+.4f} ± {r.get('A_slope_se', float('nan')):.4f}"
        for r in rope) + desc
    return verdict, v, nums + (f"; flagged: {buck}" if buck else ""), ""


def _gate(s: pd.DataFrame) -> tuple:
    value, met = spectral_gate(s) if len(s) else (np.nan, None)
    if met is None:
        return NA, np.nan, "", "no RoPE model in this folder"
    rope = [r for r in _rows(s, pe="rope") if _fin(r["A_early_mean"])]
    flags = [r["A_early_mean"] > GATE_THRESHOLD for r in rope]
    verdict = MET if met and all(flags) else FAILED if not met and not any(flags) else PARTIAL
    nums = (f"gate {'met' if met else 'not met'} ({value:.3f} over all early RoPE heads); "
            + _numbers(rope, "A_early_mean"))
    return verdict, value, nums, ""


def _spectral(s: pd.DataFrame) -> tuple:
    value, met = spectral_gate(s) if len(s) else (np.nan, None)
    if met is None:
        return NA, np.nan, "", "no RoPE model in this folder"
    if not met:
        return NA, np.nan, "", f"gate not met (mean early-layer R² {value:.3f} ≤ 0.60): " \
            "spectral analysis deferred, as pre-registered"
    rows = [r for r in _rows(s, pe="rope") if r.get("spec_status") == "computed"
            and r.get("spec_n_analysed", 0) > 0]
    if not rows:
        return NA, np.nan, "", "gate met but no spectral results were passed in"
    n = sum(int(r["spec_n_analysed"]) for r in rows)
    k = sum(int(r["spec_n_criterion_met"]) for r in rows)
    aligned = sum(int(r.get("spec_n_aligned", 0)) for r in rows)
    share = k / n
    verdict = MET if share >= 0.5 else PARTIAL if k > 0 else FAILED
    nums = (f"{k}/{n} analysed heads have ≥ 50% of top-5 peaks matched; {aligned} beat the "
            "rescaled-θ null; " + _numbers(rows, "spec_frac_matched_mean")
            + "; chance share: " + _numbers(rows, "spec_chance_mean"))
    return verdict, share, nums, ""


def _nope(s: pd.DataFrame) -> tuple:
    rows = [r for r in _rows(s, pe="none") if _fin(r["A_early_mean"])]
    if not rows:
        return NA, np.nan, "", "no NoPE model in this folder"
    flags = [r["A_early_mean"] < 0.40 for r in rows]
    high = "; ".join(f"{_name(r)}: {r['early_ge_040']}" for r in rows
                     if r.get("early_ge_040"))
    nums = _numbers(rows, "A_early_mean") + (
        f"; early NoPE heads ≥ 0.40 (possible leakage through the causal mask): {high}"
        if high else "")
    return _share(flags), _mean(rows, "A_early_mean"), nums, ""


def _random_vs_text(s: pd.DataFrame) -> tuple:
    pairs = []
    for rnd in _rows(s, natural=False):
        for txt in s.to_dict("records"):
            if txt.get("natural") and txt["model"] == rnd["model"] and \
                    int(txt["length"]) == int(rnd["length"]) and _fin(txt["A_early_mean"]) \
                    and _fin(rnd["A_early_mean"]):
                pairs.append((txt, rnd, txt["A_early_mean"] - rnd["A_early_mean"]))
    if not pairs:
        return NA, np.nan, "", ("no model has both a random-token and a natural-text "
                                "condition at the same length")
    flags = [abs(d) < 0.10 for *_, d in pairs]
    nums = "; ".join(f"{t['model']}/T={int(t['length'])}: "
                     f"{t.get('dataset_label', t['dataset'])} − random = "
                     f"{d:+.3f}" for t, _, d in pairs)
    return _share(flags), max(abs(d) for *_, d in pairs), "largest |difference| shown; " \
        + nums, ""


def _seq_std(s: pd.DataFrame) -> tuple:
    rows = [r for r in _rows(s, pe="rope") if _fin(r.get("seq_std_early"))]
    if not rows:
        return NA, np.nan, "", ("no RoPE model in this folder" if not _rows(s, pe="rope")
                                else "fewer than 2 evaluation sequences")
    flags = [r["seq_std_early"] < 0.15 for r in rows]
    return _share(flags), _mean(rows, "seq_std_early"), \
        "mean per-head std across sequences; " + _numbers(rows, "seq_std_early"), ""


RULES = {"early_r2": _early_r2, "falsification": _falsification, "agreement": _agreement,
         "depth_decay": _depth, "gate": _gate, "spectral": _spectral, "nope": _nope,
         "random_vs_text": _random_vs_text, "seq_std": _seq_std}


def evaluate(summary: pd.DataFrame) -> pd.DataFrame:
    """Every Pre-Registration Summary row judged on ``summary`` (one row per condition
    with at least model, dataset, length, pe, centered, natural, A_early_mean; further
    columns as :func:`~poskernel_tl.report.tables.condition_summary` writes them)."""
    out = []
    for cid, criterion, track, threshold in CRITERIA:
        if not len(summary):
            verdict, value, nums, reason = NA, np.nan, "", "no conditions in this folder"
        else:
            verdict, value, nums, reason = RULES[cid](summary)
        out.append({"id": cid, "criterion": criterion, "track": track,
                    "threshold": threshold, "verdict": verdict, "value": value,
                    "reading": READINGS[cid].get(verdict, reason), "numbers": nums,
                    "reason": reason})
    return pd.DataFrame(out, columns=["id", *COLUMNS])


def verdicts(results: Sequence, spectral: Mapping[Key, pd.DataFrame] | None = None
             ) -> pd.DataFrame:
    """:func:`evaluate` on :func:`~poskernel_tl.report.tables.condition_summary`."""
    return evaluate(condition_summary(results, spectral))


def write_verdicts(df: pd.DataFrame, stem) -> tuple:
    """``stem.csv`` and ``stem.md``."""
    return write_table(df, stem, title="Pre-registration verdicts")


__all__ = ["CRITERIA", "FAILED", "MET", "NA", "PARTIAL", "READINGS", "evaluate", "verdicts",
           "write_verdicts"]

"""One condition's data file for the head views: ``report/data/{stem}.js``.

The file assigns ``window.PK_DATA[key]`` (``key`` = ``{model}/{dataset}_{T}``, the
permalink prefix), so the page loads it with a ``<script>`` element from ``file://``
(Chromium refuses ``fetch()`` of local files). It holds only numbers the run and its
analyses saved: R² grids, the g(Δ) of both tracks, per-sequence R², the spectral tables,
peaks and spectra of both g sources, the further analyses' rows, and the logits of one
saved sequence with that sequence's own g(Δ) and token strings (past 256 tokens: where
the heads' long views are, :mod:`poskernel_tl.report.long_files`, and the tokens).
Large arrays travel as base64 typed arrays (``f4`` float32, ``f8`` float64, ``u1`` uint8,
``f2`` float16):

- logits (strict lower triangle, row by row) as 8-bit codes per head, value = lo + code ×
  step (``logits_lo``, ``logits_step``), zlib-compressed: a display copy; every R² shown
  comes from the result files, not from these codes;
- spectra as float16 divided by each head's maximum (``spec_*_scale``).
"""

import base64
import zlib
from pathlib import Path

import numpy as np
from jaxtyping import Float

from poskernel_tl import constants as C
from poskernel_tl.analyses.spectral.io import LABELS, SOURCES
from poskernel_tl.measurement.parts import head_labels
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.plan.allocator import release_pages
from poskernel_tl.report import extras
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.figures import model_label
from poskernel_tl.report.html import write_script_data
from poskernel_tl.report.tables import dataset_label

DATA_DIR = "data"
GLOBAL = "PK_DATA"
SPECTRAL_COMMAND = "poskernel spectral DIR"
HEAD_FIELDS = ("status", "preregistered", "n_peaks_found", "n_significant", "n_matched",
               "frac_matched", "criterion_met", "chance", "p_value", "aligned", "fpr",
               "ref_peak_r", "gate_met")
PEAK_FIELDS = ("omega", "magnitude", "significant", "matched", "nearest_theta", "rel_error")
KERNEL_FIELDS = (("R2_pooled", "Track A R² (pooled)"), ("null_max", "R² of the null (max)"),
                 ("prev_share", "previous-token share"), ("sink_share", "sink share"),
                 ("peak_lag", "peak lag Δ"), ("peak_margin", "peak margin"),
                 ("width", "local width (offsets)"), ("decay_slope", "decay slope over ln Δ"),
                 ("decay_r2", "decay R²"), ("periodic_share", "periodic share"),
                 ("periodic_theta", "matched θᵢ (rad/token)"))


def condition_key(model: str, dataset: str, length: int) -> str:
    """``{model}/{dataset}_{T}`` with filename-safe slugs: the permalink prefix."""
    return f"{C.model_slug(model)}/{C.dataset_slug(dataset)}_{int(length)}"


def head_anchor(model: str, dataset: str, length: int, layer: int, head: int) -> str:
    """The permalink fragment of one head, e.g. ``smollm2-135m/prose_256/L1H2``."""
    return f"{condition_key(model, dataset, length)}/L{int(layer)}H{int(head)}"


def data_path(report_dir: str | Path, r: ConditionResult) -> Path:
    return Path(report_dir) / DATA_DIR / f"{r.stem()}.js"


def num(x) -> float | bool | str | None:
    """A JSON value: finite floats, bools and ints as they are, NaN/NA as None."""
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, str):
        return x
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x) else None


def grid(a: Float[np.ndarray, "layer head_index"]) -> list:
    """A [layer, head_index] array as nested lists (None for NaN)."""
    return [[num(v) for v in row] for row in np.asarray(a, np.float64)]


def typed(a: np.ndarray, dtype: str, deflate: bool = False) -> dict:
    """``a`` as a base64 little-endian typed array; ``deflate``: zlib-compressed first
    (``"z": true``; the viewer inflates it with the browser's DecompressionStream)."""
    arr = np.ascontiguousarray(np.asarray(a).astype("<" + dtype))
    data = zlib.compress(arr.tobytes(), 1) if deflate else arr.tobytes()
    out = {"dtype": dtype, "shape": list(arr.shape), "b64": base64.b64encode(data).decode()}
    return {**out, "z": True} if deflate else out


def quantize_logits(logits: Float[np.ndarray, "layer head_index query_pos key_pos"],
                    causal: bool = True) -> dict:
    """[layer, head_index, T, T] logits (finite on the strict lower triangle, or off the
    diagonal for a bidirectional model: ``causal=False``) as 8-bit codes of those entries,
    row by row, with each head's ``lo`` and ``step``; one layer's floats at a time."""
    L, H, T, _ = logits.shape
    t, s = np.tril_indices(T, -1) if causal else np.nonzero(~np.eye(T, dtype=bool))
    flat = t * T + s
    codes = np.empty((L, H, len(flat)), np.uint8)
    lo, step = np.empty((L, H), np.float32), np.empty((L, H), np.float32)
    for layer in range(L):
        x = np.take(np.asarray(logits[layer], np.float32).reshape(H, T * T), flat, axis=-1)
        release_pages(np.asarray(logits[layer]))  # a mapped file's pages, read once
        # nanmin/nanmax: a damaged matrix's NaN are skipped
        lo[layer], hi = np.nanmin(x, axis=-1), np.nanmax(x, axis=-1)
        step[layer] = (hi - lo[layer]) / np.float32(255.0)
        x = np.nan_to_num(x - lo[layer][:, None], nan=0.0, copy=False)
        x /= np.where(step[layer] > 0, step[layer], 1.0)[:, None]
        codes[layer] = np.clip(np.rint(x, out=x), 0, 255, out=x)
    step[~(step > 0)] = 1.0
    return {"logits": typed(codes, "u1", deflate=True), "logits_lo": typed(lo, "f4"),
            "logits_step": typed(step, "f4")}


def _spectral(cond: SavedCondition, source: str) -> dict:
    saved, r = cond.spectral, cond.result
    problems = [f"{f}: {why}" for f, why in saved.problems]
    if not saved.has(source):
        status = "not run" if source in saved.missing else "unreadable"
        return {"status": status, "label": LABELS[source], "message": SPECTRAL_COMMAND
                if status == "not run" else "; ".join(problems) or "incomplete files"}
    t = saved.tables[source]
    rows = [[num(v) for v in rec] for rec in t.reindex(columns=list(HEAD_FIELDS))
            .itertuples(index=False)]
    peaks: list = [[] for _ in range(r.n_layers * r.n_heads)]
    for rec in saved.peaks[source].to_dict("records"):
        peaks[int(rec["layer"]) * r.n_heads + int(rec["head"])].append(
            [num(rec[k]) for k in PEAK_FIELDS])
    name = str(t["source"].iloc[0])
    label = LABELS[source] if name != "gram_raw" else \
        "Track B g, raw Gram: the condition is uncentered (pre-registered)"
    return {"status": "ok", "label": label, "source": name,
            "fields": list(HEAD_FIELDS), "rows": rows, "peak_fields": list(PEAK_FIELDS),
            "peaks": peaks}


def _arrays(cond: SavedCondition) -> dict:
    r = cond.result
    g_b, _ = r.g_trackB
    out = {"g_a": typed(r.g_pooled, "f4"), "g_b": typed(g_b, "f4"),
           "per_seq": typed(r.r2_per_seq, "f4")}
    if not r.causal:  # keys after the query, Δ = −1..−(T−1)
        g_b_back = r.g_gram_back if r.centered else r.g_gram_raw_back
        out.update(g_a_back=typed(r.g_pooled_back, "f4"), g_b_back=typed(g_b_back, "f4"))
    if r.g_within is not None:  # the within-row kernel (Track A with a constant per row)
        out["g_within"] = typed(r.g_within, "f4")
        if r.g_within_back is not None:
            out["g_within_back"] = typed(r.g_within_back, "f4")
    if cond.spectral.omega is not None:
        out["omega"] = typed(cond.spectral.omega, "f8")
    for source, mags in cond.spectral.spectra.items():
        scale = np.nanmax(np.where(np.isfinite(mags), mags, np.nan), axis=-1)
        scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0).astype(np.float32)
        out[f"spec_{source}"] = typed(mags / scale[..., None], "f2")
        out[f"spec_{source}_scale"] = typed(scale, "f4")
    if cond.logits_seq is not None:
        out.update(quantize_logits(r.logits[cond.logits_seq], r.causal))
        i = [int(s) for s in r.seq_id].index(cond.logits_seq)
        out["g_seq"] = typed(r.g_per_seq[i], "f4")
        if not r.causal:
            out["g_seq_back"] = typed(r.g_per_seq_back[i], "f4")
    return out


def kernel_rows(r: ConditionResult) -> dict:
    """The head views' table of kernel descriptors, in the shape of
    :func:`~poskernel_tl.report.extras.viewer_tables`'s entries: the class is the first
    row's note ("not run" for a result saved without the sink column's mean)."""
    entry = {"name": "kernel", "title": "Kernel class and descriptors (exploratory)",
             "status": "ok", "message": ""}
    heads = r.kernels()
    if heads is None:
        return {**entry, "status": "not run",
                "message": "measured before kernel classes: run poskernel run again"}
    cols = [(c, label) for c, label in (*KERNEL_FIELDS, *head_labels().items())
            if c in heads.columns]
    values: list = [None] * (r.n_layers * r.n_heads)
    for row in heads.to_dict("records"):
        values[int(row["layer"]) * r.n_heads + int(row["head"])] = \
            [num(row[c]) for c, _ in cols] + [f"class: {row['kernel_class']}"]
    return {**entry, "labels": [label for _, label in cols], "values": values,
            "intervals": [None] * len(values)}


def condition_payload(cond: SavedCondition, long: dict | None = None) -> dict:
    """Everything the head views of one condition show (see the module docstring);
    ``long``: where its heads' long views are (:mod:`poskernel_tl.report.long_files`)."""
    r = cond.result
    g_b, b_source = r.g_trackB
    seq = None
    if cond.logits_seq is not None:
        seq = [int(s) for s in r.seq_id].index(cond.logits_seq)
    return {
        "key": condition_key(r.model, r.dataset, r.length), "stem": r.stem(),
        "model": r.model, "model_label": model_label(r), "dataset": r.dataset,
        "dataset_label": dataset_label(r.dataset), "length": int(r.length),
        "n_layers": r.n_layers, "n_heads": r.n_heads, "group_size": int(r.spec.group_size),
        "pe": r.spec.pe, "causal": r.causal, "centered": bool(r.centered), "n_eval": len(r.seq_id),
        "weights": str(r.provenance.get("weights", "")),
        "thetas": None if r.thetas is None else [num(t) for t in r.thetas],
        "r2": {"pooled": grid(r.r2_pooled), "nosink": grid(r.r2_pooled_nosink),
               "B": grid(r.r2_gram if r.centered else r.r2_gram_raw),
               "B_raw": grid(r.r2_gram_raw),
               "seq": None if seq is None else grid(r.r2_per_seq[seq]),
               "within": None if r.r2_within_pooled is None else grid(r.r2_within_pooled)},
        "g_b_source": b_source, "logits_seq": cond.logits_seq, "tokens": cond.tokens,
        "spectral": {source: _spectral(cond, source) for source in SOURCES},
        "extras": [kernel_rows(r)] + extras.viewer_tables(cond.extras, r.model, r.dataset,
                                                          r.length, r.n_layers, r.n_heads),
        "arrays": _arrays(cond), "long": long,
    }


def write_data(report_dir: str | Path, cond: SavedCondition, long: dict | None = None) -> Path:
    """Write the condition's data file (temp file + rename) and return its path."""
    payload = condition_payload(cond, long)
    return write_script_data(data_path(report_dir, cond.result), GLOBAL, payload["key"], payload)


__all__ = ["DATA_DIR", "GLOBAL", "condition_key", "condition_payload", "data_path",
           "head_anchor", "quantize_logits", "typed", "write_data"]

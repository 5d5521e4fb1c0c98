"""A condition's long view as files the report's head views load one head at a time.

A run past 256 tokens with ``--save-logits yes`` saves one evaluation sequence's long view
(:mod:`poskernel_tl.statistics.long_view`). The report writes, under ``data/{stem}/``:

- ``L{layer}H{head}.js``: the head's overview (the run's block sums of the logits and the
  pattern; the fit's block sums from that sequence's g(Δ) and the geometry,
  :func:`poskernel_tl.fit.blocks.fit_blocks`), g(Δ) over every offset and the notes —
  at T = 8192 ≈ 0.3 MB, the only file a head view opens with;
- ``Q{layer}H{head}.js`` (q as float16, each row's log-normaliser, the logit scale) and
  ``K{layer}G{kv_head}.js`` (k of the key/value head): what the zoom computes from, loaded
  when the zoom is first used.

Each file assigns ``window.PK_LONG[name]`` (``{condition key}/{file stem}``) and is loaded
with a ``<script>`` element, as the condition's data file is.
"""

import shutil
from pathlib import Path

import numpy as np

from poskernel_tl.encode import num, typed
from poskernel_tl.fit.blocks import block_size, fit_blocks
from poskernel_tl.mask import Mask
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.html import write_script_data
from poskernel_tl.report.viewer_data import DATA_DIR, condition_key
from poskernel_tl.report.viewer_long import assemble, maps_from_sums
from poskernel_tl.statistics.long_view import CHECK_ROWS

GLOBAL = "PK_LONG"


def long_dir(report_dir: str | Path, stem: str) -> Path:
    return Path(report_dir) / DATA_DIR / stem


def _write(folder: Path, key: str, name: str, payload: dict) -> None:
    write_script_data(folder / f"{name}.js", GLOBAL, f"{key}/{name}", payload)


def _head(r, part, i: int, layer: int, head: int, mask: Mask, count, b: int) -> dict:
    T = int(r.length)
    g = np.asarray(r.g_per_seq[i][layer, head], np.float64)
    g_back = None if mask.causal else np.asarray(r.g_per_seq_back[i][layer, head], np.float64)
    f_sum, _ = fit_blocks(g, g_back, b, mask)
    maps = maps_from_sums(np.asarray(part.logit_sum[layer, head], np.float64), f_sum, count,
                          part.mass[layer, head])
    long, notes = assemble(T, [], g, g_back, mask, maps, b, None)
    if part.q is not None:
        err = float(part.factor_err[layer, head])
        long["factorNote"] = ("Zoom: logits recomputed in the page as scale · q · k from the "
                              f"run's float16 q and k (max |error| {err:.2g} of the largest "
                              f"|logit| on {CHECK_ROWS} sampled rows).")
    return {"long": long, "notes": notes}


def write_long_views(report_dir: str | Path, cond: SavedCondition) -> dict | None:
    """Write the files of the module docstring for ``cond`` (removing an older set) and
    return what the condition's payload says of them (None: no long view saved)."""
    r = cond.result
    folder = long_dir(report_dir, r.stem())
    shutil.rmtree(folder, ignore_errors=True)
    part = r.parts.get("long_view")
    if part is None:
        return None
    T, key = int(r.length), condition_key(r.model, r.dataset, r.length)
    i = [int(s) for s in r.seq_id].index(part.seq_id)
    b, _ = block_size(T)
    scale = float(np.asarray(part.scale).ravel()[0])
    for layer in range(r.n_layers):
        mask = r.geometry.mask(layer)
        _, count = fit_blocks(np.zeros(T - 1), None, b, mask)
        for head in range(r.n_heads):
            _write(folder, key, f"L{layer}H{head}", _head(r, part, i, layer, head, mask, count, b))
            if part.q is not None:
                _write(folder, key, f"Q{layer}H{head}", {
                    "q": typed(part.q[layer, head], "f2"), "d": int(part.q.shape[-1]),
                    "lse": typed(part.lse[layer, head], "f4"), "scale": scale,
                    "check": {"rel_err": num(part.factor_err[layer, head])}})
        for kv in range(part.k.shape[1] if part.q is not None else 0):
            _write(folder, key, f"K{layer}G{kv}", {"k": typed(part.k[layer, kv], "f2")})
    return {"dir": f"{DATA_DIR}/{r.stem()}", "seq": part.seq_id, "zoom": part.q is not None}


__all__ = ["GLOBAL", "long_dir", "write_long_views"]

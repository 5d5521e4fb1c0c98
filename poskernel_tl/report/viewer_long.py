"""A head view at any length: the whole triangle as a fixed grid of blocks, and a zoom.

Past ``max_tokens`` (256) a head's T×T matrices do not fit a page (T = 8192: 67 M entries
per matrix). The viewer then gets, instead of the matrices:

- **the overview**: the logits A(t, s), the fit g(t − s), the residual A − g(t − s) and
  the pattern, each reduced to at most ``n_blocks`` × ``n_blocks`` blocks of b × b entries
  (b = ⌈T / n_blocks⌉). Logits, fit and residual: the **mean over the entries of the block
  that the fit reads** (:func:`~poskernel_tl.report.viewer.fit_mask`; NaN where the block
  holds none). Pattern: the block's **attention mass per query row**, the sum of the
  pattern over the block divided by the rows of the block (each row block's masses sum to
  1 over the key blocks). Every entry of the triangle counts in exactly one block.
- **the zoom's factors**: the head's post-rotary q [pos d_head] and its kv head's k
  [pos d_head] as float16, the logit scale, each row's log-normaliser
  lse(t) = log Σ_{s ≤ t} exp A(t, s) and g(Δ) over every offset, so that any window of
  rows and keys is drawn at full resolution in the page: A = scale · q_t · k_s,
  fit g(t − s), residual, pattern exp(A − lse(t)). The error the float16 factors make is
  measured here on sampled rows and stated on the page. A notebook view whose factors
  exceed :data:`NOTEBOOK_FACTOR_BYTES` carries those of one window (rows of q, keys of
  k, ``qFrom``/``kFrom``) and zooms within it; ``HeadView.zoom`` draws any other.

A head whose logits are not scale · q · kᵀ (ALiBi, soft-capping: what the softmax reads
adds terms) gets the overview only, with a note saying why.
"""

import math

import numpy as np
from jaxtyping import Bool, Float

from poskernel_tl.report.viewer_data import num, typed

N_BLOCKS = 256  # the overview's grid: at most N_BLOCKS × N_BLOCKS blocks
ZOOM = 256  # the default zoom window: ZOOM rows × ZOOM keys
ZOOM_MAX = 512  # the largest window the page draws at full resolution
NOTEBOOK_FACTOR_BYTES = 384 << 10  # a notebook view's q, k and lse whole up to this, else
# its first window's (T = 8192, d_head 64: 2.1 MB whole; 66 kB for 256 rows and keys)
CHECK_ROWS = 64  # rows sampled to measure the float16 factors' error
FACTOR_TOL = 1e-3  # relative error above which the logits are not scale · q · kᵀ


def block_size(T: int, n_blocks: int = N_BLOCKS) -> tuple[int, int]:
    """(b, number of blocks per side) of the overview of a T×T matrix."""
    b = max(1, math.ceil(T / n_blocks))
    return b, math.ceil(T / b)


def _reduce(v: np.ndarray, k: np.ndarray, n: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(Σ v, count) over the kept entries ``k`` of one block row, per key block."""
    pad = n * b - v.shape[1]
    v = np.pad(np.where(k, v, 0.0), ((0, 0), (0, pad)))
    k = np.pad(k, ((0, 0), (0, pad)))
    return v.reshape(len(v), n, b).sum(axis=(0, 2)), k.reshape(len(k), n, b).sum(axis=(0, 2))


def fitted_matrix_rows(g: Float[np.ndarray, " lag"], g_back, rows: slice, T: int
                       ) -> Float[np.ndarray, "query_pos key_pos"]:
    """g(t − s) for the rows ``rows`` (g_back(s − t) above the diagonal when given, NaN
    where neither defines it)."""
    t = np.arange(T)[rows][:, None]
    lag = t - np.arange(T)[None]
    full = np.concatenate([[np.nan], np.asarray(g, np.float64)])
    out = full[np.clip(lag, 0, T - 1)]
    if g_back is not None:
        back = np.concatenate([[np.nan], np.asarray(g_back, np.float64)])
        out = np.where(lag < 0, back[np.clip(-lag, 0, T - 1)], out)
    else:
        out[lag <= 0] = np.nan
    return out


def overview_maps(logits, pattern, keep, g, g_back, n_blocks: int = N_BLOCKS
                  ) -> tuple[int, dict[str, Float[np.ndarray, "row_block key_block"]]]:
    """(b, the four block maps of the module docstring), in one pass over the rows
    (g(t − s) is formed one block row at a time: no T×T temporary)."""
    T = logits.shape[0]
    b, n = block_size(T, n_blocks)
    a_sum, f_sum, count, mass = (np.zeros((n, n)) for _ in range(4))
    for i in range(n):
        rows = slice(i * b, min((i + 1) * b, T))
        a = np.asarray(logits[rows], np.float64)
        f = fitted_matrix_rows(g, g_back, rows, T)
        k = keep[rows] & np.isfinite(a) & np.isfinite(f)
        a_sum[i], count[i] = _reduce(a, k, n, b)
        f_sum[i], _ = _reduce(f, k, n, b)
        p = np.nan_to_num(np.asarray(pattern[rows], np.float64))
        mass[i] = _reduce(p, np.ones_like(k), n, b)[0] / len(p)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = lambda x: np.where(count > 0, x / np.maximum(count, 1), np.nan)  # noqa: E731
        maps = {"logits": mean(a_sum), "fit": mean(f_sum), "residual": mean(a_sum - f_sum),
                "mass": mass}
    return b, maps


def overview(logits, pattern, keep, g, g_back, n_blocks: int = N_BLOCKS) -> dict:
    """The overview as the page reads it: the maps as deflated float16, ``block``, ``n``."""
    b, maps = overview_maps(logits, pattern, keep, g, g_back, n_blocks)
    return {"block": b, "n": math.ceil(logits.shape[0] / b),
            **{k: typed(v, "f2", deflate=True) for k, v in maps.items()}}


def row_lse(logits: Float[np.ndarray, "query_pos key_pos"], causal: bool,
            max_lag: int | None = None) -> Float[np.ndarray, " query_pos"]:
    """log Σ_s exp A(t, s) over the keys the softmax reads (s ≤ t when ``causal``, and
    t − s ≤ ``max_lag`` in a sliding window)."""
    T = logits.shape[0]
    out = np.empty(T)
    for start in range(0, T, 512):
        a = np.asarray(logits[start:start + 512], np.float64)
        if causal:
            lag = np.arange(start, start + len(a))[:, None] - np.arange(T)[None]
            a = np.where((lag >= 0) & (lag <= (T if max_lag is None else max_lag)), a, -np.inf)
        a = np.where(np.isfinite(a) | (a == -np.inf), a, -np.inf)
        m = a.max(axis=1)
        out[start:start + len(a)] = m + np.log(np.exp(a - m[:, None]).sum(axis=1))
    return out


def factor_check(logits, pattern, q, k, scale: float, lse, keep) -> dict:
    """The float16 factors against the view's own matrices on ``CHECK_ROWS`` evenly spaced
    rows: max |A − scale·q16·k16| and max |P − exp(A16 − lse)| over the kept entries."""
    T = logits.shape[0]
    rows = np.unique(np.linspace(1, T - 1, min(CHECK_ROWS, T - 1)).astype(int))
    q16, k16 = (np.asarray(x, np.float16).astype(np.float64) for x in (q, k))
    a16 = scale * (q16[rows] @ k16.T)
    a = np.asarray(logits[rows], np.float64)
    kept = keep[rows] & np.isfinite(a)
    err = float(np.abs(a16 - a)[kept].max()) if kept.any() else 0.0
    size = float(np.abs(a[kept]).max()) if kept.any() else 1.0
    p16 = np.exp(a16 - lse[rows][:, None])
    p = np.nan_to_num(np.asarray(pattern[rows], np.float64))
    p_err = float(np.abs(p16 - p)[kept].max()) if kept.any() else 0.0
    return {"logit_err": err, "rel_err": err / max(size, 1e-30), "pattern_err": p_err}


def factor_window(T: int, window=None, size: int = ZOOM) -> tuple[int, int, int, int]:
    """The zoom window (r0, r1, c0, c1), ends included: ``window`` checked against T and
    :data:`ZOOM_MAX`, or the default first ``size`` rows and keys."""
    if window is None:
        n = min(size, T)
        return 0, n - 1, 0, n - 1
    r0, r1, c0, c1 = (int(x) for x in window)
    if not (0 <= r0 <= r1 < T and 0 <= c0 <= c1 < T):
        raise ValueError(f"zoom window rows {r0}..{r1}, keys {c0}..{c1} is not inside "
                         f"0..{T - 1}")
    if max(r1 - r0, c1 - c0) + 1 > ZOOM_MAX:
        raise ValueError(f"a zoom window has at most {ZOOM_MAX} rows and keys; asked "
                         f"{r1 - r0 + 1} × {c1 - c0 + 1}")
    return r0, r1, c0, c1


def factor_bytes(T: int, d_head: int) -> int:
    """Bytes of the whole factors as the page carries them (float16 q and k, float32 lse)."""
    return 2 * T * d_head * 2 + 4 * T


def long_payload(data, keep: Bool[np.ndarray, "query_pos key_pos"], g, g_back,
                 n_blocks: int = N_BLOCKS, *, window=None, factor_budget: int | None = None,
                 overview_maps_too: bool = True) -> tuple[dict, list[str]]:
    """The ``long`` part of a head's payload (overview, factors, tokens) and its notes;
    ``data`` a :class:`~poskernel_tl.report.viewer.HeadPageData`, ``keep`` its fit mask,
    ``g``/``g_back`` the fit the page shows.

    The factors travel whole (any window zooms in the page) unless ``window`` names one
    (r0, r1, c0, c1) or they exceed ``factor_budget`` bytes (a notebook keeps its views
    light): then only that window's rows of q and keys of k travel, the page zooms within
    them, and ``HeadView.zoom`` draws any other from the same q and k.
    ``overview_maps_too=False``: the zoom alone (no overview, no g(Δ) plot)."""
    T = len(data.tokens)
    logits = np.asarray(data.logits)
    b, n = block_size(T, n_blocks)
    out = overview(logits, np.asarray(data.pattern), keep, g, g_back, n_blocks) \
        if overview_maps_too else {"block": b, "n": n, "overview": False}
    notes = [f"{T} tokens: the overview reduces the whole matrix to {n} × {n} blocks of "
             f"{b} × {b} entries (logits, fit, residual: mean over the block's entries the "
             "fit reads; pattern: attention mass per query row); the zoom draws any window "
             "of rows and keys at full resolution."] if overview_maps_too else []
    out.update(T=T, twoSided=bool(data.two_sided), maxLag=data.max_lag,
               g=typed(g, "f4"), gBack=None if g_back is None else typed(g_back, "f4"),
               tokens=[str(t) for t in data.tokens], zoom=min(ZOOM, T), zoomMax=ZOOM_MAX,
               q=None, k=None)
    if data.q is None or data.k is None or data.logit_scale is None:
        notes.append("The zoom needs the head's q and k: not available for this view.")
        return out, notes
    causal = not data.two_sided
    lse = row_lse(logits, causal, data.max_lag)
    check = factor_check(logits, data.pattern, data.q, data.k, data.logit_scale, lse, keep)
    if check["rel_err"] > FACTOR_TOL:
        notes.append("The zoom is off: this head's logits are not scale · q · kᵀ (what its "
                     f"softmax reads adds terms; relative difference {check['rel_err']:.2g}"
                     "); the overview is exact.")
        return out, notes
    whole = window is None and (factor_budget is None or
                                factor_bytes(T, np.shape(data.q)[1]) <= factor_budget)
    r0, r1, c0, c1 = (0, T - 1, 0, T - 1) if whole else factor_window(T, window)
    out.update(q=typed(np.asarray(data.q)[r0:r1 + 1], "f2"),
               k=typed(np.asarray(data.k)[c0:c1 + 1], "f2"), d=int(np.shape(data.q)[1]),
               qFrom=r0, kFrom=c0, scale=float(data.logit_scale),
               lse=typed(lse[r0:r1 + 1], "f4"), check={k: num(v) for k, v in check.items()},
               start=None if whole else [r0, r1, c0, c1])
    notes.append("Zoom: logits recomputed in the page as scale · q · k from float16 q and k "
                 f"(max |error| {check['logit_err']:.2g} against the float32 logits, "
                 f"pattern {check['pattern_err']:.2g}, on {CHECK_ROWS} sampled rows).")
    if not whole:
        out["hint"] = (f"This view carries q and k of rows {r0}–{r1} and keys {c0}–{c1} "
                       "only (a notebook keeps each view light): view.zoom(rows=(R0, R1), "
                       "keys=(K0, K1)) draws any other window from the same q and k.")
    return out, notes


__all__ = ["NOTEBOOK_FACTOR_BYTES", "N_BLOCKS", "ZOOM", "ZOOM_MAX", "block_size",
           "factor_bytes", "factor_check", "factor_window", "fitted_matrix_rows",
           "long_payload", "overview", "overview_maps", "row_lse"]

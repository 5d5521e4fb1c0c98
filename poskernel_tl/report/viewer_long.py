"""A head view at any length: the whole triangle as a fixed grid of blocks, and a zoom.

Past ``max_tokens`` (256) a head's T×T matrices do not fit a page (T = 8192: 67 M entries
per matrix). The viewer then gets, instead of the matrices:

- **the overview**: the logits A(t, s), the fit g(t − s), the residual A − g(t − s) and
  the pattern, each reduced to at most ``n_blocks`` × ``n_blocks`` blocks of b × b entries
  (b = ⌈T / n_blocks⌉). Logits, fit and residual: the **mean over the entries of the block
  that the fit reads** (:func:`~poskernel_tl.fit.blocks.fit_mask`; NaN where the block
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

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.encode import num, typed
from poskernel_tl.fit.blocks import N_BLOCKS, block_size, fit_blocks, fit_mask, reduce_blocks
from poskernel_tl.mask import Mask
from poskernel_tl.statistics.long_view import CHECK_ROWS  # rows sampled for the factors' error

ZOOM = 256  # the default zoom window: ZOOM rows × ZOOM keys
ZOOM_MAX = 512  # the largest window the page draws at full resolution
NOTEBOOK_FACTOR_BYTES = 384 << 10  # a notebook view's q, k and lse whole up to this, else
# its first window's (T = 8192, d_head 64: 2.1 MB whole; 66 kB for 256 rows and keys)
FACTOR_TOL = 1e-3  # relative error above which the logits are not scale · q · kᵀ


def maps_from_sums(a_sum, f_sum, count, mass
                   ) -> dict[str, Float[np.ndarray, "*head row_block key_block"]]:
    """The four maps of the module docstring from the blocks' sums of the logits and of
    the fit over the entries the fit reads, their count, and the pattern's mass."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = lambda x: np.where(count > 0, x / np.maximum(count, 1), np.nan)  # noqa: E731
        return {"logits": mean(a_sum), "fit": mean(f_sum), "residual": mean(a_sum - f_sum),
                "mass": np.asarray(mass, np.float64)}


def overview_maps(logits, pattern, g, g_back, mask: Mask, n_blocks: int = N_BLOCKS
                  ) -> tuple[int, dict[str, Float[np.ndarray, "row_block key_block"]]]:
    """(b, the four block maps of the module docstring) of one head's matrices: the
    logits' and the pattern's block sums in one pass over the block rows, the fit's from
    g and the geometry (:func:`poskernel_tl.fit.blocks.fit_blocks`)."""
    T = logits.shape[0]
    b, n = block_size(T, n_blocks)
    a_sum, mass = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        rows = slice(i * b, min((i + 1) * b, T))
        keep = fit_mask(mask, rows)
        a = torch.from_numpy(np.where(keep, np.asarray(logits[rows], np.float64), 0.0))
        p = torch.from_numpy(np.nan_to_num(np.asarray(pattern[rows], np.float64)))
        a_sum[i] = reduce_blocks(a, b)[0].numpy()
        mass[i] = reduce_blocks(p, b)[0].numpy() / len(p)
    f_sum, count = fit_blocks(g, g_back, b, mask)
    return b, maps_from_sums(a_sum, f_sum, count, mass)


def overview(maps: dict, b: int, T: int) -> dict:
    """The overview as the page reads it: the maps as deflated float16, ``block``, ``n``."""
    return {"block": b, "n": -(-T // b), **{k: typed(v, "f2", deflate=True)
                                             for k, v in maps.items()}}


def row_lse(logits: Float[np.ndarray, "query_pos key_pos"], mask: Mask
            ) -> Float[np.ndarray, " query_pos"]:
    """log Σ_s exp A(t, s) over the keys the softmax reads (``mask``, the diagonal kept)."""
    T = logits.shape[0]
    out = np.empty(T)
    for start in range(0, T, 512):
        a = np.asarray(logits[start:start + 512], np.float64)
        if not mask.every_key:
            rows = np.arange(start, start + len(a))[:, None]
            a = np.where(mask.keeps(rows, np.arange(T)[None], diagonal=True), a, -np.inf)
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


@dataclass
class Factors:
    """What the zoom computes from: the head's q [pos d_head] and its kv head's k (any
    float dtype; float16 in the page), the logit scale, each row's log-normaliser and the
    measured error of the float16 copies (:func:`factor_check`; None: not measured)."""

    q: np.ndarray
    k: np.ndarray
    scale: float
    lse: np.ndarray
    check: dict | None = None


def assemble(T: int, tokens, g, g_back, mask: Mask,
             maps: dict | None, b: int, factors: Factors | None, *, window=None,
             factor_budget: int | None = None) -> tuple[dict, list[str]]:
    """The ``long`` part of a head's payload and its notes: the overview ``maps`` (None:
    the zoom alone), g, the tokens and the factors, whole or (``window``, or over
    ``factor_budget`` bytes) one window's rows of q and keys of k."""
    n = -(-T // b)
    out = overview(maps, b, T) if maps is not None else {"block": b, "n": n, "overview": False}
    notes = [] if maps is None else [
        f"{T} tokens: the overview reduces the whole matrix to {n} × {n} blocks of {b} × {b} "
        "entries (logits, fit, residual: mean over the block's entries the fit reads; "
        "pattern: attention mass per query row); the zoom draws any window of rows and keys "
        "at full resolution."]
    out.update(T=T, **mask.page(), g=typed(g, "f4"),
               gBack=None if g_back is None else typed(g_back, "f4"),
               tokens=[str(t) for t in tokens], zoom=min(ZOOM, T), zoomMax=ZOOM_MAX,
               q=None, k=None)
    if factors is None:
        return out, notes
    d = int(np.shape(factors.q)[1])
    whole = window is None and (factor_budget is None or factor_bytes(T, d) <= factor_budget)
    r0, r1, c0, c1 = (0, T - 1, 0, T - 1) if whole else factor_window(T, window)
    out.update(q=typed(np.asarray(factors.q[r0:r1 + 1]), "f2"), d=d, qFrom=r0, kFrom=c0,
               k=typed(np.asarray(factors.k[c0:c1 + 1]), "f2"), scale=float(factors.scale),
               lse=typed(np.asarray(factors.lse[r0:r1 + 1]), "f4"),
               start=None if whole else [r0, r1, c0, c1])
    check = factors.check
    notes.append("Zoom: logits recomputed in the page as scale · q · k from float16 q and k" +
                 ("." if check is None else
                  f" (max |error| {check['logit_err']:.2g} against the float32 logits, "
                  f"pattern {check['pattern_err']:.2g}, on {CHECK_ROWS} sampled rows)."))
    if check is not None:
        out["check"] = {k: num(v) for k, v in check.items()}
    if not whole:
        out["hint"] = (f"This view carries q and k of rows {r0}–{r1} and keys {c0}–{c1} "
                       "only (a notebook keeps each view light): view.zoom(rows=(R0, R1), "
                       "keys=(K0, K1)) draws any other window from the same q and k.")
    return out, notes


def long_payload(data, g, g_back, n_blocks: int = N_BLOCKS, *, window=None,
                 factor_budget: int | None = None, overview_maps_too: bool = True
                 ) -> tuple[dict, list[str]]:
    """:func:`assemble` for a :class:`~poskernel_tl.report.viewer.HeadPageData` with its
    whole matrices (``g``/``g_back`` the fit the page shows): the overview from them, the
    factors checked against them (a head whose logits are not scale · q · kᵀ gets none,
    with a note). ``overview_maps_too=False``: the zoom alone."""
    T, mask = len(data.tokens), data.mask
    logits = np.asarray(data.logits)
    b, maps = overview_maps(logits, np.asarray(data.pattern), g, g_back, mask, n_blocks) \
        if overview_maps_too else (block_size(T, n_blocks)[0], None)
    factors, why = None, "The zoom needs the head's q and k: not available for this view."
    if data.q is not None and data.k is not None and data.logit_scale is not None:
        lse = row_lse(logits, mask)
        check = factor_check(logits, data.pattern, data.q, data.k, data.logit_scale, lse,
                             fit_mask(mask))
        factors = Factors(data.q, data.k, data.logit_scale, lse, check)
        why = ("The zoom is off: this head's logits are not scale · q · kᵀ (what its softmax "
               f"reads adds terms; relative difference {check['rel_err']:.2g}); the overview "
               "is exact.")
        factors = factors if check["rel_err"] <= FACTOR_TOL else None
    out, notes = assemble(T, data.tokens, g, g_back, mask, maps, b, factors,
                          window=window, factor_budget=factor_budget)
    return out, notes if factors is not None else notes + [why]


__all__ = ["FACTOR_TOL", "NOTEBOOK_FACTOR_BYTES", "ZOOM", "ZOOM_MAX",
           "Factors", "assemble", "factor_bytes", "factor_check", "factor_window",
           "long_payload", "maps_from_sums", "overview", "overview_maps", "row_lse"]

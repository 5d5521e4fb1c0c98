"""How the head pages' data travel: JSON values (finite numbers, None for NaN) and
arrays as base64 little-endian typed arrays (``f4`` float32, ``f8`` float64, ``u1``
uint8, ``f2`` float16), zlib-compressed where marked; the logits of a saved sequence as
8-bit codes per head (:func:`quantize`)."""

import base64
import zlib

import numpy as np
from jaxtyping import Float

from poskernel_tl.plan.allocator import release_pages


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


def quantize(logits: Float[np.ndarray, "layer head_index query_pos key_pos"],
             causal: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[layer, head_index, T, T] logits (finite on the strict lower triangle, or off the
    diagonal for a bidirectional model: ``causal=False``) as 8-bit codes of those entries,
    row by row, [layer, head_index, entry], with each head's ``lo`` and ``step`` (value =
    lo + code × step: a display copy); one layer's floats at a time."""
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
    return codes, lo, step


__all__ = ["grid", "num", "quantize", "typed"]

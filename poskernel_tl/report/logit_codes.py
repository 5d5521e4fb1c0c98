"""The logits of a saved sequence as the head pages carry them: 8-bit codes per head, a
display copy (value = lo + code × step)."""

import numpy as np
from jaxtyping import Float

from poskernel_tl.plan.allocator import release_pages


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


__all__ = ["quantize"]

"""How the head pages' data travel: JSON values (finite numbers, None for NaN) and
arrays as base64 little-endian typed arrays (``f4`` float32, ``f8`` float64, ``u1``
uint8, ``f2`` float16), zlib-compressed where marked (the logits of a saved sequence as
8-bit codes: :mod:`poskernel_tl.report.logit_codes`)."""

import base64
import zlib

import numpy as np
from jaxtyping import Float


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


__all__ = ["grid", "num", "typed"]

"""The overview grid of a long head view: a T×T matrix as n × n blocks of b × b entries.

b = ⌈T / n_blocks⌉ and n = ⌈T / b⌉ (the last row and column of blocks may be shorter).
Every entry belongs to exactly one block. Two sums per block pair follow from the geometry
and g alone, for every head at once and without a T×T temporary:

- how many entries the fit reads in the block (1 ≤ t − s ≤ ``last`` for a causal layer,
  t ≠ s for a bidirectional one), and
- the sum of the fit g(t − s) over them.

Both are Σ_{t ∈ rows} Σ_{s ∈ keys} G(t − s) for a function G of the offset (the indicator
of a read offset, or g there and 0 elsewhere): with S the prefix sum of G over offsets and
SS the prefix sum of S, the block [a0, a1) × [c0, c1) sums to
SS(a1−1−c0) − SS(a0−1−c0) − SS(a1−1−c1) + SS(a0−1−c1): O(T + n²) per head.
"""

import math

import numpy as np
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

from poskernel_tl.mask import Mask

N_BLOCKS = 256  # the overview's grid: at most N_BLOCKS × N_BLOCKS blocks


def block_size(T: int, n_blocks: int = N_BLOCKS) -> tuple[int, int]:
    """(b, number of blocks per side) of the overview of a T×T matrix."""
    b = max(1, math.ceil(T / n_blocks))
    return b, math.ceil(T / b)


def read_offsets(T: int, two_sided: bool, last: int | None) -> np.ndarray:
    """[2T − 1] booleans over the offsets t − s = −(T−1) … T−1: those the fit reads
    (:meth:`~poskernel_tl.mask.Mask.offsets`)."""
    return Mask(T, not two_sided, last).offsets()


def fit_mask(mask: Mask, rows: slice = slice(None)) -> Bool[np.ndarray, "query_pos key_pos"]:
    """The entries of the rows ``rows`` a head's fit reads under ``mask``: its offset test
    (:meth:`~poskernel_tl.mask.Mask.offsets`: entry (t, s) is offset t − s, read
    from a Toeplitz view of the offsets, so that no T × T index is formed) and its chunk."""
    T = mask.length
    back = mask.offsets()[::-1]  # back[T − 1 − t + s] = (t − s read)
    keep = np.lib.stride_tricks.sliding_window_view(back, T)[::-1][rows].copy()
    pos = np.arange(T)
    return keep & mask.same_chunk(pos[rows, None], pos[None])


def reduce_blocks(x: Float[Tensor, "*head row key"], b: int
                  ) -> Float[Tensor, "*head row_block key_block"]:
    """Sums over b × b blocks of the last two axes (zero-padded at their ends): the
    overview's reduction of a block of rows against keys whose first row and key are
    multiples of b."""
    r, w = x.shape[-2:]
    x = F.pad(x, (0, -w % b, 0, -r % b))
    return x.unflatten(-1, (-1, b)).unflatten(-3, (-1, b)).sum((-3, -1))


def offset_function(g: Float[np.ndarray, "*head lag"], g_back, keep: np.ndarray
                    ) -> Float[np.ndarray, "*head offset"]:
    """g over the offsets −(T−1) … T−1 (g_back(−Δ) before the diagonal when given), 0 where
    ``keep`` is False."""
    g = np.asarray(g, np.float64)
    back = np.zeros_like(g) if g_back is None else np.asarray(g_back, np.float64)
    zero = np.zeros(g.shape[:-1] + (1,))
    full = np.concatenate([back[..., ::-1], zero, g], axis=-1)
    return np.where(keep, np.nan_to_num(full), 0.0)


def block_sums(G: Float[np.ndarray, "*head offset"], T: int, b: int, chunk: int | None = None
               ) -> Float[np.ndarray, "*head row_block key_block"]:
    """Σ over each block of G(t − s) (G over the offsets −(T−1) … T−1), by the double
    prefix sums of the module docstring; ``chunk``: over the block's entries whose query
    and key lie in one chunk only (each chunk's square cut from the block: a rectangle)."""
    n = math.ceil(T / b)
    edges = np.minimum(np.arange(n + 1) * b, T)
    S = np.cumsum(G, axis=-1)
    # SS over x = −T−1 … T−1 (index x + T + 1); S(x) = 0 below −(T−1)
    SS = np.concatenate([np.zeros(G.shape[:-1] + (2,)), np.cumsum(S, axis=-1)], axis=-1)

    def at(x):  # SS(x) for an integer array x
        return SS[..., x + T + 1]

    def rect(a0, a1, c0, c1):  # rows [a0, a1) × keys [c0, c1) (0 where empty)
        return at(a1 - 1 - c0) - at(a0 - 1 - c0) - at(a1 - 1 - c1) + at(a0 - 1 - c1)

    a0, a1 = edges[:-1, None], edges[1:, None]
    c0, c1 = edges[None, :-1], edges[None, 1:]
    if chunk is None:
        return rect(a0, a1, c0, c1)
    return sum(rect(*(np.clip(x, lo, min(lo + chunk, T)) for x in (a0, a1, c0, c1)))
               for lo in range(0, T, chunk))


def fit_blocks(g, g_back, b: int, mask: Mask
               ) -> tuple[Float[np.ndarray, "*head row_block key_block"],
                          Float[np.ndarray, "row_block key_block"]]:
    """(Σ of the fit g(t − s), count) over each block's entries the fit reads (``mask``)."""
    T, keep = mask.length, mask.offsets()
    count = block_sums(keep.astype(np.float64), T, b, mask.chunk)
    return block_sums(offset_function(g, g_back, keep), T, b, mask.chunk), np.rint(count)


__all__ = ["N_BLOCKS", "block_size", "block_sums", "fit_blocks", "fit_mask", "offset_function",
           "read_offsets", "reduce_blocks"]

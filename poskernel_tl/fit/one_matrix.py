"""The shift-invariant fit of one materialised logit matrix: a head view's sequence
(:class:`~poskernel_tl.report.viewer.HeadPageData` fits its logits here when the caller
gives no fit of its own)."""

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.fit.blocks import fit_mask
from poskernel_tl.fit.toeplitz import shift_invariance_r2, shift_invariance_r2_two_sided
from poskernel_tl.mask import Mask


def matrix_fit(logits: Float[np.ndarray, "query_pos key_pos"], mask: Mask | None = None
               ) -> tuple[float, Float[np.ndarray, " lag"], Float[np.ndarray, " lag"] | None]:
    """(R², g, g_back) of the shift-invariant fit of one logit matrix on the entries
    ``mask`` keeps (default: the strict lower triangle): ``g_back`` None for a causal
    mask, else Δ = −1..−(T−1); g NaN past a window's last offset."""
    T = logits.shape[0]
    mask = Mask(T) if mask is None else mask
    clean = torch.from_numpy(np.where(fit_mask(mask), np.asarray(logits, np.float64), 0.0))
    if not mask.causal:
        r2, g, g_back, _ = shift_invariance_r2_two_sided(clean, mask.window_last)
        return float(r2), g.numpy(), g_back.numpy()
    r2, g = shift_invariance_r2(clean, mask.window_last, mask.chunk)
    return float(r2), g.numpy(), None


__all__ = ["matrix_fit"]

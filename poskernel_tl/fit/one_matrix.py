"""The shift-invariant fit of one materialised logit matrix: a head view's sequence
(:class:`~poskernel_tl.report.viewer.HeadPageData` fits its logits here when the caller
gives no fit of its own)."""

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.fit.blocks import fit_mask
from poskernel_tl.fit.toeplitz import shift_invariance_r2, shift_invariance_r2_two_sided


def matrix_fit(logits: Float[np.ndarray, "query_pos key_pos"], two_sided: bool = False,
               max_lag: int | None = None, chunk: int | None = None
               ) -> tuple[float, Float[np.ndarray, " lag"], Float[np.ndarray, " lag"] | None]:
    """(R², g, g_back) of the shift-invariant fit of one logit matrix on its strict lower
    triangle (``g_back`` None; up to offset ``max_lag`` where given, g NaN past it), or on
    every off-diagonal entry (``two_sided``: ``g_back`` holds Δ = −1..−(T−1)); within one
    ``chunk`` where a chunked mask binds."""
    T = logits.shape[0]
    keep = fit_mask(T, two_sided, max_lag, chunk=chunk)
    clean = torch.from_numpy(np.where(keep, np.asarray(logits, np.float64), 0.0))
    if two_sided:
        r2, g, g_back, _ = shift_invariance_r2_two_sided(clean)
        return float(r2), g.numpy(), g_back.numpy()
    r2, g = shift_invariance_r2(clean, max_lag, chunk)
    return float(r2), g.numpy(), None


__all__ = ["matrix_fit"]

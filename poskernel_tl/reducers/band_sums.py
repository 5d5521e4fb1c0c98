"""Per-lag sums over a band of offsets, from the band's entries formed explicitly.

A layer with a sliding window reads the offsets Δ = 1..W of A = scale·q·kᵀ only (query
head h reads key/value head h // (H / H_kv)). Its Track A sums over those offsets, the
per-lag sums S1(Δ) = Σ_t A[t, t−Δ] and sums of squares S2(Δ) = Σ_t A[t, t−Δ]², follow
from the band's T·W entries themselves:

- the queries are taken in chunks c of C positions, and chunk c's keys
  [cC − P, cC + C) (P: W rounded up to a multiple of C; keys before 0 are zero padding)
  hold every entry of the band its rows read: one batched matmul per piece of chunks
  forms the blocks [rows, P + C], the key windows read in place as overlapping views;
- entry (i, j) of every chunk's block sits at the offset Δ = P + i − j, whatever the
  chunk, so the blocks and their squares are summed over the chunks first, leaving one
  [C, P + C] matrix per head; S1 and S2 are then its diagonals (strided lines).

Cost per head O(T·(W + C)·d) in matmuls of a good shape, memory O(C·(W + C)) per head
beyond q and k: for a window of a few d_head (Gemma 3's 512 at d_head 256) cheaper than
the FFT cross-correlation plus the running moments of :mod:`poskernel_tl.reducers.lag_sums`
(which cost the same whatever the window) and exact alike; :func:`band_is_cheaper`
says which. The blocks are formed and summed over a piece's chunks in ``dtype`` (float64
exact; float32 for the permutation null, ~1e-7 relative), the pieces and the lines summed
in float64.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.diagonals import diagonal_sums
from poskernel_tl.protocol import band_ends

ACC = torch.float64
BAND_CHUNK = 64
PIECE_BYTES = 8 << 20  # blocks formed at once (stay in cache while summed)
# the band path is taken while the keys a query chunk reads, W + C, are at most this many
# times d_head (CPU, 2 threads, T = 2048 and 8192: Gemma-3-270M's W = 511 at d_head 256
# 3.3–4.3× faster on the band than by FFT and moments; at d_head 64 the two even at
# (W + C)/d ≈ 9, the band 1.4–2× slower at 13–17)
BAND_KEYS_PER_DIM = 8


def band_is_cheaper(length: int, last: int | None, d_head: int) -> bool:
    """Whether a window of offsets 1..``last`` is summed on its band (not by FFT and
    running moments over the whole triangle)."""
    if last is None or last >= length - 1:
        return False
    return last + BAND_CHUNK <= BAND_KEYS_PER_DIM * d_head


def band_lag_sums(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                  last: int, dtype: torch.dtype = ACC, chunk: int = BAND_CHUNK
                  ) -> tuple[Float[Tensor, "batch head_index lag"],
                             Float[Tensor, "batch head_index lag"]]:
    """S1(Δ) and S2(Δ), Δ = 1..``last``, of scale·q·kᵀ per sequence and query head
    (float64; blocks formed in ``dtype``; see the module docstring)."""
    b, T, H, d = q.shape
    kv = k.shape[2]
    g, C = H // kv, max(1, min(chunk, T))
    W = min(last, T - 1)
    nc, P = -(-T // C), -(-W // C) * C
    span = P + C
    qc = torch.empty(b, kv, nc, g * C, d, dtype=dtype, device=q.device)
    if nc * C > T:  # (F.pad copies even when it pads nothing)
        q = F.pad(q, (0, 0, 0, 0, 0, nc * C - T))
    qc.view(b, kv, nc, g, C, d).copy_(q.view(b, nc, C, kv, g, d).permute(0, 3, 1, 4, 2, 5))
    kp = torch.zeros(b, kv, P + nc * C, d, dtype=dtype, device=q.device)
    kp[:, :, P:P + T] = k.transpose(1, 2)
    # each piece's sums over its chunks in ``dtype``, the pieces' in float64
    r1 = torch.zeros(b, kv, g * C, span, dtype=ACC, device=q.device)
    r2 = torch.zeros_like(r1)
    a1, a2 = (torch.empty_like(r1, dtype=dtype) for _ in range(2))
    step = max(1, PIECE_BYTES // (b * kv * g * C * span * qc.element_size()))
    for c0 in range(0, nc, step):
        c1 = min(nc, c0 + step)
        keys = kp[:, :, c0 * C:].as_strided((b, kv, c1 - c0, span, d),
                                            (kp.stride(0), kp.stride(1), C * d, d, 1))
        blocks = torch.matmul(qc[:, :, c0:c1], keys.transpose(-1, -2))
        a1.copy_(blocks[:, :, 0])
        a2.copy_(blocks[:, :, 0]).square_()
        for c in range(1, c1 - c0):
            a1.add_(blocks[:, :, c])
            a2.addcmul_(blocks[:, :, c], blocks[:, :, c])
        r1 += a1
        r2 += a2
    return tuple(diagonal_sums(r.view(b, H, C, span), P, W) * s
                 for r, s in ((r1, scale), (r2, scale * scale)))


_ENDS: dict = {}


def band_part_sums(s2: Float[Tensor, "batch head_index lag"], length: int
                   ) -> Float[Tensor, "batch head_index part"]:
    """Σ A² of each band of offsets of :func:`~poskernel_tl.protocol.band_ends` from the
    per-lag squares of Δ = 1..W (0 past W: bands a window removes)."""
    W = s2.shape[-1]
    upto = torch.cumsum(s2, -1)
    key = (length, W, str(s2.device))
    if key not in _ENDS:  # made once (no host-to-device copy per call on a GPU)
        _ENDS[key] = torch.tensor([min(e, W) - 1 for e in band_ends(length)], device=s2.device)
    at = upto.index_select(-1, _ENDS[key])
    return torch.diff(at, dim=-1, prepend=torch.zeros_like(at[..., :1]))


__all__ = ["band_is_cheaper", "band_lag_sums", "band_part_sums"]

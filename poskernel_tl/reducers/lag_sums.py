"""Track A's sufficient statistics straight from q and k, without the T×T logits.

With A[t, s] = scale·q_t·k_s (query head h reads key/value head h // (H / H_kv)), every
Track A fit (:mod:`poskernel_tl.fit.toeplitz`) needs, per block of the strictly lower
triangle, the per-lag sums S1(Δ) and the total sum of squares. Both follow from q and k:

1. Per-lag sums are a cross-correlation along positions, summed over d_head:
   S1(Δ) = Σ_{t=Δ}^{T−1} A[t, t−Δ] = scale · IFFT_n( Σ_i Q_i · conj(K_i) )[Δ],
   Q_i = FFT_n(q[:, i]), K_i = FFT_n(k[:, i]), zero-padded to n ≥ 2T − 1 so the circular
   correlation never wraps (for t < Δ the index t − Δ mod n ≥ T lands on padding). The
   sum over d_head is taken in the frequency domain: one inverse FFT per head.
2. The sum of squares of the strictly lower triangle is a running key second moment:
   Σ_{s<t} A[t, s]² = scale² · Σ_t q_tᵀ M_t q_t,  M_t = Σ_{s<t} k_s k_sᵀ (d × d).
   In chunks c of C positions: Σ_{t in c} q_tᵀ M_c q_t (M_c, the exclusive prefix sum of
   the chunks' key Grams) plus the chunk's own C × C strictly lower
   triangle, formed explicitly. The entries with t − s ≤ W (a window, a band of offsets)
   take the key chunks within W from a difference of two prefix sums, read through each
   chunk's query moment Σ_{t in c} q_t q_tᵀ (d² per chunk and end), and the ≤ 2 chunks W
   cuts through explicitly (C × C per chunk and end).
3. Every other region Track A fits (its variants, declared on the result's fields:
   :mod:`poskernel_tl.fit.variants`) either lies in the strip A[:, :50] of the first keys
   (the sink column, query rows 1–20) or leaves out only entries of it (no-sink, rows
   ≥ 50, the interior A[50:, 50:]). The strip is formed explicitly (T × 50 per head) and
   skewed once (entry (s, Δ) = A[s + Δ, s]); each region is a masked sum over it, or the
   whole triangle's sums less one.

Per-sequence g = S1 / n(Δ); pooled fits and 80/20 splits add sums over sequences. The
permutation null fits the lower triangle of A' = q[π]·k[π]ᵀ (unmasked: A'[t, s] =
A[π(t), π(s)] reads both triangles of A), which is again a product of two position
sequences, so 1 and 2 apply to q[π], k[π] unchanged: no causality is
assumed, and the null costs the same as the real fit.

Cost per sequence and head O(T·d·(d + C + 50) + d·T·log T) and memory
O(T·(d + C + 50) + (T / C)·d²) (with C = 64 ≈ d, O(T·d)), instead of O(T²·d) time and
O(T²) memory. Everything is computed in float64 (q/k are cast once per function, in the
layout it needs; the permutation null forms its products in float32, totals in
float64); GQA keys are broadcast by folding a kv head's query heads into the row
dimension of each product (or by broadcasting in the frequency domain), never copied per
query head.
"""

from dataclasses import dataclass

import numpy as np
import scipy.fft as sp_fft
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.protocol import band_ends
from poskernel_tl.reducers.band_sums import band_is_cheaper, band_lag_sums, band_part_sums
from poskernel_tl.reducers.track_a_result import STRIP

ACC = torch.float64
DEFAULT_CHUNK = 64
MOMENT_BYTES = 16 << 20  # per piece of the windowed sums of squares' query moments (in cache)
# positions of a batch the float64 FFT and key-moment work holds at once: longer batches
# are taken a few sequences at a time (same sums, less transient memory at long T)
PIECE_TOKENS = 4096
SCIPY_FROM = 2048  # FFT sizes from which a CPU's float64 lag sums take scipy's FFT


def _pieces(b: int, T: int) -> list[slice]:
    """Slices of the batch axis of at most max(1, PIECE_TOKENS // T) sequences each (one
    slice when the whole batch fits)."""
    step = max(1, PIECE_TOKENS // T)
    return [slice(i, i + step) for i in range(0, b, step)]


def _fft_size(n: int) -> int:
    """The smallest 2^a·3^b ≥ n (fast sizes for every FFT backend)."""
    best = 1 << max(0, (n - 1).bit_length())
    p3 = 1
    while p3 < best:
        p2 = p3
        while p2 < n:
            p2 *= 2
        best = min(best, p2)
        p3 *= 3
    return best


def cast_permuted(x: Tensor, dims: tuple[int, ...], dtype: torch.dtype = ACC) -> Tensor:
    """``x.permute(dims)`` as a contiguous ``dtype`` tensor, cast and transposed in one pass."""
    out = torch.empty([x.shape[i] for i in dims], dtype=dtype, device=x.device)
    return out.copy_(x.permute(*dims))


def _padded_acc(x: Float[Tensor, "batch pos head_index d_head"], n: int,
                dtype: torch.dtype = ACC) -> Float[Tensor, "batch head_index d_head fft_pos"]:
    """x as ``dtype`` [b, head, d, n], positions last and zero-padded to n (one pass)."""
    b, T, h, d = x.shape
    out = torch.zeros(b, h, d, n, dtype=dtype, device=x.device)
    out[..., :T] = x.permute(0, 2, 3, 1)
    return out


def cross_correlation(q: Float[Tensor, "batch pos head_index d_head"],
                      k: Float[Tensor, "batch pos kv_head_index d_head"], n: int,
                      dtype: torch.dtype = ACC, scipy: bool | None = None
                      ) -> Float[Tensor, "batch head_index fft_pos"]:
    """IFFT_n(Σ_i FFT_n(q_i)·conj(FFT_n(k_i))) per query head, positions zero-padded to n,
    transforms in ``dtype``. ``scipy`` takes scipy's FFT and numpy's einsum for the sum over
    d_head, else torch's FFT and complex product; the two agree to rounding (tested). By
    default scipy's where it is the faster on a CPU (one thread, SmolLM2's heads): float64
    with n ≥ :data:`SCIPY_FROM` (torch's time over scipy's: 1.2–2.2 from T = 1024 on,
    0.6–0.8 below), not float32 (the two within ±15% at every length)."""
    b, T, H, d = q.shape
    kv = k.shape[2]
    if scipy is None:
        scipy = q.device.type == "cpu" and dtype == torch.float64 and n >= SCIPY_FROM
    if scipy:  # on rows already zero-padded to n (scipy's own padding is the slower)
        workers = torch.get_num_threads()
        qf, kf = (sp_fft.rfft(_padded_acc(x, n, dtype).numpy(), workers=workers,
                              overwrite_x=True) for x in (q, k))
        f = qf.shape[-1]
        spec = np.einsum("bkgdf,bkdf->bkgf", qf.reshape(b, kv, H // kv, d, f), kf.conj())
        return torch.from_numpy(sp_fft.irfft(spec.reshape(b, H, f), n=n, workers=workers))
    qf = torch.fft.rfft(_padded_acc(q, n, dtype))  # [b, H, d, f]
    kf = torch.fft.rfft(_padded_acc(k, n, dtype))  # [b, kv, d, f]
    f = qf.shape[-1]
    spec = qf.view(b, kv, H // kv, d, f).mul_(kf.conj().unsqueeze(2)).sum(3)
    return torch.fft.irfft(spec.reshape(b, H, f), n=n)


def lag_sums(q: Float[Tensor, "batch pos head_index d_head"],
             k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
             dtype: torch.dtype = ACC) -> Float[Tensor, "batch head_index lag"]:
    """S1(Δ) = Σ_{t ≥ Δ} scale·q_t·k_{t−Δ} for Δ = 1..T−1, by FFT cross-correlation
    (identity 1 of the module docstring), in ``dtype``, returned as float64."""
    b, T, H, d = q.shape
    if len(parts := _pieces(b, T)) > 1:
        return torch.cat([lag_sums(q[p], k[p], scale, dtype) for p in parts])
    corr = cross_correlation(q, k, _fft_size(2 * T - 1), dtype)  # lag m at column m
    return corr[..., 1:T].to(ACC) * scale


_MASKS: dict = {}


def _strict_lower(C: int, device) -> Tensor:
    """Float64 [C, C] with ones strictly below the diagonal (cached per size/device)."""
    key = ("lower", C, str(device))
    if key not in _MASKS:
        _MASKS[key] = torch.ones(C, C, dtype=ACC, device=device).tril(-1)
    return _MASKS[key]


def before(x: Tensor, dim: int) -> Tensor:
    """Exclusive prefix sums along ``dim``, in place: x[c] becomes Σ_{c' < c} x[c'] (a
    chunk's running moment of the chunks before it), with one slice of temporaries and no
    second copy of ``x`` (4 GiB at rank 512 and T = 32,768). One in-place add per step: on
    CPU many times faster than ``torch.cumsum`` along a leading dimension of [d, d]
    blocks. Returns ``x``."""
    xs = x.movedim(dim, 0)
    running = torch.zeros_like(xs[0])
    for c in range(xs.shape[0]):
        here = xs[c].clone()
        xs[c].copy_(running)
        running.add_(here)
    return x


def windowed(x: Float[Tensor, "*batch lag"], last: int | None) -> Float[Tensor, "*batch lag"]:
    """``x`` over lags Δ = 1..T−1 with the lags past ``last`` (those a sliding window
    removes) zeroed; ``x`` itself when the window keeps every lag."""
    if last is None or last >= x.shape[-1]:
        return x
    out = x.clone()
    out[..., last:] = 0
    return out


def lower_sum_squares(q: Float[Tensor, "batch pos head_index d_head"],
                      k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                      chunk: int = DEFAULT_CHUNK, last: int | None = None,
                      dtype: torch.dtype = ACC) -> Float[Tensor, "batch head_index"]:
    """Σ (scale·q_t·k_s)² over 0 < t − s ≤ ``last`` (default: the whole strictly lower
    triangle), products in ``dtype``, totals in float64 (:func:`sum_squares_upto`)."""
    T = q.shape[1]
    ends = [T - 1 if last is None else last]
    return sum_squares_upto(q, k, scale, ends, chunk, dtype)[..., 0]


def band_sum_squares(q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                     chunk: int = DEFAULT_CHUNK, last: int | None = None,
                     dtype: torch.dtype = ACC) -> tuple[Float[Tensor, "batch head_index"],
                                Float[Tensor, "batch head_index"],
                                Float[Tensor, "batch head_index part"]]:
    """Σ (scale·q_t·k_s)² over the whole strictly lower triangle, over t − s ≤ ``last``
    (the whole again without one) and over each band of offsets of the partition
    :func:`~poskernel_tl.protocol.band_ends` (0 past ``last``), from one
    :func:`sum_squares_upto` (products formed in ``dtype``; with the whole triangle to
    sum, cheaper than a window's band plus the whole: 178 against 228 ms for a
    Gemma-3-270M local layer at T = 8192 in float64)."""
    T = q.shape[1]
    end = T - 1 if last is None else min(last, T - 1)
    ends = band_ends(T)
    upto = sum_squares_upto(q, k, scale, [T - 1, end] + [min(e, end) for e in ends], chunk,
                            dtype)
    bands = torch.diff(upto[..., 2:], dim=-1, prepend=torch.zeros_like(upto[..., :1]))
    return upto[..., 0], upto[..., 1], bands


def sum_squares_upto(q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                     ends: list[int], chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = ACC
                     ) -> Float[Tensor, "batch head_index end"]:
    """Σ (scale·q_t·k_s)² over 0 < t − s ≤ W for each W of ``ends`` (identity 2 of the
    module docstring by chunks of C positions). With K_c = Σ_{s in chunk c} k_s k_sᵀ and
    Q_c = Σ_{t in chunk c} q_t q_tᵀ, the key chunks c − j wholly within W of every query
    of chunk c (1 ≤ j ≤ J = ⌊(W + 1)/C⌋ − 1) add ⟨Q_c, K_{c−J} + … + K_{c−1}⟩, a
    difference of two running key moments: each end costs d² per chunk, not per query
    (with no such window, the whole triangle's q_tᵀ M_c q_t is taken query by query).
    The chunk itself (j = 0) and the ≤ 2 key chunks W cuts through are formed explicitly
    (C × C per chunk and offset, each formed once for all ends), masked to 1 ≤ t − s ≤ W.
    Positions are zero-padded to a multiple of C (zero rows add nothing); a kv head's
    query heads share its key moments. C is ``chunk``, at least d_head / 2: on
    Gemma-3-270M at T = 8192, Track A's float64 sums by band 218 → 189 ms and the null's
    float32 ones 268 → 230 ms with C = 128 against 64, and with Track B's rank-512
    correction at C = 256 the whole run's peak RSS 8.61 → 7.81 GiB (15.12 → 13.74 GiB at
    T = 16,384). In float32 the chunking is part of the rounding (~1e-7 relative either
    way). Products, the C × C squares and Q_c are formed in ``dtype`` (float32 is 2–3×
    faster on CPU, ~1e-7 relative), the moments' inner products and every total in
    float64."""
    b, T, H, d = q.shape
    if len(parts := _pieces(b, T)) > 1:
        return torch.cat([sum_squares_upto(q[p], k[p], scale, ends, chunk, dtype)
                          for p in parts])
    kv, g = k.shape[2], H // k.shape[2]
    C = max(1, min(max(chunk, d // 2), T))  # at least d_head / 2: longer contractions
    nc = -(-T // C)
    if nc * C > T:
        q = F.pad(q, (0, 0, 0, 0, 0, nc * C - T))
        k = F.pad(k, (0, 0, 0, 0, 0, nc * C - T))
    # chunk-first [chunk, b, kv, group·C, d] (row j·C + i: query head j at offset i), so
    # that the chunks c ≥ j are one contiguous slice for every product below
    qc = cast_permuted(q.reshape(b, nc, C, kv, g, d), (1, 0, 3, 4, 2, 5), dtype
                 ).view(nc, b, kv, g * C, d)
    kc = cast_permuted(k.reshape(b, nc, C, kv, d), (1, 0, 3, 2, 4), dtype)  # [chunk, b, kv, C, d]
    # M_c = Σ_{c' < c} K_c' in float64; moment[J] = Σ_c Σ_{t in c} q_tᵀ M_{c−J} q_t
    prior = before(torch.matmul(kc.transpose(-1, -2), kc).to(ACC), 0)
    fulls = [min(max(0, (W + 1) // C - 1), nc - 1) for W in ends]
    windows = sorted(set(fulls) - {0, nc - 1})
    if windows:  # as ⟨Q_c, M_{c−J}⟩: d² per chunk and end, not per query
        moment = _window_moments(qc.view(nc, b, kv, g, C, d), prior, [0] + windows)
    else:
        moment = {0: torch.matmul(qc, prior.to(dtype)).mul_(qc).view(nc, b, kv, g, C, d).sum(
            (0, 4, 5), dtype=ACC)}
    offset = (torch.arange(C, device=q.device)[:, None] - torch.arange(C, device=q.device))
    squares: dict[int, Tensor] = {}  # chunk offset j -> Σ_c (q_t·k_s)² of key chunk c − j
    total = {}
    for W, full in sorted(set(zip(ends, fulls))):
        acc = qc.new_zeros(b, kv, g, dtype=ACC)
        if full > 0:  # the key chunks c − J .. c − 1
            acc += moment[0] - (moment[full] if full < nc - 1 else 0)
        for j in [0] + list(range(full + 1, min(nc - 1, (W + C - 1) // C) + 1)):
            if j not in squares:
                squares[j] = torch.matmul(qc[j:], kc[:nc - j].transpose(-1, -2)
                                          ).square_().sum(0).view(b, kv, g, C, C)
            lag = j * C + offset
            acc += (squares[j] * ((lag >= 1) & (lag <= W))).sum((-2, -1), dtype=ACC)
        total[W] = acc.reshape(b, H)
    return torch.stack([total[W] for W in ends], -1) * (scale * scale)


def _window_moments(qv: Float[Tensor, "chunk batch kv_head_index group pos d_head"],
                    prior: Float[Tensor, "chunk batch kv_head_index d_head d_head"],
                    lags: list[int]) -> dict[int, Tensor]:
    """moment[J] = Σ_{c ≥ J} ⟨Q_c, M_{c−J}⟩ per (sequence, kv head, group), the Q_c formed
    for :data:`MOMENT_BYTES` worth of chunks at a time and read for every J while they are
    in cache (all at once they were memory-bound: 0.24 against 0.17 s for one Gemma-3-270M
    layer at T = 8192; at rank 512 and T = 32,768 they would be 4 GiB)."""
    nc, b, kv, g, _, d = qv.shape
    pv = prior.view(nc, b, kv, d * d, 1)
    moment = {J: prior.new_zeros(b, kv, g) for J in lags}
    step = max(1, MOMENT_BYTES // (b * kv * g * d * d * 8))
    for c0 in range(0, nc, step):
        c1 = min(nc, c0 + step)
        part = qv[c0:c1]
        qm = torch.matmul(part.transpose(-1, -2), part).to(ACC).view(c1 - c0, b, kv, g, d * d)
        for J in lags:
            lo = max(c0, J)  # the chunks c ≥ J of this piece
            if lo < c1:
                moment[J] += torch.matmul(qm[lo - c0:], pv[lo - J:c1 - J]).sum((0, 4))
    return moment


def key_strip(q: Float[Tensor, "batch pos head_index d_head"],
              k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
              key_hi: int) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """The strip A[:, :key_hi] = scale·q·k[:key_hi]ᵀ in float64, every query row (entries
    with s ≥ t included: callers skip them), GQA keys broadcast."""
    b, T, H, d = q.shape
    kv = k.shape[2]
    qf = cast_permuted(q.reshape(b, T, kv, H // kv, d), (0, 2, 3, 1, 4)).view(b, kv, H // kv * T, d)
    kk = k[:, :key_hi].to(ACC).permute(0, 2, 3, 1) * scale  # [b, kv, d, key]
    return torch.matmul(qf, kk).view(b, H, T, key_hi)


def skew_keys(strip: Float[Tensor, "batch head_index query_pos key_pos"]
              ) -> Float[Tensor, "batch head_index key_pos lag"]:
    """out[..., s, Δ−1] = A[s + Δ, s] (0 where s + Δ ≥ T), Δ = 1..T−1: the strictly lower
    entries of the strip by key and lag. One zero-padded copy, then a strided view: row s
    of the padded [key, T + K] buffer read from column s + 1."""
    b, H, T, K = strip.shape
    W = T + K
    buf = strip.new_zeros(b, H, K, W)
    buf[..., :T] = strip.transpose(-1, -2)
    return buf.as_strided((b, H, K, T - 1), (H * K * W, K * W, W + 1, 1),
                          buf.storage_offset() + 1)


@dataclass
class LowerStats:
    """Per (sequence, head) sums Track A fits, float64: S1(Δ) and Σ A² of the whole
    strictly lower triangle, Σ A² of each band of offsets
    (:func:`~poskernel_tl.protocol.band_ends`), and the strip of the first
    :data:`~poskernel_tl.reducers.track_a_result.STRIP` keys skewed to [key, lag] (entry (s, Δ−1) =
    A[s + Δ, s]), from which every variant's region is summed
    (:func:`~poskernel_tl.fit.variants.region_sums`). Under a window (``last``) ``sq``
    and ``bands`` are the window's, ``s1`` keeps every lag (the window is applied by the
    lag counts) and ``sq_whole`` is Σ A² of the whole triangle."""

    s1: Float[Tensor, "batch head_index lag"]
    sq: Float[Tensor, "batch head_index"]
    sq_whole: Float[Tensor, "batch head_index"]
    bands: Float[Tensor, "batch head_index part"]
    skewed: Float[Tensor, "batch head_index key_pos lag"]


def track_a_stats(q: Float[Tensor, "batch pos head_index d_head"],
                  k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                  chunk: int = DEFAULT_CHUNK, last: int | None = None) -> LowerStats:
    """Every sum :class:`~poskernel_tl.reducers.track_a.TrackAReducer` keeps, from q/k
    (identities 1–3 of the module docstring); ``last``: Σ A² over the entries with
    t − s ≤ last only (those a sliding window keeps)."""
    T = q.shape[1]
    if T < 2:
        raise ValueError(f"need at least 2 positions, got T={T}")
    skewed = skew_keys(key_strip(q, k, scale, min(STRIP, T)))
    whole, kept, bands = band_sum_squares(q, k, scale, chunk, last)
    return LowerStats(lag_sums(q, k, scale), kept, whole, bands, skewed)


def lower_stats(q: Float[Tensor, "batch pos head_index d_head"],
                k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
                chunk: int = DEFAULT_CHUNK, last: int | None = None,
                dtype: torch.dtype = ACC
                ) -> tuple[Float[Tensor, "batch head_index lag"],
                           Float[Tensor, "batch head_index"],
                           Float[Tensor, "batch head_index part"]]:
    """(S1(Δ), Σ A², Σ A² of each band of offsets) of the strictly lower triangle of
    scale·q·kᵀ (identities 1, 2), over t − s ≤ ``last`` where given, formed in
    ``dtype`` with float64 totals; for the permutation null, pass q[:, π], k[:, π]. A
    window the band path sums more cheaply is summed on its band alone (no FFT)."""
    T = q.shape[1]
    if band_is_cheaper(T, last, q.shape[-1]):
        s1, s2 = band_lag_sums(q, k, scale, last, dtype)
        return F.pad(s1, (0, T - 1 - s1.shape[-1])), s2.sum(-1), band_part_sums(s2, T)
    _, kept, bands = band_sum_squares(q, k, scale, chunk, last, dtype)
    return windowed(lag_sums(q, k, scale, dtype), last), kept, bands


__all__ = ["LowerStats", "band_sum_squares", "cast_permuted", "cross_correlation", "key_strip",
           "lag_sums", "lower_stats", "lower_sum_squares", "skew_keys", "sum_squares_upto",
           "track_a_stats", "windowed"]

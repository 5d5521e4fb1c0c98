"""The shift-invariant (Toeplitz) fit on the strictly lower triangle, from sufficient
statistics.

For a score matrix A[t, s] restricted to s < t (lag Δ = t − s = 1..T−1), the best
shift-invariant fit is g(Δ) = mean of the Δ-th sub-diagonal, and

    SS_res = Σ_{s<t} A² − Σ_Δ S1(Δ)² / n(Δ),     SS_tot = Σ_{s<t} A² − (Σ_Δ S1(Δ))² / N,
    R² = 1 − SS_res / SS_tot,

with S1(Δ) the sum and n(Δ) the count of sub-diagonal Δ, N = Σ n(Δ). Sums add across
sequences, so pooled fits, subsets and subsets of query rows all come from the same
three numbers per lag: count, sum, and the total sum of squares.
"""

import warnings

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor


def skew_lower(
    scores: Float[Tensor, "*batch query_pos key_pos"],
) -> Float[Tensor, "*batch query_pos lag"]:
    """View of the strictly lower triangle indexed by lag: out[..., t, Δ−1] = A[t, t−Δ]
    for Δ = 1..T−1, and 0 where t < Δ (no such key). One padded copy of A."""
    T = scores.shape[-1]
    batch = scores.shape[:-2]
    padded = F.pad(scores.flip(-1), (0, T))  # [..., T, 2T]: padded[t, j] = A[t, T-1-j]
    sheared = padded.reshape(*batch, 2 * T * T)[..., : T * (2 * T - 1)]
    sheared = sheared.reshape(*batch, T, 2 * T - 1)  # sheared[t, c] = padded[t, c - t]
    return sheared[..., T:]  # c = T-1+Δ, i.e. s = t - Δ


def lag_counts(T: int, row_lo: int = 0, row_hi: int | None = None,
               device=None) -> Float[Tensor, " lag"]:
    """n(Δ) for Δ = 1..T−1: how many query rows t in [row_lo, row_hi) have a key at t−Δ."""
    row_hi = T if row_hi is None else min(row_hi, T)
    lags = torch.arange(1, T, device=device, dtype=torch.float64)
    lo = torch.clamp(lags, min=row_lo)
    return torch.clamp(row_hi - lo, min=0)


def lag_sums(
    scores: Float[Tensor, "*batch query_pos key_pos"],
    row_lo: int = 0,
    row_hi: int | None = None,
) -> tuple[Float[Tensor, "*batch lag"], Float[Tensor, "*batch"]]:
    """Per-lag sums S1(Δ) and the total sum of squares over the strictly lower triangle
    (optionally only query rows in [row_lo, row_hi)), accumulated in float64."""
    return lag_sums_blocks(scores, [(row_lo, row_hi)])[0]


def lag_sums_blocks(
    scores: Float[Tensor, "*batch query_pos key_pos"],
    blocks: list[tuple[int, int | None]],
) -> list[tuple[Float[Tensor, "*batch lag"], Float[Tensor, "*batch"]]]:
    """:func:`lag_sums` for several blocks of query rows from one skewed copy of A.
    Products are formed in the input dtype; all sums are accumulated in float64."""
    z = skew_lower(scores)
    zz = z * z
    out = []
    for lo, hi in blocks:
        out.append((z[..., lo:hi, :].sum(dim=-2, dtype=torch.float64),
                    zz[..., lo:hi, :].sum(dim=(-2, -1), dtype=torch.float64)))
    return out


def r2_from_sums(
    s1: Float[Tensor, "*batch lag"],
    sq: Float[Tensor, "*batch"],
    counts: Float[Tensor, " lag"],
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"]]:
    """R² and g(Δ) from per-lag sums, total sum of squares and per-lag counts.
    Lags with no entries get g = NaN; a constant input (SS_tot = 0) gives R² = NaN."""
    counts = counts.to(s1.device, torch.float64)
    s1 = s1.double()
    sq = sq.double()
    has = counts > 0
    safe = torch.where(has, counts, torch.ones_like(counts))
    g = torch.where(has, s1 / safe, torch.full_like(s1, float("nan")))
    n_total = counts.sum()
    explained = torch.where(has, s1 * s1 / safe, torch.zeros_like(s1)).sum(-1)
    total = s1.sum(-1)
    ss_tot = sq - total * total / n_total
    ss_res = sq - explained
    # relative floor: SS_tot at rounding level of Σ A² is a constant matrix
    degenerate = ss_tot <= 1e-12 * torch.clamp(sq, min=torch.finfo(torch.float64).tiny)
    if bool(degenerate.any()):
        warnings.warn("shift_invariance_r2: constant input (zero variance); R² is NaN",
                      RuntimeWarning, stacklevel=2)
    r2 = torch.where(degenerate, torch.full_like(ss_tot, float("nan")),
                     1.0 - ss_res / torch.where(degenerate, torch.ones_like(ss_tot), ss_tot))
    return r2, g


def shift_invariance_r2(
    scores: Float[Tensor, "*batch query_pos key_pos"],
) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch lag"]]:
    """Fit g(Δ) to the strictly lower triangle of ``scores`` and return ``(r2, g)``.

    ``g[..., Δ−1]`` is the mean of sub-diagonal Δ (Δ = 1..T−1); R² = 1 − SS_res/SS_tot
    over all entries with s < t, accumulated in float64. Entries on or above the
    diagonal are ignored whatever they hold (masked fills included).
    """
    T = scores.shape[-1]
    if scores.shape[-2] != T or T < 3:
        raise ValueError(f"need square score matrices with T >= 3, got {tuple(scores.shape)}")
    s1, sq = lag_sums(scores)
    return r2_from_sums(s1, sq, lag_counts(T, device=scores.device))


# ------------------------------------------------------------- straight from q and k
def qk_lag_sums(
    q: Float[Tensor, "batch pos head_index d_head"],
    k: Float[Tensor, "batch pos kv_head_index d_head"],
    scale: float,
    row_blocks: list[tuple[int, int]],
    chunk: int = 128,
) -> list[tuple[Float[Tensor, "batch head_index lag"], Float[Tensor, "batch head_index"]]]:
    """The sufficient statistics of A = scale·q·kᵀ (per query head; keys shared by GQA
    groups) for blocks of query rows, without forming any T×T matrix, in float64:

    * S1(Δ) = scale·Σ_{t∈block} q_t·k_{t−Δ}: a cross-correlation along positions, one
      zero-padded FFT per block (O(T log T · d));
    * Σ_{t∈block} Σ_{s<t} A[t, s]² = scale²·Σ_t q_tᵀ P_t q_t with the running key moment
      P_t = Σ_{s<t} k_s k_sᵀ (O(T · d²), in chunks of ``chunk`` positions).
    """
    b, T, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    q64 = q.double().permute(0, 2, 1, 3).reshape(b, kv, g, T, d)
    k64 = k.double().permute(0, 2, 1, 3).unsqueeze(2)  # [b, kv, 1, T, d]
    n = 2 * T  # zero padding: k at negative positions wraps onto zeros
    k_hat = torch.fft.rfft(k64, n=n, dim=-2).conj()
    rows = torch.arange(T, device=q.device)

    # per-row sums of squares of the strictly lower triangle, [b, kv, g, T]
    moment = torch.zeros(b, kv, 1, d, d, dtype=torch.float64, device=q.device)
    row_sq = []
    for c0 in range(0, T, chunk):
        kc = k64[..., c0:c0 + chunk, :]
        outer = kc.unsqueeze(-1) * kc.unsqueeze(-2)  # [b, kv, 1, C, d, d]
        inclusive = outer.cumsum(dim=-3)
        before = inclusive - outer + moment.unsqueeze(-3)  # Σ_{s<t} k_s k_sᵀ
        qc = q64[..., c0:c0 + chunk, :]
        row_sq.append(torch.einsum("bkgcd,bkcde,bkgce->bkgc", qc, before[:, :, 0], qc))
        moment = moment + inclusive[..., -1, :, :]
    row_sq = torch.cat(row_sq, dim=-1) * scale * scale

    out = []
    for lo, hi in row_blocks:
        mask = ((rows >= lo) & (rows < hi)).double()
        if not bool(mask.any()):
            out.append((torch.zeros(b, h, T - 1, dtype=torch.float64, device=q.device),
                        torch.zeros(b, h, dtype=torch.float64, device=q.device)))
            continue
        q_hat = torch.fft.rfft(q64 * mask[:, None], n=n, dim=-2)
        corr = torch.fft.irfft((q_hat * k_hat).sum(-1), n=n, dim=-1)  # [b, kv, g, n]
        s1 = corr[..., 1:T].reshape(b, h, T - 1) * scale
        sq = (row_sq * mask).sum(-1).reshape(b, h)
        out.append((s1, sq))
    return out

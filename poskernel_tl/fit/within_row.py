"""The within-row fit: how much of each query row's variation is a function of the offset.

A softmax row is unchanged by adding a constant to the row, so what a head attends to is
decided by the variation of its logits within each row. The within-row fit reads

    A_x(t, s) ≈ g(Δ) + c_x(t),     Δ = t − s,

over the kept entries (Track A's: the strictly lower triangle of a causal layer within its
window; every off-diagonal entry of a bidirectional one) — one lag kernel g shared by the
sequences fitted together and a free constant c_x(t) for every row of every sequence —
by least squares, and its R² is the share of the within-row variance
SS_w = Σ_{x,t} Σ_s (A_x(t, s) − Ā_x(t))² that g explains. Adding any constant to any row
changes nothing in it (a query norm, a content bias of the query, ALiBi's key-position
form against the paper's offset form, a softmax that subtracts each row's maximum).

**From sums.** With R_x(t) the sum of row t's kept entries, m_t their number, S(Δ) the
per-lag sums Track A keeps and n(Δ) the lag counts of one sequence, eliminating the row
constants leaves one system for g of N sequences:

    N·K g = r,   K = diag(n) − Σ_t (1/m_t)·b_t b_tᵀ,   r(Δ) = S(Δ) − Σ_{t ∋ Δ} R(t)/m_t,

with b_t the lags row t keeps and R = Σ_x R_x. The explained sum of squares is g·r, so

    R²_within = (rᵀ K⁺ r / N) / (Σ A² − Σ_{x,t} R_x(t)² / m_t).

K is singular once (g + a, c − a fit alike); r is orthogonal to its null vector, so any
solution gives the same g·r. Nothing here holds a T × T matrix: a reducer keeps
u(Δ) = Σ_{t ∋ Δ} R_x(t)/m_t and Σ_t R_x(t)²/m_t per sequence beside Track A's sums.

**Solving.** A causal layer's row t keeps the offsets 1..m_t with m_t = min(t, W) (a
chunked mask of C positions: min(t mod C, W)), so K[i, j] = n_i·δ_ij − τ(max(i, j)) with
τ(j) = Σ_{t: m_t ≥ j} 1/m_t; the difference of consecutive equations is a recursion,

    n_{i+1} g_{i+1} = r_{i+1} − r_i + n_i g_i − (τ_i − τ_{i+1}) Σ_{j ≤ i} g_j,

solved from g_1 = 0 in one sweep over the offsets for every head and sequence at once
(O(W) per right-hand side; against a dense solve: 1e-14 relative at T = 4096). A
bidirectional layer's rows keep both sides (m_t = T − 1; under a two-sided window of W,
min(t, W) + min(T − 1 − t, W)); its K is formed over the kept signed offsets (2(T − 1)
without a window) and solved by Cholesky with the null vector pinned (O(T³) once per
length).
"""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.mask import Mask, within


@dataclass(frozen=True)
class RowLayout:
    """The row/offset incidence of one layer's kept entries at length ``T``: ``last``
    the last offset the layer keeps on each side it keeps (its window; T − 1 without one);
    ``two_sided`` for a bidirectional layer (both triangles); ``chunk`` a chunked mask's
    where it binds (row t keeps offsets up to t mod chunk). Lag axes follow Track A's:
    Δ = 1..T−1 (zero past ``last``), then, two-sided, Δ = −1..−(T−1)."""

    T: int
    last: int
    two_sided: bool = False
    chunk: int | None = None
    _weights: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, mask: Mask) -> "RowLayout":
        """The layout of the entries ``mask`` keeps."""
        return cls(mask.length, mask.last, two_sided=not mask.causal, chunk=mask.chunk)

    @property
    def mask(self) -> Mask:
        return Mask(self.T, not self.two_sided, self.last, self.chunk)

    @property
    def windowed(self) -> bool:
        return self.last < self.T - 1

    @property
    def n_lags(self) -> int:
        return (2 if self.two_sided else 1) * (self.T - 1)

    def row_counts(self, device=None) -> Float[Tensor, " query_pos"]:
        """m_t: how many entries row t keeps (0 for a causal layer's row 0)."""
        t = torch.arange(self.T, dtype=torch.float64, device=device)
        if self.two_sided:  # min(t, W) keys before, min(T − 1 − t, W) after
            W = self.last
            return torch.clamp(t, max=W) + torch.clamp(self.T - 1 - t, max=W)
        return torch.clamp(t if self.chunk is None else t % self.chunk, max=self.last)

    def lag_counts(self, device=None) -> Float[Tensor, " lag"]:
        """n(Δ) of one sequence on the lag axis (Track A's counts of each side)."""
        n = lag_counts(self.T, device=device, last=self.last, chunk=self.chunk)
        return torch.cat([n, n]) if self.two_sided else n  # (a two-sided mask: symmetric)

    def weights(self, device) -> tuple[Tensor, Tensor | None]:
        """1/m_t (0 where a row keeps nothing) and, for a window, the kept lags as 0/1;
        made once per device."""
        key = str(device)
        if key not in self._weights:
            m = self.row_counts(device)
            inv = torch.where(m > 0, 1.0 / torch.clamp(m, min=1.0), 0.0)
            kept = None if not self.windowed else \
                within(torch.arange(1, self.T, device=device), self.last).double()
            if kept is not None and self.two_sided:
                kept = torch.cat([kept, kept])
            self._weights[key] = inv, kept
        return self._weights[key]

    def row_terms(self, rows: Float[Tensor, "*batch query_pos"]
                  ) -> tuple[Float[Tensor, "*batch lag"], Float[Tensor, " *batch"]]:
        """(u, Σ_t R(t)²/m_t) of the rows' kept sums ``rows`` = R(t) (float64): u(Δ) the
        sum of R(t)/m_t over the rows keeping Δ — a causal layer's offset Δ is kept by the
        rows t ≥ Δ (for Δ ≤ its window), offset −Δ by the rows t ≤ T − 1 − Δ."""
        inv, kept = self.weights(rows.device)
        per_row = rows * inv
        if self.chunk is not None:  # the rows keeping Δ: those with m_t ≥ Δ
            by_m = per_row.new_zeros(*per_row.shape[:-1], self.T + 1)
            by_m.index_add_(-1, self.row_counts(rows.device).long(), per_row)
            u = by_m.flip(-1).cumsum(-1).flip(-1)[..., 1:self.T]
            return u, torch.linalg.vecdot(per_row, rows)
        inclusive = torch.cumsum(per_row, -1)
        # Σ_{t ≥ Δ} = total − Σ_{t < Δ}, for Δ = 1..T−1
        lower = inclusive[..., -1:] - inclusive[..., :-1]
        u = torch.cat([lower, inclusive[..., :-1].flip(-1)], -1) if self.two_sided else lower
        if kept is not None:
            u = u * kept
        return u, torch.linalg.vecdot(per_row, rows)

    @cached_property
    def _dense(self) -> tuple[Tensor, Tensor]:
        """The kept signed offsets and the Cholesky factor of K + 11ᵀ/L over them
        (two-sided layers; K's null vector pinned): K[a, b] = n_a·δ_ab − Σ 1/m_t over
        the rows t keeping both a and b — the rows max(0, a, b) ≤ t ≤ T − 1 + min(0, a, b)
        (a window keeps a pair in every such row, or none), summed as a difference of the
        running Σ 1/m_t (every m_t is T − 1 without a window: that count over T − 1)."""
        T = self.T
        d = torch.arange(1, T, dtype=torch.float64)
        kept = within(torch.cat([d, d]), self.last)
        signed = torch.cat([d, -d])[kept]
        hi, lo = torch.maximum(signed[:, None], signed[None]), \
            torch.minimum(signed[:, None], signed[None])
        first, last = torch.clamp(hi, min=0), torch.clamp(T - 1 + lo, max=T - 1)
        if self.windowed:
            running = F.pad(torch.cumsum(1.0 / self.row_counts(), 0), (1, 0))
            shared = torch.where(last >= first, running[(last + 1).long()] -
                                 running[first.long()], 0.0)
        else:  # rows t keeping both offsets, each 1/(T − 1)
            shared = torch.clamp(last - first + 1, min=0) / (T - 1)
        K = torch.diag(self.lag_counts()[kept]) - shared + 1.0 / len(signed)
        return torch.nonzero(kept)[:, 0], torch.linalg.cholesky(K)

    def solve(self, rhs: Float[Tensor, "*batch lag"]) -> Float[Tensor, "*batch lag"]:
        """One solution g of K g = ``rhs`` (``rhs`` orthogonal to K's null vector), zero
        at the offsets no row keeps."""
        if not self.two_sided:
            return self._recursion(rhs)
        index, chol = (x.to(rhs.device) for x in self._dense)
        flat = rhs[..., index].reshape(-1, len(index)).T
        out = torch.zeros_like(rhs)
        out[..., index] = torch.cholesky_solve(flat, chol).T.reshape(*rhs.shape[:-1], -1)
        return out

    def _recursion(self, rhs: Float[Tensor, "*batch lag"]) -> Float[Tensor, "*batch lag"]:
        """The causal sweep of the module docstring (zero past the window)."""
        W, dev = self.last, rhs.device
        # τ(j) for j = 1..W+1 (τ(W+1) = 0)
        tau = _tails(self.row_counts(dev), self.weights(dev)[0], W)
        n = self.lag_counts(dev)[:W]
        drop = (tau[:-1] - tau[1:]).tolist()
        n_host = n.tolist()
        # in numpy on the host: W small steps over every right-hand side at once (a
        # torch operator per step costs more than the arithmetic at these sizes)
        r = rhs[..., :W].reshape(-1, W).T.cpu().numpy()  # [lag, every right-hand side]
        g = np.zeros_like(r)
        G = np.zeros_like(r[0])
        for i in range(W - 1):
            g[i + 1] = (r[i + 1] - r[i] + n_host[i] * g[i] - drop[i] * G) / n_host[i + 1]
            G += g[i + 1]
        out = torch.zeros_like(rhs)
        out[..., :W] = torch.from_numpy(g.T.reshape(*rhs.shape[:-1], W)).to(rhs.device)
        return out


def _tails(m: Tensor, inv: Tensor, W: int) -> Tensor:
    """τ(j) = Σ_{t: m_t ≥ j} 1/m_t for j = 1..W+1 (m_t integral, ≤ W)."""
    per = torch.zeros(W + 2, dtype=torch.float64, device=m.device)
    per.index_add_(0, m.long(), inv)  # Σ 1/m_t over the rows with m_t = j
    tails = per.flip(0).cumsum(0).flip(0)
    return tails[1:]


def within_fit(rhs: Float[Tensor, "*batch lag"], within: Float[Tensor, " *batch"],
               layout: RowLayout, n: Float[Tensor, " *batch"] | int = 1
               ) -> tuple[Float[Tensor, " *batch"], Float[Tensor, "*batch lag"]]:
    """(R²_within, g) from r = S − u (summed over ``n`` sequences: one count, or one per
    fit) and SS_w: R² = (r·K⁺r / n) / SS_w (NaN where the rows hold no variation, SS_w ≤ 0)
    and g = K⁺r / n in the solver's gauge (a constant added to g is taken from the rows'
    constants: :func:`match_mean` sets it)."""
    g = layout.solve(rhs)
    n = torch.as_tensor(n, dtype=torch.float64, device=rhs.device)
    explained = (g * rhs).sum(-1) / n
    ok = within > 0
    r2 = torch.where(ok, explained / torch.where(ok, within, 1.0), float("nan"))
    return r2, g / n[..., None]


def within_r2(rhs: Float[Tensor, "*batch lag"], within: Float[Tensor, " *batch"],
              layout: RowLayout, n: Float[Tensor, " *batch"] | int = 1
              ) -> Float[Tensor, " *batch"]:
    """The R² of :func:`within_fit`."""
    return within_fit(rhs, within, layout, n)[0]


def match_mean(g: Float[Tensor, "*batch lag"], s1: Float[Tensor, "*batch lag"],
               layout: RowLayout, n: int) -> Float[Tensor, "*batch lag"]:
    """``g`` shifted so that its mean over the kept entries equals the raw logits' (Σ S /
    (n·Σ n(Δ))): the within-row kernel on the raw kernel's level, NaN at offsets no row
    keeps."""
    counts = layout.lag_counts(g.device)
    raw = s1.sum(-1) / (n * counts.sum())
    shift = raw - (g * counts).sum(-1) / counts.sum()
    return torch.where(counts > 0, g + shift[..., None], float("nan"))


__all__ = ["RowLayout", "match_mean", "within_fit", "within_r2"]

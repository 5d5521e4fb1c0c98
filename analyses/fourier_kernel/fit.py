"""The cosine-series fit of one kernel g(Δ): part (a) of
:mod:`poskernel_tl.analyses.fourier_kernel`, whose docstring describes the method.

:func:`fit_cosine_series` fits one g(Δ) (Δ = 1..T−1) and returns a :class:`CosineFit`;
``cosine_fit_table`` (in ``fourier_kernel``) runs the same steps for every head and K.
Both names are also importable from ``fourier_kernel``.
"""

import dataclasses
import math
from typing import Literal

import numpy as np
from jaxtyping import Float
from scipy.optimize import least_squares

from poskernel_tl.analyses.spectral.processing import n_fft_for, pick_peaks, spectrum

_FREQ_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class CosineFit:
    """g(Δ) ≈ offset + Σ_k amplitudes[k]·cos(freqs[k]·Δ + phases[k]); largest amplitude first.

    ``fitted`` is the model on ``lags`` (all of g's lags, Δ = 1..T−1); ``r2`` is computed
    over the fitted lags (Δ ≤ ``max_lag``)."""

    freqs: Float[np.ndarray, " component"]
    amplitudes: Float[np.ndarray, " component"]
    phases: Float[np.ndarray, " component"]
    offset: float
    r2: float
    fitted: Float[np.ndarray, " lag"]
    lags: Float[np.ndarray, " lag"]
    max_lag: int
    success: bool
    nfev: int

    @property
    def K(self) -> int:
        return len(self.freqs)

    def __call__(self, lags: Float[np.ndarray, " n"]) -> Float[np.ndarray, " n"]:
        """Evaluate the fitted series at arbitrary lags."""
        lags = np.asarray(lags, np.float64)
        arg = np.outer(lags, self.freqs) + self.phases
        return self.offset + np.cos(arg) @ self.amplitudes


def _design(lags: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Columns [1, cos(a_k Δ)…, sin(a_k Δ)…]."""
    arg = np.outer(lags, freqs)
    return np.concatenate([np.ones((len(lags), 1)), np.cos(arg), np.sin(arg)], axis=1)


def _joint_fit(g: np.ndarray, lags: np.ndarray, freqs0: np.ndarray, max_nfev: int,
               min_freq: float):
    """Least squares over [offset, a (K), u (K), w (K)] by variable projection: for given
    frequencies the rest is linear and solved exactly, so ``least_squares`` moves only the
    a_k (Kaufman's Jacobian: the orthogonal complement of the design's span applied to
    ∂(design·coef)/∂a_k). The optimum is the joint one; it avoids crawling along the
    amplitude–frequency valleys that a joint parametrisation has."""
    K = len(freqs0)
    freqs0 = np.clip(np.asarray(freqs0, np.float64), min_freq + _FREQ_EPS, math.pi - _FREQ_EPS)
    cache: dict = {}

    def solve(a):
        key = a.tobytes()
        if key not in cache:
            design = _design(lags, a)
            u_, s_, vt = np.linalg.svd(design, full_matrices=False)
            rank = int(np.sum(s_ > s_[0] * 1e-12))
            basis = u_[:, :rank]
            coef = vt[:rank].T @ ((basis.T @ g) / s_[:rank])  # minimum-norm least squares
            cache.clear()
            cache[key] = (design, coef, basis)
        return cache[key]

    if K == 0:
        coef = solve(freqs0)[1]
        return coef[0], freqs0, coef[1:1], coef[1:1], True, 0

    def residual(a):
        design, coef, _ = solve(a)
        return design @ coef - g

    def jacobian(a):
        design, coef, basis = solve(a)
        u, w = coef[1:1 + K], coef[1 + K:]
        d_a = lags[:, None] * (w * design[:, 1:1 + K] - u * design[:, 1 + K:])
        return d_a - basis @ (basis.T @ d_a)

    sol = least_squares(residual, freqs0, jac=jacobian, bounds=_windows(freqs0, min_freq),
                        method="trf", x_scale="jac", ftol=1e-10, xtol=1e-10, gtol=1e-10,
                        max_nfev=max_nfev)
    coef = solve(sol.x)[1]
    return coef[0], sol.x, coef[1:1 + K], coef[1 + K:], bool(sol.success), int(sol.nfev)


def _make_fit(g, lags, n_fit, off, a, u, w, success, nfev) -> CosineFit:
    amp = np.hypot(u, w)
    phase = np.arctan2(-w, u)  # u cos − … : c cos(aΔ + b) = c cos b cos aΔ − c sin b sin aΔ
    order = np.argsort(-amp, kind="stable")
    fit = CosineFit(freqs=np.asarray(a, np.float64)[order], amplitudes=amp[order],
                    phases=phase[order], offset=float(off), r2=float("nan"),
                    fitted=np.zeros(len(lags)), lags=lags, max_lag=n_fit, success=success,
                    nfev=nfev)
    fitted = fit(lags)
    resid = g[:n_fit] - fitted[:n_fit]
    ss_tot = float(np.sum((g[:n_fit] - g[:n_fit].mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    return dataclasses.replace(fit, fitted=fitted, r2=r2)


def _windows(freqs: np.ndarray, min_freq: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds that keep neighbouring frequencies ≥ ``min_freq`` (= π/window by default,
    half the Rayleigh resolution) apart: each a_k stays between the midpoints to its
    neighbours, shrunk by min_freq/2. Without them two cosines can merge into a
    near-collinear pair with huge opposite amplitudes."""
    order = np.argsort(freqs, kind="stable")
    f = freqs[order]
    mid = (f[1:] + f[:-1]) / 2
    lo = np.minimum(np.concatenate([[min_freq], mid + min_freq / 2]), f)
    hi = np.maximum(np.concatenate([mid - min_freq / 2, [math.pi]]), f)
    hi = np.maximum(hi, lo + 1e-12)
    out_lo, out_hi = np.empty_like(f), np.empty_like(f)
    out_lo[order], out_hi[order] = lo, hi
    return out_lo, out_hi


def _largest_peak(resid: np.ndarray, n_fft: int, taken: np.ndarray, gap: float) -> float:
    """ω of the largest bin (m ≥ 1) of the zero-padded, demeaned spectrum of ``resid``
    at least ``gap`` away from the frequencies already ``taken`` (if any bin is)."""
    mag = np.abs(np.fft.rfft(resid - resid.mean(), n=n_fft))[1:]
    omega = 2 * math.pi * np.arange(1, len(mag) + 1) / n_fft
    free = (np.abs(omega[:, None] - taken[None]) >= gap).all(1)
    return float(omega[np.argmax(np.where(free, mag, -1.0)) if free.any() else np.argmax(mag)])


def prepare_lags(g, max_lag):
    g = np.asarray(g, np.float64)
    if g.ndim != 1 or len(g) < 2:
        raise ValueError(f"g must be one kernel over lags Δ = 1..T−1; got shape {g.shape}")
    lags = np.arange(1, len(g) + 1, dtype=np.float64)
    n_fit = len(g) if max_lag is None else int(min(max(max_lag, 2), len(g)))
    return g, lags, n_fit


def residual_path(g, lags, n_fit, Ks, max_nfev, min_freq=None, start=None
                   ) -> dict[int, CosineFit]:
    """Fit at the ``start`` frequencies, then add the residual spectrum's largest peak one
    at a time (refitting jointly) up to max(Ks); the fit at each K in ``Ks``."""
    gf, lf = g[:n_fit], lags[:n_fit]
    n_fft = n_fft_for(n_fit + 1)
    freqs = np.zeros(0) if start is None else np.asarray(start, np.float64)
    min_freq = math.pi / n_fit if min_freq is None else float(min_freq)
    out, state = {}, _joint_fit(gf, lf, freqs, max_nfev, min_freq)
    for k in range(len(freqs), max(Ks) + 1):
        if k > len(freqs):
            off, a, u, w = state[:4]
            arg = np.outer(lf, a)
            resid = gf - (off + np.cos(arg) @ u + np.sin(arg) @ w)
            freqs_k = np.append(a, _largest_peak(resid, n_fft, a, 2 * min_freq))
            state = _joint_fit(gf, lf, freqs_k, max_nfev, min_freq)
        if k in Ks:
            out[k] = _make_fit(g, lags, n_fit, *state)
    return out


def _peak_freqs(g: np.ndarray, K: int) -> np.ndarray:
    """The K largest local maxima of g's zero-padded, demeaned spectrum (fewer if absent):
    the spectral analysis' raw-spectrum peaks, at least 2π/T apart."""
    T = len(g) + 1
    return pick_peaks(spectrum(g, T, raw_spectrum=True, demean=True), T, n_peaks=K,
                      raw_spectrum=True)[1]


def fit_cosine_series(
    g: Float[np.ndarray, " lag"],
    *,
    K: int = 3,
    init_freqs: Float[np.ndarray, " component"] | None = None,
    init: Literal["residual", "peaks"] = "residual",
    max_lag: int | None = None,
    min_freq: float | None = None,
    max_nfev: int = 100,
) -> CosineFit:
    """Fit g(Δ) (Δ = 1..len(g)) ≈ offset + Σ_{k ≤ K} c_k cos(a_k Δ + b_k).

    ``init_freqs`` (rad/token) overrides K and the spectral initialisation. ``init``:
    "residual" (peaks of the residual's spectrum, one at a time) or "peaks" (the K largest
    local maxima, ≥ 2π/T apart, of g's spectrum at once; they can be a larger cosine's
    sidelobes; the residual rule fills in if there are fewer). ``max_lag`` fits only
    Δ ≤ max_lag. Frequencies lie in [``min_freq``, π] and neighbours stay ≥ min_freq apart;
    the default π/max_lag (half a period over the window) keeps slow trends from becoming
    cosines of vanishing frequency and diverging amplitude. ``max_nfev`` caps evaluations
    per refit. Returns a :class:`CosineFit` (NaN-filled if g is not finite)."""
    g, lags, n_fit = prepare_lags(g, max_lag)
    if init not in ("residual", "peaks"):
        raise ValueError(f"init must be 'residual' or 'peaks', not {init!r}")
    if init_freqs is not None:
        init_freqs = np.asarray(init_freqs, np.float64).ravel()
        K = len(init_freqs)
    if not np.isfinite(g[:n_fit]).all():
        nan = np.full(K, np.nan)
        return CosineFit(freqs=nan, amplitudes=nan, phases=nan, offset=math.nan, r2=math.nan,
                         fitted=np.full(len(lags), np.nan), lags=lags, max_lag=n_fit,
                         success=False, nfev=0)
    if init_freqs is None and init == "peaks":
        init_freqs = _peak_freqs(g[:n_fit], K)
    return residual_path(g, lags, n_fit, (K,), max_nfev, min_freq, start=init_freqs)[K]

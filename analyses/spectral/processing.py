"""Processing of g(Δ) before and after the FFT: detrending, the taper, the zero-padded
spectrum, peak picking, the reference kernel and the log-power correlations. Array functions
only; :mod:`poskernel_tl.analyses.spectral` explains the choices and uses them.

g(Δ), Δ = 1..T−1, is zero-padded to N_fft = 4T, ĝ(ω_m) = FFT[m], ω_m = 2πm/N_fft. By default
the weighted least-squares quadratic in Δ is subtracted and the residual tapered by a
one-sided Hann window; ``raw_spectrum=True`` keeps the literal procedure (mean kept unless
``demean``, no taper, peaks on the grid).

**Two-sided g** (bidirectional models): g over signed lags Δ = −(T−1)..T−1 (2T − 1 values,
:func:`two_sided_for_spectrum`) is processed by the same functions with ``length`` =
:func:`span` = 2T: index j ↔ Δ = j + 1 − T, so the taper sin²(π(Δ + T)/2T) = cos²(πΔ/2T) is
the Hann window over the whole two-sided span, the quadratic trend is in Δ/T, N_fft = 8T
and the grid, the peak spacing and ω_min are in bins of 2π/2T (|ĝ| does not depend on
where Δ = 0 sits). Spectra of a two-sided g have 4T + 1 points.
"""

from functools import lru_cache

import numpy as np
from jaxtyping import Float
from scipy.signal import find_peaks

from poskernel_tl.analyses.spectral.null import PAD_FACTOR, local_background

N_PEAKS = 5
DETREND_DEGREE = 2
OMEGA_MIN_BINS = 4.0
PROMINENCE_REL = 0.05
LOG_POWER_FLOOR = 1e-6


def span(length: int, two_sided: bool = False) -> int:
    """The ``length`` the processing functions take for a condition of T = ``length``:
    T for g(Δ), Δ = 1..T−1; 2T for a two-sided g (2T − 1 signed lags)."""
    return 2 * length if two_sided else length


def signed_lags(length: int, two_sided: bool = False) -> Float[np.ndarray, " lag"]:
    """The lags g is given at: 1..T−1, or −(T−1)..T−1 for a two-sided g."""
    lo = -(length - 1) if two_sided else 1
    return np.arange(lo, length, dtype=np.float64)


def two_sided_for_spectrum(forward: Float[np.ndarray, "*batch lag"],
                           back: Float[np.ndarray, "*batch lag"]
                           ) -> Float[np.ndarray, "*batch signed_lag"]:
    """g over Δ = −(T−1)..T−1 from ``forward`` (Δ = 1..T−1) and ``back`` (index j ↔
    Δ = −(j+1)), Δ = 0 set to the mean of g(1) and g(−1): the diagonal, where a token meets
    itself, is no shift-invariant value and its spike would spread over every frequency."""
    forward, back = np.asarray(forward, np.float64), np.asarray(back, np.float64)
    mid = 0.5 * (forward[..., 0] + back[..., 0])
    return np.concatenate([back[..., ::-1], mid[..., None], forward], -1)


def n_fft_for(length: int) -> int:
    return PAD_FACTOR * length


def frequency_grid(length: int) -> Float[np.ndarray, " freq"]:
    """ω_m = 2πm/N_fft for m = 0..N_fft/2 (radians per token)."""
    n_fft = n_fft_for(length)
    return 2 * np.pi * np.arange(n_fft // 2 + 1) / n_fft


def lag_window(length: int) -> Float[np.ndarray, " lag"]:
    """One-sided Hann taper over the lags: w(Δ) = sin²(πΔ/T), Δ = 1..T−1."""
    return np.sin(np.pi * np.arange(1, length) / length) ** 2


@lru_cache(maxsize=16)
def _trend_factors(length: int, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """(A [lag, degree + 1], B [degree + 1, lag]) with (g @ A) @ B the weighted
    least-squares polynomial trend of g (weights = the taper), cached per (T, degree): the
    projection A·B kept as its two factors, O(T·degree) in time and memory (as one
    [lag, lag] matrix it held 8.6 GB at T = 32,768)."""
    w = lag_window(length)
    x = (np.arange(1, length) - length / 2) / (length / 2)
    vander = np.vander(x, degree + 1)
    fit = np.linalg.pinv(vander * np.sqrt(w)[:, None])  # [degree + 1, lag]
    a, b = (fit * np.sqrt(w)[None]).T, np.ascontiguousarray(vander.T)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


def prepare(
    g: Float[np.ndarray, "*batch lag"], length: int, *, raw_spectrum: bool = False,
    demean: bool = False, detrend_degree: int = DETREND_DEGREE,
) -> Float[np.ndarray, "*batch lag"]:
    """What is Fourier-transformed: w·(g − weighted LS polynomial trend) by default; g as
    given (minus its mean with ``demean``) with ``raw_spectrum``."""
    g = np.asarray(g, dtype=np.float64)
    if g.shape[-1] != length - 1:
        raise ValueError(f"g has {g.shape[-1]} lags; expected T−1 = {length - 1}")
    if raw_spectrum:
        return g - g.mean(-1, keepdims=True) if demean else g
    w = lag_window(length)
    a, b = _trend_factors(length, detrend_degree)
    resid = g - (g @ a) @ b
    tiny = np.linalg.norm(resid, axis=-1, keepdims=True) <= 1e-9 * np.linalg.norm(
        g, axis=-1, keepdims=True)
    return np.where(tiny, 0.0, resid) * w


def spectrum(
    g: Float[np.ndarray, "*batch lag"], length: int, *, raw_spectrum: bool = False,
    demean: bool = False, detrend_degree: int = DETREND_DEGREE,
) -> Float[np.ndarray, "*batch freq"]:
    """|ĝ(ω_m)| of :func:`prepare`'s output, zero-padded to N_fft = 4T, on
    :func:`frequency_grid` (g(1) sits at index 0; |ĝ| does not depend on that offset)."""
    h = prepare(g, length, raw_spectrum=raw_spectrum, demean=demean,
                detrend_degree=detrend_degree)
    return np.abs(np.fft.rfft(h, n=n_fft_for(length), axis=-1))


def pick_peaks(
    mag: Float[np.ndarray, " freq"], length: int, *, n_peaks: int = N_PEAKS,
    raw_spectrum: bool = False, omega_min: float | None = None,
) -> tuple[np.ndarray, Float[np.ndarray, " peak"], Float[np.ndarray, " peak"]]:
    """(grid index, ω, |ĝ| at ω) of the ``n_peaks`` largest peaks, largest first; ω and |ĝ|
    interpolated (default) or on the grid (``raw_spectrum``). See the module docstring."""
    mag = np.asarray(mag, np.float64)
    n_fft = n_fft_for(length)
    omega = frequency_grid(length)
    empty = (np.zeros(0, int), np.zeros(0), np.zeros(0))
    if raw_spectrum:
        idx, _ = find_peaks(mag, distance=n_fft // length)
        idx = idx[np.argsort(-mag[idx], kind="stable")[:n_peaks]]
        return idx, omega[idx], mag[idx]
    lo = OMEGA_MIN_BINS * 2 * np.pi / length if omega_min is None else omega_min
    above = omega >= lo
    if not above.any() or mag[above].max() <= 0:
        return empty
    floor = PROMINENCE_REL * mag[above].max()  # a peak's prominence never exceeds its height
    idx, _ = find_peaks(mag, height=floor, distance=n_fft // length, prominence=floor)
    idx = idx[omega[idx] >= lo]
    idx = idx[np.argsort(-mag[idx], kind="stable")[:n_peaks]]
    if len(idx) == 0:
        return empty
    a, b, c = (np.log(np.maximum(mag[idx + k], 1e-300)) for k in (-1, 0, 1))
    curv = a - 2 * b + c
    off = np.where(curv < 0, 0.5 * (a - c) / np.where(curv < 0, curv, -1.0), 0.0)
    off = np.clip(off, -0.5, 0.5)
    return idx, 2 * np.pi * (idx + off) / n_fft, np.exp(b - 0.25 * (a - c) * off)


def reference_kernel(
    thetas: Float[np.ndarray, " pair"], length: int,
    usage: Float[np.ndarray, " pair"] | None = None, two_sided: bool = False,
) -> Float[np.ndarray, " lag"]:
    """Σ_i w_i cos(θ_i Δ) for Δ = 1..T−1 (``two_sided``: Δ = −(T−1)..T−1); w = ``usage``
    (equal weights when None)."""
    thetas = np.asarray(thetas, np.float64)
    w = np.ones(len(thetas)) if usage is None else np.asarray(usage, np.float64)
    return np.cos(np.outer(signed_lags(length, two_sided), thetas)) @ w


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def log_power(power: Float[np.ndarray, " freq"], length: int, *, relative: bool = False
              ) -> Float[np.ndarray, " freq"]:
    """ln power floored at 10⁻⁶ of its maximum; ``relative`` subtracts the ln of the
    :func:`local_background` (what is left is peak shape, not spectral slope)."""
    power = np.asarray(power, np.float64)
    floor = LOG_POWER_FLOOR * max(float(power.max()), 1e-300)
    out = np.log(power + floor)
    return out - np.log(local_background(power, length) + floor) if relative else out


def log_power_r(p: np.ndarray, q: np.ndarray, length: int, keep: np.ndarray, *,
                relative: bool = False) -> float:
    """Pearson's r of :func:`log_power` of two power spectra over the grid points ``keep``."""
    if np.asarray(p).max() <= 0 or np.asarray(q).max() <= 0:
        return float("nan")
    return pearson(log_power(p, length, relative=relative)[keep],
                   log_power(q, length, relative=relative)[keep])


__all__ = ["DETREND_DEGREE", "LOG_POWER_FLOOR", "N_PEAKS", "OMEGA_MIN_BINS", "PROMINENCE_REL",
           "frequency_grid", "lag_window", "log_power", "log_power_r", "n_fft_for", "pearson",
           "pick_peaks", "prepare", "reference_kernel", "signed_lags", "span", "spectrum",
           "two_sided_for_spectrum"]

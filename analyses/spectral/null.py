"""Judging spectral peaks: which count as evidence, what they match, and the null.

**Significance** (:func:`peak_significance`): power > 10× the running median power over ±8
bins (:func:`local_background`) and magnitude > 5× the side-lobe bound of the rest of the
spectrum (:func:`leakage_bound`: max_j |ĝ(ω_j)|·E(D_j), E the window's side-lobe envelope at
D_j bins: Hann 1/(πD(D² − 1)) for D ≥ 2, rectangular 1/(πD) for D ≥ 1).

**The seed's criterion** (:func:`criterion`, :func:`match_peaks`): a peak ω matches θ_i iff
|ω − θ_i|/θ_i < τ_rel (0.10) or |ω − θ_i| < 2π/N_fft. Adjacent rotary frequencies are
base^(2/d_head) apart (1.155× for base 10⁴, d_head 128; 1.43× for base 10⁵, d_head 64), so a
±10% window around every θ_i covers most frequencies: the binary "matched" is met by chance
for most peaks and cannot be significant by itself. It is reported as the seed defines it.

**The statistic that decides** (:func:`alignment_statistic`): for each significant peak the
distance in log-frequency to the nearest θ_i, d_k = min_i |ln ω_k − ln θ_i|, floored by the
precision a peak position can have, δ_k = ε·(2π/T)/ω_k (ε = 0.05 of a DFT bin, turned into
log units at that peak), and averaged as S = mean_k ln(d_k + δ_k). S is small when peaks sit
on rotary frequencies; the floor keeps one peak that lands on a θ_i by luck from deciding.

**The null** (:func:`rotation_null`): the same observed peaks, the θ set rescaled by random
factors e^u, u uniform on [−s/2, s/2), where s is the median spacing of ln θ_i near the peaks
(for plain RoPE the θ_i are evenly spaced in ln θ, so this is exactly a uniformly random
placement of the θ grid relative to the peaks; rescaling only by up to half a spacing keeps
the local structure of non-uniform sets such as Llama-3 scaling). The draws are stratified
(one per 1/n_null of the range, seeded jitter). Per head, nothing from other heads enters:

- ``p_value`` = (1 + #{null S ≤ observed S}) / (1 + n_null);
- ``chance`` = the mean fraction of the top peaks that meet the pre-registered criterion
  under the null: the criterion's chance level for these very peaks;
- ``fpr`` = the test's false-positive rate for these peaks: how often a draw of the null,
  taken as the observed statistic, would be called aligned (≈ ``alpha`` for a head with
  significant peaks, 0 for one without: such a head is never called aligned).

The null is evaluated in log-frequency without forming [draw, peak, pair] arrays
(:func:`shifted_log_distance`, :func:`criterion_hits`), so a head costs about a millisecond.
"""

import numpy as np
from jaxtyping import Bool, Float
from scipy.ndimage import median_filter

PAD_FACTOR = 4  # N_fft = 4T
SIG_FACTOR = 10.0
LEAK_FACTOR = 5.0
FLOOR_HALF_WIDTH_BINS = 8
TAU_REL = 0.10
MARGINAL_REL = 0.05
PRECISION_BINS = 0.05
N_NULL = 2000
ALPHA = 0.05


def local_background(power: Float[np.ndarray, " freq"], length: int
                     ) -> Float[np.ndarray, " freq"]:
    """Running median of the power over ±8 DFT bins (mirrored at ω = 0 and π)."""
    size = 2 * FLOOR_HALF_WIDTH_BINS * PAD_FACTOR + 1
    return median_filter(np.asarray(power, np.float64), size=size, mode="mirror")


def leakage_bound(mag: Float[np.ndarray, " freq"], omega: Float[np.ndarray, " peak"],
                  length: int, raw_spectrum: bool = False) -> Float[np.ndarray, " peak"]:
    """The most that side lobes of the rest of the spectrum can put at each ω: max_j |ĝ(ω_j)|
    E(D_j), D_j = |ω − ω_j| in DFT bins, E the side-lobe envelope of the window (Hann:
    1/(πD(D² − 1)) beyond its main lobe, D ≥ 2; rectangular: 1/(πD), D ≥ 1)."""
    grid = np.arange(len(mag)) / PAD_FACTOR  # ω_m in DFT bins (2π/T)
    d = np.abs(np.asarray(omega, np.float64)[:, None] / (2 * np.pi / length) - grid[None])
    if raw_spectrum:
        env = np.where(d >= 1, 1 / (np.pi * np.maximum(d, 1)), 0.0)
    else:
        env = np.where(d >= 2, 1 / (np.pi * np.maximum(d, 2) * (np.maximum(d, 2) ** 2 - 1)), 0.0)
    return (np.asarray(mag, np.float64)[None] * env).max(1) if d.size else np.zeros(0)


def peak_significance(
    mag: Float[np.ndarray, " freq"], idx: np.ndarray, omega: Float[np.ndarray, " peak"],
    peak_mag: Float[np.ndarray, " peak"], length: int, raw_spectrum: bool = False,
) -> Bool[np.ndarray, " peak"]:
    """A peak (grid index ``idx``, refined ``omega`` and ``peak_mag``) is significant if its
    power exceeds 10× its :func:`local_background` and its magnitude 5× the
    :func:`leakage_bound` of the rest of the spectrum."""
    power = np.asarray(mag, np.float64) ** 2
    return (peak_mag ** 2 >= SIG_FACTOR * local_background(power, length)[idx]) & (
        peak_mag >= LEAK_FACTOR * leakage_bound(mag, omega, length, raw_spectrum))


def criterion(
    omega: Float[np.ndarray, " peak"], thetas: Float[np.ndarray, " pair"], n_fft: int,
    tau_rel: float = TAU_REL,
) -> tuple[Float[np.ndarray, "peak pair"], Bool[np.ndarray, "peak pair"]]:
    """(relative error, matched) for every (ω, θ_i) pair under the seed's criterion."""
    omega, thetas = np.asarray(omega, np.float64), np.asarray(thetas, np.float64)
    diff = np.abs(omega[:, None] - thetas[None])
    rel = diff / thetas[None]
    return rel, (rel < tau_rel) | (diff < 2 * np.pi / n_fft)


def match_peaks(
    omega: Float[np.ndarray, " peak"], thetas: Float[np.ndarray, " pair"], n_fft: int,
    tau_rel: float = TAU_REL,
) -> dict[str, np.ndarray]:
    """Per peak: nearest θ (by relative error, among matching θ when any match), its index,
    the relative error, matched, and marginal (matched with relative error > 0.05)."""
    rel, ok = criterion(omega, thetas, n_fft, tau_rel)
    matched = ok.any(1)
    index = np.where(matched[:, None] & ~ok, np.inf, rel).argmin(1)
    rel_error = rel[np.arange(len(rel)), index]
    return {"nearest_theta": np.asarray(thetas)[index], "theta_index": index,
            "rel_error": rel_error, "matched": matched,
            "marginal": matched & (rel_error > MARGINAL_REL)}


def log_distance(
    omega: Float[np.ndarray, " peak"], thetas: Float[np.ndarray, "*draw pair"]
) -> Float[np.ndarray, "*draw peak"]:
    """min_i |ln ω_k − ln θ_i| for each peak (and each null draw when θ has a draw axis)."""
    lw = np.log(np.asarray(omega, np.float64))
    lt = np.log(np.asarray(thetas, np.float64))
    return np.abs(lw[..., :, None] - lt[..., None, :]).min(-1)


def precision_floor(
    omega: Float[np.ndarray, " peak"], length: int, precision_bins: float = PRECISION_BINS
) -> Float[np.ndarray, " peak"]:
    """δ_k = ε·(2π/T)/ω_k: ε of a DFT bin expressed in log-frequency at each peak."""
    return precision_bins * (2 * np.pi / length) / np.asarray(omega, np.float64)


def alignment_statistic(
    omega: Float[np.ndarray, " peak"], thetas: Float[np.ndarray, "*draw pair"],
    floor: Float[np.ndarray, " peak"],
) -> Float[np.ndarray, "*draw"]:
    """S = mean_k ln(d_k + δ_k) (small = peaks on rotary frequencies)."""
    return np.asarray(np.log(log_distance(omega, thetas) + floor).mean(-1))


def local_log_spacing(
    thetas: Float[np.ndarray, " pair"], omega: Float[np.ndarray, " peak"], margin: float = 0.5
) -> float:
    """Median spacing of the sorted ln θ_i whose midpoints lie within ``margin`` (in ln units)
    of the peaks' range; the median over all spacings when none does."""
    lt = np.sort(np.log(np.asarray(thetas, np.float64)))
    if len(lt) < 2:
        return float(np.log(2.0))
    gaps, mid = np.diff(lt), 0.5 * (lt[1:] + lt[:-1])
    lw = np.log(np.asarray(omega, np.float64))
    near = (mid >= lw.min() - margin) & (mid <= lw.max() + margin) & (gaps > 0)
    chosen = gaps[near] if near.any() else gaps[gaps > 0]
    return float(np.median(chosen)) if len(chosen) else float(np.log(2.0))


def null_factors(spacing: float, n_null: int = N_NULL, seed: int = 0
                 ) -> Float[np.ndarray, " draw"]:
    """e^u for u stratified-uniform on [−s/2, s/2): one seeded draw per 1/n_null of the range."""
    jitter = np.random.default_rng(seed).random(n_null)
    return np.exp(((np.arange(n_null) + jitter) / n_null - 0.5) * spacing)


def shifted_log_distance(
    lw: Float[np.ndarray, " peak"], lt_sorted: Float[np.ndarray, " pair"],
    u: Float[np.ndarray, " draw"],
) -> Float[np.ndarray, "draw peak"]:
    """min_i |ln ω_k − (ln θ_i + u_j)| for every draw j: :func:`log_distance` against the
    θ set rescaled by e^u, by binary search in the sorted ln θ (no [draw, peak, pair] array)."""
    x = np.asarray(lw, np.float64)[None, :] - np.asarray(u, np.float64)[:, None]
    idx = np.searchsorted(lt_sorted, x)
    below = lt_sorted[np.clip(idx - 1, 0, len(lt_sorted) - 1)]
    above = lt_sorted[np.clip(idx, 0, len(lt_sorted) - 1)]
    return np.minimum(np.abs(x - below), np.abs(x - above))


def criterion_hits(
    omega: Float[np.ndarray, " peak"], thetas: Float[np.ndarray, " pair"],
    u: Float[np.ndarray, " draw"], n_fft: int, tau_rel: float = TAU_REL,
) -> Bool[np.ndarray, "draw peak"]:
    """Whether each peak meets the criterion against the θ set rescaled by e^{u_j} (``u``
    sorted ascending). For one (ω, θ_i) the matching u form one open interval (the ±τ window
    and the one-bin floor both contain u = ln(ω/θ_i)), so the draws inside are found by
    binary search and the union over i by a running count."""
    omega, thetas = np.asarray(omega, np.float64), np.asarray(thetas, np.float64)
    centre = np.log(omega)[:, None] - np.log(thetas)[None]
    bin_ = 2 * np.pi / n_fft
    floor_lo = np.log(np.maximum(omega - bin_, 1e-300))[:, None] - np.log(thetas)[None]
    floor_lo = np.where((omega > bin_)[:, None], floor_lo, -np.inf)
    floor_hi = np.log(omega + bin_)[:, None] - np.log(thetas)[None]
    lo = np.minimum(centre - np.log1p(tau_rel), floor_lo)
    hi = np.maximum(centre - np.log1p(-tau_rel), floor_hi)
    start = np.searchsorted(u, lo, side="right")
    end = np.searchsorted(u, hi, side="left")
    n, k = len(u), len(omega)
    count = np.zeros((k, n + 1), np.int64)
    rows = np.broadcast_to(np.arange(k)[:, None], start.shape)
    keep = start < end
    np.add.at(count, (rows[keep], start[keep]), 1)
    np.add.at(count, (rows[keep], end[keep]), -1)
    return (np.cumsum(count, axis=1)[:, :n] > 0).T


def false_positive_rate(null: Float[np.ndarray, " draw"], alpha: float = ALPHA) -> float:
    """The test's false-positive rate for one head: the share of its own null draws that
    would be called aligned (p < ``alpha``) if each were the observed statistic, judged
    against the other draws. The peaks stay the head's own; only where the rotary
    frequencies sit is random. NaN without a null (no significant peak: the head cannot be
    called aligned, so its rate is 0 — see :func:`rotation_null`)."""
    null = np.sort(np.asarray(null, np.float64))
    n = len(null)
    if n < 2:
        return float("nan")
    below = np.searchsorted(null, null, side="right") - 1  # other draws ≤ this one
    return float(np.mean((1 + below) / n < alpha))


def rotation_null(
    omega: Float[np.ndarray, " peak"],
    significant: Bool[np.ndarray, " peak"],
    thetas: Float[np.ndarray, " pair"],
    length: int,
    n_fft: int,
    *,
    tau_rel: float = TAU_REL,
    n_null: int = N_NULL,
    seed: int = 0,
    precision_bins: float = PRECISION_BINS,
    alpha: float = ALPHA,
) -> dict[str, float | np.ndarray]:
    """Chance level of the criterion and the p-value of S for one head's peaks.

    ``omega``: the head's top peaks (all of them enter ``chance``); ``significant``: which
    of them enter the statistic. Returns ``chance``, ``p_value``, ``statistic`` (S),
    ``log_dist_gmean`` (e^S, a typical floored log-distance), ``spacing`` (s), ``null``
    (S under each draw; empty without significant peaks) and ``fpr``
    (:func:`false_positive_rate`; 0 without significant peaks)."""
    omega = np.asarray(omega, np.float64)
    thetas = np.asarray(thetas, np.float64)
    nan = float("nan")
    if len(omega) == 0 or len(thetas) == 0:
        return {"chance": nan, "p_value": nan, "statistic": nan, "log_dist_gmean": nan,
                "spacing": nan, "null": np.zeros(0), "fpr": 0.0 if len(thetas) else nan}
    sig = np.asarray(significant, bool)
    spacing = local_log_spacing(thetas, omega[sig] if sig.any() else omega)
    u = np.log(null_factors(spacing, n_null, seed))
    hit = criterion_hits(omega, thetas, u, n_fft, tau_rel)
    out = {"chance": float(hit.mean()), "p_value": nan, "statistic": nan,
           "log_dist_gmean": nan, "spacing": spacing, "null": np.zeros(0), "fpr": 0.0}
    if sig.any():
        floor = precision_floor(omega[sig], length, precision_bins)
        lt = np.sort(np.log(thetas))
        lw = np.log(omega[sig])
        observed = float(np.log(shifted_log_distance(lw, lt, np.zeros(1)) + floor).mean())
        null = np.log(shifted_log_distance(lw, lt, u) + floor).mean(-1)
        out.update(statistic=observed, log_dist_gmean=float(np.exp(observed)), null=null,
                   p_value=float((1 + np.sum(null <= observed)) / (1 + n_null)),
                   fpr=false_positive_rate(null, alpha))
    return out

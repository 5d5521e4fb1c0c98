"""What kind of positional kernel a head implements: descriptors of its pooled g(Δ), its
sink column and its permutation null, and one class per head.

Everything is read from Track A's pooled fit of a condition (no forward pass):

- ``g_ns(Δ)``: the pooled g without the key column s = 0, (g·n − g_sink)/(n − 1) with n(Δ)
  the entries per sequence (exact: g and the sink column's mean are both pooled means);
- the **kernel's rows**: query row t attends key 0 with the sink column's mean logit and
  key s ≥ 1 with g_ns(t − s) (a bidirectional model also keys s > t with g_back(s − t); the
  diagonal, never fitted, is left out; a window removes keys past its last offset). From
  their softmax, averaged over rows t = 1..T−1: ``prev_share`` (the mass on key t − 1, key
  0 itself at t = 1) and ``sink_share`` (the mass on key 0 at t ≥ 2);
- on the offsets with at least half the entries of Δ = 1 (Δ ≤ ⌈last/2⌉, where g is well
  measured): ``peak_lag`` and ``peak_margin`` (g_ns at its peak less the next best
  offset's); ``width`` (the offsets Δ ≤ width hold half the softmax mass exp(g_ns) alone
  gives); ``decay_slope`` and ``decay_r2`` (the least-squares line of g_ns against ln Δ,
  weighted by n(Δ), and its R²); ``periodic_share``, ``periodic_freq`` (the strongest
  Fourier component of g_ns less that line, with ≥ 2 cycles over the offsets: its share
  of g_ns's variance, rad/token) and ``periodic_theta`` (the nearest rotary θ_i where it
  lies within one frequency bin, else NaN);
- ``null_max``: the largest pooled R² of the head's permutation null (NaN without one).

The class, first rule that holds (:data:`THRESHOLDS`): ``content`` — R² ≤ null_max (R² <
0.05 without a null); ``previous-token`` — peak at Δ = 1 and prev_share ≥ 0.5 (half the
row's mass); ``sink`` — sink_share ≥ 0.5; ``local`` — width ≤ max(2, last/16), half
the mass in a sixteenth of the offsets (a flat kernel's width is ≈ last/4);
``periodic`` — periodic_share ≥ 0.25; ``decay`` — decay_slope < 0 and decay_r2 ≥ 0.5;
else ``other`` (positional beyond its null, none of these shapes).
"""

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.fit.counts import layer_lag_counts

THRESHOLDS = {"content_r2_without_null": 0.05, "prev_share": 0.5, "sink_share": 0.5,
              "local_width_fraction": 1 / 16, "periodic_share": 0.25, "decay_r2": 0.5}
CLASSES = ("content", "previous-token", "sink", "local", "periodic", "decay", "other")
# the per-head table's descriptor columns a head view shows, with their labels
DESCRIPTORS = {"R2_pooled": "Track A R² (pooled)", "null_max": "R² of the null (max)",
               "prev_share": "previous-token share", "sink_share": "sink share",
               "peak_lag": "peak lag Δ", "peak_margin": "peak margin",
               "width": "local width (offsets)", "decay_slope": "decay slope over ln Δ",
               "decay_r2": "decay R²", "periodic_share": "periodic share",
               "periodic_theta": "matched θᵢ (rad/token)"}


def _logcum(x: np.ndarray) -> np.ndarray:
    """Running log Σ exp along the last axis (−inf where nothing is summed yet)."""
    return np.logaddexp.accumulate(np.where(np.isfinite(x), x, -np.inf), axis=-1)


def row_shares(g_ns: Float[np.ndarray, "*head lag"], g_sink: Float[np.ndarray, "*head lag"],
               g_back: Float[np.ndarray, "*head lag"] | None = None
               ) -> tuple[Float[np.ndarray, "*head"], Float[np.ndarray, "*head"]]:
    """Mean over query rows t = 1..T−1 of the kernel's softmax mass on key t − 1 and on key
    0 (see the module docstring); NaN (a window's far offsets) counts as no key."""
    T = g_ns.shape[-1] + 1
    neg = np.full(g_ns.shape[:-1] + (1,), -np.inf)
    # keys s = 1..t−1 of row t are the offsets 1..t−1: rest[t] = log Σ_{Δ<t} exp g_ns(Δ)
    rest = np.concatenate([neg, _logcum(g_ns[..., :-1])], -1)  # rows t = 1..T−1
    sink = np.where(np.isfinite(g_sink), g_sink, -np.inf)  # key 0 of row t sits at Δ = t
    z = np.logaddexp(rest, sink)
    if g_back is not None:  # keys after the query: row t has offsets −1..−(T−1−t)
        after = np.concatenate([_logcum(g_back)[..., ::-1][..., 1:], neg], -1)
        z = np.logaddexp(z, after)
    first = g_ns[..., :1]
    prev = np.where(np.arange(1, T) == 1, sink, first) - z
    share = lambda logp: np.nanmean(np.exp(logp), -1)
    return share(prev), share((sink - z)[..., 1:])


def shape_descriptors(g_ns: Float[np.ndarray, " lag"], counts: Float[np.ndarray, " lag"],
                      thetas: np.ndarray | None) -> dict[str, float | int]:
    """Peak, width, decay and periodicity of one head's g_ns on its well-measured offsets."""
    last = int(np.flatnonzero(np.isfinite(g_ns) & (counts > 1))[-1]) + 1 if \
        np.isfinite(g_ns).any() else 0
    m = max(2, -(-last // 2))
    g, n = g_ns[:m], counts[:m].astype(np.float64)
    lags = np.arange(1, m + 1, dtype=np.float64)
    order = np.argsort(g)[::-1]
    p = np.exp(g - g.max())
    width = int(np.searchsorted(np.cumsum(p) / p.sum(), 0.5) + 1)
    X = np.stack([np.ones(m), np.log(lags)], 1) * np.sqrt(n)[:, None]
    coef = np.linalg.lstsq(X, g * np.sqrt(n), rcond=None)[0]
    fit = coef[0] + coef[1] * np.log(lags)
    mean = (n * g).sum() / n.sum()
    var = (n * (g - mean) ** 2).sum()
    power = np.abs(np.fft.rfft(g - fit)) ** 2
    total = (np.abs(np.fft.rfft(g - g.mean())) ** 2)[1:].sum()
    k = 2 + int(np.argmax(power[2:])) if len(power) > 2 else 0
    freq = 2 * np.pi * k / m
    theta = np.nan
    if thetas is not None and k and len(thetas):
        near = thetas[np.argmin(np.abs(thetas - freq))]
        theta = float(near) if abs(near - freq) <= 2 * np.pi / m else np.nan
    return dict(last_lag=last, peak_lag=int(order[0] + 1),
                peak_margin=float(g[order[0]] - g[order[1]]), width=width,
                decay_slope=float(coef[1]),
                decay_r2=float(1 - (n * (g - fit) ** 2).sum() / var) if var > 0 else np.nan,
                periodic_share=float(power[k] / total) if k and total > 0 else 0.0,
                periodic_freq=float(freq) if k else np.nan, periodic_theta=theta)


def kernel_class(d: dict, r2: float) -> str:
    """The first class of :data:`CLASSES` whose rule (module docstring) holds."""
    t = THRESHOLDS
    null = d["null_max"]
    if (r2 <= null) if np.isfinite(null) else (not r2 >= t["content_r2_without_null"]):
        return "content"
    if d["peak_lag"] == 1 and d["prev_share"] >= t["prev_share"]:
        return "previous-token"
    if d["sink_share"] >= t["sink_share"]:
        return "sink"
    if d["width"] <= max(2, d["last_lag"] * t["local_width_fraction"]):
        return "local"
    if d["periodic_share"] >= t["periodic_share"]:
        return "periodic"
    if d["decay_slope"] < 0 and d["decay_r2"] >= t["decay_r2"]:
        return "decay"
    return "other"


def head_kernels(g: Float[np.ndarray, "layer head_index lag"],
                 g_sink: Float[np.ndarray, "layer head_index lag"],
                 counts: Float[np.ndarray, "layer lag"],
                 r2: Float[np.ndarray, "layer head_index"],
                 null: Float[np.ndarray, "perm layer head_index"] | None = None,
                 g_back: Float[np.ndarray, "layer head_index lag"] | None = None,
                 thetas: np.ndarray | None = None) -> pd.DataFrame:
    """One row per (layer, head): the descriptors and ``kernel_class``. ``counts``: n(Δ)
    of one sequence per layer (0 past a window); ``g`` the pooled g with the sink."""
    n = np.asarray(counts, np.float64)[:, None]
    g_ns = np.where(n > 1, (g * n - g_sink) / np.maximum(n - 1, 1), np.nan)
    prev, sink = row_shares(g_ns, g_sink, g_back)
    rows = []
    for L in range(g.shape[0]):
        for h in range(g.shape[1]):
            d = dict(layer=L, head=h, R2_pooled=float(r2[L, h]),
                     null_max=float(null[:, L, h].max()) if null is not None else np.nan,
                     prev_share=float(prev[L, h]), sink_share=float(sink[L, h]),
                     **shape_descriptors(g_ns[L, h], n[L, 0], thetas))
            d["kernel_class"] = kernel_class(d, d["R2_pooled"])
            rows.append(d)
    return pd.DataFrame(rows)


def condition_kernels(r) -> pd.DataFrame | None:
    """:func:`head_kernels` of a :class:`~poskernel_tl.measurement.result.ConditionResult`, with its
    condition's columns first; None for a result saved without the sink column's mean."""
    if r.g_sink is None:
        return None
    counts = layer_lag_counts(r.geometry.masks)[:, 0].numpy()
    df = head_kernels(np.asarray(r.g_pooled, np.float64), np.asarray(r.g_sink, np.float64),
                      counts, r.r2_pooled, r.r2_perm_null, r.g_pooled_back, r.thetas)
    for i, (name, value) in enumerate((("model", r.model), ("dataset", r.dataset),
                                       ("length", r.length))):
        df.insert(i, name, value)
    return df

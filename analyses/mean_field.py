"""Mean-field kernel: does a head's positional kernel live in its mean query and key?

With μ_q(t), μ_k(s) the per-position centering means of the post-rotary queries and keys
(``result.mean_q`` / ``result.mean_k``; query head h reads kv head h // (n_heads /
n_kv_heads)) and s the model's logit scale, the raw averaged Gram matrix of the
evaluation sequences splits exactly into three parts,

    Ḡ = mean_x q_x k_xᵀ·s = M + X + C,
    M = μ_q μ_kᵀ·s                                   (mean field: content-free),
    C = mean_x (q_x − μ_q)(k_x − μ_k)ᵀ·s             (the centered Gram of Track B),
    X = (μ_q (k̄ − μ_k)ᵀ + (q̄ − μ_q) μ_kᵀ)·s          (cross: the rest),

with q̄, k̄ the evaluation means (X vanishes when the evaluation and centering means
coincide; it measures how much the two sets' means differ, seen through the other side's
mean). Per head the analysis reports the Toeplitz R² of M (``R2_meanfield``, the fit of
:func:`poskernel_tl.shift_invariance_r2`), its g(Δ) and spectrum (|rfft| of the demeaned
g(Δ), zero-padded to 4T; frequencies in rad/token), and the variance shares of the three
parts in Ḡ on the strictly lower triangle's entries the layer's softmax keeps (those every
fit reads: a sliding window's band, a binding chunk's blocks; its
:class:`~poskernel_tl.mask.Mask`; a windowed layer's spectrum is that of its kept
offsets, interpolated onto the grid of T),

    share_P = ⟨P − p̄, Ḡ − ḡ⟩_F / ‖Ḡ − ḡ‖²_F,   P ∈ {M, X, C},

p̄, ḡ the means over those entries. The three shares sum to 1 exactly; each is
the part's projection on the raw Gram's variation (what a regression of Ḡ on the part
would attribute to it), so a share can be negative or exceed 1 when parts cancel.
``share_*_ss`` are the same without demeaning (fractions of ⟨Ḡ, Ḡ⟩_F).

Two routes to the parts. ``source="pass"`` (the exact one, used by the command line) runs
the evaluation sequences once through :func:`poskernel_tl.measurement.measure.forward_pass` with
:class:`MeanFieldReducer`, accumulating Σ_x (q_x − μ_q)(k_x − μ_k)ᵀ and Σ_x q_x, Σ_x k_x
in float64 (cost: one q·kᵀ per head and sequence on top of the forward; memory
L·H·T²·8 bytes, 141 MB for SmolLM2 at T = 256), so Ḡ = M + X + C holds to float64
rounding. ``source="result"`` uses the saved ``result.gram_raw`` and
``result.gram_centered`` (kept for T ≤ 256, float32) with X = Ḡ − M − C, so X also
absorbs their float32 rounding. A condition without centering means (random tokens) has
no mean field: its rows are NaN, with a note.
"""

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.spectral.processing import frequency_grid
from poskernel_tl.analyses.spectral.processing import spectrum as spectral_spectrum
from poskernel_tl.data.inputs import as_tokens, check_tokens
from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.mask import Mask
from poskernel_tl.measurement.measure import forward_pass
from poskernel_tl.plan.config import option
from poskernel_tl.schema import head_index_columns

PARTS = ("meanfield", "cross", "centered")
NO_MEANS = ("no centering means (uncentered condition, e.g. random tokens): the mean-field "
            "kernel is undefined")


# --------------------------------------------------------------- decomposition
def _heads(x: Tensor, group: int) -> Tensor:
    """[kv_head_index, ...] → [head_index, ...]."""
    return x.repeat_interleave(group, dim=0)


def decompose(
    mean_q: Float[Tensor, "head_index pos d_head"],
    mean_k: Float[Tensor, "kv_head_index pos d_head"],
    eval_q: Float[Tensor, "head_index pos d_head"],
    eval_k: Float[Tensor, "kv_head_index pos d_head"],
    centered: Float[Tensor, "head_index query_pos key_pos"],
    scale: float,
) -> dict[str, Float[Tensor, "head_index query_pos key_pos"]]:
    """``{"meanfield": M, "cross": X, "centered": C, "raw": M + X + C}`` in float64 for
    one layer, from the centering means, the evaluation means and the centered Gram C."""
    group = mean_q.shape[0] // mean_k.shape[0]
    mq, q_bar = mean_q.double(), eval_q.double()
    mk, k_bar = _heads(mean_k.double(), group), _heads(eval_k.double(), group)
    outer = lambda a, b: torch.einsum("htd,hsd->hts", a, b) * scale
    m = outer(mq, mk)
    x = outer(mq, k_bar - mk) + outer(q_bar - mq, mk)
    c = centered.double()
    return {"meanfield": m, "cross": x, "centered": c, "raw": m + x + c}


def shares(parts: dict[str, Tensor], demean: bool = True, mask: Mask | None = None
           ) -> dict[str, Tensor]:
    """share_P = ⟨P − p̄, Ḡ − ḡ⟩ / ‖Ḡ − ḡ‖² over the strict lower triangle's entries the
    layer's ``mask`` keeps (None: all of them; ``demean=False``: without the means), per
    leading index; the three shares sum to 1."""
    T = parts["raw"].shape[-1]
    keep = (mask or Mask(T)).lower(parts["raw"].device)
    flat = {k: v[..., keep] for k, v in parts.items()}
    if demean:
        flat = {k: v - v.mean(-1, keepdim=True) for k, v in flat.items()}
    raw = flat["raw"]
    norm = (raw * raw).sum(-1)
    return {p: (flat[p] * raw).sum(-1) / norm for p in PARTS}


def spectrum(g: Float[np.ndarray, "*batch lag"], reach: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(|rfft| of g − mean(g), zero-padded to 4T with T = lag + 1; frequencies rad/token).
    ``reach``: only the offsets 1..reach are kept (a window or a chunk: g is NaN past it);
    their spectrum, on its own grid, interpolated onto T's."""
    T = g.shape[-1] + 1
    if reach is None or reach >= T - 1:
        return spectral_spectrum(g, T, raw_spectrum=True, demean=True), frequency_grid(T)
    amp = spectral_spectrum(g[..., :reach], reach + 1, raw_spectrum=True, demean=True)
    grid, own = frequency_grid(T), frequency_grid(reach + 1)
    flat = amp.reshape(-1, amp.shape[-1])
    out = np.stack([np.interp(grid, own, row) for row in flat]) if len(flat) else flat
    return out.reshape(amp.shape[:-1] + grid.shape), grid


# -------------------------------------------------------------------- reducer
class MeanFieldReducer:
    """Σ_x (q_x − μ_q)(k_x − μ_k)ᵀ·scale per (layer, head) and Σ_x q_x, Σ_x k_x, float64,
    from each :class:`~poskernel_tl.reducers.LayerBatch` (post-rotary q/k; GQA keys are
    not expanded). No host sync in :meth:`update`."""

    def __init__(self, mean_q: Float[Tensor, "layer head_index pos d_head"],
                 mean_k: Float[Tensor, "layer kv_head_index pos d_head"], scale: float,
                 device: torch.device | str = "cpu"):
        self.mean_q = mean_q.to(device, torch.float64)
        self.mean_k = mean_k.to(device, torch.float64)
        self.scale = scale
        L, H, T, _ = self.mean_q.shape
        self.group = H // self.mean_k.shape[1]
        self.acc = torch.zeros(L, H, T, T, dtype=torch.float64, device=device)
        self.q_sum = torch.zeros_like(self.mean_q)
        self.k_sum = torch.zeros_like(self.mean_k)
        self.count = [0] * L

    def update(self, batch) -> None:
        L = batch.layer
        q, k = batch.q.double(), batch.k.double()  # [batch, pos, head, d]
        b, T, H, d = q.shape
        kv = k.shape[2]
        self.q_sum[L] += q.sum(0).transpose(0, 1)
        self.k_sum[L] += k.sum(0).transpose(0, 1)
        self.count[L] += b
        qc = ((q - self.mean_q[L].transpose(0, 1)) * self.scale).permute(2, 1, 0, 3)
        qc = qc.reshape(kv, self.group * T, b * d)  # [kv, group·T, b·d]
        kc = (k - self.mean_k[L].transpose(0, 1)).permute(2, 0, 3, 1).reshape(kv, b * d, T)
        self.acc[L].view(kv, self.group * T, T).baddbmm_(qc, kc)

    def parts(self, layer: int) -> dict[str, Tensor]:
        """The exact decomposition of one layer (see :func:`decompose`)."""
        n = self.count[layer]
        if n == 0:
            raise ValueError(f"MeanFieldReducer: layer {layer} saw no sequences")
        return decompose(self.mean_q[layer], self.mean_k[layer], self.q_sum[layer] / n,
                         self.k_sum[layer] / n, self.acc[layer] / n, self.scale)

    def result(self) -> list[dict[str, Tensor]]:
        return [self.parts(layer) for layer in range(len(self.count))]


# -------------------------------------------------------------------- results
@dataclass
class MeanFieldResult:
    """Per (layer, head): Toeplitz R² and g(Δ) (lag Δ = 1..T−1) of the mean field and of
    the raw and centered Gram, the spectrum of the mean-field g, and the shares."""

    r2: dict[str, Float[np.ndarray, "layer head_index"]]  # part (and "raw") -> R²
    g: dict[str, Float[np.ndarray, "layer head_index lag"]]
    share: dict[str, Float[np.ndarray, "layer head_index"]]
    share_ss: dict[str, Float[np.ndarray, "layer head_index"]]
    spectrum: Float[np.ndarray, "layer head_index freq"]
    freqs: Float[np.ndarray, " freq"]
    source: str
    note: str = ""
    parts: list[dict[str, np.ndarray]] | None = None  # per layer, with keep_matrices

    @property
    def peak_freq(self) -> Float[np.ndarray, "layer head_index"]:
        """Frequency (rad/token) of the largest non-DC peak of the mean-field spectrum."""
        amp = np.nan_to_num(self.spectrum[..., 1:], nan=-1.0)
        out = self.freqs[1:][amp.argmax(-1)]
        return np.where(np.isnan(self.spectrum[..., 1]), np.nan, out)


def summarise(layers: list[dict[str, Tensor]], source: str, keep_matrices: bool = False,
              masks: list[Mask] | None = None) -> MeanFieldResult:
    """R², g(Δ), shares and spectrum from each layer's parts (:func:`decompose`), each
    over the entries its layer's mask keeps (``masks``; None: the whole triangle)."""
    r2: dict = {p: [] for p in (*PARTS, "raw")}
    g: dict = {p: [] for p in (*PARTS, "raw")}
    sh: dict = {p: [] for p in PARTS}
    ss: dict = {p: [] for p in PARTS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a zero part: R² NaN
        for layer, parts in enumerate(layers):
            mask = None if masks is None else masks[layer]
            for p in r2:
                fit = shift_invariance_r2(parts[p], *((mask.window_last, mask.chunk) if mask
                                                      else ()))
                r2[p].append(fit[0].cpu().numpy())
                g[p].append(fit[1].cpu().numpy())
            for out, demean in ((sh, True), (ss, False)):
                for p, v in shares(parts, demean, mask).items():
                    out[p].append(v.cpu().numpy())
    stack = lambda d: {k: np.stack(v) for k, v in d.items()}
    g = stack(g)
    reach = [None] * len(layers) if masks is None else [m.reach for m in masks]
    amp = np.stack([spectrum(g["meanfield"][L], reach[L])[0] for L in range(len(layers))])
    freqs = frequency_grid(g["meanfield"].shape[-1] + 1)
    mats = ([{k: v.cpu().numpy() for k, v in p.items()} for p in layers]
            if keep_matrices else None)
    return MeanFieldResult(stack(r2), g, stack(sh), stack(ss), amp, freqs, source,
                           parts=mats)


def _nan_result(L: int, H: int, T: int, source: str) -> MeanFieldResult:
    nan = np.full((L, H), np.nan)
    g = np.full((L, H, T - 1), np.nan)
    amp, freqs = spectrum(g)
    every = (*PARTS, "raw")
    return MeanFieldResult({p: nan for p in every}, {p: g for p in every},
                           {p: nan for p in PARTS}, {p: nan for p in PARTS}, amp, freqs,
                           source, note=NO_MEANS)


def compute_mean_field(result, model=None, eval_tokens=None, *, source: str = "auto",
                       batch_size: int = 4, progress: bool = True,
                       keep_matrices: bool = False) -> MeanFieldResult:
    """The mean-field analysis of a condition (see the module). ``source``: ``"pass"``
    (needs ``model`` and the evaluation ``eval_tokens``), ``"result"`` (needs the saved
    Gram matrices) or ``"auto"`` (the pass when a model is given)."""
    L, H, T = result.n_layers, result.n_heads, result.length
    if source == "auto":
        source = "pass" if model is not None and eval_tokens is not None else "result"
    if source not in ("pass", "result"):
        raise ValueError(f"source={source!r}: choose auto, pass or result")
    if result.mean_q is None or result.mean_k is None:
        return _nan_result(L, H, T, source)
    mean_q, mean_k = torch.from_numpy(result.mean_q), torch.from_numpy(result.mean_k)
    masks = list(result.geometry.masks)
    scale = float(result.provenance.get("logit_scale", result.spec.d_head ** -0.5))
    if source == "result":
        if result.gram_raw is None or result.gram_centered is None:
            raise ValueError("this result has no saved Gram matrices (kept for T <= 256): "
                             "pass model= and eval_tokens= to run the exact pass")
        layers = []
        for layer in range(L):
            group = H // mean_k.shape[1]
            m = torch.einsum("htd,hsd->hts", mean_q[layer].double(),
                             _heads(mean_k[layer].double(), group)) * scale
            raw = torch.from_numpy(result.gram_raw[layer]).double()
            c = torch.from_numpy(result.gram_centered[layer]).double()
            layers.append({"meanfield": m, "cross": raw - m - c, "centered": c, "raw": raw})
        return summarise(layers, source, keep_matrices, masks)
    ids = as_tokens(model, eval_tokens)
    check_tokens(model, ids, "evaluation tokens")
    if ids.shape[1] != T:
        raise ValueError(f"result measured at T={T}, tokens have T={ids.shape[1]}")
    (red,) = forward_pass(model, ids, lambda: [MeanFieldReducer(mean_q, mean_k, scale,
                                                                model.device)],
                          batch_size, "mean-field pass", progress)
    return summarise(red.result(), source, keep_matrices, masks)


def mean_field_table(mf: MeanFieldResult, kv_head: np.ndarray | None = None) -> pd.DataFrame:
    """One row per (layer, head): ``R2_meanfield``, the shares, the R² of the raw,
    centered and cross parts, the correlation of the mean-field and raw g(Δ), the
    mean-field spectrum's peak frequency, the route and a note."""
    L, H = mf.share["meanfield"].shape
    cols = head_index_columns(L, H)
    if kv_head is not None:
        cols["kv_head"] = np.asarray(kv_head)[cols["head"]]
    cols["R2_meanfield"] = mf.r2["meanfield"].ravel()
    for p in PARTS:
        cols[f"share_{p}"] = mf.share[p].ravel()
    for p in PARTS:
        cols[f"share_{p}_ss"] = mf.share_ss[p].ravel()
    cols["R2_gram_raw"] = mf.r2["raw"].ravel()
    cols["R2_gram_centered"] = mf.r2["centered"].ravel()
    cols["R2_cross"] = mf.r2["cross"].ravel()
    gm, gr = mf.g["meanfield"], mf.g["raw"]
    with np.errstate(invalid="ignore", divide="ignore"):
        a, b = gm - gm.mean(-1, keepdims=True), gr - gr.mean(-1, keepdims=True)
        corr = (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    cols["corr_g_meanfield_raw"] = corr.ravel()
    cols["meanfield_peak_freq"] = mf.peak_freq.ravel()
    cols["source"] = mf.source
    cols["note"] = mf.note
    return pd.DataFrame(cols)


def mean_field(result, model=None, eval_tokens=None, *, source: str = "auto",
               batch_size: int = 4, progress: bool = True) -> pd.DataFrame:
    """Notebook entry: the per-head table of :func:`mean_field_table`. With ``model`` and
    the condition's evaluation tokens the exact pass runs; otherwise the saved Gram
    matrices are used (T ≤ 256)."""
    mf = compute_mean_field(result, model, eval_tokens, source=source,
                            batch_size=batch_size, progress=progress)
    return mean_field_table(mf, result.kv_head)


@dataclass(frozen=True)
class MeanFieldOptions:
    source: Literal["pass", "result"] = option(
        "pass", "pass: one exact pass over the evaluation sequences; result: the saved "
        "Gram matrices (T ≤ 256, no forward)")


def analyze(inputs: AnalysisInputs, options: MeanFieldOptions) -> pd.DataFrame:
    """``poskernel analyze mean-field``: the decomposition with the condition's centering
    means (``inputs.result``)."""
    return mean_field(inputs.result, inputs.model, inputs.eval_tokens, source=options.source,
                      batch_size=inputs.batch_size, progress=inputs.progress)


def plot_mean_field(table: pd.DataFrame, title: str = "") -> Figure:
    """Left: the mean over heads of each part's share of the raw Gram, stacked per layer
    (negative shares stack below zero). Right: mean Toeplitz R² per layer of the mean
    field, the raw and the centered Gram. The backend is not touched."""
    fig = Figure(figsize=(11, 4))
    ax, ax2 = fig.subplots(1, 2)
    by = table.groupby("layer")
    means = by[[f"share_{p}" for p in PARTS]].mean()
    x = means.index.to_numpy()
    pos, neg = np.zeros(len(x)), np.zeros(len(x))
    colors = {"meanfield": "tab:orange", "cross": "tab:gray", "centered": "tab:blue"}
    labels = {"meanfield": "mean field μ_q μ_kᵀ", "cross": "cross", "centered": "centered"}
    for p in PARTS:
        v = np.nan_to_num(means[f"share_{p}"].to_numpy())
        bottom = np.where(v >= 0, pos, neg)
        ax.bar(x, v, bottom=bottom, color=colors[p], label=labels[p], width=0.8)
        pos, neg = pos + np.clip(v, 0, None), neg + np.clip(v, None, 0)
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("layer")
    ax.set_ylabel("share of the raw Gram (mean over heads)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    r2 = by[["R2_meanfield", "R2_gram_raw", "R2_gram_centered"]].mean()
    for col, style, label in (("R2_meanfield", "-o", "mean field"),
                              ("R2_gram_raw", "-s", "raw Gram"),
                              ("R2_gram_centered", "-^", "centered Gram")):
        ax2.plot(r2.index, r2[col], style, ms=3, label=label)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("Toeplitz R² (mean over heads)")
    ax2.set_ylim(-0.02, 1.02)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    notes = table["note"].fillna("").astype(str)
    if notes.str.len().gt(0).any():
        ax.text(0.5, 0.5, notes.iloc[0], transform=ax.transAxes, ha="center", va="center",
                fontsize=7, wrap=True)
    fig.suptitle(title or "where the positional kernel lives: mean field vs content",
                 fontsize=10)
    fig.tight_layout()
    return fig


SPEC = AnalysisSpec(
    order=80,  # (where it is listed)
    name="mean-field", title="Mean field", compute=analyze, options=MeanFieldOptions,
    needs_result=True, figure=plot_mean_field,
    columns=("R2_meanfield", "share_meanfield", "share_cross", "share_centered"),
    layer_means=(("R2_meanfield", "R² mean field"), ("share_meanfield", "share MF"),
                 ("share_cross", "share cross"), ("share_centered", "share centered")),
    head_rows=(("R2_meanfield", "R² of the mean field μ_q μ_kᵀ"),
               ("share_meanfield", "share: mean field"),
               ("share_cross", "share: cross"),
               ("share_centered", "share: centered")),
    guide="The raw averaged Gram split into the mean field μ_q μ_kᵀ (content-free), the "
          "centered Gram (content) and a cross term: a large mean-field share with a high "
          "R²_meanfield says the kernel lives in the mean query and key.")


__all__ = ["SPEC", "MeanFieldOptions", "MeanFieldReducer", "MeanFieldResult", "analyze",
           "compute_mean_field", "decompose", "mean_field", "mean_field_table", "summarise",
           "plot_mean_field", "shares", "spectrum"]

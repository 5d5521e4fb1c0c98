"""The report's figures (Phase 6 of the protocol), one function per figure, each returning a
``matplotlib.figure.Figure`` built directly (the global pyplot backend is never touched).

- :func:`fig1_heatmaps`: Track A pooled R² [layer × head] per condition, shared 0–1 scale,
  kv-group boundaries for grouped-query attention;
- :func:`fig2_depth`: mean R² per layer (Track A pooled, Track B centered, Track B raw)
  with the linear fit of Track A and its slope ± SE;
- :func:`fig3_violins`: per-sequence R² of the top early-layer heads, one panel per
  populated PE × norm cell;
- :func:`fig4_spectral`: one early rotary head's centered Gram, g(Δ) and |ĝ(ω)|² against θᵢ;
- the nulls' figure: :mod:`poskernel_tl.report.figure_nulls`.

:func:`save_figure` writes PNG and PDF.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from poskernel_tl.constants import GRAM_SAVE_MAX_T
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.protocol import EARLY_LAYERS
from poskernel_tl.report import nulls
from poskernel_tl.report.tables import dataset_label, depth_slope

CELLS = [(("rope", "rmsnorm"), "RoPE + RMSNorm"), (("rope", "layernorm"), "RoPE + LayerNorm"),
         (("none", "rmsnorm"), "NoPE + RMSNorm"),
         (("learned-absolute", "layernorm"), "absolute PE + LayerNorm")]
PRETTY = {"gemma3-270m": "Gemma-3-270M", "gpt2": "GPT-2 small", "gpt2-medium": "GPT-2 medium",
          "olmo-1b": "OLMo-1B",
          "llama-3.2-1b": "LLaMA-3.2-1B", "tinyllama-1.1b": "TinyLlama-1.1B",
          "tinyllama-nope-1.1b": "TinyLlama-NoPE-1.1B", "smollm2-135m": "SmolLM2-135M",
          "minilm-l6": "all-MiniLM-L6-v2"}
TAU_REL = 0.10


def model_label(r: ConditionResult) -> str:
    """Display name; quantized checkpoints say so, e.g. 'SmolLM2-135M (Q4_1-dequantized
    weights)', and encoders that their fits read both triangles ('… (bidirectional)')."""
    name = PRETTY.get(r.model, r.model)
    if not r.causal:
        name += " (bidirectional)"
    if r.spec.loader == "gguf":
        name += f" ({r.spec.quantization or 'GGUF'}-dequantized weights)"
    return name


def condition_label(r: ConditionResult) -> str:
    return _plain(f"{model_label(r)} · {dataset_label(r.dataset)} · T={r.length}")


def _plain(text: str) -> str:
    """Text that matplotlib must not read as mathtext ('$' escaped)."""
    return text.replace("$", r"\$")


def cell_of(r: ConditionResult) -> tuple[tuple, str]:
    key = (r.spec.pe, r.spec.norm)
    for k, name in CELLS:
        if k == key:
            return k, name
    return key, f"{r.spec.pe or 'unknown PE'} + {r.spec.norm}"


def _ticks(n: int, most: int = 16) -> np.ndarray:
    step = 1 if n <= most else int(np.ceil(n / most))
    return np.arange(0, n, step)


def _panels(results: Sequence, ncols: int, what: str, w: float, h: float,
            extra_w: float = 0.0, **subplots) -> tuple[Figure, np.ndarray, int]:
    """A figure of one w × h panel per condition, ``ncols`` across (the spare panels
    hidden): the figure, its axes in reading order and the columns used."""
    if not results:
        raise ValueError(f"{what}: no conditions")
    ncols = max(1, min(ncols, len(results)))
    fig = Figure(figsize=(w * ncols + extra_w, h * -(-len(results) // ncols)),
                 layout="constrained")
    axes = fig.subplots(-(-len(results) // ncols), ncols, squeeze=False, **subplots).ravel()
    for ax in axes[len(results):]:
        ax.set_visible(False)
    return fig, axes, ncols


# ------------------------------------------------------------------------- Figure 1
def fig1_heatmaps(results: Sequence[ConditionResult], ncols: int = 3) -> Figure:
    """Track A pooled R² per (layer, head), one panel per condition: head index on x,
    layer on y (layer 0 at the top), one colour scale 0–1 for all panels (NaN grey).
    White lines separate the kv groups of grouped-query attention models."""
    H = max((r.n_heads for r in results), default=0)
    L = max((r.n_layers for r in results), default=0)
    fig, axes, _ = _panels(results, ncols, "fig1_heatmaps", max(3.2, 0.3 * H + 1.6),
                           max(2.8, 0.22 * L + 1.4), 1.0)
    cmap = colormaps["viridis"].with_extremes(bad="0.75")
    im = None
    for ax, r in zip(axes, results):
        im = ax.imshow(np.ma.masked_invalid(r.r2_pooled), cmap=cmap, vmin=0, vmax=1,
                       aspect="auto", interpolation="nearest")
        g = r.spec.group_size
        if g > 1:
            for b in range(g, r.n_heads, g):
                ax.axvline(b - 0.5, color="white", lw=1.6)
        ax.set_xticks(_ticks(r.n_heads))
        ax.set_yticks(_ticks(r.n_layers, 20))
        ax.set_xlabel("head index" + (f"  (kv groups of {g})" if g > 1 else ""))
        ax.set_ylabel("layer")
        _mark_layer_kinds(ax, r)
        ax.set_title(_plain(f"{model_label(r)}\n{dataset_label(r.dataset)} · T={r.length} · "
                            f"{len(r.seq_id)} sequences"), fontsize=9)
    fig.colorbar(im, ax=list(axes[:len(results)]), label="Track A pooled R² (0–1, all panels)",
                 shrink=0.9)
    return fig


def _mark_layer_kinds(ax, r: ConditionResult) -> None:
    """Where a model's layers differ in positional scheme (Gemma 3's global layers among
    local ones, SmolLM3's NoPE layers), frame and label the rows of every kind but the
    most common, which the axis label names."""
    kinds = [s.kind for s in r.spec.layers or ()]
    if len(set(kinds)) < 2:
        return
    common = max(dict.fromkeys(kinds), key=kinds.count)
    odd = [i for i, k in enumerate(kinds) if k != common]
    ax.set_yticks(odd, [f"{i}: {kinds[i]}" for i in odd], fontsize=6)
    for i in odd:
        for y in (i - 0.5, i + 0.5):
            ax.axhline(y, color="white", lw=1.0)
    ax.set_ylabel(f"layer (unlabelled: {common})", fontsize=8)


# ------------------------------------------------------------------------- Figure 2
TRACK_A_QUESTIONS = (
    "Track A pooled R² asks whether the raw logits are a function of the offset; Track A "
    "within rows asks whether what the softmax sees — each row's logits less a constant of "
    "the row, which it ignores — is one: a query norm or a content bias of the query moves "
    "the first and not the second.")


def fig2_depth(results: Sequence[ConditionResult], ncols: int = 3) -> Figure:
    """Mean R² over heads per layer — Track A pooled and within rows (:data:`TRACK_A_QUESTIONS`),
    Track B centered, Track B raw — one
    panel per condition on a shared 0–1 axis, with the least-squares line of Track A
    against layer and its slope ± standard error in the legend."""
    fig, axes, ncols = _panels(results, ncols, "fig2_depth", 4.6, 3.4, sharey=True)
    for ax, r in zip(axes, results):
        s = r.layer_summary()
        x = s.index.to_numpy()
        ax.plot(x, s["R2_A_pooled"], "o-", color="C0", ms=3, label="Track A pooled")
        if "R2_A_within_row" in s:
            ax.plot(x, s["R2_A_within_row"], "o:", color="C1", ms=3,
                    label="Track A within rows")
        if r.centered and np.isfinite(s["R2_B_centered"]).any():
            ax.plot(x, s["R2_B_centered"], "s-", color="C3", ms=3, label="Track B centered")
        else:
            ax.plot([], [], " ", label="Track B centered: not run (uncentered)")
        ax.plot(x, s["R2_B_raw"], "^--", color="C2", ms=3, label="Track B raw")
        slope, se, icept = depth_slope(r.r2_pooled)
        if np.isfinite(slope):
            ax.plot(x, icept + slope * x, ":", color="k", lw=1.2,
                    label=f"fit to A: slope {slope:+.4f} ± {se:.4f} /layer")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_title(condition_label(r), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[::ncols]:
        ax.set_ylabel("mean R² over heads")
    return fig


# ------------------------------------------------------------------------- Figure 3
def top_early_heads(r: ConditionResult, n: int = 5) -> list[tuple[int, int]]:
    """The ``n`` heads of layers 0–1 with the highest Track A pooled R²."""
    layers = [layer for layer in EARLY_LAYERS if layer < r.n_layers]
    cand = [(float(r.r2_pooled[layer, h]), layer, h) for layer in layers
            for h in range(r.n_heads) if np.isfinite(r.r2_pooled[layer, h])]
    return [(layer, h) for _, layer, h in sorted(cand, reverse=True)[:n]]


def fig3_violins(results: Sequence[ConditionResult], n_top: int = 5) -> Figure:
    """Violins of per-sequence Track A R² for the ``n_top`` (3–5) highest early-layer heads
    of each model, one panel per populated cell of the protocol's PE × norm grid (RoPE+RMSNorm,
    RoPE+LayerNorm, NoPE+RMSNorm, absolute PE+LayerNorm; others get their own panel).
    Each violin is labelled with its head and its std across sequences; dashed lines mark
    0.40 and 0.80."""
    if not results:
        raise ValueError("fig3_violins: no conditions")
    order = {k: i for i, (k, _) in enumerate(CELLS)}
    cells: dict = {}
    for r in results:
        key, name = cell_of(r)
        cells.setdefault((order.get(key, len(order)), name), []).append(r)
    panels = sorted(cells.items())
    many = len({(r.dataset, r.length) for r in results}) > 1
    widths = [max(2, sum(len(top_early_heads(r, n_top)) for r in rs)) for _, rs in panels]
    fig = Figure(figsize=(min(24, 1.5 + 0.5 * sum(widths) + 0.8 * len(panels)), 5.2),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True,
                        gridspec_kw={"width_ratios": widths}).ravel()
    for ax, ((_, name), rs) in zip(axes, panels):
        pos, labels, x = [], [], 0
        for i, r in enumerate(sorted(rs, key=lambda r: (r.model, r.dataset, r.length))):
            for layer, h in top_early_heads(r, n_top):
                vals = r.r2_per_seq[:, layer, h]
                vals = vals[np.isfinite(vals)]
                if vals.size > 1 and np.ptp(vals) > 0:
                    parts = ax.violinplot(vals, [x], widths=0.8, showmedians=True)
                    for body in parts["bodies"]:
                        body.set_facecolor(f"C{i % 10}")
                        body.set_alpha(0.55)
                    for line in ("cbars", "cmins", "cmaxes", "cmedians"):
                        parts[line].set_color("k")
                        parts[line].set_linewidth(0.8)
                elif vals.size:
                    ax.plot([x] * vals.size, vals, "_", color=f"C{i % 10}", ms=14)
                sd = float(np.std(vals, ddof=1)) if vals.size > 1 else float("nan")
                ax.text(x, 1.005, f"sd {sd:.2f}", ha="center", va="bottom", fontsize=6.5)
                short = _plain(PRETTY.get(r.model, r.model))
                extra = _plain(f"\n{dataset_label(r.dataset)} T={r.length}") if many else ""
                labels.append(f"{short}{extra}\nL{layer}H{h}")
                pos.append(x)
                x += 1
        for t in nulls.THRESHOLDS:
            ax.axhline(t, color="0.4", ls="--", lw=0.8)
        ax.set_xticks(pos, labels, fontsize=7, rotation=90 if len(pos) > 3 else 0)
        ax.set_xlim(-0.7, max(x, 1) - 0.3)
        names = sorted({_plain(model_label(r)) for r in rs})
        ax.set_title(name + "\n" + "\n".join(names), fontsize=8.5)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("per-sequence Track A R²")
    axes[0].set_ylim(-0.02, 1.07)
    datasets = sorted({(r.dataset, r.length) for r in results})
    if not many:
        fig.suptitle(_plain(f"Top early-layer (0–1) heads · {dataset_label(datasets[0][0])} · "
                            f"T={datasets[0][1]}"), fontsize=10)
    return fig


# ------------------------------------------------------------------------- Figure 4
def pick_spectral_head(results: Sequence[ConditionResult]) -> tuple[ConditionResult, int, int]:
    """The rotary condition and early-layer head with the highest Track A pooled R²,
    preferring centered conditions, then those whose Gram matrix is kept (T ≤ 256, or the
    matrix present); raises without a rotary model."""
    rope = [r for r in results if r.spec.pe == "rope" and r.thetas is not None]
    if not rope:
        raise ValueError("no rotary model among the conditions")
    best = max(((r.centered, r.gram_centered is not None or r.gram_raw is not None
                 or r.length <= GRAM_SAVE_MAX_T, float(r.r2_pooled[layer, h]), i, layer, h)
                for i, r in enumerate(rope) for layer, h in top_early_heads(r, 1)),
               default=None)
    if best is None:
        raise ValueError("no finite early-layer R² among the rotary conditions")
    return rope[best[3]], best[4], best[5]


def _fig4_gram(fig: Figure, ax, r: ConditionResult, T: int, grams: dict) -> None:
    which = "centered" if r.centered and "gram_centered" in grams else "raw"
    gram = grams.get(f"gram_{which}")
    if gram is not None:
        m = np.where(np.tril(np.ones((T, T), bool), -1), gram, np.nan)
        lo, hi = np.nanpercentile(m, [1, 99])
        im = ax.imshow(m, cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.046, label="mean q̃·k̃ᵀ·scale")
        ax.set(xlabel="key position s", ylabel="query position t")
    else:
        ax.text(0.5, 0.5, f"Gram matrix not kept\n(T = {T} > 256)", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title(f"(a) {which} Gram matrix\nstrictly lower triangle s < t", fontsize=9)


def _fig4_kernels(ax, kept: dict, T: int) -> None:
    lags = np.arange(1, T)
    ax.plot(lags, kept["g_trackB"], color="C3", lw=1.4,
            label=f"Track B ({kept['g_trackB_source']})", zorder=3)
    ax.set(xlabel="lag Δ = t − s", ylabel="g(Δ), Track B", xscale="log")
    twin = ax.twinx()
    twin.plot(lags, kept["g_pooled"], color="C0", lw=1.0, ls="--", alpha=0.8,
              label="Track A pooled (right axis)")
    twin.set_ylabel("g(Δ), Track A", color="C0")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7)
    ax.set_title("(b) g(Δ)\nTrack B (analysed) and Track A", fontsize=9)
    ax.grid(alpha=0.3)


def _fig4_spectrum(ax, r: ConditionResult, spectral: dict) -> None:
    omega, power = np.asarray(spectral["omega"]), np.asarray(spectral["spectrum"]) ** 2
    keep = omega > 0
    ax.plot(omega[keep], power[keep], color="C0", lw=1.0, label="|ĝ(ω)|² as analysed")
    lo_w, hi_w = omega[keep].min(), np.pi
    thetas = [t for t in np.asarray(r.thetas, float) if lo_w <= t <= hi_w]
    for i, t in enumerate(thetas):
        ax.axvspan(t * (1 - TAU_REL), t * (1 + TAU_REL), color="C1", alpha=0.12, lw=0)
        ax.axvline(t, color="C1", ls="--", lw=0.7, label=f"θᵢ ±10% ({len(thetas)} of "
                   f"{len(r.thetas)} in range)" if i == 0 else None)
    peaks = np.asarray(spectral.get("peaks", []), float)
    if peaks.size:
        pk_pow = np.interp(peaks, omega, power)
        matched = np.asarray(spectral.get("matched", np.zeros(len(peaks), bool)), bool)
        rel = np.asarray(spectral.get("rel_error", np.full(len(peaks), np.nan)), float)
        ax.plot(peaks[matched], pk_pow[matched], "v", color="C2", ms=7, label="matched peak")
        ax.plot(peaks[~matched], pk_pow[~matched], "v", mfc="none", mec="k", ms=7,
                label="unmatched peak")
        for k, (w, p, e) in enumerate(zip(peaks[matched], pk_pow[matched], rel[matched])):
            ax.annotate(f"{100 * e:.1f}%", (w, p), textcoords="offset points",
                        xytext=(0, 8 + 9 * (k % 2)), ha="center", fontsize=7, color="C2")
    top = float(np.nanmax(power[keep])) if np.isfinite(power[keep]).any() else 1.0
    top = top if top > 0 else 1.0
    ax.set(xscale="log", yscale="log", xlabel="ω (rad/token)", ylabel="power",
           xlim=(lo_w, hi_w), ylim=(top * 1e-7, top * 20))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    frac, p = spectral.get("frac_matched", np.nan), spectral.get("p_value", np.nan)
    ptext = f"p = {p:.3g}" if np.isfinite(p) else "no significant peak"
    ax.set_title(f"(c) |ĝ(ω)|²\n{frac:.0%} of top-5 peaks matched (chance "
                 f"{spectral.get('chance', np.nan):.2f}); {ptext}"
                 if np.isfinite(frac) else "(c) |ĝ(ω)|²", fontsize=9)


def head_arrays(r: ConditionResult, layer: int, head: int) -> dict:
    """What Figure 4 reads of one head, copied: its Gram matrices where kept
    (``gram_centered``, ``gram_raw``), Track B's g and its source (``g_trackB``,
    ``g_trackB_source``) and Track A's pooled g (``g_pooled``)."""
    g_b, src = r.g_trackB
    return {**{n: np.array(getattr(r, n)[layer, head]) for n in ("gram_centered", "gram_raw")
               if getattr(r, n) is not None},
            "g_trackB": np.array(g_b[layer, head]), "g_trackB_source": src,
            "g_pooled": np.array(r.g_pooled[layer, head])}


def fig4_spectral(r: ConditionResult, layer: int, head: int, spectral: dict | None, *,
                  gate_met: bool | None, kept: dict | None = None) -> Figure:
    """One head: (a) the centered Gram matrix (raw when the condition is uncentered) on
    its strictly lower triangle, (b) Track B g(Δ) with Track A's on a second axis, (c)
    |ĝ(ω)|² (``spectral``: the saved spectrum ``omega``/``spectrum`` and the head's
    ``peaks``, ``matched``, ``rel_error``, ``frac_matched``, ``chance``, ``p_value``) with
    the model's θᵢ dashed, ±10% bands shaded and the top peaks marked, matched peaks
    labelled with their relative error. Titled "gate not met" when the spectral gate
    failed. ``kept``: this head's arrays (:func:`head_arrays`), read from ``r`` when not
    given."""
    spectral = spectral or {}
    if "omega" not in spectral or "spectrum" not in spectral:
        raise ValueError("fig4_spectral needs the head's saved spectrum (omega, spectrum)")
    kept = head_arrays(r, layer, head) if kept is None else kept
    fig = Figure(figsize=(15, 4.4), layout="constrained")
    ax_a, ax_b, ax_c = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.1, 1.5]})
    _fig4_gram(fig, ax_a, r, r.length, kept)
    _fig4_kernels(ax_b, kept, r.length)
    _fig4_spectrum(ax_c, r, spectral)
    gate = "" if gate_met else "  —  gate not met" if gate_met is False else \
        "  —  no gate applies"
    fig.suptitle(f"{condition_label(r)} · L{layer}H{head} · Track A pooled R² "
                 f"{r.r2_pooled[layer, head]:.3f}{gate}", fontsize=10)
    return fig


def save_figure(fig: Figure, stem: str | Path, dpi: int = 110, pdf: bool = True
                ) -> tuple[Path, Path | None]:
    """Write ``stem.png`` and (with ``pdf``) ``stem.pdf``; returns both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = stem.parent / f"{stem.name}.png"
    fig.savefig(png, dpi=dpi, facecolor="white")
    if not pdf:
        return png, None
    pdf = stem.parent / f"{stem.name}.pdf"
    engine = fig.get_layout_engine()
    fig.set_layout_engine("none")  # keep the positions just computed: lay out once
    fig.savefig(pdf, facecolor="white")
    fig.set_layout_engine(engine)
    return png, pdf


__all__ = ["CELLS", "cell_of", "condition_label", "fig1_heatmaps", "fig2_depth",
           "fig3_violins", "fig4_spectral", "model_label", "pick_spectral_head",
           "save_figure", "top_early_heads"]

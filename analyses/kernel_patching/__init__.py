"""Kernel patching: is a head "just its kernel"?

For every attention head, the pre-softmax scores A(t, s) read at ``hook_attn_scores``
([batch, head_index, query_pos, key_pos], already causally masked) are replaced by a
shift-invariant kernel K(t, s) = g(t − s) through a TransformerLens hook that returns the
modified scores, and the mean next-token loss on the evaluation sequences is compared with
the clean loss and with the loss after mean-ablating the same head:

- ``mode="per_seq"``: g is fitted inside the hook on that sequence's own scores (g(Δ) =
  mean of sub-diagonal Δ, exactly the Track A fit; the head keeps everything that is a
  function of Δ in this sequence and loses everything else);
- ``mode="pooled"``: g is the condition's pooled Track A kernel ``result.g_pooled`` (one
  kernel for all sequences; a content-free head). Without a result, or with
  ``keep_keys``, it is fitted to the mean scores of the patched sequences, which is the
  pooled Track A fit of those sequences (the mean of sub-diagonal Δ over all of them).

Only the causal triangle s ≤ t is replaced; entries above the diagonal keep their masked
fill value. The Track A fit covers Δ = 1..T−1; the main diagonal (Δ = 0, a token attending
to itself) is, with ``diagonal="fit"`` (default), replaced by its own mean (per sequence,
or pooled over the evaluation batch's clean scores), and with ``diagonal="keep"`` left at
its clean value. ``keep_keys=k`` does the same for the main patch.

Mean ablation replaces the head's scores on the causal triangle (diagonal included) by
their mean over the evaluation sequences at each (t, s), computed in a clean pass over
the same sequences (the per-position mean scores; for a head this is its raw averaged
Gram matrix). The loss is the mean cross-entropy of positions 0..T−2 predicting 1..T−1.

Per head the table reports ``dloss_patched`` = loss(patched) − loss(clean),
``dloss_ablated`` = loss(mean-ablated) − loss(clean), their ratio ``dloss_ratio`` (the
normalised loss change: 0 = the kernel is all the head contributes, 1 = the kernel is no
better than the mean), and seeded bootstrap 95% intervals over sequences (the ratio's
interval is the ratio of resampled means). The ratio is only meaningful where ablation
matters (``ablation_matters``: its interval lies above 0).

A kernel g(t − s) cannot hold an attention sink (a large score on the first key whatever
the offset), and destroying a sink can cost nats where mean ablation, which keeps it,
costs nothing. So by default a second patch, ``patched_sink``, runs beside the first: the
same kernel with the first ``sink_keys`` (default 1) key columns kept at their clean
values and left out of the fit (``dloss_patched_sink``, ``dloss_ratio_sink``).

The forward passes, their batching and cost are in :mod:`.passes`, the kernels in
:mod:`.kernels`; this module makes the table, the figure and the
``poskernel analyze kernel-patching`` entry.
"""

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.kernel_patching.passes import PatchingResult, run_kernel_patching
from poskernel_tl.data.inputs import as_tokens, check_tokens
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.plan.config import option
from poskernel_tl.schema import head_index_columns

MAX_SEQS = 16  # evaluation sequences patched by default from a notebook


# ------------------------------------------------------------------ table, figure
def bootstrap(dloss: dict[str, np.ndarray], ratios: dict[str, tuple[str, str]],
              n_boot: int = 1000, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded percentile 95% intervals over sequences (axis 0) of the mean of each array
    in ``dloss`` and of each ratio of means ``ratios[name] = (numerator, denominator)``:
    ``{name: (lo, hi)}`` arrays shaped like one sequence's."""
    first = next(iter(dloss.values()))
    n = first.shape[0]
    nan = np.full(first.shape[1:], np.nan)
    if n < 2:
        return {k: (nan, nan) for k in (*dloss, *ratios)}
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    means = {k: v[idx].mean(1) for k, v in dloss.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, (num, den) in ratios.items():
            means[name] = means[num] / means[den]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, x in means.items():
            x = np.where(np.isfinite(x), x, np.nan)
            out[name] = (np.nanpercentile(x, 2.5, axis=0), np.nanpercentile(x, 97.5, axis=0))
    return out


def patching_table(res: PatchingResult, extra: dict[str, np.ndarray] | None = None,
                   n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per patched (layer, head): mean losses, the loss changes ``dloss_patched``,
    ``dloss_ablated`` (and ``dloss_patched_sink``), the normalised patching loss
    ``dloss_ratio`` = dloss_patched / dloss_ablated (and ``dloss_ratio_sink``), seeded
    bootstrap intervals (``_lo``, ``_hi``), ``ablation_matters`` (the ablation interval
    lies above 0) and the ``extra`` per-head arrays [layer, head_index] (e.g. Track A's
    pooled R²)."""
    n, L, H = res.loss_patched.shape
    dloss = {f"dloss_{v}": res.dloss(v) for v in res.losses}
    ratios = {"dloss_ratio": ("dloss_patched", "dloss_ablated")}
    if "patched_sink" in res.losses:
        ratios["dloss_ratio_sink"] = ("dloss_patched_sink", "dloss_ablated")
    ci = bootstrap(dloss, ratios, n_boot, seed)
    cols = {**head_index_columns(L, H), "mode": res.mode,
            "diagonal": res.diagonal, "keep_keys": res.keep_keys,
            "sink_keys": res.sink_keys, "kernel_from": res.kernel_from, "n_seqs": n,
            "loss_clean": res.loss_clean.mean()}
    for v, loss in res.losses.items():
        cols[f"loss_{v}"] = loss.mean(0).ravel()
    means = {k: v.mean(0) for k, v in dloss.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, (num, den) in ratios.items():
            r = means[num] / means[den]
            means[name] = np.where(np.isfinite(r), r, np.nan)
    for name, mean in means.items():
        cols[name] = mean.ravel()
        cols[f"{name}_lo"], cols[f"{name}_hi"] = (x.ravel() for x in ci[name])
    cols["ablation_matters"] = (ci["dloss_ablated"][0] > 0).ravel()
    for name, arr in (extra or {}).items():
        cols[name] = np.asarray(arr).ravel()
    table = pd.DataFrame(cols)
    return table[np.isfinite(table["dloss_patched"])].reset_index(drop=True)


def kernel_patching(model, eval_tokens, result=None, *, mode: str = "pooled",
                    diagonal: str = "fit", keep_keys: int = 0, sink_keys: int = 1,
                    max_seqs: int | None = MAX_SEQS, layers=None,
                    head_chunk: int | None = None, batch_size: int = 4,
                    expand: bool | None = None, n_boot: int = 1000, seed: int = 0,
                    progress: bool = True) -> pd.DataFrame:
    """Notebook entry: the per-head patching table (see :func:`patching_table`) on the first
    ``max_seqs`` evaluation sequences (``eval_tokens``: int tensor [n, T] or strings).
    ``result`` (the condition's :class:`~poskernel_tl.ConditionResult`) supplies the pooled
    kernel and Track A's R²; without it the pooled kernel is fitted to the patched
    sequences."""
    ids = as_tokens(model, eval_tokens)
    check_tokens(model, ids, "evaluation tokens")
    Geometry.of(model.spec, ids.shape[1]).require_whole("kernel patching")
    if result is not None and result.length != ids.shape[1]:
        raise ValueError(f"result measured at T={result.length}, tokens have T={ids.shape[1]}")
    res = run_kernel_patching(
        model, ids, g_pooled=None if result is None else result.g_pooled, mode=mode,
        diagonal=diagonal, keep_keys=keep_keys, sink_keys=sink_keys, layers=layers,
        head_chunk=head_chunk,
        max_seqs=max_seqs, batch_size=batch_size, expand=expand, progress=progress)
    extra = {} if result is None else {"R2_pooled": result.r2_pooled,
                                       "R2_pooled_nosink": result.r2_pooled_nosink}
    table = patching_table(res, extra, n_boot, seed)
    table["n_forwards"], table["seconds"] = res.n_forwards, res.seconds
    return table


@dataclass(frozen=True)
class KernelPatchingOptions:
    max_seqs: int = option(2, "evaluation sequences patched; each costs about R·L²/2 block "
                              "evaluations (≈ 450 single-sequence forwards on SmolLM2)")
    sink_keys: int = option(1, "key columns the second patch keeps clean (0: no second "
                               "patch, about a third cheaper)")
    mode: Literal["pooled", "per_seq"] = option(
        "pooled", "pooled: the condition's pooled kernel; per_seq: each sequence's own fit")


def analyze(inputs: AnalysisInputs, options: KernelPatchingOptions) -> pd.DataFrame:
    """``poskernel analyze kernel-patching``: kernel patching of every head on the first
    ``max_seqs`` evaluation sequences (centering sequences are not used)."""
    return kernel_patching(inputs.model, inputs.eval_tokens, inputs.result,
                           mode=options.mode, sink_keys=options.sink_keys,
                           max_seqs=options.max_seqs, batch_size=inputs.batch_size,
                           progress=inputs.progress)


def plot_kernel_patching(table: pd.DataFrame, title: str = "") -> Figure:
    """Layer × head heatmaps: the normalised loss change dloss_patched / dloss_ablated
    (clipped to [−0.25, 1.25]; grey where the ablation interval reaches 0, so that the
    ratio means nothing), the same with the sink kept when the table has it, and Track A's
    pooled R² when the table has it. The backend is not touched."""
    import matplotlib

    L, H = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = lambda col: _grid(table, col, L, H)
    panels = [("dloss_ratio", "kernel / mean ablation", "RdBu_r", (-0.25, 1.25))]
    if "dloss_ratio_sink" in table:
        panels.append(("dloss_ratio_sink", "kernel + sink / mean ablation", "RdBu_r",
                       (-0.25, 1.25)))
    if "R2_pooled" in table:
        panels.append(("R2_pooled", "Track A pooled R²", "viridis", (0.0, 1.0)))
    fig = Figure(figsize=(3.4 * len(panels) + 1, 0.22 * L + 2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    matters = grid("ablation_matters") > 0
    for ax, (col, label, cmap, (lo, hi)) in zip(axes, panels):
        values = np.clip(grid(col), lo, hi)
        if col.startswith("dloss_ratio"):
            values = np.where(matters, values, np.nan)
        im = ax.imshow(values, cmap=matplotlib.colormaps[cmap].with_extremes(bad="0.85"),
                       vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    mode = table["mode"].iloc[0] if "mode" in table else "pooled"
    n = f", {int(table['n_seqs'].iloc[0])} sequences" if "n_seqs" in table else ""
    fig.suptitle(f"{title or 'kernel patching'} ({mode} g{n}; grey: ablation not "
                 "significant)", fontsize=10)
    fig.tight_layout()
    return fig


def _grid(table: pd.DataFrame, col: str, L: int, H: int) -> np.ndarray:
    out = np.full((L, H), np.nan)
    out[table["layer"].to_numpy(), table["head"].to_numpy()] = table[col].astype(float)
    return out


SPEC = AnalysisSpec(
    order=60,  # (where it is listed)
    name="kernel-patching", title="Kernel patching", compute=analyze,
    options=KernelPatchingOptions, needs_result=True, figure=plot_kernel_patching,
    columns=("dloss_patched", "dloss_ablated", "dloss_ratio"),
    layer_means=(("dloss_patched", "Δloss kernel"), ("dloss_ablated", "Δloss ablated"),
                 ("dloss_ratio", "kernel / ablation*")),
    valid=("ablation_matters", "ablation's interval reaches 0: the ratio means little"),
    head_rows=(("dloss_patched", "Δloss, kernel patched (nats)"),
               ("dloss_patched_sink", "Δloss, kernel patched, sink kept (nats)"),
               ("dloss_ablated", "Δloss, mean-ablated (nats)"),
               ("dloss_ratio", "kernel / ablation (normalised loss)"),
               ("dloss_ratio_sink", "kernel + sink / ablation")),
    guide="Each head's scores are replaced by its pooled kernel g(t − s) and the loss "
          "change is divided by that of mean-ablating the head: 0 means the kernel is all "
          "the head contributes, 1 means it does no better than the mean (the ratio means "
          "something only where ablation costs loss; grey cells in the figure).")


__all__ = ["SPEC", "KernelPatchingOptions", "analyze", "bootstrap", "kernel_patching",
           "patching_table", "plot_kernel_patching"]

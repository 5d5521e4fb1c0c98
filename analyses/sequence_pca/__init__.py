"""Sequence-dimension PCA, positional probes and seed 002's compression experiment.

**PCA across the sequence axis.** Seed 002 transposes an activation [pos, channel] and
treats every channel's time series as a sample: positions are the variables, samples are
(sequence, channel) pairs. With S = Σ x xᵀ and s = Σ x over samples x ∈ R^T, the
covariance is S/n − (s/n)(s/n)ᵀ and its top eigenvectors are the *temporal components*
(:class:`SequencePCA`). A rotary head's queries are q(t) = R(tθ_i)·c per frequency pair,
so across channels they are sinusoids at θ_i with random phases, whose covariance
Σ_i a_i² cos(θ_i (t − s)) has cos/sin eigenvectors at the planted θ_i (tested on
:func:`synthetic_rope_queries`). Sources: a layer's ``q`` or ``k`` (post-rotary, heads
pooled as channels; :func:`qk_sequence_pca` via
:func:`poskernel_tl.measurement.measure.forward_pass`) or the residual stream ``resid``
(``blocks.{L}.hook_resid_pre``; layer n_layers is the last block's ``hook_resid_post``).

**Positional probes.** Per residual layer, a linear probe (ridge least squares on the
standardised features, from streamed moments) and the seed's small MLP
``position_predictor`` (Linear d→d/2, ReLU, Linear d/2→T, softmax; read out as the
expected position Σ_t p(t)·t; trained on a seeded sample of positions with cross-entropy
plus the readout's L1 error, a few hundred seeded Adam steps) are fitted on the centering
sequences and scored on every position of the evaluation sequences: the mean absolute
position error in tokens (Haviv et al. 2022), beside chance (always predicting the middle,
(T−1)/2). Without centering sequences the first half of the evaluation sequences trains.

**Compression experiment** (not run by ``analyze``): seed 002's positional decoder on
temporal components of the input embeddings, in
:mod:`.compression`.

The numerical core (the sequence PCA from streamed moments, the probes' fits and their
reducers) is in :mod:`.stats`. This module runs the model: the passes, the table and the
figures.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.analyses.sequence_pca.stats import (
    PROBES,
    ProbeErrorReducer,
    ProbeMomentsReducer,
    SequenceCovReducer,
    SequencePCA,
    StreamBatch,
    fit_linear_probes,
    train_mlp_probe,
)
from poskernel_tl.data.inputs import as_tokens, check_tokens
from poskernel_tl.hooks import block_site, qk_hook_names
from poskernel_tl.measurement.measure import forward_pass
from poskernel_tl.plan.batching import batched
from poskernel_tl.progress import tqdm

N_REPORT = 3  # temporal components reported per layer in the table


# ------------------------------------------------------------------------ PCA
def qk_sequence_pca(model, tokens, source: str = "q", *, n_components: int | None = None,
                    batch_size: int = 4, progress: bool = True) -> list[SequencePCA]:
    """Per layer, the sequence PCA of the post-rotary ``q`` or ``k`` (heads pooled)."""
    ids = as_tokens(model, tokens)
    check_tokens(model, ids, "tokens")
    L, T = model.spec.n_layers, ids.shape[1]
    (red,) = forward_pass(model, ids, lambda: [SequenceCovReducer(L, T, model.device, source)],
                          batch_size, f"sequence PCA ({source})", progress)
    return red.result(n_components)


# --------------------------------------------------------------- residual pass
def stream_pass(model, ids: Int[Tensor, "batch pos"], reducers: list, batch_size: int,
                desc: str, progress: bool = True, with_q: bool = False) -> list:
    """Feed ``reducers`` a :class:`StreamBatch` per residual layer (0..n_layers) and
    batch, and per block's queries when ``with_q``. Hooks observe and return None."""
    bridge, dev = model.bridge, model.device
    n = bridge.cfg.n_layers
    names = {f"blocks.{layer}.hook_resid_pre": ("resid", layer) for layer in range(n)}
    names[f"blocks.{n - 1}.hook_resid_post"] = ("resid", n)
    if with_q:
        names.update({qk_hook_names(bridge, block_site(layer))[0]: ("q", layer)
                      for layer in range(n)})
    state: dict = {}

    def make(name: str, layer: int):
        def hook(x: Tensor, hook) -> None:  # aliases fire under their canonical name
            batch = StreamBatch(layer, name, x.reshape(x.shape[0], x.shape[1], -1),
                                state["index"])
            for r in reducers:
                r.update(batch)
        return hook

    def run(rows: tuple[int, ...], tokens: Tensor) -> None:
        state["index"] = torch.as_tensor(rows, device=dev)
        bridge(tokens)

    with bridge.hooks(fwd_hooks=[(n, make(*v)) for n, v in names.items()]):
        batched(ids, batch_size, dev, desc, progress, run)
    return reducers


# --------------------------------------------------------------------- probes
@dataclass
class ProbeResult:
    """MAE in tokens [probe, layer] (probes :data:`PROBES`), by position, and chance."""

    mae: Float[np.ndarray, "probe layer"]
    mae_by_pos: Float[np.ndarray, "probe layer pos"]
    mae_chance: float
    resid_pca: list[SequencePCA] = field(default_factory=list)
    q_pca: list[SequencePCA] = field(default_factory=list)


def position_probes(model, train_tokens, eval_tokens, *, ridge: float = 1e-2,
                    mlp_steps: int = 200, mlp_tokens: int = 4096, seed: int = 0,
                    batch_size: int = 4, progress: bool = True) -> ProbeResult:
    """Fit both probes per residual layer on ``train_tokens``, score them on
    ``eval_tokens`` and, from the same evaluation pass, the sequence PCA of the
    residual stream and of every block's queries."""
    tr, ev = as_tokens(model, train_tokens), as_tokens(model, eval_tokens)
    for ids, what in ((tr, "training tokens"), (ev, "evaluation tokens")):
        check_tokens(model, ids, what)
    T, dev = ev.shape[1], model.device
    if tr.shape[1] != T:
        raise ValueError(f"training sequences have T={tr.shape[1]}, evaluation T={T}")
    n_layers, d_model = model.bridge.cfg.n_layers, model.bridge.cfg.d_model
    per_seq = min(T, math.ceil(mlp_tokens / len(tr)))
    (mom,) = stream_pass(model, tr, [ProbeMomentsReducer(n_layers + 1, len(tr), T, d_model,
                                                         dev, per_seq, seed)],
                         batch_size, "probe training pass", progress)
    linear = fit_linear_probes(mom, ridge)
    y = mom.pick.reshape(-1)
    mlps = [train_mlp_probe(mom.sample[i].reshape(-1, d_model), y, T, steps=mlp_steps,
                            seed=seed + i)
            for i in tqdm(range(n_layers + 1), desc="MLP probes", disable=not progress)]
    del mom
    reds = [ProbeErrorReducer(linear, mlps, T, dev),
            SequenceCovReducer(n_layers + 1, T, dev, "resid"),
            SequenceCovReducer(n_layers, T, dev, "q")]
    stream_pass(model, ev, reds, batch_size, "probe evaluation pass", progress, with_q=True)
    err, count = reds[0].err.cpu().numpy(), reds[0].count.cpu().numpy()
    by_pos = err / count[None, :, None]
    t = np.arange(T)
    return ProbeResult(mae=by_pos.mean(-1), mae_by_pos=by_pos,
                       mae_chance=float(np.abs(t - (T - 1) / 2).mean()),
                       resid_pca=reds[1].result(N_REPORT), q_pca=reds[2].result(N_REPORT))


def probe_table(res: ProbeResult) -> pd.DataFrame:
    """One row per (layer, probe): ``mae_tokens``, ``mae_chance`` and, for the top
    temporal components of the residual stream (``resid_*``) and of the block's queries
    (``q_*``, NaN for the final residual layer), the explained-variance ratio
    (``_ev_i``), dominant frequency in cycles/token (``_freq_i``) and the position of
    the largest loading (``_peak_i``)."""
    rows = []
    for layer in range(res.mae.shape[1]):
        pcas = {"resid": res.resid_pca[layer],
                "q": res.q_pca[layer] if layer < len(res.q_pca) else None}
        extra = {}
        for src, pca in pcas.items():
            k = 0 if pca is None else len(pca.explained_variance_ratio)
            cols = {} if pca is None else {"ev": pca.explained_variance_ratio.cpu().numpy(),
                                           "freq": pca.dominant_frequencies(),
                                           "peak": pca.peak_positions()}
            for i in range(N_REPORT):
                for what in ("ev", "freq", "peak"):
                    extra[f"{src}_{what}_{i + 1}"] = float(cols[what][i]) if i < k \
                        else float("nan")
        for p, probe in enumerate(PROBES):
            rows.append(dict(layer=layer, probe=probe, mae_tokens=res.mae[p, layer],
                             mae_chance=res.mae_chance, **extra))
    return pd.DataFrame(rows)


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """``poskernel analyze seq-pca``: probes trained on the centering sequences (the
    first half of the evaluation sequences when there are none), scored on the
    evaluation sequences, with the sequence PCA of the evaluation pass."""
    model, centering_tokens = inputs.model, inputs.centering_tokens
    batch_size, progress = inputs.batch_size, inputs.progress
    ev = as_tokens(model, inputs.eval_tokens)
    if centering_tokens is None or len(centering_tokens) == 0:
        if len(ev) < 2:
            raise ValueError("need at least 2 sequences to train and score the probes")
        tr, ev = ev[: len(ev) // 2], ev[len(ev) // 2:]
    else:
        tr = centering_tokens
    return probe_table(position_probes(model, tr, ev, batch_size=batch_size,
                                       progress=progress))


# -------------------------------------------------------------------- figures
def plot_temporal_components(pca: SequencePCA, k: int = 4, title: str = "") -> Figure:
    """The top ``k`` temporal components against position."""
    fig = Figure(figsize=(7, 3.5))
    ax = fig.subplots()
    comps = pca.components.double().cpu().numpy()
    freqs = pca.dominant_frequencies()
    for i in range(min(k, len(comps))):
        ev = float(pca.explained_variance_ratio[i])
        ax.plot(comps[i], lw=1, label=f"PC{i + 1}: {100 * ev:.1f}%, f={freqs[i]:.3f} cyc/tok")
    ax.set_xlabel("position t")
    ax.set_ylabel("loading")
    ax.legend(fontsize=7)
    ax.set_title(title or "top temporal components (PCA across the sequence axis)")
    fig.tight_layout()
    return fig


def plot_probe_mae(table: pd.DataFrame, title: str = "") -> Figure:
    """Mean absolute position error per residual layer for each probe, with chance."""
    fig = Figure(figsize=(7, 3.5))
    ax = fig.subplots()
    for probe, style in zip(PROBES, ("-o", "-s")):
        t = table[table.probe == probe].sort_values("layer")
        ax.plot(t.layer, t.mae_tokens, style, ms=3, label=f"{probe} probe")
    ax.axhline(float(table.mae_chance.iloc[0]), color="k", ls="--", lw=0.8, label="chance")
    ax.set_xlabel("residual layer (0 = embeddings)")
    ax.set_ylabel("mean |error| (tokens)")
    ax.legend(fontsize=8)
    ax.set_title(title or "position decodable from the residual stream")
    fig.tight_layout()
    return fig


SPEC = AnalysisSpec(
    order=40,  # (where it is listed)
    name="seq-pca", title="Sequence PCA and positional probes", compute=analyze,
    figure=plot_probe_mae, columns=("probe", "mae_tokens"),
    guide="How well each layer's residual stream encodes absolute position: probes "
          "trained on the centering sequences, mean absolute error in tokens on the "
          "evaluation sequences, and the top temporal components of the sequence axis.")

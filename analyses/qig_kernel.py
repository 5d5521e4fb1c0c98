"""The QIG Fisher–Rao kernel (seed 003) as a position-free control for the Toeplitz R².

Seed 003 ("Pure QIG Kernel Template") builds attention without q·kᵀ: each token vector is
mapped to the probability simplex (softplus, then normalised), the pairwise Fisher–Rao
distance d(p, q) = 2·arccos(Σ_i √(p_i q_i)) gives logits −d/temperature, a softmax turns
them into weights, and the token vectors are updated by a convex mix with their weighted
average. Nothing in it depends on where a token sits: permuting the input positions
permutes the logits exactly. Its logits therefore measure how Toeplitz-looking a score
matrix is by chance, given only content — a null for the Track A R².

The seed also reports two quantities it calls "Φ" and "κ". Both are simple statistics,
and the seed itself labels them proxies: :func:`phi_proxy` is the mean absolute
off-diagonal correlation between feature dimensions across positions, :func:`kappa_proxy`
the mean L2 norm of the token vectors. They are computed and reported under those names,
nothing more.

The pair-permutation null (:func:`pair_permutation_null_r2`) applies one permutation π
to query and key positions alike and permutes the lower triangle's position pairs: its
values are kept (as a multiset), their offsets t − s are scrambled. For a symmetric score
matrix (the QIG logits) this is A[π(t), π(s)]; for any other matrix the lower triangle is
first reflected onto the upper one, so the null acts on unordered position pairs and
masked fills never enter the fit. That sets it apart from the position-permutation null
of ``pk.measure`` (:mod:`poskernel_tl.statistics.perm_null`, and the head view's on one
matrix), which fits A[π(t), π(s)] whole and so reads both triangles of a causal head's
product q·kᵀ.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from matplotlib.figure import Figure
from torch import Tensor, nn

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import r2_from_sums, shift_invariance_r2
from poskernel_tl.statistics.perm_null import joint_permutations, null_p_value, null_percentile

_CHUNK_ELEMENTS = 1 << 24  # bounds the [batch, chunk, pos, d] and [batch, perm, pair] temps


# ------------------------------------------------------------------ the seed's kernel
def project_to_simplex(
    x: Float[Tensor, "*batch d_model"], eps: float = 1e-8
) -> Float[Tensor, "*batch d_model"]:
    """The seed's simplex projection: softplus, normalise to sum 1, clamp below at eps."""
    x = F.softplus(x)
    x = x / (x.sum(dim=-1, keepdim=True) + eps)
    return x.clamp_min(eps)


def fisher_rao_distance(
    p: Float[Tensor, "... d_model"], q: Float[Tensor, "... d_model"], eps: float = 1e-8
) -> Float[Tensor, "..."]:
    """The seed's Fisher–Rao distance on the simplex, d = 2·arccos(Σ_i √(p_i q_i + eps)),
    with p and q broadcast against each other (the seed passes [B, T, 1, D] and
    [B, 1, T, D]), renormalised, and the inner product clamped to ±(1 − 1e-6) (so d(p, p)
    is ≈ 2.8e-3, not 0, exactly as in the seed)."""
    p = p / (p.sum(dim=-1, keepdim=True) + eps)
    q = q / (q.sum(dim=-1, keepdim=True) + eps)
    inner = torch.sum(torch.sqrt(p * q + eps), dim=-1).clamp(-1.0 + 1e-6, 1.0 - 1e-6)
    return 2.0 * torch.acos(inner)


def fisher_rao_distances(
    x: Float[Tensor, "batch pos d_model"], eps: float = 1e-8
) -> Float[Tensor, "batch query_pos key_pos"]:
    """All pairwise Fisher–Rao distances between the simplex projections of the token
    vectors of each sequence. Same formula as the seed's (B, T, T, D) broadcast, computed
    in blocks of query positions to bound memory; every entry is computed from its own
    two points only, so the result does not depend on the blocking."""
    b, T, d = x.shape
    p = project_to_simplex(x, eps)
    p = p / (p.sum(dim=-1, keepdim=True) + eps)  # the seed renormalises inside the distance
    chunk = max(1, _CHUNK_ELEMENTS // max(1, b * T * d))
    out = torch.empty(b, T, T, dtype=x.dtype, device=x.device)
    for i in range(0, T, chunk):
        prod = p[:, i:i + chunk, None, :] * p[:, None, :, :]
        inner = prod.add_(eps).sqrt_().sum(-1).clamp(-1.0 + 1e-6, 1.0 - 1e-6)
        out[:, i:i + chunk] = 2.0 * torch.acos(inner)
    return out


def qig_logits(
    x: Float[Tensor, "batch pos d_model"], temperature: float = 1.0
) -> Float[Tensor, "batch query_pos key_pos"]:
    """The seed's attention logits, −d_FR(i, j) / temperature (temperature floored at
    1e-6). Symmetric, no causal mask, no positional input: for a permutation π of the
    positions, ``qig_logits(x[:, π]) == qig_logits(x)[:, π][:, :, π]`` exactly."""
    return -fisher_rao_distances(x) / max(temperature, 1e-6)


def qfi_attention_weights(
    x: Float[Tensor, "batch pos d_model"], temperature: float = 1.0
) -> Float[Tensor, "batch query_pos key_pos"]:
    """The seed's attention weights: softmax over keys of :func:`qig_logits`."""
    return torch.softmax(qig_logits(x, temperature), dim=-1)


def qig_update(
    x: Float[Tensor, "batch pos d_model"],
    temperature: float = 1.0,
    update_rate: float = 0.5,
    residual_scale: float | Tensor = 1.0,
) -> Float[Tensor, "batch pos d_model"]:
    """One layer of the seed's kernel: values are the token vectors themselves,
    x_attn = w·x, then the convex mix x ← (1 − r)·x + r·x_attn and the small residual
    step x ← x + 0.01·residual_scale·(x_attn − x)."""
    w = qfi_attention_weights(x, temperature)
    x_attn = torch.einsum("bij,bjd->bid", w, x)
    x = (1.0 - update_rate) * x + update_rate * x_attn
    return x + 0.01 * residual_scale * (x_attn - x)


def phi_proxy(acts: Float[Tensor, "batch pos d_model"], eps: float = 1e-8
              ) -> Float[Tensor, " batch"]:
    """What the seed calls its "Φ" proxy: the mean absolute off-diagonal correlation
    between feature dimensions, across positions. A proxy, as the seed labels it."""
    T = acts.shape[1]
    x = acts - acts.mean(dim=1, keepdim=True)
    cov = torch.einsum("btd,bte->bde", x, x) / (T + eps)
    var = torch.diagonal(cov, dim1=-2, dim2=-1).clamp_min(eps)
    denom = torch.sqrt(var[:, :, None] * var[:, None, :]).clamp_min(eps)
    corr = (cov / denom).clamp(-1.0, 1.0)
    offdiag = corr - torch.diag_embed(torch.diagonal(corr, dim1=-2, dim2=-1))
    return offdiag.abs().mean(dim=(-2, -1))


def kappa_proxy(x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, " batch"]:
    """What the seed calls its "κ" proxy (a placeholder, in its words): the mean L2 norm
    of the token vectors."""
    return torch.norm(x, dim=-1).mean(dim=-1)


@dataclass(frozen=True)
class QIGKernelConfig:
    """The seed's configuration (basin_dim 64 in the seed; any width works here)."""

    basin_dim: int = 64
    layers: int = 2
    temperature: float = 1.0
    update_rate: float = 0.5


class QIGKernel(nn.Module):
    """The seed's minimal kernel: ``layers`` steps of :func:`qig_update` on basin
    coordinates, one scalar parameter (``residual_scale``), and the two proxies measured
    on the output (never optimised)."""

    def __init__(self, cfg: QIGKernelConfig = QIGKernelConfig()):
        super().__init__()
        self.cfg = cfg
        self.residual_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, basin_seq: Float[Tensor, "batch pos d_model"]
                ) -> tuple[Tensor, dict[str, Tensor]]:
        if basin_seq.shape[-1] != self.cfg.basin_dim:
            raise ValueError(f"expected basin_dim {self.cfg.basin_dim}, "
                             f"got {basin_seq.shape[-1]}")
        x = basin_seq
        for _ in range(self.cfg.layers):
            x = qig_update(x, self.cfg.temperature, self.cfg.update_rate,
                           self.residual_scale.to(x.dtype))
        return x, {"phi_proxy": phi_proxy(x), "kappa_proxy": kappa_proxy(x)}


def synthetic_basins(n_seqs: int, length: int, dim: int = 64, *, n_basins: int = 8,
                     spread: float = 0.5, scale: float = 2.0, seed: int = 0
                     ) -> Float[Tensor, "batch pos d_model"]:
    """Synthetic basin coordinates: ``n_basins`` centres ~ N(0, scale²·I) per sequence;
    each position independently picks a centre uniformly and adds N(0, spread²·I) noise.
    Positions are i.i.d., so nothing in the data depends on position."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_seqs, n_basins, dim, generator=g) * scale
    pick = torch.randint(0, n_basins, (n_seqs, length), generator=g)
    noise = torch.randn(n_seqs, length, dim, generator=g) * spread
    return torch.gather(centres, 1, pick[..., None].expand(-1, -1, dim)) + noise


# ------------------------------------------------------- joint-permutation null
def pair_permutation_null_r2(
    scores: Float[Tensor, "*batch query_pos key_pos"], n_perm: int = 200, seed: int = 0
) -> Float[Tensor, " perm *batch"]:
    """Toeplitz R² of ``scores`` after ``n_perm`` joint permutations of query and key
    positions (rows and columns by the same π). Acts on unordered pairs: the permuted
    entry (t, s), s < t, is the lower-triangle value of the pair {π(t), π(s)}, so the
    lower triangle keeps every value and only the offsets change (for a symmetric matrix,
    A[π(t), π(s)]). The sum of squares is invariant; only the per-lag sums are recomputed,
    by one gather per permutation. Float64."""
    T = scores.shape[-1]
    batch = scores.shape[:-2]
    dev = scores.device
    t, s = torch.tril_indices(T, T, -1, device=dev)  # row-major: pair index t(t−1)/2 + s
    vals = scores[..., t, s].double().reshape(-1, len(t))  # [B, N]
    sq = (vals * vals).sum(-1)
    lag_id = t - s - 1
    counts = lag_counts(T, device=dev)
    perms = joint_permutations(T, n_perm, seed).to(dev)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, vals.shape[0] * len(t)))
    out = []
    for i in range(0, n_perm, chunk):
        pi = perms[i:i + chunk]
        a, b = pi[:, t], pi[:, s]
        hi, lo = torch.maximum(a, b), torch.minimum(a, b)
        src = hi * (hi - 1) // 2 + lo  # [P, N]
        moved = vals[:, src]  # [B, P, N]
        s1 = torch.zeros(*moved.shape[:2], T - 1, dtype=torch.float64, device=dev)
        s1.index_add_(-1, lag_id, moved)
        out.append(r2_from_sums(s1, sq[:, None].expand(-1, s1.shape[1]), counts)[0])
    return torch.cat(out, dim=1).T.reshape(n_perm, *batch)


@dataclass
class PermutationNull:
    """Observed Toeplitz R², its joint-permutation null, and where it falls in it:
    ``percentile`` (mid-rank, 0–100) and the one-sided ``p_value``
    (1 + #null ≥ r2) / (1 + n_perm)."""

    r2: Tensor  # [*batch]
    null: Tensor  # [n_perm, *batch]
    percentile: Tensor  # [*batch]
    p_value: Tensor  # [*batch]


def r2_vs_permutation_null(
    scores: Float[Tensor, "*batch query_pos key_pos"], n_perm: int = 200, seed: int = 0
) -> PermutationNull:
    """Toeplitz R² of ``scores`` (:func:`poskernel_tl.fit.toeplitz.shift_invariance_r2`) and
    its percentile within :func:`pair_permutation_null_r2`."""
    r2, _ = shift_invariance_r2(scores)
    null = pair_permutation_null_r2(scores, n_perm, seed)
    host = (r2.cpu(), null.cpu())
    return PermutationNull(r2, null, torch.as_tensor(null_percentile(*host), device=r2.device),
                           torch.as_tensor(null_p_value(*host), device=r2.device))


# ------------------------------------------------------------ model, table, figure
def residual_streams(model, tokens: Int[Tensor, "batch pos"], layers: list[int] | None = None,
                     hook: str = "hook_resid_pre") -> dict[str, Tensor]:
    """The residual stream ``blocks.{L}.{hook}`` [batch, pos, d_model] of a
    :class:`poskernel_tl.LoadedModel` (or a bare TransformerBridge), read through
    TransformerLens' cache for the given layers (default: all)."""
    bridge = getattr(model, "bridge", model)
    n_layers = bridge.cfg.n_layers
    names = {f"blocks.{L}.{hook}" for L in (range(n_layers) if layers is None else layers)}
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    return {name: cache[name].detach() for name in sorted(names, key=_layer_of)}


def _layer_of(name: str) -> int:
    m = re.match(r"blocks\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def qig_table(sources: Mapping[str, Tensor], *, temperature: float = 1.0, n_perm: int = 200,
              seed: int = 0, kernel: QIGKernelConfig | None = None, model: str = "",
              dataset: str = "") -> pd.DataFrame:
    """One row per (source, sequence) for each token-vector tensor [batch, pos, d_model]
    in ``sources`` (synthetic basins, a layer's residual stream, ...): the Toeplitz R² of
    its QIG logits (``R2_qig``, lower triangle), the joint-permutation null's mean and
    1/50/99th percentiles, the percentile of R2_qig in it and the p-value, and the seed's
    "Φ" and "κ" proxies on the kernel's output (``phi_proxy``, ``kappa_proxy``; proxies
    only). ``layer`` is parsed from names like ``blocks.{L}.hook_resid_pre`` (−1 if
    none)."""
    rows = []
    for name, x in sources.items():
        x = x.float()
        test = r2_vs_permutation_null(qig_logits(x, temperature), n_perm, seed)
        cfg = kernel or QIGKernelConfig(basin_dim=x.shape[-1], temperature=temperature)
        with torch.no_grad():
            _, metrics = QIGKernel(cfg).to(x.device)(x)
        q = torch.quantile(test.null, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64,
                                                   device=test.null.device), dim=0)
        cpu = lambda t: t.detach().cpu().numpy()
        r2, pct, p = cpu(test.r2), cpu(test.percentile), cpu(test.p_value)
        mean, q = cpu(test.null.mean(0)), cpu(q)
        phi, kappa = cpu(metrics["phi_proxy"]), cpu(metrics["kappa_proxy"])
        for i in range(x.shape[0]):
            rows.append({"model": model, "dataset": dataset, "source": name,
                         "layer": _layer_of(name), "seq": i, "length": x.shape[1],
                         "d_model": x.shape[2], "temperature": temperature,
                         "R2_qig": r2[i], "null_mean": mean[i], "null_p01": q[0, i],
                         "null_p50": q[1, i], "null_p99": q[2, i], "percentile": pct[i],
                         "p_value": p[i], "n_perm": n_perm, "phi_proxy": phi[i],
                         "kappa_proxy": kappa[i]})
    return pd.DataFrame(rows)


def plot_qig_null(table: pd.DataFrame, title: str = "") -> Figure:
    """Per source: the joint-permutation null's 1–99% band and median (grey) and the
    Toeplitz R² of the QIG logits of each sequence (dots). Returns a figure; the
    matplotlib backend is not touched."""
    sources = list(dict.fromkeys(table["source"]))
    fig = Figure(figsize=(max(5.0, 0.6 * len(sources) + 2), 4))
    ax = fig.subplots()
    for i, name in enumerate(sources):
        sub = table[table["source"] == name]
        lo, mid, hi = sub.null_p01.mean(), sub.null_p50.mean(), sub.null_p99.mean()
        ax.vlines(i, lo, hi, color="0.6", lw=6, alpha=0.6,
                  label="null 1–99% (mean over seqs)" if i == 0 else None)
        ax.plot([i - 0.2, i + 0.2], [mid, mid], color="0.3", lw=1.5,
                label="null median" if i == 0 else None)
        jitter = np.linspace(-0.12, 0.12, len(sub)) if len(sub) > 1 else np.zeros(1)
        ax.plot(i + jitter, sub.R2_qig, "o", color="C3", ms=4,
                label="R² of QIG logits" if i == 0 else None)
    ax.set_xticks(range(len(sources)), sources, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("Toeplitz R² (lower triangle)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "QIG Fisher–Rao logits vs the joint position-permutation null")
    fig.tight_layout()
    return fig


# ----------------------------------------------------- poskernel analyze qig-control
MAX_SEQS = 8  # the QIG logits cost O(T²·d_model) per sequence and layer


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """QIG logits of each layer's residual stream (first ``MAX_SEQS`` evaluation
    sequences) through the Toeplitz R², against the joint position-permutation null."""
    model = inputs.model
    tokens = inputs.eval_tokens[:MAX_SEQS].to(model.device)
    streams = residual_streams(model, tokens)
    table = qig_table(streams, model=model.spec.name)
    return table.drop(columns=[c for c in ("model", "dataset") if c in table.columns])


SPEC = AnalysisSpec(
    order=50,  # (where it is listed)
    name="qig-control", title="Position-free control kernel (QIG)", compute=analyze,
    figure=plot_qig_null, columns=("source", "R2_qig", "p_value"),
    guide="Attention logits built without q·kᵀ from Fisher–Rao distances between residual "
          "streams, fitted by the same Toeplitz R² against a joint position-permutation "
          "null: how much shift invariance a position-free kernel shows by construction.")

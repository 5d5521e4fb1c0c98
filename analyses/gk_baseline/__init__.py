"""Positional baseline G_k (seed 000) and the four-term split of layer-0 scores.

For a model that adds a position table to its token embeddings (GPT-2's learned ``wpe``,
BERT's ``embeddings.position_embeddings``, or a sinusoidal table), the input of layer 0's
q/k is LN(x(t)) with x(t) = e(t) + p(t): GPT-2's block-0 ``ln_1``, BERT's embeddings
LayerNorm (post-LN; e(t) there is the word embedding plus the token-type row, see
:mod:`poskernel_tl.analyses.gk_baseline.split`). Seed 000 expands the logit
(e_x + P(i))ᵀ W_Q W_Kᵀ (e_y + P(j)) into a semantic, a token→position, a position→token
and a position→position term, and takes the average positional contribution at distance
k, G_k = mean_i P(i+k) P(i)ᵀ, as the baseline to subtract. LayerNorm is not linear in
e + p, so the split here is done on the layer's *actual* normalised input. With the
per-token statistics of the real input, σ(t)² = Var_features(e(t) + p(t)) + ε,

    LN(x(t)) = γ ⊙ (e(t) − ē(t)) / σ(t)  +  γ ⊙ (p(t) − p̄(t)) / σ(t)  +  β
             =            ẽ(t)           +            p̃(t)            +  β,

exactly (centring is linear; the bar is the mean over features). Then per head
q(t) = q_e(t) + q_p(t) + q_b with q_e = W_Qᵀ ẽ, q_p = W_Qᵀ p̃, q_b = W_Qᵀ β + b_Q (keys
alike), and the model's layer-0 score scale·q(t)·k(s) is the sum of six terms:

    semantic    q_e(t)·k_e(s)        tok_pos   q_e(t)·k_p(s)    (query token → key position)
    pos_tok     q_p(t)·k_e(s)        pos_pos   q_p(t)·k_p(s)
    key_bias    q_b·(k_e(s) + k_p(s))                    (depends on the key only)
    query_bias  (q_e(t) + q_p(t) + q_b)·k_b              (query only: softmax-invariant)

each times the model's scale (1/√d_head). The six sum to layer 0's q·kᵀ·scale on every
entry (tests: 1e-5; the table's ``split_max_abs_err`` records the gap on the entries
fitted). Note that p̃(t) carries 1/σ(t), which depends on the token at t: the real
position→position term is not a function of positions alone.

Seed 000's baseline is G_k projected per head through the query/key maps:
W_Q,hᵀ G̃_k W_K,h · scale (:func:`.split.projected_gram`; k < 0, a key after the query, uses
G̃_|k|ᵀ), with G̃_k = positional_gram(P̃, k) from :mod:`poskernel_tl.measurement.pe_kernel`; its trace
is S_PE(k), the head-projected kernel (:func:`.split.projected_pe_kernels`). P̃ is the position
table through the LayerNorm(s) on the way to each layer's q/k, normalised either by the
position vector's own statistics (``ln_stats="own"``, GPT-2's default) or by the real
per-position factor measured on the analysed sequences (``"data"``, the default for a
post-LN model; see :mod:`poskernel_tl.measurement.pe_kernel` for both and for what P̃ means in BERT's
layers > 0). ``pos_pos_gk_gain`` is the least-squares slope of the real term's lag means
on layer 0's S_PE: σ_p² / σ_x² on own statistics when e and p are orthogonal with
constant norms, and close to 1 on the data's (exactly 1 when σ(t) does not vary with
the token).

Per head the table reports, pooled over sequences and the strictly lower triangle (both
triangles for a bidirectional model, whose g and S_PE then have both signs of Δ, the
fit one g per signed lag; the diagonal is never fitted): Track A R² of the scores
(``R2_scores``), of the position→position term (``R2_pos_pos``), of the scores minus
that term (``R2_minus_pos_pos``) and minus the seed's lag-only baseline S_PE(Δ)
(``R2_minus_gk``); ``gk_explained`` = 1 − SS_tot(A − S_PE)/SS_tot(A); each term's
variance share ``share_<term>`` = Var(term) / Σ Var (non-negative, sums to 1) and
covariance share ``cov_share_<term>`` = Cov(term, A) / Var(A) (sums to 1 with the real
scores A, may be negative). Rows cover every (layer, head); the split columns are filled
for layer 0 only, the S_PE columns for every layer.

Sinusoidal GPT-2 and BERT models with a planted position→position term, the tests'
ground truth, are in ``tests/planted_gk.py``.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.gk_baseline.split import (
    TERMS,
    BlockParts,
    additive_kind,
    block_parts,
    position_scale,
    projected_pe_kernels,
    split_layer0_scores,
)
from poskernel_tl.data.inputs import as_tokens, check_tokens
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import lag_sums, r2_from_sums
from poskernel_tl.measurement.measure import choose_scores_path, forward_pass
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.plan.config import option


# ------------------------------------------------------------------- reducer
@dataclass
class GkBaselineResult:
    """Pooled statistics (numpy, float64); ``spe`` is S_PE[layer, head, Δ−1] and, for a
    bidirectional model, ``spe_back`` S_PE[layer, head, j] at Δ = −(j+1) (the fits then
    cover both triangles). ``ln_stats``: ``own`` or ``data`` (:mod:`.split`)."""

    r2_scores: Float[np.ndarray, "layer head_index"]
    r2_minus_gk: Float[np.ndarray, "layer head_index"]
    gk_explained: Float[np.ndarray, "layer head_index"]
    spe: Float[np.ndarray, "layer head_index lag"]
    r2_pos_pos: Float[np.ndarray, " head_index"]
    r2_minus_pos_pos: Float[np.ndarray, " head_index"]
    pos_pos_gk_gain: Float[np.ndarray, " head_index"]
    share: Float[np.ndarray, "term head_index"]
    cov_share: Float[np.ndarray, "term head_index"]
    split_max_abs_err: Float[np.ndarray, " head_index"]
    spe_back: Float[np.ndarray, "layer head_index lag"] | None = None
    ln_stats: str = "own"


def _signed_lag_sums(A: Tensor, two_sided: bool) -> tuple[Tensor, Tensor]:
    """Lag sums [..., lags] and sums of squares of the strictly lower triangle, followed
    (``two_sided``) by those of the strictly upper one (index j ↔ Δ = −(j+1))."""
    s1, sq = lag_sums(A)
    if not two_sided:
        return s1, sq
    s1_b, sq_b = lag_sums(A.transpose(-1, -2))
    return torch.cat([s1, s1_b], -1), sq + sq_b


class GkBaselineReducer:
    """Layer 0: the six-term split of every batch checked against the real scores, and
    the per-term moments; every layer: the scores' lag sums (for R² with and without
    S_PE). ``ids`` are the pass's token ids (indexed by the batch's sequence index).
    With ``spe_back`` (a bidirectional model) every statistic covers both triangles: the
    lag axis of the sums holds Δ = 1..T−1, then Δ = −1..−(T−1)."""

    def __init__(self, parts: BlockParts, ids: Int[Tensor, "batch pos"],
                 spe: Float[Tensor, "layer head_index lag"], device,
                 spe_back: Float[Tensor, "layer head_index lag"] | None = None):
        self.parts, self.ids = parts, ids.to(device)
        self.two_sided = spe_back is not None
        self.spe = torch.cat([spe, spe_back], -1) if self.two_sided else spe
        self.spe = self.spe.to(device, torch.float64)
        L, H, lags = self.spe.shape
        T = spe.shape[-1] + 1
        f64 = dict(dtype=torch.float64, device=device)
        lower = torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
        self.mask = lower | lower.T if self.two_sided else lower
        self.s1 = torch.zeros(L, H, lags, **f64)  # lag sums of the scores, per layer
        self.sq = torch.zeros(L, H, **f64)
        n = len(TERMS)
        self.t_sum = torch.zeros(n, H, **f64)  # Σ term, Σ term², Σ term·A (layer 0)
        self.t_sq = torch.zeros(n, H, **f64)
        self.t_cross = torch.zeros(n, H, **f64)
        self.pp_s1 = torch.zeros(H, lags, **f64)  # lag sums of the pos_pos term
        self.max_err = torch.zeros(H, **f64)
        self.n_seqs = 0

    def update(self, batch) -> None:
        A = torch.where(self.mask, batch.scores.double(), 0.0)  # [b, H, T, T]
        s1, sq = _signed_lag_sums(A, self.two_sided)
        self.s1[batch.layer] += s1.sum(0)
        self.sq[batch.layer] += sq.sum(0)
        if batch.layer != 0:
            return
        self.n_seqs += A.shape[0]
        terms = split_layer0_scores(self.parts, self.ids[batch.index])
        terms = torch.where(self.mask, terms, 0.0)
        self.t_sum += terms.sum((1, 3, 4))
        self.t_sq += (terms * terms).sum((1, 3, 4))
        self.t_cross += (terms * A).sum((1, 3, 4))
        self.pp_s1 += _signed_lag_sums(terms[TERMS.index("pos_pos")], self.two_sided)[0].sum(0)
        err = (terms.sum(0) - A).abs().amax((0, 2, 3))
        self.max_err = torch.maximum(self.max_err, err)

    def result(self, ln_stats: str = "own") -> GkBaselineResult:
        L, H, lags = self.spe.shape
        T = (lags // 2 if self.two_sided else lags) + 1
        counts = lag_counts(T, device=self.s1.device) * self.n_seqs
        counts = torch.cat([counts, counts]) if self.two_sided else counts
        N = counts.sum()
        r2, _ = r2_from_sums(self.s1, self.sq, counts)
        spe = self.spe
        # A − S_PE(Δ): lag sums shift by n(Δ)·S, squares by −2 Σ S·s1 + Σ n S²
        s1_gk = self.s1 - counts * spe
        sq_gk = self.sq - 2 * (spe * self.s1).sum(-1) + (counts * spe * spe).sum(-1)
        r2_gk, _ = r2_from_sums(s1_gk, sq_gk, counts)
        ss_tot = self.sq - self.s1.sum(-1) ** 2 / N
        ss_tot_gk = sq_gk - s1_gk.sum(-1) ** 2 / N
        gk_explained = 1 - ss_tot_gk / ss_tot
        # layer 0: the pos_pos term and the scores minus it
        pp = TERMS.index("pos_pos")
        r2_pp, _ = r2_from_sums(self.pp_s1, self.t_sq[pp], counts)
        a_sum = self.s1[0].sum(-1)
        sq_rest = self.sq[0] - 2 * self.t_cross[pp] + self.t_sq[pp]
        r2_rest, _ = r2_from_sums(self.s1[0] - self.pp_s1, sq_rest, counts)
        g_pp = self.pp_s1 / counts
        s0 = spe[0]
        gain = (g_pp * s0 * counts).sum(-1) / (s0 * s0 * counts).sum(-1)
        var = self.t_sq / N - (self.t_sum / N) ** 2
        cov = self.t_cross / N - self.t_sum / N * (a_sum / N)
        var_a = self.sq[0] / N - (a_sum / N) ** 2
        np_ = lambda t: t.detach().cpu().numpy()
        return GkBaselineResult(
            r2_scores=np_(r2), r2_minus_gk=np_(r2_gk), gk_explained=np_(gk_explained),
            spe=np_(spe[..., :T - 1]), r2_pos_pos=np_(r2_pp), r2_minus_pos_pos=np_(r2_rest),
            pos_pos_gk_gain=np_(gain), share=np_(var / var.sum(0)), cov_share=np_(cov / var_a),
            split_max_abs_err=np_(self.max_err),
            spe_back=np_(spe[..., T - 1:]) if self.two_sided else None, ln_stats=ln_stats)


# --------------------------------------------------------------- entry points
@dataclass(frozen=True)
class GkOptions:
    ln_stats: Literal["auto", "own", "data"] = option(
        "auto", "LayerNorm statistics of the position vectors in S_PE: own (p alone), data "
                "(measured on the sequences), auto (data for post-LN models such as BERT, "
                "own for GPT-2)")


def gk_baseline(model, tokens, *, batch_size: int = 4, progress: bool = True,
                ln_stats: str = "auto") -> GkBaselineResult:
    """Split layer 0's scores of ``tokens`` (int tensor [n, T] or strings) on a
    :class:`poskernel_tl.LoadedModel` with an additive position table, and fit every
    layer's scores with and without the head-projected G_k baseline S_PE (both signs of
    Δ for a bidirectional model), its position vectors on the ``ln_stats`` statistics
    (:mod:`poskernel_tl.analyses.gk_baseline.split`)."""
    parts = block_parts(model, 0)
    ids = as_tokens(model, tokens)
    check_tokens(model, ids, "tokens")
    Geometry.of(model.spec, ids.shape[1]).require_whole("gk-baseline")
    scale = position_scale(model, ids, ln_stats, batch_size)
    spe, spe_back = projected_pe_kernels(model, ids.shape[1], scale)
    hook = choose_scores_path(model, "auto")
    make = lambda: [GkBaselineReducer(parts, ids, spe, model.device, spe_back)]
    (red,) = forward_pass(model, ids, make, batch_size, "gk-baseline", progress, hook)
    return red.result("own" if scale is None else "data")


def gk_table(res: GkBaselineResult) -> pd.DataFrame:
    """One row per (layer, head); split columns (layer 0) are NaN for deeper layers, the
    S_PE(−1) column for a causal model."""
    L, H = res.r2_scores.shape
    rows, nan = [], float("nan")
    for layer in range(L):
        for h in range(H):
            row = dict(layer=layer, head=h, R2_scores=res.r2_scores[layer, h],
                       R2_minus_gk=res.r2_minus_gk[layer, h],
                       gk_explained=res.gk_explained[layer, h],
                       spe_std=res.spe[layer, h].std(), spe_lag1=res.spe[layer, h, 0],
                       spe_back_lag1=nan if res.spe_back is None else res.spe_back[layer, h, 0],
                       two_sided=res.spe_back is not None, ln_stats=res.ln_stats)
            zero = layer == 0
            row.update(
                R2_pos_pos=res.r2_pos_pos[h] if zero else nan,
                R2_minus_pos_pos=res.r2_minus_pos_pos[h] if zero else nan,
                pos_pos_gk_gain=res.pos_pos_gk_gain[h] if zero else nan,
                split_max_abs_err=res.split_max_abs_err[h] if zero else nan)
            for i, term in enumerate(TERMS):
                row[f"share_{term}"] = res.share[i, h] if zero else nan
            for i, term in enumerate(TERMS):
                row[f"cov_share_{term}"] = res.cov_share[i, h] if zero else nan
            rows.append(row)
    return pd.DataFrame(rows)


def analyze(inputs: AnalysisInputs, options: GkOptions) -> pd.DataFrame:
    """``poskernel analyze gk-baseline``: :func:`gk_table` of the evaluation sequences
    (the centering sequences are not used)."""
    additive_kind(inputs.model.hf_model)  # a clear error before any forward pass
    return gk_table(gk_baseline(inputs.model, inputs.eval_tokens, batch_size=inputs.batch_size,
                                progress=inputs.progress, ln_stats=options.ln_stats))


def plot_term_shares(table: pd.DataFrame, column: str = "share", title: str = "") -> Figure:
    """Stacked bars per layer-0 head of each term's variance share (``column="share"``)
    or covariance share with the real scores (``"cov_share"``). The backend is not
    touched."""
    t0 = table[table["layer"] == 0].sort_values("head")
    fig = Figure(figsize=(max(6.0, 0.6 * len(t0) + 3), 4))
    ax = fig.subplots()
    x = np.arange(len(t0))
    pos = np.zeros(len(t0))
    neg = np.zeros(len(t0))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    for term, color in zip(TERMS, colors):
        v = t0[f"{column}_{term}"].to_numpy(dtype=float)
        base = np.where(v >= 0, pos, neg)
        ax.bar(x, v, bottom=base, color=color, label=term.replace("_", "→")
               if term in ("tok_pos", "pos_tok") else term)
        pos, neg = np.where(v >= 0, pos + v, pos), np.where(v < 0, neg + v, neg)
    ax.set_xticks(x, [f"H{h}" for h in t0["head"]])
    ax.set_xlabel("layer-0 head")
    ax.set_ylabel("variance share" if column == "share" else "Cov(term, scores) / Var(scores)")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "layer-0 score split by term")
    fig.tight_layout()
    return fig


SPEC = AnalysisSpec(
    order=20,  # (where it is listed)
    bidirectional=True,
    name="gk-baseline", title="Positional baseline G_k", compute=analyze, options=GkOptions,
    figure=lambda table, title="": plot_term_shares(table, title=title),
    columns=("R2_scores", "R2_minus_gk", "gk_explained"),
    head_rows=(("R2_scores", "R² of the scores"), ("R2_minus_gk", "R² after subtracting G_k"),
               ("gk_explained", "share explained by G_k")),
    guide="For a learned-absolute-PE model, the head-projected positional Gram "
          "E[P(i+k)P(i)ᵀ] and its share of the skip-k logits, split into four terms.")


__all__ = ["SPEC", "GkBaselineReducer", "GkBaselineResult", "GkOptions", "analyze",
           "gk_baseline", "gk_table", "plot_term_shares"]

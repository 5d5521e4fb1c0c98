"""Positional baseline G_k (seed 000) and the four-term split of layer-0 scores.

For a model that adds a position table to its token embeddings (GPT-2's learned ``wpe``,
or a sinusoidal table), the residual stream entering block 0 is x(t) = e(t) + p(t).
Seed 000 expands the logit (e_x + P(i))ᵀ W_Q W_Kᵀ (e_y + P(j)) into a semantic, a
token→position, a position→token and a position→position term, and takes the average
positional contribution at distance k, G_k = mean_i P(i+k) P(i)ᵀ, as the baseline to
subtract. GPT-2 normalises x before W_Q/W_K, and LayerNorm is not linear in e + p, so
the split here is done on the block's *actual* normalised input. With the per-token
statistics of the real input, σ(t)² = Var_features(e(t) + p(t)) + ε (the model's own),

    LN(x(t)) = γ ⊙ (e(t) − ē(t)) / σ(t)  +  γ ⊙ (p(t) − p̄(t)) / σ(t)  +  β
             =            ẽ(t)           +            p̃(t)            +  β,

exactly (centring is linear; the bar is the mean over features). Then per head
q(t) = q_e(t) + q_p(t) + q_b with q_e = W_Qᵀ ẽ, q_p = W_Qᵀ p̃, q_b = W_Qᵀ β + b_Q (keys
alike), and the model's layer-0 score scale·q(t)·k(s) is the sum of six terms:

    semantic    q_e(t)·k_e(s)        tok_pos   q_e(t)·k_p(s)    (query token → key position)
    pos_tok     q_p(t)·k_e(s)        pos_pos   q_p(t)·k_p(s)
    key_bias    q_b·(k_e(s) + k_p(s))                    (depends on the key only)
    query_bias  (q_e(t) + q_p(t) + q_b)·k_b              (query only: softmax-invariant)

each times the model's scale (1/√d_head for GPT-2). The six sum to ``hook_attn_scores``
of layer 0 on the strictly lower triangle (tests: 1e-5; the table's
``split_max_abs_err`` records the gap on the data measured). Note that p̃(t) carries
1/σ(t), which depends on the token at t: the real position→position term is not a
function of positions alone.

Seed 000's baseline is G_k projected per head through the query/key maps:
W_Q,hᵀ G̃_k W_K,h · scale (:func:`projected_gram`), with G̃_k = positional_gram(LN(P), k)
from :mod:`poskernel_tl.pe_kernel`; its trace is S_PE(k), the head-projected kernel
(:func:`projected_pe_kernel`, equal to ``pe_kernel.head_projected_pe_kernel`` on an
unprocessed model, but read from the bridge's own weights so that it also holds under
``enable_compatibility_mode()``, which folds the LayerNorm into W_Q). G̃_k normalises the
position vector by its own statistics, so it misses the 1/σ(t) above by a factor;
``pos_pos_gk_gain`` is the least-squares slope of the real term's lag means on S_PE
(σ_p² / σ_x² when e and p are orthogonal with constant norms).

Per head the table reports, pooled over sequences and the strictly lower triangle:
Track A R² of the scores (``R2_scores``), of the position→position term
(``R2_pos_pos``), of the scores minus that term (``R2_minus_pos_pos``) and minus the
seed's lag-only baseline S_PE(Δ) (``R2_minus_gk``); ``gk_explained`` = 1 −
SS_tot(A − S_PE)/SS_tot(A); each term's variance share ``share_<term>`` = Var(term) /
Σ Var (non-negative, sums to 1) and covariance share ``cov_share_<term>`` =
Cov(term, A) / Var(A) (sums to 1 with the real scores A, may be negative). Rows cover
every (layer, head); the split columns are filled for layer 0 only, the S_PE columns for
every layer.

Sinusoidal GPT-2 models with a planted position→position term, for tests, are in
:mod:`poskernel_tl.analyses.gk_baseline_planted`.
"""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from matplotlib.figure import Figure
from torch import Tensor

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.measure import as_tokens, check_tokens, choose_scores_path, forward_pass
from poskernel_tl.pe_kernel import (
    NoPositionTableError,
    layer_positions,
    positional_gram,
    unwrap,
)
from poskernel_tl.toeplitz import lag_counts, lag_sums, r2_from_sums, shift_invariance_r2

TERMS = ("semantic", "tok_pos", "pos_tok", "pos_pos", "key_bias", "query_bias")


# ------------------------------------------------------------------- the split
@dataclass
class BlockParts:
    """One block's input LayerNorm and q/k maps plus the embedding tables (float64), as
    the bridge computes with them (with ``enable_compatibility_mode()`` the LayerNorm's
    affine map is folded into W_Q/b_Q, and the HF module's ``c_attn`` is then stale)."""

    wte: Float[Tensor, "d_vocab d_model"]
    wpe: Float[Tensor, "n_ctx d_model"]
    ln: torch.nn.Module
    W_Q: Float[Tensor, "head_index d_model d_head"]
    W_K: Float[Tensor, "head_index d_model d_head"]
    b_Q: Float[Tensor, "head_index d_head"]
    b_K: Float[Tensor, "head_index d_head"]
    scale: float

    @property
    def ln_weight(self) -> Tensor:
        return self.ln.weight.detach().to(self.W_Q)

    @property
    def ln_bias(self) -> Tensor:
        b = self.ln.bias
        return torch.zeros_like(self.ln_weight) if b is None else b.detach().to(self.W_Q)


def _check_additive(hf_model) -> None:
    body = getattr(hf_model, "transformer", hf_model)
    ok = all(hasattr(body, n) for n in ("wte", "wpe", "h"))
    if not ok or not hasattr(body.h[0], "ln_1"):
        raise NoPositionTableError(
            f"{type(hf_model).__name__} has no additive position table (a GPT-2-style "
            "transformer.wpe added to the token embeddings): G_k and the four-term split "
            "apply to learned-absolute or sinusoidal tables, not to rotary or NoPE models")


def block_parts(model, layer: int = 0, device=None) -> BlockParts:
    """The weights of ``layer`` that the split and S_PE need, read from the bridge of a
    :class:`poskernel_tl.LoadedModel` (raises :class:`NoPositionTableError`, a
    ValueError, for a model without an additive position table)."""
    _check_additive(model.hf_model)
    br = model.bridge
    f64 = dict(dtype=torch.float64, device=device if device is not None else model.device)
    attn = br.blocks[layer].attn
    cfg = model.hf_model.config
    d_head = attn.W_Q.shape[-1]
    scale = 1.0 / math.sqrt(d_head) if getattr(cfg, "scale_attn_weights", True) else 1.0
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        scale /= layer + 1
    get = lambda t: t.detach().to(**f64)
    return BlockParts(wte=get(br.W_E), wpe=get(br.W_pos),
                      ln=unwrap(br.blocks[layer].ln1), W_Q=get(attn.W_Q), W_K=get(attn.W_K),
                      b_Q=get(attn.b_Q), b_K=get(attn.b_K), scale=scale)


def split_layer0_scores(
    parts: BlockParts, ids: Int[Tensor, "batch pos"]
) -> Float[Tensor, "term batch head_index query_pos key_pos"]:
    """The six terms of layer 0's scores (order :data:`TERMS`) from block 0's
    :func:`block_parts`, float64, every entry (no causal mask: read the strictly lower
    triangle)."""
    T = ids.shape[1]
    if T > parts.wpe.shape[0]:
        raise ValueError(f"T={T} exceeds the position table ({parts.wpe.shape[0]} rows)")
    e = parts.wte[ids.to(parts.wte.device)]  # [b, t, D]
    p = parts.wpe[:T].expand_as(e)
    x = e + p
    inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + parts.ln.eps)  # 1/σ(t)
    e_n = (e - e.mean(-1, keepdim=True)) * inv * parts.ln_weight
    p_n = (p - p.mean(-1, keepdim=True)) * inv * parts.ln_weight
    proj = lambda v, W: torch.einsum("btm,hmd->bthd", v, W)
    q_e, q_p = proj(e_n, parts.W_Q), proj(p_n, parts.W_Q)  # [b, t, H, d]
    k_e, k_p = proj(e_n, parts.W_K), proj(p_n, parts.W_K)
    q_b = torch.einsum("m,hmd->hd", parts.ln_bias, parts.W_Q) + parts.b_Q  # [H, d]
    k_b = torch.einsum("m,hmd->hd", parts.ln_bias, parts.W_K) + parts.b_K
    qk = lambda q, k: torch.einsum("bthd,bshd->bhts", q, k)
    key_bias = torch.einsum("hd,bshd->bhs", q_b, k_e + k_p)[:, :, None, :].expand(-1, -1, T, -1)
    query_bias = torch.einsum("bthd,hd->bht", q_e + q_p + q_b, k_b)[..., None].expand(
        -1, -1, -1, T)
    terms = [qk(q_e, k_e), qk(q_e, k_p), qk(q_p, k_e), qk(q_p, k_p), key_bias, query_bias]
    return torch.stack(terms) * parts.scale


def _position_qk(parts: BlockParts, length: int) -> tuple[Tensor, Tensor]:
    """W_Q,hᵀ p̃(t) and W_K,hᵀ p̃(t) [head_index, pos, d_head] with p̃ = LN(p) on its own
    statistics, without β or biases (:func:`poskernel_tl.pe_kernel.layer_positions`)."""
    P = parts.wpe[:length]
    x = layer_positions(parts.ln, P.cpu(), include_bias=False).to(P)
    return (torch.einsum("tm,hmd->htd", x, parts.W_Q),
            torch.einsum("tm,hmd->htd", x, parts.W_K))


def projected_gram(model, k: int, length: int, layer: int = 0
                   ) -> Float[Tensor, "head_index d_head d_head"]:
    """Seed 000's G_k projected per head: W_Q,hᵀ G̃_k W_K,h · scale, with
    G̃_k = positional_gram(LN_layer(P[:length]), k) (float64). Its trace is S_PE(k)
    (:func:`projected_pe_kernel`)."""
    parts = block_parts(model, layer)
    P = parts.wpe[:length]
    G = positional_gram(layer_positions(parts.ln, P.cpu(), include_bias=False).to(P), k)
    return parts.W_Q.transpose(1, 2) @ G @ parts.W_K * parts.scale


def projected_pe_kernel(model, length: int) -> Float[Tensor, "layer head_index lag"]:
    """S_PE[layer, head, Δ−1] = mean_t scale·q_p(t)·k_p(t−Δ) (Δ = 1..length−1): the
    lag means of the position-only logits, i.e. the ``g`` of
    :func:`poskernel_tl.shift_invariance_r2` on them, which is the trace of
    :func:`projected_gram`. Read from the bridge's weights, so it holds with or without
    compatibility mode (equal to :func:`poskernel_tl.pe_kernel.head_projected_pe_kernel`
    on an unprocessed model)."""
    out = []
    for layer in range(model.bridge.cfg.n_layers):
        parts = block_parts(model, layer)
        if length > parts.wpe.shape[0]:
            raise ValueError(f"T={length} exceeds the position table ({parts.wpe.shape[0]})")
        q, k = _position_qk(parts, length)
        _, g = shift_invariance_r2(q @ k.transpose(1, 2) * parts.scale)
        out.append(g)
    return torch.stack(out)


# ------------------------------------------------------------------- reducer
@dataclass
class GkBaselineResult:
    """Pooled statistics (numpy, float64); ``spe`` is S_PE[layer, head, Δ−1]."""

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


class GkBaselineReducer:
    """Layer 0: the six-term split of every batch checked against the real scores, and
    the per-term moments; every layer: the scores' lag sums (for R² with and without
    S_PE). ``ids`` are the pass's token ids (indexed by the batch's sequence index)."""

    def __init__(self, parts: BlockParts, ids: Int[Tensor, "batch pos"],
                 spe: Float[Tensor, "layer head_index lag"], device):
        self.parts, self.ids = parts, ids.to(device)
        self.spe = spe.to(device, torch.float64)
        L, H, lags = spe.shape
        T = lags + 1
        f64 = dict(dtype=torch.float64, device=device)
        self.mask = torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
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
        s1, sq = lag_sums(A)
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
        self.pp_s1 += lag_sums(terms[TERMS.index("pos_pos")])[0].sum(0)
        err = (terms.sum(0) - A).abs().amax((0, 2, 3))
        self.max_err = torch.maximum(self.max_err, err)

    def result(self) -> GkBaselineResult:
        L, H, lags = self.spe.shape
        T = lags + 1
        counts = lag_counts(T, device=self.s1.device) * self.n_seqs
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
            spe=np_(spe), r2_pos_pos=np_(r2_pp), r2_minus_pos_pos=np_(r2_rest),
            pos_pos_gk_gain=np_(gain), share=np_(var / var.sum(0)), cov_share=np_(cov / var_a),
            split_max_abs_err=np_(self.max_err))


# --------------------------------------------------------------- entry points
def gk_baseline(model, tokens, *, batch_size: int = 4, progress: bool = True
                ) -> GkBaselineResult:
    """Split layer 0's scores of ``tokens`` (int tensor [n, T] or strings) on a
    :class:`poskernel_tl.LoadedModel` with an additive position table, and fit every
    layer's scores with and without the head-projected G_k baseline S_PE."""
    parts = block_parts(model, 0)
    ids = as_tokens(model, tokens)
    check_tokens(model, ids, "tokens")
    spe = projected_pe_kernel(model, ids.shape[1])
    hook = choose_scores_path(model, "auto")
    (red,) = forward_pass(model, ids, lambda: [GkBaselineReducer(parts, ids, spe, model.device)],
                          batch_size, "gk-baseline", progress, hook)
    return red.result()


def gk_table(res: GkBaselineResult) -> pd.DataFrame:
    """One row per (layer, head); split columns (layer 0) are NaN for deeper layers."""
    L, H = res.r2_scores.shape
    rows = []
    for layer in range(L):
        for h in range(H):
            row = dict(layer=layer, head=h, R2_scores=res.r2_scores[layer, h],
                       R2_minus_gk=res.r2_minus_gk[layer, h],
                       gk_explained=res.gk_explained[layer, h],
                       spe_std=res.spe[layer, h].std(), spe_lag1=res.spe[layer, h, 0])
            zero = layer == 0
            nan = float("nan")
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


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """``poskernel analyze gk-baseline``: :func:`gk_table` of the evaluation sequences
    (the centering sequences are not used)."""
    _check_additive(inputs.model.hf_model)  # a clear error before any forward pass
    return gk_table(gk_baseline(inputs.model, inputs.eval_tokens,
                                batch_size=inputs.batch_size, progress=inputs.progress))


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
    name="gk-baseline", title="Positional baseline G_k", compute=analyze,
    figure=lambda table, title="": plot_term_shares(table, title=title),
    columns=("R2_scores", "R2_minus_gk", "gk_explained"),
    head_rows=(("R2_scores", "R² of the scores"), ("R2_minus_gk", "R² after subtracting G_k"),
               ("gk_explained", "share explained by G_k")),
    guide="For a learned-absolute-PE model, the head-projected positional Gram "
          "E[P(i+k)P(i)ᵀ] and its share of the skip-k logits, split into four terms.")


__all__ = ["SPEC", "TERMS", "GkBaselineReducer", "GkBaselineResult",
           "BlockParts", "NoPositionTableError", "analyze", "gk_baseline", "gk_table",
           "block_parts", "projected_pe_kernel", "plot_term_shares", "projected_gram",
           "split_layer0_scores"]

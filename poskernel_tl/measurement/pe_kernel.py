"""The head-projected positional kernel of learned-absolute-PE models (GPT-2, BERT).

Seed 000's average positional contribution at distance k is

    G_k = mean_i P(i+k) P(i)ᵀ          (i = 0 .. n−1−k)            [positional_gram]

and the position-position term of head h's logit between query t and key t−Δ is
p̃(t)ᵀ W_Q,h W_K,hᵀ p̃(t−Δ) / √d_head, with p̃(t) the position vector as it reaches the
layer's W_Q/W_K (defined below). Its average over query positions is the head-projected
kernel

    S_PE(Δ) = mean_t ⟨W_Q,hᵀ p̃(t), W_K,hᵀ p̃(t−Δ)⟩ / √d_head
            = tr(W_Q,hᵀ G̃_Δ W_K,h) / √d_head = ⟨G̃_Δ, W_Q,h W_K,hᵀ⟩_F / √d_head,

where G̃_Δ = positional_gram(P̃, Δ) [pe_kernel_from_gram]. Forming G̃_Δ for every lag costs
T·d_model² per lag, so the kernels are evaluated as a cross-correlation of the projected
vectors with one FFT per layer (tests check it against the gram identity and against a
direct loop over t). A bidirectional model (BERT) has logits for keys after the query as
well: ``s_pe_back[..., j−1]`` is S_PE(−j) = mean_t ⟨q̃(t), k̃(t+j)⟩ / √d_head (j = 1..T−1)
and ``s_pe_self`` is S_PE(0), the project's ``_back`` / ``_self`` convention.

What p̃_ℓ(t) is. Every LayerNorm between the position table and layer ℓ's W_Q/W_K,
LN_k(v) = γ_k ⊙ (v − v̄)/σ_k + β_k (v̄: mean over features), acts on a sum of which the
position row p(t) is one term. Centring and γ are linear, so the position term leaves it as
γ_k ⊙ (p − p̄)/σ_k exactly, where σ_k is the standard deviation of the LayerNorm's *whole*
input (tokens and everything else included), not of p. The LayerNorms on the way are

* GPT-2 (pre-LN): the residual stream carries p(t) unnormalised; the only LayerNorm
  between it and layer ℓ's q/k is block ℓ's ``ln_1``.
* BERT (post-LN): p(t) enters through the embeddings LayerNorm,
  x_0 = LN_emb(tok + pos + type), and each block re-normalises the residual stream,
  x ← LN_a(x + attn(x)), x ← LN_m(x + mlp(x)); the direct (skip-connection) route to
  layer ℓ passes LN_emb, then LN_a and LN_m of blocks 0..ℓ−1 (2ℓ + 1 LayerNorms).

Composing them, p̃_ℓ(t) = A_ℓ p(t) · c_ℓ(t), with A_ℓ the composition of the centring and
γ maps of the route and c_ℓ(t) the product of the 1/σ_k. Where c comes from:

* ``ln_scale=None`` (no data; the default, and every GPT-2 number so far): each LayerNorm
  normalises the carried vector by its own σ, p̃ = LN'_k(…LN'_1(p)) with LN' = LN without
  β. For GPT-2 this is p̃ = ln_1(p) − β.
* ``ln_scale`` = :func:`position_ln_stats` (the model's real statistics):
  c_ℓ(t) = mean_x Π_k 1/σ_k(x, t), σ_k(x, t) = (Var_features(input of LN_k) + ε)^½ measured
  on sequences x at position t. p̃_ℓ(t) is then exactly the mean over those sequences of
  the position table's direct-route component of layer ℓ's input.

For GPT-2 and for layer 0 of BERT the direct route is the only one: the layer's input is
(LN of) a sum that contains A_ℓ p(t) c(x, t) as a term, and the real-statistics p̃ is its
per-position mean. For BERT's layers > 0 it is an approximation: the attention and MLP
outputs written before layer ℓ are computed from p too (through softmax and GELU), and
that rewritten position signal is not in p̃_ℓ. We project the direct route rather than
the per-position mean of the layer's input μ_ℓ(t) (what Track B's centering removes,
measured by ``analyses/mean_field``) because μ_ℓ also holds the mean content (the average
token and any position-dependent token statistics), so S_PE would stop being "the model's
own position table, projected"; the direct route reduces to the exact positional
component at layer 0 and, for GPT-2, to the definition above.

By default the kernel is the pure position-position term: the LayerNorm shift β and the
q/k biases are left out (under TransformerLens' LN folding β becomes part of b_Q, b_K, so
"no biases" means neither); ``include_bias=True`` adds the last LayerNorm's β and the q/k
biases (BERT: the shifts of earlier LayerNorms on the route are not carried).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from poskernel_tl.errors import UserError
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.loading import position_table
from poskernel_tl.plan.batching import batched
from poskernel_tl.reducers.lag_sums import lag_sums
from poskernel_tl.schema import Part, stored


@dataclass
class PEKernel(Part):
    """S_PE(Δ) of every head, for learned-absolute-position models; a bidirectional model
    also has S_PE for keys after the query (``s_pe_back``, Δ = −1..−(T−1)) and S_PE(0)."""

    NAME = "pe_kernel"
    s_pe: Float[np.ndarray, "layer head_index lag"] = stored("pe_kernel.npz", "s_pe",
                                                             finite=True)
    s_pe_back: Float[np.ndarray, "layer head_index lag"] | None = stored(
        "pe_kernel.npz", "s_pe_back", finite=True, default=None)
    s_pe_self: Float[np.ndarray, "layer head_index"] | None = stored(
        "pe_kernel.npz", "s_pe_self", finite=True, default=None)


class NoPositionTableError(UserError):
    """The model has no learned absolute position table (e.g. a rotary or NoPE model)."""


def positional_gram(
    P: Float[Tensor, "pos d_model"] | Float[np.ndarray, "pos d_model"], k: int
) -> Float[Tensor, "d_model d_model"] | Float[np.ndarray, "d_model d_model"]:
    """Seed 000's G_k = mean_i P(i+k) P(i)ᵀ over i = 0..n−1−k (row index = P(i+k) feature)."""
    n = P.shape[0]
    if not 0 <= k < n:
        raise UserError(f"lag k={k} must lie in [0, {n - 1}] for {n} positions")
    return P[k:].T @ P[: n - k] / (n - k)


def pe_kernel_from_gram(
    G: Float[Tensor, "d_model d_model"],
    W_Q: Float[Tensor, "d_model d_head"],
    W_K: Float[Tensor, "d_model d_head"],
) -> float:
    """S_PE(Δ) = tr(W_Qᵀ G_Δ W_K) / √d_head for G_Δ = positional_gram(P̃, Δ) (Conv1D layout:
    q = p̃ @ W_Q)."""
    return float(torch.trace(W_Q.T @ G @ W_K)) / math.sqrt(W_Q.shape[1])


def unwrap(module: nn.Module) -> nn.Module:
    """The HF module behind a TransformerBridge component (booting a bridge replaces the
    HF model's submodules with wrappers that keep the original)."""
    return getattr(module, "original_component", None) or module


# ------------------------------------------------------------- the architectures
def _body(hf_model) -> tuple[str, nn.Module]:
    """("gpt2", the transformer) or ("bert", the BertModel); NoPositionTableError else."""
    gpt2 = getattr(hf_model, "transformer", hf_model)
    if getattr(gpt2, "wpe", None) is not None and hasattr(gpt2, "h"):
        return "gpt2", gpt2
    bert = getattr(hf_model, "bert", hf_model)
    emb = getattr(bert, "embeddings", None)
    if getattr(emb, "position_embeddings", None) is not None and hasattr(bert, "encoder"):
        kind = getattr(hf_model.config, "position_embedding_type", "absolute")
        if kind != "absolute":
            raise NoPositionTableError(f"position_embedding_type={kind!r} has no learned "
                                       "position table in the embeddings; S_PE needs 'absolute'")
        return "bert", bert
    raise NoPositionTableError(
        f"{type(hf_model).__name__} has no learned position table (transformer.wpe or "
        "embeddings.position_embeddings); S_PE is defined only for learned-absolute-PE "
        "models such as GPT-2 and BERT")


def is_post_ln(hf_model) -> bool:
    """Whether positions reach layers > 0 through post-LN blocks (BERT), not pre-LN (GPT-2)."""
    return _body(hf_model)[0] == "bert"


def is_bidirectional(hf_model) -> bool:
    """An encoder (its family's, not configured as a decoder): its queries read keys on
    both sides, so S_PE has both signs of Δ."""
    cfg = hf_model.config
    family = family_of(cfg)
    return family is not None and not family.CAUSAL and not getattr(
        cfg, "is_decoder", False)


def ln_routes(hf_model) -> list[list[nn.Module]]:
    """Per layer, the LayerNorms (HF modules, in order) on the direct route from the
    position table to the layer's q/k (module docstring)."""
    kind, body = _body(hf_model)
    if kind == "gpt2":
        return [[unwrap(block.ln_1)] for block in body.h]
    route, out = [unwrap(body.embeddings.LayerNorm)], []
    for block in body.encoder.layer:
        out.append(list(route))
        route += [unwrap(block.attention.output.LayerNorm), unwrap(block.output.LayerNorm)]
    return out


@dataclass
class QKMaps:
    """One layer's query/key maps in ``x @ W`` layout (heads are contiguous blocks of
    d_head columns), float64 on the CPU, and the divisor of the model's scores."""

    W_Q: Float[Tensor, "d_model qk"]
    b_Q: Float[Tensor, " qk"] | None
    W_K: Float[Tensor, "d_model kv"]  # kv = qk but under multi-query attention
    b_K: Float[Tensor, " kv"] | None
    n_heads: int
    denom: float
    n_kv_heads: int | None = None  # multi-query (GPT-BigCode): 1; None: n_heads

    def heads(self, x: Float[Tensor, "pos d_model"], include_bias: bool
              ) -> tuple[Float[Tensor, "head_index pos d_head"],
                         Float[Tensor, "head_index pos d_head"]]:
        q, k = x @ self.W_Q, x @ self.W_K
        if include_bias and self.b_Q is not None:
            q, k = q + self.b_Q, k + self.b_K
        T, kv = x.shape[0], self.n_kv_heads or self.n_heads
        k = k.reshape(T, kv, -1).repeat_interleave(self.n_heads // kv, dim=1)
        return q.reshape(T, self.n_heads, -1).transpose(0, 1), k.transpose(0, 1)


def qk_maps(hf_model, layer: int) -> QKMaps:
    """Layer ``layer``'s q/k maps: GPT-2's ``attn.c_attn`` columns (scaled by 1/√d_head,
    and 1/(ℓ+1) when the config sets ``scale_attn_by_inverse_layer_idx``), BERT's
    ``attention.self.query/key`` (1/√d_head), as in the models' own attention scores."""
    kind, body = _body(hf_model)
    cfg = hf_model.config
    f64 = lambda t: None if t is None else t.detach().double().cpu()
    if kind == "gpt2" and not hasattr(unwrap(body.h[layer].attn), "c_attn"):
        return _separate_qk_maps(unwrap(body.h[layer].attn), cfg)
    if kind == "gpt2" and isinstance(unwrap(body.h[layer].attn.c_attn), nn.Linear):
        return _multi_query_maps(unwrap(body.h[layer].attn.c_attn), cfg)
    if kind == "gpt2":
        c_attn = unwrap(body.h[layer].attn.c_attn)
        W, b, D = f64(c_attn.weight), f64(c_attn.bias), c_attn.weight.shape[0]
        denom = math.sqrt(D // cfg.n_head) if getattr(cfg, "scale_attn_weights", True) else 1.0
        if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
            denom *= layer + 1
        return QKMaps(W[:, :D], None if b is None else b[:D], W[:, D: 2 * D],
                      None if b is None else b[D: 2 * D], cfg.n_head, denom)
    attn = body.encoder.layer[layer].attention.self
    q, k = unwrap(attn.query), unwrap(attn.key)
    n_heads = cfg.num_attention_heads
    return QKMaps(f64(q.weight).T, f64(q.bias), f64(k.weight).T, f64(k.bias), n_heads,
                  math.sqrt(q.weight.shape[0] // n_heads))


def _separate_qk_maps(attn: nn.Module, cfg) -> QKMaps:
    """GPT-Neo's ``attn.attention.q_proj``/``k_proj`` (no bias; its scores are q·k
    unscaled); NoPositionTableError for a layout of separate maps it does not know."""
    inner = unwrap(getattr(attn, "attention", attn))
    q, k = (unwrap(getattr(inner, name, None)) for name in ("q_proj", "k_proj"))
    if not isinstance(q, nn.Linear) or not isinstance(k, nn.Linear) or \
            getattr(cfg, "model_type", None) != "gpt_neo":
        raise NoPositionTableError(f"the q/k maps of {type(inner).__name__} are in no layout "
                                   "S_PE reads (GPT-2's c_attn, GPT-Neo's q_proj/k_proj)")
    f64 = lambda t: None if t is None else t.detach().double().cpu()
    return QKMaps(f64(q.weight).T, f64(q.bias), f64(k.weight).T, f64(k.bias),
                  cfg.num_heads, 1.0)


def _multi_query_maps(c_attn: nn.Linear, cfg) -> QKMaps:
    """GPT-BigCode's fused ``c_attn`` (an ``nn.Linear``: rows [q of every head, k, v] with
    one key head under multi-query attention, as many as the queries' otherwise);
    scores scaled by 1/√d_head where ``scale_attn_weights``."""
    D, heads = cfg.n_embd, cfg.n_head
    d_head, kv = D // heads, 1 if getattr(cfg, "multi_query", True) else heads
    W = c_attn.weight.detach().double().cpu().T
    b = None if c_attn.bias is None else c_attn.bias.detach().double().cpu()
    k = slice(D, D + kv * d_head)
    return QKMaps(W[:, :D], None if b is None else b[:D], W[:, k], None if b is None else b[k],
                  heads, math.sqrt(d_head) if getattr(cfg, "scale_attn_weights", True) else 1.0,
                  kv)


# ----------------------------------------------------------- positions per layer
def _ln_step(ln: nn.Module, x: Tensor, own: bool) -> Tensor:
    """Centre, (``own``) divide by the vector's own σ, times γ; float64."""
    x = x - x.mean(-1, keepdim=True)
    if own:
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + ln.eps)
    if ln.weight is not None:
        x = x * ln.weight.detach().double().cpu()
    return x


def _ln_bias(ln: nn.Module) -> Tensor | float:
    return 0.0 if ln.bias is None else ln.bias.detach().double().cpu()


def layer_positions(ln: nn.Module, P: Tensor, include_bias: bool) -> Tensor:
    """p̃ = LN(p) in float64 on the CPU on p's own statistics, with (``include_bias``) or
    without the shift β (GPT-2's p̃ with ``ln_scale=None``)."""
    ln = unwrap(ln)
    x = _ln_step(ln, P, own=True)
    return x + _ln_bias(ln) if include_bias else x


def position_ln_stats(hf_model, ids: Int[Tensor, "batch pos"], batch_size: int = 8
                      ) -> Float[Tensor, "layer pos"]:
    """The real-statistics factor c_ℓ(t) = mean_x Π_k 1/σ_k(x, t) over the LayerNorms of
    layer ℓ's route (:func:`ln_routes`; module docstring), measured by running ``ids``
    through the HF model with forward hooks on those LayerNorms (float64, CPU). BERT
    sequences get token type 0 and no padding, as in the bridge's forward."""
    routes = ln_routes(hf_model)
    inv: dict[int, Tensor] = {}

    def keep(module, args, output) -> None:
        var = args[0].detach().double().var(-1, unbiased=False)
        inv[id(module)] = torch.rsqrt(var + module.eps).cpu()

    modules = {id(m): m for route in routes for m in route}
    handles = [m.register_forward_hook(keep) for m in modules.values()]
    device = next(hf_model.parameters()).device
    total = torch.zeros(len(routes), ids.shape[1], dtype=torch.float64)

    def run(rows: tuple[int, ...], tokens: Tensor) -> None:
        hf_model(tokens)
        for layer, route in enumerate(routes):
            total[layer] += math.prod(inv[id(m)] for m in route).sum(0)

    try:
        batched(ids, batch_size, device, "LayerNorm statistics", False, run, total.zero_)
    finally:
        for handle in handles:
            handle.remove()
    return total / len(ids)


def layer_position_vectors(hf_model, T: int, include_bias: bool = False,
                           ln_scale: Float[Tensor, "layer pos"] | None = None
                           ) -> list[Float[Tensor, "pos d_model"]]:
    """p̃_ℓ(t) for t < T of every layer (module docstring), float64 on the CPU."""
    routes = ln_routes(hf_model)
    table = unwrap(position_table(hf_model)).weight
    if T < 2 or T > table.shape[0]:
        raise UserError(f"T={T} must lie in [2, {table.shape[0]}] (the position table)")
    if ln_scale is not None and (ln_scale.shape[0] != len(routes) or ln_scale.shape[1] < T):
        raise UserError(f"ln_scale has shape {tuple(ln_scale.shape)}; expected "
                        f"({len(routes)}, >= {T}) from position_ln_stats")
    P = table.detach()[:T].double().cpu()
    out = []
    for layer, route in enumerate(routes):
        x = P
        for ln in route:
            x = _ln_step(ln, x, own=ln_scale is None)
        if ln_scale is not None:
            x = x * ln_scale[layer, :T, None].double().cpu()
        out.append(x + _ln_bias(route[-1]) if include_bias else x)
    return out


# ----------------------------------------------------------------- the kernels
def head_projected_pe_kernels(
    hf_model, T: int, include_bias: bool = False, *,
    ln_scale: Float[Tensor, "layer pos"] | None = None,
) -> tuple[Float[np.ndarray, "layer head_index lag"], Float[np.ndarray, "layer head_index lag"],
           Float[np.ndarray, "layer head_index"]]:
    """(S_PE(Δ) for Δ = 1..T−1, S_PE(−j) for j = 1..T−1, S_PE(0)) of every layer and head,
    float64, whatever device the model is on; ``ln_scale`` from :func:`position_ln_stats`
    for the real LayerNorm statistics (module docstring)."""
    xs = layer_position_vectors(hf_model, T, include_bias, ln_scale)
    kernels = []
    with torch.no_grad():
        for layer, x in enumerate(xs):
            maps = qk_maps(hf_model, layer)
            kernels.append(lag_means(*maps.heads(x, include_bias), 1.0 / maps.denom))
    return tuple(torch.stack(k).numpy() for k in zip(*kernels))


def lag_means(q: Float[Tensor, "head_index pos d_head"],
              k: Float[Tensor, "head_index pos d_head"], scale: float
              ) -> tuple[Float[Tensor, "head_index lag"], Float[Tensor, "head_index lag"],
                         Float[Tensor, " head_index"]]:
    """(S(Δ), S(−Δ)) for Δ = 1..T−1 and S(0): the mean over query positions of the
    position-only logits scale·q_t·k_{t−Δ} (one sequence; S(−j) is k's lag sum against q),
    by FFT cross-correlation in float64."""
    T = q.shape[1]
    counts = torch.arange(T - 1, 0, -1, dtype=torch.float64)  # T−|Δ| pairs, |Δ| = 1..T−1
    q, k = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # one sequence [1, pos, head, d]
    return (lag_sums(q, k, scale)[0] / counts, lag_sums(k, q, scale)[0] / counts,
            (q.double() * k.double()).sum((1, 3))[0] * scale / T)


def head_projected_pe_kernel(hf_model, T: int, include_bias: bool = False, *,
                             ln_scale: Float[Tensor, "layer pos"] | None = None
                             ) -> Float[np.ndarray, "layer head_index lag"]:
    """S_PE[layer, head, Δ−1] for Δ = 1..T−1 (float64) of a GPT-2- or BERT-style HF model:
    the key-before-query half of :func:`head_projected_pe_kernels`. p(t) is the position
    table's row t; layer ℓ's p̃ and q/k maps are those of the module docstring
    (:func:`ln_routes`, :func:`qk_maps`)."""
    return head_projected_pe_kernels(hf_model, T, include_bias, ln_scale=ln_scale)[0]


def pe_kernel_part(hf_model, T: int, ids: Int[Tensor, "batch pos"] | None = None, *,
                   batch_size: int = 8) -> PEKernel:
    """The :class:`PEKernel` a measurement stores: S_PE, and for a bidirectional model
    (:func:`is_bidirectional`) also ``s_pe_back`` and ``s_pe_self``. With ``ids`` (the
    evaluation sequences) a post-LN model's p̃ uses the real LayerNorm statistics
    measured on them (:func:`position_ln_stats`); GPT-2's uses its own (unchanged)."""
    scale = position_ln_stats(hf_model, ids, batch_size) \
        if ids is not None and is_post_ln(hf_model) else None
    fwd, back, diag = head_projected_pe_kernels(hf_model, T, ln_scale=scale)
    if not is_bidirectional(hf_model):
        return PEKernel(fwd)
    return PEKernel(fwd, s_pe_back=back, s_pe_self=diag)


__all__ = ["NoPositionTableError", "PEKernel", "QKMaps", "head_projected_pe_kernel",
           "head_projected_pe_kernels", "is_bidirectional", "is_post_ln", "lag_means",
           "layer_position_vectors", "layer_positions", "ln_routes",
           "pe_kernel_from_gram", "pe_kernel_part", "position_ln_stats", "positional_gram",
           "qk_maps", "unwrap"]

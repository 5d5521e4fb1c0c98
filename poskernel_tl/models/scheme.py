"""Each layer's own positional scheme, read from the Hugging Face model itself.

Models mix schemes per layer: Gemma 3's local layers attend within a 512-token sliding
window with RoPE base 10,000 beside global layers with base 1,000,000; SmolLM3 leaves
RoPE out of every fourth layer; GPT-NeoX rotates a quarter of each head's dimensions and
GPT-J pairs neighbouring dimensions. A :class:`LayerScheme` says, for one layer, what
enters its logits:

- ``pe``: ``"rope"`` (with its own ``inv_freq``, the rotated share ``rotary_dims`` of
  d_head and the pair ``layout``: ``"rotate_half"`` pairs i with i + r/2, ``"interleaved"``
  pairs 2i with 2i + 1), ``"none"`` (NoPE) or ``"learned-absolute"`` (a position table
  added to the residual stream);
- ``mask``: ``"causal"``, ``"sliding"`` (a query t reads keys s with t − s < ``window``,
  the rule of transformers' ``sliding_window_overlay``) or ``"bidirectional"``;
- ``qk_norm``: whether q and k are normalised per head before RoPE.

Everything is read from the config and modules (``layer_types``, ``sliding_window``,
per-type rotary buffers, ``no_rope_layers``, the rotary module's ``inv_freq`` or GPT-J's
``embed_positions`` table); what cannot be read is refused with
:class:`UnreadableSchemeError` naming what is missing, never guessed.
"""

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch
from torch import nn

from poskernel_tl.errors import UserError
from poskernel_tl.models.alibi import alibi_slopes
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms, read_terms

# model types whose attention has no causal mask (every query reads every key)
ENCODER_TYPES = frozenset({"bert"})


class UnreadableSchemeError(UserError):
    """A layer's positional scheme or mask cannot be read from the model (or is one the
    fit does not support): the model is refused rather than measured under a guess."""


@dataclass(frozen=True)
class LayerScheme:
    """One layer's positional scheme (see the module docstring)."""

    pe: str  # "rope" | "none" | "learned-absolute" | "alibi"
    mask: str = "causal"  # "causal" | "sliding" | "bidirectional"
    window: int | None = None  # sliding: a query reads keys with t − s < window
    inv_freq: tuple[float, ...] | None = None  # rope: θ_i per rotated pair
    rotary_dims: int | None = None  # rope: how many of d_head's dimensions rotate
    layout: str | None = None  # rope: "rotate_half" | "interleaved"
    qk_norm: bool = False
    # ε of a weightless RMS norm of q and k applied after rotary (Llama 4's L2 norm), which
    # a capture rotating pre-rotary hooks must apply itself
    norm_after_rotary: float | None = None
    terms: SoftmaxTerms = NONE
    # rope: the first rotated dimension (DeepSeek's MLA heads put qk_nope_head_dim plain
    # dimensions before the rotary ones)
    rotary_offset: int = 0
    # the model's block index of this attention layer where they differ (a hybrid's
    # attention layers among its state-space or convolution layers)
    block: int | None = None  # what the softmax adds to scale·q·k (softmax_terms)

    @property
    def max_lag(self) -> int | None:
        """The largest offset Δ = t − s whose logit the mask keeps (None: no limit)."""
        return None if self.window is None else self.window - 1

    @property
    def kind(self) -> str:
        """A short label that separates layer kinds in tables and figures, e.g.
        ``"rope 1e+04, window 512"``, ``"rope 1e+06"``, ``"nope"``."""
        head = {"rope": "rope", "none": "nope", "learned-absolute": "learned",
                "alibi": "alibi"}[self.pe]
        if self.pe == "rope" and self.inv_freq:
            head += f" {self.base:.3g}"
        if self.mask == "sliding":
            head += f", window {self.window}"
        extra = [x for x in self.terms.labels() if x != "alibi"]
        return ", ".join([head, *extra])

    @property
    def base(self) -> float | None:
        """The RoPE base b read back from θ_i = b^(−i/n) over n pairs: b = (θ_0/θ_1)^n, to
        5 significant digits (the buffers are float32; None without RoPE or with fewer than
        two pairs)."""
        f = self.inv_freq
        if self.pe != "rope" or not f or len(f) < 2 or min(f[0], f[1]) <= 0:
            return None
        return float(f"{(f[0] / f[1]) ** len(f):.5g}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["inv_freq"] = None if self.inv_freq is None else list(self.inv_freq)
        d["terms"] = self.terms.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LayerScheme":
        d = dict(d)
        if d.get("inv_freq") is not None:
            d["inv_freq"] = tuple(float(x) for x in d["inv_freq"])
        d["terms"] = SoftmaxTerms.from_dict(d.get("terms"))
        return cls(**d)


# ------------------------------------------------------------------ reading the model
def _inner(hf_model: nn.Module) -> nn.Module | None:
    for name in ("model", "transformer", "gpt_neox"):
        inner = getattr(hf_model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return None


def original(module: nn.Module | None) -> nn.Module | None:
    """The Hugging Face module itself where a TransformerLens bridge wraps it (a model
    read after it was booted, e.g. :meth:`~poskernel_tl.models.loading.LoadedModel.from_bridge`)."""
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, nn.Module) else module


def attention_modules(hf_model: nn.Module) -> list[nn.Module]:
    """The innermost Hugging Face module named ``…Attention`` of every layer, in order
    (BERT's ``BertSelfAttention``, not the ``BertAttention`` around it)."""
    named = lambda m: type(m).__name__.endswith("Attention")
    found: list[nn.Module] = []
    for m in map(original, hf_model.modules()):
        inner = [c for c in map(original, m.modules()) if c is not m and named(c)]
        if named(m) and not inner and all(m is not f for f in found):
            found.append(m)
    return found


def _layer_types(cfg, n_layers: int) -> list[str]:
    """``config.layer_types`` where given, else one type for every layer: sliding where the
    config sets ``sliding_window`` for all layers (Mistral, Phi-3), else full."""
    types = getattr(cfg, "layer_types", None)
    if types:
        return list(types)
    if getattr(cfg, "attention_chunk_size", None):
        return ["chunked_attention"] * n_layers
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * n_layers
    return ["full_attention"] * n_layers


# transformers' layer types of layers without softmax attention (state-space, linear
# recurrent, convolution, MoE/MLP-only layers of hybrids)
NO_ATTENTION_TYPES = frozenset({"linear_attention", "conv", "moe", "mlp", "mamba"})


class NoAttentionError(UnreadableSchemeError):
    """The model has no softmax-attention layer (Mamba, RWKV, …): nothing to measure."""


def _mask(cfg, layer_type: str, causal: bool) -> tuple[str, int | None]:
    if not causal:
        return "bidirectional", None
    if layer_type in ("full_attention", "hybrid"):  # hybrid: attention beside a state
        return "causal", None
    if layer_type == "chunked_attention":  # causal within each chunk (SoftmaxTerms.chunk)
        return "causal", None
    if layer_type in ("sliding_attention", "hybrid_sliding"):
        window = getattr(cfg, "sliding_window", None)
        if not isinstance(window, int) or window < 1:
            raise UnreadableSchemeError("a sliding-attention layer without an integer "
                                        "config.sliding_window")
        return "sliding", window
    raise UnreadableSchemeError(f"layer type {layer_type!r}: only full and sliding-window "
                                "attention are supported (chunked attention keeps entries "
                                "that depend on position, not on the offset alone)")


def _no_rope(cfg, n_layers: int) -> list[bool]:
    """Per layer, True where the config leaves RoPE out (SmolLM3's ``no_rope_layers``:
    1 = RoPE; Llama 4 likewise)."""
    flags = getattr(cfg, "no_rope_layers", None)
    if not flags:
        return [False] * n_layers
    if len(flags) != n_layers:
        raise UnreadableSchemeError(f"config.no_rope_layers has {len(flags)} entries for "
                                    f"{n_layers} layers")
    return [not bool(f) for f in flags]


def _rotary_tables(inner: nn.Module | None) -> tuple[nn.Module | None, dict]:
    rotary = original(getattr(inner, "rotary_emb", None))
    if rotary is None and inner is not None:  # GPT-J keeps its table on each attention
        rotary = next((original(m) for m in inner.modules()
                       if hasattr(original(m), "embed_positions")), None)
    return rotary, ({} if rotary is None else dict(rotary.named_buffers()))


def _inv_freq(buffers: dict, layer_type: str) -> torch.Tensor | None:
    """θ_i of a layer type: Gemma 3 keeps one buffer per type (``{type}_inv_freq``); GPT-J
    a sin/cos table ``embed_positions`` [pos, r] = [sin(θ·p), cos(θ·p)], read at p = 1."""
    for name in (f"{layer_type}_inv_freq", "inv_freq"):
        if name in buffers:
            return buffers[name].detach().double().cpu()
    table = buffers.get("embed_positions")
    if table is not None:
        half = table.shape[-1] // 2
        row = table[1].double().cpu()
        return torch.atan2(row[:half], row[half:])
    return None


def _layout(hf_model: nn.Module) -> str:
    """``"interleaved"`` where the attention's own code rotates neighbouring dimensions
    (a ``rotate_every_two`` in its module, GPT-J), else ``"rotate_half"``."""
    attn = next(iter(attention_modules(hf_model)), None)
    code = sys.modules.get(type(attn).__module__) if attn is not None else None
    pairs_neighbours = hasattr(code, "rotate_every_two") or hasattr(code, "apply_rotary_emb")
    if code is not None and pairs_neighbours and not hasattr(code, "rotate_half"):
        return "interleaved"  # GPT-J's rotate_every_two, Llama 4's complex apply_rotary_emb
    return "rotate_half"


def _qk_norm(attn: nn.Module | None) -> bool:
    return attn is not None and any(getattr(attn, n, None) is not None
                                    for n in ("q_norm", "k_norm", "q_layernorm", "qk_norm"))


def _norm_after_rotary(attn: nn.Module | None) -> float | None:
    """ε of Llama 4's weightless L2 norm of q and k after rotary (``attn.qk_norm``)."""
    norm = getattr(attn, "qk_norm", None)
    if isinstance(norm, nn.Module) and type(norm).__name__.endswith("L2Norm"):
        return float(norm.eps)
    return None


def read_layers(hf_model: nn.Module, pe: str, n_layers: int, d_head: int,
                n_heads: int | None = None) -> tuple[LayerScheme, ...]:
    """The :class:`LayerScheme` of every attention layer of ``hf_model``'s ``n_layers``
    blocks (``pe``: the model-level scheme already read: ``"rope"``, ``"none"``,
    ``"learned-absolute"`` or ``"alibi"``), with what each layer's softmax adds to
    scale·q·k (:func:`~poskernel_tl.models.softmax_terms.read_terms`). A hybrid's blocks
    without softmax attention (:data:`NO_ATTENTION_TYPES`) are left out and each scheme
    names its block; a model with none is refused (:class:`NoAttentionError`)."""
    cfg = hf_model.config
    types = _layer_types(cfg, n_layers)
    if len(types) != n_layers:
        raise UnreadableSchemeError(f"config.layer_types has {len(types)} entries for "
                                    f"{n_layers} layers")
    blocks = [i for i, t in enumerate(types) if t not in NO_ATTENTION_TYPES]
    if not blocks:
        raise NoAttentionError(f"{type(hf_model).__name__} has no softmax-attention layer "
                               f"(layer types: {', '.join(sorted(set(types)))}): nothing to "
                               "measure")
    n_heads = n_heads or getattr(cfg, "num_attention_heads", None) or cfg.n_head
    try:
        slopes = alibi_slopes(hf_model, n_heads) if pe == "alibi" else None
    except ValueError as err:
        raise UnreadableSchemeError(str(err)) from None
    if getattr(getattr(cfg, "attn_config", None), "clip_qkv", None):
        raise UnreadableSchemeError("MPT's clip_qkv clamps q and k after TransformerLens's "
                                    "hook_q/hook_k fire: not supported")
    attns = attention_modules(hf_model)
    attns = attns if len(attns) == len(blocks) else [None] * len(blocks)
    no_rope = _no_rope(cfg, n_layers)
    rotary, buffers = _rotary_tables(_inner(hf_model)) if pe == "rope" else (None, {})
    shared = dict(causal=getattr(cfg, "model_type", None) not in ENCODER_TYPES,
                  layout=_layout(hf_model) if pe == "rope" else None, d_head=d_head,
                  offset=getattr(cfg, "qk_nope_head_dim", None) or 0, slopes=slopes,
                  n_heads=n_heads, hybrid=len(blocks) < n_layers)
    out = []
    for block, attn in zip(blocks, attns):
        layer_pe = "none" if pe == "rope" and no_rope[block] else pe
        freq = None if layer_pe != "rope" else _inv_freq(buffers, types[block])
        if layer_pe == "rope" and freq is None:
            raise UnreadableSchemeError(
                f"layer {block}: no rotary frequencies on {type(rotary).__name__} "
                f"(looked for {types[block]}_inv_freq, inv_freq, embed_positions)")
        out.append(_layer_scheme(cfg, block, types[block], layer_pe, freq, attn, **shared))
    return tuple(out)


def _layer_scheme(cfg, block: int, layer_type: str, pe: str, freq: torch.Tensor | None,
                  attn: nn.Module | None, *, causal: bool, layout: str | None, d_head: int,
                  offset: int, slopes, n_heads: int, hybrid: bool) -> LayerScheme:
    mask, window = _mask(cfg, layer_type, causal)
    try:
        terms = read_terms(cfg, attn, layer_type, n_heads, slopes)
    except ValueError as err:
        raise UnreadableSchemeError(f"layer {block}: {err}") from None
    if freq is not None and 2 * len(freq) + offset > d_head:
        raise UnreadableSchemeError(f"layer {block}: {len(freq)} rotary pairs from dimension "
                                    f"{offset} exceed d_head {d_head}")
    return LayerScheme(
        pe=pe, mask=mask, window=window,
        inv_freq=None if freq is None else tuple(float(x) for x in freq),
        rotary_dims=None if freq is None else 2 * len(freq),
        layout=layout if freq is not None else None, qk_norm=_qk_norm(attn),
        norm_after_rotary=_norm_after_rotary(attn), terms=terms,
        rotary_offset=offset if freq is not None else 0, block=block if hybrid else None)


def summary(layers) -> str:
    """One line naming each kind of layer and where it sits, e.g.
    ``"rope 1e+04, window 512: layers 0-4, 6-10, 12-16; rope 1e+06: layers 5, 11, 17"``
    (a hybrid's attention layers also name the model's blocks they are)."""
    if not layers:
        return "unknown until loaded"
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(layers):
        groups.setdefault(s.kind, []).append(i)
    blocks = lambda ix: "" if layers[ix[0]].block is None else \
        f" (the model's blocks {', '.join(str(layers[i].block) for i in ix)})"
    return "; ".join(f"{kind}: layers {_ranges(ix)}{blocks(ix)}" for kind, ix in groups.items())


def terms_summary(layers) -> str:
    """One line naming what each kind of layer's softmax adds to scale·q·k and where, e.g.
    ``"ALiBi −m·(t − s), m = 0.25 … 0.0039 over 4 heads: layers 0-3"`` (empty when no
    layer adds anything)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(layers):
        if s.terms:
            groups.setdefault(s.terms.describe(values=False), []).append(i)
    return "; ".join(f"{what}: layers {_ranges(ix)}" for what, ix in groups.items())


def _ranges(ix: list[int]) -> str:
    runs, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [math.inf]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)


__all__ = ["ENCODER_TYPES", "NO_ATTENTION_TYPES", "LayerScheme", "NoAttentionError",
           "UnreadableSchemeError", "attention_modules", "original", "read_layers", "summary",
           "terms_summary"]

"""Each layer's :class:`~poskernel_tl.models.scheme.LayerScheme` and
:class:`~poskernel_tl.models.softmax_terms.SoftmaxTerms`, read from the Hugging Face model
itself: its config and its modules (what :mod:`~poskernel_tl.models.scheme` describes).
"""

import dataclasses
import sys

import torch
from torch import nn

from poskernel_tl.models.families.family import Family, Stack
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.scheme import SLIDING_TYPES, LayerScheme, UnreadableSchemeError
from poskernel_tl.models.softmax_terms import SoftmaxTerms
from poskernel_tl.models.terms.term import LayerContext


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
    """``config.layer_types`` where given (GPT-Neo's ``attention_layers``: local layers
    slide over ``window_size``), else one type for every layer: sliding where the config
    sets ``sliding_window`` for all layers (Mistral, Phi-3), else full."""
    types = getattr(cfg, "layer_types", None)
    if types:
        return list(types)
    local = getattr(cfg, "attention_layers", None)  # GPT-Neo: "global" / "local" per layer
    if isinstance(local, (list, tuple)) and set(local) <= {"global", "local"}:
        return ["sliding_attention" if x == "local" else "full_attention" for x in local]
    if getattr(cfg, "attention_chunk_size", None):
        return ["chunked_attention"] * n_layers
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * n_layers
    return ["full_attention"] * n_layers


# transformers' layer types of layers without softmax attention (state-space, linear
# recurrent, convolution, MoE/MLP-only layers of hybrids)
NO_ATTENTION_TYPES = frozenset({"linear_attention", "conv", "moe", "mlp", "mamba"})


# layer types whose softmax keeps, or reads, other than one key per position under a mask
# of offsets: what each is, said in the refusal
UNMEASURED_TYPES = {
    "indexed_attention": "each query attends to the keys a learned indexer selects by "
                         "content (DeepSeek sparse attention), so the entries its softmax keeps "
                         "depend on content, not on the offset",
    "compressed_sparse_attention": "its keys are compressed over blocks of positions, a "
                                   "learned indexer selecting among them by content",
    "heavily_compressed_attention": "its keys are compressed over blocks of positions",
}


class NoAttentionError(UnreadableSchemeError):
    """The model has no softmax-attention layer (Mamba, RWKV, …): nothing to measure."""


def _mask(cfg, layer_type: str, causal: bool, reach: int | None = None
          ) -> tuple[str, int | None]:
    """(mask, window) of one layer: a bidirectional layer's sliding window (``reach``: the
    last |t − s| it keeps, read by the model's family; None: every offset) is
    ``reach + 1`` (|t − s| < window), a causal one's ``config.sliding_window``
    (t − s < window)."""
    if not causal:
        return "bidirectional", None if reach is None else reach + 1
    if layer_type in ("full_attention", "hybrid"):  # hybrid: attention beside a state
        return "causal", None
    if layer_type == "chunked_attention":  # causal within each chunk (SoftmaxTerms.chunk)
        return "causal", None
    if layer_type in SLIDING_TYPES:
        window = getattr(cfg, "sliding_window", None)
        if window is None and getattr(cfg, "attention_layers", None):
            window = getattr(cfg, "window_size", None)  # GPT-Neo's local layers
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
    """The model's rotary module and its buffers: ``rotary_emb``, else the first module
    named ``…RotaryEmbedding`` (LFM2-MoE's ``pos_emb``; RecurrentGemma's, on each attention),
    else GPT-J's per-attention table (``embed_positions``)."""
    rotary = original(getattr(inner, "rotary_emb", None))
    if rotary is None and inner is not None:
        found = [original(m) for m in inner.modules()]
        rotary = next((m for m in found if type(m).__name__.endswith("RotaryEmbedding")),
                      next((m for m in found if hasattr(m, "embed_positions")), None))
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


def _layout(attn: nn.Module | None) -> str:
    """``"interleaved"`` where the attention's own code rotates neighbouring dimensions
    (a ``rotate_every_two`` in its module, GPT-J), else ``"rotate_half"``."""
    code = sys.modules.get(type(attn).__module__) if attn is not None else None
    pairs_neighbours = hasattr(code, "rotate_every_two") or hasattr(code, "apply_rotary_emb")
    if code is not None and pairs_neighbours and not hasattr(code, "rotate_half"):
        return "interleaved"  # GPT-J's rotate_every_two, Llama 4's complex apply_rotary_emb
    return "rotate_half"


def _qk_norm(attn: nn.Module | None) -> bool:
    return attn is not None and any(getattr(attn, n, None) is not None
                                    for n in ("q_norm", "k_norm", "q_layernorm", "qk_norm"))


def _norm_after_rotary(attn: nn.Module | None, family: Family | None) -> float | None:
    """ε of a weightless norm of q and k after rotary: Llama 4's L2 norm (``attn.qk_norm``),
    or where the model's family reads one (NanoChat's ``q_norm``/``k_norm``)."""
    norm = getattr(attn, "qk_norm", None)
    if isinstance(norm, nn.Module) and type(norm).__name__.endswith("L2Norm"):
        return float(norm.eps)
    return None if family is None or attn is None else family.norm_after_rotary(attn)


def read_layers(hf_model: nn.Module, pe: str, n_layers: int, d_head: int,
                n_heads: int | None = None, stack: str | None = None
                ) -> tuple[LayerScheme, ...]:
    """The :class:`LayerScheme` of every attention layer of ``hf_model``'s ``n_layers``
    blocks (``pe``: the model-level scheme already read: ``"rope"``, ``"none"``,
    ``"learned-absolute"``, ``"alibi"`` or ``"relative-bias"``), with what each layer's
    softmax adds to scale·q·k (:func:`~poskernel_tl.models.scheme_reader.read_terms`). A
    hybrid's blocks without softmax attention (:data:`NO_ATTENTION_TYPES`) are left out
    and each scheme names its block; a model with none is refused
    (:class:`NoAttentionError`). An encoder-decoder's layers are the self-attention layers
    of its ``stack`` (:func:`stack_of`), read from the stack's own config, modules and
    rotary table, each naming the bridge's hook prefix of its attention (``site``)."""
    family = family_of(hf_model.config)
    chosen = stack_of(hf_model, family, stack)
    cfg = hf_model.config if chosen is None else family.stack_config(hf_model.config, chosen)
    types = _layer_types(cfg, n_layers)
    blocks = _attention_blocks(hf_model, types, n_layers)
    n_heads = n_heads or getattr(cfg, "num_attention_heads", None) or cfg.n_head
    causal = chosen.causal if chosen is not None else family is None or family.CAUSAL
    try:
        slopes = alibi_slopes(hf_model, family, n_heads) if pe == "alibi" else None
        reaches = [None if causal or family is None else
                   family.window_reach(cfg, types[b], b) for b in blocks]
    except ValueError as err:
        raise UnreadableSchemeError(str(err)) from None
    found = attention_modules(hf_model) if chosen is None else \
        family.attention(hf_model, chosen)
    attns = found if len(found) == len(blocks) else [None] * len(blocks)
    inner = _inner(hf_model) if chosen is None else family.stack_module(hf_model, chosen)
    rotary, buffers = _rotary_tables(inner) if pe == "rope" else (None, {})
    no_rope = _no_rope(cfg, n_layers)
    rotates = _rope_layers(family, attns) if pe == "rope" else None
    shared = dict(causal=causal, d_head=d_head,
                  layout=_layout(next(iter(found), None)) if pe == "rope" else None,
                  offset=getattr(cfg, "qk_nope_head_dim", None) or 0, slopes=slopes,
                  n_heads=n_heads, hybrid=len(blocks) < n_layers, model=hf_model)
    out = []
    for i, (block, attn) in enumerate(zip(blocks, attns)):
        unrotated = no_rope[block] or (rotates is not None and not rotates[i])
        layer_pe = "none" if pe == "rope" and unrotated else pe
        freq = None if layer_pe != "rope" else _inv_freq(buffers, types[block])
        if layer_pe == "rope" and freq is None:
            raise UnreadableSchemeError(
                f"layer {block}: no rotary frequencies on {type(rotary).__name__} "
                f"(looked for {types[block]}_inv_freq, inv_freq, embed_positions)")
        scheme = _layer_scheme(cfg, block, types[block], layer_pe, freq, attn,
                               reach=reaches[i], **shared)
        out.append(scheme if chosen is None else
                   dataclasses.replace(scheme, site=chosen.site.format(i=block)))
    return tuple(out)


def _attention_blocks(hf_model: nn.Module, types: list[str], n_layers: int) -> list[int]:
    """The blocks with softmax attention, from the layers' types: a model with none is
    refused (:class:`NoAttentionError`), as is one with a type not measured, in one line."""
    if len(types) != n_layers:
        raise UnreadableSchemeError(f"config.layer_types has {len(types)} entries for "
                                    f"{n_layers} layers")
    blocks = [i for i, t in enumerate(types) if t not in NO_ATTENTION_TYPES]
    if not blocks:
        raise NoAttentionError(f"{type(hf_model).__name__} has no softmax-attention layer "
                               f"(layer types: {', '.join(sorted(set(types)))}): nothing to "
                               "measure")
    unmeasured = next((t for t in types if t in UNMEASURED_TYPES), None)
    if unmeasured is not None:
        raise UnreadableSchemeError(
            f"layer {types.index(unmeasured)} ({unmeasured!r}): "
            f"{UNMEASURED_TYPES[unmeasured]}; not measured")
    return blocks


def _rope_layers(family: Family | None, attns: list) -> list[bool] | None:
    """Per attention layer, whether it rotates, where the model's family reads it from its
    modules (:meth:`~poskernel_tl.models.families.family.Family.rope_layers`), else None."""
    try:
        return None if family is None else family.rope_layers(attns)
    except ValueError as err:
        raise UnreadableSchemeError(f"{family.NAME}: {err}") from None


def stack_of(hf_model: nn.Module, family: Family | None, stack: str | None
             ) -> Stack | None:
    """The stack of an encoder-decoder that ``stack`` names (None: its family's first),
    or None for a model of one stack; refused in one line where the family does not
    measure it, or where a one-stack model is asked for a stack."""
    if family is None or not family.STACKS:
        if stack is not None:
            raise UnreadableSchemeError(f"@{stack}: {type(hf_model).__name__} is no "
                                        "encoder-decoder (one stack of layers, no @stack to "
                                        "choose)")
        reason = None if family is None else family.refusal(hf_model, None)
        chosen = None
    else:
        chosen = family.stack(stack)
        reason = family.refusal(hf_model, chosen)
    if reason:
        raise UnreadableSchemeError(reason)
    return chosen


def alibi_slopes(hf_model: nn.Module, family: Family | None,
                 n_heads: int) -> tuple[float, ...]:
    """m_h per query head on the softmax's scale, read by the model's family file; a
    ValueError where no family reads them."""
    if family is None or not family.uses_alibi(hf_model.config):
        kind = getattr(hf_model.config, "model_type", None)
        raise ValueError(f"ALiBi of model type {kind!r}: slopes unknown (BLOOM, MPT and "
                         "Falcon are read)")
    return family.alibi_slopes(hf_model, n_heads)


def _layer_scheme(cfg, block: int, layer_type: str, pe: str, freq: torch.Tensor | None,
                  attn: nn.Module | None, *, causal: bool, reach: int | None,
                  layout: str | None, d_head: int, offset: int, slopes, n_heads: int,
                  hybrid: bool, model: nn.Module) -> LayerScheme:
    mask, window = _mask(cfg, layer_type, causal, reach)
    try:
        terms = read_terms(cfg, attn, layer_type, n_heads, slopes, model)
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
        norm_after_rotary=_norm_after_rotary(attn, family_of(model.config)), terms=terms,
        rotary_offset=offset if freq is not None else 0, block=block if hybrid else None)


def read_terms(cfg, attn, layer_type: str, n_heads: int,
               slopes: tuple[float, ...] | None = None,
               model: nn.Module | None = None) -> SoftmaxTerms:
    """One layer's :class:`SoftmaxTerms` from its config and Hugging Face attention module
    ``attn`` (None where the layers could not be matched to modules): every registered
    term reads itself (:mod:`poskernel_tl.models.terms`); ``slopes``: the layer's ALiBi
    slopes, read by the caller (:func:`alibi_slopes`); ``model``: the whole model (a
    term kept outside the layer). A ValueError names what is missing or inconsistent."""
    return SoftmaxTerms.read(LayerContext(cfg, attn, layer_type, n_heads, slopes, model))


__all__ = ["NO_ATTENTION_TYPES", "NoAttentionError", "attention_modules", "original",
           "read_layers", "read_terms", "stack_of"]

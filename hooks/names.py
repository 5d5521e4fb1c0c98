"""Which hook points carry the post-rotary queries, keys and attention scores.

The choice is made from the bridge itself: a rotary bridge of the Llama family exposes
``hook_rot_q``/``hook_rot_k``; the fused-QKV rotary bridge (GPT-NeoX, Phi-3) hooks q and k
before rotary and ``hook_cos``/``hook_sin``, from which the capture rotates them; the base
bridge (GPT-J) hooks q and k before rotary only, which the capture rotates by the layer's
own frequencies (:mod:`poskernel_tl.hooks.rotary`); DeepSeek's MLA bridge hooks whole heads
(the plain and the rotary part, already rotated, heads before positions) as ``hook_q`` and
``hook_k``. ``layer`` is the model's block index (a hybrid's attention layers sit among
blocks without attention).
"""

import math
from dataclasses import dataclass

ROT_Q = "{site}.hook_rot_q"
ROT_K = "{site}.hook_rot_k"
PLAIN_Q = "{site}.hook_q"
PLAIN_K = "{site}.hook_k"
PROJ_Q = "{site}.q.hook_out"  # where the bridge hooks the projections only (T5)
PROJ_K = "{site}.k.hook_out"
Q_NORMED = "{site}.hook_q_normed"
K_NORMED = "{site}.hook_k_normed"
Q_NORM_OUT = "{site}.q_norm.hook_out"
K_NORM_OUT = "{site}.k_norm.hook_out"
COS = "{site}.hook_cos"
SIN = "{site}.hook_sin"
SCORES = "{site}.hook_attn_scores"


def block_site(block: int) -> str:
    """The hook prefix of block ``block``'s attention in a decoder-only or encoder-only
    bridge (an encoder-decoder's stacks name their own: ``encoder_blocks.{i}.attn``,
    ``decoder_blocks.{i}.self_attn``)."""
    return f"blocks.{block}.attn"


def site_of(layer: int, scheme=None) -> str:
    """The hook prefix of layer ``layer``'s attention: its scheme's ``site`` (a
    :class:`~poskernel_tl.hooks.rotary.LayerScheme`, or None) where it names one (an
    encoder-decoder's stack), else its block's (:func:`block_site`; a hybrid's scheme names
    its block)."""
    if scheme is not None and scheme.site:
        return scheme.site
    return block_site(layer if scheme is None or scheme.block is None else scheme.block)


def attention_component(bridge, site: str):
    """The bridge's attention component at ``site``, or None where there is none."""
    try:
        return bridge.get_submodule(site)
    except AttributeError:
        return None


@dataclass(frozen=True)
class QKSource:
    """Where one layer's q and k entering Q·Kᵀ come from: ``q``/``k`` hook names and how
    they are finished: ``"as-is"`` (already post-rotary, or no rotary), ``"hooked-angles"``
    (rotate by ``hook_cos``/``hook_sin``, named in ``angles``) or ``"scheme-angles"``
    (rotate by the layer's own frequencies)."""

    q: str
    k: str
    rotation: str = "as-is"
    angles: tuple[str, str] | None = None
    heads_first: bool = False  # hooked as [batch, head, pos, d_head] (DeepSeek's MLA)
    # hooked as [pos, batch, head·d_head] over the length the model pads its input to
    # (Longformer's windowed attention, LED's encoder): the first T positions kept
    seq_first: bool = False
    d_head: int | None = None  # hooked as [batch, pos, head·d_head] (a norm over the width)


def qk_source(bridge, site: str, rope: bool, norm_after_rotary: bool = False) -> QKSource:
    """The :class:`QKSource` of the attention at ``site`` (:func:`block_site`; ``rope``:
    whether the layer's scheme rotates), from the class of its attention bridge:
    TransformerLens's rotary bridge fires ``hook_rot_q``/``hook_rot_k`` (every layer,
    SmolLM3's NoPE ones included, where they equal q and k), or, where the model
    normalises q and k after rotary (``cfg.qk_norm_after_rope``, HunYuan),
    ``hook_q_normed``/``hook_k_normed``; the fused-QKV rotary bridge fires
    ``hook_cos``/``hook_sin`` but not the rotated q/k; the base bridge neither, and hooks q
    and k before the model's own q/k norms, read then from the norms' ``hook_out`` (Gemma
    4, which normalises before rotary; OLMo hybrid over the whole width, [batch, pos,
    head·d_head]), or, where the norm follows rotary (``norm_after_rotary``: NanoChat),
    already rotated, heads first; a bridge that hooks only the projections (T5's)
    gives them as ``q.hook_out``/``k.hook_out``. A site :func:`capture_blocker` names is
    refused (ValueError). (Every bridge *lists* ``hook_rot_q`` in its ``hook_dict``, fired
    or not, so the listing cannot tell.)"""
    from transformer_lens.model_bridge.generalized_components.mla_attention import (
        MLAAttentionBridge,
    )
    from transformer_lens.model_bridge.generalized_components.position_embedding_hooks_mixin import (  # noqa: E501
        PositionEmbeddingHooksMixin,
    )
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (  # noqa: E501
        PositionEmbeddingsAttentionBridge,
    )

    reason = capture_blocker(bridge, site)
    if reason:
        raise ValueError(f"{site}: {reason}")
    attn = attention_component(bridge, site)
    norms = "q_norm" in attn.submodules
    if isinstance(attn, PositionEmbeddingsAttentionBridge):
        if norms and getattr(bridge.cfg, "qk_norm_after_rope", False):  # HunYuan
            return QKSource(Q_NORMED.format(site=site), K_NORMED.format(site=site),
                            heads_first=True)
        return QKSource(ROT_Q.format(site=site), ROT_K.format(site=site))
    q, k = PLAIN_Q.format(site=site), PLAIN_K.format(site=site)
    if q not in bridge.hook_dict and PROJ_Q.format(site=site) in bridge.hook_dict:
        q, k = PROJ_Q.format(site=site), PROJ_K.format(site=site)  # T5's bridge
    if isinstance(attn, MLAAttentionBridge):  # whole heads, plain and rotary parts, rotated
        return QKSource(q, k, heads_first=True)
    if "q_global" in attn.submodules and not rope:  # Longformer's projections (LED's encoder)
        return QKSource(PROJ_Q.format(site=site), PROJ_K.format(site=site), seq_first=True,
                        d_head=bridge.cfg.d_head)
    if norms:  # the base bridge hooks q/k before the model's own norms (Gemma 4)
        q, k = Q_NORM_OUT.format(site=site), K_NORM_OUT.format(site=site)
        if norm_after_rotary:  # the norms' outputs enter Q·Kᵀ as they are (NanoChat)
            return QKSource(q, k, heads_first=True)
    d_head = bridge.cfg.d_head if norms else None
    if not rope:
        return QKSource(q, k, d_head=d_head)
    if isinstance(attn, PositionEmbeddingHooksMixin):
        return QKSource(q, k, "hooked-angles", (COS.format(site=site), SIN.format(site=site)),
                        d_head=d_head)
    return QKSource(q, k, "scheme-angles", d_head=d_head)


def capture_blocker(bridge, site: str) -> str | None:
    """Why the q and k of the attention at ``site`` cannot be read as the model forms
    them, or None: a block TransformerLens wraps whole, with no attention component
    (RecurrentGemma's and Nemotron-H's layers; Zamba2's hybrid blocks, which call one
    attention block shared by several), an attention component that hooks no queries
    (JetMoE's mixture of attention heads forms them inside Hugging Face's module), or a
    layer that normalises its queries but reads another layer's keys (key/value sharing)."""
    attn = attention_component(bridge, site)
    if attn is None:
        parent = site.rpartition(".")[0]
        block = attention_component(bridge, parent)
        if block is None:
            return (f"TransformerLens's bridge has no block {parent} (its adapter names "
                    "its layers otherwise), so no attention component to hook")
        shared = hasattr(getattr(block, "original_component", None), "shared_transformer")
        return (f"TransformerLens's {type(block).__name__} wraps this block whole, with no "
                "attention component to hook"
                + (" (an attention block shared between layers is not measured)" if shared
                   else ": the layer's q and k are not read"))
    if not _hooks_queries(bridge, site):
        return (f"TransformerLens's {type(attn).__name__} hooks no queries (Hugging Face's "
                "module forms them inside), so the layer's q and k are not read")
    subs = getattr(attn, "submodules", {})
    if "q_norm" in subs and "k_norm" not in subs:
        return ("it normalises its queries but reads another layer's keys (key/value "
                "sharing), which the capture does not follow")
    return None


def _hooks_queries(bridge, site: str) -> bool:
    """Whether the attention at ``site`` has a hook the capture can read queries from
    (every bridge lists ``hook_rot_q``, fired or not: the projections' hooks tell)."""
    names = (PLAIN_Q, PROJ_Q, Q_NORMED, Q_NORM_OUT)
    return any(n.format(site=site) in bridge.hook_dict for n in names)


def qk_hook_names(bridge, site: str) -> tuple[str, str]:
    """Hook names of the queries/keys a layer's capture reads first (post-rotary where
    the bridge hooks them, see :func:`qk_source`)."""
    src = qk_source(bridge, site, rope=False)
    return src.q, src.k


def scores_hook_name(site: str) -> str:
    """``hook_attn_scores`` ``[batch head_index query_pos key_pos]`` of the attention at
    ``site``: the pre-softmax, masked scores q·kᵀ·scale wherever TransformerLens computes
    attention itself (GPT-2, the rotary models, the fast path), but not on every bridge:
    see :func:`scores_hook_is_logits`."""
    return SCORES.format(site=site)


def scores_hook_is_logits(bridge, site: str = block_site(0)) -> bool:
    """Whether ``hook_attn_scores`` at ``site`` carries the pre-softmax logits.

    False where the bridge's attention component is TransformerLens 4.3's base
    ``AttentionBridge``, whose forward hands the whole attention to the Hugging Face
    module (BERT, so ``minilm-l6``; GPT-J; T5): it then fires ``hook_attn_scores``
    afterwards on the attention *weights* HF returns, i.e. the post-softmax pattern
    softmax(q·kᵀ/√d_head + padding mask), the same tensor as ``hook_pattern`` (rows sum
    to 1; on MiniLM it differs from q·kᵀ/√d_head by up to ≈ 30). ``hook_q``/``hook_k``
    are right there too ([batch pos head_index d_head], equal to HF's query/key
    projections), so form the logits from them instead.
    """
    attn = attention_component(bridge, site)
    owner = next(c for c in type(attn).__mro__ if "forward" in vars(c))
    return owner.__name__ != "AttentionBridge"


def kv_head_map(n_heads: int, n_kv_heads: int) -> list[int]:
    """kv(h) = h // (n_heads / n_kv_heads): the key/value head each query head reads."""
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads do not split into {n_kv_heads} kv groups")
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]


# where Hugging Face attention modules keep the factor on q·k: most as ``scaling``, MPT as
# ``softmax_scale``, BLOOM and Falcon as ``inv_norm_factor``
SCALE_ATTRIBUTES = ("scaling", "softmax_scale", "inv_norm_factor")


def logit_scale(hf_model, d_head: int, attention=None) -> float:
    """The factor multiplying q·k in the model's attention (1/√d_head unless the HF
    attention module records its own: :data:`SCALE_ATTRIBUTES`), read from the first
    module of ``attention`` (an encoder-decoder's stack's; None: the model's)."""
    for module in hf_model.modules() if attention is None else attention:
        if not type(module).__name__.endswith("Attention"):
            continue
        for name in SCALE_ATTRIBUTES:
            scaling = getattr(module, name, None)
            if isinstance(scaling, float):
                return scaling
    return 1.0 / math.sqrt(d_head)

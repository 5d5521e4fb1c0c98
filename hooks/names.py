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

ROT_Q = "blocks.{layer}.attn.hook_rot_q"
ROT_K = "blocks.{layer}.attn.hook_rot_k"
PLAIN_Q = "blocks.{layer}.attn.hook_q"
PLAIN_K = "blocks.{layer}.attn.hook_k"
Q_NORMED = "blocks.{layer}.attn.hook_q_normed"
K_NORMED = "blocks.{layer}.attn.hook_k_normed"
Q_NORM_OUT = "blocks.{layer}.attn.q_norm.hook_out"
K_NORM_OUT = "blocks.{layer}.attn.k_norm.hook_out"
COS = "blocks.{layer}.attn.hook_cos"
SIN = "blocks.{layer}.attn.hook_sin"
SCORES = "blocks.{layer}.attn.hook_attn_scores"


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


def qk_source(bridge, layer: int, rope: bool) -> QKSource:
    """The :class:`QKSource` of ``layer`` (``rope``: whether the layer's scheme rotates),
    from the class of its attention bridge: TransformerLens's rotary bridge fires
    ``hook_rot_q``/``hook_rot_k`` (every layer, SmolLM3's NoPE ones included, where they
    equal q and k), or, where the model normalises q and k after rotary
    (``cfg.qk_norm_after_rope``, HunYuan), ``hook_q_normed``/``hook_k_normed``; the
    fused-QKV rotary bridge fires ``hook_cos``/``hook_sin`` but not the rotated q/k; the
    base bridge neither, and hooks q and k before the model's own q/k norms, read then
    from the norms' ``hook_out`` (Gemma 4, which normalises before rotary). A block
    :func:`capture_blocker` names is refused (ValueError). (Every bridge *lists*
    ``hook_rot_q`` in its ``hook_dict``, fired or not, so the listing cannot tell.)"""
    from transformer_lens.model_bridge.generalized_components.mla_attention import (
        MLAAttentionBridge,
    )
    from transformer_lens.model_bridge.generalized_components.position_embedding_hooks_mixin import (  # noqa: E501
        PositionEmbeddingHooksMixin,
    )
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (  # noqa: E501
        PositionEmbeddingsAttentionBridge,
    )

    reason = capture_blocker(bridge, layer)
    if reason:
        raise ValueError(f"block {layer}: {reason}")
    attn = bridge.blocks[layer].attn
    norms = "q_norm" in attn.submodules
    if isinstance(attn, PositionEmbeddingsAttentionBridge):
        if norms and getattr(bridge.cfg, "qk_norm_after_rope", False):  # HunYuan
            return QKSource(Q_NORMED.format(layer=layer), K_NORMED.format(layer=layer),
                            heads_first=True)
        return QKSource(ROT_Q.format(layer=layer), ROT_K.format(layer=layer))
    q, k = PLAIN_Q.format(layer=layer), PLAIN_K.format(layer=layer)
    if isinstance(attn, MLAAttentionBridge):  # whole heads, plain and rotary parts, rotated
        return QKSource(q, k, heads_first=True)
    if norms:  # the base bridge hooks q/k before the model's own norms (Gemma 4)
        q, k = Q_NORM_OUT.format(layer=layer), K_NORM_OUT.format(layer=layer)
    if not rope:
        return QKSource(q, k)
    if isinstance(attn, PositionEmbeddingHooksMixin):
        return QKSource(q, k, "hooked-angles", (COS.format(layer=layer),
                                                SIN.format(layer=layer)))
    return QKSource(q, k, "scheme-angles")


def capture_blocker(bridge, layer: int) -> str | None:
    """Why block ``layer``'s q and k cannot be read as the model forms them, or None: a
    block TransformerLens gives no attention component (Zamba2's hybrid blocks call one
    attention block shared by several), or a layer that normalises its queries but reads
    another layer's keys (key/value sharing)."""
    block = bridge.blocks[layer]
    attn = getattr(block, "attn", None)
    if attn is None:
        return (f"TransformerLens's {type(block).__name__} of this block has no attention "
                "component to hook (an attention block shared between layers is not "
                "measured)")
    subs = getattr(attn, "submodules", {})
    if "q_norm" in subs and "k_norm" not in subs:
        return ("it normalises its queries but reads another layer's keys (key/value "
                "sharing), which the capture does not follow")
    return None


def qk_hook_names(bridge, layer: int) -> tuple[str, str]:
    """Hook names of the queries/keys a layer's capture reads first (post-rotary where
    the bridge hooks them, see :func:`qk_source`)."""
    src = qk_source(bridge, layer, rope=False)
    return src.q, src.k


def scores_hook_name(layer: int) -> str:
    """``hook_attn_scores`` ``[batch head_index query_pos key_pos]``: the pre-softmax,
    masked scores q·kᵀ·scale wherever TransformerLens computes attention itself (GPT-2,
    the rotary models, the fast path), but not on every bridge: see
    :func:`scores_hook_is_logits`."""
    return SCORES.format(layer=layer)


def scores_hook_is_logits(bridge, layer: int = 0) -> bool:
    """Whether ``hook_attn_scores`` at ``layer`` carries the pre-softmax logits.

    False where the bridge's attention component is TransformerLens 4.3's base
    ``AttentionBridge``, whose forward hands the whole attention to the Hugging Face
    module (BERT, so ``minilm-l6``; GPT-J): it then fires ``hook_attn_scores`` afterwards
    on the attention *weights* HF returns, i.e. the post-softmax pattern
    softmax(q·kᵀ/√d_head + padding mask), the same tensor as ``hook_pattern`` (rows sum
    to 1; on MiniLM it differs from q·kᵀ/√d_head by up to ≈ 30). ``hook_q``/``hook_k``
    are right there too ([batch pos head_index d_head], equal to HF's query/key
    projections), so form the logits from them instead.
    """
    attn = bridge.blocks[layer].attn
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


def logit_scale(hf_model, d_head: int) -> float:
    """The factor multiplying q·k in the model's attention (1/√d_head unless the HF
    attention module records its own: :data:`SCALE_ATTRIBUTES`)."""
    for module in hf_model.modules():
        if not type(module).__name__.endswith("Attention"):
            continue
        for name in SCALE_ATTRIBUTES:
            scaling = getattr(module, name, None)
            if isinstance(scaling, float):
                return scaling
    return 1.0 / math.sqrt(d_head)

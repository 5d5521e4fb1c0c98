"""Which hook points carry the post-rotary queries, keys and attention scores.

The choice is made from the bridge itself (a rotary model exposes ``hook_rot_q``), so
any TransformerLens-supported architecture works without a table of its own.
"""

import math

ROT_Q = "blocks.{layer}.attn.hook_rot_q"
ROT_K = "blocks.{layer}.attn.hook_rot_k"
PLAIN_Q = "blocks.{layer}.attn.hook_q"
PLAIN_K = "blocks.{layer}.attn.hook_k"
SCORES = "blocks.{layer}.attn.hook_attn_scores"


def qk_hook_names(bridge, layer: int) -> tuple[str, str]:
    """Hook names of the queries/keys entering Q·Kᵀ at ``layer``: post-rotary for rotary
    models (``hook_rot_q``/``hook_rot_k``), otherwise ``hook_q``/``hook_k`` (GPT-2)."""
    rot_q = ROT_Q.format(layer=layer)
    if rot_q in bridge.hook_dict:
        return rot_q, ROT_K.format(layer=layer)
    return PLAIN_Q.format(layer=layer), PLAIN_K.format(layer=layer)


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
    module (BERT, so ``minilm-l6``): it then fires ``hook_attn_scores`` afterwards on the
    attention *weights* HF returns, i.e. the post-softmax pattern
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


def logit_scale(hf_model, d_head: int) -> float:
    """The factor multiplying q·k in the model's attention (1/√d_head unless the HF
    attention module records its own ``scaling``)."""
    for module in hf_model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, float) and type(module).__name__.endswith("Attention"):
            return scaling
    return 1.0 / math.sqrt(d_head)

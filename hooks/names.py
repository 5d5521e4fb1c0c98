"""Which hook points carry the post-rotary queries, keys and attention scores.

The choice is made from the bridge itself: a rotary bridge of the Llama family exposes
``hook_rot_q``/``hook_rot_k``; the fused-QKV rotary bridge (GPT-NeoX, Phi-3) hooks q and k
before rotary and ``hook_cos``/``hook_sin``, from which the capture rotates them; the base
bridge (GPT-J) hooks q and k before rotary only, which the capture rotates by the layer's
own frequencies (:mod:`poskernel_tl.hooks.rotary`).
"""

import math
import weakref
from dataclasses import dataclass

import torch

ROT_Q = "blocks.{layer}.attn.hook_rot_q"
ROT_K = "blocks.{layer}.attn.hook_rot_k"
PLAIN_Q = "blocks.{layer}.attn.hook_q"
PLAIN_K = "blocks.{layer}.attn.hook_k"
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


_FIRED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_PROBED = (ROT_Q, ROT_K, PLAIN_Q, PLAIN_K, COS, SIN)


def fired_hooks(bridge) -> frozenset[str]:
    """The q/k/rotary hook names that really fire in a forward of ``bridge``, found by one
    probe forward of two tokens (cached per bridge). A bridge lists ``hook_rot_q`` in its
    ``hook_dict`` whether or not its attention calls it (GPT-NeoX, Phi-3 and GPT-J never
    do), so the listing alone cannot tell."""
    if bridge in _FIRED:
        return _FIRED[bridge]
    names = [n.format(layer=L) for L in range(bridge.cfg.n_layers) for n in _PROBED]
    names = [n for n in names if n in bridge.hook_dict]
    seen: set[str] = set()
    hooks = [(n, lambda x, hook: seen.add(hook.name)) for n in names]
    probe = torch.zeros(1, 2, dtype=torch.long, device=bridge.cfg.device)
    with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
        bridge(probe)
    # an alias reports the name it is attached to: map both ways
    fired = frozenset(n for n in names if bridge.hook_dict[n].name in seen or n in seen)
    _FIRED[bridge] = fired
    return fired


def qk_source(bridge, layer: int, rope: bool) -> QKSource:
    """The :class:`QKSource` of ``layer``; ``rope``: whether the layer's scheme rotates."""
    fired = fired_hooks(bridge)
    rot_q = ROT_Q.format(layer=layer)
    if rot_q in fired:
        return QKSource(rot_q, ROT_K.format(layer=layer))
    q, k = PLAIN_Q.format(layer=layer), PLAIN_K.format(layer=layer)
    if not rope:
        return QKSource(q, k)
    cos = COS.format(layer=layer)
    if cos in fired:
        return QKSource(q, k, "hooked-angles", (cos, SIN.format(layer=layer)))
    return QKSource(q, k, "scheme-angles")


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


def logit_scale(hf_model, d_head: int) -> float:
    """The factor multiplying q·k in the model's attention (1/√d_head unless the HF
    attention module records its own ``scaling``)."""
    for module in hf_model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, float) and type(module).__name__.endswith("Attention"):
            return scaling
    return 1.0 / math.sqrt(d_head)

"""A fast attention path for TransformerLens bridges that keeps every hook point.

TransformerLens 4.3 runs attention eagerly inside its own bridge classes (projection,
RoPE, ``Q·Kᵀ``, mask, softmax, ``·V``) so that ``hook_attn_scores`` and ``hook_pattern``
can fire, never through ``scaled_dot_product_attention``: about 2× a plain Hugging Face
forward at T = 1024, where the measurement only reads the post-rotary queries and keys.

The two subclasses here fire the same hooks, in the same order and with the same shapes,
as TransformerLens's own forward, and compute attention with
:func:`torch.nn.functional.scaled_dot_product_attention` (causal, GQA without expanding
the keys) whenever nothing listens to ``hook_attn_scores``/``hook_pattern`` and the call
uses no feature the fast path does not reproduce. Otherwise they run TransformerLens's
own forward (``super()``), so attaching a hook to the scores or the pattern is all it
takes to get them. Hooks fired by the rotary bridge, in order::

    hook_in, q.hook_in, hook_q, k.hook_in, hook_k, v.hook_in, hook_v, hook_cos, hook_sin,
    hook_rot_q [batch pos head_index d_head], hook_rot_k [batch pos kv_head_index d_head],
    (hook_attn_scores, hook_pattern: TransformerLens's path only), hook_z (= o.hook_in),
    o.hook_out, hook_out

and by the fused-QKV bridge (GPT-2): ``hook_in, q/k/v.hook_in, hook_q, hook_k, hook_v,
(hook_attn_scores, hook_pattern), hook_z, o.hook_out, hook_hidden_states, hook_out``.
The fast path returns ``(attn_output, None)`` where TransformerLens returns the pattern
as the second element: Hugging Face's own sdpa attention returns None there too, and the
decoder layers discard it. Each call records the path it took (:func:`attention_paths`:
``"sdpa"``, or the reason it ran TransformerLens's code).

The classes depend on TransformerLens internals, so :func:`install_fast_attention`
switches a bridge only on the TransformerLens versions in :data:`VERIFIED_TL_VERSIONS`;
on any other it warns once and leaves the bridge on TransformerLens's own path.
"""

import importlib.metadata
import warnings
from typing import Any

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
    JointQKVAttentionBridge,
)
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from poskernel_tl.errors import UserError
from poskernel_tl.hooks.banded import banded_sdpa
from poskernel_tl.hooks.lazy_masks import install_lazy_masks, materialize, uninstall_lazy_masks
from poskernel_tl.hooks.masks import causal_window

# TransformerLens versions whose attention forwards these subclasses were checked against
VERIFIED_TL_VERSIONS: tuple[str, ...] = ("4.3.0",)
ATTENTION_CHOICES: tuple[str, ...] = ("sdpa", "eager")
FAST_PATH = "sdpa"  # what a call on the fast path records (:func:`attention_paths`)
NOT_INSTALLED = "TransformerLens's attention (fast path not installed)"

# config switches under which TransformerLens's forward takes a branch we do not reproduce
_ROTARY_CONFIG_FLAGS = ("use_split_qkv_input", "use_attn_in", "use_attn_result", "gated_q_proj",
                        "rotary_interleaved_cos_sin", "rotary_adjacent_pairs",
                        "qk_norm_after_rope")
_JOINT_CONFIG_FLAGS = ("use_split_qkv_input", "use_attn_in", "use_attn_result",
                       "scale_attn_by_inverse_layer_idx")
# Hugging Face attention attributes that change the computation (soft-capping, sinks, ...)
_HF_ATTN_FEATURES = ("key_multiplier", "attn_logit_softcapping", "sinks")


def transformer_lens_version() -> str:
    return importlib.metadata.version("transformer-lens")


_WARNED: set[str] = set()  # the unverified versions already warned about


def _warn_unverified(version: str) -> None:
    if version in _WARNED:
        return
    _WARNED.add(version)
    warnings.warn(
        f"poskernel_tl's fast attention path was verified on TransformerLens "
        f"{', '.join(VERIFIED_TL_VERSIONS)}, not {version}: the bridge stays on "
        "TransformerLens's own (eager) attention.", RuntimeWarning, stacklevel=3)


def _sdpa(
    q: Float[Tensor, "batch head_index query_pos d_head"],
    k: Float[Tensor, "batch kv_head_index key_pos d_head"],
    v: Float[Tensor, "batch kv_head_index key_pos d_head"],
    scale: float, window: int = 0,
) -> Float[Tensor, "batch head_index query_pos d_head"]:
    """Causal attention (``window`` > 0: a query t reads keys t − window < s ≤ t, computed
    on the band, :func:`banded_sdpa`); query head h reads key/value head
    h // (n_heads / n_kv_heads)."""
    if window:
        return banded_sdpa(q, k, v, scale, window)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _listened(hook: nn.Module) -> bool:
    return bool(hook.has_hooks() or hook._forward_hooks or hook._forward_pre_hooks
                or hook._backward_hooks)


def _dropout_active(attn: nn.Module) -> bool:
    hf_attn = attn.original_component
    for name in ("attention_dropout", "attn_dropout"):
        rate = getattr(hf_attn, name, None)
        rate = rate.p if isinstance(rate, nn.Dropout) else rate
        if isinstance(rate, int | float) and rate > 0 and (attn.training or hf_attn.training):
            return True
    return False


def _has_cached_positions(attn: nn.Module, kwargs: dict) -> bool:
    layer = getattr(attn, "_layer_idx", None) or 0
    for key in ("past_key_values", "layer_past", "cache"):
        cache = kwargs.get(key)
        if cache is None:
            continue
        seq_length = getattr(cache, "get_seq_length", None)
        if seq_length is None or seq_length(layer) != 0:
            return True
    return False


def _common_blocker(attn: nn.Module, q_len: int, kwargs: dict) -> str | None:
    """Why this call needs TransformerLens's own path (None: the fast path is exact)."""
    if _listened(attn.hook_attn_scores) or _listened(attn.hook_pattern):
        return "a hook on hook_attn_scores or hook_pattern"
    if not attn.is_causal or attn.is_cross_attention:
        return "not causal self-attention"
    if kwargs.get("output_attentions"):
        return "output_attentions"
    if _dropout_active(attn):
        return "attention dropout in training mode"
    if _has_cached_positions(attn, kwargs):
        return "a KV cache holding earlier positions"
    if causal_window(kwargs.get("attention_mask"), q_len) is None:
        return "an attention mask that is neither causal nor a causal sliding window"
    return None


def _feature_blocker(attn: nn.Module, flags: tuple[str, ...]) -> str | None:
    for flag in flags:
        if getattr(attn.config, flag, False):
            return f"config.{flag}"
    hf_attn = attn.original_component
    for name in _HF_ATTN_FEATURES:
        if getattr(hf_attn, name, None) is not None:
            return name
    hf_config = getattr(hf_attn, "config", None)
    if getattr(hf_config, "clip_qkv", None) is not None:
        return "clip_qkv"
    return None


def _match_output_dtype(attn: nn.Module, z: Tensor) -> Tensor:
    """TransformerLens casts the attention output to the output projection's float
    dtype (rotary modules returning float32 cos/sin promote q/k)."""
    weight = getattr(getattr(getattr(attn, "o", None), "original_component", None), "weight",
                     None)
    if (isinstance(weight, Tensor) and weight.dtype.is_floating_point
            and z.is_floating_point() and z.dtype != weight.dtype):
        z = z.to(dtype=weight.dtype)
    return z


def _only_hidden_states(args: tuple, kwargs: dict) -> Tensor | None:
    """The hidden states when they are the only positional input (else None: any other
    positional argument is left to TransformerLens's forward)."""
    if not args:
        found = kwargs.get("hidden_states")
    else:
        found = args[0] if len(args) == 1 and "hidden_states" not in kwargs else None
    return found if isinstance(found, Tensor) else None


def _materialized(kwargs: dict) -> dict:
    """``kwargs`` with a described mask replaced by the tensor it stands for (for
    TransformerLens's own attention)."""
    if "attention_mask" not in kwargs:
        return kwargs
    return {**kwargs, "attention_mask": materialize(kwargs["attention_mask"])}


class FastPositionEmbeddingsAttentionBridge(PositionEmbeddingsAttentionBridge):
    """TransformerLens's rotary attention bridge with an sdpa fast path (same hooks)."""

    _last_path: str | None = None  # the path of the last call (:func:`attention_paths`)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hidden_states = _only_hidden_states(args, kwargs)
        reason = ("no Hugging Face attention module" if self.original_component is None
                  else "positional inputs besides the hidden states" if hidden_states is None
                  else self.fast_path_blocker(hidden_states, kwargs))
        self._last_path = reason or FAST_PATH
        if reason is not None:
            return super().forward(*args, **_materialized(kwargs))
        return self._fast_forward(hidden_states, kwargs)

    def fast_path_blocker(self, hidden_states: Tensor, kwargs: dict) -> str | None:
        """Why a call with these inputs runs TransformerLens's forward (None: sdpa)."""
        reason = _common_blocker(self, hidden_states.shape[-2], kwargs)
        reason = reason or _feature_blocker(self, _ROTARY_CONFIG_FLAGS)
        if reason:
            return reason
        if self._modules.get("gate") is not None or "gate" in self.submodules:
            return "gate"
        if ("q_norm" in self.submodules or "k_norm" in self.submodules) and \
                self._qk_norm_phase not in ("pre_reshape", "post_reshape"):
            return f"QK-norm applied at {self._qk_norm_phase!r}"
        rope = getattr(getattr(self.original_component, "config", None), "rope_parameters",
                       None)
        if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
            return "llama-4 query scaling"
        embeddings = kwargs.get("position_embeddings")
        if not (isinstance(embeddings, tuple) and len(embeddings) == 2
                and all(isinstance(x, Tensor) for x in embeddings)):
            return "no (cos, sin) position embeddings"
        if any(x.shape[-1] != self.original_component.head_dim for x in embeddings):
            return "partial or half-width rotary"
        return None

    def _qk_norm(self, q: Tensor, k: Tensor, phase: str, head_dim: int
                 ) -> tuple[Tensor, Tensor]:
        """TransformerLens's QK-norm where this layer applies it in ``phase``: over the
        flattened heads before the reshape (OLMo-2), or per head on [batch, head, pos, d]
        after it (Gemma 3, Qwen3), firing ``hook_q_normed``/``hook_k_normed`` as it does."""
        has_q, has_k = "q_norm" in self.submodules, "k_norm" in self.submodules
        if not has_q or self._qk_norm_phase != phase:
            return q, k
        if phase == "pre_reshape":
            q = self._apply_pre_reshape_qk_norm(q, self.q_norm, self.hook_q_normed, head_dim)
            if has_k:
                k = self._apply_pre_reshape_qk_norm(k, self.k_norm, self.hook_k_normed,
                                                    head_dim)
            return q, k
        per_head = (lambda norm, x: norm(x.transpose(1, 2)).transpose(1, 2)) \
            if self._qk_norm_per_head else (lambda norm, x: norm(x))
        q = self.hook_q_normed(per_head(self.q_norm, q))
        if has_k:
            k = self.hook_k_normed(per_head(self.k_norm, k))
        return q, k

    def _fast_forward(self, hidden_states: Float[Tensor, "batch pos d_model"],
                      kwargs: dict) -> tuple[Float[Tensor, "batch pos d_model"], None]:
        head_dim = self.original_component.head_dim
        hidden_states = self.hook_in(hidden_states)
        input_shape = hidden_states.shape[:-1]
        heads = (*input_shape, -1, head_dim)
        q = self.q(hidden_states)
        k = self.k(hidden_states)
        v = self.v(hidden_states)
        q, k = self._qk_norm(q, k, "pre_reshape", head_dim)
        q, k, v = (x.view(heads).transpose(1, 2) for x in (q, k, v))
        q, k = self._qk_norm(q, k, "post_reshape", head_dim)
        cos, sin = self._apply_position_embedding_hooks(kwargs["position_embeddings"])
        # rotary in cos/sin's dtype, cast back (as OLMo's own attention does when its
        # cos/sin stay float32 under a half-precision forward; a no-op when they agree)
        dtype = q.dtype
        q, k = apply_rotary_pos_emb(q.to(cos.dtype), k.to(cos.dtype), cos, sin)
        q, k = q.to(dtype), k.to(dtype)
        if hasattr(self, "hook_rot_q"):
            q = self.hook_rot_q(q)
        if hasattr(self, "hook_rot_k"):
            k = self.hook_rot_k(k)
        k, v = self._update_kv_cache(k, v, **kwargs)
        scale = float(getattr(self.original_component, "scaling", head_dim**-0.5))
        z = _sdpa(q, k, v, scale, causal_window(kwargs.get("attention_mask"), q.shape[2]))
        z = z.transpose(1, 2).contiguous().reshape(*input_shape, -1)
        out = self.o(_match_output_dtype(self, z))
        return self.hook_out(out), None


class FastJointQKVAttentionBridge(JointQKVAttentionBridge):
    """TransformerLens's fused-QKV attention bridge (GPT-2) with an sdpa fast path."""

    _last_path: str | None = None  # the path of the last call (:func:`attention_paths`)

    def fast_path_blocker(self, q: Tensor, k: Tensor, v: Tensor, kwargs: dict) -> str | None:
        """Why attention on these projections runs TransformerLens's code (None: sdpa)."""
        if q.ndim != 3:
            return "per-head (split) inputs"
        reason = _common_blocker(self, q.shape[1], kwargs)
        reason = reason or _feature_blocker(self, _JOINT_CONFIG_FLAGS)
        if reason:
            return reason
        if getattr(self, "_reorder_and_upcast_attn", False):
            return "reorder_and_upcast_attn"
        if not q.dtype == k.dtype == v.dtype:
            return "q/k/v dtypes differ"
        return None

    def _reconstruct_attention(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> tuple:
        reason = self.fast_path_blocker(q, k, v, kwargs)
        self._last_path = reason or FAST_PATH
        if reason is not None:
            return super()._reconstruct_attention(q, k, v, **_materialized(kwargs))
        n_heads = self.config.n_heads
        n_kv_heads = getattr(self.config, "n_key_value_heads", None) or n_heads
        q, k, v, batch, pos, head_dim = self._reshape_qkv_to_heads(q, k, v, n_heads, n_kv_heads)
        k, v = self._update_kv_cache(k, v, **kwargs)
        z = _sdpa(q, k, v, float(head_dim**-0.5),
                  causal_window(kwargs.get("attention_mask"), q.shape[2]))
        z = self._reshape_attn_output(z, batch, pos, n_heads, head_dim)
        return self._apply_output_projection(z), None


# TransformerLens class -> our subclass; only modules of exactly these classes are switched
FAST_CLASSES: dict[type, type] = {
    PositionEmbeddingsAttentionBridge: FastPositionEmbeddingsAttentionBridge,
    JointQKVAttentionBridge: FastJointQKVAttentionBridge,
}
_ORIGINAL_CLASSES = {fast: base for base, fast in FAST_CLASSES.items()}


def _attention_modules(bridge) -> list[nn.Module]:
    return [block.attn for block in getattr(bridge, "blocks", ())
            if isinstance(getattr(block, "attn", None), nn.Module)]


def install_fast_attention(bridge) -> int:
    """Switch the attention of every block of this one bridge to the sdpa fast path.

    When every block runs the rotary class, the model's config also switches to masks
    described instead of built (:mod:`poskernel_tl.hooks.lazy_masks`): no [T, T] mask for a
    causal or sliding-window layer unless TransformerLens's own attention needs it.
    Only modules whose class is exactly a verified TransformerLens class are switched
    (other bridges, even of the same model, are untouched). Returns the number of blocks
    that run the fast path afterwards (0 on an unverified TransformerLens version, with a
    one-time warning, or for an architecture without a verified class).
    """
    version = transformer_lens_version()
    if version not in VERIFIED_TL_VERSIONS:
        _warn_unverified(version)
        return 0
    switched, rotary = 0, 0
    modules = _attention_modules(bridge)
    for attn in modules:
        fast = FAST_CLASSES.get(type(attn))
        if fast is not None:
            attn.__class__ = fast
        switched += type(attn) in _ORIGINAL_CLASSES
        rotary += type(attn) is FastPositionEmbeddingsAttentionBridge
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    if modules and rotary == len(modules) and config is not None:
        install_lazy_masks(config)  # every layer can read a described mask
    return switched


def attention_paths(bridge) -> list[str | None]:
    """Per block, what its attention's last call ran: :data:`FAST_PATH` (``"sdpa"``) or
    the reason for TransformerLens's own code (e.g. ``"a hook on hook_attn_scores or
    hook_pattern"``); None where it was not called since :func:`clear_attention_paths`
    (e.g. the layers after ``capture_qk(stop=True)`` ended the forward);
    :data:`NOT_INSTALLED` for a block not on a fast class. A call records its path as it
    decides: the rotary class as its forward begins (so the layer where a capture stops
    records it), the fused-QKV class (GPT-2) after its q/k/v hooks."""
    return [attn._last_path if type(attn) in _ORIGINAL_CLASSES else NOT_INSTALLED
            for attn in _attention_modules(bridge)]


def clear_attention_paths(bridge) -> None:
    """Forget every block's recorded path (None until its attention runs again)."""
    for attn in _attention_modules(bridge):
        if type(attn) in _ORIGINAL_CLASSES:
            attn._last_path = None


def uninstall_fast_attention(bridge) -> int:
    """Put every block of ``bridge`` back on TransformerLens's own attention; returns
    how many were switched back."""
    restored = 0
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    if config is not None:
        uninstall_lazy_masks(config)
    for attn in _attention_modules(bridge):
        base = _ORIGINAL_CLASSES.get(type(attn))
        if base is not None:
            attn.__class__ = base
            restored += 1
    return restored


def check_attention(attention: str) -> str:
    """``attention`` if it names an attention path, else a ValueError listing them."""
    if attention not in ATTENTION_CHOICES:
        raise UserError(f"attention={attention!r}: choose one of {', '.join(ATTENTION_CHOICES)}")
    return attention


def set_attention(bridge, attention: str) -> str:
    """``"sdpa"``: install the fast path; ``"eager"``: TransformerLens's own attention.
    Returns the path the bridge now runs (``"eager"`` when sdpa could not be installed)."""
    if check_attention(attention) == "eager":
        uninstall_fast_attention(bridge)
        return "eager"
    return "sdpa" if install_fast_attention(bridge) else "eager"

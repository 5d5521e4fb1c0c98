"""Attention masks that Hugging Face describes instead of building: the plain causal
mask and the causal sliding window, as a small :class:`LazyCausalMask`, materialised only
for a layer that really reads a [T, T] mask.

A transformers 5 decoder builds one 4D mask per kind of layer before its first layer
(``create_causal_mask``, ``create_sliding_window_causal_mask``), through the mask function
registered for ``config._attn_implementation``: under ``"eager"`` a float [batch, 1, T, T]
(4 GiB each at T = 32,768), which the fast attention path only reads back to learn that it
is causal or a window. :func:`install_lazy_masks` points the config at an implementation
registered here, ``"poskernel_lazy_<base>"``, whose mask function returns a
:class:`LazyCausalMask` exactly where Hugging Face's own sdpa mask function may skip the
mask (``allow_is_causal_skip``: no padding, no cache offset, no packed sequences or extra
mask functions) and the mask is the causal one or the config's sliding window (not a
chunked one); everywhere else it returns what ``<base>`` returns. The fast path reads the
window from the object (0: causal); TransformerLens's own attention, and Hugging Face's
(registered under the same name), get ``materialize()``: the base function's mask for the
same arguments, built on first use and shared by the layers of that kind.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

PREFIX = "poskernel_lazy_"
BASES: tuple[str, ...] = ("eager", "sdpa")  # the implementations whose masks are described


@dataclass(eq=False)
class LazyCausalMask:
    """A causal mask over ``q_length`` positions (``window`` 0) or a causal sliding window
    (a query t reads keys t − window < s ≤ t), for every sequence of a batch."""

    window: int
    q_length: int
    build: Callable[[], Any] = field(repr=False)
    _built: Any = field(default=None, repr=False)

    def materialize(self) -> Any:
        """The mask the base implementation builds for these arguments (cached)."""
        if self._built is None:
            self._built = self.build()
        return self._built


def _describable(kwargs: dict) -> int | None:
    """The window of the mask these arguments ask for (0: causal), or None when the base
    function must build it."""
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if not (kwargs.get("allow_is_causal_skip") and not kwargs.get("use_vmap")
            and isinstance(q_length, int) and q_length == kv_length):
        return None
    for offset in ("q_offset", "kv_offset"):
        value = kwargs.get(offset, 0)
        if not isinstance(value, int) or value != 0:
            return None
    padding = kwargs.get("attention_mask")
    if padding is not None and not (isinstance(padding, torch.Tensor) and padding.ndim == 2
                                    and bool(padding.all())):
        return None
    local_size, config = kwargs.get("local_size"), kwargs.get("config")
    if local_size is None:
        return 0
    if (not isinstance(local_size, int) or local_size < 1
            or getattr(config, "attention_chunk_size", None) is not None
            or local_size != getattr(config, "sliding_window", None)):
        return None
    return 0 if local_size >= q_length else local_size


def _lazy_mask(base: str, **kwargs: Any) -> Any:
    build = partial(ALL_MASK_ATTENTION_FUNCTIONS[base], **kwargs)
    window = _describable(kwargs)
    if window is None:
        return build()
    return LazyCausalMask(window=window, q_length=kwargs["q_length"], build=build)


def materialize(mask: Any) -> Any:
    """``mask`` itself, or the tensor a :class:`LazyCausalMask` stands for."""
    return mask.materialize() if isinstance(mask, LazyCausalMask) else mask


def _attention(base: str, module, query, key, value, attention_mask, *args, **kwargs):
    """Hugging Face's ``base`` attention on the materialised mask."""
    if base == "eager":
        function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward",
                           None)
        if function is None:
            raise RuntimeError(f"{type(module).__name__}: no eager_attention_forward to run")
    else:
        function = ALL_ATTENTION_FUNCTIONS[base]
    return function(module, query, key, value, materialize(attention_mask), *args, **kwargs)


for _base in BASES:
    AttentionMaskInterface.register(PREFIX + _base, partial(_lazy_mask, _base))
    AttentionInterface.register(PREFIX + _base, partial(_attention, _base))


def install_lazy_masks(config) -> bool:
    """Point ``config`` (and its sub-configs) at the lazy masks of its implementation;
    False (nothing changed) for an implementation other than eager or sdpa."""
    current = getattr(config, "_attn_implementation", None)
    if isinstance(current, str) and current.startswith(PREFIX):
        return True
    if current not in BASES:
        return False
    config._attn_implementation = PREFIX + current
    return True


def uninstall_lazy_masks(config) -> bool:
    """Put ``config`` back on the implementation it had; whether it was switched."""
    current = getattr(config, "_attn_implementation", None)
    if not (isinstance(current, str) and current.startswith(PREFIX)):
        return False
    config._attn_implementation = current.removeprefix(PREFIX)
    return True


__all__ = ["LazyCausalMask", "install_lazy_masks", "materialize", "uninstall_lazy_masks"]

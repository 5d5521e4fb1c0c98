"""What the attention mask a layer receives keeps: the plain causal mask, or a causal
sliding window of w tokens (a query t reads keys t − w < s ≤ t), read from the mask itself
so that the fast attention path reproduces it exactly."""

import weakref

import torch
from torch import Tensor

from poskernel_tl.hooks.lazy_masks import LazyCausalMask
from poskernel_tl.mask import Mask

_BANDS: dict = {}


def band(n: int, window: int, device) -> Tensor:
    """Bool [n, n]: True where 0 ≤ t − s < window (cached per size, window and device)."""
    key = (n, window, str(device))
    if key not in _BANDS:
        if len(_BANDS) >= 2:  # the forward's and a reducer's (the TL score's) at a time
            _BANDS.pop(next(iter(_BANDS)))
        _BANDS[key] = Mask(n, last=window - 1).kept(device=device, diagonal=True)
    return _BANDS[key]


# (weak reference to a mask checked, its version counter, the answer) of the last few: the
# model passes one mask object per kind of layer to every layer of that kind, so a forward
# checks each once, not once per layer
_LAST_MASKS: list = []


def _check_window(mask: Tensor) -> int | None:
    """0 for the plain causal mask, w for a causal sliding window (kept where
    0 ≤ t − s < w), None for any other mask."""
    n = mask.shape[-1]
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        keep = mask == 0
        if not bool((keep | (mask <= torch.finfo(mask.dtype).min)).all()):
            return None
    else:
        return None
    window = int(keep[..., -1, :].sum(-1).max())  # the last row keeps min(w, n) keys
    if window == 0 or not torch.equal(keep, band(n, window, mask.device).expand_as(keep)):
        return None
    return 0 if window >= n else window


def causal_window(mask: Tensor | LazyCausalMask | None, q_len: int) -> int | None:
    """What the ``attention_mask`` a layer receives keeps, for every sequence of the batch:
    0 for exactly the causal mask over ``q_len`` positions (or None), w for a causal
    sliding window of w tokens, None for anything else (4D, 0 or True where kept, the
    dtype's lowest value, -inf or False elsewhere; or a :class:`LazyCausalMask`)."""
    if mask is None:
        return 0
    if isinstance(mask, LazyCausalMask):  # described, never built: its window is exact
        return mask.window if mask.q_length == q_len else None
    if not isinstance(mask, Tensor) or mask.ndim != 4 or tuple(mask.shape[-2:]) != (q_len,
                                                                                     q_len):
        return None
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor has no version counter: no memo
        return _check_window(mask)
    for ref, seen, answer in _LAST_MASKS:
        if ref() is mask and seen == version:
            return answer
    answer = _check_window(mask)
    _LAST_MASKS[:] = [(weakref.ref(mask), version, answer)] + _LAST_MASKS[:3]
    return answer


def is_plain_causal(mask: Tensor | None, q_len: int) -> bool:
    """Whether ``mask`` is exactly the causal mask over ``q_len`` positions."""
    return causal_window(mask, q_len) == 0


__all__ = ["band", "causal_window", "is_plain_causal"]

"""Which head dimensions a layer rotates together, and rotary applied from a layer's
scheme where the bridge hooks only the queries and keys before it.

A layer's :class:`~poskernel_tl.models.scheme.LayerScheme` names its pair layout and rotated
share r of d_head: ``"rotate_half"`` (Llama, GPT-NeoX, Phi-3, Gemma) pairs dimension i with
i + r/2, ``"interleaved"`` (GPT-J) pairs 2i with 2i + 1, and dimensions ≥ r pass through;
all of it shifted by the scheme's ``rotary_offset`` (DeepSeek's MLA heads: plain
dimensions first, the rotary ones after them).
Pair j rotates by the angle θ_j·t at position t:

    x'[first_j]  = x[first_j]·cos − x[second_j]·sin,
    x'[second_j] = x[second_j]·cos + x[first_j]·sin.

TransformerLens's ``hook_cos`` holds cos per rotated dimension in the rotate-half layout
(``[θ_0..θ_{r/2−1}, θ_0..θ_{r/2−1}]``): its first r/2 columns are the pairs' cosines.
"""

from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Float
from torch import Tensor


@runtime_checkable
class LayerScheme(Protocol):
    """What the capture reads of a layer's positional scheme: the fields of
    :class:`poskernel_tl.models.scheme.LayerScheme` it uses (the capture layer sits below
    the models and reads a scheme, never builds one)."""

    pe: str
    rotary_dims: int | None
    rotary_offset: int
    layout: str | None
    inv_freq: tuple[float, ...] | None
    block: int | None
    site: str | None
    norm_after_rotary: float | None


def pair_indices(scheme: LayerScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second) index tensors over d_head, one entry per rotated pair, in the order
    of the layer's ``inv_freq``. ValueError for a layer without RoPE."""
    if scheme.pe != "rope" or not scheme.rotary_dims:
        raise ValueError(f"a {scheme.pe} layer has no rotary pairs")
    half, start = scheme.rotary_dims // 2, scheme.rotary_offset
    idx = torch.arange(half)
    if scheme.layout == "interleaved":
        return start + 2 * idx, start + 2 * idx + 1
    if scheme.layout == "rotate_half":
        return start + idx, start + idx + half
    raise ValueError(f"unknown rotary layout {scheme.layout!r}")


def pair_angles(scheme: LayerScheme, length: int, device, dtype
                ) -> tuple[Float[Tensor, "pos pair"], Float[Tensor, "pos pair"]]:
    """cos(θ_j·t), sin(θ_j·t) for t = 0..length−1, from the layer's ``inv_freq`` (formed in
    float64, then cast): for a bridge that hooks neither rotated q/k nor cos/sin (GPT-J)."""
    theta = torch.tensor(scheme.inv_freq, dtype=torch.float64, device=device)
    angle = torch.arange(length, dtype=torch.float64, device=device)[:, None] * theta
    return angle.cos().to(dtype), angle.sin().to(dtype)


def hooked_angles(cos: Float[Tensor, "batch pos rot"], sin: Float[Tensor, "batch pos rot"]
                  ) -> tuple[Float[Tensor, "batch pos pair"], Float[Tensor, "batch pos pair"]]:
    """The pairs' cos/sin from ``hook_cos``/``hook_sin`` (rotate-half layout, see the module
    docstring)."""
    half = cos.shape[-1] // 2
    return cos[..., :half], sin[..., :half]


def rotate(x: Float[Tensor, "batch pos head_index d_head"], scheme: LayerScheme,
           cos: Tensor, sin: Tensor) -> Float[Tensor, "batch pos head_index d_head"]:
    """x with each of the layer's pairs rotated (module docstring); ``cos``/``sin`` are
    [pos, pair] or [batch, pos, pair] (broadcast over heads)."""
    first, second = (i.to(x.device) for i in pair_indices(scheme))
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    a, b = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


__all__ = ["hooked_angles", "pair_angles", "pair_indices", "rotate"]

"""Which head dimensions the model rotates together, read from the model itself.

A rotary model's ``hook_cos`` holds cos(θ·pos) per head dimension. HF-style rotary
("rotate_half") repeats the frequencies as [θ_0..θ_{d/2-1}, θ_0..θ_{d/2-1}], pairing
dimension i with i + d/2; GPT-J style interleaves them, pairing 2i with 2i + 1.
"""

import torch

from poskernel_tl.hooks.names import ROT_Q

COS = "blocks.0.attn.hook_cos"


def rotary_pairs(bridge, d_head: int, probe_token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second) index tensors of length d_head/2: pair j rotates dimensions
    first[j] and second[j], in the order of the model's ``inv_freq``. Raises
    ValueError for a model without rotary hooks or an unrecognised layout."""
    if ROT_Q.format(layer=0) not in bridge.hook_dict or COS not in bridge.hook_dict:
        raise ValueError("model has no rotary hooks (hook_rot_q / hook_cos)")
    seen: dict = {}

    def grab(x, hook):
        seen["cos"] = x.detach()

    with torch.no_grad(), bridge.hooks(fwd_hooks=[(COS, grab)]):
        bridge(torch.full((1, 2), probe_token, dtype=torch.long, device=bridge.cfg.device))
    cos = seen["cos"].reshape(-1, seen["cos"].shape[-1])[1].double()  # position 1
    return pairs_from_cos(cos, d_head)


def pairs_from_cos(cos: torch.Tensor, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the pairing from cos(θ·1) per head dimension (see :func:`rotary_pairs`)."""
    half = d_head // 2
    idx = torch.arange(half)
    if cos.shape[-1] != d_head:
        raise ValueError(f"hook_cos has {cos.shape[-1]} dims, expected d_head={d_head}")
    if torch.allclose(cos[:half], cos[half:]):
        return idx, idx + half
    if torch.allclose(cos[0::2], cos[1::2]):
        return 2 * idx, 2 * idx + 1
    raise ValueError("unrecognised rotary layout in hook_cos")

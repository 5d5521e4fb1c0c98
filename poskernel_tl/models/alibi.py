"""ALiBi slopes read from the model's own code (BLOOM, MPT, Falcon with ``alibi=True``).

Each family builds its bias with its own function, on its own scale, and adds it where it
likes; the slope m_h that matters is the one on the softmax's input. Each builder is
called on two key positions and m_h is read as the step from key 0 to key 1:

- BLOOM: ``build_alibi_tensor`` gives m_h·s, added with β = 1 beside the scaled product
  (``alibi.baddbmm(q, kᵀ, beta=1, alpha=1/√d)``): m_h as built.
- MPT: the model's ``build_mpt_alibi_tensor(H, T)`` gives m_h·(s − T + 1), added after
  ``softmax_scale``: m_h as built (the model calls it without ``attn_config.alibi_bias_max``,
  so its default of 8 is what runs).
- Falcon: ``build_alibi_tensor`` gives m_h·s (slopes rounded to bfloat16, as Falcon does);
  its attention adds it to q·kᵀ before the 1/√d scaling, and its model adds alibi/√d to
  the causal mask it hands that attention as well, so the eager softmax reads 2·m_h/√d·s.
  Falcon forms the positions in bfloat16 too, exact up to s = 256: past that its bias
  departs from the linear ramp by the rounding, and the fit reads the exact ramp.

Every one of them differs from the paper's −m_h·(t − s) by a per-row constant
(:mod:`poskernel_tl.models.softmax_terms`); the tests check each against the input of
Hugging Face's eager softmax.
"""

import math

import torch
from torch import nn


def uses_alibi(cfg) -> bool:
    """Whether the config's attention adds an ALiBi bias."""
    kind = getattr(cfg, "model_type", None)
    if kind == "bloom":
        return True
    if kind == "mpt":
        return bool(getattr(getattr(cfg, "attn_config", None), "alibi", False))
    return kind == "falcon" and bool(getattr(cfg, "alibi", False))


def _step(bias: torch.Tensor, n_heads: int) -> tuple[float, ...]:
    """m_h from a bias built at key positions 0 and 1: [..., head, ..., 2] → step."""
    b = bias.double().reshape(n_heads, -1)
    return tuple(float(x) for x in b[:, -1] - b[:, -2])


def alibi_slopes(hf_model: nn.Module, n_heads: int) -> tuple[float, ...]:
    """m_h per query head on the scale of the softmax's input (module docstring); a
    ValueError for an architecture whose ALiBi this module does not know."""
    import importlib

    cfg = hf_model.config
    kind = getattr(cfg, "model_type", None)
    ones = torch.ones(1, 2, dtype=torch.long)
    if kind == "bloom":
        code = importlib.import_module("transformers.models.bloom.modeling_bloom")
        return _step(code.build_alibi_tensor(ones, n_heads, torch.float32), n_heads)
    if kind == "mpt":  # the call MptModel.forward makes (its default alibi_bias_max, 8)
        inner = getattr(hf_model, "transformer", hf_model)
        return _step(inner.build_mpt_alibi_tensor(n_heads, 2), n_heads)
    if kind == "falcon":
        code = importlib.import_module("transformers.models.falcon.modeling_falcon")
        d_head = cfg.hidden_size // n_heads
        step = _step(code.build_alibi_tensor(ones, n_heads, torch.float32), n_heads)
        return tuple(2 * m / math.sqrt(d_head) for m in step)
    raise ValueError(f"ALiBi of model type {kind!r}: slopes unknown (BLOOM, MPT and Falcon "
                     "are read)")


__all__ = ["alibi_slopes", "uses_alibi"]

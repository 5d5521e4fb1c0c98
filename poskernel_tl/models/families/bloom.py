"""BLOOM: ALiBi. ``build_alibi_tensor`` gives m_h·s (the key position), added with β = 1
beside the scaled product (``alibi.baddbmm(q, kᵀ, beta=1, alpha=1/√d)``): m_h as built."""

import importlib

import torch

from poskernel_tl.models.alibi import ramp_step, two_keys
from poskernel_tl.models.families.family import Family


class Bloom(Family):
    NAME = "BLOOM"
    MODEL_TYPES = frozenset({"bloom"})

    def uses_alibi(self, cfg) -> bool:
        return True

    def alibi_slopes(self, hf_model, n_heads: int) -> tuple[float, ...]:
        code = importlib.import_module("transformers.models.bloom.modeling_bloom")
        return ramp_step(code.build_alibi_tensor(two_keys(), n_heads, torch.float32), n_heads)


FAMILY = Bloom()

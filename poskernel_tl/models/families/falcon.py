"""Falcon. Two things particular to it.

**ALiBi** (``alibi=True``): ``build_alibi_tensor`` gives m_h·s (slopes rounded to
bfloat16, as Falcon does); its attention adds it to q·kᵀ before the 1/√d scaling, and its
model adds alibi/√d to the causal mask it hands that attention as well, so the eager
softmax reads 2·m_h/√d·s. Falcon forms the positions in bfloat16 too, exact up to
s = 256: past that its bias departs from the linear ramp by the rounding, and the fit
reads the exact ramp.

**The new decoder** (rotary, grouped key/value heads). TransformerLens 4.3's Falcon adapter
sets one key/value head whenever ``multi_query`` is set (also under
``new_decoder_architecture``, where Hugging Face reads ``num_kv_heads``) and splits the
fused ``query_key_value`` weight as contiguous [Q | K | V] blocks; Hugging Face lays it out
per key/value group, ``view(n_kv, group + 2, d_head, d_model)``: each group's query heads,
then its key head, then its value head. The bridge then fails to boot
(``split_with_sizes``) or, where the sizes happen to add up, splits the wrong rows.
:class:`GroupedFalconAdapter` splits the grouped layout and keeps the module's own
key/value head count; every other Falcon (ALiBi, multi-query, the old interleaved layout)
goes through TransformerLens's adapter unchanged. :meth:`Falcon.prepare` registers it for
``FalconForCausalLM`` and tells the bridge's config the key/value head count (as
``num_key_value_heads``, the name TransformerLens reads) before a bridge is booted.
"""

import importlib
import math

import torch
from torch import nn
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge.supported_architectures.falcon import (
    FalconArchitectureAdapter,
)

from poskernel_tl.models.alibi import ramp_step, two_keys
from poskernel_tl.models.families.family import Family


class GroupedFalconAdapter(FalconArchitectureAdapter):
    """TransformerLens's Falcon adapter with the new decoder's grouped qkv split."""

    def __init__(self, cfg) -> None:
        if getattr(cfg, "new_decoder_architecture", False):
            cfg.multi_query = False  # the new decoder reads num_kv_heads, whatever this says
        super().__init__(cfg)

    def _split_falcon_qkv(self, original_attention_component
                          ) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        if not self._is_new_arch:
            return super()._split_falcon_qkv(original_attention_component)
        qkv = original_attention_component.query_key_value
        n_kv = self.cfg.n_key_value_heads or self.cfg.n_heads
        group = self.cfg.n_heads // n_kv
        d_model = self.cfg.d_model
        d_head = d_model // self.cfg.n_heads
        w = qkv.weight.detach().view(n_kv, group + 2, d_head, d_model)
        b = None if qkv.bias is None else qkv.bias.detach().view(n_kv, group + 2, d_head)
        parts = (slice(0, group), slice(group, group + 1), slice(group + 1, group + 2))

        def linear(part: slice) -> nn.Linear:
            weight = w[:, part].reshape(-1, d_model)
            out = nn.Linear(d_model, weight.shape[0], bias=b is not None,
                            device=weight.device, dtype=weight.dtype)
            out.weight = nn.Parameter(weight.clone().contiguous())
            if b is not None:
                out.bias = nn.Parameter(b[:, part].reshape(-1).clone().contiguous())
            return out

        return linear(parts[0]), linear(parts[1]), linear(parts[2])


class Falcon(Family):
    NAME = "Falcon"
    MODEL_TYPES = frozenset({"falcon"})

    def uses_alibi(self, cfg) -> bool:
        return bool(getattr(cfg, "alibi", False))

    def alibi_slopes(self, hf_model, n_heads: int) -> tuple[float, ...]:
        code = importlib.import_module("transformers.models.falcon.modeling_falcon")
        d_head = hf_model.config.hidden_size // n_heads
        step = ramp_step(code.build_alibi_tensor(two_keys(), n_heads, torch.float32), n_heads)
        return tuple(2 * m / math.sqrt(d_head) for m in step)

    def prepare(self, hf_model) -> None:
        """The new decoder: register :class:`GroupedFalconAdapter` and state the key/value
        heads its attention keeps (module docstring)."""
        cfg = hf_model.config
        if not getattr(cfg, "new_decoder_architecture", False):
            return
        attn = next(m for m in hf_model.modules() if type(m).__name__ == "FalconAttention")
        cfg.num_key_value_heads = int(attn.num_kv_heads)
        ArchitectureAdapterFactory.register_adapter("FalconForCausalLM", GroupedFalconAdapter)


FAMILY = Falcon()

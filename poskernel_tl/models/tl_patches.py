"""Where TransformerLens 4.3 and transformers 5.x do not meet: two adapters mended for one
model, and the name TransformerLens knows an architecture by.

**Architecture names.** transformers writes some classes under another capitalisation than
the one TransformerLens registers its adapter for (PhiMoE: ``PhimoeForCausalLM`` against
``PhiMoEForCausalLM``): :func:`adapter_architecture` finds the registered one.

**Falcon's new decoder** (rotary, grouped key/value heads).

TransformerLens's Falcon adapter sets one key/value head whenever ``multi_query`` is set
(also under ``new_decoder_architecture``, where Hugging Face reads ``num_kv_heads``) and
splits the fused ``query_key_value`` weight as contiguous [Q | K | V] blocks; Hugging Face
lays it out per key/value group, ``view(n_kv, group + 2, d_head, d_model)``: each group's
query heads, then its key head, then its value head. The bridge then fails to boot
(``split_with_sizes``) or, where the sizes happen to add up, splits the wrong rows.

:class:`GroupedFalconAdapter` splits the grouped layout and keeps the module's own
key/value head count; every other Falcon (ALiBi, multi-query, the old interleaved layout)
goes through TransformerLens's adapter unchanged. :func:`prepare_falcon` registers it for
``FalconForCausalLM`` and tells the bridge's config the key/value head count (as
``num_key_value_heads``, the name TransformerLens reads) before a bridge is booted.

**CodeGen.** TransformerLens's CodeGen attention reads the rotary table and the score
scale from attributes transformers 4.x kept on each attention module (``embed_positions``,
``scale_attn``); transformers 5 keeps the table on ``transformer.rotary_emb`` and the
scale as ``scaling``, and the bridge fails on its first forward. :func:`prepare_codegen`
gives each attention module of the booted model the attributes the bridge reads, taken
from the model itself (the shared table; √d_head, the inverse of its ``scaling``).
"""

import torch
from torch import nn
from transformer_lens.factories.architecture_adapter_factory import (
    SUPPORTED_ARCHITECTURES,
    ArchitectureAdapterFactory,
)
from transformer_lens.model_bridge.supported_architectures.falcon import (
    FalconArchitectureAdapter,
)


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


def prepare_falcon(hf_model: nn.Module) -> None:
    """Before booting a bridge around a Falcon with the new decoder: register
    :class:`GroupedFalconAdapter` and state the key/value heads its attention keeps."""
    cfg = hf_model.config
    if getattr(cfg, "model_type", None) != "falcon" or not getattr(
            cfg, "new_decoder_architecture", False):
        return
    attn = next(m for m in hf_model.modules() if type(m).__name__ == "FalconAttention")
    cfg.num_key_value_heads = int(attn.num_kv_heads)
    ArchitectureAdapterFactory.register_adapter("FalconForCausalLM", GroupedFalconAdapter)


def prepare_codegen(hf_model: nn.Module) -> None:
    """The attributes TransformerLens's CodeGen bridge reads, on every attention module of
    a transformers-5 CodeGen (module docstring); nothing for any other model."""
    if getattr(hf_model.config, "model_type", None) != "codegen":
        return
    table = hf_model.transformer.rotary_emb.embed_positions
    for module in hf_model.modules():
        if type(module).__name__ == "CodeGenAttention" and not hasattr(module,
                                                                      "embed_positions"):
            module.register_buffer("embed_positions", table, persistent=False)
            module.scale_attn = torch.tensor(1.0 / module.scaling, dtype=torch.float32,
                                             device=table.device)


def adapter_architecture(hf_model: nn.Module) -> str:
    """The architecture name a bridge is booted under: the config's first, or the name
    TransformerLens registers an adapter under that differs from it in case only."""
    name = (getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__])[0]
    if name in SUPPORTED_ARCHITECTURES:
        return name
    same = [a for a in SUPPORTED_ARCHITECTURES if a.lower() == name.lower()]
    return same[0] if same else name


def related_architectures(name: str) -> list[str]:
    """The architectures TransformerLens has adapters for whose name starts as ``name``'s
    model does (``Gemma3nForCausalLM`` → ``Gemma3nForConditionalGeneration``)."""
    stem = name.split("For")[0].lower()
    return [a for a in SUPPORTED_ARCHITECTURES if a.split("For")[0].lower() == stem
            and a != name]


__all__ = ["GroupedFalconAdapter", "adapter_architecture", "prepare_codegen", "prepare_falcon",
           "related_architectures"]


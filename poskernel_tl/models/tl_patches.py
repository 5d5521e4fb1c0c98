"""Where TransformerLens 4.3 and transformers 5.x do not meet in general: the name
TransformerLens knows an architecture by. (What is particular to one model family — an
adapter mended or added, attributes its bridge reads — is that family's file in
:mod:`poskernel_tl.models.families`.)

**Architecture names.** transformers writes some classes under another capitalisation than
the one TransformerLens registers its adapter for (PhiMoE: ``PhimoeForCausalLM`` against
``PhiMoEForCausalLM``): :func:`adapter_architecture` finds the registered one.
"""

from torch import nn
from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES


def adapter_architecture(hf_model: nn.Module) -> str:
    """The architecture name a bridge is booted under: the class transformers built where
    TransformerLens has an adapter for it (a hub EXAONE 3 config names the remote-code
    ``ExaoneForCausalLM``, whose adapter reads that code's module names, while transformers
    builds it as ``LlamaForCausalLM``), else the config's first, or the name TransformerLens
    registers an adapter under that differs from it in case only."""
    if type(hf_model).__name__ in SUPPORTED_ARCHITECTURES:
        return type(hf_model).__name__
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


__all__ = ["adapter_architecture", "related_architectures"]

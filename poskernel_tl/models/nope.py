"""The NoPE twin of a Llama-family model: rotary made the identity on one model instance
(TinyLlama-NoPE's weights were trained without positional encoding)."""

import torch
from torch import nn

from poskernel_tl.errors import UserError


class NoRotaryEmbedding(nn.Module):
    """Stand-in for a Llama rotary module that makes rotary the identity (cos=1, sin=0).

    Installed on one model instance only, so models loaded beside it are unaffected.
    """

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("inv_freq", torch.zeros(head_dim // 2), persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        shape = (*position_ids.shape, self.head_dim)
        cos = torch.ones(shape, dtype=x.dtype, device=x.device)
        return cos, torch.zeros_like(cos)


def apply_nope(hf_model: nn.Module) -> nn.Module:
    """Disable rotary on a Llama-family model by replacing its rotary module."""
    inner = getattr(hf_model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None:
        raise UserError(f"{type(hf_model).__name__} has no model.rotary_emb to disable")
    cfg = hf_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inner.rotary_emb = NoRotaryEmbedding(head_dim).to(rotary.inv_freq.device)
    return hf_model


__all__ = ["NoRotaryEmbedding", "apply_nope"]

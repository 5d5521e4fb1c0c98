"""LED (Longformer encoder-decoder): a BART-layout encoder-decoder under ``led.`` whose
encoder attends through Longformer's sliding windows.

Its decoder is plain BART attention (causal, learned absolute positions, scaled q·k) and is
measured as BART's is (``hf:DIR@decoder``). Its encoder (``@encoder``, the default) keeps,
for each query, the keys within ``one_sided_attn_window_size`` (half of the layer's
``attention_window``) on both sides: a two-sided sliding window, read from the model's
own attention modules (one per layer: ``attention_window`` may give each its own).
Longformer computes it on a banded layout over inputs padded inside
the model to a multiple of the window; the capture reads q and k as the module projects
them (sequence first, over the padded length) and keeps the real tokens
(:func:`~poskernel_tl.hooks.names.qk_source`), and the self-check reads the banded softmax
input back onto T × T (:meth:`Led.softmax_input`). Global-attention tokens (a
``global_attention_mask``) are never passed: every encoder token attends locally.
"""

import torch
from torch import Tensor

from poskernel_tl.models.families.bart import Bart
from poskernel_tl.models.families.family import Stack


class Led(Bart):
    NAME = "LED"
    MODEL_TYPES = frozenset({"led"})

    def stack_module(self, hf_model, stack: Stack):
        return getattr(hf_model.led, stack.name)

    def attention(self, hf_model, stack: Stack) -> list:
        if stack.name == "decoder":
            return super().attention(hf_model, stack)
        return [layer.self_attn.longformer_self_attn
                for layer in self.stack_module(hf_model, stack).layers]

    def geometry(self, cfg, stack: Stack) -> dict:
        """BART's, with each stack's context: its learned position table's length."""
        return {**super().geometry(cfg, stack),
                "n_ctx": cfg.max_encoder_position_embeddings if stack.name == "encoder"
                else cfg.max_decoder_position_embeddings}

    def window_reach(self, cfg, layer_type: str, layer: int) -> int:
        """The last |t − s| encoder layer ``layer`` keeps: its Longformer attention
        module's ``one_sided_attn_window_size``, as the model builds it from the config
        (``attention_window``: one size, or one per layer)."""
        from transformers.models.led.modeling_led import LEDEncoderSelfAttention

        return LEDEncoderSelfAttention(cfg, layer_id=layer).one_sided_attn_window_size

    def softmax_input(self, hf_model, x: Tensor, length: int) -> Tensor | None:
        """A Longformer layer's softmax input — [batch, padded T, head, 2w + 1], entry j of
        query t the key t + j − w, w that layer's window — as [batch, head, T, T] (−inf off
        the band), or None for any other call."""
        windows = {layer.self_attn.longformer_self_attn.one_sided_attn_window_size
                   for layer in hf_model.led.encoder.layers}
        heads = hf_model.config.encoder_attention_heads
        w = (x.shape[-1] - 1) // 2
        if x.ndim != 4 or x.shape[1] < length or w not in windows \
                or x.shape[2:] != (heads, 2 * w + 1):
            return None
        t = torch.arange(length, device=x.device)[:, None]
        s = t + torch.arange(-w, w + 1, device=x.device)[None]
        inside = (s >= 0) & (s < length)
        out = x.new_full((x.shape[0], heads, length, length), -torch.inf)
        band = x[:, :length].permute(0, 2, 1, 3)  # [batch, head, T, 2w + 1]
        out[:, :, t.expand_as(s)[inside], s[inside]] = band[:, :, inside]
        return out

    def note(self, hf_model) -> str:
        return ("encoder-decoder: each stack measured as its own model (@encoder, the "
                "default: Longformer's two-sided window, no global tokens; @decoder), both fed "
                "the same tokens; cross-attention (no offset) skipped")


FAMILY = Led()

"""LED (Longformer encoder-decoder): a BART-layout encoder-decoder under ``led.`` whose
encoder attends through Longformer's sliding windows.

Its decoder is plain BART attention (causal, learned absolute positions, scaled q·k) and is
measured as BART's is (``hf:DIR@decoder``). Its encoder (``@encoder``, the default) keeps,
for each query, the keys within ``one_sided_attn_window_size`` (half of the layer's
``attention_window``) on both sides: a two-sided sliding window, read from the model's
own attention modules. Longformer computes it on a banded layout over inputs padded inside
the model to a multiple of the window; the capture reads q and k as the module projects
them (sequence first, over the padded length) and keeps the real tokens
(:func:`~poskernel_tl.hooks.names.qk_source`), and the self-check reads the banded softmax
input back onto T × T (:meth:`Led.softmax_input`). Global-attention tokens (a
``global_attention_mask``) are never passed: every encoder token attends locally.
"""

import copy

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

    def stack_config(self, cfg, stack: Stack):
        """The encoder's layers as sliding ones (their window is read by
        :meth:`window_reach`); the decoder's as the config says (full)."""
        if stack.name != "encoder":
            return cfg
        sliding = copy.deepcopy(cfg)
        sliding.layer_types = ["sliding_attention"] * cfg.encoder_layers
        return sliding

    def geometry(self, cfg, stack: Stack) -> dict:
        """BART's, with each stack's context: its learned position table's length."""
        return {**super().geometry(cfg, stack),
                "n_ctx": cfg.max_encoder_position_embeddings if stack.name == "encoder"
                else cfg.max_decoder_position_embeddings}

    def window_reach(self, cfg) -> int:
        """The last |t − s| the encoder's layers keep: each Longformer attention module's
        ``one_sided_attn_window_size``, as the model builds it from the config; one value
        for every layer (a ValueError names the layers' windows where they differ)."""
        from transformers.models.led.modeling_led import LEDEncoderSelfAttention

        reach = {LEDEncoderSelfAttention(cfg, layer_id=i).one_sided_attn_window_size
                 for i in range(cfg.encoder_layers)}
        if len(reach) != 1:
            raise ValueError(f"LED's encoder layers keep different windows (attention_window "
                             f"{cfg.attention_window}): one window per model is measured")
        return reach.pop()

    def softmax_input(self, hf_model, x: Tensor, length: int) -> Tensor | None:
        """A Longformer layer's softmax input — [batch, padded T, head, 2w + 1], entry j of
        query t the key t + j − w — as [batch, head, T, T] (−inf off the band), or None
        for any other call."""
        w = hf_model.led.encoder.layers[0].self_attn.longformer_self_attn \
            .one_sided_attn_window_size
        heads = hf_model.config.encoder_attention_heads
        if x.ndim != 4 or x.shape[1] < length or x.shape[2:] != (heads, 2 * w + 1):
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

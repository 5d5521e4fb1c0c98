"""T5Gemma: an encoder-decoder built from Gemma 2's layers. Each stack keeps its own config
(``config.encoder``, ``config.decoder``: layer types, sliding window, soft-cap,
``query_pre_attn_scalar``) and its own rotary table (``model.encoder.rotary_emb``,
``model.decoder.rotary_emb``), which the generic scheme reading reads per stack.

Two stacks, each measured as a model of its own: ``@encoder`` (the default; two-sided)
and ``@decoder`` (causal; its sliding layers the causal window of Gemma 2). Both are fed
the same tokens. The decoder's cross-attention layers (no offset between a query and a
key) are skipped. The encoder's sliding layers keep a *two-sided* window, |t − s| ≤ w,
the rule read from the mask builder the encoder calls; such a window is measured where it
does not bind (T ≤ w + 1: 4,097 tokens for the released models) and refused past it.
"""

import copy

import torch

from poskernel_tl.models.families.family import Family, Stack
from poskernel_tl.models.scheme import SLIDING_TYPES

PROBE_WINDOW, PROBE_LENGTH = 3, 12


class T5Gemma(Family):
    NAME = "T5Gemma"
    MODEL_TYPES = frozenset({"t5gemma"})
    LOADS_AS = "seq2seq"
    STACKS = (Stack("encoder", causal=False, site="encoder_blocks.{i}.attn"),
              Stack("decoder", causal=True, site="decoder_blocks.{i}.self_attn"))
    NORM = "rmsnorm"

    def stack_module(self, hf_model, stack: Stack):
        return getattr(hf_model.model, stack.name)

    def attention(self, hf_model, stack: Stack) -> list:
        layers = self.stack_module(hf_model, stack).layers
        return [getattr(x.self_attn, "original_component", x.self_attn) for x in layers]

    def stack_config(self, cfg, stack: Stack):
        return getattr(cfg, stack.name)

    def geometry(self, cfg, stack: Stack) -> dict:
        sub = self.stack_config(cfg, stack)
        return dict(n_layers=sub.num_hidden_layers, n_heads=sub.num_attention_heads,
                    n_kv_heads=sub.num_key_value_heads, d_head=sub.head_dim,
                    n_ctx=sub.max_position_embeddings, causal=stack.causal, pe="rope")

    def window_reach(self, cfg, layer_type: str, layer: int) -> int | None:
        """A sliding layer's, read by building the encoder's own sliding mask at a probe
        window and length and taking the largest |t − s| it keeps (the reach of ``cfg``'s
        window is the same rule at its size); a full layer keeps every offset."""
        from transformers.models.t5gemma import modeling_t5gemma

        if layer_type not in SLIDING_TYPES:
            return None
        probe = copy.deepcopy(cfg)
        probe.sliding_window, probe._attn_implementation = PROBE_WINDOW, "eager"
        mask = modeling_t5gemma.create_bidirectional_sliding_window_mask(
            config=probe, inputs_embeds=torch.zeros(1, PROBE_LENGTH, 1),
            attention_mask=torch.ones(1, PROBE_LENGTH, dtype=torch.long))
        kept = mask[0, 0] == 0 if mask.dtype != torch.bool else mask[0, 0]
        t = torch.arange(PROBE_LENGTH)
        reach = int((t[:, None] - t[None, :]).abs()[kept].max())
        if not torch.equal(kept, (t[:, None] - t[None, :]).abs() <= reach):
            raise ValueError("the encoder's sliding mask is no two-sided band of the offset")
        return cfg.sliding_window + reach - PROBE_WINDOW

    def note(self, hf_model) -> str:
        return ("encoder-decoder: each stack measured as its own model (@encoder, the "
                "default; @decoder), both fed the same tokens; cross-attention (no offset) "
                "skipped; the encoder's sliding layers keep |t − s| ≤ w (measured up to "
                "T = w + 1)")


FAMILY = T5Gemma()

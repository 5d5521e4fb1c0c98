"""The BART family of encoder-decoders (BART, mBART, Blenderbot, Marian, Pegasus, M2M-100):
absolute positions added to the token embeddings (learned, or fixed sinusoids for Marian,
Pegasus and M2M-100), scaled q·k, no term added to the softmax's input.

Two stacks, each measured as a model of its own, as T5's are: ``@encoder`` (the default;
two-sided) and ``@decoder`` (causal), both fed the same tokens. The decoder's
cross-attention layers read the encoder's output, with no offset between a query and a
key, and are skipped.
"""

from poskernel_tl.models.families.family import Family, Stack


class Bart(Family):
    NAME = "BART"
    MODEL_TYPES = frozenset({"bart", "mbart", "blenderbot", "marian", "pegasus", "m2m_100"})
    LOADS_AS = "seq2seq"
    STACKS = (Stack("encoder", causal=False, site="encoder_blocks.{i}.attn"),
              Stack("decoder", causal=True, site="decoder_blocks.{i}.self_attn"))
    NORM = "layernorm"

    def attention(self, hf_model, stack: Stack) -> list:
        layers = self.stack_module(hf_model, stack).layers
        return [getattr(layer.self_attn, "original_component", layer.self_attn)
                for layer in layers]

    def stack_module(self, hf_model, stack: Stack):
        return getattr(hf_model.model, stack.name)

    def geometry(self, cfg, stack: Stack) -> dict:
        encoder = stack.name == "encoder"
        return dict(n_layers=cfg.encoder_layers if encoder else cfg.decoder_layers,
                    n_heads=cfg.encoder_attention_heads if encoder else
                    cfg.decoder_attention_heads, causal=stack.causal, pe="learned-absolute",
                    n_kv_heads=cfg.encoder_attention_heads if encoder else
                    cfg.decoder_attention_heads, d_head=cfg.d_model // (
                        cfg.encoder_attention_heads if encoder else cfg.decoder_attention_heads))

    def note(self, hf_model) -> str:
        return ("encoder-decoder: each stack measured as its own model (@encoder, the "
                "default; @decoder), both fed the same tokens; cross-attention (no offset) "
                "skipped")


FAMILY = Bart()

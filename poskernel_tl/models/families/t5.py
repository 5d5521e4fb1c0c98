"""T5 and the models built on its attention (T5, mT5, Switch Transformers, LongT5):
encoder-decoders whose self-attention adds a learned table of per-head biases over
bucketed offsets (the ``relative_bias`` term) to an *unscaled* q·k (no 1/√d: the scale
is folded into the initialisation; the attention module keeps it as ``scaling = 1.0``,
which is what the logit scale reads).

Two stacks, each measured as a model of its own: ``@encoder`` (the default; two-sided)
and ``@decoder`` (causal). Both are fed the same tokens (the decoder's input is the
encoder's, not shifted right). The decoder's cross-attention layers read the encoder's
output, with no offset between a query and a key, and are skipped. LongT5's encoder
attends within a local window in blocks (or with transient global tokens): not measured,
said in one line; its decoder is an ordinary T5 decoder.
"""

from poskernel_tl.models.families.family import Family, Stack


class T5(Family):
    NAME = "T5"
    MODEL_TYPES = frozenset({"t5", "mt5", "switch_transformers", "longt5"})
    LOADS_AS = "seq2seq"
    STACKS = (Stack("encoder", causal=False, site="encoder_blocks.{i}.attn"),
              Stack("decoder", causal=True, site="decoder_blocks.{i}.self_attn"))
    NORM = "rmsnorm"  # T5LayerNorm: no mean subtracted, no bias

    def attention(self, hf_model, stack: Stack) -> list:
        blocks = self.stack_module(hf_model, stack).block
        return [_self_attention(block.layer[0]) for block in blocks]

    def stack_module(self, hf_model, stack: Stack):
        return getattr(hf_model, stack.name)

    def geometry(self, cfg, stack: Stack) -> dict:
        n_layers = cfg.num_layers if stack.name == "encoder" else \
            (cfg.num_decoder_layers or cfg.num_layers)
        return dict(n_layers=n_layers, n_heads=cfg.num_heads, n_kv_heads=cfg.num_heads,
                    d_head=cfg.d_kv, causal=stack.causal, pe="relative-bias")

    def refusal(self, hf_model, stack: Stack) -> str | None:
        cfg = hf_model.config
        if stack.name == "encoder" and cfg.model_type == "longt5":
            return (f"LongT5's encoder attends {cfg.encoder_attention_type!r} (a two-sided "
                    f"window of ±{cfg.local_radius} in blocks), which is not measured; its "
                    "decoder is (@decoder)")
        return None

    def note(self, hf_model) -> str:
        return ("encoder-decoder: each stack measured as its own model (@encoder, the "
                "default; @decoder), both fed the same tokens; cross-attention (no offset) "
                "skipped")


def _self_attention(layer):
    """The attention module of a block's self-attention layer (``SelfAttention``, LongT5's
    ``LocalSelfAttention`` / ``TransientGlobalSelfAttention``)."""
    for name in ("SelfAttention", "LocalSelfAttention", "TransientGlobalSelfAttention"):
        found = getattr(layer, name, None)
        if found is not None:
            return getattr(found, "original_component", found)
    raise ValueError(f"{type(layer).__name__} has no self-attention module")


FAMILY = T5()

"""Tiny random configs of TransformerLens-supported decoders beyond the per-layer-scheme and
softmax sets of ``tiny_models`` (4 layers, 4 query heads, hidden 64, d_head 16; a 16-token
window where there is one; 2 experts for mixtures; hybrids with attention in two of their
four blocks), each with the outcome the toolkit owes it: exact against the input of Hugging
Face's eager softmax (None), or refused in one line (a phrase of the refusal)."""

import transformers as tf
from adapter_configs import REFUSED_ADAPTERS, adapter_decoders
from tiny_shapes import COMMON, IDS, LOCAL_GLOBAL, MOE, N_CTX, SSM, VOCAB


def _gemma(cls, **extra):
    return cls(**COMMON, num_key_value_heads=2, head_dim=16, sliding_window=16,
               layer_types=LOCAL_GLOBAL, vocab_size_per_layer_input=VOCAB,
               hidden_size_per_layer_input=16, **extra)


def _dense() -> dict:
    kv2 = dict(num_key_value_heads=2)
    return {
        # window / full layers, each kind its own rotary (the full ones 25 % of the dims,
        # "proportional"), q/k/v norms before rotary, scale 1
        "gemma4": lambda: _gemma(tf.Gemma4TextConfig, per_layer_config={"3": {"head_dim": 16}}),
        "hunyuan_v1_dense": lambda: tf.HunYuanDenseV1Config(**COMMON, **kv2, head_dim=16),
        # local attention on alternate layers (attention_layers, window_size), no 1/√d
        "gpt_neo": lambda: tf.GPTNeoConfig(
            vocab_size=VOCAB, hidden_size=64, num_layers=4, num_heads=4, window_size=16,
            max_position_embeddings=N_CTX, attention_types=[[["global", "local"], 2]], **IDS),
        # multi-query attention, one fused qkv of width d + 2·d_head
        "gpt_bigcode": lambda: tf.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=64, n_layer=4,
                                                   n_head=4, n_positions=N_CTX,
                                                   multi_query=True, **IDS),
        "olmo3": lambda: tf.Olmo3Config(**COMMON, **kv2, sliding_window=16),
        "gemma": lambda: tf.GemmaConfig(**COMMON, **kv2, head_dim=16),
        "glm": lambda: tf.GlmConfig(**COMMON, **kv2, head_dim=16),
        "glm4": lambda: tf.Glm4Config(**COMMON, **kv2, head_dim=16),
        "exaone4": lambda: tf.Exaone4Config(**COMMON, **kv2, sliding_window=16,
                                            layer_types=LOCAL_GLOBAL),
        "nemotron": lambda: tf.NemotronConfig(**COMMON, **kv2),
        "seed_oss": lambda: tf.SeedOssConfig(**COMMON, **kv2, head_dim=16),
        "ministral3": lambda: tf.Ministral3Config(**COMMON, **kv2, head_dim=16),
        "apertus": lambda: tf.ApertusConfig(**COMMON, **kv2),
        "vaultgemma": lambda: tf.VaultGemmaConfig(**COMMON, num_key_value_heads=1, head_dim=16,
                                                  sliding_window=16, query_pre_attn_scalar=16,
                                                  attn_logit_softcapping=0.5),
        "openai_gpt": lambda: tf.OpenAIGPTConfig(vocab_size=VOCAB, n_embd=64, n_layer=4,
                                                 n_head=4, n_positions=N_CTX),
    }


def _mixtures_and_hybrids() -> dict:
    kv2 = dict(num_key_value_heads=2)
    shared = dict(moe_intermediate_size=32, shared_expert_intermediate_size=32)
    return {
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(**COMMON, **kv2, num_experts=2,
                                               num_experts_per_tok=1, **shared),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**COMMON, **kv2, head_dim=16, num_experts=2,
                                               num_experts_per_tok=1, moe_intermediate_size=32),
        "mixtral": lambda: tf.MixtralConfig(**COMMON, **kv2, **MOE),
        "olmoe": lambda: tf.OlmoeConfig(**COMMON, num_key_value_heads=4, num_experts=2,
                                        num_experts_per_tok=1),
        "granitemoe": lambda: tf.GraniteMoeConfig(**COMMON, **kv2, **MOE),
        # transformers' class name (PhimoeForCausalLM); "phimoe_hub" below: the hub's
        "phimoe": lambda: tf.PhimoeConfig(**COMMON, **kv2, **MOE),
        "phimoe_hub": lambda: tf.PhimoeConfig(**COMMON, **kv2, **MOE,
                                              architectures=["PhiMoEForCausalLM"]),
        "qwen3_next": lambda: tf.Qwen3NextConfig(
            **COMMON, **kv2, head_dim=16, num_experts=2, num_experts_per_tok=1, **shared,
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
            linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"] * 2),
        "jamba": lambda: tf.JambaConfig(
            **COMMON, **kv2, num_experts=2, num_experts_per_tok=1, attn_layer_period=2,
            attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
            use_mamba_kernels=False),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
            **COMMON, **kv2, **MOE, **SSM, position_embedding_type="rope",
            layer_types=["mamba", "attention"] * 2),
        "lfm2": lambda: tf.Lfm2Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=N_CTX,
            layer_types=["conv", "full_attention"] * 2, **IDS),
        # alternating window, per-layer inputs, AltUp: TransformerLens boots only the
        # multimodal class
        "gemma3n": lambda: _gemma(tf.Gemma3nTextConfig, num_kv_shared_layers=0,
                                  laurel_rank=8, activation_sparsity_pattern=[0.0] * 4),
        # one attention block shared by the hybrid layers, on a doubled-width input
        "zamba2": lambda: tf.Zamba2Config(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8,
            max_position_embeddings=N_CTX, layers_block_type=["mamba", "hybrid"] * 2, **IDS),
    }


def decoder_configs() -> dict:
    """Name → a function building the config (built on demand: one per test): these, and
    the decoders of the adapters tried later (``adapter_configs``)."""
    return {**_dense(), **_mixtures_and_hybrids(), **adapter_decoders()}


# what the toolkit owes each: None (exact, ≤ 1e-6 against the naive fit on what the
# softmax reads) or a phrase of its one-line refusal
REFUSED = {
    "gemma3n": "cannot boot Gemma3nForCausalLM",
    "zamba2": "no attention component to hook (an attention block shared between layers",
    **REFUSED_ADAPTERS,
}
DECODERS = tuple(decoder_configs())

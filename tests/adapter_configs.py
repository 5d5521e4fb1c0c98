"""Tiny random configs of the TransformerLens 4.3 text adapters tried after the first
decoder sweep (``decoder_configs``), on the same shapes (4 layers, 4 query heads, hidden
64, d_head 16; a 16-token window where there is one; 2 experts for mixtures; hybrids with
attention in two of their four blocks): the decoders as decoders, the BART family's
encoder-decoders by stack, the models without attention over positions, and the adapters
transformers cannot build here. Each with the outcome the toolkit owes it: exact against
the input of Hugging Face's eager softmax (None), or refused in one line (a phrase of the
refusal)."""

import transformers as tf
from tiny_shapes import COMMON, IDS, LOCAL_GLOBAL, N_CTX, SSM, VOCAB

KV2 = dict(num_key_value_heads=2)
# DeepSeek's multi-head latent attention: 16 plain + 8 rotary dimensions per head
MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
           qk_rope_head_dim=8, v_head_dim=16)
ROUTED = dict(moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1,
              n_shared_experts=1, n_group=1, topk_group=1)
LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
              linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"] * 2)


def _dense() -> dict:
    return {
        "arcee": lambda: tf.ArceeConfig(**COMMON, **KV2),
        "bitnet": lambda: tf.BitNetConfig(**COMMON, **KV2),
        # RoPE on the sliding layers only, NoPE on the full one
        "cohere2": lambda: tf.Cohere2Config(**COMMON, **KV2, sliding_window=16,
                                            layer_types=LOCAL_GLOBAL),
        # EXAONE 3: transformers builds it as a Llama; a hub config names the remote-code
        # class ExaoneForCausalLM
        "exaone": lambda: tf.ExaoneConfig(**COMMON, **KV2),
        "exaone_hub": lambda: tf.ExaoneConfig(**COMMON, **KV2,
                                              architectures=["ExaoneForCausalLM"]),
        "ernie4_5": lambda: tf.Ernie4_5Config(**COMMON, **KV2, head_dim=16),
        "jais2": lambda: tf.Jais2Config(**COMMON, **KV2),
        "deepseek_v2": lambda: tf.DeepseekV2Config(
            **COMMON, **MLA, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=2, moe_intermediate_size=32),
        "youtu": lambda: tf.YoutuConfig(**COMMON, **MLA),
        # a decoder with ModernBERT's alternating local (16) / global layers
        "modernbert_decoder": lambda: tf.ModernBertDecoderConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, max_position_embeddings=N_CTX, local_attention=16,
            layer_types=LOCAL_GLOBAL, **IDS),
        # a weightless RMS norm of q and k after rotary
        "nanochat": lambda: tf.NanoChatConfig(**COMMON, **KV2),
        # per-layer cycles of two looped stacks
        "hrm_text": lambda: tf.HrmTextConfig(**COMMON, head_dim=16),
    }


def _mixtures() -> dict:
    return {
        # RoPE on the sliding layers only (the full ones apply none in HF's forward)
        "afmoe": lambda: tf.AfmoeConfig(
            **COMMON, **KV2, head_dim=16, moe_intermediate_size=32, num_dense_layers=1,
            num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
            global_attn_every_n_layers=2, sliding_window=16),
        "ernie4_5_moe": lambda: tf.Ernie4_5_MoeConfig(
            **COMMON, **KV2, moe_intermediate_size=32, moe_k=1, moe_num_experts=2,
            moe_num_shared_experts=1, moe_layer_start_index=1),
        "flex_olmo": lambda: tf.FlexOlmoConfig(**COMMON, **KV2, num_experts=2,
                                               num_experts_per_tok=1),
        "glm4_moe": lambda: tf.Glm4MoeConfig(**COMMON, **KV2, **ROUTED,
                                             first_k_dense_replace=1),
        "glm4_moe_lite": lambda: tf.Glm4MoeLiteConfig(**COMMON, **MLA, **ROUTED),
        # DeepSeek sparse attention: a learned indexer picks each query's keys
        "glm_moe_dsa": lambda: tf.GlmMoeDsaConfig(**COMMON, **MLA, **ROUTED, index_topk=16,
                                                  index_head_dim=16, index_n_heads=2),
        "deepseek_v4": lambda: tf.DeepseekV4Config(
            vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=32,
            num_experts_per_tok=1, n_routed_experts=2, n_shared_experts=1,
            max_position_embeddings=N_CTX, sliding_window=16, index_n_heads=2,
            index_head_dim=16, index_topk=16, **IDS),
        # a mixture of attention heads: the queries come from the experts a router picks
        "jetmoe": lambda: tf.JetMoeConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_key_value_heads=2,
            kv_channels=16, intermediate_size=96, max_position_embeddings=N_CTX,
            num_local_experts=2, num_experts_per_tok=1, **IDS),
        "laguna": lambda: tf.LagunaConfig(
            **COMMON, **KV2, head_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts=2, num_experts_per_tok=1,
            sliding_window=16),
        "minimax_m2": lambda: tf.MiniMaxM2Config(**COMMON, **KV2, head_dim=16,
                                                 num_local_experts=2, num_experts_per_tok=1),
    }


def _hybrids() -> dict:
    no_mlp = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return {
        # attention and a state-space mixer side by side in every layer
        "falcon_h1": lambda: tf.FalconH1Config(**COMMON, **KV2, **SSM, mamba_d_ssm=128),
        # the rotary module kept as model.pos_emb
        "lfm2_moe": lambda: tf.Lfm2MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=N_CTX, num_dense_layers=1, num_experts=2,
            num_experts_per_tok=1, layer_types=["conv", "full_attention"] * 2, **IDS),
        # a q/k norm over the whole width, then rotary; and its released form, without
        # rotary (rope_theta None)
        "olmo_hybrid": lambda: tf.OlmoHybridConfig(**COMMON, **KV2, **LINEAR),
        "olmo_hybrid_nope": lambda: tf.OlmoHybridConfig(
            **COMMON, **KV2, **LINEAR, rope_parameters={"rope_type": "default",
                                                        "rope_theta": None}),
        "qwen3_5": lambda: tf.Qwen3_5TextConfig(**COMMON, **KV2, head_dim=16, **LINEAR),
        "qwen3_5_moe": lambda: tf.Qwen3_5MoeTextConfig(
            **no_mlp, **KV2, head_dim=16, **LINEAR, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts=2, num_experts_per_tok=1),
        # TransformerLens wraps these layers whole (no attention component)
        "nemotron_h": lambda: tf.NemotronHConfig(
            vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=N_CTX, intermediate_size=96,
            layers_block_type=["mamba", "attention", "mlp", "attention"], ssm_state_size=16,
            mamba_num_heads=8, mamba_head_dim=16, n_groups=1, chunk_size=16,
            use_mamba_kernels=False, **IDS),
        "recurrent_gemma": lambda: tf.RecurrentGemmaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, lru_width=64,
            attention_window_size=16, conv1d_width=4, block_types=["recurrent", "attention"],
            **IDS),
    }


def _no_attention() -> dict:
    """State-space and linear-recurrent models: no softmax over positions at all."""
    return {
        "mamba2": lambda: tf.Mamba2Config(vocab_size=VOCAB, hidden_size=64,
                                          num_hidden_layers=2, num_heads=8, head_dim=16,
                                          state_size=16, n_groups=1, chunk_size=16, **IDS),
        "falcon_mamba": lambda: tf.FalconMambaConfig(vocab_size=VOCAB, hidden_size=64,
                                                     num_hidden_layers=2, state_size=8, **IDS),
        "rwkv": lambda: tf.RwkvConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                      attention_hidden_size=64, intermediate_size=128,
                                      context_length=N_CTX, **IDS),
    }


def adapter_decoders() -> dict:
    """Name → a function building the config (built on demand: one per test)."""
    return {**_dense(), **_mixtures(), **_hybrids(), **_no_attention()}


REFUSED_ADAPTERS = {
    "hrm_text": "calls each layer's attention several times per forward",
    "glm_moe_dsa": "keys a learned indexer selects by content",
    "deepseek_v4": "its keys are compressed over blocks of positions",
    "jetmoe": "_JetMoeAttentionBridge hooks no queries",
    # (the hybrid's first attention layer is block 1: the refusal names its hook prefix)
    "nemotron_h": "layer 0 (blocks.1.attn): TransformerLens's SSMBlockBridge wraps this block "
                  "whole, with no attention component",
    "recurrent_gemma": "layer 0 (blocks.1.attn): TransformerLens's RecurrentGemmaBlockBridge "
                       "wraps this block whole, with no attention component",
    "mamba2": "Mamba2ForCausalLM has no softmax-attention layer",
    "falcon_mamba": "FalconMambaForCausalLM has no softmax-attention layer",
    "rwkv": "RwkvForCausalLM has no softmax-attention layer",
}


# ---------------------------------------------------- encoder-decoders, by stack
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
               decoder_ffn_dim=96, max_position_embeddings=N_CTX, dropout=0.0,
               attention_dropout=0.0, decoder_start_token_id=2, **IDS)


def encoder_decoders() -> dict:
    """Name → (config class, model class) of the BART family (learned positions: BART,
    mBART, Blenderbot; sinusoids: Marian, Pegasus, M2M-100), built with :data:`SEQ2SEQ`."""
    return {
        "bart": (tf.BartConfig, tf.BartForConditionalGeneration),
        "mbart": (tf.MBartConfig, tf.MBartForConditionalGeneration),
        "blenderbot": (tf.BlenderbotConfig, tf.BlenderbotForConditionalGeneration),
        "marian": (tf.MarianConfig, tf.MarianMTModel),
        "pegasus": (tf.PegasusConfig, tf.PegasusForConditionalGeneration),
        "m2m_100": (tf.M2M100Config, tf.M2M100ForConditionalGeneration),
    }


STACKS = ("encoder", "decoder")


# ------------------------------------------- adapters of other inputs, refused
# TransformerLens's adapter → its model type: multimodal classes (a text stack beside a vision
# or audio encoder) and encoders of audio or images, each refused from its config alone
# (``poskernel_tl/models/modality.py``), before any weights load
OTHER_MODALITIES = {
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma3nForConditionalGeneration": "gemma3n",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Llama4ForConditionalGeneration": "llama4",
    "LlavaForConditionalGeneration": "llava",
    "LlavaNextForConditionalGeneration": "llava_next",
    "LlavaOnevisionForConditionalGeneration": "llava_onevision",
    "Mistral3ForConditionalGeneration": "mistral3",
    "Idefics3ForConditionalGeneration": "idefics3",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Glm4vForConditionalGeneration": "glm4v",
    "Florence2ForConditionalGeneration": "florence2",
    "Emu3ForConditionalGeneration": "emu3",
    "MuseGlimmerForConditionalGeneration": "muse_glimmer",
    "T5Gemma2ForConditionalGeneration": "t5gemma2",
    "Qwen2AudioForConditionalGeneration": "qwen2_audio",
    "GlmAsrForConditionalGeneration": "glmasr",
    "AudioFlamingo3ForConditionalGeneration": "audioflamingo3",
    "MusicFlamingoForConditionalGeneration": "musicflamingo",
    "HubertForCTC": "hubert",
    "Wav2Vec2ForCTC": "wav2vec2",
    "ASTForAudioClassification": "audio-spectrogram-transformer",
    "ViTForImageClassification": "vit",
    "DeiTForImageClassification": "deit",
}
OTHER_REFUSALS = ("is a multimodal model class", "reads audio", "reads images")


# ----------------------------------------- adapters transformers cannot build here
REMOTE = "remote code only (not in transformers; trust_remote_code)"
OWN_FORMAT = "a checkpoint TransformerLens converts itself, not a Hugging Face model class"
NOT_BUILT = {
    "BaichuanForCausalLM": REMOTE, "BD3LM": REMOTE, "DreamModel": REMOTE,
    "GiddForDiffusionLM": REMOTE, "GPT2LMHeadCustomModel": REMOTE,
    "HyenaDNAForCausalLM": REMOTE + "; a long convolution, no attention over positions",
    "InternLM2ForCausalLM": REMOTE, "LLaDAModelLM": REMOTE, "LLaDA2MoeModelLM": REMOTE,
    "OpenELMForCausalLM": REMOTE, "OuroForCausalLM": REMOTE, "QwenForCausalLM": REMOTE,
    "RavenForCausalLM": REMOTE,
    "RWKV7ForCausalLM": REMOTE + "; a linear recurrence, no attention over positions",
    "ExaoneForCausalLM": "remote code only (EXAONE 3's own module names); transformers "
                         "builds its checkpoints as LlamaForCausalLM, measured under that "
                         "adapter (exaone, exaone_hub)",
    "MinGPTForCausalLM": OWN_FORMAT, "NanoGPTForCausalLM": OWN_FORMAT,
    "NeelSoluOldForCausalLM": OWN_FORMAT, "TransformerLensNative": OWN_FORMAT,
    "TransformerLensPretrain": OWN_FORMAT,
}

"""Tiny random models of each seed architecture, built from configs (no hub)."""

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OlmoConfig,
    OlmoForCausalLM,
)

from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
from poskernel_tl.models.nope import apply_nope
from poskernel_tl.models.registry import ModelSpec

VOCAB = 300
N_CTX = 128


def _build(arch: str):
    if arch == "gpt2":
        cfg = GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=64, n_layer=2, n_head=4)
        return GPT2LMHeadModel, cfg
    if arch == "bert":  # bidirectional encoder, learned absolute positions, post-LN
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=N_CTX, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        return BertForMaskedLM, cfg
    if arch == "olmo":  # non-parametric LayerNorm, full rotary (like OLMo-1B)
        cfg = OlmoConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=N_CTX)
        return OlmoForCausalLM, cfg
    # llama with GQA (4 query heads, 2 kv heads), also the NoPE base
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=N_CTX)
    return LlamaForCausalLM, cfg


SPECS = {
    "gpt2": ModelSpec("tiny-gpt2", None, "learned-absolute", "layernorm", 2, 4, 4, 16,
                      None, N_CTX),
    "olmo": ModelSpec("tiny-olmo", None, "rope", "layernorm", 2, 4, 4, 16, 10000.0, N_CTX),
    "llama": ModelSpec("tiny-llama", None, "rope", "rmsnorm", 2, 4, 2, 16, 10000.0, N_CTX),
    "bert": ModelSpec("tiny-bert", None, "learned-absolute", "layernorm", 2, 4, 4, 16,
                      None, N_CTX, causal=False),
    "nope": ModelSpec("tiny-nope", None, "none", "rmsnorm", 2, 4, 2, 16, None, N_CTX,
                      loader="hub-nope"),
}


def tiny_hf_model(arch: str, seed: int = 0):
    cls, cfg = _build("llama" if arch == "nope" else arch)
    cfg._attn_implementation = "eager"
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 2
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.config.architectures = [cls.__name__]
    if arch == "nope":
        apply_nope(model)
    return model


def tiny_loaded(arch: str, tokenizer, seed: int = 0, compatibility_mode: bool = False,
                device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A tiny model booted as a bridge; ``dtype``: the forward's (weights are built in
    float32 from the seed, then cast, so every dtype shares the same weights)."""
    hf = tiny_hf_model(arch, seed).to(device=device, dtype=dtype)
    spec = describe(hf, SPECS[arch])
    bridge = boot_bridge(hf, tokenizer, device=torch.device(device), dtype=dtype,
                         compatibility_mode=compatibility_mode)
    return LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf)


def load_for_grid(name: str) -> LoadedModel:
    """A grid's model loader for the tiny models ("tiny-llama", ...), picklable by
    reference, so submitit jobs can run it (with this folder on PYTHONPATH)."""
    import tempfile

    from conftest import make_tiny_tokenizer

    return tiny_loaded(name.removeprefix("tiny-"), make_tiny_tokenizer(tempfile.mkdtemp()))


# ------------------------------------------------------------ per-layer schemes
def _arch_configs() -> dict:
    """Tiny random configs of the architectures whose positional schemes differ (4 layers,
    4 query heads, d_head 16): Llama, Qwen3 and OLMo-2 (QK-norm), GPT-2, SmolLM3 (NoPE every
    second layer), Mistral (a 16-token sliding window on every layer), Gemma 3 (local layers
    with a 16-token window and base 1e4, one global layer with base 1e6), GPT-NeoX (rotary
    on a quarter of d_head), GPT-J (interleaved pairs on half of d_head), Phi-3 (fused qkv)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, max_position_embeddings=N_CTX, bos_token_id=1,
                  eos_token_id=2, pad_token_id=2)
    gpt = dict(vocab_size=VOCAB, n_embd=64, n_layer=4, n_head=4, n_positions=N_CTX,
               bos_token_id=1, eos_token_id=2)
    return {
        "llama": tf.LlamaConfig(**common, num_key_value_heads=2),
        "qwen3": tf.Qwen3Config(**common, num_key_value_heads=2, head_dim=16),
        "olmo2": tf.Olmo2Config(**common, num_key_value_heads=4),
        "gpt2": tf.GPT2Config(**gpt),
        "smollm3": tf.SmolLM3Config(**common, num_key_value_heads=2, no_rope_layer_interval=2),
        "mistral": tf.MistralConfig(**common, num_key_value_heads=2, sliding_window=16),
        "gemma3": tf.Gemma3TextConfig(
            **common, num_key_value_heads=1, head_dim=16, sliding_window=16,
            query_pre_attn_scalar=16, layer_types=["sliding_attention", "sliding_attention",
                                                   "full_attention", "sliding_attention"]),
        "gpt_neox": tf.GPTNeoXConfig(**common, rotary_pct=0.25),
        "gptj": tf.GPTJConfig(**gpt, rotary_dim=8),
        "phi3": tf.Phi3Config(**{**common, "pad_token_id": 0}, num_key_value_heads=2),
    }


ARCHITECTURES = tuple(_arch_configs())


def arch_hf_model(arch: str, seed: int = 0, **overrides):
    """The tiny random Hugging Face causal LM of ``arch`` (eager attention): a config of
    :func:`_arch_configs` or of :func:`_softmax_configs`, with ``overrides`` set on it."""
    from transformers import AutoModelForCausalLM

    config = (_arch_configs() if arch in ARCHITECTURES else _softmax_configs())[arch]
    for name, value in overrides.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config.architectures = [type(model).__name__]
    return model


def arch_loaded(arch: str, tokenizer, seed: int = 0, **overrides) -> LoadedModel:
    """``arch`` booted as a bridge with everything read from the model (as ``hf:`` does)."""
    from poskernel_tl.hooks.fast_attention import set_attention
    from poskernel_tl.models.registry import placeholder_spec

    hf = arch_hf_model(arch, seed, **overrides)
    spec = describe(hf, placeholder_spec(f"tiny-{arch}", None))
    bridge = boot_bridge(hf, tokenizer)
    return LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf,
                       attention=set_attention(bridge, "sdpa"))


# ------------------------------------------------- what each softmax reads
def _softmax_configs() -> dict:
    """Tiny random configs of architectures whose softmax reads something beside
    scale·q·k plus a causal mask, or whose q/k reach the product by another route (4
    layers, 4 query heads, hidden 64; a 16-token window where there is one): learned
    positions (XGLM's sinusoids, OPT's offset table), partial rotary (StableLM, Phi),
    windows (StarCoder2, Qwen2), Cohere, Granite's attention multiplier; gpt-oss (learned
    sinks, alternating windows, YaRN), ALiBi (BLOOM, MPT, Falcon), Falcon's grouped new
    decoder, DeepSeek-V3's MLA heads, CodeGen's interleaved partial rotary, Gemma 2 (a cap
    of 0.5, small enough to bend these logits), Llama 4 (NoPE layers with a temperature,
    chunked RoPE layers with a post-rotary L2 norm), a Bamba hybrid (attention in blocks
    1 and 3 of 4) and Mamba (no attention)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, max_position_embeddings=N_CTX, bos_token_id=1,
                  eos_token_id=2, pad_token_id=2)
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    mamba = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
                 mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16)
    return {
        "xglm": tf.XGLMConfig(vocab_size=VOCAB, d_model=64, ffn_dim=96, num_layers=4,
                              attention_heads=4, max_position_embeddings=N_CTX, **ids),
        "opt": tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=4,
                            num_attention_heads=4, max_position_embeddings=N_CTX,
                            word_embed_proj_dim=64, **ids),
        "stablelm": tf.StableLmConfig(**common, num_key_value_heads=2, partial_rotary_factor=0.25),
        "phi": tf.PhiConfig(**common, partial_rotary_factor=0.5),
        "starcoder2": tf.Starcoder2Config(**common, num_key_value_heads=2, sliding_window=16),
        "qwen2": tf.Qwen2Config(**common, num_key_value_heads=2, use_sliding_window=True,
                                sliding_window=16, max_window_layers=2),
        "cohere": tf.CohereConfig(**common, num_key_value_heads=2),
        "granite": tf.GraniteConfig(**common, num_key_value_heads=2, attention_multiplier=0.3),
        "gpt_oss": tf.GptOssConfig(**{**common, "intermediate_size": 64}, num_key_value_heads=2,
                                   head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                                   sliding_window=16,
                                   layer_types=["sliding_attention", "full_attention"] * 2),
        "bloom": tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=4, n_head=4, **ids),
        "mpt": tf.MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=4,
                            max_seq_len=N_CTX, expansion_ratio=2),
        "falcon_alibi": tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, alibi=True, **ids),
        "falcon": tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                                  num_attention_heads=4, new_decoder_architecture=True,
                                  num_kv_heads=2, max_position_embeddings=N_CTX, **ids),
        "deepseek_v3": tf.DeepseekV3Config(
            **common, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=2,
            moe_intermediate_size=32),
        "codegen": tf.CodeGenConfig(vocab_size=VOCAB, n_embd=64, n_layer=4, n_head=4,
                                    rotary_dim=8, n_positions=N_CTX, n_ctx=N_CTX,
                                    bos_token_id=1, eos_token_id=2),
        "gemma2": tf.Gemma2Config(**common, num_key_value_heads=1, head_dim=16,
                                  sliding_window=16, query_pre_attn_scalar=16,
                                  attn_logit_softcapping=0.5),
        "llama4": tf.Llama4TextConfig(**common, num_key_value_heads=2, head_dim=16,
                                      intermediate_size_mlp=96, num_local_experts=2,
                                      num_experts_per_tok=1, no_rope_layers=[1, 1, 1, 0],
                                      attention_chunk_size=64, attn_temperature_tuning=True,
                                      floor_scale=8, attn_scale=0.1),
        "bamba": tf.BambaConfig(**common, num_key_value_heads=2, attn_layer_indices=[1, 3],
                                **mamba),
        "mamba": tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                state_size=8),
    }


SOFTMAX_ARCHITECTURES = tuple(a for a in _softmax_configs() if a != "mamba")
softmax_hf_model, softmax_loaded = arch_hf_model, arch_loaded  # the same builders

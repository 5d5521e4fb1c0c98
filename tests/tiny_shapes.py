"""The shapes every tiny random config of the sweeps shares (4 layers, 4 query heads,
hidden 64; a 16-token window where there is one; 2 experts for mixtures)."""

VOCAB, N_CTX = 300, 128
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, max_position_embeddings=N_CTX, bos_token_id=1,
              eos_token_id=2, pad_token_id=2)
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)
LOCAL_GLOBAL = ["sliding_attention"] * 3 + ["full_attention"]
MOE = dict(num_local_experts=2, num_experts_per_tok=1)
SSM = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
           mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16)

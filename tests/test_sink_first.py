"""Gu et al.'s Sink₁ as their released evaluation computes it, against a transcription of
that computation on Hugging Face's own eager attention weights (``output_attentions``):
a tiny Llama whose sequences start with BOS, gpt-oss (learned sinks in the normaliser,
alternating windows), a bidirectional BERT, and the embedded SmolLM2."""

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import VOCAB, arch_hf_model, arch_loaded, tiny_hf_model, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.statistics.sink_first import EPSILON, KEYS, STATISTIC, SinkFirst

T = 24


def released(attentions, causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Gu et al.'s computation per sequence, transcribed: importance of key k = the
    column sum of the attention over the rows divided by T − k (an encoder: by T); a sink
    head on a sequence when the first key's exceeds ε; returned per layer and head: the
    share of sequences that are, and each key's importance averaged over them."""
    shares, alphas = [], []
    for A in attentions:  # [batch, head, T, T]
        n = A.shape[-1]
        rows = n - torch.arange(n, dtype=torch.float64) if causal else \
            torch.full((n,), float(n), dtype=torch.float64)
        alpha = A.double().sum(-2) / rows  # [batch, head, key]
        shares.append((alpha[..., 0] > EPSILON).double().mean(0))
        alphas.append(alpha[..., :KEYS].mean(0))
    return torch.stack(shares).numpy(), torch.stack(alphas).numpy()


def measured_and_checked(model, hf_model, ids, causal: bool = True):
    """``pk.measure`` of ``ids`` (every sequence read by the pattern statistics) against
    the released computation on ``hf_model``'s eager attention weights; the result."""
    res = pk.measure(model, ids, progress=False, null_seqs=len(ids), null_perms=0)
    with torch.no_grad():
        attentions = hf_model(ids, output_attentions=True).attentions
    share, alpha = released(attentions, causal)
    np.testing.assert_allclose(res.alpha, alpha, rtol=0, atol=1e-6)
    assert np.array_equal(res.sink1_share, share)
    return res


def ids_with_bos(n: int, bos: int = 1) -> torch.Tensor:
    ids = torch.randint(3, VOCAB - 10, (n, T), generator=torch.Generator().manual_seed(2))
    ids[:, 0] = bos
    return ids


def test_a_llama_with_bos_equals_the_released_computation(tiny_tokenizer):
    ids = ids_with_bos(6)
    res = measured_and_checked(tiny_loaded("llama", tiny_tokenizer), tiny_hf_model("llama"),
                               ids)
    assert res.alpha.shape == (2, 4, KEYS)
    assert res.provenance["bos_first"] is True  # recorded: the sink depends on it
    ids[2, 0] = 5
    assert pk.measure(tiny_loaded("llama", tiny_tokenizer), ids, progress=False,
                      null_perms=0).provenance["bos_first"] is False


def test_learned_sinks_and_windows_equal_the_released_computation(tiny_tokenizer):
    """gpt-oss: Hugging Face's weights leave the sink column out, so rows sum to less
    than 1; its sliding layers put no weight on keys the window has left."""
    measured_and_checked(arch_loaded("gpt_oss", tiny_tokenizer), arch_hf_model("gpt_oss"),
                         ids_with_bos(4))


def test_an_encoder_reads_the_mean_over_every_row(tiny_tokenizer):
    measured_and_checked(tiny_loaded("bert", tiny_tokenizer), tiny_hf_model("bert"),
                         ids_with_bos(4), causal=False)


def test_a_planted_sink_is_counted_per_sequence():
    """Sequences on which a head's α₀ exceeds ε count, the others do not: the statistic
    is a share of sequences, not a threshold on the pooled mean."""
    part = SinkFirst(np.array([[0.25, 1.0]]), np.zeros((1, 2, KEYS)))
    heads = pd.DataFrame({"sink1_share": part.sink1_share.ravel()})
    assert STATISTIC.condition_values(heads) == {"Sink1": 0.625}


@pytest.mark.smollm2
def test_smollm2_equals_the_released_computation(smollm2):
    """The embedded model on prose (its tokenizer puts no BOS first), against the eager
    weights of a copy never wrapped by a bridge."""
    from poskernel_tl.data.sequences import build_sequences
    from poskernel_tl.models.embedded import from_gguf

    ids = build_sequences(smollm2.tokenizer, "prose", 64, 8,
                          model_name="smollm2-135m")["input_ids"][4:]
    pristine, _ = from_gguf(smollm2.spec, torch.float32)
    pristine.config._attn_implementation = "eager"
    measured_and_checked(smollm2, pristine, ids)


@pytest.mark.smollm2
@pytest.mark.slow  # two runs of 30 layers on longer sequences (≈ 50 s)
def test_smollm2_puts_no_sink_on_repeated_tokens(smollm2):
    """Gu et al.'s finding for RoPE models (Mistral, LLaMA: Sink₁ 0.00 % on repeated
    tokens) holds for the embedded SmolLM2 at their T = 64 on 100 sequences, while random
    tokens (20 sequences) carry a sink on most heads."""
    from poskernel_tl.data.sequences import build_sequences

    built = lambda dataset, n: build_sequences(smollm2.tokenizer, dataset, 64, n,
                                               model_name="smollm2-135m")["input_ids"]
    run = dict(progress=False, null_perms=0, null_seqs=100)
    repeated = pk.measure(smollm2, built("repeated", 100), **run)
    assert repeated.condition_values()["Sink1"] == 0.0
    control = pk.measure(smollm2, built("random", 20), **run)  # the control: fewer suffice
    assert control.condition_values()["Sink1"] > 0.5

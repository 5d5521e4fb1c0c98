"""LED (Longformer encoder-decoder) through ``hf:`` (``poskernel_tl/models/families/led.py``):
its decoder, BART attention under a causal mask, measured exactly against what Hugging
Face's eager softmax reads; its encoder, Longformer's windowed attention on a banded
layout, refused at load in one line that says so and names the decoder."""

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, softmax_inputs
from transformers import LEDConfig, LEDForConditionalGeneration

import poskernel_tl as pk
from poskernel_tl.errors import UserError


def build():
    cfg = LEDConfig(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
                    decoder_ffn_dim=96, attention_window=8, max_encoder_position_embeddings=128,
                    max_decoder_position_embeddings=128, pad_token_id=0, bos_token_id=2,
                    eos_token_id=1, decoder_start_token_id=2)
    cfg._attn_implementation = "eager"  # the softmax the spy reads
    torch.manual_seed(0)
    return LEDForConditionalGeneration(cfg).eval()


def decoder_calls(ids: torch.Tensor) -> list:
    """The decoder's self-attention softmax inputs (each layer's self- then cross-attention;
    the encoder's banded softmax is not among the T × T calls)."""
    return softmax_inputs(build(), ids, decoder_input_ids=ids)[0::2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import checkpoint_folder
    return checkpoint_folder(tmp_path_factory, "led", build())


def test_the_decoder_is_measured_and_the_encoder_refused(folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="LED's encoder attends through Longformer's sliding "
                                        r"windows .* not measured; its decoder is") as err:
        pk.load_model(f"hf:{folder}", device="cpu", progress=False)
    assert "\n" not in str(err.value)
    model = pk.load_model(f"hf:{folder}@decoder", device="cpu", progress=False)
    assert model.spec.causal and model.self_check["max_deviation"] <= 1e-4
    ids = torch.randint(3, 290, (3, 40), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    calls = decoder_calls(ids)
    assert len(calls) == model.spec.n_layers == 2
    for layer, (A, keep, _) in enumerate(calls):
        assert np.abs(res.r2_pooled[layer] - naive_r2(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[1, layer] - naive_r2(A[1:2], keep[1:2])).max() <= 1e-6

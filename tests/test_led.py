"""LED (Longformer encoder-decoder) through ``hf:`` (``poskernel_tl/models/families/led.py``):
its encoder, Longformer's two-sided sliding window computed on a banded layout over inputs
the model pads to a multiple of its window, and its decoder, BART attention under a causal
mask, each measured exactly against what Hugging Face's eager softmax reads."""

import math

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, softmax_inputs
from test_offset_terms import naive_signed_r2
from transformers import LEDConfig, LEDForConditionalGeneration

import poskernel_tl as pk
from poskernel_tl.errors import UserError

WINDOW = 8  # attention_window: the keys within 4 on each side


def build(window=WINDOW):
    cfg = LEDConfig(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
                    decoder_ffn_dim=96, attention_window=window,
                    max_encoder_position_embeddings=128, max_decoder_position_embeddings=128,
                    pad_token_id=0, bos_token_id=2, eos_token_id=1, decoder_start_token_id=2)
    cfg._attn_implementation = "eager"  # the softmax the spy reads
    torch.manual_seed(0)
    return LEDForConditionalGeneration(cfg).eval()


def calls(ids: torch.Tensor, window=WINDOW) -> tuple[list, list]:
    """(the encoder's softmax inputs, read back from Longformer's band onto T × T; the
    decoder's self-attention ones): the forward runs the encoder's layers first, then each
    decoder layer's self- and cross-attention."""
    seen = softmax_inputs(build(window), ids, decoder_input_ids=ids)
    return seen[:2], seen[2::2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import checkpoint_folder
    return checkpoint_folder(tmp_path_factory, "led", build())


def ids_of(n: int, T: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(3, 290, (n, T), generator=torch.Generator().manual_seed(seed))


def test_the_band_is_read_back_as_the_module_projects_it():
    """The spy's reading of Longformer's banded softmax input equals, on layer 0, the
    scaled q·k of the module's own projections of the layer's (padded) input, on exactly
    the entries |t − s| ≤ 4 of the T tokens; T = 13 pads to 16."""
    model, T = build(), 13
    inputs = []
    layer = model.led.encoder.layers[0]
    handle = layer.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    A, keep, extra = softmax_inputs(model, ids_of(1, T), decoder_input_ids=ids_of(1, T))[0]
    handle.remove()
    attn = layer.self_attn.longformer_self_attn
    h = inputs[0][:, :T].double()  # [batch, padded T, d_model] -> the T tokens
    split = lambda x: x.view(1, T, 4, 16).transpose(1, 2)
    q = split(h @ attn.query.weight.double().T + attn.query.bias.double()) / math.sqrt(16)
    k = split(h @ attn.key.weight.double().T + attn.key.bias.double())
    t = torch.arange(T)
    band = (t[:, None] - t[None]).abs() <= WINDOW // 2
    assert extra is None and torch.equal(keep[0], band.expand(4, T, T))
    want = q @ k.transpose(-1, -2)
    assert torch.allclose(A[0][:, band], want[0][:, band].to(A.dtype), atol=1e-5)


def test_each_stack_is_measured_exactly_past_the_window(folder, monkeypatch):
    """T = 37 (padded inside the model to 40; the window binds past 5 tokens): Track A's R²,
    pooled and per sequence, within 1e-6 of the naive fit of what HF's eager softmax reads,
    on the encoder (two-sided, every kept offset of both signs) and the decoder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = ids_of(3, 37)
    encoder_calls, decoder_calls = calls(ids)
    for stack, seen, fit in (("encoder", encoder_calls, naive_signed_r2),
                             ("decoder", decoder_calls, naive_r2)):
        model = pk.load_model(f"hf:{folder}@{stack}", device="cpu", progress=False)
        assert model.self_check["checked"] and model.self_check["max_deviation"] <= 1e-4
        assert model.spec.n_ctx == 128
        if stack == "encoder":
            assert not model.spec.causal
            assert {(s.mask, s.window) for s in model.spec.layers} == {("bidirectional", 5)}
        res = pk.measure(model, ids, progress=False, null_perms=2)
        assert len(seen) == model.spec.n_layers == 2
        for layer, (A, keep, _) in enumerate(seen):
            assert np.abs(res.r2_pooled[layer] - fit(A, keep)).max() <= 1e-6, (stack, layer)
            assert np.abs(res.r2_per_seq[1, layer] - fit(A[1:2], keep[1:2])).max() <= 1e-6


def test_the_encoder_is_the_default_stack(folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = pk.load_model(f"hf:{folder}", device="cpu", progress=False)
    assert not model.spec.causal and model.spec.n_layers == 2


def test_each_layer_is_measured_on_its_own_window(tmp_path_factory, monkeypatch):
    """``attention_window`` [8, 16]: layer 0 keeps |t − s| ≤ 4, layer 1 ≤ 8, each read from
    its own Longformer module; at T = 37 (padded to 48) both bind, and each layer's R²,
    pooled and per sequence, is within 1e-6 of the naive fit of what its softmax reads."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from conftest import checkpoint_folder
    folder = checkpoint_folder(tmp_path_factory, "led-windows", build([8, 16]))
    model = pk.load_model(f"hf:{folder}", device="cpu", progress=False)
    assert model.self_check["checked"] and model.self_check["max_deviation"] <= 1e-4
    assert [(s.mask, s.window) for s in model.spec.layers] == [("bidirectional", 5),
                                                               ("bidirectional", 9)]
    ids = ids_of(3, 37)
    res = pk.measure(model, ids, progress=False, null_perms=2)
    encoder_calls, _ = calls(ids, [8, 16])
    for layer, (A, keep, _) in enumerate(encoder_calls):
        assert keep[0, 0, 20].sum() == 2 * (4 if layer == 0 else 8) + 1  # the diagonal too
        assert np.abs(res.r2_pooled[layer] - naive_signed_r2(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[1, layer] - naive_signed_r2(A[1:2], keep[1:2])).max() \
            <= 1e-6
    decoder = pk.load_model(f"hf:{folder}@decoder", device="cpu", progress=False)
    assert decoder.spec.causal


def test_a_window_read_one_short_is_refused_at_load(folder, monkeypatch):
    """The self-check reads the band: the encoder's window read as 3 on each side (not 4)
    keeps other entries than the model's softmax and is refused."""
    from poskernel_tl.models.families import led

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(led.Led, "window_reach", lambda self, cfg, kind, i: WINDOW // 2 - 1)
    with pytest.raises(UserError, match="layer 0's softmax keeps other entries"):
        pk.load_model(f"hf:{folder}", device="cpu", progress=False)

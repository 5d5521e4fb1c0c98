"""T5Gemma through ``hf:``: an encoder-decoder of Gemma 2 layers whose stacks keep their own
config (layer types, windows, soft-cap, ``query_pre_attn_scalar``) and rotary table. Each
stack of a tiny checkpoint, loaded from its folder as a user would, measured exactly
against what Hugging Face's eager softmax reads: the encoder two-sided, with grouped-query
attention and a sliding window at the longest length it does not bind; the decoder causal,
its sliding layers' window binding; the encoder past its window too, on the entries it
keeps."""

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, naive_within_r2, softmax_inputs
from test_offset_terms import naive_signed_r2
from transformers import T5GemmaConfig, T5GemmaForConditionalGeneration

import poskernel_tl as pk
from poskernel_tl import kernels
from poskernel_tl.models.families.t5gemma import FAMILY

ENCODER_WINDOW, DECODER_WINDOW, T = 39, 20, 40  # the encoder's window keeps |Δ| ≤ 39
STACK = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             num_attention_heads=4, head_dim=16, attn_logit_softcapping=20.0,
             rope_theta=1000.0, max_position_embeddings=512,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"])


def build():
    torch.manual_seed(0)
    cfg = T5GemmaConfig(
        encoder=dict(STACK, num_key_value_heads=2, sliding_window=ENCODER_WINDOW,
                     query_pre_attn_scalar=24),
        decoder=dict(STACK, num_key_value_heads=4, sliding_window=DECODER_WINDOW,
                     query_pre_attn_scalar=32),
        vocab_size=300, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        decoder_start_token_id=2)
    cfg._attn_implementation = "eager"  # the softmax the spy reads
    return T5GemmaForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import checkpoint_folder
    return checkpoint_folder(tmp_path_factory, "t5gemma", build())


def load(folder, stack, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return pk.load_model(f"hf:{folder}" + ("" if stack == "encoder" else "@decoder"),
                         device="cpu", progress=False)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_each_stack_equals_the_naive_fit_of_the_softmax_input(folder, stack, monkeypatch):
    model = load(folder, stack, monkeypatch)
    layers = model.spec.layers
    assert [s.pe for s in layers] == ["rope"] * 3 and model.spec.causal == (stack == "decoder")
    assert all(s.terms.softcap == 20.0 for s in layers)
    assert model.logit_scale == pytest.approx((24 if stack == "encoder" else 32) ** -0.5)
    # the load's self-check: this stack's calls paired, the probe (56 tokens) past the
    # encoder's two-sided window, whose rule it holds to the model's own mask
    assert model.self_check["checked"] and model.self_check["max_deviation"] <= 1e-4
    if stack == "encoder":  # grouped keys, a two-sided window that keeps |Δ| ≤ 39
        assert model.spec.n_kv_heads == 2
        assert [s.last for s in layers] == [ENCODER_WINDOW, None, ENCODER_WINDOW]
    else:
        assert [s.window for s in layers] == [DECODER_WINDOW, None, DECODER_WINDOW]
    ids = torch.randint(3, 290, (3, T), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    # softmaxes in order: the encoder's layers, then per decoder layer its self- and
    # cross-attention
    seen = softmax_inputs(build(), ids, decoder_input_ids=ids)
    mine = seen[:3] if stack == "encoder" else seen[3::2]
    fit = naive_signed_r2 if stack == "encoder" else naive_r2
    for layer, (A, keep, _) in enumerate(mine):
        # the encoder keeps every entry at T = window + 1; the decoder's window binds
        assert keep.all() == (stack == "encoder")
        assert (keep[0, 0, T - 1, 0] == (stack == "encoder" or layer == 1))
        assert np.abs(res.r2_pooled[layer] - fit(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[1, layer] - fit(A[1:2], keep[1:2])).max() <= 1e-6
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
    assert np.isfinite(res.r2_perm_null).all() and np.isfinite(res.r2_gram_raw).all()


@pytest.mark.skipif(not kernels.interpreting(), reason="forces the kernels' path on CPU "
                    "tensors (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("stack,length", [  # slow: within the window, a path the case past it takes
    pytest.param("encoder", T, marks=pytest.mark.slow),
    pytest.param("decoder", T, marks=pytest.mark.slow), ("encoder", 80)])
def test_the_kernels_path_equals_the_cpu_path(folder, stack, length, monkeypatch):
    """The tiled kernels (a GPU's path, here under Triton's interpreter) on grouped keys
    fitted on both sides and soft-capped logits: every array of the result equals the
    CPU path's (the diagonal g_self soft-capped and read per query head); past the
    encoder's window (T = 80: the interior region, rows and keys ≥ 50, holds 30 × 30
    entries), Track B's stored Gram read on both sides of the window by the kernels (the
    windowed layers' other sums on the CPU's path: the kernels take no two-sided window)."""
    from test_kernels import compare_results
    model = load(folder, stack, monkeypatch)
    ids = torch.randint(3, 290, (8, length), generator=torch.Generator().manual_seed(0))
    run = dict(progress=False, null_perms=2, null_seqs=3, batch_size=2)
    ref = pk.measure(model, ids[4:], ids[:4], **run)
    with kernels.forced():
        got = pk.measure(model, ids[4:], ids[:4], **run)
    diffs = compare_results(ref, got)
    assert {"track_a.r2_pooled", "track_b.r2_gram", "perm_null.r2_null"} <= set(diffs)
    assert ("track_a.g_pooled_self" in diffs) == (stack == "encoder")
    for field, (diff, scale) in diffs.items():
        assert diff <= (1e-6 if ".r2" in field else 1e-6 * scale), (field, diff)


LONG = 56  # the encoder's two-sided window keeps |Δ| ≤ 39 of 55: it binds


def test_the_encoders_binding_window_is_measured_on_the_entries_it_keeps(folder, monkeypatch):
    """Past T = window + 1 the encoder's sliding layers keep |t − s| ≤ 39 on both sides:
    Track A (pooled, per sequence), the within-row fit and the pattern statistics equal the
    naive fits of HF's softmax input on the kept entries; g past the window is NaN."""
    model = load(folder, "encoder", monkeypatch)
    encoder = model.hf_model.config.encoder
    assert FAMILY.window_reach(encoder, "sliding_attention", 0) == ENCODER_WINDOW
    assert FAMILY.window_reach(encoder, "full_attention", 1) is None
    ids = torch.randint(3, 290, (3, LONG), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    seen = softmax_inputs(build(), ids, decoder_input_ids=ids)[:3]
    t, s = torch.arange(LONG)[:, None], torch.arange(LONG)[None]
    for layer, (A, keep, _) in enumerate(seen):
        assert keep.all() == (layer == 1)  # the full layer keeps every entry
        assert np.abs(res.r2_pooled[layer] - naive_signed_r2(A, keep)).max() <= 1e-6
        one = naive_signed_r2(A[1:2], keep[1:2])
        assert np.abs(res.r2_per_seq[1, layer] - one).max() <= 1e-6, layer
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
        p = torch.where(keep, A, -np.inf).softmax(-1)  # the pattern, on the kept keys
        distance = (p * (t - s).abs()).sum(-1).mean(0)
        assert np.abs(res.attn_distance_rows[layer] - distance.numpy()).max() <= 1e-4
        first = p[:, :, 1:, 0].mean(-1).mean(0)  # each head's mean weight on key 0, t ≥ 1
        assert np.abs(res.sink_mass[layer] - first.numpy()).max() <= 1e-5
    past = np.arange(ENCODER_WINDOW, LONG - 1)  # Δ = 40..55 on each side
    assert np.isnan(res.g_pooled[0][:, past]).all() and np.isfinite(res.g_pooled[1]).all()
    assert np.isfinite(res.r2_perm_null).all() and np.isfinite(res.r2_gram_raw).all()
    view = pk.inspect_head(model, ids[0], 0, 0)  # one sequence, one head, on its own
    A, keep, _ = seen[0]
    assert abs(view.r2 - naive_signed_r2(A[:1, :1], keep[:1, :1])[0]) <= 1e-6
    assert np.isnan(view.g[ENCODER_WINDOW:]).all() and np.isnan(view.g_back[ENCODER_WINDOW:]).all()
    p = torch.where(keep[0, 0], A[0, 0], -np.inf).softmax(-1)
    assert np.abs(view.pattern - p.numpy()).max() <= 1e-5


def test_the_command_line_names_each_stacks_layers(folder, monkeypatch, capsys):
    from poskernel_tl.apps.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", f"hf:{folder}"]) == 0
    out = capsys.readouterr().out
    assert "4 query / 2 key-value heads" in out and "T5Gemma encoder stack" in out
    assert "layer   0: rope 1e+03, window ±39, soft-cap 20" in out
    assert "mask bidirectional; the softmax adds to scale·q·k: soft-cap 20·tanh(x / 20)" in out
    assert main(["models", f"hf:{folder}@decoder"]) == 0
    out = capsys.readouterr().out
    assert "logit scale 0.1768" in out and "layer   0: rope 1e+03, window 20" in out

"""Gemma-3-270M on real weights: 15 local layers (a 512-token sliding window, RoPE base
1e4) and 3 global ones (5, 11, 17; base 1e6), read from the model and fitted on what each
layer's mask keeps, against an independent recomputation from Hugging Face's eager
attention on held-out WikiText."""

from pathlib import Path

import numpy as np
import pytest
import torch
from test_layer_schemes import hf_eager_logits, naive_r2

import poskernel_tl as pk
from poskernel_tl.models.embedded import from_gguf

# slow: loading the model (its GGUF dequantized, ≈ 95 s) is most of it
pytestmark = [pytest.mark.gemma3, pytest.mark.slow]
WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext2_test_raw.txt"
T = 640  # past the 512-token window, so the window removes entries


def test_layers_read_from_the_model(gemma3):
    spec = gemma3.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (18, 4, 1, 256)
    kinds = [(s.mask, s.window, round(s.base)) for s in spec.layers]
    assert kinds == [("causal", None, 1_000_000) if i in (5, 11, 17) else
                     ("sliding", 512, 10_000) for i in range(18)]
    assert all(s.qk_norm and s.rotary_dims == 256 for s in spec.layers)
    assert gemma3.logit_scale == pytest.approx(256 ** -0.5)
    assert "Q4_K_M" in gemma3.weights_note


def test_track_a_equals_hugging_face_on_the_kept_entries(gemma3):
    if not WIKITEXT.is_file():
        pytest.skip("the shared WikiText file is not beside this checkout")
    text = WIKITEXT.read_text()[200_000:260_000]
    ids = gemma3.tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = torch.tensor([ids[:T], ids[T:2 * T]])
    res = pk.measure(gemma3, tokens, progress=False)
    pristine, _ = from_gguf(gemma3.spec, torch.float32, False)  # never wrapped by a bridge
    ref = hf_eager_logits(pristine, tokens)
    assert len(ref) == 18
    for layer, (A, keep) in enumerate(ref):
        kept, whole = naive_r2(A, keep), naive_r2(A, torch.ones(T, T, dtype=torch.bool))
        assert np.abs(res.r2_pooled[layer] - kept).max() <= 1e-4, layer
        assert np.abs(res.r2_pooled_whole[layer] - whole).max() <= 1e-4, layer
    assert "window 512" in res.provenance["layers"]


def test_full_context_is_planned_per_kind_of_layer(gemma3):
    """At T = 32,768 (4 random-token sequences) the local layers keep their band in
    Track B's accumulator, the global ones the sequences' factors, and the run fits a 16 GiB
    budget in 4 blocks of layers (3 with the README's 16.3 GiB); at T = 2048 the global
    layers keep the triangle, at 8192 their factors (as fast, a smaller state)."""
    from poskernel_tl.plan import batching
    from poskernel_tl.reducers import gram_cost

    T = 32768
    lags = gram_cost.layer_lags(gemma3, T)
    local = [i for i, m in enumerate(lags) if m is not None]
    assert len(local) == 15 and all(lags[i] == 511 for i in local)
    band = gram_cost.accumulator_bytes(gemma3, T, False, 511)
    assert band < 0.3 * 2**30 < 8 * 2**30 < gram_cost.accumulator_bytes(gemma3, T, False)
    plan = batching.plan_measure(gemma3, batching.Workload(T, 4, 0, null_draws=4), 1, "16G")
    assert plan.factors == tuple(m is None for m in lags) and len(plan.layer_blocks) <= 4
    assert "the accumulator on the band Δ ≤ 511" in plan.why
    short = batching.plan_measure(gemma3, batching.Workload(2048, 4, 0), "auto", "16G")
    assert not any(short.factors) and not short.blocked
    # at 8192 the global layers' factors are as fast as their triangle and a smaller state
    mid = batching.plan_measure(gemma3, batching.Workload(8192, 4, 0), "auto", "16G")
    assert mid.factors == tuple(m is None for m in gram_cost.layer_lags(gemma3, 8192))
    assert "with a smaller state" in mid.why and not mid.blocked

"""The BART family of encoder-decoders through ``hf:`` (BART, mBART, Blenderbot, Marian,
Pegasus, M2M-100; ``poskernel_tl/models/families/bart.py``): each stack of a tiny model,
loaded from a checkpoint folder as a user would (the load's self-check on), measured exactly
against what Hugging Face's eager softmax reads — the encoder both triangles, one g per
signed offset; the decoder under its causal mask —, both fed the same tokens."""

import numpy as np
import pytest
import torch
from adapter_configs import SEQ2SEQ, STACKS, encoder_decoders
from softmax_spy import naive_r2, softmax_inputs
from test_offset_terms import naive_signed_r2

import poskernel_tl as pk

KINDS = tuple(encoder_decoders())


def build(kind: str):
    config, cls = encoder_decoders()[kind]
    torch.manual_seed(0)
    cfg = config(**SEQ2SEQ)
    cfg._attn_implementation = "eager"  # the softmax the spy reads
    return cls(cfg).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from conftest import checkpoint_folder
    return {kind: checkpoint_folder(tmp_path_factory, kind, build(kind)) for kind in KINDS}


def stack_calls(kind: str, stack: str, ids: torch.Tensor, n_layers: int) -> list:
    """The softmax inputs of ``stack``'s self-attention layers: the encoder's come first,
    then each decoder layer's self- and cross-attention."""
    seen = softmax_inputs(build(kind), ids, decoder_input_ids=ids)
    return seen[:n_layers] if stack == "encoder" else seen[n_layers::2]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_stack_equals_the_naive_fit_of_the_softmax_input(folders, kind, stack,
                                                              monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = pk.load_model(f"hf:{folders[kind]}@{stack}", device="cpu", progress=False)
    assert model.spec.causal == (stack == "decoder") and model.spec.n_layers == 2
    assert model.self_check["checked"] and model.self_check["max_deviation"] <= 1e-4
    ids = torch.randint(3, 290, (3, 40), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    fit = naive_signed_r2 if stack == "encoder" else naive_r2
    for layer, (A, keep, _) in enumerate(stack_calls(kind, stack, ids, 2)):
        assert keep.all() == (stack == "encoder")
        assert np.abs(res.r2_pooled[layer] - fit(A, keep)).max() <= 1e-6, (kind, layer)
        assert np.abs(res.r2_per_seq[1, layer] - fit(A[1:2], keep[1:2])).max() <= 1e-6
    assert np.isfinite(res.r2_perm_null).all()

"""T5-family self-attention through ``hf:``: each stack of a tiny encoder-decoder (T5,
Switch Transformers, LongT5's decoder), loaded from a checkpoint folder as a user would,
measured exactly against what Hugging Face's eager softmax reads (unscaled q·k plus the
learned relative-position bias, the decoder's under its causal mask), both fed the same
tokens; a stack the family does not measure, or an @stack of a one-stack model, refused in
one line."""

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, naive_within_r2, softmax_inputs
from test_offset_terms import naive_signed_r2
from transformers import (
    LongT5Config,
    LongT5ForConditionalGeneration,
    SwitchTransformersConfig,
    SwitchTransformersForConditionalGeneration,
    T5Config,
    T5ForConditionalGeneration,
)

import poskernel_tl as pk
from poskernel_tl.errors import UserError

SHARED = dict(vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=2,
              num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
              relative_attention_max_distance=20, decoder_start_token_id=0, pad_token_id=0,
              dropout_rate=0.0)
FAMILIES = {
    "t5": (T5Config, T5ForConditionalGeneration, {}),
    "switch": (SwitchTransformersConfig, SwitchTransformersForConditionalGeneration,
               dict(num_experts=2, expert_capacity=64, encoder_sparse_step=2,
                    decoder_sparse_step=2)),
    "longt5": (LongT5Config, LongT5ForConditionalGeneration,
               dict(local_radius=4, encoder_attention_type="local")),
}


def build(kind: str):
    config, cls, extra = FAMILIES[kind]
    torch.manual_seed(0)
    cfg = config(**SHARED, **extra)
    cfg._attn_implementation = "eager"  # the softmax the spy reads
    model = cls(cfg).eval()
    with torch.no_grad():  # a table large enough to matter beside q·k
        for m in model.modules():
            if getattr(m, "has_relative_attention_bias", False):
                m.relative_attention_bias.weight.normal_(0.0, 2.0)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from conftest import checkpoint_folder
    return {kind: checkpoint_folder(tmp_path_factory, kind, build(kind)) for kind in FAMILIES}


@pytest.mark.parametrize("kind,stack", [("t5", "encoder"), ("t5", "decoder"),
                                        ("switch", "encoder"), ("switch", "decoder"),
                                        ("longt5", "decoder")])
def test_each_stack_equals_the_naive_fit_of_the_softmax_input(folders, kind, stack,
                                                              monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = f"hf:{folders[kind]}" + ("" if stack == "encoder" else "@decoder")
    model = pk.load_model(name, device="cpu", progress=False)
    assert model.logit_scale == 1.0 and model.spec.causal == (stack == "decoder")
    assert all(s.terms.relative_bias is not None for s in model.spec.layers)
    # the load's self-check paired this stack's own softmax calls and found them equal
    assert model.self_check["checked"] and model.self_check["max_deviation"] <= 1e-4
    T = 40
    ids = torch.randint(3, 290, (3, T), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    # softmaxes in order: the encoder's layers (none of [T, T] for LongT5's local
    # attention, which reads blocks), then per decoder layer its self- and cross-attention
    seen = softmax_inputs(build(kind), ids, decoder_input_ids=ids)
    decoder = len(seen) - 4
    mine = seen[:decoder] if stack == "encoder" else seen[decoder::2]
    assert len(mine) == 2
    fit = naive_signed_r2 if stack == "encoder" else naive_r2
    for layer, (A, keep, _) in enumerate(mine):
        assert keep.all() == (stack == "encoder")
        assert np.abs(res.r2_pooled[layer] - fit(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[1, layer] - fit(A[1:2], keep[1:2])).max() <= 1e-6
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
    assert np.isfinite(res.r2_perm_null).all()


def test_a_stack_the_family_does_not_measure_is_refused(folders, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="LongT5's encoder attends 'local'.*@decoder"):
        pk.load_model(f"hf:{folders['longt5']}", device="cpu", progress=False)
    with pytest.raises(UserError, match="no stack 'middle'; its stacks: encoder, decoder"):
        pk.load_model(f"hf:{folders['t5']}@middle", device="cpu", progress=False)


def test_a_one_stack_model_has_no_stack_to_choose(tiny_tokenizer, tmp_path, monkeypatch):
    from tiny_models import tiny_hf_model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_hf_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="no encoder-decoder"):
        pk.load_model(f"hf:{tmp_path}@decoder", device="cpu", progress=False)


def test_the_command_line_names_the_stack_and_its_scale(folders, monkeypatch, capsys):
    from poskernel_tl.apps.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", f"hf:{folders['t5']}@decoder"]) == 0
    out = capsys.readouterr().out
    assert "logit scale 1\n" in out and "T5 decoder stack" in out
    assert "mask causal; the softmax adds to scale·q·k: learned relative-position bias" in out

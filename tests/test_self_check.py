"""The self-check at load (:mod:`poskernel_tl.models.self_check`): every architecture the
tests measure exactly passes it; a model the measurement would read wrongly is refused in
one line before anything is measured — AFMoE read as it was before its family file (its
global layers apply no rotary, read as RoPE), and each mutation of what the measurement
reads (a missing soft-cap or ALiBi ramp, a wrong scale, a window one offset too wide, q
read before its norm)."""

import dataclasses

import pytest
import torch
import transformers as tf
from decoder_configs import DECODERS, REFUSED
from test_decoder_sweep import build
from tiny_models import (
    ARCHITECTURES,
    SOFTMAX_ARCHITECTURES,
    VOCAB,
    arch_hf_model,
)

import poskernel_tl as pk
from poskernel_tl.hooks.fast_attention import set_attention
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
from poskernel_tl.models.registry import placeholder_spec
from poskernel_tl.models.self_check import SelfCheckError, record_probe, verify_probe

CASES = [("arch", a) for a in ARCHITECTURES] + \
    [("arch", a) for a in SOFTMAX_ARCHITECTURES] + \
    [("decoder", a) for a in DECODERS if a not in REFUSED]


def probed(hf, tokenizer, spec=None):
    """(loaded model, probe recorded on the untouched model before booting)."""
    spec = spec or describe(hf, placeholder_spec(f"tiny-{hf.config.model_type}", None))
    probe = record_probe(hf, spec, hf.get_input_embeddings().num_embeddings)
    bridge = boot_bridge(hf, tokenizer)
    model = LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf,
                        attention=set_attention(bridge, "sdpa"))
    return model, probe


def check(model, probe, spec=None, scale=None) -> dict:
    return verify_probe(model.bridge, spec or model.spec,
                        model.logit_scale if scale is None else scale, probe, torch.float32)


@pytest.mark.parametrize("kind,arch", CASES)
def test_every_architecture_measured_exactly_passes(kind, arch, tiny_tokenizer):
    hf = arch_hf_model(arch) if kind == "arch" else build(arch)
    model, probe = probed(hf, tiny_tokenizer)
    got = check(model, probe)
    assert got["checked"] and got["max_deviation"] <= 1e-4, got


def test_load_model_checks_afmoe_and_refuses_it_read_as_rope_in_one_line(
        tiny_tokenizer, tmp_path, monkeypatch):
    """``pk.load_model("hf:DIR")``: AFMoE's full-attention layers apply no rotary in
    Hugging Face's forward; read from its modules (the sliding-RoPE family file) they are
    NoPE layers and the check passes. Read as RoPE layers (that reading undone), it is
    refused at load, naming the layer and head; ``self_check=False`` skips it, and says so.
    A Llama passes, and the check reaches the result's provenance."""
    from poskernel_tl.models.families import sliding_rope

    afmoe = tf.AfmoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=4, num_dense_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
        num_shared_experts=1, global_attn_every_n_layers=2, sliding_window=16, bos_token_id=1,
        eos_token_id=2, pad_token_id=2)
    llama = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    for name, cfg in (("afmoe", afmoe), ("llama", llama)):
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    read = pk.load_model(f"hf:{tmp_path / 'afmoe'}", progress=False)
    assert [s.pe for s in read.spec.layers] == ["rope", "none", "rope", "none"]
    assert read.self_check["checked"] and read.self_check["max_deviation"] <= 1e-4
    monkeypatch.setattr(sliding_rope.SlidingRope, "rope_layers", lambda self, attns: None)
    with pytest.raises(SelfCheckError) as refused:
        pk.load_model(f"hf:{tmp_path / 'afmoe'}", progress=False)
    line = str(refused.value)
    assert "\n" not in line and "layer 1, head" in line and "refused" in line, line
    skipped = pk.load_model(f"hf:{tmp_path / 'afmoe'}", progress=False, self_check=False)
    assert not skipped.self_check["checked"] and "skipped" in skipped.self_check["note"]
    model = pk.load_model(f"hf:{tmp_path / 'llama'}", progress=False)
    assert model.self_check["checked"] and model.self_check["probe"] == [1, 32]
    ids = torch.randint(3, VOCAB - 2, (4, 24), generator=torch.Generator().manual_seed(0))
    res = pk.measure(model, ids, progress=False, null_perms=0)
    assert res.provenance["self_check"]["max_deviation"] <= 1e-4


def mutated(spec, layer_fn=None, terms_fn=None):
    """``spec`` with every layer's scheme changed (``layer_fn``) or terms replaced
    (``terms_fn``: name → value, None removing it)."""
    layers = []
    for s in spec.layers:
        s = layer_fn(s) if layer_fn else s
        if terms_fn:
            s = dataclasses.replace(s, terms=s.terms.replace(**terms_fn))
        layers.append(s)
    return dataclasses.replace(spec, layers=tuple(layers))


@pytest.mark.parametrize("case,arch,change,expect", [
    ("soft-cap missing", "gemma2", dict(terms_fn={"softcap": None}), "layer 0, head"),
    ("ALiBi missing", "bloom", dict(terms_fn={"slopes": None}), "layer 0, head"),
    ("window one offset too wide", "mistral",
     dict(layer_fn=lambda s: dataclasses.replace(s, window=s.window + 1)),
     "keeps other entries than the measurement reads"),
])
def test_a_mutated_reading_is_refused_at_load(case, arch, change, expect, tiny_tokenizer):
    model, probe = probed(arch_hf_model(arch), tiny_tokenizer)
    assert check(model, probe)["checked"]
    with pytest.raises(SelfCheckError, match=expect):
        check(model, probe, mutated(model.spec, **change))


def test_a_wrong_scale_and_q_before_its_norm_are_refused(tiny_tokenizer):
    """A logit scale 1 % off; Qwen3's q and k read before their QK-norm (the captured q
    and k replaced by the ones the projection gives, which the norm then rescales)."""
    model, probe = probed(arch_hf_model("llama"), tiny_tokenizer)
    with pytest.raises(SelfCheckError, match="layer 0, head"):
        check(model, probe, scale=model.logit_scale * 1.01)
    model, probe = probed(arch_hf_model("qwen3"), tiny_tokenizer)
    norms = [m for n, m in model.hf_model.named_modules() if n.endswith(("q_norm", "k_norm"))]
    for m in norms:  # the norms dropped from the bridge's forward: q, k as projected
        m.forward = lambda x: x
    with pytest.raises(SelfCheckError, match="layer 0, head"):
        check(model, probe)


def test_a_missing_offset_table_is_refused_at_load(tiny_tokenizer):
    """MPNet's learned relative-position table left out of the scheme: what the fits would
    read differs from the softmax's input by b_h(t − s), refused at load."""
    from test_mpnet import build
    model, probe = probed(build(), tiny_tokenizer)
    assert check(model, probe)["checked"]
    with pytest.raises(SelfCheckError, match="layer 0, head"):
        check(model, probe, mutated(model.spec, terms_fn={"relative_bias": None}))

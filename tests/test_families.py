"""The model-family registry: each family file claims its model types once, says how its
checkpoint loads and what it refuses, and the generic code asks it (a family added is one
module, read with no other edit)."""

from types import SimpleNamespace

import pytest
import torch
from transformers import MptConfig, MptForCausalLM

from poskernel_tl.errors import UserError
from poskernel_tl.models.families import registry
from poskernel_tl.models.families.family import Family, Stack
from poskernel_tl.models.scheme import UnreadableSchemeError
from poskernel_tl.models.scheme_reader import alibi_slopes, read_layers


def test_each_family_claims_its_model_types():
    got = {kind: f.NAME for kind, f in registry.FAMILIES.items()}
    sliding = "RoPE on sliding layers only"
    assert got == {"bert": "BERT", "bloom": "BLOOM", "codegen": "CodeGen", "falcon": "Falcon",
                   "gpt_neo": "GPT-Neo", "mpt": "MPT", "mpnet": "MPNet", "t5": "T5", "mt5": "T5",
                   "switch_transformers": "T5", "longt5": "T5", "t5gemma": "T5Gemma",
                   **dict.fromkeys(["bart", "mbart", "blenderbot", "marian", "pegasus",
                                    "m2m_100"], "BART"),
                   "afmoe": sliding, "cohere2": sliding, "exaone4": sliding,
                   "nanochat": "NanoChat", "hrm_text": "HRM-Text", "led": "LED"}
    encoders = {f.NAME for f in registry.FAMILIES.values() if not f.CAUSAL}
    assert encoders == {"BERT", "MPNet"}
    assert {f.NAME for f in registry.FAMILIES.values() if f.STACKS} == {"T5", "T5Gemma",
                                                                         "BART", "LED"}
    assert registry.family_of(SimpleNamespace(model_type="llama")) is None


def test_two_families_claiming_one_type_are_refused(monkeypatch):
    class Twin(Family):
        NAME, MODEL_TYPES = "Twin", frozenset({"bert"})
    from poskernel_tl import plugins

    real = plugins.importlib.import_module

    def with_twin(name):
        module = real(name)
        return SimpleNamespace(FAMILY=Twin()) if name.endswith(".codegen") else module
    monkeypatch.setattr(plugins.importlib, "import_module", with_twin)
    with pytest.raises(ValueError, match="'bert' is claimed by"):
        registry.families()


def test_a_stack_that_is_not_there_names_the_stacks():
    t5 = registry.FAMILIES["t5"]
    assert t5.stack(None) == Stack("encoder", False, "encoder_blocks.{i}.attn")
    assert t5.stack("decoder").causal
    with pytest.raises(UserError, match="T5 has no stack 'middle'; its stacks: encoder, "
                                        "decoder"):
        t5.stack("middle")


def test_alibi_is_read_only_where_a_family_reads_it():
    llama = torch.nn.Module()
    llama.config = SimpleNamespace(model_type="llama")
    with pytest.raises(ValueError, match="'llama': slopes unknown"):
        alibi_slopes(llama, None, 4)
    mpt = registry.FAMILIES["mpt"]
    assert mpt.uses_alibi(SimpleNamespace(attn_config=SimpleNamespace(alibi=True)))
    assert not mpt.uses_alibi(SimpleNamespace(attn_config=SimpleNamespace(alibi=False)))


def test_a_family_refuses_a_setting_in_one_line():
    torch.manual_seed(0)
    cfg = MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=300, max_seq_len=64,
                    attn_config={"alibi": True, "clip_qkv": 6.0})
    with pytest.raises(UnreadableSchemeError, match="MPT's clip_qkv clamps q and k"):
        read_layers(MptForCausalLM(cfg), "alibi", 2, 16, 4)


@pytest.mark.parametrize("arch", ["afmoe", "cohere2", "exaone4"])
def test_rope_is_read_on_the_layers_that_rotate(arch):
    """AFMoE, Cohere 2 and EXAONE 4 (with a window) rotate only their sliding layers: their
    full-attention layers are read as NoPE (no frequencies), from their own modules."""
    from test_decoder_sweep import build

    from poskernel_tl.models.loading import describe
    from poskernel_tl.models.registry import placeholder_spec

    hf = build(arch)
    layers = describe(hf, placeholder_spec(f"tiny-{arch}", None)).layers
    full = [t == "full_attention" for t in hf.config.layer_types]
    assert [s.pe for s in layers] == ["none" if f else "rope" for f in full], layers
    assert all((s.inv_freq is None) == f for s, f in zip(layers, full))

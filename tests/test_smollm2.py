"""The embedded default model: real trained weights, loaded offline."""

import pytest
import torch

from poskernel_tl.hooks import capture_qk, logit_scale
from poskernel_tl.reducers.base import LayerBatch

pytestmark = pytest.mark.smollm2
SCORES_TOL = 1e-4  # float32, d_head 64, 30 layers of real activations
LOGPROB_TOL = 1e-3


def test_spec_and_frequencies(smollm2):
    spec = smollm2.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (30, 9, 3, 64)
    theta = spec.rotary_frequencies()
    assert theta.shape == (32,) and abs(theta[1] - 1e5 ** (-2 / 64)) < 1e-6


def test_greedy_generation_is_sensible(smollm2):
    from poskernel_tl.models.embedded import from_gguf

    tok = smollm2.tokenizer
    ids = tok("The capital of France is", return_tensors="pt").input_ids.to(smollm2.device)
    pristine, _ = from_gguf(smollm2.spec, torch.float32)  # never wrapped by a bridge
    with torch.no_grad():
        out = pristine.generate(ids.cpu(), max_new_tokens=4, do_sample=False)
        bridge_lp = smollm2.bridge(ids).log_softmax(-1).cpu()
        hf_lp = pristine(ids.cpu()).logits.log_softmax(-1)
    text = tok.decode(out[0, ids.shape[1]:])
    assert "Paris" in text, text
    diff = (bridge_lp - hf_lp).abs().max().item()
    assert diff < LOGPROB_TOL, f"max |Δ log-prob| = {diff:.3g}"


def test_hook_shapes_and_scores_all_layers(smollm2):
    """The seed's sanity check: Q·Kᵀ/√d == hook_attn_scores, every layer and head."""
    text = "In 1905 Albert Einstein published four papers that changed physics."
    ids = smollm2.tokenizer(text, return_tensors="pt").input_ids.to(smollm2.device)
    T = ids.shape[1]
    got, scores = {}, {}
    def on_layer(c):
        got[c.layer] = (c.q, c.k)
        scores[c.layer] = c.scores

    with torch.no_grad(), capture_qk(smollm2.bridge, on_layer, scores=True) as capture:
        capture.forward(ids)
    assert sorted(got) == list(range(30))
    scale = logit_scale(smollm2.hf_model, 64)
    tri = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    worst = 0.0
    for layer, (q, k) in got.items():
        assert tuple(q.shape) == (1, T, 9, 64) and tuple(k.shape) == (1, T, 3, 64)
        ours = LayerBatch(layer, q, k, torch.arange(1), scale).scores
        worst = max(worst, (ours - scores[layer])[..., tri].abs().max().item())
    assert worst < SCORES_TOL, f"max diff {worst:.3g}"


def _conversion_round_trip(name: str, monkeypatch, tmp_path, text: str):
    """from_gguf twice with an empty cache: the first converts the GGUF file and keeps the
    result, the second reads the kept folder (no GGUF read) and gives the same weights,
    config, token ids and logits; a damaged copy is converted again."""
    import transformers

    from poskernel_tl.models import embedded
    from poskernel_tl.models.registry import REGISTRY

    spec = REGISTRY[name]
    assembled = embedded.weights_path(spec)  # an assembled file stays where it is
    monkeypatch.setattr(embedded, "weights_path", lambda s: assembled)
    monkeypatch.setenv("POSKERNEL_CACHE", str(tmp_path))
    first, tok1 = embedded.from_gguf(spec, torch.float32, progress=False)
    folder = embedded.converted_dir(spec)
    assert (folder / "float32" / "model.safetensors").is_file()
    assert (folder / "tokenizer" / "tokenizer_config.json").is_file()
    reads = []
    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **kw: reads.append(kw.get("gguf_file")) or real(*a, **kw))
    second, tok2 = embedded.from_gguf(spec, torch.float32, progress=False)
    assert reads == [None]  # the kept folder, not the GGUF file
    a, b = first.state_dict(), second.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    diff = {k for k, v in first.config.to_diff_dict().items()
            if second.config.to_diff_dict().get(k) != v} - {"quantization_config"}
    assert not diff, diff
    ids1, ids2 = tok1(text)["input_ids"], tok2(text)["input_ids"]
    assert ids1 == ids2 and tok1.name_or_path == tok2.name_or_path == assembled.name
    ids = torch.tensor([ids1[:64]])
    with torch.no_grad():
        assert torch.equal(first(ids).logits, second(ids).logits)
    (folder / "float32" / "model.safetensors").write_bytes(b"damaged")
    third, _ = embedded.from_gguf(spec, torch.float32, progress=False)
    assert reads[-1] == assembled.name  # converted again
    assert all(torch.equal(a[k], third.state_dict()[k]) for k in a)


@pytest.mark.slow  # three conversions of the GGUF file (≈ 50 s)
def test_the_gguf_conversion_is_kept_and_read_back_the_same(monkeypatch, tmp_path):
    _conversion_round_trip("smollm2-135m", monkeypatch, tmp_path,
                           "def f(x):\n    return x ** 2  # Héllo, wörld! 1905 " * 8)


@pytest.mark.gemma3
@pytest.mark.slow
def test_gemma3_conversion_is_kept_and_read_back_the_same(monkeypatch, tmp_path):
    _conversion_round_trip("gemma3-270m", monkeypatch, tmp_path,
                           "def f(x):\n    return x ** 2  # Héllo, wörld! 1905 日本語 " * 8)

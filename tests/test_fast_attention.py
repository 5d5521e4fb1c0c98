"""The sdpa attention path: the same hooks, in the same order and shapes, and the same
numbers as TransformerLens's own attention; TransformerLens's code whenever the scores
or the pattern are hooked; one bridge at a time; a guard on the TransformerLens version."""

import warnings

import pytest
import torch
from tiny_models import VOCAB, tiny_loaded
from transformer_lens.hook_points import HookPoint
from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
    JointQKVAttentionBridge,
)
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)

from poskernel_tl.hooks import capture_qk, masks
from poskernel_tl.hooks import fast_attention as fa
from poskernel_tl.models.loading import LoadedModel, load_model

TOL = 1e-5  # float32, sdpa vs TransformerLens's eager attention, 2 tiny layers (seen ≤ 3e-7)
SMOLLM2_LOGPROB_TOL = 5e-4  # logits and log-probs, float32, 30 layers, T = 64 (seen 8e-5)
SMOLLM2_QK_RTOL = 1e-5  # max |Δ rot_q/rot_k| of a layer over that layer's max |value|
ARCHS = ["llama", "olmo", "nope", "gpt2"]
BASE_CLASS = {"llama": PositionEmbeddingsAttentionBridge, "olmo": PositionEmbeddingsAttentionBridge,
              "nope": PositionEmbeddingsAttentionBridge, "gpt2": JointQKVAttentionBridge}


def _ids(T=24, batch=2, seed=0):
    return torch.randint(3, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The query shapes of every attention the fast path computed."""
    calls = []
    real = fa._sdpa

    def counting(q, k, v, scale, window=0):
        calls.append(tuple(q.shape))
        return real(q, k, v, scale, window)

    monkeypatch.setattr(fa, "_sdpa", counting)
    return calls


def _run(model, ids, **forward_kwargs):
    """Logits, the q/k entering Q·Kᵀ per layer, and (name, shape) of every hook point of
    block 0's attention as it fired (scores and pattern left alone)."""
    got, fired = {}, []

    def on_layer(c):
        got[c.layer] = (c.q.clone(), c.k.clone())

    points = [(name, point) for name, point in model.bridge.blocks[0].attn.named_modules()
              if isinstance(point, HookPoint)
              and not name.endswith(("hook_attn_scores", "hook_pattern"))]
    for name, point in points:
        point.add_hook(lambda x, hook, name=name: fired.append((name, tuple(x.shape))))
    try:
        with torch.no_grad(), capture_qk(model.bridge, on_layer):
            logits = model.bridge(ids, **forward_kwargs)
    finally:
        for _, point in points:
            point.remove_hooks()
    return logits, got, fired


def _max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_path_matches_eager(arch, tiny_tokenizer, sdpa_calls):
    model = tiny_loaded(arch, tiny_tokenizer)
    ids = _ids()
    eager_logits, eager_qk, eager_fired = _run(model, ids)
    assert sdpa_calls == []
    n_layers = model.spec.n_layers
    assert fa.install_fast_attention(model.bridge) == n_layers
    logits, qk, fired = _run(model, ids)
    assert len(sdpa_calls) == n_layers, sdpa_calls
    assert fired == eager_fired  # the same hooks, in the same order, with the same shapes
    names = [name for name, _ in fired]
    wanted = ["hook_rot_q", "hook_rot_k"] if model.spec.pe != "learned-absolute" else []
    assert {"hook_in", "hook_out", *wanted} <= set(names) and len(names) >= 9, names
    diff = _max_diff(logits, eager_logits)
    assert diff < TOL, f"{arch}: max |Δ logits| = {diff:.3g}"
    for layer in range(n_layers):
        for ours, theirs, label in zip(qk[layer], eager_qk[layer], "qk"):
            assert ours.shape == theirs.shape
            diff = _max_diff(ours, theirs)
            assert diff < TOL, f"{arch} layer {layer} {label}: max diff {diff:.3g}"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fast_path_matches_eager_in_compatibility_mode(arch, tiny_tokenizer, sdpa_calls):
    """Processed weights (folded norms, centred writes) and -inf masking: still equal."""
    model = tiny_loaded(arch, tiny_tokenizer, compatibility_mode=True)
    ids = _ids()
    eager_logits, eager_qk, eager_fired = _run(model, ids)
    fa.install_fast_attention(model.bridge)
    logits, qk, fired = _run(model, ids)
    assert len(sdpa_calls) == model.spec.n_layers and fired == eager_fired
    diff = max([_max_diff(logits, eager_logits)]
               + [_max_diff(a, b) for layer in qk for a, b in zip(qk[layer], eager_qk[layer])])
    assert diff < TOL, f"{arch}: max |Δ| over logits and q/k = {diff:.3g}"


@pytest.mark.parametrize("hook_name", ["hook_attn_scores", "hook_pattern"])
@pytest.mark.parametrize("arch", ARCHS)
def test_hooked_scores_or_pattern_run_eager(arch, hook_name, tiny_tokenizer, sdpa_calls):
    """A hook on the scores or the pattern of one layer sends that layer (only) through
    TransformerLens's attention, and the hook sees [batch head_index query_pos key_pos]."""
    model = tiny_loaded(arch, tiny_tokenizer)
    ids = _ids()
    with torch.no_grad():
        reference = model.bridge(ids)
    fa.install_fast_attention(model.bridge)
    seen = []
    hooks = [(f"blocks.1.attn.{hook_name}", lambda x, hook: seen.append(tuple(x.shape)))]
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=hooks):
        logits = model.bridge(ids)
    assert seen == [(2, model.spec.n_heads, 24, 24)]
    assert len(sdpa_calls) == model.spec.n_layers - 1
    diff = _max_diff(logits, reference)
    assert diff < TOL, f"{arch}: max |Δ logits| = {diff:.3g}"
    sdpa_calls.clear()
    with torch.no_grad():
        model.bridge(ids)  # the hook is gone: every layer is fast again
    assert len(sdpa_calls) == model.spec.n_layers


def test_other_bridge_is_not_affected(tiny_tokenizer, sdpa_calls):
    fast, other = tiny_loaded("llama", tiny_tokenizer), tiny_loaded("llama", tiny_tokenizer)
    assert fa.install_fast_attention(fast.bridge) == 2
    assert all(type(b.attn) is PositionEmbeddingsAttentionBridge for b in other.bridge.blocks)
    with torch.no_grad():
        other.bridge(_ids())
        assert sdpa_calls == []
        fast.bridge(_ids())
    assert len(sdpa_calls) == 2
    assert fa.install_fast_attention(fast.bridge) == 2  # idempotent
    assert fa.uninstall_fast_attention(fast.bridge) == 2
    assert all(type(b.attn) is PositionEmbeddingsAttentionBridge for b in fast.bridge.blocks)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_padding_mask_runs_eager(arch, tiny_tokenizer, sdpa_calls):
    """A left-padded batch is not plain causal: TransformerLens's attention handles it."""
    model = tiny_loaded(arch, tiny_tokenizer)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        reference = model.bridge(ids, attention_mask=mask)
        fa.install_fast_attention(model.bridge)
        logits = model.bridge(ids, attention_mask=mask)
    assert sdpa_calls == []
    assert torch.equal(logits, reference)


def test_cached_decoding_matches_eager(tiny_tokenizer):
    """A second step fed the cache of the first gives what TransformerLens's path gives."""
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = _ids()

    def two_steps():
        with torch.no_grad():
            _, cache = model.bridge(ids[:, :16], return_type="logits_and_cache")
            return model.bridge(ids[:, 16:], past_key_values=cache)

    reference = two_steps()
    fa.install_fast_attention(model.bridge)
    diff = _max_diff(two_steps(), reference)
    assert diff < TOL, f"max |Δ logits| = {diff:.3g}"


def test_plain_causal_mask_check():
    T, low = 5, torch.finfo(torch.float32).min
    causal = torch.full((T, T), low).triu(1)[None, None].expand(3, 1, T, T).clone()
    assert masks.is_plain_causal(None, T)
    assert masks.is_plain_causal(causal, T)
    assert masks.is_plain_causal(causal.masked_fill(causal < 0, -torch.inf), T)
    assert masks.is_plain_causal(torch.ones(T, T, dtype=torch.bool).tril()[None, None], T)
    assert not masks.is_plain_causal(causal, T - 1)
    assert not masks.is_plain_causal(causal[:, 0], T)  # not 4D
    causal[1, 0, 3, 0] = low  # one padded key: checked again after the in-place edit
    assert not masks.is_plain_causal(causal, T)
    assert not masks.is_plain_causal(torch.zeros(1, 1, T, T), T)  # bidirectional
    with torch.inference_mode():  # inference tensors have no version counter
        assert masks.is_plain_causal(torch.full((T, T), low).triu(1)[None, None], T)


def test_inference_mode(tiny_tokenizer, sdpa_calls):
    model = tiny_loaded("llama", tiny_tokenizer)
    with torch.inference_mode():
        reference = model.bridge(_ids())
        fa.install_fast_attention(model.bridge)
        diff = _max_diff(model.bridge(_ids()), reference)
    assert len(sdpa_calls) == 2 and diff < TOL, f"max |Δ logits| = {diff:.3g}"


def test_transformer_lens_version_is_verified():
    """Fails on purpose after a TransformerLens upgrade: the fast path copies the order
    of hooks and the arithmetic of TransformerLens's attention forwards, so re-check
    hooks/fast_attention.py against the new version before adding it to the list."""
    version = fa.transformer_lens_version()
    assert version in fa.VERIFIED_TL_VERSIONS, (
        f"TransformerLens {version} is installed, but the fast attention path was verified "
        f"only on {fa.VERIFIED_TL_VERSIONS}: until it is re-verified, install_fast_attention "
        "leaves every bridge on TransformerLens's own attention")


def test_unverified_version_warns_once_and_stays_eager(monkeypatch, tiny_tokenizer):
    monkeypatch.setattr(fa, "transformer_lens_version", lambda: "0.0.0+unverified")
    monkeypatch.setattr(fa, "_WARNED", set())
    model = tiny_loaded("llama", tiny_tokenizer)
    with pytest.warns(RuntimeWarning, match="verified on TransformerLens"):
        assert fa.install_fast_attention(model.bridge) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fa.install_fast_attention(model.bridge) == 0
        wrapped = LoadedModel.from_bridge(model.bridge, tiny_tokenizer)
    assert wrapped.attention == "eager"
    assert all(type(b.attn) is PositionEmbeddingsAttentionBridge for b in model.bridge.blocks)


@pytest.mark.parametrize("arch", ["olmo", "gpt2"])
def test_loaded_model_records_attention(arch, tiny_tokenizer):
    model = tiny_loaded(arch, tiny_tokenizer)
    assert model.attention == "eager"  # built directly: TransformerLens's own attention
    with pytest.raises(ValueError, match="sdpa, eager"):
        LoadedModel.from_bridge(model.bridge, tiny_tokenizer, attention="flash")
    wrapped = LoadedModel.from_bridge(model.bridge, tiny_tokenizer)
    assert wrapped.attention == "sdpa"
    assert all(type(b.attn) is fa.FAST_CLASSES[BASE_CLASS[arch]] for b in model.bridge.blocks)
    eager = LoadedModel.from_bridge(model.bridge, tiny_tokenizer, attention="eager")
    assert eager.attention == "eager"
    assert all(type(b.attn) is BASE_CLASS[arch] for b in model.bridge.blocks)


def test_load_model_rejects_unknown_attention():
    with pytest.raises(ValueError, match="sdpa, eager"):
        load_model("smollm2-135m", attention="flash")  # before any weights are read


@pytest.mark.smollm2
def test_smollm2_sdpa_matches_eager(smollm2):
    """The embedded model at T = 64: log-probs and every layer's rot_q/rot_k agree."""
    text = ("The rotary embedding rotates each pair of query and key dimensions by an angle "
            "proportional to the position, so their dot product depends on the offset. ") * 3
    ids = smollm2.tokenizer(text, return_tensors="pt").input_ids[:, :64]
    ids = torch.cat([ids, ids.flip(-1)]).to(smollm2.device)
    assert ids.shape == (2, 64)
    was = smollm2.attention
    try:
        assert fa.set_attention(smollm2.bridge, "sdpa") == "sdpa"
        fast_logits, fast_qk, _ = _run(smollm2, ids)
        assert fa.set_attention(smollm2.bridge, "eager") == "eager"
        eager_logits, eager_qk, _ = _run(smollm2, ids)
    finally:
        fa.set_attention(smollm2.bridge, was)
    diff = _max_diff(fast_logits.log_softmax(-1), eager_logits.log_softmax(-1))
    assert diff < SMOLLM2_LOGPROB_TOL, f"max |Δ log-prob| = {diff:.3g}"
    diff = _max_diff(fast_logits, eager_logits)
    assert diff < SMOLLM2_LOGPROB_TOL, f"max |Δ logits| = {diff:.3g}"
    worst, worst_abs = 0.0, 0.0
    for layer in range(30):
        for ours, theirs in zip(fast_qk[layer], eager_qk[layer]):
            assert ours.shape == theirs.shape
            worst_abs = max(worst_abs, _max_diff(ours, theirs))
            worst = max(worst, _max_diff(ours, theirs) / theirs.abs().max().item())
    assert worst < SMOLLM2_QK_RTOL, (
        f"rot_q/rot_k over 30 layers: max |Δ| = {worst_abs:.3g}, relative {worst:.3g}")


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen3", "olmo2"])
def test_fast_path_covers_sliding_windows_and_qk_norm(arch, tiny_tokenizer, sdpa_calls):
    """A causal sliding window (read from the mask the layer receives) and QK-norm, before
    the reshape (OLMo-2) or per head after it (Gemma 3, Qwen3), on the sdpa path: the same
    hooks, logits and q/k as TransformerLens's own attention, at a length past the window."""
    from tiny_models import arch_hf_model

    from poskernel_tl.models.loading import boot_bridge

    bridge = boot_bridge(arch_hf_model(arch), tiny_tokenizer)
    model = type("M", (), {"bridge": bridge, "spec": type("S", (), {"n_layers": 4})})
    ids = _ids(T=40)
    eager_logits, eager_qk, eager_fired = _run(model, ids)
    assert sdpa_calls == []
    assert fa.install_fast_attention(bridge) == 4
    logits, qk, fired = _run(model, ids)
    assert len(sdpa_calls) == 4 and fired == eager_fired
    diff = max([_max_diff(logits, eager_logits)]
               + [_max_diff(a, b) for layer in qk for a, b in zip(qk[layer], eager_qk[layer])])
    assert diff < TOL, f"{arch}: max |Δ| over logits and q/k = {diff:.3g}"


def test_causal_window_reads_the_mask():
    T = 12
    lag = torch.arange(T)[:, None] - torch.arange(T)[None]
    for w in (1, 5, 11):
        band = ((lag >= 0) & (lag < w))[None, None]
        assert masks.causal_window(band, T) == w
        assert masks.causal_window(torch.zeros(1, 1, T, T).masked_fill(~band, -torch.inf), T) == w
    assert masks.causal_window(((lag >= 0) & (lag < T))[None, None], T) == 0
    chunked = (lag >= 0) & (torch.arange(T)[:, None] // 4 == torch.arange(T)[None] // 4)
    assert masks.causal_window(chunked[None, None], T) is None

"""Sliding-window layers on their band: blocks of queries against their window of keys,
equal to TransformerLens's and Hugging Face's eager attention, with no [T, T] mask built
for a causal or windowed layer on the fast path."""

import pytest
import torch
import torch.nn.functional as F
from tiny_models import VOCAB, arch_hf_model
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)

from poskernel_tl.hooks import banded, lazy_masks
from poskernel_tl.hooks import fast_attention as fa
from poskernel_tl.models.loading import boot_bridge

TOL = 1e-5  # float32, tiny 4-layer models, banded sdpa vs eager (seen ≤ 1e-6)
ARCHS = ["gemma3", "mistral", "gpt_oss", "qwen2"]  # window 16 (gpt-oss: learned sinks)


def _reference(n: int, window: int) -> torch.Tensor:
    lag = torch.arange(n)[:, None] - torch.arange(n)[None]
    return (lag >= 0) & (lag < window)


@pytest.mark.parametrize(("n", "window", "block", "heads"),
                         [(40, 16, 8, (4, 2)), (37, 5, 4, (4, 4)), (64, 16, 16, (4, 1)),
                          (9, 1, 4, (2, 1)), (30, 29, 8, (2, 2))])
def test_banded_sdpa_equals_the_full_band_mask(n, window, block, heads):
    gen = torch.Generator().manual_seed(n + window)
    q = torch.randn(2, heads[0], n, 8, generator=gen)
    k, v = (torch.randn(2, heads[1], n, 8, generator=gen) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_reference(n, window), scale=0.3,
                                         enable_gqa=heads[0] != heads[1])
    got = banded.banded_sdpa(q, k, v, 0.3, window, block=block)
    diff = (got - ref).abs().max().item()
    assert diff < 1e-6, f"n={n} w={window} block={block}: max |Δ| = {diff:.3g}"


def test_blocks_cover_each_window():
    for n, window, block in [(1300, 512, 512), (40, 16, 8), (17, 3, 4)]:
        blocks = banded.band_blocks(n, window, block)
        assert [b[0] for b in blocks] == list(range(0, n, block)) and blocks[-1][1] == n
        for start, end, key_start in blocks:
            assert key_start % block == 0 and key_start <= max(0, start - window + 1)
            assert end - key_start <= 2 * block + window


@pytest.mark.skipif(torch.backends.mkldnn.is_available() is False, reason="CPU kernel")
def test_default_blocks_are_bitwise_the_full_call_on_cpu():
    """Key starts on multiples of 512 (the CPU kernel's key tile): the same sums in the
    same order as the full-size masked call (Gemma-3-270M's shapes: w = 512, d_head 256)."""
    gen = torch.Generator().manual_seed(0)
    n = 1300
    q = torch.randn(1, 4, n, 256, generator=gen)
    k, v = (torch.randn(1, 1, n, 256, generator=gen) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_reference(n, 512), scale=1 / 16,
                                         enable_gqa=True)
    got = banded.banded_sdpa(q, k, v, 1 / 16, 512)
    assert torch.equal(got, ref), f"max |Δ| = {(got - ref).abs().max().item():.3g}"


def _forward(bridge, ids) -> tuple[torch.Tensor, dict]:
    """Logits and every layer's hook_z (the attention output before o)."""
    zs = {}
    names = [f"blocks.{i}.attn.hook_z" for i in range(len(bridge.blocks))]
    hooks = [(name, lambda x, hook, name=name: zs.__setitem__(name, x.clone()))
             for name in names]
    with torch.no_grad():
        logits = bridge.run_with_hooks(ids, fwd_hooks=hooks)
    return logits, zs


def _hf_eager_z(arch: str, ids) -> tuple[torch.Tensor, dict]:
    """Hugging Face's own eager forward (a second copy of the same seeded weights): logits
    and each layer's attention output entering o_proj."""
    hf = arch_hf_model(arch)
    zs, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: zs.__setitem__(f"blocks.{i}.attn.hook_z", args[0].clone())))
    with torch.no_grad():
        logits = hf(ids).logits
    for handle in handles:
        handle.remove()
    return logits, zs


@pytest.fixture
def built_masks(monkeypatch):
    """Every described mask that was materialised (a [T, T] built after all)."""
    built = []
    real = lazy_masks.LazyCausalMask.materialize

    def counting(self):
        built.append(self.window)
        return real(self)

    monkeypatch.setattr(lazy_masks.LazyCausalMask, "materialize", counting)
    return built


@pytest.mark.parametrize("arch", ARCHS)
def test_banded_layers_equal_eager_attention(arch, tiny_tokenizer, monkeypatch, built_masks):
    """Tiny models (window 16) at T = 64 in blocks of 8 queries: logits and hook_z of every
    layer equal TransformerLens's eager path and Hugging Face's eager attention; the
    fast path builds no [T, T] mask (gpt-oss: learned sinks keep TransformerLens's path,
    on the materialised masks)."""
    monkeypatch.setattr(banded, "BAND_BLOCK", 8)
    calls = []
    real = banded.banded_sdpa
    monkeypatch.setattr(fa, "banded_sdpa", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    ids = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))
    bridge = boot_bridge(arch_hf_model(arch), tiny_tokenizer)
    eager_logits, eager_z = _forward(bridge, ids)
    hf_logits, hf_z = _hf_eager_z(arch, ids)
    assert fa.install_fast_attention(bridge) == 4
    config = bridge.original_model.config
    assert config._attn_implementation == lazy_masks.PREFIX + "eager"
    logits, z = _forward(bridge, ids)
    diffs = {"TL logits": (logits - eager_logits).abs().max().item(),
             "HF logits": (logits - hf_logits).abs().max().item(),
             "TL hook_z": max((z[n] - eager_z[n]).abs().max().item() for n in z),
             "HF z": max((z[n] - hf_z[n].reshape(z[n].shape)).abs().max().item() for n in z)}
    assert max(diffs.values()) < TOL, f"{arch}: {diffs}"
    if arch == "gpt_oss":
        assert calls == [] and built_masks, "sinks: TransformerLens's path, built masks"
    else:
        assert calls and set(calls) == {16} and built_masks == []
    fa.uninstall_fast_attention(bridge)
    assert config._attn_implementation == "eager"


def test_padding_or_a_hooked_pattern_builds_the_mask(tiny_tokenizer, built_masks):
    """Anything the band does not describe gets the mask Hugging Face builds: a padded
    batch, or a hook on the pattern (TransformerLens's own attention)."""
    bridge = boot_bridge(arch_hf_model("gemma3"), tiny_tokenizer)
    ids = torch.randint(3, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    ref = bridge(ids)
    fa.install_fast_attention(bridge)
    assert all(type(b.attn) is not PositionEmbeddingsAttentionBridge for b in bridge.blocks)
    with torch.no_grad():
        hooked = bridge.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern",
                                                        lambda x, hook: None)])
    assert built_masks, "the hooked layer read a built mask"
    assert (hooked - ref).abs().max().item() < TOL
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[0, :3] = 0
    seen = []
    bridge.blocks[0].attn.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True)
    with torch.no_grad():
        bridge(ids, attention_mask=mask)
    assert seen and all(isinstance(m, torch.Tensor) for m in seen)


def test_chunked_and_offset_masks_are_built():
    assert lazy_masks._describable(dict(allow_is_causal_skip=True, q_length=8, kv_length=8)) == 0
    config = type("C", (), {"sliding_window": 4, "attention_chunk_size": None})()
    base = dict(allow_is_causal_skip=True, q_length=8, kv_length=8, config=config)
    assert lazy_masks._describable({**base, "local_size": 4}) == 4
    assert lazy_masks._describable({**base, "local_size": 3}) is None  # not the window
    wide = type("C", (), {"sliding_window": 8, "attention_chunk_size": None})()
    assert lazy_masks._describable({**base, "config": wide, "local_size": 8}) == 0  # w ≥ T
    assert lazy_masks._describable({**base, "kv_offset": 2}) is None
    assert lazy_masks._describable({**base, "allow_is_causal_skip": False}) is None
    assert lazy_masks._describable({**base, "attention_mask": torch.ones(1, 8).bool()}) == 0
    chunked = type("C", (), {"sliding_window": 4, "attention_chunk_size": 4})()
    assert lazy_masks._describable({**base, "config": chunked, "local_size": 4}) is None

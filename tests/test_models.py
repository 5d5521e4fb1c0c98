"""Bridge parity, hook-name → shape table, Q·Kᵀ vs hook_attn_scores, NoPE converter."""

import functools

import pytest
import torch
from tiny_models import VOCAB, tiny_hf_model, tiny_loaded

from poskernel_tl.hooks import block_site, capture_qk, kv_head_map, logit_scale, qk_hook_names
from poskernel_tl.hooks.names import scores_hook_is_logits
from poskernel_tl.reducers.base import LayerBatch

LOGPROB_TOL = 1e-5  # bridge (compatibility mode) vs HF eager log-probabilities, float32
SCORES_TOL = 1e-5  # our q·kᵀ·scale vs the model's own hook_attn_scores, lower triangle
NOPE_TOL = 1e-6  # NoPE logits under different position-id spacing
ROPE_MIN_CHANGE = 1e-3  # the RoPE control must move at least this much
QK_TOL = 1e-6  # bridge hook_q/hook_k vs HF's query/key projections, float32
PATTERN_TOL = 1e-6  # BERT's hook_attn_scores vs softmax(q·kᵀ·scale)
ARCHS = ["gpt2", "olmo", "llama", "nope"]  # hook_attn_scores holds the logits
ALL_ARCHS = ARCHS + ["bert"]  # bert: hook_attn_scores holds the softmax pattern


def _ids(T=12, batch=2, seed=0):
    return torch.randint(3, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


def _capture(model, ids):
    got, scores = {}, {}

    def on_layer(c):
        got[c.layer] = (c.q.clone(), c.k.clone())
        scores[c.layer] = c.scores.clone()

    with torch.no_grad(), capture_qk(model.bridge, on_layer, scores=True) as capture:
        out = capture.forward(ids)
    return out, got, scores


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_bridge_logprobs_match_hf(arch, tiny_tokenizer):
    """Against a separately built HF model with the same weights: booting a bridge
    rewires the HF model it wraps, so that one is no independent reference."""
    model = tiny_loaded(arch, tiny_tokenizer)
    pristine = tiny_hf_model(arch)
    ids = _ids()
    with torch.no_grad():
        ours = model.bridge(ids).log_softmax(-1)
        ref = pristine(ids).logits.log_softmax(-1)
    diff = (ours - ref).abs().max().item()
    assert diff < LOGPROB_TOL, f"{arch}: max |Δ log-prob| = {diff:.3g}"


EXPECTED_HOOKS = {  # arch -> (q hook, k hook, kv heads)
    "gpt2": ("hook_q", "hook_k", 4),
    "olmo": ("hook_rot_q", "hook_rot_k", 4),
    "llama": ("hook_rot_q", "hook_rot_k", 2),
    "nope": ("hook_rot_q", "hook_rot_k", 2),
    "bert": ("hook_q", "hook_k", 4),
}


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_hook_name_shape_table(arch, tiny_tokenizer):
    model = tiny_loaded(arch, tiny_tokenizer)
    q_hook, k_hook, n_kv = EXPECTED_HOOKS[arch]
    for layer in range(2):
        assert qk_hook_names(model.bridge, block_site(layer)) == (
            f"blocks.{layer}.attn.{q_hook}", f"blocks.{layer}.attn.{k_hook}")
    _, got, scores = _capture(model, _ids(T=12, batch=2))
    assert sorted(got) == [0, 1]
    for layer, (q, k) in got.items():
        assert tuple(q.shape) == (2, 12, 4, 16), (arch, layer, "q")
        assert tuple(k.shape) == (2, 12, n_kv, 16), (arch, layer, "k")
        assert tuple(scores[layer].shape) == (2, 4, 12, 12)
    assert model.spec.n_kv_heads == n_kv
    assert kv_head_map(4, n_kv) == [h // (4 // n_kv) for h in range(4)]


@pytest.mark.parametrize("arch", ARCHS)
def test_qk_product_equals_attn_scores(arch, tiny_tokenizer):
    model = tiny_loaded(arch, tiny_tokenizer)
    T = 12
    _, got, scores = _capture(model, _ids(T=T))
    tri = torch.ones(T, T, dtype=torch.bool).tril()  # by index: the fill value may vary
    scale = logit_scale(model.hf_model, model.spec.d_head)
    for layer, (q, k) in got.items():
        ours = LayerBatch(layer, q, k, torch.arange(2), scale).scores
        diff = (ours - scores[layer])[..., tri].abs().max().item()
        assert diff < SCORES_TOL, f"{arch} layer {layer}: max diff {diff:.3g}"


def hf_bert_qk(hf_model, ids) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the query and key projections of an HF BERT (``BertModel`` or
    ``BertForMaskedLM``) as [batch pos head_index d_head]."""
    got, handles = {}, []
    for i, layer in enumerate(getattr(hf_model, "bert", hf_model).encoder.layer):
        sa = layer.attention.self

        def save(module, inputs, out, i=i, slot=0, heads=sa.num_attention_heads):
            got.setdefault(i, [None, None])[slot] = out.unflatten(-1, (heads, -1))
        handles += [sa.query.register_forward_hook(functools.partial(save, slot=0)),
                    sa.key.register_forward_hook(functools.partial(save, slot=1))]
    try:
        with torch.no_grad():
            hf_model(ids)
    finally:
        for h in handles:
            h.remove()
    return {i: tuple(qk) for i, qk in got.items()}


def test_bert_q_k_equal_hf_projections(tiny_tokenizer):
    model = tiny_loaded("bert", tiny_tokenizer)
    ids = _ids()
    _, got, _ = _capture(model, ids)
    ref = hf_bert_qk(tiny_hf_model("bert"), ids)
    assert sorted(got) == sorted(ref) == [0, 1]
    for layer, (q, k) in got.items():
        for name, ours, theirs in (("q", q, ref[layer][0]), ("k", k, ref[layer][1])):
            diff = (ours - theirs).abs().max().item()
            assert diff < QK_TOL, f"layer {layer} {name}: max diff {diff:.3g}"


def test_bert_attn_scores_hook_is_the_softmax_pattern(tiny_tokenizer):
    """On BERT the bridge hands attention to HF and fires hook_attn_scores on the weights
    HF returns: the post-softmax pattern, not q·kᵀ·scale (which q and k give)."""
    model = tiny_loaded("bert", tiny_tokenizer)
    _, got, scores = _capture(model, _ids(T=12))
    scale = logit_scale(model.hf_model, model.spec.d_head)
    assert not scores_hook_is_logits(model.bridge) and model.spec.causal is False
    for layer, (q, k) in got.items():
        logits = LayerBatch(layer, q, k, torch.arange(2), scale).scores
        diff = (logits.softmax(-1) - scores[layer]).abs().max().item()
        assert diff < PATTERN_TOL, f"layer {layer}: max diff {diff:.3g} from the pattern"
        assert (logits - scores[layer]).abs().max().item() > 0.1  # not the logits


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_hook_is_logits_where_the_bridge_computes_attention(arch, tiny_tokenizer):
    assert scores_hook_is_logits(tiny_loaded(arch, tiny_tokenizer).bridge)


def test_nope_rotary_is_identity(tiny_tokenizer):
    model = tiny_loaded("nope", tiny_tokenizer)
    seen = {}
    hooks = []
    for layer in range(2):
        for name in ("hook_q", "hook_rot_q", "hook_k", "hook_rot_k"):
            full = f"blocks.{layer}.attn.{name}"
            hooks.append((full, lambda x, hook, full=full: seen.__setitem__(full, x.clone())))
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=hooks):
        model.bridge(_ids())
    for layer in range(2):
        for a, b in (("hook_q", "hook_rot_q"), ("hook_k", "hook_rot_k")):
            pre, post = seen[f"blocks.{layer}.attn.{a}"], seen[f"blocks.{layer}.attn.{b}"]
            assert torch.equal(pre, post), f"layer {layer}: {b} differs from {a}"
    assert model.spec.rotary_frequencies() is None


def _spacing_change(hf_model, T=16) -> float:
    ids = _ids(T=T, batch=1)
    with torch.no_grad():
        a = hf_model(ids, position_ids=torch.arange(T)[None]).logits
        b = hf_model(ids, position_ids=3 * torch.arange(T)[None]).logits
    return (a - b).abs().max().item()


def test_nope_position_spacing_check_with_rope_control():
    """A constant offset cannot reveal rotary; a change of spacing can. The RoPE twin
    (built after the NoPE model, so it also shows the converter did not leak) must
    move, the NoPE model must not."""
    nope = tiny_hf_model("nope", seed=0)
    rope = tiny_hf_model("llama", seed=0)  # same weights, rotary intact
    nope_change = _spacing_change(nope)
    rope_change = _spacing_change(rope)
    assert nope_change < NOPE_TOL, f"NoPE logits moved by {nope_change:.3g}"
    assert rope_change > ROPE_MIN_CHANGE, f"RoPE control moved only {rope_change:.3g}"


def test_loaded_spec_reads_model_inv_freq(tiny_tokenizer):
    model = tiny_loaded("llama", tiny_tokenizer)
    theta = model.spec.rotary_frequencies()
    want = model.hf_model.model.rotary_emb.inv_freq.double().numpy()
    assert theta is not None and (abs(theta - want) < 1e-12).all()


def test_rotation_from_a_layer_scheme_equals_hugging_face():
    """Both pair layouts against Hugging Face's own rotary code: Llama's ``rotate_half``
    (pairs i, i + r/2; partial rotary leaves dimensions ≥ r alone, as GPT-NeoX does) and
    GPT-J's ``rotate_every_two`` (pairs 2i, 2i + 1)."""
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj

    from poskernel_tl.hooks import pair_indices, rotate
    from poskernel_tl.hooks.rotary import pair_angles
    from poskernel_tl.models.scheme import LayerScheme

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, 16, generator=g, dtype=torch.float64)  # [batch pos head d]
    theta = (1e4 ** (-torch.arange(4, dtype=torch.float64) / 4)).tolist()
    half = LayerScheme("rope", inv_freq=tuple(theta), rotary_dims=8, layout="rotate_half")
    cos, sin = pair_angles(half, 7, "cpu", torch.float64)
    want, _ = neox(x.transpose(1, 2), x.transpose(1, 2), torch.cat([cos, cos], -1)[None],
                   torch.cat([sin, sin], -1)[None])
    assert torch.allclose(rotate(x, half, cos, sin), want.transpose(1, 2), atol=1e-12)
    inter = LayerScheme("rope", inv_freq=tuple(theta), rotary_dims=8, layout="interleaved")
    rot = x.clone()
    rot[..., :8] = gptj(x[..., :8], sin[None], cos[None])
    assert torch.allclose(rotate(x, inter, cos, sin), rot, atol=1e-12)
    assert [t.tolist() for t in pair_indices(inter)] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ValueError, match="no rotary pairs"):
        pair_indices(LayerScheme("none"))

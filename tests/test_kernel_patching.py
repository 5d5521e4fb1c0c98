"""Kernel patching: the hook edits exactly the head's causal triangle, an exact RoPE head
with constant content is its kernel (patching changes the loss by < 1e-5), a random head
is not, and the two batching paths agree."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from tiny_models import tiny_loaded
from transformers import LlamaConfig, LlamaForCausalLM

import poskernel_tl as pk
from poskernel_tl.analyses import kernel_patching as kp
from poskernel_tl.analyses.base import AnalysisInputs
from poskernel_tl.analyses.kernel_patching import passes as kpp
from poskernel_tl.analyses.kernel_patching.kernels import shift_invariant_part
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
from poskernel_tl.models.registry import ModelSpec

D_HEAD = 16


def exact_rope_model(tokenizer, seed: int = 0) -> LoadedModel:
    """A tiny GQA Llama whose layer-0 head 0 has constant content: its q/k projections
    are zero and their biases fixed vectors u, v, so post-rotary q_t = R(t)u, k_s = R(s)v
    and the scores q_t·k_s = uᵀR(s − t)v are an exact function of t − s. The other
    weights are scaled up so that attention is sharp and moves the loss."""
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, attention_bias=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            a = layer.self_attn
            for proj, factor in ((a.q_proj, 8), (a.k_proj, 8), (a.v_proj, 4), (a.o_proj, 4)):
                proj.weight.mul_(factor)
            a.q_proj.bias.zero_()
            a.k_proj.bias.zero_()
        a = hf.model.layers[0].self_attn
        a.q_proj.weight[:D_HEAD] = 0
        a.k_proj.weight[:D_HEAD] = 0
        a.q_proj.bias[:D_HEAD] = 2 * torch.randn(D_HEAD)
        a.k_proj.bias[:D_HEAD] = 2 * torch.randn(D_HEAD)
        hf.model.embed_tokens.weight.mul_(10)
    hf.config.architectures = ["LlamaForCausalLM"]
    spec = describe(hf, ModelSpec("tiny-exact-rope", None, "rope", "rmsnorm", 2, 4, 2, D_HEAD,
                                  10000.0, 128))
    bridge = boot_bridge(hf, tokenizer)
    return LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf)


@pytest.fixture(scope="module")
def exact(tiny_tokenizer):
    model = exact_rope_model(tiny_tokenizer)
    ids = torch.randint(0, 300, (6, 32), generator=torch.Generator().manual_seed(0))
    result = pk.measure(model, ids, progress=False)
    return model, ids, result


def toeplitz(g: torch.Tensor, T: int) -> torch.Tensor:
    pos = torch.arange(T)
    return g[(pos[:, None] - pos[None]).abs()]


def test_shift_invariant_part_is_the_track_a_fit(rng):
    T = 12
    scores = torch.randn(3, 2, T, T, generator=rng, dtype=torch.float64)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -1e30)
    part = shift_invariant_part(scores)
    _, g = pk.shift_invariance_r2(scores)
    lags = torch.arange(1, T)
    for d in lags:
        sub = torch.diagonal(part, offset=-int(d), dim1=-2, dim2=-1)
        assert torch.allclose(sub, g[..., d - 1, None].expand_as(sub), atol=1e-12)
    diag = torch.diagonal(part, dim1=-2, dim2=-1)
    want = torch.diagonal(scores, dim1=-2, dim2=-1).mean(-1, keepdim=True)
    assert torch.allclose(diag, want.expand_as(diag), atol=1e-12)
    upper = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.equal(part[..., upper], scores[..., upper])  # mask fill kept
    kept = shift_invariant_part(scores, diagonal="keep")
    assert torch.equal(torch.diagonal(kept, dim1=-2, dim2=-1),
                       torch.diagonal(scores, dim1=-2, dim2=-1))
    exact = toeplitz(torch.randn(T, generator=rng, dtype=torch.float64), T)
    assert torch.allclose(shift_invariant_part(exact).tril(), exact.tril(), atol=1e-12)
    # keep_keys: the first key columns stay, and the fit ignores them
    sink = exact.clone()
    sink[:, 0] += 5.0
    part = shift_invariant_part(sink, keep_keys=1)
    assert torch.equal(part[:, 0], sink[:, 0])
    assert torch.allclose(part.tril(), sink.tril(), atol=1e-12)
    assert not torch.allclose(shift_invariant_part(sink).tril(), sink.tril(), atol=1e-3)


def test_patch_hook_edits_only_the_chosen_head_rows(rng):
    """Rows [clean, patched h…, ablated h…]: each row changes only its head, only on the
    causal triangle."""
    H, T, heads = 4, 6, [1, 3]
    mean = torch.randn(2, H, T, T, generator=rng)
    kernel = torch.randn(H, T, T, generator=rng)
    sink = torch.randn(H, T, T, generator=rng)
    p = kpp._Patcher(1, heads, H, "pooled", "fit", mean, [(0, kernel), (1, sink)])
    assert p.rows == 1 + 3 * len(heads)
    x = torch.randn(2 * p.rows, H, T, T, generator=rng)
    x = x.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), torch.finfo(x.dtype).min)
    out = p.scores(x.clone(), None).view(2, p.rows, H, T, T)
    xv = x.view(2, p.rows, H, T, T)
    lower = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(out[:, 0], xv[:, 0])
    hc = len(heads)
    for j, h in enumerate(heads):
        sink_row = xv[:, 1 + hc + j, h]
        sink_want = torch.where(torch.arange(T) >= 1, sink[h], sink_row)  # key 0 kept
        for row, want in ((1 + j, kernel[h]), (1 + hc + j, sink_want),
                          (1 + 2 * hc + j, mean[1, h])):
            others = [o for o in range(H) if o != h]
            assert torch.equal(out[:, row, others], xv[:, row, others])
            assert torch.equal(out[:, row, h][:, lower], want.expand(2, -1, -1)[:, lower])
            assert torch.equal(out[:, row, h][:, ~lower], xv[:, row, h][:, ~lower])


@pytest.mark.parametrize("mode", ["pooled", "per_seq"])
def test_exact_rope_head_is_its_kernel(exact, mode):
    model, ids, result = exact
    assert result.r2_pooled[0, 0] > 1 - 1e-9
    res = kpp.run_kernel_patching(model, ids, g_pooled=result.g_pooled, mode=mode,
                                  progress=False)
    dp = np.abs(res.dloss_patched)  # [seq, layer, head]
    assert dp[:, 0, 0].max() < 1e-5, dp[:, 0, 0]
    assert np.abs(res.dloss("patched_sink")[:, 0, 0]).max() < 1e-5
    others = dp.mean(0).ravel()[1:]  # every other head of the model
    assert others.max() > 1e-4, others
    assert others.max() > 100 * dp[:, 0, 0].mean()
    assert np.allclose(res.loss_clean_row, res.loss_clean[:, None], atol=1e-5)


def test_expand_and_repeat_paths_agree(tiny_tokenizer):
    model = tiny_loaded("gpt2", tiny_tokenizer, compatibility_mode=False)
    ids = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    runs = [kpp.run_kernel_patching(model, ids, mode="per_seq", layers=[1], head_chunk=3,
                                    batch_size=2, expand=e, progress=False)
            for e in (True, False)]
    assert runs[0].expanded and not runs[1].expanded
    assert np.isnan(runs[0].loss_patched[:, 0]).all()  # layer 0 not patched
    assert np.allclose(runs[0].loss_patched[:, 1], runs[1].loss_patched[:, 1], atol=1e-6)
    for v in ("patched", "patched_sink", "ablated"):
        assert np.allclose(runs[0].losses[v][:, 1], runs[1].losses[v][:, 1], atol=1e-6)


def test_table_figure_and_cli_contract(exact):
    model, ids, result = exact
    assert kp.SPEC.name == "kernel-patching" and kp.SPEC.needs_result
    table = kp.SPEC.run(AnalysisInputs(model, result, ids, progress=False),
                        kp.KernelPatchingOptions(max_seqs=16))
    assert len(table) == 2 * 4
    for col in ("layer", "head", "dloss_patched", "dloss_ablated", "dloss_ratio",
                "dloss_patched_sink", "dloss_ratio_sink", "dloss_ratio_sink_lo",
                "dloss_patched_lo", "dloss_patched_hi", "dloss_ratio_lo", "R2_pooled"):
        assert col in table
    row = table[(table["layer"] == 1) & (table["head"] == 0)].iloc[0]
    assert row.dloss_patched_lo <= row.dloss_patched <= row.dloss_patched_hi
    again = kp.kernel_patching(model, ids, result, progress=False)
    assert np.array_equal(table["dloss_ratio_lo"].to_numpy(),
                          again["dloss_ratio_lo"].to_numpy(), equal_nan=True)  # seeded
    assert isinstance(kp.plot_kernel_patching(table), Figure)
    # without a result the pooled kernel is fitted to the same sequences' mean scores
    alone = kp.kernel_patching(model, ids, None, mode="pooled", progress=False)
    assert np.allclose(alone["dloss_patched"], table["dloss_patched"], atol=1e-6)
    assert (alone["kernel_from"] != table["kernel_from"]).all()

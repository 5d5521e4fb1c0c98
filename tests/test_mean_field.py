"""Mean-field kernel: the three parts sum to the raw Gram exactly (checked against q·kᵀ
formed directly from the captured queries and keys), shares sum to 1, planted means."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl.analyses import mean_field as mf
from poskernel_tl.analyses.base import AnalysisInputs
from poskernel_tl.hooks import capture_qk
from poskernel_tl.reducers import LayerBatch


@pytest.fixture(scope="module")
def condition(tiny_tokenizer):
    model = tiny_loaded("llama", tiny_tokenizer, compatibility_mode=False)
    gen = torch.Generator().manual_seed(3)
    ev = torch.randint(0, 300, (6, 20), generator=gen)
    cen = torch.randint(0, 300, (6, 20), generator=gen)
    result = pk.measure(model, ev, cen, progress=False, keep_gram=True)
    return model, ev, cen, result


def captured_qk(model, ids):
    """Post-rotary q [n, layer, pos, head, d] and k [n, layer, pos, kv_head, d], float64."""
    qs, ks = {}, {}

    def on_layer(c):
        qs[c.layer], ks[c.layer] = c.q.double(), c.k.double()

    with torch.no_grad(), capture_qk(model.bridge, on_layer) as cap:
        cap.forward(ids)
    L = len(qs)
    return torch.stack([qs[i] for i in range(L)], 1), torch.stack([ks[i] for i in range(L)], 1)


def test_parts_sum_to_the_raw_gram_exactly(condition):
    model, ev, _, result = condition
    res = mf.compute_mean_field(result, model, ev, source="pass", progress=False,
                                keep_matrices=True)
    q, k = captured_qk(model, ev)
    group = model.spec.n_heads // model.spec.n_kv_heads
    k = k.repeat_interleave(group, dim=3)
    s = model.logit_scale
    mq = torch.from_numpy(result.mean_q).double().permute(0, 2, 1, 3)  # [layer, pos, head, d]
    mk = torch.from_numpy(result.mean_k).double().permute(0, 2, 1, 3)
    mk = mk.repeat_interleave(group, dim=2)
    raw = torch.einsum("nlthd,nlshd->lhts", q, k) * s / len(ev)
    cen = torch.einsum("nlthd,nlshd->lhts", q - mq, k - mk) * s / len(ev)
    meanfield = torch.einsum("lthd,lshd->lhts", mq, mk) * s
    for layer, parts in enumerate(res.parts):
        total = parts["meanfield"] + parts["cross"] + parts["centered"]
        scale = np.abs(raw[layer].numpy()).max()
        assert np.abs(total - raw[layer].numpy()).max() < 1e-12 * scale
        assert np.abs(parts["centered"] - cen[layer].numpy()).max() < 1e-12 * scale
        assert np.abs(parts["meanfield"] - meanfield[layer].numpy()).max() < 1e-12 * scale
        # the saved float32 raw Gram of Track B agrees to float32 rounding
        assert np.abs(result.gram_raw[layer] - raw[layer].numpy()).max() < 1e-5 * scale
    total = sum(res.share[p] for p in mf.PARTS)
    assert np.abs(total - 1).max() < 1e-12
    assert np.abs(sum(res.share_ss[p] for p in mf.PARTS) - 1).max() < 1e-12
    assert np.allclose(res.r2["raw"], result.r2_gram_raw, atol=1e-5)
    assert np.allclose(res.r2["centered"], result.r2_gram, atol=1e-5)
    # the float32 route from the saved Gram matrices gives the same table
    saved = mf.compute_mean_field(result, source="result")
    for p in mf.PARTS:
        assert np.allclose(saved.share[p], res.share[p], atol=1e-4)
    assert np.allclose(saved.r2["meanfield"], res.r2["meanfield"], atol=1e-9)


def planted(means_q, means_k, noise: float, n: int, scale: float = 0.25, seed: int = 0,
            centering=None):
    """Feed q, k = per-position means + noise to the reducer (one layer)."""
    gen = torch.Generator().manual_seed(seed)
    cq, ck = centering if centering is not None else (means_q, means_k)
    red = mf.MeanFieldReducer(cq[None], ck[None], scale)
    H, T, d = means_q.shape
    for start in range(0, n, 4):
        b = min(4, n - start)
        q = means_q.transpose(0, 1)[None] + noise * torch.randn(b, T, H, d, generator=gen,
                                                                 dtype=torch.float64)
        k = means_k.transpose(0, 1)[None] + noise * torch.randn(b, T, means_k.shape[0], d,
                                                                 generator=gen,
                                                                 dtype=torch.float64)
        red.update(LayerBatch(0, q, k, torch.arange(start, start + b), scale))
    return mf.summarise(red.result(), "pass")


def rope_means(H: int, T: int, d: int, gen) -> torch.Tensor:
    """Constant content rotated by RoPE: u·R(t), whose Gram is exactly Toeplitz."""
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta  # [T, d/2]
    u = 3 * torch.randn(H, 1, d, generator=gen, dtype=torch.float64)
    x, y = u[..., ::2], u[..., 1::2]
    out = torch.empty(H, T, d, dtype=torch.float64)
    out[..., ::2] = x * ang.cos() - y * ang.sin()
    out[..., 1::2] = x * ang.sin() + y * ang.cos()
    return out


def test_planted_means_dominate_or_vanish():
    gen = torch.Generator().manual_seed(0)
    H, Hkv, T, d = 4, 2, 16, 8
    mq, mk = rope_means(H, T, d, gen), rope_means(Hkv, T, d, gen)
    strong = planted(mq, mk, noise=0.05, n=16)
    assert (strong.share["meanfield"] > 0.99).all(), strong.share["meanfield"]
    assert (strong.r2["meanfield"] > 1 - 1e-9).all()  # a RoPE mean field is Toeplitz
    assert np.allclose(strong.share["cross"], 0, atol=0.02)
    zero_q, zero_k = torch.zeros_like(mq), torch.zeros_like(mk)
    none = planted(zero_q, zero_k, noise=1.0, n=16)
    assert np.abs(none.share["meanfield"]).max() == 0  # M = 0 exactly
    assert np.allclose(none.share["centered"], 1, atol=1e-12)
    # means estimated from other noise: the mean field is small, not zero
    gen = torch.Generator().manual_seed(5)
    est = (0.25 * torch.randn(H, T, d, generator=gen, dtype=torch.float64),
           0.25 * torch.randn(Hkv, T, d, generator=gen, dtype=torch.float64))
    small = planted(zero_q, zero_k, noise=1.0, n=64, centering=est)
    assert np.abs(small.share["meanfield"]).max() < 0.2
    assert np.isnan(small.peak_freq).sum() == 0


def test_gqa_mapping_matches_a_loop():
    gen = torch.Generator().manual_seed(1)
    H, Hkv, T, d = 6, 2, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    mq, mk, eq, ek, c = r(H, T, d), r(Hkv, T, d), r(H, T, d), r(Hkv, T, d), r(H, T, T)
    parts = mf.decompose(mq, mk, eq, ek, c, 0.5)
    for h in range(H):
        kv = h // (H // Hkv)
        m = mq[h] @ mk[kv].T * 0.5
        x = (mq[h] @ (ek[kv] - mk[kv]).T + (eq[h] - mq[h]) @ mk[kv].T) * 0.5
        assert torch.allclose(parts["meanfield"][h], m)
        assert torch.allclose(parts["cross"][h], x)
    amp, freqs = mf.spectrum(np.cos(0.5 * np.arange(1, 64))[None])
    assert abs(freqs[amp[0, 1:].argmax() + 1] - 0.5) < 2 * np.pi / 256


def test_table_figure_contract_and_uncentered(condition):
    model, ev, cen, result = condition
    assert mf.SPEC.name == "mean-field" and mf.SPEC.needs_result
    table = mf.SPEC.run(AnalysisInputs(model, result, ev, cen, progress=False))
    assert len(table) == result.n_layers * result.n_heads
    for col in ("layer", "head", "R2_meanfield", "share_meanfield", "share_cross",
                "share_centered"):
        assert col in table and table[col].notna().all()
    assert isinstance(mf.plot_mean_field(table), Figure)
    random = pk.measure(model, ev, progress=False)  # no centering means
    nan = mf.mean_field(random, model, ev, progress=False)
    assert nan["share_meanfield"].isna().all() and nan["R2_meanfield"].isna().all()
    assert "no centering means" in nan["note"].iloc[0]
    assert isinstance(mf.plot_mean_field(nan), Figure)

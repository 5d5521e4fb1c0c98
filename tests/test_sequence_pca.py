"""Sequence-dimension PCA, positional probes and the compression experiment (seed 002)."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from tiny_models import tiny_loaded

from poskernel_tl.analyses import compression as SC
from poskernel_tl.analyses import sequence_pca as S
from poskernel_tl.analyses.base import AnalysisInputs
from poskernel_tl.analyses.sequence_pca import stats as SS
from poskernel_tl.reducers import LayerBatch

THETAS = (0.9, 0.45, 0.2)  # rad/token, planted
AMPLITUDES = (3.0, 2.0, 1.0)


@pytest.fixture(scope="module")
def llama(tiny_tokenizer):
    return tiny_loaded("llama", tiny_tokenizer)


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(3, 300, (12, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("length", [64, 100])
def test_rope_head_components_are_planted_sinusoids(length):
    q = SS.synthetic_rope_queries(64, length, THETAS, AMPLITUDES, noise=0.1, seed=1)
    pca = SS.sequence_pca(q.reshape(64, length, -1), 2 * len(THETAS))
    freqs = pca.dominant_frequencies()  # cycles/token, rfft bins of width 1/T
    for i, theta in enumerate(THETAS):  # each θ gives a cos/sin pair, largest first
        for c in (2 * i, 2 * i + 1):
            assert abs(freqs[c] * length - theta * length / (2 * np.pi)) <= 1.0, (c, freqs)
    ev = pca.explained_variance_ratio.numpy()
    assert ev[1] > ev[2] and ev[3] > ev[4]
    assert ev[: 2 * len(THETAS)].sum() > 0.95


def test_pca_matches_svd_and_transform_inverts():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 12, 7, generator=g, dtype=torch.float64)
    x = x + torch.linspace(0, 3, 12, dtype=torch.float64)[:, None]
    pca = SS.sequence_pca(x)
    samples = x.permute(0, 2, 1).reshape(-1, 12)  # (sequence, channel) × position
    centered = samples - samples.mean(0)
    _, sv, vt = torch.linalg.svd(centered, full_matrices=False)
    np.testing.assert_allclose(pca.explained_variance.numpy(), (sv ** 2 / len(samples)).numpy(),
                               rtol=1e-9, atol=1e-12)
    overlap = (pca.components[:6] @ vt[:6].T).abs().diagonal()
    np.testing.assert_allclose(overlap.numpy(), 1.0, atol=1e-8)
    z = pca.transform(x)  # all components: exact inverse
    back = torch.einsum("kt,bkc->btc", pca.components, z) + pca.mean[:, None]
    np.testing.assert_allclose(back.numpy(), x.numpy(), atol=1e-10)
    np.testing.assert_allclose(pca.explained_variance_ratio.sum().item(), 1.0, atol=1e-12)


def test_streaming_reducer_equals_one_shot():
    q = SS.synthetic_rope_queries(6, 20, THETAS, AMPLITUDES, noise=0.3)
    red = SS.SequenceCovReducer(1, 20, "cpu", "q")
    for start in (0, 4):
        chunk = q[start:start + 4]
        red.update(LayerBatch(0, chunk, chunk[:, :, :1], torch.arange(len(chunk)), 0.25))
    streamed = red.result(4)[0]
    direct = SS.sequence_pca(q.reshape(6, 20, -1), 4)
    np.testing.assert_allclose(streamed.components.numpy(), direct.components.numpy(),
                               atol=1e-6)
    np.testing.assert_allclose(streamed.explained_variance.numpy(),
                               direct.explained_variance.numpy(), rtol=1e-9)


def test_probes_recover_a_planted_position_code():
    """Features that encode t linearly (plus noise) and through sinusoids: both probes
    decode the position far better than chance."""
    T, n, d = 48, 8, 16
    g = torch.Generator().manual_seed(0)
    t = torch.arange(T, dtype=torch.float32)
    code = torch.stack([t / T] + [f(t * w) for w in (0.05, 0.13, 0.3) for f in
                                  (torch.sin, torch.cos)], -1)  # [T, 7]
    mix = torch.randn(code.shape[1], d, generator=g)
    feats = lambda m: code @ mix + 0.01 * torch.randn(m, T, d, generator=g)
    mom = SS.ProbeMomentsReducer(1, n, T, d, "cpu", per_seq=T)
    mom.update(SS.StreamBatch(0, "resid", feats(n), torch.arange(n)))
    linear = SS.fit_linear_probes(mom, ridge=1e-4)
    mlp = SS.train_mlp_probe(mom.sample[0].reshape(-1, d), mom.pick.reshape(-1), T,
                            steps=300, seed=0)
    err = SS.ProbeErrorReducer(linear, [mlp], T, "cpu")
    err.update(SS.StreamBatch(0, "resid", feats(4), torch.arange(4)))
    mae = (err.err / err.count[None, :, None]).mean(-1)[:, 0]
    chance = np.abs(np.arange(T) - (T - 1) / 2).mean()
    assert mae[0] < 1.0, mae  # linear: the code holds t/T exactly
    assert mae[1] < chance / 4, mae


def test_mlp_probe_is_seeded():
    x, y = torch.randn(64, 8), torch.randint(0, 10, (64,))
    a = SS.train_mlp_probe(x, y, 10, steps=20, seed=3)
    b = SS.train_mlp_probe(x, y, 10, steps=20, seed=3)
    assert torch.equal(a(x), b(x))


def test_analyze_on_a_tiny_rotary_model(llama, tokens):
    table = S.SPEC.run(AnalysisInputs(llama, None, tokens[6:], tokens[:6], progress=False))
    assert len(table) == (2 + 1) * 2  # residual layers 0..n_layers, two probes
    assert set(table.probe) == set(SS.PROBES)
    assert {"layer", "probe", "mae_tokens", "mae_chance", "resid_ev_1", "q_freq_1"} \
        <= set(table.columns)
    assert table.mae_tokens.between(0, 31).all()
    assert table.loc[table.layer == 2, "q_ev_1"].isna().all()
    assert table.loc[table.layer < 2, "q_ev_1"].between(0, 1).all()
    fig = S.plot_probe_mae(table)
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 3
    # no centering sequences: the first half of the evaluation sequences trains
    assert len(S.SPEC.run(AnalysisInputs(llama, None, tokens[:4], progress=False))) == 6


def test_qk_sequence_pca_and_figure(llama, tokens):
    pcas = S.qk_sequence_pca(llama, tokens, "k", n_components=5, progress=False)
    assert len(pcas) == 2
    assert pcas[0].components.shape == (5, 32) and pcas[0].n_samples == 12 * 2 * 16
    fig = S.plot_temporal_components(pcas[1], k=3)
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 3


def test_positional_decoder_starts_from_components_plus_positions():
    torch.manual_seed(0)
    dec = SC.PositionalDecoder(16, 10)
    z = torch.randn(2, 4, 16)
    out, scores = dec(z)
    assert out.shape == z.shape and scores.shape == (2, 4, 10)
    torch.testing.assert_close(scores.sum(-1), torch.ones(2, 4))
    pos = (scores * torch.arange(10.0)).sum(-1)
    lo = pos.floor().long()
    frac = (pos - lo)[..., None]
    emb = dec.position_embeddings
    expect = z + emb(lo) * (1 - frac) + emb((lo + 1).clamp(max=9)) * frac
    torch.testing.assert_close(out, expect)  # the refiner's last layer starts at zero


def test_compression_experiment_small(llama):
    g = torch.Generator().manual_seed(0)
    train, held = torch.randint(3, 300, (6, 40), generator=g), torch.randint(3, 300, (4, 40),
                                                                              generator=g)
    flags = [p.requires_grad for p in llama.hf_model.parameters()]
    res = SC.compression_experiment(llama, train, held, context=24, n_components=8, steps=15,
                                    batch_size=2, threads=1, progress=False)
    assert res.steps_done == 15 and len(res.train_loss) == 15
    assert list(res.table.condition) == ["full", "pca_decoder", "pca_raw", "pool", "none"]
    assert list(res.table.prefix_tokens) == [24, 8, 8, 8, 0]
    assert np.isfinite(res.table.heldout_loss).all()
    assert res.pca.components.shape == (8, 24)
    assert [p.requires_grad for p in llama.hf_model.parameters()] == flags
    with pytest.raises(ValueError, match="no continuation"):
        SC.compression_experiment(llama, train[:, :25], held[:, :25], context=24,
                                  progress=False)


def test_seq_compression_command(llama):
    """``poskernel analyze seq-compression`` on a condition's sequences: the decoder
    trains on the first half of the evaluation windows (no centering set) and is scored
    on the rest, the context being the window less ``--continuation``."""
    ids = torch.randint(3, 300, (8, 40), generator=torch.Generator().manual_seed(1))
    options = SC.CompressionOptions(continuation=16, n_components=8, steps=4, threads=1)
    table = SC.SPEC.run(AnalysisInputs(llama, None, ids, progress=False), options)
    assert list(table.condition) == ["full", "pca_decoder", "pca_raw", "pool", "none"]
    assert list(table.prefix_tokens) == [24, 8, 8, 8, 0] and (table.steps_done == 4).all()
    assert np.isfinite(table.heldout_loss).all()

"""Each layer's mask, read by the analyses: the entries a layer keeps
(:class:`poskernel_tl.mask.Mask`) are those Hugging Face's own eager softmax keeps,
and the separable baseline and the mean-field kernel fit only them — on a sliding window
that binds (Mistral, Gemma 3's local layers) and a chunked mask that binds (Llama 4) —
against dense least squares over the entries the model's softmax keeps."""

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, softmax_inputs
from test_separable import dense_r2, design
from tiny_models import arch_hf_model, arch_loaded

import poskernel_tl as pk
from poskernel_tl.analyses import mean_field as mf
from poskernel_tl.analyses import separable as sep
from poskernel_tl.analyses.base import AnalysisInputs, NoOptions
from poskernel_tl.errors import UserError
from poskernel_tl.mask import Mask
from poskernel_tl.models.geometry import Geometry

T = 40
MODELS = {"mistral": {}, "gemma3": {}, "llama4": {"attention_chunk_size": 16}}


@pytest.fixture(scope="module")
def spied(tiny_tokenizer):
    """Per architecture: the booted model, tokens, and HF's eager softmax inputs."""
    ids = torch.randint(3, 290, (6, T), generator=torch.Generator().manual_seed(3))
    return {arch: (arch_loaded(arch, tiny_tokenizer, **kw), ids,
                   softmax_inputs(arch_hf_model(arch, **kw), ids))
            for arch, kw in MODELS.items()}


@pytest.mark.parametrize("arch", list(MODELS))
def test_each_layers_mask_is_the_one_hf_keeps(arch, spied):
    model, ids, ref = spied[arch]
    geometry = Geometry.checked(model.spec, T)
    assert not all(geometry.mask(L).whole for L in range(geometry.n_layers))  # one binds
    for L, (_, keep, _) in enumerate(ref):
        assert torch.equal(geometry.mask(L).lower(), keep[0, 0].tril(-1)), L
        rows, keys = torch.arange(5, 30), torch.arange(0, 40, 3)
        assert torch.equal(geometry.mask(L).kept(rows, keys),
                           geometry.mask(L).kept()[rows][:, keys])


@pytest.mark.parametrize("arch", list(MODELS))
def test_separable_fits_the_kept_entries_only(arch, spied):
    """Pooled R² of the three fits against dense least squares over the entries HF's
    softmax keeps (its own mask), every layer and head."""
    model, ids, ref = spied[arch]
    table = sep.analyze(AnalysisInputs(model, None, ids, batch_size=3, progress=False),
                        NoOptions())
    for L, (A, keep, _) in enumerate(ref):
        X, blocks, t, s = design(T, keep[0, 0].numpy())
        for h in range(A.shape[1]):
            y = np.concatenate([A[i, h].numpy()[t, s] for i in range(len(A))])
            row = table[(table["layer"] == L) & (table["head"] == h)].iloc[0]
            for name, cols in blocks.items():
                want = dense_r2(np.vstack([X[:, cols]] * len(A)), y)
                assert abs(row[name] - want) < 1e-6, (L, h, name, row[name], want)


def test_separable_on_a_window_and_chunks_of_planted_matrices():
    """On random matrices (float64), per matrix, a window (last offset 4) and chunks of 5
    with it: the sufficient statistics' R² equal dense least squares over the kept
    entries, and a Toeplitz matrix inside a window has R²(Toeplitz) = 1."""
    n, rng = 12, torch.Generator().manual_seed(0)
    scores = torch.randn(2, n, n, generator=rng, dtype=torch.float64) + \
        torch.arange(n, dtype=torch.float64)[:, None] * 0.2
    for mask in (Mask(n, last=4), Mask(n, chunk=5), Mask(n, last=3, chunk=5)):
        got = sep.separable_r2(scores, mask)
        X, blocks, t, s = design(n, mask.lower().numpy())
        for i in range(2):
            for name, cols in blocks.items():
                want = dense_r2(X[:, cols], scores[i].numpy()[t, s])
                assert abs(got[name][i].item() - want) < 1e-9, (mask, name)
    g = torch.randn(n, generator=rng, dtype=torch.float64)
    toeplitz = g[(torch.arange(n)[:, None] - torch.arange(n)[None]).abs()]
    assert abs(sep.separable_r2(toeplitz, Mask(n, last=4))["R2_toeplitz"].item() - 1) < 1e-12


@pytest.mark.parametrize("arch", ["mistral", "llama4"])
def test_mean_field_fits_the_kept_entries_only(arch, spied):
    """The raw Gram's Toeplitz R² equals the naive fit over HF's kept entries of the mean
    softmax input (where the softmax reads scale·q·k alone: not Llama 4's global NoPE layer,
    whose queries a temperature scales by position), the three shares, taken over those
    entries, sum to 1, and the centered part's R² is Track B's."""
    model, ids, ref = spied[arch]
    result = pk.measure(model, ids[2:], ids[:2], progress=False, batch_size=2)
    res = mf.compute_mean_field(result, model, ids[2:], source="pass", progress=False)
    for L, (A, keep, _) in enumerate(ref):
        if model.spec.layer_terms(L).temperature is not None:
            continue
        want = naive_r2(A[2:].mean(0, keepdim=True), keep[:1])
        assert np.abs(res.r2["raw"][L] - want).max() < 1e-6, (L, res.r2["raw"][L], want)
        total = sum(res.share[p][L] for p in mf.PARTS)
        assert np.abs(total - 1).max() < 1e-9
    assert np.isfinite(res.spectrum).all()
    # the centered part is Track B's Gram: the same R² as the measurement's, band and all
    assert np.abs(res.r2["centered"] - result.r2_gram).max() < 1e-6


def test_a_method_on_whole_triangles_refuses_a_binding_mask_in_one_line(spied):
    model = spied["mistral"][0]
    Geometry.of(model.spec, 16).require_whole("gk-baseline")  # the window keeps all: fine
    with pytest.raises(UserError, match=r"gk-baseline .* layer 0 keeps offsets ≤ 15 \(a "
                       r"sliding window\) at T = 40: not measured; choose a length ≤ 16"):
        Geometry.of(model.spec, T).require_whole("gk-baseline")

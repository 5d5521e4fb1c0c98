"""Every layer's own positional scheme: read from tiny random Hugging Face models of ten
architectures, and the fits on exactly the entries each layer's mask keeps, against a naive
float64 fit on Hugging Face's own eager attention (its q, k, scaling and additive mask)."""

import importlib
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from masks import masks
from tiny_models import ARCHITECTURES, arch_hf_model, arch_loaded
from transformer_lens.head_detector import (
    compute_head_attention_similarity_score,
    get_previous_token_head_detection_pattern,
)

import poskernel_tl as pk
from poskernel_tl import constants as C
from poskernel_tl.fit.kernel_class import CLASSES
from poskernel_tl.fit.toeplitz import lower_lag_stats, lower_mean_from_qk, shift_invariance_r2
from poskernel_tl.fit.variants import region_sums
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.scheme import summary
from poskernel_tl.models.scheme_reader import attention_modules, read_layers
from poskernel_tl.reducers import GramReducer, LayerBatch
from poskernel_tl.reducers.gram_fit import lower_apply
from poskernel_tl.reducers.lag_sums import lower_sum_squares, track_a_stats, windowed
from poskernel_tl.reducers.track_a_result import SINK_COLUMN
from poskernel_tl.statistics import PermNullReducer

T = 40

EXPECTED = {  # summary(spec.layers): each layer kind and where it sits
    "llama": "rope 1e+04: layers 0-3",
    "qwen3": "rope 1e+04: layers 0-3",
    "olmo2": "rope 1e+04: layers 0-3",
    "gpt2": "learned: layers 0-3",
    "smollm3": "rope 2e+06: layers 0, 2; nope: layers 1, 3",
    "mistral": "rope 1e+04, window 16: layers 0-3",
    "gemma3": "rope 1e+04, window 16: layers 0-1, 3; rope 1e+06: layers 2",
    "gpt_neox": "rope 1e+04: layers 0-3",
    "gptj": "rope 1e+04: layers 0-3",
    "phi3": "rope 1e+04: layers 0-3",
}
ROTATED = {"gpt_neox": (4, "rotate_half"), "gptj": (8, "interleaved"),
           "phi3": (16, "rotate_half"), "gemma3": (16, "rotate_half")}
QK_NORM = {"qwen3", "olmo2", "gemma3"}


def hf_eager_logits(hf_model, ids) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: scaling·q·kᵀ in float64 [batch, head, T, T] (GQA keys expanded) from the
    q/k that Hugging Face's ``eager_attention_forward`` receives, and the bool mask of the
    entries its additive mask keeps (0 kept, −inf removed)."""
    got = []
    saved = {}
    for name in {type(a).__module__ for a in attention_modules(hf_model)}:
        code = importlib.import_module(name)
        original = code.eager_attention_forward
        saved[name] = original

        def spy(module, query, key, value, attention_mask, *args, original=original, **kw):
            scaling = kw.get("scaling", args[0] if args else None)
            scaling = module.scaling if scaling is None else scaling
            key_x = key.repeat_interleave(query.shape[1] // key.shape[1], 1)
            A = query.double() @ key_x.double().transpose(-1, -2) * scaling
            got.append((A, attention_mask[0, 0] == 0))
            return original(module, query, key, value, attention_mask, *args, **kw)

        code.eager_attention_forward = spy
    try:
        with torch.no_grad():
            hf_model(ids)
    finally:
        for name, original in saved.items():
            importlib.import_module(name).eager_attention_forward = original
    return got


def naive_r2(A: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Pooled R² per head over the strictly lower entries ``keep`` holds, from the entries
    themselves: g(Δ) the mean of each offset's entries over all sequences (a bincount by
    offset), residuals and total variance summed entry by entry, in float64."""
    n, H, T_, _ = A.shape
    lag = torch.arange(T_)[:, None] - torch.arange(T_)[None]
    kept = keep & (lag > 0)
    lags = lag[kept].repeat(n)
    out = np.empty(H)
    for h in range(H):
        vals = A[:, h][:, kept].reshape(-1).double()
        g = torch.bincount(lags, vals) / torch.bincount(lags).clamp(min=1)
        out[h] = 1 - float(((vals - g[lags]) ** 2).sum() / ((vals - vals.mean()) ** 2).sum())
    return out


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_layer_scheme_is_read_from_the_model(arch, tiny_tokenizer):
    spec = arch_loaded(arch, tiny_tokenizer).spec
    assert summary(spec.layers) == EXPECTED[arch]
    rope = [s for s in spec.layers if s.pe == "rope"]
    dims, layout = ROTATED.get(arch, (16, "rotate_half"))
    assert all((s.rotary_dims, s.layout) == (dims, layout) for s in rope)
    assert all(s.qk_norm == (arch in QK_NORM) for s in spec.layers)
    if arch == "gemma3":  # each layer type its own base, from its own buffer
        assert spec.layers[2].base == pytest.approx(1e6, rel=1e-4)
        assert spec.layers[0].base == pytest.approx(1e4, rel=1e-4)
        assert [m.window_last for m in Geometry.of(spec, T).masks] == [15, 15, None, 15]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_track_a_equals_a_naive_fit_on_hf_eager_attention(arch, tiny_tokenizer):
    """What the model's mask keeps is read from the mask HF's eager attention receives:
    Track A (the lag sums of the captured, rotated where needed, q and k) equals the naive
    fit on those entries of HF's own logits, layer by layer."""
    model = arch_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False)
    ref = hf_eager_logits(arch_hf_model(arch), ids)
    assert len(ref) == model.spec.n_layers
    for layer, (A, keep) in enumerate(ref):
        window = model.spec.layers[layer].window
        lag = torch.arange(T)[:, None] - torch.arange(T)[None]
        assert torch.equal(keep, (lag >= 0) & (lag < (window or T + 1)))  # the scheme's mask
        got = res.r2_pooled[layer]
        want = naive_r2(A, keep)
        assert np.abs(got - want).max() <= 1e-6, (arch, layer, np.abs(got - want).max())
        # TransformerLens's previous-token score on HF's own attention pattern
        pattern = A.masked_fill(~keep, float("-inf")).softmax(-1).float()
        detect = get_previous_token_head_detection_pattern(ids[:1])
        tl = [[compute_head_attention_similarity_score(
            pattern[x, h], detect, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(A.shape[1])] for x in range(len(ids))]
        assert np.abs(res.tl_prev_token[layer] - np.mean(tl, 0)).max() <= 1e-5
    if arch == "mistral":  # the whole triangle would give other numbers
        whole = naive_r2(ref[0][0], torch.ones(T, T, dtype=torch.bool))
        assert np.abs(res.r2_pooled[0] - whole).max() > 1e-3


@pytest.mark.parametrize("rows", [256, 5])
@pytest.mark.parametrize("causal, window", [(True, None), (True, 5), (False, None)])
def test_prev_token_score_is_transformer_lens_own(monkeypatch, causal, window, rows):
    """The reducer's score against TransformerLens's similarity on the softmax pattern
    (GQA, a window, two-sided; the logits formed whole or ``rows`` query rows at a time);
    a causal model's score past ``max_pos`` positions is TransformerLens's score of the
    sequences cut to ``max_pos`` tokens."""
    from poskernel_tl.reducers import pattern
    from poskernel_tl.statistics.prev_token import PrevTokenReducer

    monkeypatch.setattr(pattern, "ROWS", rows)

    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(3, T, 4, 8, generator=g) * 2, torch.randn(3, T, 2, 8, generator=g) * 2
    k = k if causal else k.repeat_interleave(2, 2)
    lag = torch.arange(T)[:, None] - torch.arange(T)[None]
    for max_pos in (T, 16):
        red = PrevTokenReducer(masks(T, causal=causal, lasts=None if window is None
                               else [window]), 4, max_pos=max_pos)
        red.update(LayerBatch(0, q, k, torch.arange(3), 0.3, rows=(0, 1, 2)))
        n = max_pos if causal else T
        keep = torch.ones(n, n, dtype=torch.bool) if not causal else lag[:n, :n] >= 0
        if window is not None:
            keep &= lag[:n, :n] <= window
        kx = k.repeat_interleave(4 // k.shape[2], 2)
        A = torch.einsum("xthd,xshd->xhts", q[:, :n], kx[:, :n]) * 0.3
        pattern = A.masked_fill(~keep, float("-inf")).softmax(-1)
        detect = get_previous_token_head_detection_pattern(torch.zeros(1, n))
        want = [[compute_head_attention_similarity_score(
            pattern[x, h], detect, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(4)] for x in range(3)]
        assert np.abs(red.result().tl_prev_token[0] - np.mean(want, 0)).max() <= 1e-6


def test_windowed_sums_equal_naive_loops():
    """Every windowed sum (key moments with the window's far part taken off, the strip, the
    lag sums, B_low·X) against the explicit masked matrix, at windows 1 … T − 1."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 30, 4, 8, generator=g), torch.randn(3, 30, 2, 8, generator=g)
    A = (q.double().transpose(1, 2) @ k.double().repeat_interleave(2, 2)
         .permute(0, 2, 3, 1)) * 0.5
    lag = torch.arange(30)[:, None] - torch.arange(30)[None]
    x = torch.randn(30, 2, 3, generator=g, dtype=torch.float64)
    for last in (1, 7, 28, 29):
        keep = (lag > 0) & (lag <= last)
        assert torch.allclose(lower_sum_squares(q, k, 0.5, chunk=8, last=last),
                              (A * A * keep).sum((-2, -1)), rtol=1e-10)
        st = track_a_stats(q, k, 0.5, chunk=8, last=last)
        (s1, sq), _ = lower_lag_stats(A, lower_mean_from_qk(q, k, 0.5), [], last=last)
        assert torch.allclose(windowed(st.s1, last), s1, atol=1e-9)
        assert torch.allclose(st.sq, sq, rtol=1e-10)
        sink, _ = region_sums(st.skewed, SINK_COLUMN, (st.s1, st.sq), last)
        assert torch.allclose(sink, A[:, :, 1:, 0] * keep[1:, 0], atol=1e-12)
        if last > 1:
            r2, _ = shift_invariance_r2(A, last=last)
            assert np.allclose(r2[0].numpy(), naive_r2(A[:1], keep), atol=1e-9)
        Y = lower_apply(q[0].double(), k[0].double(), x, chunk=8, last=last)
        want = torch.einsum("hts,hsw->htw", A[0] * keep / 0.5,
                            x[:, [0, 0, 1, 1]].transpose(0, 1))
        assert torch.allclose(Y, want, atol=1e-9)


@pytest.mark.parametrize("factors", [False, True])
def test_track_b_fits_the_window(factors):
    """Track B's raw Gram (mean_x scale·q·kᵀ, uncentered) fitted on the offsets a window
    keeps, by the accumulator and by the factors, equals the naive fit on the explicit
    mean."""
    g = torch.Generator().manual_seed(2)
    L, n, H, Hkv, d = 2, 6, 4, 2, 8
    q, k = torch.randn(n, L, T, H, d, generator=g), torch.randn(n, L, T, Hkv, d, generator=g)
    lasts = [9, T - 1]
    red = GramReducer(masks(T, L, lasts=lasts), H, Hkv, d, 0.25, factors=factors, full=False)
    for i in range(0, n, 3):
        for layer in range(L):
            red.update(LayerBatch(layer, q[i:i + 3, layer], k[i:i + 3, layer],
                                  torch.arange(i, i + 3), 0.25, rows=tuple(range(i, i + 3))))
    res = red.result()
    for layer in range(L):
        qd, kd = q[:, layer].double(), k[:, layer].double()
        gram = torch.einsum("nthd,nshd->hts", qd, kd.repeat_interleave(2, 2)) * 0.25 / n
        r2, _ = shift_invariance_r2(gram, last=lasts[layer])
        assert np.allclose(res.r2_gram_raw[layer], r2.numpy(), atol=1e-6)
    assert np.isnan(res.g_gram_raw[0, :, 9:]).all() and np.isfinite(res.g_gram_raw[0, :, :9]).all()


def test_permutation_null_fits_the_window_on_both_paths():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(4, T, 4, 8, generator=g), torch.randn(4, T, 2, 8, generator=g)
    out = []
    for source in ("lags", "scores"):
        red = PermNullReducer(masks(T, lasts=[11]), 4, n_perm=3, max_seqs=4, source=source)
        red.update(LayerBatch(0, q, k, torch.arange(4), 0.3, rows=(0, 1, 2, 3)))
        out.append(red.result().r2_null)
    assert np.allclose(out[0], out[1], atol=1e-9)


def test_chunked_attention_is_read_from_the_config():
    """A chunked mask keeps every causal entry up to its chunk size (read as such); past
    it the offsets up to chunk − 1, the chunk binding (``tests/test_chunked.py`` measures
    it)."""
    from poskernel_tl.models.loading import describe
    from poskernel_tl.models.registry import placeholder_spec

    hf = arch_hf_model("llama")
    hf.config.attention_chunk_size = 8
    layers = read_layers(hf, "rope", 4, 16)
    assert all(s.terms.chunk == 8 and s.mask == "causal" for s in layers)
    spec = describe(hf, placeholder_spec("tiny", None))
    assert Geometry.checked(spec, 8).lags == (7,) * 4
    assert [m.chunk for m in Geometry.checked(spec, 8).masks] == [None] * 4
    past = Geometry.checked(spec, 9)
    assert past.lags == (7,) * 4 and [m.chunk for m in past.masks] == [8] * 4


def test_an_hf_folder_runs_with_its_own_schemes(tmp_path, tiny_tokenizer):
    """A tiny Gemma 3 saved as a folder goes through the hub loader (``hf:DIR``): the
    command line prints every layer's scheme and the run records it in its provenance."""
    arch_hf_model("gemma3").save_pretrained(tmp_path / "gemma")
    tiny_tokenizer.save_pretrained(tmp_path / "gemma")
    cmd = [sys.executable, "-m", "poskernel_tl.apps.cli", "models", f"hf:{tmp_path / 'gemma'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "layer   2: rope 1e+06" in out and "window 16" in out and "QK-norm" in out
    model = pk.load_model(f"hf:{tmp_path / 'gemma'}", progress=False)
    res = pk.measure(model, torch.randint(3, 290, (3, 24)), progress=False)
    assert res.provenance["layers"] == EXPECTED["gemma3"]
    assert np.isnan(res.g_pooled[0, :, 15:]).all() and np.isfinite(res.g_pooled[2]).all()


@pytest.mark.parametrize("scores", ["auto", "qk"])
def test_the_whole_triangle_stays_a_diagnostic(scores, tiny_tokenizer):
    """A windowed layer's ``r2_pooled_whole`` is the fit over every causal entry (what a
    fit blind to the window reports); both Track A paths agree on every number."""
    model = arch_loaded("mistral", tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(5))
    res = pk.measure(model, ids, progress=False, scores=scores, null_perms=2)
    ref = hf_eager_logits(arch_hf_model("mistral"), ids)
    for layer, (A, keep) in enumerate(ref):
        whole = naive_r2(A, torch.ones(T, T, dtype=torch.bool))
        assert np.abs(res.r2_pooled_whole[layer] - whole).max() <= 1e-6
        assert np.abs(res.r2_pooled[layer] - naive_r2(A, keep)).max() <= 1e-6
    other = pk.measure(model, ids, progress=False, scores="qk" if scores == "auto" else "auto",
                       null_perms=2)
    for name in ("r2_per_seq", "r2_per_seq_nosink", "r2_pooled_nosink", "r2_pooled_early",
                 "r2_pooled_interior", "r2_pooled_interior_keys", "r2_split", "r2_gram_raw"):
        assert np.allclose(getattr(res, name), getattr(other, name), atol=1e-9, equal_nan=True)
    assert np.allclose(res.r2_perm_null, other.r2_perm_null, atol=1e-9)


def test_a_windowed_result_round_trips_and_its_spectra_use_each_layer(tmp_path, tiny_tokenizer):
    """Saved and loaded exactly (g NaN past the window is valid there, nowhere else); the
    spectral analysis reads each layer on its own θ and its kept offsets."""
    from poskernel_tl.analyses.spectral import run_spectral
    from poskernel_tl.analyses.spectral.table import layer_groups
    from poskernel_tl.errors import ResultFileError
    from poskernel_tl.measurement.result import ConditionResult

    model = arch_loaded("gemma3", tiny_tokenizer)
    ids = torch.randint(3, 290, (8, T), generator=torch.Generator().manual_seed(6))
    res = pk.measure(model, ids[4:], ids[:4], progress=False, dataset="random")
    res.save(tmp_path)
    back = ConditionResult.load(tmp_path)
    for name in ("r2_pooled", "r2_pooled_whole", "g_pooled", "r2_gram", "g_gram"):
        assert np.array_equal(getattr(back, name), getattr(res, name), equal_nan=True)
    assert back.spec.layers == model.spec.layers
    groups = layer_groups(back.spec, T)
    assert [(layers, n) for layers, _, n, _ in groups] == [([0, 1, 3], 16), ([2], T)]
    assert groups[1][1][1] == pytest.approx(1e6 ** (-1 / 8), rel=1e-5)  # θ_1 of base 1e6
    table, _, _ = run_spectral(back, tmp_path, force=True)
    assert list(table["layer"]) == [L for L in range(4) for _ in range(4)]
    assert (table.loc[table["layer"] != 2, "n_fft"] < table.loc[table["layer"] == 2, "n_fft"]
            .min()).all()  # the local layers' spectra span their 15 kept offsets
    from poskernel_tl.report.figures import fig1_heatmaps
    from poskernel_tl.report.sections import layer_kinds_html

    labels = [t.get_text() for t in fig1_heatmaps([back]).axes[0].get_yticklabels()]
    assert labels == ["2: rope 1e+06"]  # the global layer, framed among local ones
    html = layer_kinds_html([back])
    assert "rope 1e+04, window 16" in html and "rope 1e+06" in html and "exploratory" in html
    assert layer_kinds_html([pk.measure(arch_loaded("llama", tiny_tokenizer), ids[4:],
                                        progress=False)]) == ""
    from poskernel_tl.report.build import build_report

    page = build_report(tmp_path, workers=1).read_text()
    assert "Layer kinds (exploratory)" in page and '"kinds":["rope 1e+04, window 16"' in page
    assert "Figure 5" in page and (tmp_path / "report" / "atlas_classes.csv").exists()
    heads = pd.read_csv(C.result_path(tmp_path, back.model, back.dataset, T, C.HEADS_CSV))
    assert len(heads) == 16 and set(heads["kernel_class"]) <= set(CLASSES)
    data = (tmp_path / "report" / "data" / f"{back.stem()}.js").read_text(encoding="utf-8")
    pages = json.loads(data[data.index(" = {") + 3:-2])["heads"]
    for row in heads.itertuples():  # each head view's table of kernel descriptors
        kernel = pages[row.layer * 4 + row.head]["tables"][0]
        assert kernel["rows"][0][3] == f"class: {row.kernel_class}"
        shown = {r[0]: r[1] for r in kernel["rows"]}
        assert float(shown["previous-token share"]) == pytest.approx(row.prev_share, rel=1e-3)
    assert heads.loc[heads["layer"] != 2, "last_lag"].max() <= 15  # the window's offsets
    g = back.g_pooled.copy()
    g[2, 0, 3] = np.nan  # a hole inside the kept offsets is damage
    from poskernel_tl.fit.toeplitz import kept_finite
    assert kept_finite(back.g_pooled) and not kept_finite(g)
    with pytest.raises(ResultFileError):
        back.track_a.__class__.check(
            type(back.track_a)(**{**back.track_a.__dict__, "g_pooled": g}),
            {"layer": 4, "head_index": 4, "lag": T - 1, "n_seqs": 4, "split": 5})


def test_a_head_view_fits_its_layers_window(tiny_tokenizer):
    """One head of a sliding layer (T past the window): the view, its page and the
    layer's own g agree with the naive fit of HF's logits on the kept entries; the page
    shows no logit the window removes."""
    from poskernel_tl.report.viewer import head_payload

    model = arch_loaded("gemma3", tiny_tokenizer)
    ids = torch.randint(3, 290, (1, T), generator=torch.Generator().manual_seed(7))
    view = pk.inspect_head(model, ids[0], 0, 1)
    A, keep = hf_eager_logits(arch_hf_model("gemma3"), ids)[0]
    assert view.last == 15 and abs(view.r2 - naive_r2(A, keep)[1]) < 1e-6
    assert np.isnan(view.g[15:]).all() and np.isfinite(view.g[:15]).all()
    assert view.kernel["kernel_class"] in CLASSES and view.kernel["last_lag"] <= 15
    assert np.isfinite(view.kernel["null_max"])  # the null reads unmasked scores
    payload = head_payload(view.page_data())
    assert abs(payload["seq"]["r2"] - view.r2) < 1e-9
    assert abs(payload["numbers"][0][2] - view.r2) < 1e-9

"""A chunked mask past its chunk (Llama 4 at T > attention_chunk_size): query t reads the
keys s ≤ t of its own chunk, so the kept entries are no function of the offset alone.
Every count a fit reads is the mask's, the logits across chunks are never read, and every
statistic equals a naive float64 computation on what Hugging Face's eager softmax reads
(its own block-diagonal mask), at T = 2 × chunk and with a partial last chunk."""

import numpy as np
import pytest
import torch
from browser import find_chromium, load_page
from masks import masks
from softmax_spy import naive_r2, naive_within_r2, softmax_inputs
from tiny_models import arch_hf_model, arch_loaded
from transformer_lens.head_detector import (
    compute_head_attention_similarity_score,
    get_previous_token_head_detection_pattern,
)

import poskernel_tl as pk
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.fit.variants import Variant
from poskernel_tl.fit.within_row import RowLayout
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.softmax_ops import chunk_qk
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.gram import GramReducer
from poskernel_tl.reducers.gram_cost import FACTOR_RANK_MAX
from poskernel_tl.reducers.moments import MomentsReducer
from poskernel_tl.reducers.track_a_result import VARIANTS
from poskernel_tl.report.build import build_report
from poskernel_tl.report.viewer_data import head_anchor
from poskernel_tl.statistics.perm_null import PermNullReducer

CHUNK = 16


def kept(T: int, chunk: int) -> torch.Tensor:
    """The chunked causal mask's strictly lower entries, [T, T] bool."""
    t, s = torch.arange(T)[:, None], torch.arange(T)[None]
    return (t > s) & (t // chunk == s // chunk)


def by_lag(keep: torch.Tensor) -> torch.Tensor:
    T = keep.shape[-1]
    lag = torch.arange(T)[:, None] - torch.arange(T)[None]
    return torch.stack([(keep & (lag == d)).sum() for d in range(1, T)]).double()


@pytest.mark.parametrize("T", [32, 45, 7])
def test_the_counts_are_the_masks(T):
    """n(Δ) of the whole mask, of row ranges, of every Track A region and of the
    within-row layout, against the explicit mask (T = 7: the chunk does not bind)."""
    keep = kept(T, CHUNK)
    t, s = torch.arange(T)[:, None], torch.arange(T)[None]
    assert torch.equal(lag_counts(T, chunk=CHUNK, last=CHUNK - 1), by_lag(keep))
    for lo, hi in [(0, 21), (5, 40), (17, 18), (30, 60)]:
        rows = keep & (t >= lo) & (t < hi)
        assert torch.equal(lag_counts(T, lo, hi, chunk=CHUNK), by_lag(rows))
    for v in [*VARIANTS.values(), Variant(rows=(3, 9), keys=(1, 30))]:
        assert torch.equal(v.counts(T, CHUNK - 1, chunk=CHUNK), by_lag(keep & v.holds(t, s)))
    layout = RowLayout(T, min(T, CHUNK) - 1, chunk=CHUNK)
    assert torch.equal(layout.row_counts(), keep.sum(1).double())
    assert torch.equal(layout.lag_counts(), by_lag(keep))


def test_chunk_qk_is_the_product_within_chunks():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 37, 4, 8, generator=g), torch.randn(2, 37, 2, 8, generator=g)
    cq, ck = chunk_qk(q, k, 10)
    assert cq.shape == (2, 37, 4, 32) and ck.shape == (2, 37, 2, 32)
    same = (torch.arange(37)[:, None] // 10 == torch.arange(37)[None] // 10)
    want = torch.einsum("bthd,bshd->bhts", q, k.repeat_interleave(2, 2)) * same
    got = torch.einsum("bthd,bshd->bhts", cq, ck.repeat_interleave(2, 2))
    assert torch.equal(got == 0, want == 0) and torch.allclose(got, want, atol=1e-6)


def test_the_geometry_keeps_chunk_minus_one_offsets(tiny_tokenizer):
    spec = arch_loaded("llama4", tiny_tokenizer, attention_chunk_size=CHUNK).spec
    g = Geometry.checked(spec, 2 * CHUNK)
    assert g.lags == (CHUNK - 1,) * 3 + (2 * CHUNK - 1,)
    assert [m.chunk for m in g.masks] == [CHUNK] * 3 + [None] and g.chunk(3) is None
    # every causal entry kept
    assert [m.chunk for m in Geometry.checked(spec, CHUNK).masks] == [None] * 4


def _pattern(A, keep):
    return torch.where(keep | torch.eye(A.shape[-1], dtype=torch.bool), A, -np.inf).softmax(-1)


@pytest.fixture(scope="module")
def llama4(tiny_tokenizer):
    return arch_loaded("llama4", tiny_tokenizer, attention_chunk_size=CHUNK)


@pytest.mark.parametrize("T", [2 * CHUNK, 2 * CHUNK + 13])
def test_llama4_past_its_chunk_equals_the_naive_fit(llama4, T):
    """Track A (pooled, per sequence, every pooled region), the within-row fit, the
    previous-token score and the attention distance against what HF's eager softmax reads;
    the chunked layers' whole-triangle R² is NaN (never read), the global layer's is not."""
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(llama4, ids, progress=False, null_perms=2)
    ref = softmax_inputs(arch_hf_model("llama4", attention_chunk_size=CHUNK), ids)
    t, s = torch.arange(T)[:, None], torch.arange(T)[None]
    detect = get_previous_token_head_detection_pattern(ids[:1])
    assert len(ref) == 4
    for layer, (A, keep, _) in enumerate(ref):
        lower = keep & (t > s)
        if layer < 3:  # HF's own mask is the block-diagonal one
            assert torch.equal(lower[0, 0], kept(T, CHUNK))
        assert np.abs(res.r2_pooled[layer] - naive_r2(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[1, layer] - naive_r2(A[1:2], keep[1:2])).max() <= 1e-6
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
        for field, v in VARIANTS.items():
            got = getattr(res, field)
            if got.ndim == 2 and (keep & v.holds(t, s)).any():
                want = naive_r2(A, keep & v.holds(t, s))
                assert np.allclose(got[layer], want, atol=1e-6, equal_nan=True), field
        p = _pattern(A, keep).float()
        tl = [[compute_head_attention_similarity_score(
            p[x, h], detect, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(A.shape[1])] for x in range(len(ids))]
        assert np.abs(res.tl_prev_token[layer] - np.mean(tl, 0)).max() <= 1e-5
        distance = (p.double() * (t - s).abs()).sum(-1).mean(0)  # [head, pos]
        assert np.abs(res.attn_distance_rows[layer] - distance.numpy()).max() <= 1e-4
    assert np.isnan(res.r2_pooled_whole[:3]).all() and np.isfinite(res.r2_pooled_whole[3]).all()
    assert np.isnan(res.g_pooled[:3, :, CHUNK - 1:]).all()
    assert np.isfinite(res.g_pooled[:3, :, :CHUNK - 1]).all()
    assert np.isfinite(res.r2_perm_null).all()


def test_the_null_reads_the_permuted_product_within_chunks():
    """The permutation null of a chunked layer: the lags and the materialised paths agree,
    and each draw equals the naive fit of A[π][:, π] on the chunked mask."""
    T, g = 40, torch.Generator().manual_seed(3)
    q, k = torch.randn(3, T, 4, 8, generator=g), torch.randn(3, T, 2, 8, generator=g)
    terms = llama_terms()
    out = []
    for source in ("lags", "scores"):
        red = PermNullReducer(masks(T, lasts=[CHUNK - 1], chunks=[CHUNK]), 4, n_perm=3, max_seqs=3,
                              source=source)
        red.update(LayerBatch(0, q, k, torch.arange(3), 0.3, rows=(0, 1, 2), terms=terms))
        out.append(red.result())
    assert np.allclose(out[0].r2_null, out[1].r2_null, atol=1e-6)
    A = torch.einsum("bthd,bshd->bhts", q.double(), k.double().repeat_interleave(2, 2)) * 0.3
    for i, pi in enumerate(out[0].perms):
        pi = torch.as_tensor(pi)
        Ap = A[:, :, pi][:, :, :, pi]
        want = naive_r2(Ap, kept(T, CHUNK).expand(3, 4, T, T))
        assert np.abs(out[0].r2_null[i] - want).max() <= 1e-6


def llama_terms():
    from poskernel_tl.models.softmax_terms import SoftmaxTerms
    return SoftmaxTerms(chunk=CHUNK)


@pytest.mark.parametrize("path", ["accumulator", "factors", "factor_blocks"])
def test_track_b_fits_the_chunked_mask(path):
    """Track B's raw, centered and half-centered Gram of a chunked layer (and a global one
    beside it) on the accumulator, on the factors and on blocks formed from the factors,
    against the naive fit of the explicit mean Gram over the chunked mask."""
    T, n, H, kv = 45, 4, 4, 2
    d = 8 if path != "factor_blocks" else FACTOR_RANK_MAX // n + 8
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(n, 2, T, H, d, generator=g) + 0.4, torch.randn(n, 2, T, kv, d, generator=g)
    cq, ck = q[:, :, :] + torch.randn(n, 2, T, H, d, generator=g), k + 0.3
    cen = MomentsReducer(n, 2, H, kv, T, d, half_seed=5)
    for L in range(2):
        cen.update(LayerBatch(L, cq[:, L], ck[:, L], torch.arange(n), 0.3))
    means = cen.result()
    red = GramReducer(masks(T, 2, lasts=[CHUNK - 1, T - 1], chunks=[CHUNK, None]), H, kv, d, 0.3,
                      reference=means, full=False, factors=path != "accumulator")
    for L in range(2):
        red.update(LayerBatch(L, q[:, L], k[:, L], torch.arange(n), 0.3,
                              rows=tuple(range(n))))
    res = red.result(means)
    for L, chunk in enumerate([CHUNK, None]):
        qd, kd = q[:, L].double(), k[:, L].double().repeat_interleave(H // kv, 2)
        keep = kept(T, chunk or T)[None, None].expand(1, H, T, T)
        for field, (mq, mk) in {"r2_gram_raw": (0.0, 0.0),
                                "r2_gram": (means.mean_q[L].transpose(0, 1).double(),
                                            means.mean_k[L].transpose(0, 1).double())}.items():
            mk = mk if isinstance(mk, float) else mk.repeat_interleave(H // kv, 1)
            gram = torch.einsum("nthd,nshd->hts", qd - mq, kd - mk)[None] * 0.3 / n
            assert np.abs(getattr(res, field)[L] - naive_r2(gram, keep)).max() <= 1e-6, \
                (path, L, field)


def test_inspect_head_fits_the_chunked_mask(llama4):
    """A head view of a chunked layer past its chunk fits the entries of one chunk (its R²
    the naive fit's) and says so."""
    ids = torch.randint(3, 290, (40,), generator=torch.Generator().manual_seed(2))
    view = pk.inspect_head(llama4, ids, 0, 1)
    A = torch.as_tensor(view.logits, dtype=torch.float64)
    keep = kept(40, CHUNK)
    want = naive_r2(torch.where(keep, A, 0.0)[None, None], keep[None, None])[0]
    assert abs(view.r2 - want) <= 1e-6 and view.chunk == CHUNK
    assert abs(float(shift_invariance_r2(A.nan_to_num(), CHUNK - 1, CHUNK)[0]) - want) <= 1e-6
    assert any("chunks of 16" in n for n in view.page_data().notes)


def test_whitened_gram_reads_each_layers_mask():
    """``--whiten``'s Gram is fitted on each layer's own mask — a chunk, a window, the
    whole triangle — as Track B's is (it was fitted on the whole triangle, and refused for
    windowed models)."""
    from poskernel_tl.statistics.whitened_gram import WhitenedGramReducer

    T, n, H, kv, d = 40, 6, 2, 1, 4
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(n, 3, T, H, d, generator=g), torch.randn(n, 3, T, kv, d, generator=g)
    cen = MomentsReducer(n, 3, H, kv, T, d, half_seed=1, second_moments=True)
    for L in range(3):
        cen.update(LayerBatch(L, q[:, L], k[:, L], torch.arange(n), 0.5))
    means = cen.result()
    red = WhitenedGramReducer(means, 0.5, masks(T, 3, lasts=[CHUNK - 1, 9, T - 1],
                                               chunks=[CHUNK, None, None]))
    for L in range(3):
        red.update(LayerBatch(L, q[:, L], k[:, L], torch.arange(n), 0.5, rows=tuple(range(n))))
    got = red.result().r2_gram_whitened
    wq, wk = means.whitening()
    t, s = torch.arange(T)[:, None], torch.arange(T)[None]
    keeps = [kept(T, CHUNK), (t > s) & (t - s <= 9), t > s]
    for L, keep in enumerate(keeps):
        mq, mk = (m[L].transpose(0, 1).double() for m in (means.mean_q, means.mean_k))
        qw = torch.einsum("nthd,hde->nthe", q[:, L].double() - mq, wq[L].double())
        kw = torch.einsum("nthd,hde->nthe", k[:, L].double() - mk, wk[L].double())
        gram = torch.einsum("nthd,nshd->hts", qw, kw.repeat_interleave(H // kv, 2)) * 0.5 / n
        want = naive_r2(gram[None], keep[None, None].expand(1, H, T, T))
        assert np.abs(got[L] - want).max() <= 1e-5, L


def test_the_plan_counts_the_widened_q_and_k(llama4):
    """Track A's transient estimate counts q and k ⌈T / chunk⌉ times wider where a chunk
    binds, and is unchanged where none does."""
    from poskernel_tl.fit.variants import strip_bytes
    from poskernel_tl.reducers import track_a

    s = llama4.spec
    assert Geometry.of(s, CHUNK).widening == 1 and Geometry.of(s, 40).widening == 3
    for T, wide in ((CHUNK, 1), (40, 3)):
        want = track_a.LAG_COPIES * s.n_heads * T * s.d_head * wide * 8 + \
            strip_bytes(s.n_heads, T, track_a.STRIP)
        assert track_a.work_bytes(llama4, T) == want


@pytest.mark.skipif(find_chromium() is None, reason="headless Chromium not found")
def test_the_report_page_reads_the_chunked_mask(llama4, tmp_path):
    """In the report, a saved sequence's pattern and fit read the entries the layer's
    mask keeps: Σ_t (t mod chunk) keys below the diagonal on a chunked layer, every one on
    the global layer (the page counts them in ``data-pk-kept``)."""
    T = 40
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(5))
    res = pk.measure(llama4, ids, progress=False, null_perms=0, logits_for=[0])
    res.save(tmp_path)
    page = build_report(tmp_path, workers=1)
    for layer, want in ((0, int(kept(T, CHUNK).sum())), (3, T * (T - 1) // 2)):
        anchor = head_anchor(res.model, res.dataset, T, layer, 1)
        run = load_page(page, budget_ms=8000, fragment=anchor)
        assert run.probe == [] and run.console == [], (run.probe, run.console)
        box = run.dom.find_all("div", id="pk-head")[0].find_all("div", class_="pk-cv")[0]
        assert box.attrs["data-pk-state"] == "mounted"
        assert box.attrs["data-pk-kept"] == str(want), layer


@pytest.mark.skipif(find_chromium() is None, reason="headless Chromium not found")
def test_the_report_page_reads_a_sliding_window(tiny_tokenizer, tmp_path):
    """The same count on Gemma 2's sliding-window layers: min(t, window) keys per row."""
    model = arch_loaded("gemma2", tiny_tokenizer)
    T = 40
    ids = torch.randint(3, 290, (2, T), generator=torch.Generator().manual_seed(5))
    res = pk.measure(model, ids, progress=False, null_perms=0, logits_for=[0])
    res.save(tmp_path)
    page = build_report(tmp_path, workers=1)
    windowed = [L for L, m in enumerate(res.geometry.masks) if m.window_last is not None]
    assert windowed
    last = res.geometry.mask(windowed[0]).window_last
    anchor = head_anchor(res.model, res.dataset, T, windowed[0], 0)
    run = load_page(page, budget_ms=8000, fragment=anchor)
    box = run.dom.find_all("div", id="pk-head")[0].find_all("div", class_="pk-cv")[0]
    assert box.attrs["data-pk-kept"] == str(sum(min(t, last) for t in range(T)))

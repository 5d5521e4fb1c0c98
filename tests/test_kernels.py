"""The GPU's tiled kernels (:mod:`poskernel_tl.kernels`), run under Triton's interpreter on
CPU tensors (``TRITON_INTERPRET=1``, set in conftest): each against a naive float64
computation of what the softmax reads (T not a multiple of the tile, GQA, windows,
ALiBi, a temperature, the soft-cap, permuted positions, the transposed side of a
bidirectional fit, bf16 operands), a planted Toeplitz head, and the whole measurement on
the kernels' path against the CPU path on tiny models of every kind of softmax."""

import contextlib
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from masks import masks
from tiny_models import arch_loaded, tiny_loaded  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl import kernels  # noqa: E402
from poskernel_tl.kernels.gram_tiles import gram_layout, gram_tile_update  # noqa: E402
from poskernel_tl.kernels.lag_tiles import TILE, lag_tile_sums  # noqa: E402
from poskernel_tl.kernels.pattern_pass import pattern_sums  # noqa: E402
from poskernel_tl.models.softmax_ops import temperatures  # noqa: E402
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms  # noqa: E402
from poskernel_tl.reducers.base import LayerBatch  # noqa: E402
from poskernel_tl.reducers.gram import GramReducer  # noqa: E402
from poskernel_tl.reducers.gram_cost import gram_row_blocks  # noqa: E402
from poskernel_tl.reducers.moments import MomentsReducer  # noqa: E402

interpreted = pytest.mark.skipif(not kernels.interpreting(), reason="forces the kernels' "
                                 "path on CPU tensors (TRITON_INTERPRET=1)")


TERMS = {"plain": NONE, "softcap": SoftmaxTerms(softcap=4.0),
         "alibi": SoftmaxTerms(slopes=(0.5, 0.25, 0.125, 0.0625)),
         "temperature": SoftmaxTerms(temperature=(8.0, 0.1))}


def qk(b=2, T=75, H=4, kv=2, d=24, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, T, H, d, generator=g), torch.randn(b, T, kv, d, generator=g)
    return q.to(device), k.to(device)


def naive_logits(q, k, scale, terms, pos=None):
    """What the softmax reads, float64 [b, H, T, T], at positions ``pos`` (q and k read
    through them: the permuted product)."""
    T, H = q.shape[1], q.shape[2]
    pos = torch.arange(T) if pos is None else pos.cpu()
    q, k = q.cpu()[:, pos].double(), k.cpu()[:, pos].double()
    A = torch.einsum("bthd,bshd->bhts", q, k.repeat_interleave(H // k.shape[2], 2)) * scale
    if terms.temperature is not None:
        A = A * temperatures(terms, T)[pos][None, None, :, None]
    if terms.slopes is not None:
        p = pos.double()
        A = A - torch.tensor(terms.slopes).double()[None, :, None, None] * (p[:, None] - p)
    if terms.softcap is not None:
        A = terms.softcap * torch.tanh(A / terms.softcap)
    return A


def per_lag(A, W):
    """(S1, S2) of offsets 1..W of the strictly lower triangle: [2, b, H, W]."""
    diag = [A.diagonal(-lag, -2, -1) for lag in range(1, W + 1)]
    return torch.stack([torch.stack([d.sum(-1) for d in diag], -1),
                        torch.stack([(d * d).sum(-1) for d in diag], -1)])


def rel(a, b):
    return float((a.cpu() - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("window,splits", [(None, None), (40, 1), (40, 3), (5, 2)])
def test_lag_tiles_equal_naive_sums(terms, window, splits, device):
    """Per-lag sums and squares of every sequence and head (T = 75: not a multiple of the
    tile; GQA; a window shorter and longer than a tile; a block diagonal split over
    programs) within float32's rounding of the float64 reference."""
    q, k = qk(device=device)
    got = lag_tile_sums(q, k, 0.3, TERMS[terms], window, splits=splits)
    want = per_lag(naive_logits(q, k, 0.3, TERMS[terms]), window or q.shape[1] - 1)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert rel(got[0], want[0]) < 1e-6 and rel(got[1], want[1]) < 1e-6, terms


def test_lag_tiles_wide_heads(device):
    """d_head past one chunk of the product (Gemma 3's 256, Track B's ranks): d = 150 in
    chunks of 64, the last one partial."""
    q, k = qk(T=40, H=2, kv=1, d=150, device=device)
    got = lag_tile_sums(q, k, 0.1, TERMS["softcap"])
    assert rel(got, per_lag(naive_logits(q, k, 0.1, TERMS["softcap"]), 39)) < 1e-6
    dist, sums = pattern_sums(q, k, 0.1, 39, NONE, 5)
    want_dist, want_sums = naive_pattern(naive_logits(q, k, 0.1, NONE), 39, 5)
    assert rel(dist, want_dist) < 1e-5 and rel(sums, want_sums) < 1e-5


@pytest.mark.parametrize("terms", ["plain", "alibi", "temperature"])
def test_lag_tiles_permuted_draws_pooled(terms, device):
    """Every draw of the null in one launch: the lower triangle of the product of q and k
    read through each permutation, summed over the sequences."""
    q, k = qk(b=3, T=50, device=device)
    perms = torch.stack([torch.randperm(50, generator=torch.Generator().manual_seed(i))
                         for i in range(3)]).to(device)
    got = lag_tile_sums(q, k, 0.3, TERMS[terms], 20, perms=perms, pooled=True)
    for p in range(3):
        want = per_lag(naive_logits(q, k, 0.3, TERMS[terms], perms[p]), 20).sum(1)
        assert rel(got[:, p], want) < 1e-6, (terms, p)


@pytest.mark.parametrize("terms", ["plain", "alibi", "temperature", "softcap"])
def test_lag_tiles_transposed_side(terms, device):
    """The upper triangle of A (a bidirectional fit) as the lower one of Aᵀ: q and k passed
    swapped with ``transposed``, the softmax's terms read the right way round."""
    q, k = qk(H=4, kv=4, device=device)
    got = lag_tile_sums(k, q, 0.3, TERMS[terms], transposed=True)
    want = per_lag(naive_logits(q, k, 0.3, TERMS[terms]).transpose(-1, -2), q.shape[1] - 1)
    assert rel(got, want) < 1e-6


def test_lag_tiles_bf16_operands_are_exact_products(device):
    """bf16 q and k: products exact in float32 (the model's own attention), so the sums
    equal the float64 sums of the bf16 values to float32 accumulation."""
    q, k = (x.bfloat16() for x in qk(device=device))
    got = lag_tile_sums(q, k, 0.3, NONE)
    want = per_lag(naive_logits(q, k, 0.3, NONE), q.shape[1] - 1)
    assert rel(got, want) < 1e-6


def test_lag_tiles_planted_toeplitz_head(device):
    """A planted shift-invariant head: q_t·k_s = cos θ(t − s) exactly (one rotary pair),
    so S1(Δ) = (T − Δ)·cos θΔ and S2(Δ) = (T − Δ)·cos² θΔ."""
    T, theta = 3 * TILE + 7, 0.37
    ang = theta * torch.arange(T, dtype=torch.float64)
    rot = torch.stack([ang.cos(), ang.sin()], -1)  # [T, 2]
    q, k = (rot[None, :, None].float().to(device) for _ in range(2))
    got = lag_tile_sums(q, k, 1.0, NONE).cpu()
    lag = torch.arange(1, T, dtype=torch.float64)
    n = T - lag
    assert torch.allclose(got[0, 0, 0], n * torch.cos(theta * lag), atol=1e-5)
    assert torch.allclose(got[1, 0, 0], n * torch.cos(theta * lag) ** 2, atol=1e-5)


def naive_pattern(A, last, n_alpha, sinks=None):
    """The pattern's sums of :func:`pattern_sums` from the logits ``A`` [b, H, T, T]
    (float64): each row's distance Σ_s p(t, s)·|t − s|; per (sequence, head) α_k (over the
    rows reading k), Σ_t p(t, t − 1), Σ_{t ≥ 1} p(t, 0), Σ_t the row's share on tokens."""
    T = A.shape[-1]
    lag = torch.arange(T)[:, None] - torch.arange(T)
    if last is not None:
        A = A.masked_fill((lag < 0) | (lag > last), float("-inf"))
    lse = torch.logsumexp(A, -1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.double()[None, :, None])
    p = (A - lse[..., None]).exp()
    share = p.sum(-1)
    readers = (T - torch.arange(n_alpha)).double() if last is not None else torch.full(
        (n_alpha,), float(T), dtype=torch.float64)
    alpha = p[..., :n_alpha].sum(-2) / readers
    prev = p.diagonal(-1, -2, -1).sum(-1)
    first = p[..., 1:, 0].sum(-1)
    dist = (p * lag.abs().double()).sum(-1)
    return dist, torch.cat([alpha, torch.stack([prev, first, share.sum(-1)], -1)], -1)


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("last", [None, 74, 20])
def test_pattern_pass_equals_naive(terms, last, device):
    """Every sum the pattern statistics read, from one pass (every key; causal; a window),
    with and without learned sinks."""
    q, k = qk(device=device)
    A = naive_logits(q, k, 0.3, TERMS[terms])
    for sinks in (None, torch.tensor([0.5, -1.0, 2.0, 0.0])):
        got = pattern_sums(q, k, 0.3, last, TERMS[terms], 5,
                           None if sinks is None else sinks.to(device))
        want = naive_pattern(A, last, 5, sinks)
        assert rel(got[0], want[0]) < 1e-5 and rel(got[1], want[1]) < 1e-5, (terms, last)


@pytest.mark.parametrize("full,last", [(False, None), (False, 40), (True, None)])
def test_gram_tiles_update_every_block(full, last, device):
    """Track B's accumulator: every row block (the triangle, a window's band, every key)
    after two batches equals Σ_x q_x k_xᵀ over them, GQA keys by index."""
    q, k = qk(b=3, T=150, device=device)
    blocks = gram_row_blocks(150, full, last=last)
    flat, views, table = gram_layout(blocks, 4, device)
    for _ in range(2):
        gram_tile_update(flat, table, 64, q, k)
    want = 2 * torch.einsum("bthd,bshd->hts", q.cpu().double(),
                            k.cpu().double().repeat_interleave(2, 2))
    for (r0, r1, k0, k1), view in zip(blocks, views):
        err = float((view.cpu() - want[:, r0:r1, k0:k1]).abs().max())
        assert err < 1e-4 * float(want.abs().max())


@interpreted
def test_dispatch_rule(monkeypatch):
    """CPU tensors take the chunked path unless forced; forcing needs the interpreter."""
    x = torch.zeros(1)
    assert not kernels.active(x)
    with kernels.forced():
        assert kernels.active(x)
    assert not kernels.active(x)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with kernels.forced():
            pass


def test_cpu_install_needs_no_triton():
    """Without Triton (a CPU build of torch ships none) the package imports, measures on
    the CPU and says the kernels are unavailable: kernels load their modules on first
    use only."""
    code = ("import sys; sys.modules['triton'] = None  # import triton now fails\n"
            "import torch, poskernel_tl as pk\n"
            "from poskernel_tl.kernels.dispatch import triton_available\n"
            "from poskernel_tl.reducers.lag_sums import track_a_stats\n"
            "track_a_stats(torch.randn(1, 8, 2, 4), torch.randn(1, 8, 1, 4), 0.5)\n"
            "assert not triton_available() and not pk.kernels.active(torch.zeros(1))\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# the default suite runs the whole path on a plain GQA decoder and Gemma 3's non-consecutive
# groups here, and on an encoder in test_t5gemma.py (its two-sided window past T); the other
# softmax terms (sinks, ALiBi, the soft-cap, a temperature, windows on some layers) are each
# held to naive sums kernel by kernel above, and their whole path runs in the slow suite
# (`make test-slow`), with BERT's
ARCHS = ["llama", "gemma3"] + [pytest.param(a, marks=pytest.mark.slow) for a in (
    "bert", "gpt_oss", "bloom", "gemma2", "llama4", "qwen2")]


def compare_results(ref, got) -> dict[str, tuple[float, float]]:
    """Per float array of every part: (max |Δ| over its finite entries, NaN where one is
    NaN and the other not; the largest |value|, at least 1)."""
    out = {}
    for name, part in ref.parts.items():
        for field, value in vars(part).items():
            other = getattr(got.parts[name], field)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                ok = np.isfinite(value)
                if not (ok == np.isfinite(other)).all():
                    out[f"{name}.{field}"] = (float("nan"), 1.0)
                elif ok.any():
                    out[f"{name}.{field}"] = (float(np.abs(value[ok] - other[ok]).max()),
                                              max(1.0, float(np.abs(value[ok]).max())))
    return out


@interpreted
@pytest.mark.parametrize("arch", ARCHS)
def test_kernel_path_equals_cpu_path(arch, tiny_tokenizer):
    """``pk.measure`` on the kernels' path equals the CPU path on every array of the
    result, on models whose softmax adds nothing (llama, GQA), is bidirectional (bert),
    has sinks and alternating windows (gpt-oss), ALiBi (BLOOM), a soft-cap and a window
    (Gemma 2), windowed and global layers grouped by kind (Gemma 3: a group's layers not
    consecutive), a temperature (Llama 4) or windows on some layers (Qwen2): R² to float32's
    rounding (≤ 1e-6), g and the Gram within 1e-6 of their scale."""
    model = tiny_loaded(arch, tiny_tokenizer) if arch in ("llama", "bert") \
        else arch_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (8, 40), generator=torch.Generator().manual_seed(0))
    run = dict(progress=False, null_perms=2, null_seqs=3, batch_size=2)
    ref = pk.measure(model, ids[4:], ids[:4], **run)
    with kernels.forced():
        got = pk.measure(model, ids[4:], ids[:4], **run)
    diffs = compare_results(ref, got)
    assert {"track_a.r2_pooled", "track_b.r2_gram", "perm_null.r2_null",
            "prev_token.tl_prev_token", "sink.sink_mass"} <= set(diffs)
    for field, (diff, scale) in diffs.items():
        bound = 1e-6 if ".r2" in field else 1e-6 * scale
        assert diff <= bound, (arch, field, diff)


def gram_run(tiled: bool, factors: bool, causal: bool, lasts, T: int = 140):
    """Track B of random q/k (1 layer; 4 centering, 4 evaluation sequences in batches of
    2) without its matrices kept (as past T = 256: the row blocks of 64 rows, the last one
    partial), on the kernels' path or the CPU's."""
    g = torch.Generator().manual_seed(0)
    L, H, d = 1, 4, 16
    kv = 2 if causal else 4
    draw = lambda: (torch.randn(2, T, H, d, generator=g) + 0.5,
                    torch.randn(2, T, kv, d, generator=g) - 0.3)
    cen, ev = [draw() for _ in range(2)], [draw() for _ in range(2)]
    moments = MomentsReducer(4, L, H, kv, T, d)
    for b, (q, k) in enumerate(cen):
        for layer in range(L):
            moments.update(LayerBatch(layer, q, k, torch.arange(2 * b, 2 * b + 2), 0.25))
    centering = moments.result()
    with kernels.forced() if tiled else contextlib.nullcontext():
        red = GramReducer(masks(T, L, causal=causal, lasts=lasts), H, kv, d, 0.25,
                          reference=centering, factors=factors, full=False)
        for b, (q, k) in enumerate(ev):
            for layer in range(L):
                red.update(LayerBatch(layer, q, k, torch.arange(2 * b, 2 * b + 2), 0.25))
        return red.result(centering)


@interpreted
@pytest.mark.parametrize("factors,causal,lasts", [
    (False, True, None), (False, True, [40]), (True, True, [40]), (True, True, None),
    (False, False, None), (True, False, None)])
def test_track_b_tiles_equal_cpu(factors, causal, lasts):
    """Track B without its matrices (the lower triangle's row blocks, a window's band, the kept
    factors; an encoder's two sides) on the kernels' path — the accumulator updated by
    tiles, its pieces read by tiles, the centering's U·Vᵀ terms from the lag tiles —
    equals the CPU path: R² (raw, centered, half) within 1e-6, g within 1e-6 of its
    scale."""
    ref, got = (gram_run(tiled, factors, causal, lasts) for tiled in (False, True))
    for name in ("r2_gram_raw", "r2_gram", "r2_gram_half"):
        assert np.nanmax(np.abs(getattr(ref, name) - getattr(got, name))) < 1e-6, name
    for name in ("g_gram_raw", "g_gram") + (() if causal else ("g_gram_back", "g_gram_self")):
        a, b = getattr(ref, name), getattr(got, name)
        assert (np.isfinite(a) == np.isfinite(b)).all(), name
        assert np.nanmax(np.abs(a - b)) < 1e-6 * max(1.0, np.nanmax(np.abs(a))), name


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("T,last,upper", [(75, None, False), (75, 30, False), (40, None, True),
                                          (130, None, False)])
def test_strip_regions_equal_region_sums(terms, T, last, upper, device):
    """Every region of Track A from one launch equals :func:`region_sums` of the skewed
    float64 strip (the regions inside the strip, and the complements: the whole side's
    sums less the strip's part), under a window and on the upper side."""
    from poskernel_tl.fit.variants import region_sums
    from poskernel_tl.kernels.strip_regions import strip_region_sums
    from poskernel_tl.models.softmax_ops import cap_scores, fold_qk
    from poskernel_tl.reducers.lag_sums import key_strip, skew_keys
    from poskernel_tl.reducers.track_a_result import REGIONS, STRIP
    from poskernel_tl.reducers.two_sided import per_query_head

    q, k = qk(T=T, device=device)
    fq, fk = fold_qk(q.cpu(), k.cpu(), TERMS[terms], 0.3)
    rows, keys = (per_query_head(fk, 4), fq) if upper else (fq, fk)
    strip = skew_keys(cap_scores(key_strip(rows, keys, 0.3, min(STRIP, T)), TERMS[terms]))
    g = torch.Generator().manual_seed(1)
    s1 = torch.randn(2, 4, T - 1, generator=g, dtype=torch.float64)
    s1 = s1 * (torch.arange(1, T) <= (T if last is None else last))
    sq = torch.rand(2, 4, generator=g, dtype=torch.float64) * 100
    got = strip_region_sums(q, k, 0.3, TERMS[terms], REGIONS, STRIP,
                            torch.cat([s1, sq[..., None]], -1).to(device), last, upper).cpu()
    for r, v in enumerate(REGIONS):
        want_s1, want_sq = region_sums(strip, v, (s1, sq), None if upper else last, upper=upper)
        assert float((got[r, ..., :T - 1] - want_s1).abs().max()) < 3e-5, (v, terms)
        assert float((got[r, ..., T - 1] - want_sq).abs().max()) < 1e-6 * float(
            want_sq.abs().max()) + 1e-5, (v, terms)

"""Track B within a memory budget: the lower-triangle accumulator in row blocks, Track B in
blocks of layers (one evaluation pass each, the forward stopped after the block's last
layer), the plan made before the run and its refusals."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from masks import masks
from tiny_models import VOCAB, tiny_loaded

import poskernel_tl as pk
from poskernel_tl import sizes
from poskernel_tl.errors import PlanError, UserError
from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.hooks import capture_qk, qk_hook_names
from poskernel_tl.models.registry import resolve
from poskernel_tl.plan import batching
from poskernel_tl.plan.config import MeasureConfig, RunConfig
from poskernel_tl.reducers import GramReducer, LayerBatch, MomentsReducer, gram_cost, gram_fit
from poskernel_tl.reducers.gram import concat_layers

H, HKV, D = 4, 2, 8
SCALE = 1 / math.sqrt(D)
TRACK_B = ("r2_gram_raw", "g_gram_raw", "r2_gram", "g_gram", "r2_gram_half")


def _qk(rng, n, T, layers=1):
    pos = torch.randn(T, 1, D, generator=rng, dtype=torch.float64)
    q = torch.randn(layers, n, T, H, D, generator=rng, dtype=torch.float64) + 3 * pos + 5
    k = torch.randn(layers, n, T, HKV, D, generator=rng, dtype=torch.float64) + 3 * pos - 2
    return q.float(), k.float()


def _feed(red, q, k, batch=3):
    for L in range(q.shape[0]):
        for s in range(0, q.shape[1], batch):
            idx = torch.arange(s, min(q.shape[1], s + batch))
            red.update(LayerBatch(L, q[L, idx], k[L, idx], idx, SCALE,
                                  rows=tuple(idx.tolist())))


def _centering(rng, T, layers=1):
    cq, ck = _qk(rng, 6, T, layers)
    mom = MomentsReducer(6, layers, H, HKV, T, D, half_seed=1)
    _feed(mom, cq, ck)
    return mom.result()


@pytest.mark.parametrize("n", [3, 7])
def test_every_layout_equals_the_full_accumulator_and_float64(rng, n):
    """T = 300: three row blocks, the last one partial. The lower-triangle accumulator
    and the kept factors give every Track B number of the full layout and of a float64
    computation of the Gram matrices."""
    T = 300
    q, k = _qk(rng, n, T)
    means = _centering(rng, T)
    runs = {}
    for layout in ("full", "lower", "factors"):
        red = GramReducer(masks(T), H, HKV, D, SCALE, reference=means, full=layout == "full",
                          factors=layout == "factors")
        _feed(red, q, k)
        runs[layout] = red.result(means, keep_matrices=layout == "full")
    for layout in ("lower", "factors"):
        for name in TRACK_B:
            np.testing.assert_allclose(getattr(runs[layout], name), getattr(runs["full"], name),
                                       rtol=1e-6, atol=1e-6, err_msg=f"{layout} {name}")
    qd, kd = q[0].double(), k[0].double().repeat_interleave(H // HKV, dim=2)
    mq = means.mean_q[0].transpose(0, 1)[None]
    mk = means.mean_k[0].transpose(0, 1)[None].repeat_interleave(H // HKV, dim=2)
    raw = torch.einsum("bthd,bshd->hts", qd, kd) / len(qd) * SCALE
    cen = torch.einsum("bthd,bshd->hts", qd - mq, kd - mk) / len(qd) * SCALE
    for layout, run in runs.items():
        for mat, r2, g in ((raw, "r2_gram_raw", "g_gram_raw"), (cen, "r2_gram", "g_gram")):
            want_r2, want_g = shift_invariance_r2(mat)
            assert np.abs(getattr(run, r2)[0] - want_r2.numpy()).max() < 1e-6, (layout, r2)
            assert np.abs(getattr(run, g)[0] - want_g.numpy()).max() < 1e-4, (layout, g)
    assert np.abs(runs["full"].gram_raw[0] - raw.numpy()).max() < 1e-3
    assert np.abs(runs["full"].gram_centered[0] - cen.numpy()).max() < 1e-4
    lower = GramReducer(masks(T), H, HKV, D, SCALE, full=False)
    stored = sum(a.numel() for a in lower.acc[0])
    blocks = gram_cost.gram_row_blocks(T, False)
    assert stored == H * sum((r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in blocks)
    assert all(k0 == 0 and k1 == r1 for r0, r1, k0, k1 in blocks)
    big = gram_cost.block_entries(4096, False)
    assert big < 0.52 * 4096 ** 2  # T²/2 and the diagonal blocks, not T²
    with pytest.raises(ValueError, match="full=False"):
        lower.result(keep_matrices=True)


def test_factors_are_chosen_for_few_sequences_at_long_t(smol_sized):
    assert all(gram_cost.gram_factors(smol_sized, 8192, 2, False))
    assert all(gram_cost.gram_factors(smol_sized, 4096, 2, False))
    assert not any(gram_cost.gram_factors(smol_sized, 8192, 2, True))  # matrices to keep
    # rank > 256: the factors would form the accumulator's blocks, as dear; the accumulator
    assert not any(gram_cost.gram_factors(smol_sized, 1024, 100, False))
    assert not any(gram_cost.gram_factors(smol_sized, 256, 2, False))  # T² is small
    tied = batching.plan_measure(smol_sized, batching.Workload(1024, 100, 0), "auto", "64G")
    assert not any(tied.factors) and "as fast as the sequences' q/k factors" in tied.why
    # as dear at rank 512 too; at T = 8192 the factors are the smaller state (0.2 GB per
    # layer against the triangle's 1.2 GB)
    far = batching.plan_measure(smol_sized, batching.Workload(8192, 8, 0), "auto", "64G")
    assert all(far.factors) and "as fast as the [T, T] accumulator" in far.why
    seconds = gram_cost.track_b_seconds
    for T in (256, 1024, 4096, 8192):  # the accumulator's fit is O(T²), the factors' O(T)
        assert seconds(smol_sized, 2 * T, 2, False) > 3.9 * seconds(smol_sized, T, 2, False)
        assert seconds(smol_sized, 2 * T, 2, True) < 2.3 * seconds(smol_sized, T, 2, True)


@pytest.mark.parametrize("faster", [True, False])
def test_the_plan_takes_the_faster_path_that_fits(smol_sized, monkeypatch, faster):
    """Both regimes, by the cost model's constants: the plan keeps Track B the way it
    estimates faster and says why; a budget the faster path does not fit in one pass
    takes the other one rather than more passes."""
    cheap, dear = (1e-12, 1e-8) if faster else (1e-8, 1e-12)
    monkeypatch.setattr(gram_cost, "COST", {"update": dear, "fit": dear,
                                               "factor_lags": cheap, "factor_rank": cheap})
    w = batching.Workload(2048, 2, 2)
    plan = batching.plan_measure(smol_sized, w, "auto", "64G")
    assert set(plan.factors) == {faster} and not plan.blocked
    took = "q/k factors" if faster else "accumulator"
    assert plan.why.startswith(f"the sequences' {took}" if faster else f"the [T, T] {took}")
    assert "CPU s estimated, against" in plan.why
    acc = batching.estimate_peak(smol_sized, w, 1, 30, factors=False)
    fac = batching.estimate_peak(smol_sized, w, 1, 30, factors=True)
    assert fac < acc
    if not faster:  # the accumulator does not fit: the factors, in one pass
        plan = batching.plan_measure(smol_sized, w, "auto", f"{(fac + acc) // 2 >> 20}M")
        assert all(plan.factors) and not plan.blocked and "does not fit" in plan.why
    kept = batching.plan_measure(smol_sized, dataclasses.replace(w, keep_gram=True), "auto",
                                 "64G")
    assert not any(kept.factors) and "never for kept matrices" in kept.why


def test_blocks_of_layers_join_into_the_all_layer_result(rng):
    T, L = 70, 3
    q, k = _qk(rng, 5, T, L)
    means = _centering(rng, T, L)
    whole = GramReducer(masks(T, L), H, HKV, D, SCALE, reference=means)
    _feed(whole, q, k)
    parts = []
    for layers in ([0, 1], [2]):
        red = GramReducer(masks(T, L), H, HKV, D, SCALE, reference=means, layers=layers)
        _feed(red, q, k)  # every layer is offered; each reducer keeps its own
        parts.append(red.result(means, keep_matrices=True))
    a, b = whole.result(means, keep_matrices=True), concat_layers(parts)
    for name in (*TRACK_B, "gram_raw", "gram_centered"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    torch.testing.assert_close(a.eval_moments.mean_q, b.eval_moments.mean_q)


@pytest.fixture(scope="module")
def llama(tiny_tokenizer):
    return tiny_loaded("llama", tiny_tokenizer)


def _tokens(n, T, seed):
    return torch.randint(3, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("keep_gram", [True, False])
def test_blocked_run_equals_the_unblocked_one(llama, capsys, keep_gram):
    """A budget that holds Track B for one layer at a time: two evaluation passes, the
    same numbers (and the same saved matrices), and one line saying so."""
    ev, cen = _tokens(8, 100, 1), _tokens(8, 100, 2)
    one = pk.measure(llama, ev, cen, batch_size=4, progress=False, keep_gram=keep_gram)
    work = batching.Workload(100, 8, 8, llama.attention != "sdpa", keep_gram, 0, False, 4)
    fits_one_layer = batching.estimate_peak(llama, work, 4, 1)
    assert batching.estimate_peak(llama, work, 4, 2) > fits_one_layer
    capsys.readouterr()
    split = pk.measure(llama, ev, cen, batch_size=4, progress=False, keep_gram=keep_gram,
                       max_memory=f"{math.ceil(fits_one_layer / 1024)}K")
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("Track B in 2 blocks of layers")
    assert "1 more evaluation pass stopped after layer 0" in printed[0]
    assert split.provenance["notes"][0] == printed[0]
    names = (*TRACK_B, "r2_pooled", "r2_per_seq") + (("gram_raw", "gram_centered")
                                                     if keep_gram else ())
    for name in names:
        np.testing.assert_allclose(getattr(split, name), getattr(one, name), rtol=1e-12,
                                   atol=1e-12, err_msg=name)
    assert (one.gram_raw is None) == (not keep_gram)


def test_forward_stops_after_the_last_layer_wanted(llama):
    seen, later = [], []
    ids = _tokens(2, 20, 3)
    q1_name, _ = qk_hook_names(llama.bridge, "blocks.1.attn")
    with torch.no_grad(), llama.bridge.hooks(fwd_hooks=[(q1_name,
                                                         lambda x, hook: later.append(1))]):
        with capture_qk(llama.bridge, lambda c: seen.append((c.layer, c.q.clone())),
                        layers=[0], stop=True) as cap:
            assert cap.forward(ids) is None  # stopped: no logits
    assert [layer for layer, _ in seen] == [0] and later == []
    full = []
    with torch.no_grad(), capture_qk(llama.bridge, lambda c: full.append(c.q.clone())) as cap:
        assert cap.forward(ids) is not None
        assert cap.forward(ids) is not None  # and the bridge still runs whole passes
    torch.testing.assert_close(seen[0][1], full[0])


@pytest.fixture(scope="module")
def smol_sized(llama):
    """The tiny bridge with SmolLM2-135M's geometry: plans at the lengths that matter."""
    return dataclasses.replace(llama, spec=resolve("smollm2-135m"), attention="sdpa")


def test_plans_at_smollm2_lengths(smol_sized):
    w = lambda T, n: batching.Workload(T, n // 2, n // 2)
    p = batching.plan_measure(smol_sized, w(1024, 200), "auto", "4G")
    assert not p.blocked and p.note() is None and p.batch_size == 4
    p = batching.plan_measure(smol_sized, w(8192, 4), "auto", "14G")
    assert not p.blocked  # two evaluation sequences: Track B keeps their factors
    p = batching.plan_measure(smol_sized, w(4096, 40), "auto", "6G")
    assert p.blocked and p.peak <= p.budget == 6 * 2**30
    flat = [layer for a, b in p.layer_blocks for layer in range(a, b)]
    assert flat == list(range(30))
    assert f"Track B in {len(p.layer_blocks)} blocks of layers (0–" in p.note()
    assert p.extra_forwards == pytest.approx(sum(b for _, b in p.layer_blocks[:-1]) / 30)
    more = batching.plan_measure(smol_sized, w(4096, 40), "auto", "9G")
    assert len(more.layer_blocks) < len(p.layer_blocks)


@pytest.mark.parametrize("max_memory, batch, flag", [("2G", "auto", "--max-memory"),
                                                     ("10G", 64, "--batch-size")])
def test_what_cannot_fit_is_refused_in_one_line(smol_sized, max_memory, batch, flag):
    with pytest.raises(PlanError) as err:
        batching.plan_measure(smol_sized, batching.Workload(8192, 20, 20), batch, max_memory)
    message = str(err.value)
    assert message.startswith(flag) and "\n" not in message and "--max-memory" in message
    assert isinstance(err.value, UserError)


def test_measure_refuses_before_any_work(llama):
    with pytest.raises(PlanError, match="--max-memory"):
        pk.measure(llama, _tokens(4, 64, 1), progress=False, max_memory="1M")


@pytest.mark.parametrize("text, expected", [("auto", None), ("12G", 12 * 2**30),
                                            ("800M", 800 * 2**20), ("1.5GiB", 3 * 2**29),
                                            ("2", 2 * 2**30), (3, 3 * 2**30)])
def test_memory_sizes(text, expected):
    assert sizes.parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1G", "0", "12X"])
def test_bad_memory_sizes_name_the_flag(bad):
    with pytest.raises(UserError, match="--max-memory"):
        sizes.parse_memory(bad)


def test_the_flag_is_a_measure_option_checked_before_any_work():
    assert MeasureConfig().max_memory == "auto" and "max_memory" in RunConfig().to_dict()
    with pytest.raises(UserError, match="--max-memory lots"):
        MeasureConfig(max_memory="lots").validate()


def test_whitened_gram_holds_what_the_plan_counts(rng, llama):
    """The whitened diagnostic keeps Track B's float32 lower-triangle accumulator (no
    float64 T×T): its tensors add up to the plan's count per layer, and its R² equals a
    GramReducer's raw fit fed the whitened vectors."""
    from poskernel_tl.statistics import WhitenedGramReducer

    T, n = 300, 4
    q, k = _qk(rng, n, T)
    cq, ck = _qk(rng, 6, T)
    mom = MomentsReducer(6, 1, H, HKV, T, D, second_moments=True)
    _feed(mom, cq, ck)
    means = mom.result()
    red = WhitenedGramReducer(means, SCALE, masks(T))
    _feed(red, q, k)
    acc = sum(a.numel() * a.element_size() for a in red.gram.acc[0])
    assert all(a.dtype == torch.float32 for a in red.gram.acc[0])
    per_head = gram_cost.accumulator_bytes(llama, T, False) // llama.spec.n_heads
    assert acc == H * per_head < H * T * T * 4 * 0.75
    wq, wk = means.whitening()
    white = lambda x, m, w: ((x.double() - m.double()[0].transpose(0, 1)).transpose(1, 2)
                             @ w.double()[0]).transpose(1, 2)
    ref = GramReducer(masks(T), H, HKV, D, SCALE)
    _feed(ref, white(q[0], means.mean_q, wq)[None].float(),
          white(k[0], means.mean_k, wk)[None].float())
    np.testing.assert_allclose(red.result().r2_gram_whitened, ref.result().r2_gram_raw,
                               atol=1e-5)


def test_means_are_taken_in_place_once(rng):
    """The centering and evaluation means replace their sums (no second [layer, head, T,
    d] copy at the peak): the centering means are rounded to float32 (as saved) and their
    float64 sums released, the evaluation means are the sums divided in place; taken
    twice they are the same tensors, and a reducer refuses more batches after them."""
    T = 40
    q, k = _qk(rng, 4, T)
    mom = MomentsReducer(4, 1, H, HKV, T, D, half_seed=1)
    _feed(mom, q, k)
    first = mom.result()
    assert mom.result() is first
    assert all(t.dtype == torch.float32 for t in (first.mean_q, first.mean_k,
                                                   first.mean_q_half, first.mean_k_half))
    assert mom.q_sum is None and mom.k_sum is None and mom.q_half is None
    torch.testing.assert_close(first.mean_q[0],
                               q[0].double().mean(0).transpose(0, 1).float())
    red = GramReducer(masks(T), H, HKV, D, SCALE, reference=first)
    _feed(red, q, k)
    ev = red.eval_moments()
    assert red.eval_moments() is ev and ev.mean_k.data_ptr() == red.k_sum.data_ptr()
    torch.testing.assert_close(ev.mean_k[0], k[0].double().mean(0).transpose(0, 1))
    for reducer in (mom, red):
        with pytest.raises(RuntimeError, match="after the means"):
            _feed(reducer, q, k)


def _rotated(rng, n: int, heads: int, T: int, d: int = 64) -> torch.Tensor:
    """n sequences of one fixed vector per head rotated by RoPE at every position: each
    sequence's q_t·k_s is a function of t − s alone."""
    v = torch.randn(n, heads, d // 2, 2, generator=rng, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(angle)[None, :, None], torch.sin(angle)[None, :, None]
    x, y = v[:, None, ..., 0], v[:, None, ..., 1]
    return torch.stack([x * c - y * s, x * s + y * c], -1).flatten(-2).float()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_factor_fit_of_an_exact_rope_gram(rng, monkeypatch, dtype, tol):
    """The factors' fit at T = 4096 with products in ``dtype`` (float32 by default, totals
    in float64): a Gram matrix that is exactly Toeplitz has R² = 1 within ``tol`` and the
    g of a float64 fit."""
    T, n = 4096, 2
    q, k = _rotated(rng, n, 2, T), _rotated(rng, n, 1, T)
    fits = {}
    for run in (torch.float64, dtype):
        monkeypatch.setattr(gram_fit, "FIT_DTYPE", run)
        red = GramReducer(masks(T), 2, 1, 64, 0.125, full=False, factors=True)
        red.update(LayerBatch(0, q, k, torch.arange(n), 0.125))
        fits[run] = red.result(None)
    assert np.abs(fits[dtype].r2_gram_raw - 1).max() < tol
    np.testing.assert_allclose(fits[dtype].g_gram_raw, fits[torch.float64].g_gram_raw,
                               rtol=0, atol=1e-9)

"""An offset term that does not fold into q and k (a learned table b_h(Δ) added to the
logits) is read by every fit through the materialised scores: a planted table, registered
as a term for these tests only, on a tiny model whose q and k are the model's own.

Reference: the naive float64 fit of what the softmax reads, scale·q·kᵀ (HF's eager
softmax input) plus b_h(t − s) at every entry; a head whose q·k is nothing recovers the
table exactly (R² = 1, g = b)."""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from masks import masks
from softmax_spy import naive_r2, naive_within_r2, softmax_inputs
from tiny_models import tiny_hf_model, tiny_loaded
from transformer_lens.head_detector import (
    compute_head_attention_similarity_score,
    get_previous_token_head_detection_pattern,
)

import poskernel_tl as pk
from poskernel_tl.models.softmax_ops import head_logits, offset_bias
from poskernel_tl.models.softmax_terms import SoftmaxTerms
from poskernel_tl.models.terms import registry
from poskernel_tl.models.terms.term import Term
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.track_a import TrackAReducer
from poskernel_tl.statistics.perm_null import PermNullReducer


@dataclass(frozen=True)
class Planted(Term):
    """b_h(Δ) = amplitude·(sin(0.9·Δ + h) + 0.03·Δ·(h + 1)), both signs of Δ differing."""

    NAME = "planted_table"
    KIND = "offset"
    ORDER = 99

    @classmethod
    def read(cls, ctx):
        return None  # planted by the tests, never read from a model

    def describe(self, values: bool = True) -> str:
        return "a planted table"

    def known_kernel(self, lags, scale: float = 1.0):
        heads, amp = self.value
        return [[amp * (math.sin(0.9 * d + h) + 0.03 * d * (h + 1)) for d in lags]
                for h in range(int(heads))]


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setitem(registry.TERMS, Planted.NAME, Planted)
    return lambda heads, amp=1.0: SoftmaxTerms(planted_table=(heads, amp))


def table(terms: SoftmaxTerms, T: int) -> torch.Tensor:
    t = torch.arange(T)
    return offset_bias(terms, t[:, None] - t[None], T)


def test_an_offset_term_without_its_kernel_is_refused():
    @dataclass(frozen=True)
    class Bare(Term):
        NAME, KIND, ORDER = "bare", "offset", 98
    with pytest.raises(ValueError, match="known_kernel"):
        registry.check(Bare)
    registry.check(Planted)  # one that gives it is read
    for term in registry.TERMS.values():
        registry.check(term)


def test_the_table_is_read_at_every_offset(planted):
    terms = planted(3)
    T = 9
    B = table(terms, T)
    for h in range(3):
        for t in range(T):
            for s in range(T):
                want = math.sin(0.9 * (t - s) + h) + 0.03 * (t - s) * (h + 1)
                assert B[h, t, s].item() == pytest.approx(want, abs=1e-12)
    assert not terms.bilinear and terms.offsets and not terms.additive


@pytest.mark.parametrize("causal", [True, False])
def test_a_content_free_head_recovers_the_table(planted, causal):
    """q = k = 0: the logits are the table alone, so R² = 1 and g(Δ) = b_h(Δ)."""
    T, H = 24, 3
    terms = planted(H, 2.0)
    q, k = torch.zeros(2, T, H, 8), torch.zeros(2, T, H, 8)
    red = TrackAReducer(2, masks(T, causal=causal), H)
    red.update(LayerBatch(0, q, k, torch.arange(2), 0.5, rows=(0, 1), terms=terms))
    res = red.result()
    assert np.allclose(res.r2_pooled[0], 1.0, atol=1e-12)
    want = np.asarray(terms.terms[0].known_kernel(range(1, T)))
    assert np.abs(res.g_pooled[0] - want).max() <= 1e-6  # float32 scores
    if not causal:
        back = np.asarray(terms.terms[0].known_kernel(range(-1, -T, -1)))
        assert np.abs(res.g_pooled_back[0] - back).max() <= 1e-6


def test_the_null_permutes_the_tables_offsets_with_q_and_k(planted):
    """Each draw equals the naive fit of (scale·q·kᵀ + B)[π][:, π]."""
    T, H, g = 30, 4, torch.Generator().manual_seed(2)
    terms = planted(H)
    q, k = torch.randn(3, T, H, 8, generator=g), torch.randn(3, T, 2, 8, generator=g)
    red = PermNullReducer(masks(T), H, n_perm=3, max_seqs=3)
    red.update(LayerBatch(0, q, k, torch.arange(3), 0.3, rows=(0, 1, 2), terms=terms))
    out = red.result()
    A = torch.einsum("bthd,bshd->bhts", q.double(), k.double().repeat_interleave(2, 2)) * 0.3
    A = A + table(terms, T)
    for i, pi in enumerate(out.perms):
        pi = torch.as_tensor(pi)
        keep = torch.ones(3, H, T, T, dtype=torch.bool).tril(-1)
        want = naive_r2(A[:, :, pi][:, :, :, pi], keep)
        assert np.abs(out.r2_null[i] - want).max() <= 1e-6


def test_head_logits_add_the_table(planted):
    T, g = 12, torch.Generator().manual_seed(4)
    terms = planted(2)
    q, k = torch.randn(T, 8, generator=g), torch.randn(T, 8, generator=g)
    A = head_logits(q, k, terms, 1, 0.25)
    assert torch.allclose(A, 0.25 * q.double() @ k.double().T + table(terms, T)[1])


def naive_signed_r2(A: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Pooled R² per head of one g per signed offset over the kept off-diagonal entries."""
    n, H, T, _ = A.shape
    lag = (torch.arange(T)[:, None] - torch.arange(T)[None]).expand(n, T, T) + T
    out = np.empty(H)
    for h in range(H):
        kept = keep[:, h] & (lag != T)
        vals, lags = A[:, h][kept], lag[kept]
        g = torch.bincount(lags, vals, minlength=2 * T) / \
            torch.bincount(lags, minlength=2 * T).clamp(min=1)
        out[h] = 1 - float(((vals - g[lags]) ** 2).sum() / ((vals - vals.mean()) ** 2).sum())
    return out


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_every_fit_reads_the_table_on_a_model(planted, tiny_tokenizer, arch):
    """A tiny Llama (and a BERT: both triangles, one g per signed offset) whose layers are
    given a planted table: Track A (pooled, per sequence), the within-row fit, the
    previous-token score's pattern and the attention distance equal the naive fit of HF's
    softmax input plus the table."""
    T = 40
    model = tiny_loaded(arch, tiny_tokenizer)
    H = model.spec.n_heads
    terms = planted(H, 0.5)
    layers = tuple(dataclasses.replace(s, terms=terms) for s in model.spec.layers)
    model.spec = dataclasses.replace(model.spec, layers=layers)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    ref = softmax_inputs(tiny_hf_model(arch), ids)
    fit = naive_r2 if arch == "llama" else naive_signed_r2
    t, s = torch.arange(T)[:, None], torch.arange(T)[None]
    B = table(terms, T)
    detect = get_previous_token_head_detection_pattern(ids[:1])
    for layer, (A, keep, _) in enumerate(ref):
        A = torch.where(keep, A + B, 0.0)
        assert np.abs(res.r2_pooled[layer] - fit(A, keep)).max() <= 1e-6
        assert np.abs(res.r2_per_seq[2, layer] - fit(A[2:3], keep[2:3])).max() <= 1e-6
        assert np.abs(res.r2_within_pooled[layer] - naive_within_r2(A, keep)).max() <= 1e-6
        p = torch.where(keep, A, -np.inf).softmax(-1)
        distance = (p * (t - s).abs()).sum(-1).mean(0)
        assert np.abs(res.attn_distance_rows[layer] - distance.numpy()).max() <= 1e-4
        tl = [[compute_head_attention_similarity_score(
            p[x, h].float(), detect, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(H)] for x in range(len(ids))]
        assert np.abs(res.tl_prev_token[layer] - np.mean(tl, 0)).max() <= 1e-5
    assert np.isfinite(res.r2_perm_null).all()

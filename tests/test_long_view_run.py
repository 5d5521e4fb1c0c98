"""A run's long view past VIEW_TOKENS (one evaluation sequence, for the report's head
views): its block sums of the logits and of the pattern, its row normalisers and its
float16 factors against the head view's own hooked logits and pattern (an independent
path through TransformerLens's hooks) summed naively; causal, grouped-query, sliding
windows with learned sinks, ALiBi (no factors) and a bidirectional encoder; saved and
loaded; the plan counts it and full logits are not kept past VIEW_TOKENS."""

import numpy as np
import pytest
import torch
from tiny_models import arch_loaded, tiny_loaded

import poskernel_tl as pk
import poskernel_tl.reducers.logits as saved_logits
import poskernel_tl.reducers.long_view as LV
from poskernel_tl.fit.blocks import block_size, fit_mask
from poskernel_tl.measurement.result import ConditionResult

VIEW = 24  # VIEW_TOKENS in these tests (tiny models have a context of 128)
T = 100


@pytest.fixture
def short_view(monkeypatch):
    monkeypatch.setattr(LV, "VIEW_TOKENS", VIEW)
    monkeypatch.setattr(saved_logits, "VIEW_TOKENS", VIEW)


def naive(view, b: int):
    """Block sums of the hooked logits on the fitted entries and of the pattern / rows."""
    A, P = np.asarray(view.logits, np.float64), np.asarray(view.pattern, np.float64)
    n = -(-T // b)
    keep = fit_mask(T, view.two_sided, view.max_lag)
    a_sum, mass = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            block = (slice(i * b, (i + 1) * b), slice(j * b, (j + 1) * b))
            a_sum[i, j] = np.where(keep[block], A[block], 0.0).sum()
            mass[i, j] = np.nan_to_num(P[block]).sum() / len(P[block[0]])
    return a_sum, mass


@pytest.mark.parametrize("arch,factors", [("llama", True), ("gpt_oss", True),
                                          ("bloom", False), ("bert", True)])
def test_long_view_equals_the_hooked_head(arch, factors, tiny_tokenizer, short_view):
    model = tiny_loaded(arch, tiny_tokenizer) if arch in ("llama", "bert") else \
        arch_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 250, (4, T), generator=torch.Generator().manual_seed(1))
    r = pk.measure(model, ids, progress=False, logits_for=[2], seq_id=[7, 8, 9, 10],
                   batch_size=2)
    part = r.parts["long_view"]
    assert part.seq_id == 9 and not r.logits  # no full logits past VIEW_TOKENS
    b, n = block_size(T)
    assert part.logit_sum.shape == (model.spec.n_layers, model.spec.n_heads, n, n)
    assert (part.q is not None) == factors
    for layer, head in ((0, 0), (1, 3)):
        view = pk.inspect_head(model, ids[2].tolist(), layer, head)
        a_sum, mass = naive(view, b)
        np.testing.assert_allclose(part.logit_sum[layer, head], a_sum, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(part.mass[layer, head], mass, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(part.mass[layer, head].sum(-1), 1.0, atol=1e-4) \
            if arch != "gpt_oss" else None  # sinks take a share of each row
        lse = part.lse[layer, head].astype(np.float64)
        P, A = np.asarray(view.pattern, np.float64), np.asarray(view.logits, np.float64)
        kept = np.isfinite(A) & fit_mask(T, view.two_sided, view.max_lag)
        np.testing.assert_allclose(np.exp(A - lse[:, None])[kept], P[kept], atol=1e-5)
        if factors:
            kv = int(model.kv_heads[head])
            q = part.q[layer, head].astype(np.float64)
            k = part.k[layer, kv].astype(np.float64)
            A16 = model.logit_scale * q @ k.T
            size = np.abs(A[kept]).max()
            assert np.abs(A16 - A)[kept].max() / size < 5e-3
            assert part.factor_err[layer, head] < 5e-3


def test_long_view_is_saved_loaded_and_planned(tiny_tokenizer, short_view, tmp_path):
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 250, (4, T), generator=torch.Generator().manual_seed(2))
    r = pk.measure(model, ids, progress=False, logits_for=[0], batch_size=2)
    r.save(tmp_path)
    back = ConditionResult.load(tmp_path, r.model, r.dataset, r.length)
    a, b = r.parts["long_view"], back.parts["long_view"]
    for field in ("logit_sum", "mass", "lse", "q", "k", "factor_err"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert b.seq_id == 0
    from poskernel_tl.plan.batching import Workload
    work = Workload(length=T, n_eval=4, n_centering=0, n_logits=1)
    assert LV.state_bytes(model, work) > 0 and saved_logits.logit_bytes(model, T, 1) == 0
    assert "long_view" not in pk.measure(model, ids, progress=False, batch_size=2).parts

"""A run's long view past VIEW_TOKENS (one evaluation sequence, for the report's head
views): its block sums of the logits and of the pattern, its row normalisers and its
float16 factors against the head view's own hooked logits and pattern (an independent
path through TransformerLens's hooks) summed naively; causal, grouped-query, sliding
windows with learned sinks, ALiBi (no factors), a chunked mask that binds (Llama 4's
chunks of 64 at T = 100) and a bidirectional encoder; saved and
loaded; the plan counts it and full logits are not kept past VIEW_TOKENS."""

import numpy as np
import pytest
import torch
from tiny_models import arch_loaded, tiny_loaded

import poskernel_tl as pk
import poskernel_tl.statistics.logits as saved_logits
import poskernel_tl.statistics.long_view as LV
from poskernel_tl.fit.blocks import block_size, fit_mask
from poskernel_tl.mask import Mask
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
    keep = fit_mask(view.mask)
    a_sum, mass = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            block = (slice(i * b, (i + 1) * b), slice(j * b, (j + 1) * b))
            a_sum[i, j] = np.where(keep[block], A[block], 0.0).sum()
            mass[i, j] = np.nan_to_num(P[block]).sum() / len(P[block[0]])
    return a_sum, mass


@pytest.mark.parametrize("arch,factors", [("llama", True), ("gpt_oss", True),
                                          ("bloom", False), ("bert", True), ("llama4", False)])
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
        kept = np.isfinite(A) & fit_mask(view.mask)
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


def _file_payload(path):
    import json
    import re
    text = path.read_text(encoding="utf-8")
    return json.loads(re.search(r"=\s*(\{.*\})\s*;?\s*$", text, re.S).group(1))


def test_report_opens_a_long_head_and_zooms(tiny_tokenizer, short_view, tmp_path):
    """The report writes each head's overview file (≈ its overview, g and notes) and the
    zoom's q/k files; the overview is the hooked head's block means; in Chromium the head
    opens on its overview, and a permalink's zoom loads q and k and shows that window."""
    import base64
    import zlib

    from browser import find_chromium, load_page

    from poskernel_tl.report.build import build_report
    from poskernel_tl.report.viewer_data import condition_key

    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 250, (4, T), generator=torch.Generator().manual_seed(3))
    r = pk.measure(model, ids, progress=False, logits_for=[0], batch_size=2, dataset="prose")
    r.save(tmp_path)
    page = build_report(tmp_path, workers=1)
    folder = tmp_path / "report" / "data" / r.stem()
    assert {p.name for p in folder.iterdir()} >= {"L1H2.js", "Q1H2.js", "K1G1.js"}
    head = _file_payload(folder / "L1H2.js")["long"]
    spec = head["logits"]
    got = np.frombuffer(zlib.decompress(base64.b64decode(spec["b64"])), "<f2").reshape(
        spec["shape"]).astype(np.float64)
    view = pk.inspect_head(model, ids[0].tolist(), 1, 2)
    b, _ = block_size(T)
    a_sum, _ = naive(view, b)
    count = np.array([[fit_mask(Mask(T))[i * b:(i + 1) * b, j * b:(j + 1) * b].sum()
                       for j in range(got.shape[1])] for i in range(got.shape[0])])
    want = np.where(count > 0, a_sum / np.maximum(count, 1), np.nan)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    if find_chromium() is None:
        pytest.skip("headless Chromium not found")
    key = condition_key(r.model, r.dataset, r.length)
    opened = load_page(page, budget_ms=8000, fragment=f"{key}/L1H2")
    assert opened.probe == [] and opened.console == [], (opened.probe, opened.console)
    assert 'data-pk-long="100"' in opened.dom_text and "loads this head's q and k" in \
        opened.dom_text
    zoomed = load_page(page, budget_ms=8000, fragment=f"{key}/L1H2/zoom=50-80,10-40")
    assert zoomed.probe == [] and zoomed.console == [], (zoomed.probe, zoomed.console)
    zoom = zoomed.dom.find_all("div", class_="pk-zoom")[0]
    assert zoom.attrs["data-pk-window"] == "50,80,10,40"
    strips = {n.attrs["data-pk-zoom"]: n for n in zoom.find_all("div", class_="pk-tokstrip")}
    assert [s.attrs["data-pos"] for s in strips["rows"].find_all("span")] == \
        [str(i) for i in range(50, 81)]

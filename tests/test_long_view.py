"""A head view past ``max_tokens``: the overview's block reduction against a naive numpy
computation (causal, sliding window, bidirectional; T not a multiple of the block), the
row normaliser, the zoom's factors and their fallback, and in headless Chromium the zoom
showing the tokens of the window its permalink asks for, hostile tokens staying text."""

import base64
import re
import zlib

import numpy as np
import pytest
from browser import find_chromium, load_page
from scipy.special import logsumexp

from poskernel_tl.fit.blocks import fit_mask
from poskernel_tl.fit.one_matrix import matrix_fit
from poskernel_tl.mask import Mask
from poskernel_tl.report import viewer_long as VL
from poskernel_tl.report.viewer import (
    HeadPageData,
    head_payload,
    write_head_page,
    zoom_payload,
)

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="headless Chromium not found")
EVIL = "<img src=x onerror=alert(5)>"


def planted(T: int, d: int = 16, seed: int = 0, two_sided: bool = False, last=None,
            factor: bool = True) -> HeadPageData:
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((T, d)).astype(np.float32), rng.standard_normal((T, d)).astype(
        np.float32)
    scale = 0.25
    A = scale * (q.astype(np.float64) @ k.T.astype(np.float64))
    if not factor:  # a ramp on top: not scale·q·kᵀ any more
        A = A - 0.5 * np.abs(np.arange(T)[:, None] - np.arange(T)[None])
    allowed = np.ones((T, T), bool) if two_sided else np.tril(np.ones((T, T), bool))
    if last is not None:  # |t − s| ≤ last (on each side it keeps)
        allowed &= np.abs(np.arange(T)[:, None] - np.arange(T)[None]) <= last
    a = np.where(allowed, A, -np.inf)
    P = np.exp(a - logsumexp(a, axis=1, keepdims=True))
    logits = np.where(np.tril(np.ones((T, T), bool)) | two_sided, A, np.nan).astype(np.float32)
    tokens = [EVIL if i % 11 == 0 else f" tok{i}" for i in range(T)]
    return HeadPageData(title=f"planted T={T}", tokens=tokens, pattern=P.astype(np.float32),
                        logits=logits, two_sided=two_sided, last=last, q=q, k=k,
                        logit_scale=scale)


def naive_maps(logits, pattern, keep, g, g_back, b):
    T = len(logits)
    t, s = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    lag = t - s
    fit = np.full((T, T), np.nan)
    fit[lag > 0] = np.asarray(g, np.float64)[lag[lag > 0] - 1]
    if g_back is not None:
        fit[lag < 0] = np.asarray(g_back, np.float64)[-lag[lag < 0] - 1]
    n = -(-T // b)
    out = {k: np.full((n, n), np.nan) for k in ("logits", "fit", "residual", "mass")}
    for i in range(n):
        for j in range(n):
            rows, cols = slice(i * b, (i + 1) * b), slice(j * b, (j + 1) * b)
            kk = keep[rows, cols] & np.isfinite(fit[rows, cols])
            a, f = np.asarray(logits[rows, cols], np.float64), fit[rows, cols]
            if kk.any():
                out["logits"][i, j] = a[kk].mean()
                out["fit"][i, j] = f[kk].mean()
                out["residual"][i, j] = (a - f)[kk].mean()
            out["mass"][i, j] = np.nan_to_num(pattern[rows, cols].astype(np.float64)).sum() / len(a)
    return out


@pytest.mark.parametrize("T,n_blocks,two_sided,last", [
    (100, 16, False, None), (97, 10, False, 20), (61, 8, True, None), (40, 64, False, None),
    (61, 8, True, 12)])
def test_overview_equals_a_naive_reduction(T, n_blocks, two_sided, last):
    data = planted(T, two_sided=two_sided, last=last)
    mask = Mask(T, not two_sided, last)
    _, g, g_back = matrix_fit(data.logits, mask)
    keep = fit_mask(mask)
    b, maps = VL.overview_maps(data.logits, data.pattern, g, g_back, mask, n_blocks)
    assert b == max(1, -(-T // n_blocks))
    want = naive_maps(data.logits, data.pattern, keep, g, g_back, b)
    for key in want:
        np.testing.assert_allclose(maps[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(maps["mass"].sum(axis=1), 1.0, rtol=1e-5)  # rows sum to 1


def test_row_normaliser_and_factor_check():
    data = planted(50, last=9)
    lse = VL.row_lse(data.logits, Mask(50, True, 9))
    t, s = np.meshgrid(np.arange(50), np.arange(50), indexing="ij")
    a = np.where((t - s >= 0) & (t - s <= 9), data.logits.astype(np.float64), -np.inf)
    np.testing.assert_allclose(lse, logsumexp(a, axis=1), rtol=1e-6)
    check = VL.factor_check(data.logits, data.pattern, data.q, data.k, data.logit_scale, lse,
                            fit_mask(Mask(50, True, 9)))
    assert check["rel_err"] < VL.FACTOR_TOL and check["pattern_err"] < 1e-2


def decode(spec):
    raw = base64.b64decode(spec["b64"])
    raw = zlib.decompress(raw) if spec.get("z") else raw
    return np.frombuffer(raw, "<" + spec["dtype"]).reshape(spec["shape"])


def test_payload_carries_overview_and_factors_past_max_tokens():
    data = planted(300)
    p = head_payload(data, max_tokens=256)
    assert p["seq"] is None and p["long"]["T"] == 300 and p["long"]["tokens"] == data.tokens
    L = p["long"]
    assert decode(L["q"]).shape == (300, 16) and decode(L["lse"]).shape == (300,)
    assert decode(L["logits"]).shape == (L["n"], L["n"]) and L["block"] == 2
    assert any("zoom" in n.lower() for n in p["notes"])
    short = head_payload(planted(300), max_tokens=400)  # under the limit: the full matrices
    assert short["long"] is None and short["seq"]["T"] == 300
    bent = head_payload(planted(300, factor=False), max_tokens=256)
    assert bent["long"]["q"] is None and any("zoom is off" in n for n in bent["notes"])


def test_page_stays_light(tmp_path):
    """At T = 2048 the page is the assets (≈ 5 MB without circuitsvis) plus ≈ T·d·8 bytes
    of factors: at T = 8192 and d_head = 64 that is ≤ 10 MB (measured in the README)."""
    data = planted(2048, d=64)
    page = write_head_page(tmp_path / "long.html", data, assets_rel=None)
    size = page.stat().st_size
    assert "browser bundle" not in page.read_text(encoding="utf-8")  # no circuitsvis inlined
    assert size < 8e6, size


@needs_chromium
def test_zoom_shows_the_tokens_of_the_window_asked_for(tmp_path):
    data = planted(600)
    page = write_head_page(tmp_path / "long.html", data, assets_rel=None)
    run = load_page(page, budget_ms=8000, fragment="zoom=300-555,200-455")
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    strips = {n.attrs["data-pk-zoom"]: n for n in run.dom.find_all("div", class_="pk-tokstrip")
              if "data-pk-zoom" in n.attrs}
    rows = [s.text() for s in strips["rows"].find_all("span")]
    keys = [s.text() for s in strips["keys"].find_all("span")]
    assert rows == data.tokens[300:556] and keys == data.tokens[200:456]
    assert not [n for n in run.dom.find_all("img") if n.attrs.get("src") == "x"]
    zoom = run.dom.find_all("div", class_="pk-zoom")[0]
    assert zoom.attrs["data-pk-window"] == "300,555,200,455"
    for fragment in ("zoom=300-9999,0-10", "zoom=<img src=x onerror=alert(1)>",  # ignored
                     "zoom=5-1,0-10", "zoom=0-600,0-600", "zoom=%E0%A4%A"):
        bad = load_page(page, budget_ms=6000, fragment=fragment)
        assert bad.probe == [] and bad.console == [], (fragment, bad.probe, bad.console)
        assert not [n for n in bad.dom.find_all("img") if n.attrs.get("src") == "x"]
        window = bad.dom.find_all("div", class_="pk-zoom")[0].attrs["data-pk-window"]
        assert window == "0,255,0,255", fragment
    assert re.search(r"overview of \d+ × \d+ blocks", run.dom_text)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_real_head_view_zooms_from_its_own_q_and_k(arch, tiny_tokenizer):
    """On a tiny model booted as a bridge (grouped-query llama, GPT-2), the view's q and k
    times the logit scale are its hooked logits: a view longer than ``max_tokens`` gets the
    zoom, its normaliser gives the hooked pattern."""
    from tiny_models import tiny_loaded

    from poskernel_tl.apps.head_view import inspect_head

    model = tiny_loaded(arch, tiny_tokenizer, compatibility_mode=False)
    ids = np.random.default_rng(0).integers(3, 250, 120)
    view = inspect_head(model, ids.tolist(), 1, 3)
    p = head_payload(view.page_data(), max_tokens=64)
    L = p["long"]
    assert L is not None and L["q"] is not None, p["notes"]
    assert L["check"]["rel_err"] < 1e-3 and L["check"]["pattern_err"] < 1e-2
    assert decode(L["q"]).shape == view.q.shape == view.k.shape
    lse = decode(L["lse"]).astype(np.float64)
    t, s = 100, np.arange(101)
    a = view.logit_scale * (view.q[t].astype(np.float64) @ view.k[s].T.astype(np.float64))
    np.testing.assert_allclose(np.exp(a - lse[t]), view.pattern[t, :101], atol=1e-4)


def test_a_notebook_view_carries_one_window_and_zoom_draws_any_other():
    """Over the notebook's budget a view carries q, k and lse of its first window only
    (rows of q, keys of k, with their offsets) and says how to draw another; ``zoom``
    carries exactly the window asked for, whose logits are the view's."""
    data = planted(600)
    whole = head_payload(data, factor_budget=VL.factor_bytes(600, 16))["long"]
    assert decode(whole["q"]).shape == (600, 16) and "hint" not in whole
    L = head_payload(data, factor_budget=VL.factor_bytes(600, 16) - 1)["long"]
    assert decode(L["q"]).shape == decode(L["k"]).shape == (256, 16)
    assert (L["qFrom"], L["kFrom"], L["start"]) == (0, 0, [0, 255, 0, 255])
    assert "view.zoom(" in L["hint"] and decode(L["logits"]).shape == (L["n"], L["n"])
    z = zoom_payload(data, (300, 555, 200, 455))
    Z = z["long"]
    assert z["zoomOnly"] and Z["overview"] is False and "logits" not in Z
    assert (Z["qFrom"], Z["kFrom"]) == (300, 200) and decode(Z["lse"]).shape == (256,)
    q, k = decode(Z["q"]).astype(np.float64), decode(Z["k"]).astype(np.float64)
    np.testing.assert_array_equal(q, data.q[300:556].astype(np.float16))
    A = Z["scale"] * q @ k.T
    lag = np.arange(300, 556)[:, None] - np.arange(200, 456)[None]
    want = data.logits[300:556, 200:456]
    np.testing.assert_allclose(A[lag > 0], want[lag > 0], atol=0.02)
    lse = VL.row_lse(data.logits, Mask(len(data.tokens)))[300:556]
    np.testing.assert_allclose(decode(Z["lse"]), lse, rtol=1e-6)
    for bad in ((300, 9999, 0, 10), (5, 1, 0, 10), (0, 600, 0, 600), (-1, 10, 0, 10)):
        with pytest.raises(ValueError):
            VL.factor_window(600, bad)


def test_head_view_notebook_display_uses_the_budget(monkeypatch):
    """``HeadView._repr_html_`` hands the notebook budget to the page; ``zoom`` checks its
    window before anything is drawn."""
    import poskernel_tl.report.html as report_html
    from poskernel_tl.apps import head_view as HV

    monkeypatch.setattr(report_html, "SHOWN", set())  # a fresh notebook session
    seen = {}
    monkeypatch.setattr(HV, "head_html", lambda data, **kw: seen.update(kw) or "")
    view = HV.HeadView.__new__(HV.HeadView)
    monkeypatch.setattr(HV.HeadView, "page_data", lambda self: planted(300))
    view._repr_html_()
    assert seen["factor_budget"] == VL.NOTEBOOK_FACTOR_BYTES
    assert view.zoom((10, 40)).window == (10, 40, 10, 40)
    with pytest.raises(ValueError, match="not inside"):
        view.zoom((0, 299), (0, 9999))


@needs_chromium
def test_notebook_views_zoom_within_what_they_carry(tmp_path):
    """A first view (the assets), a later view carrying one window, and a zoom of another
    window, on one page as a notebook shows them: the later view draws its window (a
    permalink outside it is ignored) and names ``view.zoom``; the zoom shows its tokens."""
    from poskernel_tl.apps.head_zoom import HeadZoom
    from poskernel_tl.report.html import page_html
    from poskernel_tl.report.viewer import SHARED, head_html

    data = planted(600)
    blocks = [head_html(planted(300, seed=1), assets_rel=None, lean=True),
              head_html(data, assets_rel=SHARED, factor_budget=1000),
              HeadZoom.of(data, (300, 555), (200, 455)).to_html(assets_rel=SHARED)]
    page = tmp_path / "notebook.html"
    page.write_text(page_html("notebook", "".join(blocks)), encoding="utf-8")
    run = load_page(page, budget_ms=8000, fragment="zoom=300-555,200-455")
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    windows = [z.attrs["data-pk-window"] for z in run.dom.find_all("div", class_="pk-zoom")]
    assert windows == ["0,255,0,255", "0,255,0,255", "300,555,200,455"]  # the first: T = 300
    heads = run.dom.find_all("div", class_="pk-head")
    assert "view.zoom(" in heads[1].text() and "overview of" not in heads[2].text()
    strips = {n.attrs["data-pk-zoom"]: n for n in heads[2].find_all("div", class_="pk-tokstrip")}
    assert [s.text() for s in strips["rows"].find_all("span")] == data.tokens[300:556]
    assert [s.text() for s in strips["keys"].find_all("span")] == data.tokens[200:456]
    assert not [n for n in run.dom.find_all("img") if n.attrs.get("src") == "x"]
    saved = HeadZoom.of(data, (10, 40)).save(tmp_path / "zoom.html")  # a page of its own
    alone = load_page(saved, budget_ms=8000)
    assert alone.probe == [] and alone.console == [], (alone.probe, alone.console)
    assert alone.dom.find_all("div", class_="pk-zoom")[0].attrs["data-pk-window"] == \
        "10,40,10,40"

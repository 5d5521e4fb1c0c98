"""One head outside the report (a notebook cell, a saved page): the same viewer drawn from
an inline payload, its assets inline or shared, text escaped, and (when Chromium is
installed) rendered in a real headless browser from file://."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from browser import find_chromium, load_page, parse_html

from poskernel_tl import report
from poskernel_tl.fit.one_matrix import matrix_fit
from poskernel_tl.report import viewer as VW

EVIL = "<script>alert(1)</script>"
NASTY = [EVIL, '"double" \'single\'', "back\\slash", "</div>", "</script>",
         "<img src=x onerror=alert(2)>", "a&amp;b", "\u2028line", " é"]
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not found: apt-get install chromium (or set POSKERNEL_CHROMIUM)")


def planted(T: int, seed: int = 0) -> report.HeadPageData:
    """Tokens with the nasty strings, Toeplitz-planted logits and their causal pattern."""
    rng = np.random.default_rng(seed)
    tokens = [f" w{rng.integers(1000)}" for _ in range(T)]
    for i, s in enumerate(NASTY):
        tokens[(3 + 7 * i) % T] = s
    lag = np.subtract.outer(np.arange(T), np.arange(T))
    g_true = 2.0 * np.exp(-np.abs(lag) / 6.0) + 0.5 * np.cos(0.4 * lag)
    logits = g_true + 0.2 * rng.standard_normal((T, T))
    logits[lag < 0] = np.finfo(np.float32).min  # what hook_attn_scores holds there
    x = np.where(lag >= 0, logits, -np.inf)
    pattern = np.exp(x - x.max(1, keepdims=True))
    pattern /= pattern.sum(1, keepdims=True)
    omega = np.linspace(0, np.pi, 2 * T + 1)
    return report.HeadPageData(
        title=f"tiny · L0H1 {EVIL}", tokens=tokens, pattern=pattern.astype(np.float32),
        logits=logits.astype(np.float32), g_trackA=g_true[1:, 0], g_trackB=0.8 * g_true[1:, 0],
        spectrum=(omega, 1 / (1 + (10 * omega) ** 2)), thetas=1e4 ** (-np.arange(8) / 8),
        tables={"Track A": pd.DataFrame({"R2_pooled": [0.9], "text": [EVIL]})},
        r2_values={"R2_pooled": 0.9}, per_seq_r2=rng.uniform(0.6, 1.0, 24), notes=[EVIL])


def payload_of(html: str) -> dict:
    blocks = re.findall(r'<script type="application/json" id="[^"]*">(.*?)</script>', html,
                        flags=re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def test_inline_and_shared_assets(tmp_path):
    data = planted(40)
    inline = report.head_html(data, assets_rel=None)
    assert "Plotly" in inline and "var CircuitsVis" in inline and "<style>" in inline
    shared = report.head_html(data, assets_rel="assets")
    assert '<script src="assets/circuitsvis.js"></script>' in shared
    assert '<script src="assets/plotly.min.js"></script>' in shared and len(shared) < 200_000
    folder = report.write_assets(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(VW.ASSET_NAMES)
    assert (folder / "plotly.min.js").stat().st_size > 1_000_000
    mtime = (folder / "viewer.js").stat().st_mtime_ns
    report.write_assets(tmp_path)
    assert (folder / "viewer.js").stat().st_mtime_ns == mtime  # unchanged files stay
    assert report.assets_rel_for(tmp_path / "a" / "b.html", tmp_path) == "../assets"
    with pytest.raises(ValueError, match="relative"):
        report.head_html(data, assets_rel="https://cdn.example/x")


def test_payload_is_escaped_and_carries_the_numbers():
    data = planted(40)
    html = report.head_html(data, assets_rel="assets")
    assert EVIL not in html and "<img src=x" not in html
    assert html.lower().count("<script") == html.lower().count("</script>")
    p = payload_of(html)
    assert p["seq"]["tokens"] == data.tokens and p["title"] == data.title
    r2, g, back = matrix_fit(data.logits)
    assert back is None  # one-sided unless two_sided
    assert p["numbers"][0][2] == pytest.approx(r2)
    assert p["tables"][0]["rows"][0] == ["0.9", EVIL]
    short = payload_of(report.head_html(data, assets_rel="assets", max_tokens=12))
    assert short["seq"]["T"] == 12 and "first 12 of 40 tokens" in short["notes"][-1]
    with pytest.raises(ValueError, match="39 tokens"):
        report.HeadPageData(title="x", tokens=data.tokens[:39], pattern=data.pattern,
                            logits=data.logits)


@needs_chromium
def test_probe_sees_dialogs_and_errors(tmp_path):
    """Control: the checks below are not vacuous."""
    page = tmp_path / "unsafe.html"
    page.write_text("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>"
                    f"<p>{EVIL}</p><script>undefinedFunction();</script></body></html>",
                    encoding="utf-8")
    run = load_page(page)
    kinds = [r["kind"] for r in run.probe]
    assert "dialog" in kinds and "error" in kinds, run.probe
    assert any("undefinedFunction" in m for m in run.console)


@needs_chromium
@pytest.mark.parametrize("inline", [True, False])
def test_saved_head_view_renders_in_chromium(tmp_path, inline):
    data = planted(48)
    assets = None
    if not inline:
        report.write_assets(tmp_path)
        assets = report.assets_rel_for(tmp_path / "head.html", tmp_path)
    page = report.write_head_page(tmp_path / "head.html", data, assets_rel=assets)
    run = load_page(page, budget_ms=6000)
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    head = run.dom.find_all("div", class_="pk-head")[0]
    assert head.attrs["data-pk-state"] == "drawn"
    box = head.find_all("div", class_="pk-cv")[0]
    assert box.attrs["data-pk-state"] == "mounted" and box.attrs["data-pk-cells"] == str(48 * 48)
    assert [s.text() for s in run.dom.find_all("span", class_="pk-tok")] == data.tokens
    assert not run.dom.find_all("img", src="x") and not run.dom.find_all("b")
    plots = head.find_all("div", class_="js-plotly-plot")
    assert len(plots) == 7  # 3 matrices, 2 g(Δ), the spectrum, per-sequence R²
    for plot in plots:  # something drawn: a heatmap image, a line or bars, not bare axes
        drawn = [n for n in plot.find_all("path") if "js-line" in n.attrs.get("class", "")
                 and len(n.attrs.get("d", "")) > 20] + plot.find_all("image") + \
            [n for n in plot.find_all("g") if n.attrs.get("class", "") == "point"]
        assert drawn, "a plot of the head view has axes but no data"
    cells = [td.text() for td in parse_html(run.dom_text).find_all("td")]
    assert EVIL in cells

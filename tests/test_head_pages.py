"""Head and layer pages: escaping, the shared circuitsvis bundle, sizes, and (when
Chromium is installed) rendering in a real headless browser from file://."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from browser import find_chromium, load_page, parse_html, screenshot
from matplotlib.figure import Figure

from poskernel_tl import report
from poskernel_tl.report import html as rhtml

EVIL = "<script>alert(1)</script>"
NASTY = [EVIL, '"double" \'single\'', "back\\slash", "</div>", "</script>",
         "<img src=x onerror=alert(2)>", "a&amp;b", "\u2028line", " é"]
T = 256
N_HEADS = 9


def planted(T: int, seed: int = 0):
    """Tokens (with the nasty strings), Toeplitz-planted logits and their causal pattern."""
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
    g = g_true[np.arange(1, T), 0]
    return tokens, logits.astype(np.float32), pattern.astype(np.float32), g


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A small report: the bundle once, one layer page and three head pages."""
    root = tmp_path_factory.mktemp("report")
    bundle = report.write_assets(root)
    (root / "report.html").write_text("<!DOCTYPE html><title>report</title>", encoding="utf-8")
    tokens, logits, pattern, g = planted(T)
    folder = root / "heads" / "tiny" / "random_256"
    names = [f"L0H{h}" for h in range(N_HEADS)]
    names[2] = "<b>L0H2</b>"
    rng = np.random.default_rng(1)
    patterns = np.stack([pattern] * N_HEADS)
    layer = report.render_layer_page(
        folder / "L0.html", title=f"tiny · layer 0 {EVIL}", tokens=tokens, patterns=patterns,
        head_names=names, assets_rel=report.assets_rel_for(folder / "L0.html", root),
        links={f"L0H{h}": f"L0H{h}.html" for h in range(2)})
    heads = []
    for h in range(2):
        page = folder / f"L0H{h}.html"
        table = pd.DataFrame({"model": ["tiny"], "layer": [0], "head": [h],
                              "R2_pooled": [0.9], "text": [EVIL]})
        heads.append(report.render_head_page(
            page, title=f"tiny · random · T={T} · L0H{h}", tokens=tokens, pattern=pattern,
            logits=logits, g_trackA=g, g_trackB=0.8 * g, thetas=1e4 ** (-np.arange(32) / 32),
            spectrum=(np.linspace(0, np.pi, 129), 1 / (1 + np.linspace(0, 30, 129) ** 2)),
            tables={"Track A": table}, r2_values={"R2_pooled": 0.9, "R2_gram": 0.95},
            per_seq_r2=rng.uniform(0.6, 1.0, 24),
            assets_rel=report.assets_rel_for(page, root),
            links={"layer 0": "L0.html", "report": "../../../report.html"}))
    return {"root": root, "bundle": bundle, "layer": layer, "heads": heads,
            "tokens": tokens, "pattern": pattern, "names": names}


def cv_payload(text: str) -> dict:
    blocks = re.findall(r'<script type="application/json" id="[^"]*">(.*?)</script>', text,
                        flags=re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def decode(matrix: dict) -> np.ndarray:
    out = np.zeros(matrix["shape"])
    rows = out.reshape(-1, out.shape[-1])
    flat = matrix["data"]
    for _ in range(len(matrix["shape"]) - 2):
        flat = [row for block in flat for row in block]
    for i, row in enumerate(flat):
        rows[i, : len(row)] = np.asarray(row) / matrix["scale"]
    return out


# ------------------------------------------------------------------ without a browser


def test_bundle_written_once_and_loaded_by_relative_path(site):
    bundle = site["bundle"]
    assert bundle == site["root"] / "assets" / "circuitsvis.js"
    text = bundle.read_text(encoding="utf-8")
    assert "var CircuitsVis" in text and len(text) > 1_000_000
    assert "sourceMappingURL" not in text
    mtime = bundle.stat().st_mtime_ns
    assert report.write_assets(site["root"]) == bundle and bundle.stat().st_mtime_ns == mtime
    # the file circuitsvis' local_src inlines: the same code either way
    cut = rhtml._bundle_from_local_src()
    assert cut[:2000] in text and len(cut) > 1_000_000
    for page in [site["layer"], *site["heads"]]:
        page_text = page.read_text(encoding="utf-8")
        assert "var CircuitsVis" not in page_text
        assert '<script src="../../../assets/circuitsvis.js"></script>' in page_text
        assert (page.parent / "../../../assets/circuitsvis.js").resolve() == bundle.resolve()


def test_no_network_urls(site):
    for page in [site["layer"], *site["heads"]]:
        text = page.read_text(encoding="utf-8").lower()
        assert "http://" not in text and "https://" not in text and 'src="//' not in text
    for href in ("https://example.org/", "javascript:alert(1)", "/etc/passwd"):
        with pytest.raises(ValueError, match="relative"):
            report.render_layer_page(
                site["root"] / "x.html", title="x", tokens=["a", "b", "c"],
                patterns=np.eye(3, dtype=np.float32)[None], head_names=["h"],
                assets_rel="assets", links={"x": href})


def test_json_for_script_escapes_and_round_trips():
    text = report.json_for_script({"tokens": NASTY})
    assert not set("<>&") & set(text) and "</" not in text
    assert "\u2028" not in text
    assert json.loads(text) == {"tokens": NASTY}


def test_pages_escape_tokens_and_tables(site):
    for page in [site["layer"], *site["heads"]]:
        text = page.read_text(encoding="utf-8")
        assert EVIL not in text and "<img src=x" not in text and "<b>L0H2" not in text
        assert text.lower().count("<script") == text.lower().count("</script>")
        # the tokens travel unchanged inside the escaped JSON
        shown = 64 if page == site["layer"] else T
        assert cv_payload(text)["props"]["tokens"] == site["tokens"][:shown]
        # ... and are listed as text
        spans = parse_html(text).find_all("span", class_="pk-tok")
        assert [s.text() for s in spans] == site["tokens"]
    head = site["heads"][0].read_text(encoding="utf-8")
    cells = [td.text() for td in parse_html(head).find_all("td")]
    assert EVIL in cells


def test_pattern_payload_is_rounded_compact_and_exact(site):
    payload = cv_payload(site["heads"][0].read_text(encoding="utf-8"))
    assert payload["component"] == "AttentionPattern"
    matrix = payload["matrices"]["attention"]
    assert matrix["shape"] == [T, T]
    assert all(len(row) <= t + 1 for t, row in enumerate(matrix["data"]))  # causal: trimmed
    np.testing.assert_allclose(decode(matrix), site["pattern"], atol=5e-4 + 1e-9)
    layer = cv_payload(site["layer"].read_text(encoding="utf-8"))
    assert layer["component"] == "AttentionHeads"
    assert layer["props"]["attentionHeadNames"] == site["names"]
    assert layer["matrices"]["attention"]["shape"] == [N_HEADS, 64, 64]  # truncated
    np.testing.assert_allclose(decode(layer["matrices"]["attention"]),
                               np.stack([site["pattern"][:64, :64]] * N_HEADS), atol=5e-4)
    assert "first 64 of 256 tokens" in site["layer"].read_text(encoding="utf-8")


def test_page_sizes(site):
    head = site["heads"][0].stat().st_size
    layer = site["layer"].stat().st_size
    print(f"\n256-token head page: {head / 1e3:.0f} kB; {N_HEADS}-head layer page "
          f"(64 tokens shown): {layer / 1e3:.0f} kB; bundle "
          f"{site['bundle'].stat().st_size / 1e6:.2f} MB (once)")
    assert head < 500_000 and layer < 500_000


def test_toeplitz_fit_recovers_planted_kernel():
    T = 40
    g = np.cos(0.3 * np.arange(1, T)) + 0.1 * np.arange(1, T)
    lag = np.subtract.outer(np.arange(T), np.arange(T))
    A = np.where(lag > 0, g[np.clip(lag, 1, None) - 1], -1e30)
    fit = report.toeplitz_fit(A)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(fit.g, g, atol=1e-12)
    assert np.nanmax(np.abs(fit.residual)) < 1e-9
    assert np.isnan(fit.fitted[np.triu_indices(T)]).all()


def test_figures_are_figures_and_leave_pyplot_alone(site):
    import sys

    tokens, logits, pattern, g = planted(32)
    before = sys.modules.get("matplotlib.pyplot")
    figs = [report.fig_logits_fit(logits), report.fig_kernel(g, None),
            report.fig_spectrum(np.linspace(0, 3, 50), np.ones(50), np.array([0.1, 1.0])),
            report.fig_r2_distribution(np.array([0.5, 0.7, np.nan]), {"R2_pooled": 0.6})]
    assert all(isinstance(f, Figure) for f in figs)
    assert sys.modules.get("matplotlib.pyplot") is before


def test_bad_inputs_are_refused(tmp_path):
    tokens, logits, pattern, g = planted(8)
    with pytest.raises(ValueError, match="7 tokens"):
        report.render_head_page(tmp_path / "x.html", title="x", tokens=tokens[:7],
                                pattern=pattern, logits=logits, assets_rel="a")
    with pytest.raises(ValueError, match="finite"):
        report.attention_pattern_html(tokens, np.full((8, 8), np.nan), assets_rel="a")
    with pytest.raises(ValueError, match="relative"):
        report.attention_pattern_html(tokens, pattern, assets_rel="/abs/assets")


# ------------------------------------------------------------------ in headless Chromium

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not found: apt-get install chromium (or set POSKERNEL_CHROMIUM)")


def assert_clean(run):
    assert run.probe == [], f"page recorded errors or dialogs: {run.probe}"
    assert run.console == [], f"console messages: {run.console}"


def mounted(run) -> "list":
    boxes = run.dom.find_all("div", class_="pk-cv")
    assert len(boxes) == 1
    box = boxes[0]
    assert box.attrs.get("data-pk-state") == "mounted", box.text()
    return box


@needs_chromium
def test_probe_sees_dialogs_errors_and_missing_mounts(tmp_path):
    """Control: the checks below are not vacuous. A page that does run injected markup
    records the alert, and a script error shows up in the probe and the console."""
    page = tmp_path / "unsafe.html"
    page.write_text("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>"
                    f"<p>{EVIL}</p><script>undefinedFunction();</script></body></html>",
                    encoding="utf-8")
    run = load_page(page)
    kinds = [r["kind"] for r in run.probe]
    assert "dialog" in kinds and "error" in kinds, run.probe
    assert any("alert: 1" in r["msg"] for r in run.probe)
    assert any("undefinedFunction" in m for m in run.console)
    assert not run.dom.find_all("div", class_="pk-cv")


@needs_chromium
def test_head_page_renders_in_chromium(site):
    run = load_page(site["heads"][1])
    assert_clean(run)
    box = mounted(run)
    canvases = box.find_all("canvas", role="img")
    assert len(canvases) == 1  # circuitsvis AttentionPattern draws one chart canvas
    assert int(box.attrs["data-pk-cells"]) == T * T
    expected = np.rint(site["pattern"].astype(np.float64) * 1000).sum() / 1000
    assert float(box.attrs["data-pk-sum"]) == pytest.approx(expected, abs=1e-3)
    # the nasty tokens are text nodes, and nothing they contain ran or became an element
    spans = [s.text() for s in run.dom.find_all("span", class_="pk-tok")]
    assert spans == site["tokens"]
    assert not run.dom.find_all("img", src="x") and not run.dom.find_all("b")
    scripts = [s.text().strip() for s in run.dom.find_all("script")
               if s.attrs.get("type") != "application/json"]
    assert not any(s.startswith("alert(") for s in scripts)
    assert len(run.dom.find_all("img", class_="pk-fig")) == 4
    # links resolve to files
    for a in run.dom.find_all("a"):
        target = (site["heads"][1].parent / a.attrs["href"]).resolve()
        assert target.is_file(), a.attrs["href"]


@needs_chromium
def test_layer_page_renders_in_chromium_and_links_to_head_pages(site):
    run = load_page(site["layer"])
    assert_clean(run)
    box = mounted(run)
    # AttentionHeads: one thumbnail canvas per head plus the enlarged one, names as <h4>
    assert len(box.find_all("canvas", role="img")) == N_HEADS + 1
    assert [h.text() for h in box.find_all("h4")] == site["names"]
    assert int(box.attrs["data-pk-cells"]) == N_HEADS * 64 * 64
    assert not run.dom.find_all("b")  # the head name "<b>L0H2</b>" stayed text
    links = {a.text(): a.attrs["href"] for a in run.dom.find_all("a")}
    assert set(links) == {"L0H0", "L0H1"}
    for label, href in links.items():
        target = (site["layer"].parent / href).resolve()
        assert target.is_file()
        assert parse_html(target.read_text(encoding="utf-8")).find_all("h1")[0].text() \
            .endswith(label)


@needs_chromium
def test_missing_bundle_is_reported_on_the_page(site, tmp_path):
    tokens, logits, pattern, g = planted(12)
    page = report.render_head_page(tmp_path / "p.html", title="no bundle", tokens=tokens,
                                   pattern=pattern, logits=logits, assets_rel="missing")
    run = load_page(page)
    box = run.dom.find_all("div", class_="pk-cv")[0]
    assert box.attrs["data-pk-state"] == "error"
    assert "did not load" in box.text() and "missing/circuitsvis.js" in box.text()
    assert [r["kind"] for r in run.probe] == ["resource"]


@needs_chromium
def test_inline_bundle_page_renders(tmp_path):
    tokens, logits, pattern, g = planted(16)
    page = report.render_head_page(tmp_path / "single.html", title="single file",
                                   tokens=tokens, pattern=pattern, logits=logits,
                                   assets_rel=None)
    assert page.stat().st_size > 1_000_000  # the bundle is inside
    run = load_page(page)
    assert_clean(run)
    assert len(mounted(run).find_all("canvas", role="img")) == 1


@needs_chromium
def test_screenshot_of_head_page(site, tmp_path):
    out = screenshot(site["heads"][0], tmp_path / "head.png", size=(1400, 2000))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000


def test_long_pattern_is_truncated_with_a_note():
    tokens, logits, pattern, g = planted(20)
    data = report.HeadPageData(title="t", tokens=tokens, pattern=pattern, logits=logits)
    block = report.head_html(data, assets_rel="assets", max_tokens=12)
    assert "first 12 of 20 tokens" in block and "figures below use all 20 tokens" in block
    assert cv_payload(block)["matrices"]["attention"]["shape"] == [12, 12]
    assert '<script src="assets/circuitsvis.js"></script>' in block and "<style>" in block

"""The report's head viewer in headless Chromium from file://, with the network off: the
page loads with an empty console, every head of a tiny model's condition opens at its
permalink, the numbers a head view shows (pooled R², peak frequencies) are the saved ones,
hostile token strings stay text, and a missing analysis says "not run" with its command.
Without Chromium the browser tests are skipped with the reason; the data-file checks run
anyway."""

import base64
import dataclasses
import json
import re
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from browser import find_chromium, load_page, screenshot

from poskernel_tl import constants as C
from poskernel_tl.analyses import spectral as S
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.report.build import build_report
from poskernel_tl.report.viewer_data import condition_key, head_anchor

L, H, T, N = 2, 3, 64, 6
NASTY = ["</script>", "<img src=x onerror=alert(2)>", '"q" \'s\'', "&amp;", "</div>",
         "\u2028", "<b>bold</b>"]
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not found: apt-get install chromium (or set POSKERNEL_CHROMIUM)")


def tiny_spec():
    base = REGISTRY["smollm2-135m"]
    i = np.arange(0, 16, 2)
    return dataclasses.replace(base, n_layers=L, n_heads=H, n_kv_heads=1, d_head=16,
                               inv_freq=tuple(float(base.rope_base) ** (-i / 16)))


def tiny_result(dataset: str, seed: int) -> ConditionResult:
    """Rotary-like g(Δ) per head, per-sequence R², and one saved logit matrix (NaN on and
    above the diagonal, as the run saves it)."""
    rng = np.random.default_rng(seed)
    spec = tiny_spec()
    th = spec.rotary_frequencies()
    lags = np.arange(1, T)
    amp = rng.uniform(0.2, 1.0, (L, H, len(th)))
    g = np.einsum("lhp,tp->lht", amp, np.cos(np.outer(lags, th))) \
        + 0.05 * rng.standard_normal((L, H, T - 1))
    r2 = rng.uniform(0.1, 0.9, (L, H))
    per_seq = np.clip(r2 + rng.normal(0, 0.05, (N, L, H)), 0, 1)
    A = rng.standard_normal((L, H, T, T)).astype(np.float32) + g[:, :, :1, None]
    A[..., np.triu_indices(T)[0], np.triu_indices(T)[1]] = np.nan
    gram = np.zeros((L, H, T, T), np.float32)
    d = spec.d_head
    return ConditionResult(
        model=spec.name, dataset=dataset, length=T, spec=spec, seq_id=np.arange(N) + 10,
        r2_per_seq=per_seq, r2_per_seq_nosink=per_seq, g_per_seq=np.repeat(
            g[None], N, 0).astype(np.float32) + 0.01, r2_pooled=r2, r2_pooled_nosink=r2 * 0.9,
        g_pooled=g, r2_pooled_early=r2, r2_pooled_interior=r2, r2_pooled_interior_keys=r2,
        r2_split=np.repeat(r2[None], 5, 0), centered=True, r2_gram=r2 * 0.5, g_gram=g * 0.5,
        r2_gram_raw=r2 * 0.8, g_gram_raw=g + 1, r2_gram_half=r2 * 0.5, n_centering=N,
        mean_q=np.zeros((L, H, T, d), np.float32), mean_k=np.zeros((L, 1, T, d), np.float32),
        gram_centered=gram, logits={12: A}, provenance={"weights": "synthetic test weights"})


def hostile(ids) -> list[str]:
    return [NASTY[i % len(NASTY)] if i % 5 == 0 else f" t{i}" for i in map(int, ids)]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two conditions of a tiny rotary model: prose (spectral analysis saved, sequences
    with hostile token strings) and random (no spectral analysis run)."""
    out = tmp_path_factory.mktemp("viewer")
    prose, rand = tiny_result("prose", 0), tiny_result("random", 1)
    saved = {}
    for r in (prose, rand):
        r.save(out)
    table, peaks, _ = S.run_spectral(prose, out, gate_met=False, n_null=200)
    saved["trackB"] = peaks
    saved["trackA"] = pd.read_csv(C.result_path(out, prose.model, "prose", T,
                                                "spectral_trackA_peaks.csv"))
    ids = torch.arange(100, 100 + 16 * T).reshape(16, T)
    C.seqs_path(out, prose.model, "prose", T).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"input_ids": ids, "seq_id": torch.arange(16)},
               C.seqs_path(out, prose.model, "prose", T))
    page = build_report(out, token_decoders={prose.model: hostile}, workers=1)
    return {"out": out, "page": page, "prose": prose, "rand": rand, "peaks": saved,
            "tokens": hostile(ids[12].tolist())}


def data_of(page, r) -> dict:
    text = (page.parent / "data" / f"{r.stem()}.js").read_text(encoding="utf-8")
    key = condition_key(r.model, r.dataset, T)
    prefix = f'(window.PK_DATA = window.PK_DATA || {{}})["{key}"] = '
    assert text.startswith(prefix) and text.endswith(";\n")
    return json.loads(text[len(prefix):-2])


def typed(spec: dict) -> np.ndarray:
    data = base64.b64decode(spec["b64"])
    data = zlib.decompress(data) if spec.get("z") else data
    return np.frombuffer(data, "<" + spec["dtype"]).reshape(spec["shape"])


# ------------------------------------------------------------------ without a browser
def test_data_file_holds_the_saved_numbers(site):
    """One page per head, its numbers and curves the saved ones (the logits an 8-bit
    display copy within half a step), the peaks the spectral file's."""
    r = site["prose"]
    d = data_of(site["page"], r)
    assert len(d["heads"]) == L * H and d["tokens"] == site["tokens"]
    A = r.logits[12]
    t, s = np.tril_indices(T, -1)
    for layer in range(L):
        for head in range(H):
            p = d["heads"][layer * H + head]
            numbers = {n[0]: n[2] for n in p["numbers"]}
            assert numbers["r2-pooled"] == r.r2_pooled[layer, head]
            assert numbers["r2-shown"] == r.r2_gram[layer, head]
            assert numbers["r2-gram-raw"] == r.r2_gram_raw[layer, head]
            kernel = [q for q in p["panels"] if q["section"] == "Positional kernel g(Δ)"]
            np.testing.assert_array_equal(typed(kernel[0]["series"][0]["y"]),
                                          r.g_pooled[layer, head].astype(np.float32))
            hist = [q for q in p["panels"] if q["kind"] == "histogram"]
            np.testing.assert_array_equal(typed(hist[0]["values"]),
                                          r.r2_per_seq[:, layer, head].astype(np.float32))
            assert hist[0]["marker"] == r.r2_pooled[layer, head]
            q = p["seq"]
            assert q["codes"]["z"]  # deflated; the viewer inflates it
            back = q["lo"] + q["step"] * typed(q["codes"]).astype(np.float64)
            want = A[layer, head, t, s]
            assert np.abs(back - want).max() <= q["step"] / 2 + 1e-6
            assert q["lo"] == float(np.float32(want.min()))
            np.testing.assert_array_equal(typed(q["g"]), r.g_per_seq[2, layer, head])
            spectrum = [q for q in p["panels"] if q["section"].startswith("Spectrum — Track B")]
            power = spectrum[0]["series"][0]  # half floats of |ĝ|² over its largest value
            assert typed(power["y"]).max() == 1 and power["scale"] > 0
            assert power["x"] == "omega" and len(typed(d["shared"]["omega"])) == len(
                typed(power["y"]))
            peaks = spectrum[0]["tables"][1]["rows"]
            saved = site["peaks"]["trackB"].query(f"layer == {layer} and head == {head}")
            assert [float(row[1]["attrs"]["data-value"]) for row in peaks] == \
                saved.sort_values("rank")["omega"].tolist()
    rand = data_of(site["page"], site["rand"])["heads"][0]["panels"]
    assert [q["status"] for q in rand if q["kind"] == "message"] == ["not run", "not run"]
    # no token string can end a script: the JSON escapes <, > and &
    text = (site["page"].parent / "data" / f"{r.stem()}.js").read_text(encoding="utf-8")
    assert "</script" not in text and "<img" not in text


# ------------------------------------------------------------------ in headless Chromium
def clean(run) -> None:
    assert run.probe == [], f"page recorded errors, dialogs or failed loads: {run.probe}"
    assert run.console == [], f"console messages: {run.console}"


def cell(run, key: str) -> str:
    found = run.dom.find_all("td", data_pk=key)
    assert len(found) == 1, key
    return found[0].text()


@needs_chromium
def test_report_loads_with_an_empty_console(site):
    run = load_page(site["page"], budget_ms=5000)
    clean(run)
    fig1 = run.dom.find_all("div", id="pk-fig1")[0]
    assert fig1.find_all("div", class_="js-plotly-plot"), "Figure 1 heatmap not drawn"
    assert [o.text() for o in fig1.find_all("option")][0].startswith("SmolLM2-135M")
    head = run.dom.find_all("div", id="pk-head")[0]
    assert "hidden" in head.attrs and not head.children


@needs_chromium
def test_every_head_opens_at_its_permalink_with_the_saved_numbers(site):
    r = site["prose"]
    for layer in range(L):
        for head in range(H):
            anchor = head_anchor(r.model, r.dataset, T, layer, head)
            run = load_page(site["page"], budget_ms=8000, fragment=anchor)
            clean(run)
            panel = run.dom.find_all("div", id="pk-head")[0]
            assert panel.attrs.get("data-pk-head") == anchor
            assert panel.attrs.get("data-pk-state") == "drawn"
            assert panel.find_all("h2")[0].text().endswith(f"L{layer}H{head}")
            assert cell(run, "r2-pooled") == f"{r.r2_pooled[layer, head]:.3f}"
            for source, label in (("trackB", "pre-registered"), ("trackA", "exploratory")):
                tables = [t for t in panel.find_all("table")
                          if label in t.attrs.get("data-pk-peaks", "")]
                assert len(tables) == 1, source
                shown = [float(td.attrs["data-value"])
                         for td in tables[0].find_all("td", data_pk="omega")]
                saved = site["peaks"][source].query(f"layer == {layer} and head == {head}")
                assert shown == saved.sort_values("rank")["omega"].tolist(), source
            box = panel.find_all("div", class_="pk-cv")[0]
            assert box.attrs["data-pk-state"] == "mounted" and box.attrs["data-pk-cells"] == \
                str(T * T)


@needs_chromium
def test_hostile_tokens_stay_text(site):
    run = load_page(site["page"], budget_ms=8000,
                    fragment=head_anchor(site["prose"].model, "prose", T, 1, 2))
    clean(run)  # no alert, no error
    spans = [s.text() for s in run.dom.find_all("span", class_="pk-tok")]
    assert spans == site["tokens"]
    assert set(NASTY[:2]) <= set(spans)
    assert not run.dom.find_all("img", src="x") and not run.dom.find_all("b", class_=None)
    assert not [b for b in run.dom.find_all("b") if b.text() == "bold"]
    scripts = [s.attrs.get("src", "") for s in run.dom.find_all("script")]
    assert all(not re.match(r"[a-z]+://", src) for src in scripts)


@needs_chromium
def test_missing_analysis_says_not_run_and_unknown_heads_say_so(site):
    r = site["rand"]
    run = load_page(site["page"], budget_ms=8000, fragment=head_anchor(r.model, "random", T,
                                                                        0, 1))
    clean(run)
    missing = [p.text() for p in run.dom.find_all("p", class_="pk-missing")]
    assert any(m.startswith("not run") and "poskernel spectral DIR" in m for m in missing)
    assert sum("poskernel analyze" in m for m in missing) == 3  # the further analyses
    run = load_page(site["page"], budget_ms=4000, fragment=f"{r.model}/random_{T}/L9H0")
    clean(run)
    assert "No head at" in run.dom.find_all("div", id="pk-head")[0].text()


@needs_chromium
def test_screenshots(site, tmp_path):
    r = site["prose"]
    shots = [screenshot(site["page"], tmp_path / "report.png", budget_ms=5000),
             screenshot(site["page"], tmp_path / "head.png", size=(1400, 3000), budget_ms=8000,
                        fragment=head_anchor(r.model, "prose", T, 0, 1))]
    for png in shots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000


def test_data_files_are_written_in_pieces_as_one_text(tmp_path):
    """A data file written key by key (json_pieces) is the text json_for_script gives the
    whole payload, hostile strings escaped the same way."""
    from poskernel_tl.report.html import json_for_script, json_pieces, write_script_data

    payload = {"key": "m/d_8", "tokens": NASTY, "arrays": {"a": {"b64": "AAAA", "shape": [3]},
                                                          "</script>": [1.5, None, True]},
               "n": 3, "empty": {}, "list": [{"x": "<!--"}]}
    assert "".join(json_pieces(payload)) == json_for_script(payload)
    assert "".join(json_pieces(payload, depth=5)) == json_for_script(payload)
    path = write_script_data(tmp_path / "d.js", "PK_DATA", "m/d_8", payload)
    text = path.read_text(encoding="utf-8")
    assert text == ('(window.PK_DATA = window.PK_DATA || {})["m/d_8"] = ' +
                    json_for_script(payload) + ";\n")
    assert "</script>" not in text and "\u2028" not in text


def test_an_analysis_declares_its_head_panels(site, monkeypatch):
    """A panel an analysis declares (``AnalysisSpec.head_panels``, as the spectral analysis
    declares its spectra) reaches every head's page with the arrays it shares, given what
    the analysis saved for the condition (here nothing: its status says "not run")."""
    from poskernel_tl.analyses import registry
    from poskernel_tl.analyses.base import AnalysisSpec
    from poskernel_tl.panels import curve, series
    from poskernel_tl.report.collect import Decoders, read_condition
    from poskernel_tl.report.viewer_data import condition_payload

    class Ramp:
        def __init__(self, saved, r):
            self.shared, self.status, self.n = {"ramp_x": [0, 1, 2]}, saved.status, r.n_heads

        def __call__(self, layer, head):
            return [curve("Ramp", [series([layer, head, self.n], x="ramp_x")], x_label="x",
                          y_label="y", note=self.status)]

    monkeypatch.setitem(registry.REGISTRY, "ramp", AnalysisSpec(
        name="ramp", title="Ramp", guide="a test", compute=lambda inputs, options: pd.DataFrame(),
        head_panels=Ramp))
    r = site["prose"]
    payload = condition_payload(read_condition(site["out"], (r.model, "prose", T), Decoders()))
    assert payload["shared"]["ramp_x"] == [0, 1, 2] and "omega" in payload["shared"]
    for i, page in enumerate(payload["heads"]):
        sections = [p["section"] for p in page["panels"]]
        assert sections.count("Ramp") == 1 and sum(s.startswith("Spectrum") for s in sections) == 2
        ramp = next(p for p in page["panels"] if p["section"] == "Ramp")
        assert ramp["series"][0]["y"] == [i // H, i % H, H] and ramp["sectionNote"] == "not run"

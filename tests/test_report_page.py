"""The report opens with its answer and its picture: two lines per condition, then Figure 1
(each head clickable into its view) on the first screen of a 1400 × 2400 window in headless
Chromium; the verdicts follow with their numbers folded, and the questions (a)–(f) folded
under their verdicts."""

import json
import re

import pytest
from browser import find_chromium, load_page
from test_report import synthetic
from test_report_build import save_all, visible

from poskernel_tl.report.build import build_report
from poskernel_tl.report.tables import dataset_label

needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="headless Chromium not found")
SCREEN = (1400, 2400)
MEASURE = """<script>window.addEventListener("load", function () { setTimeout(function () {
  var top = function (e) { return e.getBoundingClientRect().top + window.scrollY; };
  var pics = Array.prototype.filter.call(document.querySelectorAll("img, svg, canvas"),
    function (e) { var r = e.getBoundingClientRect();  // drawn, on the page, not a probe
      return r.width > 40 && r.height > 40 && r.left >= 0 && top(e) >= 0; });
  pics.sort(function (a, b) { return top(a) - top(b); });
  var lead = document.querySelector(".pk-lead"), first = pics[0];
  document.documentElement.setAttribute("data-first", JSON.stringify({
    top: first ? top(first) : null, in_fig1: !!(first && first.closest("#pk-fig1")),
    lead_bottom: lead.getBoundingClientRect().bottom + window.scrollY,
    screen: window.innerHeight}));
}, 1500); });</script>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A report of three conditions, as the demo has (a text, code and random tokens)."""
    out = tmp_path_factory.mktemp("first-screen")
    save_all(out, [synthetic(dataset="prose", layers=6, seed=0),
                   synthetic(dataset="stdlib-code", layers=6, seed=1),
                   synthetic(dataset="random", centered=False, layers=6, seed=2)])
    return build_report(out, workers=1)


def test_the_answer_comes_first_then_figure1_then_the_verdicts(page):
    text = page.read_text(encoding="utf-8")
    order = [text.index(s) for s in ('class="pk-lead"', 'id="pk-fig1"',
                                     "Pre-registration verdicts", "Results, question by question",
                                     "Table 1")]
    assert order == sorted(order), order
    lead = visible(text[text.index('class="pk-lead"'):text.index('id="pk-fig1"')])
    for dataset in ("prose", "stdlib-code", "random"):
        assert f"smollm2-135m · {dataset_label(dataset)} · T=32" in lead, dataset
    assert lead.count("Early layers (0–1): Track A pooled R²") == 3
    assert lead.count("Whole model:") == 3
    assert len(re.findall(r'<a href="report\.html#smollm2-135m/[^"]+/L\d+H\d+">', text)) >= 3
    # the verdicts: every row's numbers folded under its reading; the questions folded too
    verdicts = text[text.index("Pre-registration verdicts"):text.index("Table 1")]
    table = verdicts[:verdicts.index("</table>")]
    assert table.count("<details") >= 8 and " open" not in table
    assert verdicts.count('<li><details class="pk-fold"><summary><b>(') == 6


@needs_chromium
def test_figure1_starts_on_the_first_screen(page):
    probe = page.with_name("first-screen.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"),
                     encoding="utf-8")
    run = load_page(probe, budget_ms=5000, size=SCREEN)
    assert run.probe == [], run.probe
    got = json.loads(run.dom.find_all("html")[0].attrs["data-first"])
    assert got["screen"] > 2000, got  # the window's height less the browser's own bars
    assert got["in_fig1"], got  # the first picture on the page is Figure 1
    assert got["lead_bottom"] < got["top"] < got["screen"] - 400, got  # 400 px of it shown

"""The head map: its table is the per-head tables the report reads (one row per head, the
saved numbers), and in headless Chromium a click on a point opens that head's view, a
permalink restores the axes and filters, and a hostile permalink is inert (nothing runs,
no markup enters the page, the map draws with its defaults)."""

import json

import numpy as np
import pandas as pd
import pytest
from browser import find_chromium, load_page
from test_viewer import T, hostile, tiny_result

import poskernel_tl as pk
from poskernel_tl import constants as C
from poskernel_tl.report import head_map
from poskernel_tl.report.build import build_report
from poskernel_tl.report.tables import dataset_label

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="headless Chromium not found")
EVIL = "<img src=x onerror=alert(7)>"
CLASSES = ["previous-token", "local", "sink", "decay", EVIL]


def heads_csv(r, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    L, H = r.n_layers, r.n_heads
    return pd.DataFrame({
        "model": r.model, "dataset": r.dataset, "length": r.length,
        "layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
        "R2_pooled": r.r2_pooled.ravel(), "prev_share": rng.uniform(0, 1, L * H),
        "kernel_class": [CLASSES[j % len(CLASSES)] for j in range(L * H)],
        "tl_prev_token": rng.uniform(0, 1, L * H)})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("headmap")
    results = []
    for i, ds in enumerate(["prose", "random"]):
        r = tiny_result(ds, i)
        r.save(out)
        heads_csv(r, i).to_csv(C.result_path(out, r.model, ds, T, C.HEADS_CSV), index=False)
        results.append(r)
    page = build_report(out, token_decoders={results[0].model: hostile}, workers=1)
    return {"out": out, "page": page, "results": results}


def test_table_holds_the_saved_numbers(site):
    table = pd.read_csv(site["page"].parent / "head_map.csv")
    r = site["results"][0]
    assert len(table) == sum(x.n_layers * x.n_heads for x in site["results"])
    mine = table[table["dataset"] == "prose"].sort_values(["layer", "head"])
    np.testing.assert_allclose(mine["R2_pooled"], r.r2_pooled.ravel())
    np.testing.assert_allclose(mine["R2_gram"], r.r2_gram.ravel())
    saved = heads_csv(r, 0)
    np.testing.assert_allclose(mine["tl_prev_token"], saved["tl_prev_token"])
    assert list(mine["kernel_class"]) == list(saved["kernel_class"])
    num, cat = head_map.columns(table)
    assert {"R2_pooled", "tl_prev_token", "prev_share", "depth"} <= set(num)
    assert {"model", "dataset", "length", "kind", "kernel_class"} == set(cat)
    text = (site["page"].parent / "data" / head_map.MAP_FILE).read_text(encoding="utf-8")
    assert EVIL not in text and "<" not in text


def test_notebook_figure_from_results(site):
    fig = pk.plots.head_map(site["results"], x="R2_pooled", y="R2_gram", color="model")
    xs = np.concatenate([np.asarray(t.x, float) for t in fig.data])
    assert len(xs) == sum(x.n_layers * x.n_heads for x in site["results"])
    assert fig.layout.xaxis.title.text.startswith("Track A")
    with pytest.raises(ValueError, match="no column"):
        pk.plots.head_map(site["results"], x="nope")
    folder = head_map.results_table(site["out"])  # a folder: its files, as the report reads
    saved = pd.read_csv(site["page"].parent / "head_map.csv")
    assert list(folder.columns) == list(saved.columns)
    np.testing.assert_allclose(folder["tl_prev_token"], saved["tl_prev_token"])
    fig = pk.plots.head_map(site["out"], y="prev_share", dataset="random")
    assert sum(len(t.x) for t in fig.data) == len(saved[saved["dataset"] == "random"])


# a click as Plotly's own tests make one: mouse events at the pixel position of the point
# farthest from any other (so that the click cannot land on a neighbour)
CLICK = """<script>(function () {
  function ev(type, x, y) {
    var t = document.elementFromPoint(x, y);
    if (t) t.dispatchEvent(new MouseEvent(type, {bubbles: true, cancelable: true, clientX: x,
      clientY: y, view: window, buttons: type === "mousedown" ? 1 : 0}));
  }
  var tries = 0;
  (function wait() {
    var div = document.querySelector("#pk-map .pk-plot");
    if (!div || div.getAttribute("data-pk-state") !== "drawn") {
      if (++tries < 200) setTimeout(wait, 25);
      return;
    }
    var xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis, pts = [];
    var box = div.querySelector(".nsewdrag").getBoundingClientRect();
    div.data.forEach(function (tr) {
      tr.x.forEach(function (v, i) {
        if (v !== null && tr.y[i] !== null) pts.push([box.left + xa.d2p(v),
          box.top + window.scrollY + ya.d2p(tr.y[i]), tr.customdata[i]]);
      });
    });
    var best = null, far = -1;  // the point farthest from its nearest neighbour
    pts.forEach(function (p) {
      var near = Infinity;
      pts.forEach(function (q) {
        if (q !== p) near = Math.min(near, Math.hypot(p[0] - q[0], p[1] - q[1]));
      });
      if (near > far) { far = near; best = p; }
    });
    window.scrollTo(0, best[1] - window.innerHeight / 2);  // the point mid-window
    var x = best[0], y = best[1] - window.scrollY;
    document.documentElement.setAttribute("data-clicked", String(best[2]));
    ev("mousemove", x, y);
    setTimeout(function () { ev("mousedown", x, y); ev("mouseup", x, y); ev("click", x, y); }, 100);
  })();
})();</script>"""


def with_script(page, script: str, name: str):
    copy = page.with_name(name)
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"),
                    encoding="utf-8")
    return copy


@needs_chromium
def test_a_click_on_a_point_opens_its_head(site):
    page = with_script(site["page"], CLICK, "click.html")
    run = load_page(page, budget_ms=10000)
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    table = pd.read_csv(site["page"].parent / "head_map.csv")
    row = table.iloc[int(run.dom.find_all("html")[0].attrs["data-clicked"])]
    anchor = f"{row['model']}/{row['dataset']}_{row['length']}/L{row['layer']}H{row['head']}"
    panel = run.dom.find_all("div", id="pk-head")[0]
    assert "hidden" not in panel.attrs and panel.attrs.get("data-pk-head") == anchor
    assert panel.attrs.get("data-pk-state") == "drawn"


def selected(run) -> dict:
    return {s.attrs["data-pk-axis"]: [o.attrs["value"] for o in s.find_all("option")
                                      if "selected" in o.attrs] for s in run.dom.find_all("select")
            if "data-pk-axis" in s.attrs}


COUNT = """<script>setTimeout(function () {
  var s = {}; document.querySelectorAll("#pk-map select").forEach(function (e) {
    s[e.getAttribute("data-pk-axis")] = e.value; });
  document.documentElement.setAttribute("data-axes", JSON.stringify(s));
}, 3000);</script>"""


@needs_chromium
def test_permalink_keeps_axes_and_filters(site):
    page = with_script(site["page"], COUNT, "axes.html")
    label = dataset_label("random")
    run = load_page(page, budget_ms=6000, fragment="map:x=R2_gram&y=prev_share&c=model"
                    f"&f.dataset={label.replace(' ', '%20')}")
    assert run.probe == [], run.probe
    assert json.loads(run.dom.find_all("html")[0].attrs["data-axes"]) == {
        "x": "R2_gram", "y": "prev_share", "colour": "model"}
    count = [n.text() for n in run.dom.find_all("span") if "data-pk-count" in n.attrs]
    assert count == ["6 of 12 heads"]


@needs_chromium
@pytest.mark.parametrize("fragment", [
    "map:x=%3Cimg%20src=x%20onerror=alert(1)%3E&c=%3Cscript%3Ealert(2)%3C/script%3E",
    'map:x=R2_pooled"><svg onload=alert(3)>&f.model=<b>x</b>|smollm2-135m',
    "map:x=constructor&y=__proto__&c=toString&f.__proto__=1&f.kind=%E0%A4%A",
    "map:" + "x=R2_pooled&" * 600])
def test_a_hostile_permalink_is_inert(site, fragment):
    page = with_script(site["page"], COUNT, "hostile.html")
    run = load_page(page, budget_ms=6000, fragment=fragment)
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    assert not run.dom.find_all("svg", onload="alert(3)") and not run.dom.find_all("script",
                                                                                   src="x")
    assert not [n for n in run.dom.find_all("img") if n.attrs.get("src") == "x"]
    axes = json.loads(run.dom.find_all("html")[0].attrs["data-axes"])
    assert axes["y"] == "tl_prev_token" and axes["colour"] == "kernel_class"
    assert axes["x"] == "R2_pooled"
    count = [n.text() for n in run.dom.find_all("span") if "data-pk-count" in n.attrs]
    assert count == ["12 of 12 heads"]

"""examples/quickstart.ipynb executes as shipped (nbclient, the embedded SmolLM2 at a small
length), and the page its outputs make renders in headless Chromium: Plotly figures and
head views mounted, an empty console."""

import json
import time
from pathlib import Path

import pytest
from browser import find_chromium, load_page

ROOT = Path(__file__).resolve().parents[1]

# slow: the notebook's calls on SmolLM2 (pk.measure, the plots, pk.inspect_head) are the
# default suite's (test_runner.py, test_plots.py, test_head_view.py); this runs the file
pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


@pytest.fixture(scope="module")
def executed(tmp_path_factory, smollm2):  # smollm2: skipped where the wheel is absent
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("LENGTH = 256", "LENGTH = 96")
    work = tmp_path_factory.mktemp("quickstart")
    t0 = time.time()
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}}).execute()
    return nb, time.time() - t0, work


def test_the_quickstart_executes(executed):
    nb, seconds, work = executed
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    assert (work / "artifacts" / "quickstart" / "results").is_dir()
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]
    views = [o["data"]["text/html"] for o in html if "pk-head" in o["data"]["text/html"]]
    assert len(views) == 2 and len(views[1]) < len(views[0]) / 10  # the second reuses
    size = len(json.dumps(nb))
    print(f"quickstart: executed in {seconds:.0f} s, {size / 1e6:.1f} MB")


def test_the_executed_quickstart_renders_in_chromium(executed, tmp_path):
    if find_chromium() is None:
        pytest.skip("headless Chromium not found: apt-get install chromium")
    nb, _, _ = executed
    parts = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
             for o in c.outputs if "text/html" in o.get("data", {})]
    page = tmp_path / "quickstart.html"
    page.write_text("<html><body>" + "\n".join(parts) + "</body></html>", encoding="utf-8")
    run = load_page(page, budget_ms=6000)
    assert run.console == [] and run.probe == [], (run.console, run.probe)
    heads = run.dom.find_all("div", class_="pk-head")
    assert len(heads) == 2 and all(h.children for h in heads)
    plots = run.dom.find_all("div", class_="plotly-graph-div")
    assert len(plots) >= 3 and all(p.children for p in plots)

"""Benchmark: the head map in headless Chromium at the size of a results folder.

Either reads a folder's report table (``--table DIR/report/head_map.csv``, written by
``poskernel report``) or makes a synthetic one with the head counts of a preset
(``--preset demo``: SmolLM2 on 3 datasets at T = 256, 810 heads; ``--preset seed``: the
seed grid's six models × 3 datasets × 2 lengths, 16,224 heads), every column a
``poskernel report`` table would give (R², kernel descriptors and class, band R², spectral,
null percentile). Writes a standalone page with the map (assets inline), opens it in
headless Chromium, changes the x axis ``--changes`` times (each after the previous draw) and
prints the first draw's and the slowest axis change's time as the page measured them
(``performance.now()`` around the change: Plotly's redraw, style and layout, run while the
page loads so that the clock is real) and the page's size.

Usage: python scripts/bench_head_map.py [--preset demo|seed | --table CSV] [--out PAGE]
       [--changes 5] [--screenshot PNG]
"""

import argparse
import html
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.report.head_map import GLOBAL, map_payload
from poskernel_tl.report.html import json_for_script, page_html, report_block
from poskernel_tl.report.viewer import asset_tags

SETS = {"demo": (("smollm2-135m",), ("prose", "stdlib-code", "random"), (256,)),
        "seed": (("gpt2", "gpt2-medium", "olmo-1b", "llama-3.2-1b", "tinyllama-1.1b",
                  "tinyllama-nope-1.1b"), ("wikipedia", "code", "random"), (256, 1024))}
CLASSES = ("content", "previous-token", "local", "sink", "decay", "periodic")
AXES = ("prev_share", "sink_share", "R2_gram", "null_percentile", "R2_band_1-16")


def synthetic(preset: str, seed: int = 0) -> pd.DataFrame:
    """A head table shaped like ``poskernel report``'s, values random but class-shaped."""
    rng = np.random.default_rng(seed)
    models, datasets, lengths = SETS[preset]
    frames = []
    for model in models:
        spec = REGISTRY[model]
        L, H = spec.n_layers, spec.n_heads
        for dataset in datasets:
            for T in lengths:
                n = L * H
                cls = rng.choice(CLASSES, n, p=(0.5, 0.1, 0.15, 0.15, 0.05, 0.05))
                r2 = np.clip(rng.beta(2, 3, n) + 0.3 * (cls != "content"), 0, 1)
                frames.append(pd.DataFrame({
                    "model": model, "dataset": dataset, "length": T,
                    "layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                    "kind": spec.pe or "rope", "depth": np.repeat(np.arange(L), H) / (L - 1),
                    "R2_pooled": r2, "R2_nosink": r2 * rng.uniform(0.7, 1, n),
                    "R2_gram": r2 * rng.uniform(0.5, 1, n), "R2_gram_raw": rng.uniform(0, 1, n),
                    "prev_share": np.where(cls == "previous-token", rng.uniform(0.5, 1, n),
                                           rng.uniform(0, 0.3, n)),
                    "sink_share": np.where(cls == "sink", rng.uniform(0.5, 1, n),
                                           rng.uniform(0, 0.3, n)),
                    "peak_lag": rng.integers(1, 20, n), "width": rng.integers(1, 60, n),
                    "decay_slope": rng.normal(-0.3, 0.2, n), "kernel_class": cls,
                    "tl_prev_token": rng.uniform(0, 1, n),
                    "null_percentile": rng.uniform(50, 100, n),
                    "R2_band_1-16": rng.uniform(0, 1, n), "R2_band_16-64": rng.uniform(0, 1, n),
                    "spectral_trackB_p_value": rng.uniform(0, 1, n)}))
    return pd.concat(frames, ignore_index=True)


PROBE = """<script>(function () {  // synchronous, during the page's load: real time
  var d = document.querySelector("#pk-map .pk-plot"), times = [];
  document.documentElement.setAttribute("data-first", d.getAttribute("data-pk-sync-ms"));
  AXES.forEach(function (axis) {
    var sel = document.querySelector('#pk-map select[data-pk-axis="x"]'), t0 = performance.now();
    sel.value = axis;
    sel.dispatchEvent(new Event("change"));  // redraws with Plotly.react
    void d.getBoundingClientRect().height;  // style and layout included
    document.body.offsetHeight;
    times.push(Math.round(performance.now() - t0));
  });
  document.documentElement.setAttribute("data-changes", JSON.stringify(times));
})();</script>"""


def write_page(table: pd.DataFrame, path: Path, changes: int) -> Path:
    axes = [a for a in AXES if a in table.columns][:changes] or ["R2_pooled"]
    data = f"<script>window.{GLOBAL} = {json_for_script(map_payload(table))};</script>"
    body = ('<div id="pk-map" class="pk-viewer pk-map"></div>\n' + data +
            f'\n<script>PK.headMap("pk-map", window.{GLOBAL}, false);</script>\n' +
            PROBE.replace("AXES", json.dumps(axes)))
    path.write_text(page_html("Head map", report_block(body, include_style=False),
                              head=asset_tags(None)), encoding="utf-8")
    return path


def chromium(args: list[str]) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                               f"--user-data-dir={profile}", "--enable-unsafe-swiftshader",
                               *args], capture_output=True, text=True, timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(SETS), default="demo")
    ap.add_argument("--table", help="a report's head_map.csv instead of a synthetic table")
    ap.add_argument("--out", default=None, help="the page to write (default: a temp file)")
    ap.add_argument("--changes", type=int, default=5)
    ap.add_argument("--screenshot", default=None, help="also write a PNG of the page")
    args = ap.parse_args()
    table = pd.read_csv(args.table) if args.table else synthetic(args.preset)
    out = Path(args.out or tempfile.mkdtemp() + "/head_map.html")
    write_page(table, out, args.changes)
    t0 = time.perf_counter()
    proc = chromium(["--timeout=20000", "--dump-dom", out.resolve().as_uri()])  # real time
    wall = time.perf_counter() - t0
    first = re.search(r'data-first="(\d+)"', proc.stdout)
    changes = re.search(r'data-changes="([^"]*)"', proc.stdout)
    print(f"{len(table)} heads; page {out} {out.stat().st_size / 1e6:.2f} MB; "
          f"chromium wall {wall:.1f} s")
    times = json.loads(html.unescape(changes.group(1))) if changes else "?"
    print(f"first draw {first.group(1) if first else '?'} ms; axis changes (ms): {times}")
    if args.screenshot:
        chromium([f"--screenshot={Path(args.screenshot).resolve()}", "--window-size=1200,800",
                  "--virtual-time-budget=20000", out.resolve().as_uri()])
        print(f"screenshot {args.screenshot}")


if __name__ == "__main__":
    main()

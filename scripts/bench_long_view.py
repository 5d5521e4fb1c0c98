"""Benchmark: a long head view's page sizes and its open time in headless Chromium.

Inspects one head on the first ``--tokens`` tokens of a text file (one forward pass, as
``poskernel inspect`` does), then writes and measures:

- the standalone page (``view.save``: Plotly and the viewer inline, q and k whole);
- a notebook as ``pk.inspect_head`` displays it: the first view (the assets), a later view
  of the same head (its data only; q and k of one window past the notebook's budget) and a
  ``view.zoom`` window; the size of each block;
- the open time: Chromium loads the standalone page in real time until ``--runs`` loads
  recorded it: the page records ``performance.now()`` when its zoom is drawn (from
  navigation start: parsing the page, decoding the data, drawing the overview, g(Δ) and
  the zoom; Chromium's own start, ≈ 1.5 s, is not counted).

Usage: python scripts/bench_long_view.py --file TEXT [--model smollm2-135m] [--layer 1]
       [--head 2] [--tokens 8192] [--zoom 6000] [--runs 5] [--out DIR]
"""

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from bench_head_map import chromium

import poskernel_tl as pk
from poskernel_tl.report.html import page_html
from poskernel_tl.report.viewer import SHARED, head_html
from poskernel_tl.report.viewer_long import NOTEBOOK_FACTOR_BYTES, ZOOM


def open_ms(page: Path, fragment: str) -> float | None:
    proc = chromium(["--timeout=30000", "--dump-dom", page.resolve().as_uri() + fragment])
    m = re.search(r'data-pk-opened-ms="(\d+)"', proc.stdout)
    return float(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", required=True, help="a text file (e.g. WikiText-2's test text)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--head", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--zoom", type=int, default=6000, help="first row and key of the zoom")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    model = pk.load_model(args.model)
    t0 = time.perf_counter()
    view = pk.inspect_head(model, Path(args.file).read_text(encoding="utf-8"), args.layer,
                           args.head, max_tokens=args.tokens)
    print(f"inspect_head: {time.perf_counter() - t0:.1f} s, T = {view.n_tokens}")
    t0 = time.perf_counter()
    page = view.save(out / "head.html")
    print(f"standalone page {page.stat().st_size / 1e6:.2f} MB "
          f"(written in {time.perf_counter() - t0:.1f} s)")
    data, z0 = view.page_data(), args.zoom
    first = head_html(data, assets_rel=None, factor_budget=NOTEBOOK_FACTOR_BYTES)
    later = head_html(data, assets_rel=SHARED, factor_budget=NOTEBOOK_FACTOR_BYTES)
    zoom = view.zoom((z0, z0 + ZOOM - 1)).to_html(assets_rel=SHARED)
    for name, block in (("first", first), ("later", later), ("zoom", zoom)):
        print(f"notebook {name} view: {len(block.encode()) / 1e6:.3f} MB")
    nb = out / "notebook.html"
    nb.write_text(page_html("notebook", first + later + zoom), encoding="utf-8")
    done, tries = [], 0
    while len(done) < args.runs and tries < 3 * args.runs:
        # Chromium's --dump-dom may come before the page has drawn (its data decode is
        # asynchronous): such a load records nothing and is tried again
        tries += 1
        t = open_ms(page, f"#zoom={z0}-{z0 + ZOOM - 1},{z0}-{z0 + ZOOM - 1}")
        if t is not None:
            done.append(t / 1000)
    print(f"standalone page open (s, {len(done)} loads that drew the zoom of {tries}): "
          f"{', '.join(f'{t:.2f}' for t in done)}; median "
          f"{statistics.median(done) if done else float('nan'):.2f}")
    print(f"pages in {out}")


if __name__ == "__main__":
    main()

"""Benchmark: a long head view's page sizes and its open time in headless Chromium.

Inspects one head on the first ``--tokens`` tokens of a text file (one forward pass, as
``poskernel inspect`` does), then writes and measures:

- the standalone page (``view.save``: Plotly and the viewer inline, q and k whole);
- a notebook as ``pk.inspect_head`` displays it: the first view (the assets), a later view
  of the same head (its data only; q and k of one window past the notebook's budget) and a
  ``view.zoom`` window; the size of each block;
- the open time: Chromium's wall time to load the standalone page at a zoom permalink and
  run it to rest (the dumped page must hold that zoom), less that of an empty page
  (Chromium's own start), over ``--runs`` loads; with ``--report-page`` the same for a
  report's head view (overview only, then with the zoom, whose q and k load on demand).

Usage: python scripts/bench_long_view.py --file TEXT [--model smollm2-135m] [--layer 1]
       [--head 2] [--tokens 8192] [--zoom 6000] [--runs 5] [--out DIR]
       [--report-page DIR/report/report.html --report-head KEY/L1H2]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_head_map import chromium

import poskernel_tl as pk
from poskernel_tl.report.html import page_html
from poskernel_tl.report.viewer import SHARED, head_html
from poskernel_tl.report.viewer_long import NOTEBOOK_FACTOR_BYTES, ZOOM


def load_seconds(uri: str, want: str | None) -> float | None:
    """Chromium's wall time to load ``uri`` and run it to rest (virtual time: timers do
    not wait, work does); None unless the dumped page holds ``want``."""
    t0 = time.perf_counter()
    proc = chromium(["--virtual-time-budget=30000", "--dump-dom", uri])
    wall = time.perf_counter() - t0
    return wall if want is None or want in proc.stdout else None


def open_time(page: Path, fragment: str, want: str, runs: int) -> tuple[list[float], float]:
    """The page's load times to ``want`` (``runs`` loads that reached it) and the median
    time of an empty page, which each is measured against."""
    empty = page.with_name(".empty.html")
    empty.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    base = statistics.median(load_seconds(empty.resolve().as_uri(), None) for _ in range(3))
    empty.unlink()
    done = [t for t in (load_seconds(page.resolve().as_uri() + fragment, want)
                        for _ in range(runs)) if t is not None]
    return [t - base for t in done], base


def report(times: list[float], base: float, runs: int, what: str) -> None:
    print(f"{what} open (s, wall time less an empty page's {base:.2f} s; {len(times)} of "
          f"{runs} loads drew it): {', '.join(f'{t:.2f}' for t in times)}; median "
          f"{statistics.median(times) if times else float('nan'):.2f}")


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
    ap.add_argument("--report-page", default=None,
                    help="also time a report's head view (DIR/report/report.html)")
    ap.add_argument("--report-head", default="smollm2-135m/random_8192/L1H2")
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
    z = f"{z0},{z0 + ZOOM - 1},{z0},{z0 + ZOOM - 1}"
    frag = f"#zoom={z0}-{z0 + ZOOM - 1},{z0}-{z0 + ZOOM - 1}"
    report(*open_time(page, frag, f'data-pk-window="{z}"', args.runs), args.runs,
           "standalone page with the zoom")
    if args.report_page:
        head = f"#{args.report_head}"
        report(*open_time(Path(args.report_page), head, "data-pk-long=", args.runs),
               args.runs, f"report head {args.report_head}")
        report(*open_time(Path(args.report_page), f"{head}/{frag[1:]}",
                          f'data-pk-window="{z}"', args.runs), args.runs,
               f"report head {args.report_head} with the zoom")
    print(f"pages in {out}")


if __name__ == "__main__":
    main()

"""The head viewer's static parts and its two hosts.

- **Assets**, written once per report under ``assets/``: Plotly's JavaScript bundle (from
  the ``plotly`` package's own data, never a CDN), circuitsvis' bundle, and the viewer
  (``static/viewer.js``, ``longview.js`` (a long view's overview and zoom), ``headmap.js``
  (the head map) and ``viewer.css`` of this package) (:func:`write_assets`).
- **The report**: :func:`viewer_html` is Figure 1 as a clickable heatmap per condition
  and the head panel that each permalink ``report.html#{model}/{dataset}_{T}/L{l}H{h}``
  opens; the index it needs (one R² grid per condition, the data file's path) is embedded
  as escaped JSON.
- **A notebook or a standalone page** (:class:`HeadPageData`, :func:`head_html`,
  :func:`write_head_page`): one head drawn by the same viewer from an inline payload.
"""

import hashlib
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.analyses.spectral.view import spectrum_panel
from poskernel_tl.constants import VIEW_TOKENS
from poskernel_tl.encode import num, typed
from poskernel_tl.fit.blocks import fit_mask
from poskernel_tl.fit.one_matrix import matrix_fit
from poskernel_tl.io import atomic_write
from poskernel_tl.mask import Mask
from poskernel_tl.panels import histogram
from poskernel_tl.report import head_page as HP
from poskernel_tl.report.html import (
    ASSETS_DIR,
    bundle_js,
    check_relative_url,
    escape,
    json_for_script,
    page_html,
    relative_url,
    report_block,
    write_page,
)
from poskernel_tl.report.viewer_long import long_payload

PLOTLY_NAME = "plotly.min.js"
BUNDLE_NAME = "circuitsvis.js"
VIEWER_JS, VIEWER_CSS = "viewer.js", "viewer.css"
LONG_JS, HEADMAP_JS = "longview.js", "headmap.js"  # a long head view's zoom; the head map
SCRIPT_NAMES = (PLOTLY_NAME, BUNDLE_NAME, VIEWER_JS, LONG_JS, HEADMAP_JS)
ASSET_NAMES = (*SCRIPT_NAMES, VIEWER_CSS)


def plotly_js() -> bytes:
    """Plotly's minified bundle as shipped in the ``plotly`` package's data."""
    try:
        return (resources.files("plotly") / "package_data" / PLOTLY_NAME).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise ModuleNotFoundError("the head viewer needs the plotly package (its JavaScript "
                                  "bundle): pip install plotly") from err


def static_file(name: str) -> bytes:
    """A file of this package's ``static/`` folder (the viewer's JavaScript and CSS)."""
    return (resources.files("poskernel_tl.report") / "static" / name).read_bytes()


def asset_bytes(name: str) -> bytes:
    if name == PLOTLY_NAME:
        return plotly_js()
    if name == BUNDLE_NAME:
        return bundle_js().encode("utf-8")
    return static_file(name)


def write_assets(report_dir: str | os.PathLike) -> Path:
    """Write the four assets once to ``report_dir/assets/`` (a file is rewritten only when
    its content differs) and return that folder."""
    folder = Path(report_dir) / ASSETS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name in ASSET_NAMES:
        target, data = folder / name, asset_bytes(name)
        if not (target.is_file() and target.stat().st_size == len(data)
                and target.read_bytes() == data):
            atomic_write(target, lambda tmp, data=data: tmp.write_bytes(data))
    return folder


def assets_rel_for(page_path: str | os.PathLike, report_dir: str | os.PathLike) -> str:
    """The relative URL from a page at ``page_path`` to ``report_dir/assets``."""
    return relative_url(Path(report_dir) / ASSETS_DIR, page_path)


def asset_tags(assets_rel: str | None, skip: tuple[str, ...] = ()) -> str:
    """``<link>``/``<script>`` tags loading the assets from ``assets_rel`` (a relative
    folder URL), or the assets themselves inline when ``assets_rel`` is None (but those
    named in ``skip``: a long view draws no circuitsvis pattern)."""
    if assets_rel is None:
        css = asset_bytes(VIEWER_CSS).decode("utf-8")
        scripts = [asset_bytes(n).decode("utf-8").replace("</script", "<\\/script")
                   .replace("</SCRIPT", "<\\/SCRIPT") for n in SCRIPT_NAMES if n not in skip]
        return f"<style>\n{css}\n</style>\n" + "\n".join(f"<script>\n{s}\n</script>"
                                                     for s in scripts)
    base = check_relative_url(assets_rel.rstrip("/"))
    src = {n: escape(f"{base}/{n}") for n in ASSET_NAMES}
    return (f'<link rel="stylesheet" href="{src[VIEWER_CSS]}">\n' + "\n".join(
        f'<script src="{src[n]}"></script>' for n in SCRIPT_NAMES))


def viewer_html(index: list[dict]) -> str:
    """Figure 1's interactive heatmaps and the head panel, for ``report.html`` (the assets
    are loaded by the page head; :func:`asset_tags`). ``index``: one entry per condition
    (``key``, ``label``, ``model``, ``dataset_label``, ``length``, ``n_layers``,
    ``n_heads``, ``group_size``, ``kinds`` (each layer's positional scheme, for the
    hover; empty for results saved before layers were described), ``r2`` (Track A pooled
    R² grid), ``data`` (the data file's relative path))."""
    for entry in index:
        check_relative_url(entry["data"])
    return ('<div id="pk-fig1" class="pk-viewer"></div>\n'
            '<div id="pk-head" class="pk-head pk-overlay" hidden></div>\n'
            f'<script type="application/json" id="pk-index">{json_for_script(index)}</script>\n'
            "<script>PK.start();</script>")


# --------------------------------------------------------------- one head, inline
@dataclass
class HeadPageData:
    """Everything one head's view shows. Arrays are numpy; optional parts may be None.

    ``pattern`` and ``logits`` are one sequence's attention probabilities and pre-softmax
    scores (``hook_pattern`` / ``hook_attn_scores``) over the sequence whose token strings
    are ``tokens``; the fit uses their strictly lower triangle. ``spectrum`` is ``(omega,
    power)`` with ω in rad/token; ``thetas`` the positional-encoding frequencies to mark.
    ``tables`` maps a caption to a small result table; ``r2_values`` names R² numbers shown
    at the top; ``beyond`` holds the head's rows of further analyses (a frame). ``q``,
    ``k`` and ``logit_scale`` (logits = scale · q · kᵀ) let a view longer than its
    ``max_tokens`` zoom into any window (:mod:`poskernel_tl.report.viewer_long`).
    ``fit``: (R², g, g_back) of the shift-invariant fit of ``logits`` as the caller made
    it (fitted here, :func:`~poskernel_tl.fit.one_matrix.matrix_fit`, when not given);
    ``numbers`` and ``panels``: more rows of the first table and more panels, as the head
    page's builder makes them (:func:`~poskernel_tl.report.head_page.declared`)."""

    title: str
    tokens: list[str]
    pattern: Float[np.ndarray, "query_pos key_pos"]
    logits: Float[np.ndarray, "query_pos key_pos"]
    g_trackA: Float[np.ndarray, " lag"] | None = None
    g_trackB: Float[np.ndarray, " lag"] | None = None
    g_trackA_back: Float[np.ndarray, " lag"] | None = None  # Δ = −1..−(T−1) (encoders)
    two_sided: bool = False  # no causal mask: the fit reads every off-diagonal entry
    spectrum: tuple[Float[np.ndarray, " freq"], Float[np.ndarray, " freq"]] | None = None
    thetas: Float[np.ndarray, " n_theta"] | None = None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    r2_values: dict[str, float] = field(default_factory=dict)
    per_seq_r2: Float[np.ndarray, " n_seqs"] | None = None
    notes: list[str] | tuple[str, ...] = ()
    links: dict[str, str] = field(default_factory=dict)
    beyond: pd.DataFrame | None = None
    last: int | None = None  # a sliding window's last kept offset: the fit reads Δ ≤ it
    chunk: int | None = None  # a chunked mask's chunk where it binds: the fit reads within it
    # the zoom of a long view (past max_tokens): post-rotary q, the kv head's k, the factor
    q: Float[np.ndarray, "query_pos d_head"] | None = None
    k: Float[np.ndarray, "key_pos d_head"] | None = None
    logit_scale: float | None = None
    fit: tuple | None = None
    numbers: list = field(default_factory=list)
    panels: list = field(default_factory=list)

    def __post_init__(self):
        T = len(self.tokens)
        if T < 3:
            raise ValueError(f"a head view needs at least 3 tokens, got {T}")
        for name in ("pattern", "logits"):
            shape = getattr(self, name).shape
            if shape != (T, T):
                raise ValueError(f"{name} has shape {shape}; expected ({T}, {T}) for "
                                 f"{T} tokens")
        if self.spectrum is not None and self.spectrum[0].shape != self.spectrum[1].shape:
            raise ValueError("spectrum omega and power differ in length")
        if self.fit is None:
            self.fit = matrix_fit(self.logits, self.mask)

    @property
    def mask(self) -> Mask:
        """The entries the head's fit reads, at the view's length."""
        return Mask(len(self.tokens), not self.two_sided, self.last, self.chunk)


def _frame_table(title: str, df: pd.DataFrame) -> dict:
    rows = [[str(v) if isinstance(v, str) else "–" if num(v) is None else
             f"{float(v):.4g}" if isinstance(num(v), float) else str(v) for v in rec]
            for rec in df.itertuples(index=False)]
    return {"title": title, "columns": [str(c) for c in df.columns], "rows": rows}


def head_payload(data: HeadPageData, max_tokens: int = VIEW_TOKENS, *,
                 factor_budget: int | None = None) -> dict:
    """The viewer's page for one head (:func:`~poskernel_tl.report.head_page.page`;
    arrays as base64 typed arrays). Past ``max_tokens`` tokens the whole matrix travels as
    an overview of blocks and the zoom's factors (``long``;
    :func:`~poskernel_tl.report.viewer_long.long_payload`, whole or, over
    ``factor_budget`` bytes, those of the first window) when the data has q and k, else as
    its first ``max_tokens`` tokens."""
    T = len(data.tokens)
    n = min(T, max_tokens)
    r2, g, g_back = data.fit
    keep = fit_mask(data.mask, slice(0, n))[:, :n]
    logits = np.where(keep, np.asarray(data.logits)[:n, :n], np.nan)
    notes, long = list(data.notes), None
    if n < T and data.q is not None:
        long, more = long_payload(data, g, g_back, factor_budget=factor_budget)
        notes += more
    elif n < T:
        notes.append(f"Showing the first {n} of {T} tokens; the fit uses all {T}.")
    f32 = lambda a: None if a is None else np.asarray(a, np.float32)
    panels = HP.kernel_panels([{"label": label, "g": f32(v), "back": f32(back)}
                               for label, v, back in (
                                   ("Track A g(Δ)", data.g_trackA, data.g_trackA_back),
                                   ("Track B g(Δ)", data.g_trackB, None)) if v is not None])
    if data.spectrum is not None:  # the peaks and the alignment are tables, made in Python
        panels.append(spectrum_panel("g(Δ)", *data.spectrum, data.thetas))
    if data.per_seq_r2 is not None:
        panels.append(histogram("Per-sequence R²", data.per_seq_r2,
                                x_label="R² per sequence", y_label="sequences"))
    tables = [_frame_table(k, v) for k, v in data.tables.items()]
    if data.beyond is not None:
        tables.append(_frame_table("Further analyses", data.beyond))
    numbers = [["r2-seq", f"R² of the fit below (this sequence, {T} tokens)", r2, 3]]
    numbers += [[f"r2-{i}", k, num(v), 3] for i, (k, v) in enumerate(data.r2_values.items())]
    # display copies: half precision, deflated (every number shown is computed here)
    seq = None if long else {
        "T": n, "logits": typed(logits, "f2", deflate=True), "pattern": typed(
            np.asarray(data.pattern)[:n, :n], "f2", deflate=True), "g": typed(g, "f4"),
        "r2": r2, "gBack": None if g_back is None else typed(g_back, "f4"),
        **data.mask.page(), "tokens": [str(t) for t in data.tokens[:n]],
        "step": None, "label": f"{T} tokens"}
    return HP.page(data.title, numbers=numbers + list(data.numbers),
                   panels=HP.arrange(panels + list(data.panels)), notes=notes, seq=seq, long=long,
                   tables=tables, links=[[k, check_relative_url(v)]
                                         for k, v in data.links.items()])


def zoom_payload(data: HeadPageData, window: tuple[int, int, int, int]) -> dict:
    """The payload of one zoom window (r0, r1, c0, c1) of a head, without the rest of its
    view: the window's logits, fit, residual and pattern at full resolution, its tokens."""
    _, g, g_back = data.fit
    long, notes = long_payload(data, g, g_back, window=window, overview_maps_too=False)
    r0, r1, c0, c1 = window
    return {**HP.page(f"{data.title} · rows {r0}–{r1}, keys {c0}–{c1}", numbers=[],
                      panels=[], notes=notes, long=long), "zoomOnly": True}


SHARED = "shared"  # ``assets_rel`` of a block that uses the assets an earlier block loaded


def head_html(data: HeadPageData, *, assets_rel: str | None, max_tokens: int = VIEW_TOKENS,
              include_style: bool = True, lean: bool = False,
              factor_budget: int | None = None, zoom: tuple | None = None,
              **_ignored) -> str:
    """The head view as an HTML block: a notebook's ``_repr_html_`` (``assets_rel=None``
    inlines Plotly, circuitsvis and the viewer; :data:`SHARED` loads nothing and uses what
    an earlier block of the same page loaded, saying so where nothing was) or the body of
    :func:`write_head_page`. ``lean``: a long view (no circuitsvis pattern) inlines no
    circuitsvis bundle (a standalone page; a notebook's later views may need it).
    ``factor_budget``: see :func:`head_payload`; ``zoom``: the window (r0, r1, c0, c1)
    alone (:func:`zoom_payload`)."""
    payload = zoom_payload(data, zoom) if zoom is not None else \
        head_payload(data, max_tokens, factor_budget=factor_budget)
    text = json_for_script(payload)
    key = "pk-" + hashlib.sha256(text.encode()).hexdigest()[:12]  # same input, same page
    missing = json_for_script("The viewer's scripts are not loaded on this page: display "
                              "one view with them, IPython.display.HTML(view.to_html()), "
                              "then this cell again.")
    body = (f'<div id="{key}" class="pk-head"></div>\n'
            f'<script type="application/json" id="{key}-data">{text}'
            f"</script>\n<script>if (window.PK) PK.showHead({json_for_script(key)}, "
            f"{json_for_script(key + '-data')}); else document.getElementById("
            f"{json_for_script(key)}).textContent = {missing};</script>")
    skip = (BUNDLE_NAME,) if lean and payload["long"] else ()
    tags = "" if assets_rel == SHARED else asset_tags(assets_rel, skip) + "\n"
    return report_block(tags + body, include_style=include_style and assets_rel != SHARED)


def write_head_page(path: str | os.PathLike, data: HeadPageData, *, assets_rel: str | None,
                    max_tokens: int = VIEW_TOKENS, zoom: tuple | None = None, **_ignored) -> Path:
    """Write ``data`` as a standalone page at ``path``; ``assets_rel`` and ``zoom`` as in
    :func:`head_html` (call :func:`write_assets` once for the folder it names)."""
    block = head_html(data, assets_rel=assets_rel, max_tokens=max_tokens, include_style=False,
                      lean=True, zoom=zoom)
    return write_page(path, page_html(data.title, block))


__all__ = ["ASSET_NAMES", "BUNDLE_NAME", "SHARED", "HeadPageData", "PLOTLY_NAME", "asset_tags",
           "assets_rel_for", "head_html", "head_payload", "plotly_js",
           "viewer_html", "write_assets", "write_head_page", "zoom_payload"]

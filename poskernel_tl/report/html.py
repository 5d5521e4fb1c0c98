"""HTML building blocks for report pages: escaping, the page skeleton, the shared
circuitsvis bundle, and circuitsvis components mounted from compact, escaped JSON.

circuitsvis' own offline rendering (``RenderedHTML.local_src``) inlines its ≈ 1.3 MB
JavaScript bundle into every render. Here the bundle is written once per report
(:func:`write_assets`) and every page loads it by a relative path, so pages work from
``file://`` without a network. Components are mounted with the same call the bundle's
``CircuitsVis.render(id, Component, props)`` exposes; props are embedded as JSON in a
``<script type="application/json">`` block with ``<``, ``>`` and ``&`` written as
``\\u003c``, ``\\u003e``, ``\\u0026``, so no text (a token such as ``</script>``) can end
the block early. Attention matrices travel rounded to a fixed number of decimals, as
integers with each row's trailing zeros dropped (a causal pattern's upper triangle costs
nothing); a few lines of JavaScript restore the full matrices before mounting.
"""

import base64
import hashlib
import html
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from jaxtyping import Float
from matplotlib.figure import Figure

ASSETS_DIR = "assets"
BUNDLE_NAME = "circuitsvis.js"

# --------------------------------------------------------------------------- escaping


def clean_text(text: str) -> str:
    """``text`` made encodable as UTF-8: lone surrogates (from decoding partial bytes)
    are shown as ``\\udcxx`` escapes instead of failing when the page is written."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def escape(text: object) -> str:
    """Escape any text for HTML element content and quoted attribute values."""
    return html.escape(clean_text(str(text)), quote=True)


def json_for_script(obj: object) -> str:
    """``obj`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&``
    (so also ``</script>`` and ``<!--``) and the JavaScript line separators become
    ``\\uXXXX`` escapes, which JSON and JavaScript decode back to the same string."""
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


def check_relative_url(url: str) -> str:
    """Return ``url`` if it is a relative reference (no scheme, no host), else raise:
    report pages must work from ``file://`` without a network."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith("//") or url.startswith("/"):
        raise ValueError(f"report links and asset paths must be relative, got {url!r}")
    return url


def relative_url(target: str | os.PathLike, page_path: str | os.PathLike) -> str:
    """The relative URL from the folder of ``page_path`` to ``target`` (forward slashes)."""
    rel = os.path.relpath(Path(target).resolve(), Path(page_path).resolve().parent)
    return Path(rel).as_posix()


# ------------------------------------------------------------------------ the bundle


def _bundle_file() -> Path:
    """The file circuitsvis' ``render_local`` (behind ``RenderedHTML.local_src``) reads."""
    import circuitsvis.utils.render as cv_render

    return Path(cv_render.__file__).parent.parent / "dist" / "cdn" / "iife.js"


def _bundle_from_local_src() -> str:
    """The bundle text cut out of a ``local_src`` render (fallback when the file moved)."""
    from circuitsvis.utils.render import render_local

    src = render_local("AttentionPattern", tokens=["a"], attention=[[1.0]])
    start = src.index('type="module">') + len('type="module">')
    return src[start: src.rindex("CircuitsVis.render(")].strip()


def bundle_js() -> str:
    """circuitsvis' browser bundle (defines the global ``CircuitsVis``), taken from the
    installed package, with its license header and without the source-map reference
    (the map is not shipped)."""
    path = _bundle_file()
    text = path.read_text(encoding="utf-8") if path.is_file() else _bundle_from_local_src()
    text = re.sub(r"\n//# sourceMappingURL=\S+\s*$", "\n", text)
    try:
        dist = metadata.distribution("circuitsvis")
        version, license_text = dist.version, dist.read_text("LICENSE.txt") or "MIT License"
    except metadata.PackageNotFoundError:  # pragma: no cover - circuitsvis is a dependency
        version, license_text = "unknown", "MIT License"
    header = f"/*! circuitsvis {version} browser bundle.\n{license_text.strip()}\n*/\n"
    return header + text


def write_assets(report_dir: str | os.PathLike) -> Path:
    """Write the circuitsvis bundle once to ``report_dir/assets/circuitsvis.js`` and return
    its path. Rewrites only when the content differs (safe to call for every page)."""
    target = Path(report_dir) / ASSETS_DIR / BUNDLE_NAME
    data = bundle_js().encode("utf-8")
    if not (target.is_file() and target.read_bytes() == data):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".js.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return target


def assets_rel_for(page_path: str | os.PathLike, report_dir: str | os.PathLike) -> str:
    """``assets_rel`` for a page at ``page_path``: the relative URL of the report's
    assets folder, e.g. ``"../../../assets"`` for ``report/heads/m/d_256/L0H0.html``."""
    return relative_url(Path(report_dir) / ASSETS_DIR, page_path)


def bundle_tag(assets_rel: str | None) -> str:
    """``<script>`` loading the bundle from ``assets_rel`` (relative folder URL), or the
    whole bundle inline when ``assets_rel`` is None (notebooks, single-file pages)."""
    if assets_rel is None:
        js = re.sub(r"</(script)", r"<\\/\1", bundle_js(), flags=re.IGNORECASE)
        return f"<script>\n{js}\n</script>"
    src = check_relative_url(f"{assets_rel.rstrip('/')}/{BUNDLE_NAME}")
    return f'<script src="{escape(src)}"></script>'


# ------------------------------------------------------------------ circuitsvis mount

_MOUNT_JS = """(function () {
  var id = %(id)s, el = document.getElementById(id);
  function fail(msg) { el.setAttribute("data-pk-state", "error"); el.textContent = msg; }
  if (typeof CircuitsVis === "undefined") {
    fail("The circuitsvis bundle did not load (expected at " + %(src)s + ").");
    return;
  }
  var cells = 0, total = 0;
  function inflate(x, shape, scale) {
    if (shape.length === 1) {
      var row = new Array(shape[0]);
      for (var i = 0; i < shape[0]; i++) {
        row[i] = i < x.length ? x[i] / scale : 0; cells += 1; total += row[i];
      }
      return row;
    }
    return x.map(function (y) { return inflate(y, shape.slice(1), scale); });
  }
  try {
    var spec = JSON.parse(document.getElementById(id + "-data").textContent);
    var props = spec.props;
    Object.keys(spec.matrices).forEach(function (key) {
      var m = spec.matrices[key];
      props[key] = inflate(m.data, m.shape, m.scale);
    });
    CircuitsVis.render(id, CircuitsVis[spec.component], props);
    el.setAttribute("data-pk-cells", String(cells));
    el.setAttribute("data-pk-sum", total.toFixed(3));
    el.setAttribute("data-pk-state", "mounted");
  } catch (err) {
    fail("circuitsvis could not render: " + err);
    throw err;
  }
})();"""


def encode_matrix(values: np.ndarray, decimals: int = 3) -> dict:
    """``values`` (any shape, ≥ 1 axis) rounded to ``decimals`` and stored as integers
    in units of 10^-decimals, each innermost row without its trailing zeros."""
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("circuitsvis matrices must be finite (no NaN/inf)")
    scale = 10 ** decimals
    ints = np.rint(values * scale).astype(np.int64)
    flat = ints.reshape(-1, ints.shape[-1]) if ints.ndim > 1 else ints[None]
    nonzero = flat != 0
    ends = np.where(nonzero.any(-1), flat.shape[-1] - np.argmax(nonzero[:, ::-1], -1), 0)
    rows = [row[:end].tolist() for row, end in zip(flat, ends)]
    nested: list = rows
    for size in reversed(ints.shape[1:-1]):
        nested = [nested[i:i + size] for i in range(0, len(nested), size)]
    if ints.ndim == 1:
        nested = rows[0]
    return {"shape": list(ints.shape), "scale": scale, "data": nested}


def circuitsvis_html(
    component: str,
    props: Mapping[str, object],
    matrices: Mapping[str, np.ndarray],
    *,
    assets_rel: str | None,
    decimals: int = 3,
    load_bundle: bool = True,
    element_id: str | None = None,
) -> str:
    """A fragment mounting ``CircuitsVis.<component>`` with ``props`` plus ``matrices``
    (numeric props sent rounded and compact). Loads the bundle from ``assets_rel`` (or
    inline when None) unless ``load_bundle`` is False (the page already loaded it)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", component):
        raise ValueError(f"not a circuitsvis component name: {component!r}")
    payload = {
        "component": component,
        "props": {k: v for k, v in props.items() if v is not None},
        "matrices": {k: encode_matrix(v, decimals) for k, v in matrices.items()},
    }
    # named by its content, so that identical inputs give identical pages
    element_id = element_id or "cv-" + hashlib.sha256(
        json_for_script(payload).encode()).hexdigest()[:12]
    src = "(inline)" if assets_rel is None else f"{assets_rel.rstrip('/')}/{BUNDLE_NAME}"
    mount = _MOUNT_JS % {"id": json_for_script(element_id), "src": json_for_script(src)}
    parts = [bundle_tag(assets_rel)] if load_bundle else []
    parts += [
        f'<div id="{escape(element_id)}" class="pk-cv" data-pk-state="pending"></div>',
        f'<script type="application/json" id="{escape(element_id)}-data">'
        f"{json_for_script(payload)}</script>",
        f"<script>\n{mount}\n</script>",
    ]
    return "\n".join(parts)


def _visible(tokens: Sequence[str], n_pos: int, max_tokens: int) -> tuple[int, str]:
    if len(tokens) != n_pos:
        raise ValueError(f"{len(tokens)} token strings for a pattern over {n_pos} positions")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    shown = min(n_pos, max_tokens)
    note = "" if shown == n_pos else (
        f"Showing the first {shown} of {n_pos} tokens (queries and keys); under causal "
        f"attention these {shown} query rows are complete. ")
    return shown, note


def attention_pattern_html(
    tokens: Sequence[str],
    pattern: Float[np.ndarray, "query_pos key_pos"],
    *,
    assets_rel: str | None,
    max_tokens: int = 256,
    decimals: int = 3,
    max_value: float | None = None,
    load_bundle: bool = True,
) -> str:
    """``circuitsvis.attention.attention_pattern(tokens, pattern)`` as a fragment that
    loads the shared bundle, with a note on rounding and on truncation to ``max_tokens``.
    ``max_value`` sets the value drawn darkest (circuitsvis' default: 1)."""
    shown, note = _visible(tokens, pattern.shape[0], max_tokens)
    props = {"tokens": [clean_text(t) for t in tokens[:shown]], "maskUpperTri": True,
             "maxValue": max_value}
    body = circuitsvis_html("AttentionPattern", props,
                            {"attention": pattern[:shown, :shown]},
                            assets_rel=assets_rel, decimals=decimals, load_bundle=load_bundle)
    note += f"Values rounded to {decimals} decimals. Hover a cell for its value."
    return f'{body}\n<p class="pk-note">{escape(note)}</p>'


def attention_heads_html(
    attention: Float[np.ndarray, "head_index query_pos key_pos"],
    tokens: Sequence[str],
    attention_head_names: Sequence[str] | None = None,
    *,
    assets_rel: str | None,
    max_tokens: int = 64,
    decimals: int = 3,
    max_value: float | None = None,
    load_bundle: bool = True,
) -> str:
    """``circuitsvis.attention.attention_heads(attention, tokens, attention_head_names)``
    as a fragment that loads the shared bundle (thumbnails of every head, one enlarged).
    The browser draws every cell of every head, so the default shows 64 tokens: 9 heads
    × 128² cells take seconds to draw, and thumbnails are ≈ 120 px wide anyway."""
    shown, note = _visible(tokens, attention.shape[1], max_tokens)
    names = None if attention_head_names is None else [clean_text(n)
                                                       for n in attention_head_names]
    if names is not None and len(names) != attention.shape[0]:
        raise ValueError(f"{len(names)} head names for {attention.shape[0]} heads")
    props = {"tokens": [clean_text(t) for t in tokens[:shown]],
             "attentionHeadNames": names, "maskUpperTri": True, "maxValue": max_value}
    body = circuitsvis_html("AttentionHeads", props,
                            {"attention": attention[:, :shown, :shown]},
                            assets_rel=assets_rel, decimals=decimals, load_bundle=load_bundle)
    note += (f"Values rounded to {decimals} decimals. Hover a thumbnail to enlarge it, "
             "click to keep it.")
    return f'{body}\n<p class="pk-note">{escape(note)}</p>'


# ----------------------------------------------------------------- static content


def figure_png(fig: Figure, *, dpi: int = 80, palette: bool = True) -> bytes:
    """``fig`` as PNG bytes. With ``palette``, stored with a 256-colour palette, which
    keeps noisy heatmaps about 3× smaller at no visible cost."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    if not palette:
        return buf.getvalue()
    from PIL import Image  # a matplotlib dependency

    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    small = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                   dither=Image.Dither.NONE).save(small, format="PNG", optimize=True)
    return small.getvalue()


def figure_img(fig: Figure, alt: str, *, dpi: int = 80) -> str:
    """``fig`` as an ``<img>`` with an embedded base64 PNG (no file next to the page)."""
    data = base64.b64encode(figure_png(fig, dpi=dpi)).decode("ascii")
    return f'<img class="pk-fig" alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _fmt(value: object) -> str:
    if isinstance(value, float | np.floating):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table_html(df) -> str:
    """A pandas DataFrame as an escaped HTML table (cells and headers are text)."""
    return df.to_html(index=False, escape=True, border=0, classes="pk-table", na_rep="–",
                      float_format=lambda x: f"{x:.4g}")


def values_html(values: Mapping[str, object]) -> str:
    """A two-column table of named values (e.g. R² figures)."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(_fmt(v))}</td></tr>"
                   for k, v in values.items())
    return f'<table class="pk-table pk-values">{rows}</table>'


def links_html(links: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    """A navigation list of relative links, ``{label: href}``."""
    items = links.items() if isinstance(links, Mapping) else links
    lis = "".join(f'<li><a href="{escape(check_relative_url(href))}">{escape(label)}</a></li>'
                  for label, href in items)
    return f'<ul class="pk-links">{lis}</ul>' if lis else ""


def tokens_html(tokens: Sequence[str]) -> str:
    """The token strings as text, one outlined span each (whitespace kept visible)."""
    spans = "".join(f'<span class="pk-tok" title="{i}">{escape(t)}</span>'
                    for i, t in enumerate(tokens))
    return (f'<details class="pk-tokens"><summary>{len(tokens)} tokens</summary>'
            f'<div class="pk-tokstrip">{spans}</div></details>')


STYLE = """<style>
.pk-report { font-family: system-ui, sans-serif; max-width: 1300px; margin: 0 auto;
  padding: 0 16px; color: #222; }
.pk-report h1 { font-size: 1.5em; } .pk-report h2 { font-size: 1.2em; margin-top: 1.6em;
  border-bottom: 1px solid #ddd; } .pk-report h3 { font-size: 1em; }
.pk-report .pk-note { color: #555; font-size: 0.9em; }
.pk-report .pk-fig { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.pk-report .pk-table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
.pk-report .pk-table th, .pk-report .pk-table td { border: 1px solid #ccc;
  padding: 2px 6px; text-align: right; }
.pk-report .pk-table th { background: #f4f4f4; }
.pk-report .pk-values th { text-align: left; }
.pk-report .pk-links { display: flex; flex-wrap: wrap; gap: 4px 14px; padding: 0;
  list-style: none; }
.pk-report .pk-tokstrip { line-height: 1.9; font-family: ui-monospace, monospace;
  font-size: 0.85em; white-space: pre-wrap; }
.pk-report .pk-tok { border: 1px solid #bbb; border-radius: 3px; padding: 0 1px;
  margin: 0 1px; background: #fafafa; }
.pk-report .pk-cv[data-pk-state="error"] { color: #b00; font-weight: bold; }
.pk-report .pk-cv-box { max-width: 820px; }
.pk-report .pk-beyond th, .pk-report .pk-beyond td { text-align: left; vertical-align: top; }
.pk-report .pk-beyond td.pk-value { text-align: right; }
.pk-report .pk-beyond-layers th { text-align: center; }
</style>"""


def report_block(body: str, *, include_style: bool = True) -> str:
    """``body`` (already-escaped HTML) in the styled container; with its stylesheet
    when ``include_style`` (a notebook cell), without it inside :func:`page_html`."""
    style = STYLE + "\n" if include_style else ""
    return f'{style}<div class="pk-report">\n{body}\n</div>'


def page_html(title: str, block: str) -> str:
    """A standalone page around ``block`` (from :func:`report_block` without style)."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n{STYLE}\n</head>\n<body>\n{block}\n</body>\n</html>\n"
    )


def write_page(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8, parents created, temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path

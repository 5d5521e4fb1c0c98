"""HTML building blocks for the report: escaping, JSON that is safe inside ``<script>``,
relative URLs, circuitsvis' browser bundle (written once per report by
:func:`poskernel_tl.report.viewer.write_assets`), and the page skeleton.

Text from the data (dataset names, tokens) only enters pages escaped: HTML through
:func:`escape`, JSON through :func:`json_for_script`, which writes ``<``, ``>`` and ``&``
as ``\\u003c``, ``\\u003e``, ``\\u0026`` so that no string (``</script>``) can end a
script block early.
"""

import html
import json
import math
import os
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from poskernel_tl.io import atomic_write

ASSETS_DIR = "assets"
# what a notebook session has displayed so far: "plotly" (plotly.js), "viewer" (plotly.js,
# circuitsvis and the viewer's script); a later display reuses what an earlier one loaded
SHOWN: set[str] = set()


def first_display(needs: str, carries: tuple[str, ...] = ()) -> bool:
    """Whether ``needs`` is new to this notebook session; it and what the display
    ``carries`` besides count as shown from then on."""
    first = needs not in SHOWN
    SHOWN.update((needs, *carries))
    return first

# --------------------------------------------------------------------------- escaping


def clean_text(text: str) -> str:
    """``text`` made encodable as UTF-8: lone surrogates (from decoding partial bytes)
    are shown as ``\\udcxx`` escapes instead of failing when the page is written."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def escape(text: object) -> str:
    """Escape any text for HTML element content and quoted attribute values."""
    return html.escape(clean_text(str(text)), quote=True)


def esc(text: object) -> str:
    """Escaped text; '://' as an entity so that no network URL appears in the page."""
    return escape(text).replace("://", ":&#47;&#47;")


def finite(x) -> float | None:
    """``x`` as a float, None when it is not a finite number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def number(x, spec: str = "{:.3f}", missing: str = "–") -> str:
    """A finite number formatted by ``spec``, ``missing`` for anything else."""
    return missing if (v := finite(x)) is None else spec.format(v)


def cell_text(v, spec: str = "{:.4g}") -> str:
    """A table cell's text: a float by ``spec``, '–' for None, NA or a non-finite float."""
    if isinstance(v, float | np.floating):
        return number(v, spec)
    return "–" if v is None or v is pd.NA else str(v)


def json_for_script(obj: object) -> str:
    """``obj`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&``
    (so also ``</script>`` and ``<!--``) and the JavaScript line separators become
    ``\\uXXXX`` escapes, which JSON and JavaScript decode back to the same string."""
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


def json_pieces(obj: object, depth: int = 2) -> Iterator[str]:
    """:func:`json_for_script` of ``obj`` in pieces whose concatenation is the same text:
    dicts down to ``depth`` levels key by key, each value whole below (a large payload is
    written without its whole text in memory at once)."""
    if depth <= 0 or not isinstance(obj, dict):
        yield json_for_script(obj)
        return
    yield "{"
    for i, (key, value) in enumerate(obj.items()):
        yield ("," if i else "") + json_for_script(str(key)) + ":"
        yield from json_pieces(value, depth - 1)
    yield "}"


def write_script_data(path: str | os.PathLike, store: str, key: str, obj: object) -> Path:
    """Write ``(window.{store} = window.{store} || {}){[key]} = {obj};`` to ``path`` (temp
    file + rename), ``obj`` in :func:`json_pieces`: a data file a ``<script>`` loads."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"(window.{store} = window.{store} || {{}})[{json_for_script(key)}] = ")
            for piece in json_pieces(obj):
                fh.write(piece)
            fh.write(";\n")
    return atomic_write(Path(path), write)


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


STYLE = """<style>
.pk-report { font-family: system-ui, sans-serif; max-width: 1300px; margin: 0 auto;
  padding: 0 16px; color: #222; }
.pk-report h1 { font-size: 1.5em; } .pk-report h2 { font-size: 1.2em; margin-top: 1.6em;
  border-bottom: 1px solid #ddd; } .pk-report h3 { font-size: 1em; }
.pk-report .pk-note { color: #555; font-size: 0.9em; }
.pk-report .pk-table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
.pk-report .pk-table th, .pk-report .pk-table td { border: 1px solid #ccc;
  padding: 2px 6px; text-align: right; }
.pk-report .pk-table th { background: #f4f4f4; }
.pk-report .pk-values th { text-align: left; }
.pk-report .pk-further th, .pk-report .pk-further td { text-align: left; vertical-align: top; }
.pk-report .pk-further td.pk-value { text-align: right; }
.pk-report .pk-further-layers th { text-align: center; }
</style>"""


def report_block(body: str, *, include_style: bool = True) -> str:
    """``body`` (already-escaped HTML) in the styled container; with its stylesheet
    when ``include_style`` (a notebook cell), without it inside :func:`page_html`."""
    style = STYLE + "\n" if include_style else ""
    return f'{style}<div class="pk-report">\n{body}\n</div>'


def page_html(title: str, block: str, head: str = "") -> str:
    """A standalone page around ``block`` (from :func:`report_block` without style);
    ``head``: more elements for ``<head>`` (already-escaped HTML)."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n{STYLE}\n{head}\n</head>\n<body>\n{block}\n"
        "</body>\n</html>\n"
    )


def write_page(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8, parents created, temp file + rename)."""
    return atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


__all__ = ["ASSETS_DIR", "SHOWN", "bundle_js", "check_relative_url", "clean_text", "escape",
           "first_display",
           "json_for_script", "json_pieces", "page_html", "relative_url", "report_block",
           "write_page", "write_script_data"]

"""One head's page: the one builder of what a head view draws, for the report's head
views (:mod:`poskernel_tl.report.viewer_data`, one page per head in the condition's data
file) and for ``pk.inspect_head`` and notebook views (:mod:`poskernel_tl.report.viewer`).

A page is a dict the viewer's script (``static/viewer.js``, ``PK.renderHead``) draws as
given — every number, curve and table is made here, nothing fitted or assembled in the
browser:

- ``title``, ``anchor``, ``notes``, ``links``;
- ``numbers``: rows ``[key, label, value, digits]`` of the first table;
- ``seq``: one sequence's logits (8-bit codes with ``lo``/``step``, or half floats), its
  pattern where hooked, its g(Δ) and R², its tokens — the circuitsvis pattern and the
  logits/fit/residual maps; or ``long`` / ``longFiles``: the long view;
- ``panels``: each ``{"kind": "curve" | "histogram" | "matrix" | "message", "section",
  "sectionNote", ...}``; consecutive panels of one section share its row. The positional
  kernels and spectra are built here; every part's declared panels
  (:class:`~poskernel_tl.panels.Panel`, ``Part.PANELS``) are read by :func:`declared`;
- ``tables``: the "Further analyses" tables (``title``, ``columns``, ``rows`` or
  ``message``).
"""

import numpy as np

from poskernel_tl.panels import KERNEL_NOTE, KERNEL_SECTION, Panel
from poskernel_tl.report.encode import num, typed

SPECTRUM_NOTE = ("Dashed: the model's rotary frequencies θᵢ. Triangles: the top peaks (filled: "
                 "significant; green: within ±10% of a θᵢ).")


# ------------------------------------------------------------------- text
def fixed(x, digits: int) -> str:
    return "–" if num(x) is None else f"{float(x):.{digits}f}"


def sig(x) -> str:
    """Four significant digits, trailing zeros dropped ("–" for None/NaN)."""
    if num(x) is None:
        return "–"
    v = float(f"{float(x):.4g}")
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def yes(x) -> str:
    return "–" if x is None else "yes" if x else "no"


# ------------------------------------------------------------------ panel kinds
def series(y, *, name: str = "", first: int = 1, x=None, color: str | None = None,
           dash: str | None = None, mode: str = "lines", symbol: str | None = None) -> dict:
    """One trace of a curve: ``y`` (an array, sent as float32; a typed array or a list as
    given), x = ``x`` (an array, a list, or the name of an array the page's file shares)
    or ``first``, ``first`` + 1, …; a trace may carry a ``scale`` its y are multiplied by
    (a half-precision display copy)."""
    y = typed(y, "f4") if isinstance(y, np.ndarray) else y
    return {"y": y, "x": x, "first": first, "name": name, "color": color, "dash": dash,
            "mode": mode, "symbol": symbol}


def curve(section: str, traces: list[dict], *, x_label: str, y_label: str, title: str = "",
          note: str = "", log_x: bool = False, log_y: bool = False, width: str = "half",
          vlines=(), tables=(), legend: bool | None = None) -> dict:
    return {"kind": "curve", "section": section, "sectionNote": note, "title": title,
            "series": traces, "xLabel": x_label, "yLabel": y_label, "logX": log_x,
            "logY": log_y, "width": width, "vlines": [num(v) for v in vlines],
            "tables": list(tables), "legend": len(traces) > 1 if legend is None else legend}


def histogram(section: str, values: np.ndarray, *, x_label: str, y_label: str,
              note: str = "", marker: float | None = None) -> dict:
    return {"kind": "histogram", "section": section, "sectionNote": note, "title": "",
            "values": typed(values, "f4"), "xLabel": x_label, "yLabel": y_label,
            "marker": num(marker), "width": "half"}


def matrix(section: str, z: np.ndarray, *, x_label: str, y_label: str,
           note: str = "") -> dict:
    return {"kind": "matrix", "section": section, "sectionNote": note, "title": "",
            "z": typed(z, "f4"), "shape": list(np.shape(z)), "xLabel": x_label,
            "yLabel": y_label, "width": "half"}


def message(section: str, status: str, text: str) -> dict:
    return {"kind": "message", "section": section, "sectionNote": "", "status": status,
            "text": text}


# ----------------------------------------------------------- declared panels
def declared(parts: dict, layer: int, head: int) -> tuple[list, list]:
    """(numbers, panels) of every panel the parts declare (``Part.PANELS``), in part
    order, for one head (a panel whose field a part does not hold is left out), arranged
    (:func:`arrange`)."""
    numbers, panels = [], []
    for part in parts.values():
        for p in getattr(type(part), "PANELS", ()):
            entry = panel_entry(p, part, layer, head)
            if entry is not None:
                (numbers if p.kind == "number" else panels).append(entry)
    return numbers, arrange(panels)


def arrange(panels: list[dict]) -> list[dict]:
    """Curves of one section and plot title drawn as one plot (in the first one's place),
    and each section's panels together, sections in the order they first appear."""
    out, plots = [], {}
    for entry in panels:
        key = (entry["section"], entry.get("title"))
        if entry["kind"] == "curve" and key in plots:
            _merge(plots[key], entry)
            continue
        if entry["kind"] == "curve":
            plots[key] = entry = {**entry, "series": list(entry["series"])}
        out.append(entry)
    order = list(dict.fromkeys(e["section"] for e in out))
    return sorted(out, key=lambda e: order.index(e["section"]))


def _merge(into: dict, entry: dict) -> None:
    """``entry``'s traces drawn in the plot of ``into`` (one section, one plot title)."""
    into["series"] += entry["series"]
    into["legend"] = True
    if entry["xLabel"] != into["xLabel"] and "|Δ|" in entry["xLabel"]:
        into["xLabel"] = entry["xLabel"]


def panel_entry(p: Panel, part, layer: int, head: int) -> dict | list | None:
    """One declared panel of one head as the page draws it."""
    v = p.values(part, layer, head)
    if v is None:
        return None
    if p.kind == "number":  # keyed by its field (r2_pooled: "r2-pooled")
        name = p.trace_name(part)
        return [p.field.replace("_", "-"), f"{p.title} ({name})" if name else p.title,
                num(v), p.digits]
    if p.kind == "curve":
        back = p.back_values(part, layer, head)
        name = p.trace_name(part)
        traces = [series(v.astype(np.float32), first=p.first, name=name, color=p.color)]
        if back is not None:  # keys after the query, Δ = −1, −2, …
            traces.append(series(back.astype(np.float32), first=p.first, color=p.color,
                                 dash="dot", name=f"{name}: keys after the query, g(−Δ)"))
            traces[0]["name"] = f"{name}: keys before the query, g(Δ)"
        return curve(p.title, traces, title=p.plot, x_label="|Δ| = |t − s|"
                     if back is not None and p.first == 1 else p.x, y_label=p.y, note=p.note,
                     log_x=p.log_x, legend=len(traces) > 1)
    if p.kind == "histogram":
        return histogram(p.title, v, x_label=p.x, y_label=p.y, note=p.note,
                         marker=p.marker_value(part, layer, head))
    return matrix(p.title, v, x_label=p.x, y_label=p.y, note=p.note)


# ------------------------------------------------------------ built panels
def kernel_panels(kernels: list[dict]) -> list[dict]:
    """g(Δ) of each source given as arrays (a notebook's view; a result's are declared on
    its parts), each on its own axes: ``kernels`` entries ``{label, g, back}``."""
    out = []
    for k in kernels:
        both = k.get("back") is not None
        traces = [series(k["g"], name="keys before the query: g(Δ), Δ > 0" if both else "g(Δ)")]
        if both:
            traces.append(series(k["back"], name="keys after the query: g(−Δ)", dash="dot"))
        out.append(curve(KERNEL_SECTION, traces, title=k["label"], note=KERNEL_NOTE,
                         x_label="|Δ| = |t − s|" if both else "lag Δ = t − s",
                         y_label="g(Δ)", log_x=True))
    return out


def spectrum_panel(label: str, omega: np.ndarray, power: np.ndarray, thetas, *,
                   peaks: list[dict] = (), summary: list = (), shared_x: str | None = None
                   ) -> dict:
    """|ĝ(ω)|² over ω > 0 (log-log) with the rotary frequencies marked and the top
    ``peaks`` (dicts of omega, magnitude, significant, matched, nearest_theta,
    rel_error) as markers and a table; ``summary``: (quantity, text) rows. ``shared_x``:
    the name under which the page's file holds ω > 0 for every head (else it travels
    with the panel)."""
    x = np.asarray(omega, np.float64)[1:]
    kinds = (("significant, matched", "triangle-down", "#2ca02c",
              lambda p: p["significant"] and p["matched"]),
             ("significant, unmatched", "triangle-down", "#d62728",
              lambda p: p["significant"] and not p["matched"]),
             ("not significant", "triangle-down-open", "#000", lambda p: not p["significant"]))
    y = np.asarray(power, np.float64)[1:]
    scale = float(np.nanmax(y)) if np.isfinite(y).any() and np.nanmax(y) > 0 else 1.0
    traces = [{**series(typed(y / scale, "f2"), name="|ĝ(ω)|² as analysed",
                        x=shared_x or typed(x, "f8")), "scale": scale}]  # a display copy
    for name, symbol, color, chosen in kinds:
        mine = [p for p in peaks if chosen(p)]
        traces.append(series([num(p["magnitude"] ** 2) for p in mine], mode="markers",
                             x=[num(p["omega"]) for p in mine], name=name, color=color,
                             symbol=symbol))
    lines = [t for t in (thetas if thetas is not None else ())
             if len(x) and x[0] <= t <= np.pi]
    tables = [] if not peaks and not summary else [
        {"columns": ["", ""], "rows": [[str(a), str(b)] for a, b in summary]},
        peak_table(label, peaks)]
    return curve("Spectrum — " + label, traces, note=SPECTRUM_NOTE, x_label="ω (rad/token)",
                 y_label="power", log_x=True, log_y=True, width="full", vlines=lines,
                 legend=True, tables=tables)


def peak_table(label: str, peaks: list[dict]) -> dict:
    """The top peaks as a table; the ω cells carry their value (``data-value``)."""
    rows = [[str(i + 1), {"text": fixed(p["omega"], 4), "attrs": {
                "data-pk": "omega", "data-value": repr(float(p["omega"]))}},
             fixed(2 * np.pi / p["omega"], 1) if num(p["omega"]) else "–",
             yes(p["significant"]), yes(p["matched"]), fixed(p["nearest_theta"], 4),
             "–" if num(p["rel_error"]) is None else f"{100 * p['rel_error']:.1f}%"]
            for i, p in enumerate(peaks)]
    return {"columns": ["rank", "ω (rad/token)", "period (tokens)", "significant", "matched",
                        "nearest θᵢ", "rel. error"], "rows": rows,
            "attrs": {"data-pk-peaks": label}}


def page(title: str, *, numbers: list, panels: list, anchor: str | None = None,
         notes=(), links=(), seq: dict | None = None, tables=(), long: dict | None = None,
         long_files: dict | None = None) -> dict:
    """A page as the viewer draws it (see the module docstring)."""
    return {"title": title, "anchor": anchor, "notes": list(notes), "links": list(links),
            "numbers": numbers, "seq": seq, "long": long, "longFiles": long_files,
            "panels": panels, "tables": list(tables)}


__all__ = ["KERNEL_SECTION", "curve", "declared", "fixed", "histogram", "kernel_panels",
           "matrix", "message", "page", "panel_entry", "arrange", "peak_table", "series", "sig",
           "spectrum_panel", "yes"]

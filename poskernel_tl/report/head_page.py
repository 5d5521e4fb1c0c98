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
  "sectionNote", ...}`` (the kinds' shapes: :mod:`poskernel_tl.panels`); consecutive
  panels of one section share its row. Every part's declared panels
  (:class:`~poskernel_tl.panels.Panel`, ``Part.PANELS``) are read by :func:`declared`,
  every analysis' (``AnalysisSpec.head_panels``: the spectra, the spectral analysis')
  by the hosts from its saved files;
- ``tables``: the "Further analyses" tables (``title``, ``columns``, ``rows`` or
  ``message``).
"""

import numpy as np

from poskernel_tl.encode import num
from poskernel_tl.panels import (
    KERNEL_NOTE,
    KERNEL_SECTION,
    Panel,
    curve,
    histogram,
    matrix,
    series,
)


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


def known_panels(terms, length: int, head: int, both: bool = False) -> list[dict]:
    """Each term's known kernel of the offset (ALiBi's ramp −m_h·Δ, a learned table b_h(Δ):
    :meth:`~poskernel_tl.models.terms.term.Term.known_kernel`) for query head ``head``, a
    dashed trace drawn with Track A's g(Δ) (joined to its plot by :func:`arrange`); ``both``
    (an encoder): also its keys-after side b_h(−Δ), dash-dotted."""
    out = []
    for term in terms.terms:
        known = term.known_kernel(range(1, length))
        if known is None:
            continue
        side = ", keys before the query" if both else ""
        traces = [series(np.asarray(known[head], np.float32),
                         name=f"known kernel: {term.label()}{side}", dash="dash")]
        if both:
            back = term.known_kernel(range(-1, -length, -1))[head]
            traces.append(series(np.asarray(back, np.float32), dash="dashdot",
                                 name=f"known kernel: {term.label()}, keys after the query"))
        out.append(curve(KERNEL_SECTION, traces, title="Track A g(Δ)",
                         x_label="|Δ| = |t − s|" if both else "lag Δ = t − s",
                         y_label="g(Δ)", log_x=True, note=KERNEL_NOTE))
    return out


def page(title: str, *, numbers: list, panels: list, anchor: str | None = None,
         notes=(), links=(), seq: dict | None = None, tables=(), long: dict | None = None,
         long_files: dict | None = None) -> dict:
    """A page as the viewer draws it (see the module docstring)."""
    return {"title": title, "anchor": anchor, "notes": list(notes), "links": list(links),
            "numbers": numbers, "seq": seq, "long": long, "longFiles": long_files,
            "panels": panels, "tables": list(tables)}


__all__ = ["arrange", "declared", "kernel_panels", "known_panels", "page", "panel_entry"]

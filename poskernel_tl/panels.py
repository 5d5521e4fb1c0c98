"""Head-view panels declared beside the fields they show.

A result part (:class:`~poskernel_tl.schema.Part`) lists its panels in ``PANELS``: each a
:class:`Panel` naming one of its fields (or properties) and how one head's slice of it is
drawn — a number in the view's first table, a curve over offsets or query rows, a matrix,
a histogram over sequences. The head page's builder
(:mod:`poskernel_tl.report.head_page`) collects the panels of every part a result holds,
for the report's head views and for ``pk.inspect_head`` alike, and the page's script
draws each kind the same way whoever declared it: a statistic's panel is one line of its
own module. The JSON shape of each kind (:func:`curve`, :func:`histogram`, :func:`matrix`,
:func:`message`, a curve's :func:`series`) is made here too, for the builder and for an
analysis that draws its own panels from its saved files (``AnalysisSpec.head_panels``).
"""

from dataclasses import dataclass

import numpy as np

from poskernel_tl.encode import num, typed

KINDS = ("number", "curve", "matrix", "histogram")
KERNEL_SECTION = "Positional kernel g(Δ)"  # where the g(Δ) of every source is drawn
KERNEL_NOTE = ("Each source on its own axes (their scales differ). Track A: mean sub-diagonal "
               "of the raw logits pooled over sequences; Track B: the same fit on the "
               "averaged Gram matrix. Orange: Track A within rows (a free constant per row "
               "of each sequence, which the softmax ignores), on the raw kernel's mean level.")
ORANGE = "#e08a2c"


@dataclass(frozen=True)
class Panel:
    """One head's view of the field ``field``: ``[layer, head_index, ...]`` read at
    (layer, head) — a scalar for ``number``, a vector for ``curve`` (x = ``first``,
    ``first`` + 1, …: 1 for offsets Δ, 0 for query rows), a [rows, columns] array for
    ``matrix``; ``[n_seqs, layer, head_index]`` read at (:, layer, head) for
    ``histogram``, with ``marker`` (a ``[layer, head_index]`` field) drawn as a line.
    ``title`` heads its section (a number: its row), ``note`` says what it shows; ``x`` and
    ``y`` label the axes. A curve's ``back`` names the field of the keys after the query
    (an encoder's Δ = −1, −2, …; drawn dotted where the part holds it), ``name`` its
    trace (``name_of``: a part attribute whose text is added), ``color`` its colour;
    curves of one section with one ``plot`` title share that plot, whichever part
    declares them (a statistic draws over Track A's g(Δ) this way)."""

    kind: str
    title: str
    field: str
    x: str = ""
    y: str = ""
    note: str = ""
    first: int = 1
    log_x: bool = False
    marker: str | None = None
    digits: int = 3
    plot: str = ""
    back: str | None = None
    name: str = ""
    name_of: str | None = None
    color: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r}; choose one of "
                             f"{', '.join(KINDS)}")

    def values(self, part, layer: int, head: int) -> np.ndarray | float | None:
        """This head's slice of the field (None where the part does not hold it)."""
        value = getattr(part, self.field, None)
        if value is None:
            return None
        value = np.asarray(value, np.float64)
        return value[:, layer, head] if self.kind == "histogram" else value[layer, head]

    def back_values(self, part, layer: int, head: int) -> np.ndarray | None:
        value = None if self.back is None else getattr(part, self.back, None)
        return None if value is None else np.asarray(value, np.float64)[layer, head]

    def trace_name(self, part) -> str:
        extra = "" if self.name_of is None else str(getattr(part, self.name_of))
        return f"{self.name} ({extra})" if self.name and extra else self.name or extra

    def marker_value(self, part, layer: int, head: int) -> float | None:
        if self.marker is None or getattr(part, self.marker, None) is None:
            return None
        return float(np.asarray(getattr(part, self.marker))[layer, head])


# ------------------------------------------------------------ the kinds' shapes
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



__all__ = ["KERNEL_NOTE", "KERNEL_SECTION", "KINDS", "ORANGE", "Panel", "curve", "fixed",
           "histogram", "matrix", "message", "series", "sig", "yes"]

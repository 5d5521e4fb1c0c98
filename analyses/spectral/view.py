"""The spectral analysis' head-view panels: each head's spectrum |ĝ(ω)|² of both g sources
(Track B's, pre-registered; Track A's, exploratory) with the rotary frequencies, the top
peaks and the head's test summary, read from the analysis' saved files
(:class:`~poskernel_tl.analyses.spectral.io.SavedSpectral`), or a message naming the
command that writes them. Declared on the analysis (``SPEC.head_panels``); the report's
head pages and a notebook's view of one head (:func:`spectrum_panel`) draw them alike."""

import numpy as np

from poskernel_tl.analyses.spectral.io import LABELS, SOURCES, SavedSpectral
from poskernel_tl.encode import num, typed
from poskernel_tl.panels import curve, fixed, message, series, sig, yes

COMMAND = "poskernel spectral DIR"
OMEGA = "omega"  # the spectra's frequencies ω > 0, shared by every head of a condition
NOTE = ("Dashed: the model's rotary frequencies θᵢ. Triangles: the top peaks (filled: "
        "significant; green: within ±10% of a θᵢ).")
HEAD_FIELDS = ("status", "preregistered", "n_peaks_found", "n_significant", "n_matched",
               "frac_matched", "criterion_met", "chance", "p_value", "aligned", "fpr",
               "ref_peak_r", "gate_met")
PEAK_FIELDS = ("omega", "magnitude", "significant", "matched", "nearest_theta", "rel_error")
PEAK_KINDS = (("significant, matched", "triangle-down", "#2ca02c",
               lambda p: p["significant"] and p["matched"]),
              ("significant, unmatched", "triangle-down", "#d62728",
               lambda p: p["significant"] and not p["matched"]),
              ("not significant", "triangle-down-open", "#000", lambda p: not p["significant"]))


def spectrum_panel(label: str, omega: np.ndarray, power: np.ndarray, thetas, *,
                   peaks: list[dict] = (), summary: list = (), shared_x: str | None = None
                   ) -> dict:
    """|ĝ(ω)|² over ω > 0 (log-log) with the rotary frequencies marked and the top
    ``peaks`` (dicts of :data:`PEAK_FIELDS`) as markers and a table; ``summary``:
    (quantity, text) rows. ``shared_x``: the name under which the page's file holds ω > 0
    for every head (else it travels with the panel)."""
    x = np.asarray(omega, np.float64)[1:]
    y = np.asarray(power, np.float64)[1:]
    scale = float(np.nanmax(y)) if np.isfinite(y).any() and np.nanmax(y) > 0 else 1.0
    traces = [{**series(typed(y / scale, "f2"), name="|ĝ(ω)|² as analysed",
                        x=shared_x or typed(x, "f8")), "scale": scale}]  # a display copy
    for name, symbol, color, chosen in PEAK_KINDS:
        mine = [p for p in peaks if chosen(p)]
        traces.append(series([num(p["magnitude"] ** 2) for p in mine], mode="markers",
                             x=[num(p["omega"]) for p in mine], name=name, color=color,
                             symbol=symbol))
    lines = [t for t in (thetas if thetas is not None else ())
             if len(x) and x[0] <= t <= np.pi]
    tables = [] if not peaks and not summary else [
        {"columns": ["", ""], "rows": [[str(a), str(b)] for a, b in summary]},
        peak_table(label, peaks)]
    return curve("Spectrum — " + label, traces, note=NOTE, x_label="ω (rad/token)",
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


class SpectrumPanels:
    """The panels of every head of one condition (``self(layer, head)``): each source's
    rows and peaks read once; ``shared``: what the panels refer to by name (ω > 0)."""

    def __init__(self, saved: SavedSpectral, result):
        self.saved, self.thetas, self.n_heads = saved, result.thetas, result.n_heads
        self.sources = {source: self._source(source, result) for source in SOURCES}
        omega = saved.omega
        self.shared = {} if omega is None else {OMEGA: typed(np.asarray(omega)[1:], "f8")}

    def _source(self, source: str, r) -> dict:
        """One source's ``status``, ``label``, ``message`` and, where it ran, each head's
        fields and peaks (index layer × n_heads + head)."""
        saved = self.saved
        if not saved.has(source):
            problems = [f"{f}: {why}" for f, why in saved.problems]
            status = "not run" if source in saved.missing else "unreadable"
            return {"status": status, "label": LABELS[source], "message": COMMAND
                    if status == "not run" else "; ".join(problems) or "incomplete files"}
        t = saved.tables[source]
        rows = [dict(zip(HEAD_FIELDS, (num(v) for v in rec))) for rec in
                t.reindex(columns=list(HEAD_FIELDS)).itertuples(index=False)]
        peaks: list = [[] for _ in range(r.n_layers * r.n_heads)]
        for rec in saved.peaks[source].to_dict("records"):
            peaks[int(rec["layer"]) * r.n_heads + int(rec["head"])].append(
                {k: num(rec[k]) for k in PEAK_FIELDS})
        label = LABELS[source] if str(t["source"].iloc[0]) != "gram_raw" else \
            "Track B g, raw Gram: the condition is uncentered (pre-registered)"
        return {"status": "ok", "label": label, "rows": rows, "peaks": peaks}

    def __call__(self, layer: int, head: int) -> list[dict]:
        return [self._panel(self.sources[s], s, layer, head) for s in ("trackB", "trackA")]

    def _panel(self, s: dict, source: str, layer: int, head: int) -> dict:
        """One head's spectrum of ``source`` (a message where the analysis is missing)."""
        if s["status"] != "ok":
            return message("Spectrum — " + s["label"], s["status"], s["message"])
        i = layer * self.n_heads + head
        f = s["rows"][i]
        summary = [("status", f["status"]), ("aligned with θᵢ (p < 0.05)", yes(f["aligned"])),
                   ("p-value (rescaled-θ null)", sig(f["p_value"])),
                   ("false-positive rate of the test", sig(f["fpr"])),
                   ("significant peaks", f"{fixed(f['n_significant'], 0)} of "
                                         f"{fixed(f['n_peaks_found'], 0)}"),
                   ("top-5 peaks within ±10% of a θᵢ", f"{fixed(f['n_matched'], 0)} (chance "
                                                       f"{fixed(f['chance'], 2)})"),
                   ("in the pre-registered analysis", yes(f["preregistered"]))]
        mags = np.asarray(self.saved.spectra[source][layer, head], np.float64)
        return spectrum_panel(s["label"], self.saved.omega, mags ** 2, self.thetas,
                              peaks=s["peaks"][i], summary=summary, shared_x=OMEGA)


__all__ = ["COMMAND", "OMEGA", "SpectrumPanels", "peak_table", "spectrum_panel"]

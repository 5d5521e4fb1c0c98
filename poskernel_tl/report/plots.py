"""Plotly figures of a :class:`~poskernel_tl.measurement.result.ConditionResult` for
notebooks: objects to restyle and combine (``fig.show()``, ``fig.update_layout(...)``),
drawn from the same arrays as the report's viewer with its styling (Viridis R² on 0–1,
layer 0 at the top, white lines between grouped-query kv groups, lags on a log axis, θᵢ as
dashed lines).

    import poskernel_tl as pk
    pk.plots.r2_heatmap(res).show()
    pk.plots.kernels(res, [(1, 2), (5, 0)]).show()
    pk.plots.spectrum(res, 1, 2).show()
    pk.plots.head_map([res1, res2], x="R2_pooled", y="tl_prev_token", color="kernel_class")
"""

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from poskernel_tl.analyses.spectral.summary import kernel_spectrum
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import head_map as HM
from poskernel_tl.report.html import first_display


class Figure(go.Figure):
    """A ``plotly.graph_objects.Figure`` that a notebook shows offline: as HTML carrying
    plotly.js the first time in the session (unless a head view carried it) and reusing it
    after (no CDN, no MathJax)."""

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        return {"text/html": self.to_html(full_html=False, include_mathjax=False,
                                          include_plotlyjs=first_display("plotly"))}

    def _ipython_display_(self):  # IPython asks this before any _repr_ (plotly's renderers)
        from IPython.display import publish_display_data

        publish_display_data(self._repr_mimebundle_())


# a log axis labels every tick with its whole value (20, 30, not Plotly's small "2", "3")
LOG_AXIS = dict(type="log", minorloglabels="complete")


def _title(r: ConditionResult, what: str) -> str:
    return f"{r.model} · {r.dataset} · T={r.length} — {what}"


def r2_heatmap(r: ConditionResult, track: str = "A") -> go.Figure:
    """Figure 1: pooled R² per (layer, head) of Track A (``track="B"``: Track B's centered
    Gram, raw where uncentered); the hover names layer, head, the layer's scheme, R²."""
    z = r.r2_pooled if track == "A" else (r.r2_gram if r.centered else r.r2_gram_raw)
    kinds = [s.kind for s in r.spec.layers or ()] or [r.spec.pe or ""] * r.n_layers
    custom = [[k] * r.n_heads for k in kinds]
    g = r.spec.group_size
    lines = [dict(type="line", x0=b - 0.5, x1=b - 0.5, y0=-0.5, y1=r.n_layers - 0.5,
                  line=dict(color="white", width=2)) for b in range(g, r.n_heads, g)]
    fig = Figure(go.Heatmap(z=np.asarray(z, np.float64), zmin=0, zmax=1,
                               colorscale="Viridis", customdata=custom,
                               colorbar=dict(title=dict(text="R²")),
                               hovertemplate="L%{y}H%{x} (%{customdata}): R² %{z:.3f}"
                                             "<extra></extra>"))
    fig.update_layout(title=_title(r, f"Track {track} pooled R²"), shapes=lines,
                      xaxis=dict(title="head", dtick=1),
                      yaxis=dict(title="layer", autorange="reversed"),
                      height=max(320, 18 * r.n_layers + 120))
    return fig


def kernels(r: ConditionResult, heads: Sequence[tuple[int, int]], track: str = "A"
            ) -> go.Figure:
    """g(Δ) of the chosen ``(layer, head)`` pairs over Δ = 1..T−1 (Track A's pooled g, or
    Track B's: ``track="B"``); a sliding-window layer's g ends at its window."""
    g_all = r.g_pooled if track == "A" else r.g_trackB[0]
    lags = np.arange(1, r.length)
    fig = Figure([go.Scatter(x=lags, y=np.asarray(g_all[L, H], np.float64),
                                mode="lines", name=f"L{L}H{H}",
                                hovertemplate=f"L{L}H{H} Δ=%{{x}}: g %{{y:.4g}}<extra></extra>")
                     for L, H in heads])
    fig.update_layout(title=_title(r, f"Track {track} g(Δ)"),
                      xaxis=dict(title="lag Δ = t − s", **LOG_AXIS), yaxis=dict(title="g(Δ)"))
    return fig


def spectrum(r: ConditionResult, layer: int, head: int, track: str = "B") -> go.Figure:
    """|ĝ(ω)|² of one head's g (Track B's by default, as the spectral analysis reads it;
    over the offsets its layer's mask keeps), processed as the spectral analysis does,
    with the layer's own rotary frequencies θᵢ as dashed lines."""
    g = np.asarray((r.g_trackB[0] if track == "B" else r.g_pooled)[layer, head], np.float64)
    g = g[np.isfinite(g)]  # a sliding window's kept offsets
    thetas = r.spec.rotary_frequencies(layer)
    omega, power, _, _ = kernel_spectrum(g, thetas)
    fig = Figure(go.Scatter(x=omega[1:], y=power[1:], mode="lines", name="|ĝ(ω)|²"))
    for t in [] if thetas is None else thetas:
        fig.add_vline(x=float(t), line=dict(color="orange", width=1, dash="dash"))
    fig.update_layout(title=_title(r, f"L{layer}H{head} spectrum of Track {track} g(Δ)"),
                      xaxis=dict(title="ω (rad/token)", **LOG_AXIS),
                      yaxis=dict(title="power", **LOG_AXIS))
    return fig


def head_map(results, x: str = "R2_pooled", y: str | None = None, color: str | None = None,
             **where) -> go.Figure:
    """Every head of every condition as a point (the report's head map): ``results`` a
    results folder, a list of :class:`ConditionResult` or a table of
    :func:`~poskernel_tl.report.head_map.results_table`; ``x``, ``y`` any numeric per-head
    column, ``color`` any column (categorical: one trace per value); ``where``: column =
    value or list of values to keep (e.g. ``model="gpt2"``, ``kind=["rope"]``)."""
    table = HM.results_table(results)
    num, cat = HM.columns(table)
    y = y or next((c for c in ("tl_prev_token", "R2_gram", "R2_nosink") if c in num), num[0])
    color = color or next((c for c in ("kernel_class", "model") if c in cat), cat[0])
    for name, col, allowed in (("x", x, num), ("y", y, num), ("color", color, num + cat)):
        if col not in allowed:
            raise ValueError(f"{name}={col!r}: no column of that name; choose from {allowed}")
    for col, values in where.items():
        table = table[table[col].isin(values if isinstance(values, list | tuple) else [values])]
    names = (table["model"] + " · " + table["dataset"].astype(str) + " · T=" +
             table["length"].astype(str) + " · L" + table["layer"].astype(str) + "H" +
             table["head"].astype(str)).to_numpy()
    kind = go.Scattergl if len(table) > 3000 else go.Scatter
    label = lambda c: HM.LABELS.get(c, c)  # noqa: E731
    hover = (f"%{{text}}<br>{label(x)}: %{{x:.4g}}<br>{label(y)}: %{{y:.4g}}<extra></extra>")
    if color in cat:
        groups = table.groupby(table[color].astype(str), sort=True)
        traces = [kind(x=t[x], y=t[y], mode="markers", name=str(v), text=names[
            table.index.get_indexer(t.index)], hovertemplate=hover, marker=dict(size=6))
                  for v, t in groups]
    else:
        traces = [kind(x=table[x], y=table[y], mode="markers", text=names, hovertemplate=hover,
                       marker=dict(size=6, color=table[color], colorscale="Viridis",
                                   showscale=True, colorbar=dict(title=label(color))))]
    fig = Figure(traces)
    fig.update_layout(title=f"Head map: {len(table)} heads", xaxis_title=label(x),
                      yaxis_title=label(y), legend_title=label(color), height=560)
    return fig


__all__ = ["Figure", "head_map", "kernels", "r2_heatmap", "spectrum"]

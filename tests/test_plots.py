"""The Python API's Plotly figures: the result's own arrays, the viewer's styling."""

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from tiny_models import arch_loaded

import poskernel_tl as pk
import poskernel_tl.report.html as report_html


def test_figures_are_plotly_objects_of_the_results_arrays(tiny_tokenizer, monkeypatch):
    model = arch_loaded("gemma3", tiny_tokenizer)
    ids = torch.randint(3, 290, (8, 40), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids[4:], ids[:4], progress=False)
    heat = pk.plots.r2_heatmap(res)
    assert isinstance(heat, go.Figure)
    assert np.array_equal(np.asarray(heat.data[0].z), res.r2_pooled)
    monkeypatch.setattr(report_html, "SHOWN", set())  # a notebook: plotly.js once, reused
    first, later = (f._repr_mimebundle_()["text/html"] for f in (heat, heat))
    assert len(first) > 1_000_000 and len(later) < 100_000 and "src=\"http" not in first
    assert heat.data[0].customdata[2][0] == "rope 1e+06"  # layer 2, the global one
    assert heat.layout.yaxis.autorange == "reversed" and len(heat.layout.shapes) == 0
    assert np.array_equal(np.asarray(pk.plots.r2_heatmap(res, "B").data[0].z), res.r2_gram)
    kern = pk.plots.kernels(res, [(0, 1), (2, 3)])
    assert [t.name for t in kern.data] == ["L0H1", "L2H3"]
    assert np.array_equal(np.asarray(kern.data[1].y), res.g_pooled[2, 3], equal_nan=True)
    local = pk.plots.spectrum(res, 0, 1)
    assert len(local.layout.shapes) == 8  # the layer's 8 rotary pairs as θ lines
    assert np.isclose(local.layout.shapes[1].x0, res.spec.rotary_frequencies(0)[1])
    glob = pk.plots.spectrum(res, 2, 1)
    assert np.isclose(glob.layout.shapes[1].x0, res.spec.rotary_frequencies(2)[1])
    assert len(glob.data[0].x) > len(local.data[0].x)  # the window's 15 offsets vs 39
    # log axes label every tick with its value (20, 30: not Plotly's small "2", "3"), in
    # the figures and in the head view's page script
    for axis in (kern.layout.xaxis, local.layout.xaxis, local.layout.yaxis):
        assert axis.type == "log" and axis.minorloglabels == "complete"
    script = (Path(pk.__file__).parent / "report" / "static" / "viewer.js").read_text()
    assert script.count('type: "log"') == script.count(
        'type: "log", minorloglabels: "complete"') > 0

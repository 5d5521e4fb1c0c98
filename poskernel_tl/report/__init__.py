"""Rendering of report pages: per-head and per-layer HTML pages with circuitsvis
attention views (sharing one copy of the circuitsvis bundle), embedded figures and
escaped tables. Works from numpy arrays and strings; loads no model."""

from poskernel_tl.report.head_figures import (
    ToeplitzFit,
    fig_kernel,
    fig_logits_fit,
    fig_r2_distribution,
    fig_spectrum,
    toeplitz_fit,
)
from poskernel_tl.report.head_page import (
    HeadPageData,
    head_html,
    layer_html,
    render_head_page,
    render_layer_page,
    write_head_page,
)
from poskernel_tl.report.html import (
    ASSETS_DIR,
    BUNDLE_NAME,
    assets_rel_for,
    attention_heads_html,
    attention_pattern_html,
    bundle_js,
    circuitsvis_html,
    escape,
    json_for_script,
    relative_url,
    write_assets,
)

__all__ = [
    "ASSETS_DIR",
    "BUNDLE_NAME",
    "HeadPageData",
    "ToeplitzFit",
    "assets_rel_for",
    "attention_heads_html",
    "attention_pattern_html",
    "bundle_js",
    "circuitsvis_html",
    "escape",
    "fig_kernel",
    "fig_logits_fit",
    "fig_r2_distribution",
    "fig_spectrum",
    "head_html",
    "json_for_script",
    "layer_html",
    "relative_url",
    "render_head_page",
    "render_layer_page",
    "toeplitz_fit",
    "write_assets",
    "write_head_page",
]

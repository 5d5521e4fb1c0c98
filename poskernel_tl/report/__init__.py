"""The report: ``build_report`` (figures, Table 1, verdicts, one data file per condition and
``report.html`` with the head viewer), and the same viewer for one head in a notebook or a
standalone page (:class:`HeadPageData`, :func:`head_html`, :func:`write_head_page`)."""

from poskernel_tl.report.html import (
    ASSETS_DIR,
    SHOWN,
    escape,
    first_display,
    json_for_script,
    relative_url,
)
from poskernel_tl.report.viewer import (
    BUNDLE_NAME,
    PLOTLY_NAME,
    SHARED,
    HeadPageData,
    assets_rel_for,
    head_html,
    head_payload,
    write_assets,
    write_head_page,
)

__all__ = [
    "ASSETS_DIR",
    "BUNDLE_NAME",
    "PLOTLY_NAME",
    "SHARED",
    "SHOWN",
    "HeadPageData",
    "assets_rel_for",
    "escape",
    "first_display",
    "head_html",
    "head_payload",
    "json_for_script",
    "relative_url",
    "write_assets",
    "write_head_page",
]

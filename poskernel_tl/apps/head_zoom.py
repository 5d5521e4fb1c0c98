"""One window of a head view at full resolution: :meth:`HeadView.zoom`.

A long head view in a notebook carries q and k of its first window only (each view stays
light); ``view.zoom(rows=(R0, R1), keys=(K0, K1))`` draws any other window of the same
head from the same q and k: logits scale · q · k, the fit g(t − s), the residual and the
pattern exp(A − lse(t)), with the window's tokens (:mod:`poskernel_tl.report.viewer_long`).
"""

from dataclasses import dataclass
from pathlib import Path

from poskernel_tl.report import SHARED, first_display, head_html, write_head_page
from poskernel_tl.report.viewer_long import factor_window


@dataclass
class HeadZoom:
    """The window (r0, r1, c0, c1), ends included, of a head view's ``page_data()``."""

    data: object  # a HeadPageData
    window: tuple[int, int, int, int]

    @classmethod
    def of(cls, data, rows: tuple[int, int], keys: tuple[int, int] | None = None) -> "HeadZoom":
        """``rows`` (R0, R1) and ``keys`` (K0, K1, default the rows), ends included;
        ValueError outside the sequence or over the page's largest window."""
        keys = rows if keys is None else keys
        return cls(data, factor_window(len(data.tokens), (*rows, *keys)))

    def __repr__(self) -> str:
        r0, r1, c0, c1 = self.window
        return f"HeadZoom({self.data.title!r}, rows={r0}..{r1}, keys={c0}..{c1})"

    def to_html(self, assets_rel: str | None = None) -> str:
        return head_html(self.data, assets_rel=assets_rel, lean=True, zoom=self.window)

    def _repr_html_(self) -> str:
        first = first_display("viewer", carries=("plotly",))
        return self.to_html(assets_rel=None if first else SHARED)

    def save(self, path) -> Path:
        """The window as a standalone page at ``path``."""
        return write_head_page(Path(path), self.data, assets_rel=None, zoom=self.window)


__all__ = ["HeadZoom"]

"""One head's page and one layer's page, from numpy arrays and strings.

A head page shows the head's attention pattern on one sequence (circuitsvis, loaded
from the report's shared bundle), the token strings, the logit matrix beside its
Toeplitz fit g(t−s) and the residual, g(Δ) from Track A and Track B, the spectrum of
g(Δ) with the positional-encoding frequencies θᵢ, the per-sequence R² distribution and
the head's rows of every table. A layer page shows all heads of a layer side by side
(circuitsvis ``AttentionHeads``) with links to the head pages.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from jaxtyping import Float

from poskernel_tl.report import head_figures as figures
from poskernel_tl.report.extras import HEAD_TABLE, head_rows_html
from poskernel_tl.report.html import (
    attention_heads_html,
    attention_pattern_html,
    escape,
    figure_img,
    links_html,
    page_html,
    report_block,
    table_html,
    tokens_html,
    values_html,
    write_page,
)


@dataclass
class HeadPageData:
    """Everything one head's page shows. Arrays are numpy; optional parts may be None.

    ``pattern`` and ``logits`` are one sequence's attention probabilities and
    pre-softmax scores (``hook_pattern`` / ``hook_attn_scores``) for this head, over the
    sequence whose token strings are ``tokens``; only their strictly lower triangle
    enters the fit. ``spectrum`` is ``(omega, power)`` with ω in rad/token; ``thetas``
    the positional-encoding frequencies to mark. ``tables`` maps a caption to this head's
    rows of a result table; ``r2_values`` names pooled R² numbers shown at the top.
    ``beyond`` holds the head's rows of the kernel-patching, separable and mean-field
    tables (:func:`poskernel_tl.report.extras.head_rows`), shown in their own section; a
    table captioned :data:`~poskernel_tl.report.extras.HEAD_TABLE` in ``tables`` is moved
    there.
    """

    title: str
    tokens: list[str]
    pattern: Float[np.ndarray, "query_pos key_pos"]
    logits: Float[np.ndarray, "query_pos key_pos"]
    g_trackA: Float[np.ndarray, " lag"] | None = None
    g_trackB: Float[np.ndarray, " lag"] | None = None
    spectrum: tuple[Float[np.ndarray, " freq"], Float[np.ndarray, " freq"]] | None = None
    thetas: Float[np.ndarray, " n_theta"] | None = None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    r2_values: dict[str, float] = field(default_factory=dict)
    per_seq_r2: Float[np.ndarray, " n_seqs"] | None = None
    notes: Sequence[str] = ()
    links: Mapping[str, str] = field(default_factory=dict)
    beyond: pd.DataFrame | None = None

    def __post_init__(self):
        if HEAD_TABLE in self.tables:
            tables = dict(self.tables)
            found = tables.pop(HEAD_TABLE)
            self.tables = tables
            if self.beyond is None:
                self.beyond = found
        T = len(self.tokens)
        if T < 3:
            raise ValueError(f"a head page needs at least 3 tokens, got {T}")
        for name in ("pattern", "logits"):
            shape = getattr(self, name).shape
            if shape != (T, T):
                raise ValueError(f"{name} has shape {shape}; expected ({T}, {T}) for "
                                 f"{T} tokens")
        if self.spectrum is not None and self.spectrum[0].shape != self.spectrum[1].shape:
            raise ValueError("spectrum omega and power differ in length")


def _section(title: str, content: str, note: str = "") -> str:
    note_html = f'<p class="pk-note">{escape(note)}</p>' if note else ""
    return f"<section>\n<h2>{escape(title)}</h2>\n{note_html}\n{content}\n</section>"


def _header(title: str, links: Mapping[str, str], notes: Sequence[str]) -> str:
    parts = [f"<h1>{escape(title)}</h1>", links_html(links)]
    parts += [f'<p class="pk-note">{escape(n)}</p>' for n in notes]
    return "\n".join(p for p in parts if p)


def head_html(
    data: HeadPageData,
    *,
    assets_rel: str | None,
    max_tokens: int = 256,
    dpi: int = 80,
    include_style: bool = True,
) -> str:
    """The head view as an HTML block: a notebook's ``_repr_html_`` (``assets_rel=None``
    inlines the circuitsvis bundle) or the body of :func:`render_head_page`."""
    fit = figures.toeplitz_fit(data.logits)
    r2_shown = {f"R² of the fit below (this sequence, {len(data.tokens)} tokens)": fit.r2}
    r2_shown.update(data.r2_values)
    view = attention_pattern_html(data.tokens, data.pattern, assets_rel=assets_rel,
                                  max_tokens=max_tokens)
    T = len(data.tokens)
    note = f"The figures below use all {T} tokens." if T > max_tokens else ""
    parts = [
        _header(data.title, data.links, data.notes),
        _section("Shift invariance", values_html(r2_shown)),
        _section("Attention pattern",
                 f'<div class="pk-cv-box">{view}</div>\n{tokens_html(data.tokens)}', note),
        _section(
            "Logits and their Toeplitz fit",
            figure_img(figures.fig_logits_fit(data.logits, fit),
                       "logits, Toeplitz fit and residual", dpi=dpi),
            "Strictly lower triangle (s < t). g(Δ) is the mean of sub-diagonal Δ = t − s; "
            "R² = 1 − SS_res/SS_tot over those entries."),
    ]
    if data.g_trackA is not None or data.g_trackB is not None:
        parts.append(_section(
            "Positional kernel g(Δ)",
            figure_img(figures.fig_kernel(data.g_trackA, data.g_trackB), "g(Delta)", dpi=dpi),
            "Track A: mean sub-diagonal of the raw logits, pooled over sequences. "
            "Track B: the same fit on the content-centered averaged Gram matrix."))
    if data.spectrum is not None:
        omega, power = data.spectrum
        parts.append(_section(
            "Spectrum of g(Δ)",
            figure_img(figures.fig_spectrum(omega, power, data.thetas), "spectrum", dpi=dpi),
            "Dashed lines: the model's positional-encoding frequencies θᵢ."
            if data.thetas is not None else ""))
    if data.per_seq_r2 is not None:
        parts.append(_section(
            "Per-sequence R²",
            figure_img(figures.fig_r2_distribution(data.per_seq_r2, data.r2_values),
                       "per-sequence R2", dpi=dpi)))
    if data.beyond is not None:
        parts.append(_section(
            "Beyond the seeds", head_rows_html(data.beyond),
            "This head in the kernel-patching, separable-baseline and mean-field tables "
            "(poskernel analyze NAME); see the report's section of the same name."))
    if data.tables:
        tables = "\n".join(f"<h3>{escape(name)}</h3>\n{table_html(df)}"
                           for name, df in data.tables.items())
        parts.append(_section("This head in the result tables", tables))
    return report_block("\n".join(parts), include_style=include_style)


def write_head_page(
    path: str | os.PathLike,
    data: HeadPageData,
    *,
    assets_rel: str | None,
    max_tokens: int = 256,
    dpi: int = 80,
) -> Path:
    """Write ``data`` as a standalone page at ``path``; see :func:`render_head_page`."""
    block = head_html(data, assets_rel=assets_rel, max_tokens=max_tokens, dpi=dpi,
                      include_style=False)
    return write_page(path, page_html(data.title, block))


def render_head_page(
    path: str | os.PathLike,
    *,
    title: str,
    tokens: list[str],
    pattern: Float[np.ndarray, "query_pos key_pos"],
    logits: Float[np.ndarray, "query_pos key_pos"],
    g_trackA: Float[np.ndarray, " lag"] | None = None,
    g_trackB: Float[np.ndarray, " lag"] | None = None,
    spectrum: tuple[Float[np.ndarray, " freq"], Float[np.ndarray, " freq"]] | None = None,
    thetas: Float[np.ndarray, " n_theta"] | None = None,
    tables: dict[str, pd.DataFrame] | None = None,
    r2_values: dict[str, float] | None = None,
    per_seq_r2: Float[np.ndarray, " n_seqs"] | None = None,
    beyond: pd.DataFrame | None = None,
    assets_rel: str | None,
    notes: Sequence[str] = (),
    links: Mapping[str, str] | None = None,
    max_tokens: int = 256,
    dpi: int = 80,
) -> Path:
    """Write one head's standalone page and return its path.

    ``assets_rel`` is the relative URL from the page's folder to the report's assets
    folder (see :func:`poskernel_tl.report.assets_rel_for`; call
    :func:`poskernel_tl.report.write_assets` once per report), or None to inline the
    circuitsvis bundle in the page (a single self-contained file, ≈ 1.3 MB larger).
    Patterns longer than ``max_tokens`` are shown truncated, with a note; ``links``
    (``{label: relative href}``) go in the page header; ``beyond`` (the head's rows of
    :func:`poskernel_tl.report.extras.head_rows`) adds the "Beyond the seeds" section.
    """
    data = HeadPageData(
        title=title, tokens=list(tokens), pattern=pattern, logits=logits,
        g_trackA=g_trackA, g_trackB=g_trackB, spectrum=spectrum, thetas=thetas,
        tables=dict(tables or {}), r2_values=dict(r2_values or {}), per_seq_r2=per_seq_r2,
        notes=tuple(notes), links=dict(links or {}), beyond=beyond)
    return write_head_page(path, data, assets_rel=assets_rel, max_tokens=max_tokens, dpi=dpi)


def layer_html(
    *,
    title: str,
    tokens: list[str],
    patterns: Float[np.ndarray, "head_index query_pos key_pos"],
    head_names: list[str],
    assets_rel: str | None,
    links: Mapping[str, str] | None = None,
    tables: dict[str, pd.DataFrame] | None = None,
    notes: Sequence[str] = (),
    max_tokens: int = 64,
    include_style: bool = True,
) -> str:
    """All heads of one layer as an HTML block (circuitsvis ``AttentionHeads``)."""
    if len(tokens) != patterns.shape[1] or patterns.shape[1] != patterns.shape[2]:
        raise ValueError(f"patterns of shape {patterns.shape} for {len(tokens)} tokens")
    view = attention_heads_html(patterns, tokens, head_names, assets_rel=assets_rel,
                                max_tokens=max_tokens)
    parts = [
        _header(title, links or {}, notes),
        _section("Attention patterns of every head",
                 f'<div class="pk-cv-box">{view}</div>\n{tokens_html(tokens)}'),
    ]
    for name, df in (tables or {}).items():
        parts.append(_section(name, table_html(df)))
    return report_block("\n".join(parts), include_style=include_style)


def render_layer_page(
    path: str | os.PathLike,
    *,
    title: str,
    tokens: list[str],
    patterns: Float[np.ndarray, "head_index query_pos key_pos"],
    head_names: list[str],
    assets_rel: str | None,
    links: Mapping[str, str] | None = None,
    tables: dict[str, pd.DataFrame] | None = None,
    notes: Sequence[str] = (),
    max_tokens: int = 64,
) -> Path:
    """Write one layer's page (every head's pattern side by side) and return its path.
    ``links`` (``{label: relative href}``, e.g. each head's page) go in the header;
    ``assets_rel`` as in :func:`render_head_page`."""
    block = layer_html(title=title, tokens=list(tokens), patterns=patterns,
                       head_names=list(head_names), assets_rel=assets_rel, links=links,
                       tables=tables, notes=notes, max_tokens=max_tokens,
                       include_style=False)
    return write_page(path, page_html(title, block))

"""The report's head pages and layer pages, written from :class:`ConditionResult` values.

Layout (one folder per condition, the circuitsvis bundle once in ``report/assets/``)::

    report/heads/{model}/{dataset}_{T}/L{layer}H{head}.html   one page per head
    report/heads/{model}/{dataset}_{T}/L{layer}.html          one page per layer

A head page shows the head's attention pattern on the first saved visualization sequence
(the softmax of ``result.logits`` over the keys s < t; when the condition saved no
logits the page says so and shows the rest), the logits beside their Toeplitz fit,
g(Δ) from Track A and Track B, the spectrum of the Track B g(Δ) with the rotary
frequencies and the spectral alignment, the per-sequence R² distribution, and the
head's rows of the Track A / Track B tables (per-sequence rows summarised) and of any
further table passed in. A layer page shows every head of the layer side by side
(circuitsvis ``AttentionHeads``) with a summary table and links to the head pages.

Size: patterns are sent for the first ``max_tokens`` (128) tokens, rounded to 3
decimals; figures are palette PNGs at 55 dpi. A 256-token head page of SmolLM2 is
≈ 140 kB, a 9-head layer page ≈ 60 kB, so the demo grid (3 conditions × 270 heads)
needs ≈ 120 MB.
"""

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from poskernel_tl.constants import dataset_slug, model_slug
from poskernel_tl.inspect import (
    _sentence,
    alignment_frames,
    alignment_line,
    kernel_spectrum,
    token_strings,
)
from poskernel_tl.report import head_figures as figures
from poskernel_tl.report.extras import HEAD_TABLE, head_rows_html
from poskernel_tl.report.head_page import HeadPageData, render_layer_page, write_head_page
from poskernel_tl.report.html import (
    assets_rel_for,
    escape,
    figure_img,
    links_html,
    page_html,
    relative_url,
    report_block,
    table_html,
    values_html,
    write_assets,
    write_page,
)
from poskernel_tl.result import ConditionResult

HEADS_DIR = "heads"
REPORT_PAGE = "report.html"

# (condition, seq_id) -> one token string per position, or None for index labels
TokenDecoder = Callable[[ConditionResult, int], Sequence[str] | None]

# ------------------------------------------------------------------------- paths


def condition_folder(report_dir, model: str, dataset: str, length: int) -> Path:
    """``report_dir/heads/{model}/{dataset}_{T}`` (filename-safe slugs)."""
    return Path(report_dir) / HEADS_DIR / model_slug(model) / f"{dataset_slug(dataset)}_{length}"


def head_page_path(report_dir, model: str, dataset: str, length: int, layer: int,
                   head: int) -> Path:
    return condition_folder(report_dir, model, dataset, length) / f"L{layer}H{head}.html"


def layer_page_path(report_dir, model: str, dataset: str, length: int, layer: int) -> Path:
    return condition_folder(report_dir, model, dataset, length) / f"L{layer}.html"


def head_page_href(model: str, dataset: str, length: int, layer: int, head: int) -> str:
    """The link from ``report/report.html`` to a head page (relative, forward slashes)."""
    return head_page_path(Path("."), model, dataset, length, layer, head).as_posix()


# ----------------------------------------------------------------------- tokens


def sequence_tokens(out_dir, tokenizer) -> TokenDecoder:
    """A ``tokenizer_decode`` for :func:`write_head_pages` reading the run's sequence
    files (``out_dir/data/{model}_{dataset}_{T}_seqs.pt``): the token strings of the
    sequence with that ``seq_id``, or None when the file is missing or does not fit.
    ``tokenizer``: one tokenizer, or a mapping model name → tokenizer (grids of several
    models; a model missing from it gets index labels)."""
    from poskernel_tl.constants import seqs_path
    from poskernel_tl.sequences import DataError, load_sequences

    cache: dict = {}

    def decode(result: ConditionResult, seq_id: int) -> list[str] | None:
        key = (result.model, result.dataset, result.length)
        if key not in cache:
            try:
                cache[key] = load_sequences(seqs_path(Path(out_dir), *key))["input_ids"]
            except DataError:
                cache[key] = None
        ids = cache[key]
        tok = tokenizer.get(result.model) if isinstance(tokenizer, Mapping) else tokenizer
        if tok is None or ids is None or not 0 <= seq_id < len(ids) \
                or ids.shape[1] != result.length:
            return None
        return token_strings(tok, ids[seq_id].tolist())

    return decode


def _tokens_for(result: ConditionResult, seq_id: int | None,
                decode: TokenDecoder | None) -> tuple[list[str], str]:
    T = result.length
    if decode is not None and seq_id is not None:
        tokens = decode(result, seq_id)
        if tokens is not None and len(tokens) == T:
            return [str(t) for t in tokens], ""
    return [str(i) for i in range(T)], "Positions are labelled by index (no token strings)."


# ----------------------------------------------------------------------- numbers


def causal_softmax(
    logits: Float[np.ndarray, "*batch query_pos key_pos"],
) -> Float[np.ndarray, "*batch query_pos key_pos"]:
    """Softmax of saved logits (NaN on and above the diagonal) over the keys s < t;
    row 0, which has no earlier key, attends to itself."""
    A = np.asarray(logits, dtype=np.float64)
    T = A.shape[-1]
    lower = np.tril(np.ones((T, T), dtype=bool), k=-1)
    x = np.where(lower & np.isfinite(A), A, -np.inf)
    x[..., 0, 0] = 0.0
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _finite(x) -> bool:
    return x is not None and bool(np.isfinite(x).all())


def _head_spectra(result: ConditionResult, layer: int, head: int):
    """The spectrum shown (of the Track B g(Δ), which the spectral analysis reads; Track
    A's pooled g where Track B's is not finite), its note, and the spectral alignment of
    each track's g(Δ): ``(spectrum, note, {label: alignment})``."""
    g_b, source = result.g_trackB
    usage = None if result.usage is None else result.usage[layer, head]
    tracks = {f"Track B g(Δ), {source.replace('_', ' ')}": g_b[layer, head],
              "Track A g(Δ), pooled": result.g_pooled[layer, head]}
    shown, note, alignments = None, "g(Δ) is not finite: no spectrum.", {}
    for label, g in tracks.items():
        if not _finite(g):
            continue
        omega, power, alignment, problem = kernel_spectrum(g, result.thetas, usage=usage)
        alignments[label] = alignment
        if shown is None:
            shown = (omega, power)
            note = f"Spectrum of {label}." + (f" {problem}." if problem else "")
    return shown, note, alignments


def _vertical(df: pd.DataFrame, max_columns: int = 6) -> pd.DataFrame:
    """A one-row table with many columns as (column, value) rows: readable on a page."""
    if len(df) != 1 or df.shape[1] <= max_columns:
        return df
    def text(v) -> str:
        return f"{v:.4g}" if isinstance(v, float | np.floating) else str(v)

    return pd.DataFrame({"column": [str(c) for c in df.columns],
                         "value": [text(v) for v in df.iloc[0].to_numpy(dtype=object)]})


class _Tables:
    """One condition's tables, grouped by (layer, head) once."""

    def __init__(self, result: ConditionResult, extra: Mapping[str, pd.DataFrame] | None):
        a, b = result.to_frames()
        self.n_seqs = len(result.seq_id)
        self.a = dict(tuple(a.groupby(["layer", "head"], sort=False)))
        self.b = dict(tuple(b.groupby(["layer", "head"], sort=False)))
        self.extra = {}
        for name, df in (extra or {}).items():
            if not {"layer", "head"} <= set(df.columns):
                continue
            keep = np.ones(len(df), dtype=bool)
            for col, value in (("model", result.model), ("dataset", result.dataset),
                               ("length", result.length)):
                if col in df.columns:
                    keep &= (df[col] == value).to_numpy()
            self.extra[name] = dict(tuple(df[keep].groupby(["layer", "head"], sort=False)))

    def for_head(self, layer: int, head: int) -> dict[str, pd.DataFrame]:
        a = self.a[(layer, head)]
        per_seq = ["seq_id", "R2_per_seq", "R2_per_seq_nosink"]
        out = {f"Track A (pooled over {self.n_seqs} sequences)":
               a.drop(columns=per_seq).head(1)}
        stats = []
        for col in ("R2_per_seq", "R2_per_seq_nosink"):
            v = a[col].to_numpy(dtype=np.float64)
            ok = np.isfinite(v)
            row = {"column": col, "n": int(ok.sum())}
            if ok.any():
                q = np.percentile(v[ok], [0, 25, 50, 75, 100])
                row.update(mean=v[ok].mean(), std=v[ok].std(ddof=1) if ok.sum() > 1 else np.nan,
                           min=q[0], q25=q[1], median=q[2], q75=q[3], max=q[4],
                           seq_id_min=int(a["seq_id"].to_numpy()[ok][np.argmin(v[ok])]),
                           seq_id_max=int(a["seq_id"].to_numpy()[ok][np.argmax(v[ok])]))
            stats.append(row)
        out[f"Track A per sequence (summary of {len(a)} rows)"] = pd.DataFrame(stats)
        out["Track B"] = self.b[(layer, head)]
        for name, groups in self.extra.items():
            if (layer, head) in groups:
                out[name] = groups[(layer, head)]
        return out


# ------------------------------------------------------------------------- pages


def _section(title: str, content: str, note: str = "") -> str:
    note_html = f'<p class="pk-note">{escape(note)}</p>' if note else ""
    return f"<section>\n<h2>{escape(title)}</h2>\n{note_html}\n{content}\n</section>"


def _summary_block(title: str, links: Mapping[str, str], notes: Sequence[str],
                   r2_values: dict, g_a, g_b, spectrum, thetas, per_seq_r2,
                   tables: Mapping[str, pd.DataFrame], dpi: int) -> str:
    """A head page without a logit matrix: the same sections as ``head_html`` after
    the pattern and the logit fit."""
    parts = [f"<h1>{escape(title)}</h1>", links_html(links)]
    parts += [f'<p class="pk-note">{escape(n)}</p>' for n in notes]
    parts.append(_section("Shift invariance", values_html(r2_values)))
    parts.append(_section(
        "Positional kernel g(Δ)",
        figure_img(figures.fig_kernel(g_a, g_b), "g(Delta)", dpi=dpi),
        "Track A: mean sub-diagonal of the raw logits, pooled over sequences. "
        "Track B: the same fit on the content-centered averaged Gram matrix."))
    if spectrum is not None:
        parts.append(_section(
            "Spectrum of g(Δ)",
            figure_img(figures.fig_spectrum(*spectrum, thetas), "spectrum", dpi=dpi),
            "Dashed lines: the model's positional-encoding frequencies θᵢ."
            if thetas is not None else ""))
    parts.append(_section("Per-sequence R²", figure_img(
        figures.fig_r2_distribution(per_seq_r2, r2_values), "per-sequence R2", dpi=dpi)))
    tables = dict(tables)
    beyond = tables.pop(HEAD_TABLE, None)
    if beyond is not None:
        parts.append(_section("Beyond the seeds", head_rows_html(beyond)))
    tables_html = "\n".join(f"<h3>{escape(n)}</h3>\n{table_html(df)}" for n, df in tables.items())
    parts.append(_section("This head in the result tables", tables_html))
    return report_block("\n".join(p for p in parts if p), include_style=False)


def _rel(target: Path, page: Path) -> str:
    return relative_url(target, page)


def _condition_label(r: ConditionResult) -> str:
    return f"{r.model} · {r.dataset} · T={r.length}"


def write_head_pages(
    results: Sequence[ConditionResult],
    report_dir: str | os.PathLike,
    *,
    tokenizer_decode: TokenDecoder | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
    max_tokens: int = 128,
    layer_max_tokens: int = 64,
    dpi: int = 55,
    progress: bool = False,
    workers: int | None = None,
) -> list[Path]:
    """Write a page for every head (or the ``(layer, head)`` pairs in ``heads``) of every
    condition, and a page for every layer, under ``report_dir/heads/``; the circuitsvis
    bundle goes once to ``report_dir/assets/``. Returns the paths written.

    ``tokenizer_decode(result, seq_id)`` gives the token strings of an evaluation
    sequence (e.g. :func:`sequence_tokens`); without it positions are labelled by index.
    ``tables``: further tables (caption → DataFrame with ``layer`` and ``head`` columns,
    and ``model``/``dataset``/``length`` where they apply, e.g. ``spectral.csv``); each
    head page shows its rows. Pages link to ``report_dir/report.html``, their layer page,
    neighbouring heads and the same head in the other conditions. ``workers``: processes
    drawing the pages, each a block of layers (default: the CPU count, at most 4; the
    figures are matplotlib's, about a second per page on one core)."""
    report_dir = Path(report_dir)
    write_assets(report_dir)
    wanted = None if heads is None else {(int(a), int(b)) for a, b in heads}
    written: list[Path] = []
    workers = min(4, os.cpu_count() or 1) if workers is None else max(1, int(workers))
    for result in results:
        t0 = time.time()
        args = (result, results, report_dir, tokenizer_decode, tables, wanted, max_tokens,
                layer_max_tokens, dpi)
        pages = _write_parallel(args, workers) if workers > 1 else _write_condition(*args)
        written += pages
        if progress:
            print(f"{_condition_label(result)}: {len(pages)} pages in "
                  f"{time.time() - t0:.0f} s")
    return written


_FORKED: dict = {}  # what forked page writers inherit (nothing is pickled but layers)


def _write_layers(layers: list[int]) -> list[Path]:
    torch.set_num_threads(1)  # as DataLoader workers do: no OpenMP pool after fork
    return _write_condition(*_FORKED["args"], only_layers=set(layers))


def _write_parallel(args: tuple, workers: int) -> list[Path]:
    """:func:`_write_condition` split by layers over forked processes (where the
    platform has fork; otherwise in this process)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    result, wanted = args[0], args[5]
    layers = [layer for layer in range(result.n_layers) if wanted is None
              or any((layer, h) in wanted for h in range(result.n_heads))]
    if len(layers) < 2 or "fork" not in mp.get_all_start_methods():
        return _write_condition(*args)
    blocks = [[int(x) for x in b] for b in np.array_split(layers, min(workers, len(layers)))]
    _FORKED["args"] = args
    try:
        with ProcessPoolExecutor(len(blocks), mp_context=mp.get_context("fork")) as pool:
            return [p for pages in pool.map(_write_layers, blocks) for p in pages]
    finally:
        _FORKED.clear()


def _write_condition(result, results, report_dir, decode, extra, wanted, max_tokens,
                     layer_max_tokens, dpi, only_layers: set[int] | None = None
                     ) -> list[Path]:
    L, H, T = result.n_layers, result.n_heads, result.length
    key = (result.model, result.dataset, T)

    def wants(layer, head):
        return wanted is None or (layer, head) in wanted

    report_page = report_dir / REPORT_PAGE
    sid = min(result.logits) if result.logits else None
    tokens, token_note = _tokens_for(result, sid, decode)
    tab = _Tables(result, extra)
    thetas = result.thetas
    trackb_g, trackb_src = result.g_trackB
    r2_b_name = "R2_gram (Track B, centered)" if result.centered else "R2_gram_raw (Track B)"
    r2_b = result.r2_gram if result.centered else result.r2_gram_raw
    base_notes = [n for n in (_sentence(str(result.provenance.get("weights", ""))),
                              token_note if sid is not None else "") if n]
    if sid is None:
        vis_note = ("This condition saved no full logit matrices (run with --save-logits "
                    "yes to keep them), so there is no attention pattern or logit fit here; "
                    "the pooled results follow.")
    else:
        vis_note = (f"Pattern and logits: evaluation sequence seq_id {sid} (the first saved "
                    "visualization sequence). The pattern is the softmax of the saved logits "
                    "over the keys s < t: the diagonal logit is not saved, so each query's "
                    "attention to its own position is left out.")
    written: list[Path] = []
    for layer in range(L):
        layer_heads = [h for h in range(H) if wants(layer, h)]
        if not layer_heads or (only_layers is not None and layer not in only_layers):
            continue
        layer_page = layer_page_path(report_dir, *key, layer)
        patterns = causal_softmax(result.logits[sid][layer]) if sid is not None else None
        summary = []
        for head in layer_heads:
            page = head_page_path(report_dir, *key, layer, head)
            spectrum, spec_note, alignments = _head_spectra(result, layer, head)
            links = {"report": _rel(report_page, page), f"layer {layer}": layer_page.name}
            for h2, label in ((head - 1, "← L{l}H{h}"), (head + 1, "L{l}H{h} →")):
                if 0 <= h2 < H and wants(layer, h2):
                    links[label.format(l=layer, h=h2)] = f"L{layer}H{h2}.html"
            for other in results:
                if other is not result and layer < other.n_layers and head < other.n_heads:
                    links[f"same head: {_condition_label(other)}"] = _rel(head_page_path(
                        report_dir, other.model, other.dataset, other.length, layer, head),
                        page)
            r2_values = {"R2_pooled (Track A)": float(result.r2_pooled[layer, head]),
                         "R2_pooled_nosink (Track A)":
                             float(result.r2_pooled_nosink[layer, head]),
                         r2_b_name: float(r2_b[layer, head])}
            notes = [*base_notes, vis_note, spec_note]
            head_tables = tab.for_head(layer, head)
            if thetas is not None:
                for label, alignment in alignments.items():
                    notes.append(alignment_line(alignment, label))
                    head_tables.update(alignment_frames(alignment, label))
            head_tables = {k: _vertical(v) for k, v in head_tables.items()}
            g_b = trackb_g[layer, head] if _finite(trackb_g[layer, head]) else None
            title = f"{_condition_label(result)} · L{layer}H{head}"
            per_seq = result.r2_per_seq[:, layer, head].astype(np.float64)
            if patterns is not None:
                data = HeadPageData(
                    title=title, tokens=tokens, pattern=patterns[head],
                    logits=result.logits[sid][layer, head], g_trackA=result.g_pooled[layer, head],
                    g_trackB=g_b, spectrum=spectrum, thetas=thetas, tables=head_tables,
                    r2_values=r2_values, per_seq_r2=per_seq, notes=notes, links=links)
                write_head_page(page, data, assets_rel=assets_rel_for(page, report_dir),
                                max_tokens=max_tokens, dpi=dpi)
            else:
                block = _summary_block(title, links, notes, r2_values,
                                       result.g_pooled[layer, head], g_b, spectrum, thetas,
                                       per_seq, head_tables, dpi)
                write_page(page, page_html(title, block))
            written.append(page)
            summary.append({"head": head, "kv_head": int(result.kv_head[head]),
                            **{k.split(" ")[0]: v for k, v in r2_values.items()},
                            "R2_per_seq_median": float(np.nanmedian(per_seq))
                            if np.isfinite(per_seq).any() else np.nan,
                            **{f"aligned ({'B' if 'Track B' in k else 'A'})":
                               None if a is None else bool(a.get("aligned"))
                               for k, a in alignments.items()}})
        written.append(_write_layer_page(
            layer_page, result, layer, layer_heads, patterns, tokens, summary, report_dir,
            report_page, [*base_notes, vis_note], wants, layer_max_tokens))
    return written


def _write_layer_page(path, result, layer, layer_heads, patterns, tokens, summary,
                      report_dir, report_page, notes, wants, max_tokens) -> Path:
    title = f"{_condition_label(result)} · layer {layer}"
    links = {"report": _rel(report_page, path)}
    for l2, label in ((layer - 1, "← layer {l}"), (layer + 1, "layer {l} →")):
        if 0 <= l2 < result.n_layers and any(wants(l2, h) for h in range(result.n_heads)):
            links[label.format(l=l2)] = f"L{l2}.html"
    links.update({f"L{layer}H{h}": f"L{layer}H{h}.html" for h in layer_heads})
    table = {"Heads of this layer": pd.DataFrame(summary)}
    if patterns is not None:
        return render_layer_page(
            path, title=title, tokens=tokens, patterns=patterns[layer_heads],
            head_names=[f"L{layer}H{h}" for h in layer_heads],
            assets_rel=assets_rel_for(path, report_dir), links=links, tables=table,
            notes=notes, max_tokens=max_tokens)
    parts = [f"<h1>{escape(title)}</h1>", links_html(links)]
    parts += [f'<p class="pk-note">{escape(n)}</p>' for n in notes]
    parts += [_section(name, table_html(df)) for name, df in table.items()]
    return write_page(path, page_html(title, report_block("\n".join(parts),
                                                           include_style=False)))


__all__ = ["HEADS_DIR", "TokenDecoder", "causal_softmax", "condition_folder",
           "head_page_href", "head_page_path", "layer_page_path", "sequence_tokens",
           "write_head_pages"]

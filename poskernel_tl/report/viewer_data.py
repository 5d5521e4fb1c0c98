"""One condition's data file for the head views: ``report/data/{stem}.js``.

The file assigns ``window.PK_DATA[key]`` (``key`` = ``{model}/{dataset}_{T}``, the
permalink prefix), so the page loads it with a ``<script>`` element from ``file://``
(Chromium refuses ``fetch()`` of local files). It holds one page per head, built by the
head page's builder (:mod:`poskernel_tl.report.head_page`) from the numbers the run and
its analyses saved — every part's declared panels (R², the g(Δ) of both tracks,
per-sequence R², …), every analysis' declared panels (``AnalysisSpec.head_panels``: the
spectra, peaks and tests of both g sources), the further analyses' rows, and the logits
of one saved sequence with that sequence's own g(Δ) — plus what the heads share (the
token strings of that sequence, the arrays the analyses' panels name: the spectra's
frequencies). Past 256 tokens a head's page points to its long view
(:mod:`poskernel_tl.report.long_files`). Arrays travel as base64 typed arrays
(:mod:`poskernel_tl.encode`; :mod:`poskernel_tl.report.logit_codes`): the logits
(strict lower triangle, row by row) as 8-bit codes per head, value = lo + code × step,
zlib-compressed, a display copy; every R² shown comes from the result files.
"""

from pathlib import Path

from poskernel_tl import constants as C
from poskernel_tl.analyses.registry import REGISTRY
from poskernel_tl.encode import num, typed
from poskernel_tl.fit.kernel_class import DESCRIPTORS
from poskernel_tl.measurement.parts import head_labels
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.softmax_terms import NONE
from poskernel_tl.panels import KERNEL_SECTION, sig
from poskernel_tl.report import extras
from poskernel_tl.report import head_page as HP
from poskernel_tl.report.collect import SavedCondition
from poskernel_tl.report.figures import model_label
from poskernel_tl.report.html import write_script_data
from poskernel_tl.report.logit_codes import quantize
from poskernel_tl.report.tables import dataset_label

DATA_DIR = "data"
GLOBAL = "PK_DATA"


def condition_key(model: str, dataset: str, length: int) -> str:
    """``{model}/{dataset}_{T}`` with filename-safe slugs: the permalink prefix."""
    return f"{C.model_slug(model)}/{C.dataset_slug(dataset)}_{int(length)}"


def head_anchor(model: str, dataset: str, length: int, layer: int, head: int) -> str:
    """The permalink fragment of one head, e.g. ``smollm2-135m/prose_256/L1H2``."""
    return f"{condition_key(model, dataset, length)}/L{int(layer)}H{int(head)}"


def head_href(model: str, dataset: str, length: int, layer: int, head: int) -> str:
    """The permalink of one head, relative to the report folder."""
    return "report.html#" + head_anchor(model, dataset, length, layer, head)


def data_path(report_dir: str | Path, r: ConditionResult) -> Path:
    return Path(report_dir) / DATA_DIR / f"{r.stem()}.js"


def kernel_rows(r: ConditionResult) -> dict:
    """The head views' table of kernel descriptors, in the shape of
    :func:`~poskernel_tl.report.extras.viewer_tables`'s entries: the class is the first
    row's note ("not run" for a result saved without the sink column's mean)."""
    entry = {"name": "kernel", "title": "Kernel class and descriptors (exploratory)",
             "status": "ok", "message": ""}
    heads = r.kernels()
    if heads is None:
        return {**entry, "status": "not run",
                "message": "measured before kernel classes: run poskernel run again"}
    cols = [(c, label) for c, label in (*DESCRIPTORS.items(), *head_labels().items())
            if c in heads.columns]
    values: list = [None] * (r.n_layers * r.n_heads)
    for row in heads.to_dict("records"):
        values[int(row["layer"]) * r.n_heads + int(row["head"])] = \
            [num(row[c]) for c, _ in cols] + [f"class: {row['kernel_class']}"]
    return {**entry, "labels": [label for _, label in cols], "values": values,
            "intervals": [None] * len(values)}


def _table(x: dict, i: int) -> dict:
    """Head ``i``'s rows of one analysis table (:func:`kernel_rows`'s shape)."""
    out = {"title": x["title"], "columns": ["quantity", "value", "95% interval", "note"]}
    if x["status"] != "ok":
        return {**out, "message": f"{x['status']} — {x['message']}"}
    v = x["values"][i]
    if not v:
        return {**out, "message": "no row for this head"}
    iv = x["intervals"][i] or [None] * len(x["labels"])
    return {**out, "rows": [
        [label, sig(v[j]), f"[{sig(iv[j][0])}, {sig(iv[j][1])}]"
         if iv[j] and iv[j][0] is not None else "", v[-1] if j == 0 else ""]
        for j, label in enumerate(x["labels"])]}


class _Condition:
    """What every head of one condition shares, read once: the spectral tables, the
    analysis tables, the saved sequence's quantised logits."""

    def __init__(self, cond: SavedCondition, long: dict | None):
        r = self.r = cond.result
        self.cond, self.long = cond, long
        self.analyses = [a.head_panels(cond.saved(a), r) for a in REGISTRY.values()
                         if a.head_panels is not None]
        self.tables = [kernel_rows(r)] + extras.viewer_tables(
            cond.extras, r.model, r.dataset, r.length, r.n_layers, r.n_heads)
        self.seq = self.codes = None
        if cond.logits_seq is not None:
            self.seq = [int(s) for s in r.seq_id].index(cond.logits_seq)
            self.codes = quantize(r.logits[cond.logits_seq], r.causal)

    def sequence(self, layer: int, head: int) -> dict | None:
        """The saved sequence's logits of this head (8-bit codes), its g(Δ) and R², and the
        layer's mask (``last``: a window's last kept offset, ``chunk``: a binding chunk;
        the page's pattern and fit read only those entries); its tokens are the
        condition's (``tokens`` of the data file)."""
        if self.seq is None:
            return None
        r, (codes, lo, step), at = self.r, self.codes, (layer, head)
        back = None if r.causal else typed(r.g_per_seq_back[self.seq][at], "f4")
        return {"T": int(r.length), "codes": typed(codes[at], "u1", deflate=True),
                "lo": num(lo[at]), "step": num(step[at]), "pattern": None,
                "g": typed(r.g_per_seq[self.seq][at], "f4"), "gBack": back,
                "r2": num(r.r2_per_seq[self.seq][at]), **r.geometry.mask(layer).page(),
                "tokens": None, "label": f"evaluation sequence {self.cond.logits_seq}" + (
                    "" if self.cond.tokens else
                    " (token strings not available: positions shown)")}

    def page(self, layer: int, head: int) -> dict:
        """One head's page (:func:`~poskernel_tl.report.head_page.page`)."""
        r, i = self.r, layer * self.r.n_heads + head
        numbers, declared = HP.declared(r.parts, layer, head)
        terms = r.spec.layers[layer].terms if r.spec.layers else NONE
        kernel = HP.arrange([p for p in declared if p["section"] == KERNEL_SECTION] +
                            HP.known_panels(terms, r.length, head, both=not r.spec.causal))
        rest = [p for p in declared if p["section"] != KERNEL_SECTION]
        analyses = [p for panels in self.analyses for p in panels(layer, head)]
        long_files = None if not self.long else {
            "dir": self.long["dir"], "key": condition_key(r.model, r.dataset, r.length),
            "layer": layer, "head": head, "seq": self.long["seq"],
            "kv": head // max(int(r.spec.group_size), 1), "zoom": self.long["zoom"],
            "tokens": None}
        weights = str(r.provenance.get("weights", ""))
        return HP.page(f"{model_label(r)} · {dataset_label(r.dataset)} · T={r.length} · "
                       f"L{layer}H{head}", anchor=head_anchor(r.model, r.dataset, r.length,
                                                             layer, head),
                       notes=[weights] if weights else [],
                       numbers=numbers,
                       seq=self.sequence(layer, head), long_files=long_files,
                       panels=kernel + analyses + rest,
                       tables=[_table(x, i) for x in self.tables])


def condition_payload(cond: SavedCondition, long: dict | None = None) -> dict:
    """Every head view of one condition (see the module docstring); ``long``: where its
    heads' long views are (:mod:`poskernel_tl.report.long_files`)."""
    r, shared = cond.result, _Condition(cond, long)
    return {
        "key": condition_key(r.model, r.dataset, r.length), "stem": r.stem(),
        "model": r.model, "dataset": r.dataset, "length": int(r.length),
        "n_layers": r.n_layers, "n_heads": r.n_heads, "tokens": cond.tokens,
        "shared": {k: v for panels in shared.analyses for k, v in panels.shared.items()},
        "heads": [shared.page(layer, head) for layer in range(r.n_layers)
                  for head in range(r.n_heads)],
    }


def write_data(report_dir: str | Path, cond: SavedCondition, long: dict | None = None) -> Path:
    """Write the condition's data file (temp file + rename) and return its path."""
    payload = condition_payload(cond, long)
    return write_script_data(data_path(report_dir, cond.result), GLOBAL, payload["key"], payload)


__all__ = ["DATA_DIR", "GLOBAL", "condition_key", "condition_payload", "data_path",
           "head_anchor", "head_href", "kernel_rows", "write_data"]

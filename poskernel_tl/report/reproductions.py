"""The report's Reproductions section: each published figure the toolkit can recompute,
beside ours — the source (paper, table, model, protocol), our model and protocol, our
number, and the differences that remain (model size, data, BOS, weights).

A published figure is one :class:`Published`: its source, their protocol and their
numbers, and a function that reads our number of one model from the per-condition values
every registered statistic gives (:func:`poskernel_tl.report.atlas.per_condition`). Adding
one is one more entry of :data:`PUBLISHED`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from poskernel_tl.report.html import esc
from poskernel_tl.report.sections import table_html
from poskernel_tl.report.tables import write_table

FILE = "reproductions"


@dataclass(frozen=True)
class Published:
    """One published figure: ``ours(rows, results)`` gives, for one of our models (its
    conditions' per-condition values ``rows`` and results), our figure and protocol, or
    None where no condition has it."""

    source: str
    statistic: str
    protocol: str
    figure: str
    ours: Callable[[pd.DataFrame, list], tuple[str, str] | None]
    differences: str


GU_DATASETS = (("prose", "natural"), ("random", "random"), ("repeated", "repeated"))


def _protocol(results: list, datasets, on_pattern: bool = False) -> str:
    """The length, sequence count (``on_pattern``: those the pattern statistics read, the
    first ``null_seqs``), BOS and weights of the conditions read."""
    r = results[0]
    bos = {x.provenance.get("bos_first") for x in results}
    bos_text = "BOS first" if bos == {True} else "no BOS first" if bos == {False} else \
        "BOS on some datasets only" if len(bos) > 1 else "the tokenizer names no BOS"
    read = lambda x: min(x.provenance.get("n_eval") or 0, x.config.get("null_seqs") or 0) \
        if on_pattern else x.provenance.get("n_eval") or 0
    n = sorted({read(x) for x in results if read(x)})
    two_sided = "; bidirectional (every row reads every key)" if \
        r.provenance.get("mask") == "none" else ""
    return (f"T = {r.length}, {'/'.join(map(str, n))} sequences of {' / '.join(datasets)}; "
            f"{bos_text}; {r.provenance.get('weights', 'weights not recorded')}{two_sided}")


def sink1_ours(rows: pd.DataFrame, results: list) -> tuple[str, str] | None:
    """Sink₁ on our prose / random / repeated conditions at the length with the most of
    them (T = 64 where run)."""
    if "Sink1" not in rows or rows["Sink1"].isna().all():
        return None
    rows = rows[rows["Sink1"].notna()]
    counts = rows.groupby("length")["dataset"].nunique()
    T = int(64 if 64 in counts.index else counts.idxmax())
    at = rows[rows["length"] == T].set_index("dataset")["Sink1"]
    figure = " / ".join(f"{100 * at[d]:.2f}" if d in at else "—" for d, _ in GU_DATASETS) + " %"
    used = [r for r in results if r.length == T and r.dataset in at.index]
    return figure, _protocol(used, [d for d, _ in GU_DATASETS if d in at.index], True)


def frequency_ours(rows: pd.DataFrame, results: list
                   ) -> tuple[str, str] | None:
    """The high-frequency share of the heads classed previous-token or local against the
    others, and the permutation p-value, per condition."""
    if "hf_share_p" not in rows or rows["hf_share_diff"].isna().all():
        return None
    rows = rows[rows["hf_share_diff"].notna()]
    parts = [f"{d}, T = {int(t)}: {x.hf_share_positional:.3f} vs {x.hf_share_others:.3f} "
             f"({int(x.n_positional_heads)} positional heads), p = {x.hf_share_p:.3g}"
             for (d, t), x in rows.set_index(["dataset", "length"]).iterrows()]
    used = [r for r in results if (r.dataset, r.length) in set(zip(rows.dataset, rows.length))]
    return "; ".join(parts), _protocol(used, sorted(set(rows["dataset"])))


PUBLISHED = (
    Published(
        "Gu et al., ICLR 2025 (When attention sink emerges in language models), Table 1",
        "Sink₁: share of (sequence, layer, head) whose first key's importance "
        "α₀ = Σ_i A[i, 0] / T exceeds ε = 0.3; natural / random / repeated tokens",
        "T = 64, their natural corpus, uniformly random tokens, one repeated token; Llama's "
        "BOS first; bf16/fp16 weights",
        "GPT2-XL 77.00 / 70.29 / 62.28 %; Mistral-7B 97.49 / 75.21 / 0.00 %; LLaMA2-7B "
        "92.47 / 90.13 / 0.00 %; LLaMA3-8B 99.02 / 91.23 / 0.00 %",
        sink1_ours,
        "model size (theirs 1.5–8 B parameters); our natural text is the bundled prose, "
        "not their corpus; BOS and weights as our protocol says (the embedded SmolLM2 and "
        "Gemma-3-270M: 4-bit GGUF files, dequantised)"),
    Published(
        "Barbero et al., ICLR 2025 (Round and round we go! What makes rotary positional "
        "encodings useful?)",
        "whether positional heads (diagonal, previous-token) carry their q and k norm in "
        "the highest rotary frequencies",
        "Gemma 7B, the q and k norm per rotary frequency of each head, heads inspected",
        "the highest frequencies build the positional heads; the lowest carry semantic "
        "channels",
        frequency_ours,
        "exploratory: our positional heads are those the atlas classes previous-token or "
        "local (not inspected); the share is the q and k norm above the median θ; a "
        "one-sided permutation test over heads; model size (theirs 7 B parameters) and "
        "weights as our protocol says"),
)


def reproductions_table(per: pd.DataFrame, results: list) -> pd.DataFrame:
    """One row per published figure and model of ours that has it."""
    rows = []
    for pub in PUBLISHED:
        for model, part in per.groupby("model", sort=False):
            ours = pub.ours(part, [r for r in results if r.model == model])
            if ours is None:
                continue
            rows.append({"source": pub.source, "statistic": pub.statistic,
                         "their protocol": pub.protocol, "their figure": pub.figure,
                         "our model": model, "our protocol": ours[1], "our figure": ours[0],
                         "differences": pub.differences})
    return pd.DataFrame(rows)


def section(per: pd.DataFrame, results: list, out: Path) -> str:
    """The section's HTML — per published figure its source, protocol and numbers once,
    then ours by model — and the flat table written under ``out`` (CSV and Markdown)."""
    if per.empty:
        return ""
    table = reproductions_table(per, results)
    if table.empty:
        return ""
    write_table(table, out / FILE)
    blocks = []
    for source, rows in table.groupby("source", sort=False):
        first = rows.iloc[0]
        blocks += [f"<h3>{esc(source)}</h3>",
                   f"<p><b>What:</b> {esc(first['statistic'])}. <b>Their protocol:</b> "
                   f"{esc(first['their protocol'])}. <b>Their figure:</b> "
                   f"{esc(first['their figure'])}.</p>",
                   table_html(rows[["our model", "our protocol", "our figure"]]),
                   f'<p class="pk-note">What still differs: {esc(first["differences"])}.</p>']
    return "".join([
        '<h2 id="reproductions">Reproductions</h2>',
        '<p class="pk-note">Published figures beside ours: the source and its protocol, '
        "our model and protocol, our number, and what still differs. Run "
        "<code>--dataset prose</code>, <code>random</code> and <code>repeated</code> at "
        "<code>--length 64</code> with <code>--null-seqs 100</code> for Gu et al.'s "
        "table.</p>", *blocks,
        f'<p class="pk-note">Files: <a href="{FILE}.csv">CSV</a> · '
        f'<a href="{FILE}.md">Markdown</a></p>'])


__all__ = ["PUBLISHED", "Published", "reproductions_table", "section"]

"""Per layer of a model whose softmax adds a learned offset table (T5's, MPNet's
relative-position bias): Track A's pooled R² of what the softmax reads, the same fit of
scale·q·k alone (the table left out), and, head by head, how much of g(Δ) the table
explains (the slope of g on b_h(Δ) and that line's R²; medians over heads).

Usage: python scripts/term_share.py [--model all-mpnet-base-v2] [--dataset random]
       [--length 128] [--n-seqs 16]
(``--dataset text:FILE`` reads a local text file.)
"""

import argparse
import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.data.sequences import build_sequences  # noqa: E402
from poskernel_tl.report.softmax_reads import known_frame  # noqa: E402


def without_tables(model):
    """The same model, its layers' offset tables left out of what the fits read."""
    layers = tuple(dataclasses.replace(
        s, terms=s.terms.replace(**{t.NAME: None for t in s.terms.offsets}))
        for s in model.spec.layers)
    return dataclasses.replace(model, spec=dataclasses.replace(model.spec, layers=layers))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="all-mpnet-base-v2")
    p.add_argument("--dataset", default="random")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--n-seqs", type=int, default=16)
    args = p.parse_args()
    model = pk.load_model(args.model, device="cpu", progress=False)
    seqs = build_sequences(model.tokenizer, args.dataset, args.length, args.n_seqs,
                           model_name=model.spec.name, n_ctx=model.spec.n_ctx)
    ids = seqs["input_ids"]
    with_table = pk.measure(model, ids, progress=False, null_perms=0)
    alone = pk.measure(without_tables(model), ids, progress=False, null_perms=0)
    heads = known_frame(with_table).groupby("layer")
    table = pd.DataFrame({
        "R2_A with table": np.nanmean(with_table.r2_pooled, 1),
        "R2_A of scale·q·k alone": np.nanmean(alone.r2_pooled, 1),
        "median slope of g on b": heads["slope_A_over_known"].median(),
        "median R2 of g on b": heads["R2_A_known"].median()})
    print(f"{model.spec.name} · {args.dataset} · T={args.length} · {len(ids)} sequences "
          "(mean over heads of Track A's pooled R²; medians over heads of g(Δ) against "
          "each head's table):")
    print(table.to_string(float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()

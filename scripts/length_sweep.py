"""Track A across lengths: pooled R² per layer of one model on one source at several T.

    python scripts/length_sweep.py [--lengths 256 1024 4096 8192] [--n-eval 8]
        [--dataset stdlib-code] [--model smollm2-135m] [--threads 2] [--json OUT]

The seed's length-sensitivity question: does a head's logit stay as shift-invariant as
the window grows? For each length the script draws 2·n windows of the source as
`poskernel run --n-seqs 2n` does (seed 0; the second half is the evaluation set; for
``random`` tokens, which have no centering set, n sequences, as `--n-seqs n` does) and runs
Track A alone on the evaluation half (the forward stopped after the last layer; no Track B,
no null). It prints, per layer, the pooled R² averaged over the layer's heads, then over
every layer: pooled, pooled without the sink column, and the per-sequence R² (its mean,
and the spread over sequences of each sequence's mean); then the same fit restricted to
each band of offsets (Δ in [1, 16], [17, 64], [65, 256], …, the last band of a length
ending at T − 1; and the cumulative Δ ≤ 64, ≤ 256, …), the pooled band R² averaged over
every head, so that a rise with T can be read offset by offset. Exploratory: no null and
no threshold is applied. Needs windows of every length within documents (``stdlib-code``
has 199 at T = 8192 with SmolLM2's tokenizer; ``poskernel run`` says how many a source has).
"""

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.data.sequences import build_sequences, eval_mask  # noqa: E402
from poskernel_tl.measurement.measure import forward_pass  # noqa: E402
from poskernel_tl.models.geometry import Geometry  # noqa: E402
from poskernel_tl.plan.batching import device_cap  # noqa: E402
from poskernel_tl.reducers import TrackAReducer  # noqa: E402


def sweep_length(model, dataset: str, T: int, n_eval: int) -> dict:
    """Track A of the n_eval evaluation sequences of length T."""
    s, t0 = model.spec, time.time()
    n_seqs = n_eval if dataset == "random" else 2 * n_eval
    seqs = build_sequences(model.tokenizer, dataset, T, n_seqs=n_seqs, seed=0,
                           model_name=model.spec.name, n_ctx=s.n_ctx or None)
    mask = eval_mask(seqs)
    ids = seqs["input_ids"][mask]
    masks = Geometry.of(s, T).masks  # each layer's window and chunk at this length
    (red,) = forward_pass(model, ids, lambda: [TrackAReducer(len(ids), masks, s.n_heads,
                                                             model.device)],
                          device_cap(model.device, T), f"T={T}", progress=False)
    r = red.result()
    per_seq = np.nanmean(r.r2_per_seq, axis=(1, 2))  # each sequence's mean over heads
    return {"T": T, "n_eval": len(ids), "layer_pooled": r.r2_pooled.mean(1).tolist(),
            "pooled": float(r.r2_pooled.mean()),
            "pooled_nosink": float(r.r2_pooled_nosink.mean()),
            "per_seq_mean": float(per_seq.mean()),
            "per_seq_sd": float(per_seq.std(ddof=1)) if len(per_seq) > 1 else float("nan"),
            "bands": {f"{lo}-{hi}": float(np.nanmean(b)) for lo, hi, b in
                      zip(r.band_lo, r.band_hi, r.r2_band_pooled)},
            "documents": sorted({seqs["doc_ids"][i] for i in np.flatnonzero(mask.numpy())}),
            "seconds": time.time() - t0}


def table(rows: list[dict]) -> str:
    """The markdown table: one line per layer, then the all-layer summaries."""
    head = "| layer | " + " | ".join(f"T={r['T']}" for r in rows) + " |"
    lines = [head, "|---|" + "---|" * len(rows)]
    for L in range(len(rows[0]["layer_pooled"])):
        lines.append(f"| {L} | " + " | ".join(f"{r['layer_pooled'][L]:.3f}" for r in rows)
                     + " |")
    summary = {"all layers, pooled": lambda r: f"{r['pooled']:.3f}",
               "all layers, pooled, no sink column": lambda r: f"{r['pooled_nosink']:.3f}",
               "per-sequence R², mean (sd over sequences)":
                   lambda r: f"{r['per_seq_mean']:.3f} ({r['per_seq_sd']:.3f})"}
    for name, cell in summary.items():
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in rows) + " |")
    return "\n".join(lines)


def band_table(rows: list[dict]) -> str:
    """The markdown table of the pooled band R² (mean over heads): a line per band, keyed
    by where it starts (partition bands) or ends (cumulative [1, W]); a length's last
    partition band ends at T − 1, and a cumulative band reaching T − 1 is the whole fit."""
    def key(band: str) -> tuple[str, int]:
        lo, hi = (int(x) for x in band.split("-"))
        return ("Δ ≤ ", hi) if lo == 1 and hi > 16 else ("Δ from ", lo)

    cells: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        for band, value in r["bands"].items():
            lo, hi = (int(x) for x in band.split("-"))
            if not (lo == 1 and hi == r["T"] - 1 and hi > 16):  # the whole: in the table above
                cells.setdefault(key(band), {})[r["T"]] = value
    lines = ["| band | " + " | ".join(f"T={r['T']}" for r in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for (word, edge) in sorted(cells, key=lambda k: (k[0] != "Δ from ", k[1])):
        vals = cells[(word, edge)]
        lines.append(f"| {word}{edge} | " + " | ".join(
            f"{vals[r['T']]:.3f}" if r["T"] in vals else "–" for r in rows) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    ap.add_argument("--n-eval", type=int, default=8,
                    help="evaluation sequences per length (even for random tokens)")
    ap.add_argument("--dataset", default="stdlib-code")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", help="also write the rows (with each length's documents) here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = pk.load_model(args.model, device="cpu", attention="sdpa", progress=False)
    rows = []
    for T in args.lengths:
        rows.append(sweep_length(model, args.dataset, T, args.n_eval))
        r = rows[-1]
        print(f"T={T}: {r['n_eval']} sequences from {len(r['documents'])} documents, "
              f"pooled R² {r['pooled']:.3f}, {r['seconds']:.0f} s", flush=True)
    print(f"\n{args.model} on {args.dataset}, Track A pooled R² (mean over each layer's "
          "heads; exploratory)\n")
    print(table(rows))
    print("\nThe same restricted to bands of offsets (pooled R², mean over every head)\n")
    print(band_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

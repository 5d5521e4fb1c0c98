"""GPU check: half-precision forward against float32, and the automatic batch size.

Builds a model with Llama-3.2-1B's geometry (16 layers, 32 query / 8 key-value heads,
d_head 64, rotary base 5e5) from its config with random weights — nothing is fetched —
and runs :func:`poskernel_tl.measure` on the same random tokens in float32 and in
bfloat16 with ``batch_size="auto"``. Prints, per length: the batch size chosen, seconds
per sequence, peak GPU memory, and the largest |ΔR²| between the two dtypes for Track A
(pooled) and Track B (centered and raw Gram).

Random weights make the R² values themselves meaningless; what this checks is that the
half-precision path agrees with float32 and that "auto" fills the GPU without running
out of memory.

Usage: python scripts/check_gpu.py [--lengths 256 1024] [--n-seqs 32]
"""

import argparse
import os
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_gpu import build as build_shape  # noqa: E402  (scripts/bench_gpu.py)

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.models.loading import LoadedModel  # noqa: E402


def build(dtype: torch.dtype, device: str) -> LoadedModel:
    return build_shape("llama-3.2-1b", dtype, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--n-seqs", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(1)
    tokens = {T: [torch.randint(0, 128000, (args.n_seqs, T), generator=g) for _ in "ec"]
              for T in args.lengths}  # the same tokens for both dtypes
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = build(dtype, args.device)
        for T in args.lengths:
            ev, cen = tokens[T]
            if args.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            res = pk.measure(model, ev, cen, batch_size="auto", progress=False)
            if args.device == "cuda":
                torch.cuda.synchronize()
            sec = (time.time() - t0) / (2 * args.n_seqs)
            peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0
            results[dtype, T] = res
            print(f"{str(dtype):15s} T={T:5d} batch={res.config['batch_size']:3d} "
                  f"scores from {res.provenance['scores_from']:16s} "
                  f"{sec:.4f} s/seq  peak {peak:.1f} GiB", flush=True)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    for T in args.lengths:
        a, b = results[torch.float32, T], results[torch.bfloat16, T]
        diffs = {name: float(np.nanmax(np.abs(getattr(a, name) - getattr(b, name))))
                 for name in ("r2_pooled", "r2_gram", "r2_gram_raw")}
        print(f"T={T}: max |R2(float32) - R2(bfloat16)| " +
              ", ".join(f"{k} {v:.4f}" for k, v in diffs.items()))


if __name__ == "__main__":
    main()

"""Benchmark: what R² by offset band adds to ``pk.measure``.

Times ``pk.measure`` of SmolLM2-135M (half centering, half evaluation sequences, the
default 4-permutation null on every evaluation sequence, Track B, the TransformerLens
score) three ways on the same random tokens:

  none    no band sums anywhere (each Σ A² call asks for the whole triangle and the
          window only; the band columns are zeros),
  A       Track A's band sums, none in the null,
  all     as shipped: Track A's and the null's,

and Hugging Face's own default forward (sdpa) on the same tokens, the floor a user pays
anyway. Time is process CPU time with one torch thread, the least of ``--repeats`` runs.
Prints each variant's seconds and the ratios all / none (the issue's "band R² adds
≤ 5 %") and A / none.

Usage: python scripts/bench_bands.py [--length 1024] [--n-seqs 16] [--repeats 2]
"""

import argparse
import os
import time
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import poskernel_tl as pk  # noqa: E402
import poskernel_tl.reducers.lag_sums as lag  # noqa: E402
import poskernel_tl.statistics.perm_null as perm_null  # noqa: E402
from poskernel_tl.models.embedded import from_gguf  # noqa: E402
from poskernel_tl.models.registry import resolve  # noqa: E402
from poskernel_tl.protocol import band_ends  # noqa: E402


def whole_only(q, k, scale, chunk=lag.DEFAULT_CHUNK, last=None, dtype=lag.ACC):
    """:func:`lag.band_sum_squares` without its band ends (zeros in their place)."""
    T = q.shape[1]
    end = T - 1 if last is None else min(last, T - 1)
    upto = lag.sum_squares_upto(q, k, scale, [T - 1, end], chunk, dtype)
    return upto[..., 0], upto[..., 1], upto.new_zeros(*upto.shape[:-1], len(band_ends(T)))


def null_stats(q, k, scale, chunk=lag.DEFAULT_CHUNK, last=None, dtype=lag.ACC):
    """:func:`lag.lower_stats` without the band ends."""
    _, kept, bands = whole_only(q, k, scale, chunk, last, dtype)
    return lag.windowed(lag.lag_sums(q, k, scale, dtype), last), kept, bands


@contextmanager
def variant(name: str):
    """Band sums switched off where ``name`` says (module attributes, restored after)."""
    saved = lag.band_sum_squares, perm_null.lower_stats
    if name == "none":
        lag.band_sum_squares = whole_only
    if name in ("none", "A"):
        perm_null.lower_stats = null_stats
    try:
        yield
    finally:
        lag.band_sum_squares, perm_null.lower_stats = saved


def least_cpu(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        out.append(time.process_time() - c0)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--n-seqs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = pk.load_model("smollm2-135m", device="cpu", progress=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.bridge.cfg.d_vocab - 100, (args.n_seqs, args.length),
                        generator=g)
    half = args.n_seqs // 2
    hf, _ = from_gguf(resolve("smollm2-135m"), torch.float32, False)
    hf.set_attn_implementation("sdpa")

    def floor():
        with torch.no_grad():
            for s in range(0, len(ids), 4):
                hf(ids[s:s + 4])

    def run():
        pk.measure(model, ids[half:], ids[:half], progress=False)

    run()  # warm-up
    times = {"HF sdpa": least_cpu(floor, args.repeats)}
    for name in ("none", "A", "all"):
        with variant(name):
            times[name] = least_cpu(run, args.repeats)
    print(f"SmolLM2-135M, T = {args.length}, {args.n_seqs} sequences, CPU s (least of "
          f"{args.repeats}), one thread")
    for name, t in times.items():
        print(f"  {name:8s} {t:8.2f}  ({t / times['HF sdpa']:.2f}× HF sdpa)")
    print(f"band R² in all: all / none = {times['all'] / times['none']:.3f}; Track A's "
          f"alone: A / none = {times['A'] / times['none']:.3f}")


if __name__ == "__main__":
    main()

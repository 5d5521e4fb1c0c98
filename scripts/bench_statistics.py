"""Benchmark: what the registered statistics cost in ``pk.measure`` (not a test).

Times, in one process, on the same random tokens and interleaved (a, b, a, b, …), the
whole ``pk.measure`` of the embedded default model with every registered statistic and
with some of them taken out of the registry, and Hugging Face's own default forward of
the same tokens (``model.model(ids)``, no unembedding) as the floor; prints each per
sequence, the ratios, and the share the named statistics add.

Usage: python scripts/bench_statistics.py [--without sink] [--length 1024] [--n-seqs 4]
       [--repeats 3] [--threads N]
"""

import argparse
import time

import torch

import poskernel_tl as pk
from poskernel_tl.statistics import registry


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--without", nargs="+", default=["sink"], help="statistics taken out")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--n-seqs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    for name in a.without:
        registry.get(name)  # an unknown name fails here, with the valid ones
    model = pk.load_model(a.model, progress=False)
    ids = torch.randint(100, 40000, (a.n_seqs, a.length), generator=torch.Generator()
                        .manual_seed(0))
    every = dict(registry.STATISTICS)
    fewer = {k: v for k, v in every.items() if k not in a.without}

    def measure(stats: dict) -> None:
        registry.STATISTICS.clear()
        registry.STATISTICS.update(stats)
        pk.measure(model, ids, progress=False, batch_size=1)

    with torch.inference_mode():
        hf = timed(lambda: [model.hf_model.model(x[None]) for x in ids]) / a.n_seqs
        measure(every)  # warm-up
        runs = {"all": [], "without": []}
        for _ in range(a.repeats):
            runs["all"].append(timed(lambda: measure(every)))
            runs["without"].append(timed(lambda: measure(fewer)))
    registry.STATISTICS.clear()
    registry.STATISTICS.update(every)
    n = a.n_seqs
    best = {k: min(v) / n for k, v in runs.items()}
    print(f"{a.model}, T = {a.length}, {n} sequences, best of {a.repeats} paired runs, "
          f"{torch.get_num_threads()} threads; per sequence:")
    print(f"  Hugging Face forward      {hf:8.3f} s")
    print(f"  pk.measure, every stat    {best['all']:8.3f} s  ({best['all'] / hf:.2f}× HF)")
    print(f"  without {', '.join(a.without):16s}  {best['without']:8.3f} s  "
          f"({best['without'] / hf:.2f}× HF)")
    median = lambda v: sorted(v)[len(v) // 2]
    print(f"  {', '.join(a.without)} adds {100 * (best['all'] / best['without'] - 1):+.1f} % "
          f"(best), {100 * (median(runs['all']) / median(runs['without']) - 1):+.1f} % "
          "(medians)")


if __name__ == "__main__":
    main()

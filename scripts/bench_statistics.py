"""Benchmark: what each registered statistic costs in ``pk.measure`` (not a test).

For the embedded default model on random tokens, per length T: the whole ``pk.measure``
with every statistic the run builds by default, and with each one of them taken out of the
registry in turn (leave-one-out), timed in one process, interleaved (all, without A, all,
without B, …) so that a drift of the machine falls on every pair alike; and Hugging Face's
own default forward of the same tokens (``model.model(ids)``, sdpa, no unembedding) as the
floor. Prints per length the forward, the whole measurement and, per statistic, its
marginal seconds per sequence (the whole less the run without it, the least of
``--repeats`` pairs) and its share of the whole. Process CPU seconds (all threads), so that
what the machine's neighbours do weighs less; wall seconds in the JSON line.

Usage: python scripts/bench_statistics.py [--lengths 256 1024 4096]
       [--n-seqs 256:8 1024:4 4096:2] [--repeats 256:3 1024:2 4096:1] [--threads N]
"""

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.models.geometry import Geometry  # noqa: E402
from poskernel_tl.plan.config import MeasureConfig  # noqa: E402
from poskernel_tl.statistics import registry  # noqa: E402
from poskernel_tl.statistics.statistic import StatisticContext  # noqa: E402


def cpu_timed(fn) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of ``fn()``."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def default_statistics(model, length: int, n: int) -> list[str]:
    """The statistics a default run at ``length`` builds (the rest are opt-in)."""
    run = StatisticContext(model, Geometry.checked(model.spec, length), n, MeasureConfig())
    return [name for name, stat in registry.STATISTICS.items()
            if stat.build(run) is not None]


def one_length(model, length: int, n: int, repeats: int) -> dict:
    """Every timing of one length (see the module docstring)."""
    ids = torch.randint(100, 40000, (n, length), generator=torch.Generator().manual_seed(0))
    every = dict(registry.STATISTICS)
    names = default_statistics(model, length, n)

    def measure(without: str | None) -> tuple[float, float]:
        registry.STATISTICS.clear()
        registry.STATISTICS.update({k: v for k, v in every.items() if k != without})
        try:
            return cpu_timed(lambda: pk.measure(model, ids, progress=False, batch_size=1))
        finally:
            registry.STATISTICS.clear()
            registry.STATISTICS.update(every)

    with torch.inference_mode():
        forward = cpu_timed(lambda: [model.hf_model.model(x[None]) for x in ids])
        measure(None)  # warm-up
        whole: list[tuple[float, float]] = []
        without: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
        for _ in range(repeats):
            for name in names:
                whole.append(measure(None))
                without[name].append(measure(name))
    best = min(c for c, _ in whole)
    return {"T": length, "n": n, "forward_cpu_s": forward[0] / n, "measure_cpu_s": best / n,
            "marginal_cpu_s": {k: max(0.0, best - min(c for c, _ in v)) / n
                               for k, v in without.items()},
            "wall_s": {"forward": forward[1] / n, "measure": min(w for _, w in whole) / n}}


def report(row: dict) -> None:
    f, m = row["forward_cpu_s"], row["measure_cpu_s"]
    print(f"T = {row['T']}, {row['n']} sequences; CPU s per sequence:")
    print(f"  Hugging Face forward (model.model)  {f:8.3f}")
    print(f"  pk.measure, every statistic          {m:8.3f}  ({m / f:.2f}× the forward)")
    for name, s in sorted(row["marginal_cpu_s"].items(), key=lambda kv: -kv[1]):
        print(f"    {name:14s} marginal {s:8.3f}  ({100 * s / m:5.1f} % of the measurement)")
    print(json.dumps(row))


def pairs(text: list[str], cast=int) -> dict[int, int]:
    return {int(k): cast(v) for k, v in (x.split(":") for x in text)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--n-seqs", nargs="+", default=["256:8", "1024:4", "4096:2"])
    p.add_argument("--repeats", nargs="+", default=["256:3", "1024:2", "4096:1"])
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    n_seqs, repeats = pairs(a.n_seqs), pairs(a.repeats)
    model = pk.load_model(a.model, progress=False)
    print(f"{a.model}; {torch.get_num_threads()} threads; random tokens; batches of 1")
    for length in a.lengths:
        report(one_length(model, length, n_seqs.get(length, 2), repeats.get(length, 1)))


if __name__ == "__main__":
    main()

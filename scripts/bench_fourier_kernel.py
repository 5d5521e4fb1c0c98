"""Benchmark: kernelized attention with a Fourier relative kernel (seed 001), quadratic form
(ΔP [batch, head_index, T, T, feature] materialised) vs linear form (cos/sin factorisation,
prefix sums over j ≤ i), on CPU (not a test).

For each length T it prints
  ms       best wall time of one call over ≥ --repeats calls after one warm-up (ms)
  peak     peak bytes allocated by torch during one call, from torch.profiler's memory
           events (inputs excluded; "n/a" if this torch build does not expose them)
  largest  the largest intermediate, computed analytically: ΔP = B·H·T²·K·itemsize for the
           quadratic form; for the linear one the largest of the prefix-sum tensor
           B·T·H·2K·d_head·itemsize (T → C with --chunk-size C), the float64 phases B·T·H·K·8
           and the features/output B·T·H·max(2K, d_head)·itemsize
  ×, cpu×  growth per doubling of T against the previous length, of wall time, process CPU
           time (less disturbed by other load) and memory: ≈ 2 is linear, ≈ 4 quadratic;
           at the end, the log-log slope over all lengths (1 linear, 2 quadratic)
The quadratic form runs only while its ΔP fits under --max-quadratic-mb; longer lengths are
skipped and marked so. Where both ran, the last column is max |A_quadratic − A_linear| /
max |A_quadratic|.

Usage: python scripts/bench_fourier_kernel.py [--lengths 256 512 ... 16384] [--batch 1]
       [--heads 1] [--features 16] [--d-head 64] [--pos-dim 1] [--max-quadratic-mb 1100]
       [--repeats 5] [--threads 1] [--non-causal] [--chunk-size C]
"""

import argparse
import math
import os
import time

import numpy as np
import torch

from poskernel_tl.analyses.fourier_kernel import (
    fourier_kernel_attention_linear,
    fourier_kernel_attention_quadratic,
)

MB = 2 ** 20


def make_inputs(args, T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K, D, n = args.batch, args.heads, args.features, args.d_head, args.pos_dim

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q = torch.nn.functional.elu(rnd(B, T, H, K)) + 1
    k = torch.nn.functional.elu(rnd(B, T, H, K)) + 1
    v = rnd(B, T, H, D)
    # frequencies spread like rotary θ_i over [1/T, 1] rad/token
    a = torch.logspace(0, -math.log10(T), K).repeat(H, 1)[..., None].expand(H, K, n) / n
    b, c = rnd(H, K), rnd(H, K) / K
    p = torch.arange(T, dtype=torch.float32)
    if n > 1:
        p = p[:, None].expand(T, n).contiguous()
    return q, k, v, a.contiguous(), b, c, p


def timed(fn, repeats: int, budget_s: float = 2.0) -> tuple[float, float]:
    """(wall, process CPU) seconds: the best of at least ``repeats`` calls after a warm-up
    (more while calls are short, fewer once ``budget_s`` is spent). The minimum is the least
    disturbed by other load; CPU time also leaves out time the process was not scheduled."""
    fn()
    walls: list[float] = []
    cpus: list[float] = []
    start = time.perf_counter()
    while len(walls) < max(1, repeats) or time.perf_counter() - start < budget_s / 4:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if time.perf_counter() - start > budget_s or len(walls) >= 50:
            break
    return min(walls), min(cpus)


def peak_bytes(fn) -> float:
    """Peak of the running sum of torch's CPU allocations during one call."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        events = prof.profiler.kineto_results.events()
        mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except Exception:  # private profiler API: report n/a rather than fail
        return float("nan")
    current = peak = 0
    for _, nbytes in mem:
        current += nbytes
        peak = max(peak, current)
    return float(peak) if mem else float("nan")


def fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def ratio(cur: float | None, prev: float | None, doublings: float) -> str:
    """Growth per doubling of T: (cur / prev) ** (1 / doublings)."""
    if cur is None or prev is None or not (math.isfinite(cur) and math.isfinite(prev)) \
            or prev <= 0 or doublings <= 0:
        return "-"
    return f"{(cur / prev) ** (1 / doublings):.2f}"


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(value) against log(T)."""
    x, y = (np.log([p[i] for p in points]) for i in (0, 1))
    return float(np.polyfit(x, y, 1)[0])


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+",
                    default=[256 * 2 ** i for i in range(7)])  # 256 … 16384
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--features", type=int, default=16, help="K, kernel features")
    ap.add_argument("--d-head", type=int, default=64)
    ap.add_argument("--pos-dim", type=int, default=1)
    ap.add_argument("--max-quadratic-mb", type=float, default=1100.0,
                    help="skip the quadratic form when ΔP would exceed this (MiB)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: the least disturbed by other load)")
    ap.add_argument("--non-causal", action="store_true")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="linear form: prefix sums per chunk with a running state")
    return ap.parse_args(argv)


def one_length(args, T: int, causal: bool) -> dict:
    """Both forms at length ``T``: wall and CPU seconds, peak bytes (``lt``, ``lc``, ``lp``;
    ``qt``, ``qc``, ``qp``: None where the quadratic form is skipped), the linear form's
    largest tensor, the quadratic ΔP's bytes and the largest relative difference."""
    B, H, K, D = args.batch, args.heads, args.features, args.d_head
    item = torch.finfo(torch.float32).bits // 8
    x = make_inputs(args, T)
    lin = lambda: fourier_kernel_attention_linear(*x, causal=causal,  # noqa: E731
                                                  chunk_size=args.chunk_size)
    rows = T if args.chunk_size is None else min(T, args.chunk_size)
    out = {"largest": max(B * rows * H * 2 * K * D * item if causal else 0,  # prefix sums
                          B * T * H * K * 8,  # float64 phases p̂
                          B * T * H * max(2 * K, D) * item),  # cos/sin features, output
           "dp": B * H * T * T * K * item, "qt": None, "qc": None, "qp": None,
           "diff": float("nan")}
    out["lt"], out["lc"] = timed(lin, args.repeats)
    out["lp"] = peak_bytes(lin)
    if out["dp"] <= args.max_quadratic_mb * MB:
        quad = lambda: fourier_kernel_attention_quadratic(*x, causal=causal)  # noqa: E731
        out["qt"], out["qc"] = timed(quad, args.repeats)
        out["qp"] = peak_bytes(quad)
        ref = quad()
        out["diff"] = ((ref - lin()).abs().max() / ref.abs().max()).item()
    return out


def cells(T: int, m: dict, prev: dict) -> list[str]:
    """One table row: each figure and its growth from the previous length."""
    dbl = math.log2(T / prev["T"]) if prev else 0.0
    grow = lambda key: ratio(m[key], prev.get(key), dbl)  # noqa: E731
    return [str(T), fmt(m["lt"] * 1e3), grow("lt"), grow("lc"), fmt(m["lp"] / MB), grow("lp"),
            fmt(m["largest"] / MB),
            fmt(m["qt"] * 1e3) if m["qt"] is not None else "skipped", grow("qt"), grow("qc"),
            fmt(m["qp"] / MB) if m["qp"] is not None else "-", grow("qp"), fmt(m["dp"] / MB),
            f"{m['qt'] / m['lt']:.1f}" if m["qt"] is not None else "-",
            f"{m['diff']:.1e}" if math.isfinite(m["diff"]) else "-"]


def main(argv=None):
    args = arguments(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    causal = not args.non_causal
    B, H, K, D = args.batch, args.heads, args.features, args.d_head
    print(f"Fourier-kernel attention, CPU float32, {torch.get_num_threads()} threads; "
          f"batch={B} heads={H} features K={K} d_head={D} pos_dim={args.pos_dim} "
          f"{'causal' if causal else 'non-causal'}"
          + (f", chunk={args.chunk_size}" if args.chunk_size else "")
          + (f"; load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""))
    cols = ["T", "lin ms", "×", "cpu×", "lin peak MB", "×", "lin largest MB", "quad ms", "×",
            "cpu×", "quad peak MB", "×", "quad ΔP MB", "quad/lin", "max rel diff"]
    widths = [6, 8, 5, 5, 11, 5, 14, 9, 5, 5, 12, 5, 10, 8, 12]
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, widths)))
    prev: dict = {}
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in ("lt", "lc", "lp", "qt", "qc",
                                                                    "qp")}
    skipped, t_start = [], time.perf_counter()
    for T in sorted(args.lengths):
        m = one_length(args, T, causal)
        if m["qt"] is None:
            skipped.append(T)
        print(" ".join(f"{c:>{w}}" for c, w in zip(cells(T, m, prev), widths)), flush=True)
        prev = dict(m, T=T)
        for key in series:
            if prev[key] is not None and math.isfinite(prev[key]):
                series[key].append((T, prev[key]))
    if skipped:
        item = torch.finfo(torch.float32).bits // 8
        print(f"quadratic form skipped for T = {', '.join(map(str, skipped))}: ΔP would exceed "
              f"--max-quadratic-mb {args.max_quadratic_mb:g} MiB "
              f"(it needs B·H·T²·K·4 bytes, e.g. {B * H * max(skipped) ** 2 * K * item / MB:,.0f}"
              f" MiB at T={max(skipped)})")
    names = {"lt": "linear wall time", "lc": "linear CPU time", "lp": "linear peak memory",
             "qt": "quadratic wall time", "qc": "quadratic CPU time",
             "qp": "quadratic peak memory"}
    print("log-log slope over all lengths (1 = linear, 2 = quadratic): " + ", ".join(
        f"{names[key]} {slope(pts):.2f}" for key, pts in series.items() if len(pts) >= 2))
    print("× = growth per doubling of T: ≈2 linear, ≈4 quadratic. "
          f"Total {time.perf_counter() - t_start:.0f} s.")


if __name__ == "__main__":
    main()

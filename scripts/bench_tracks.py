"""Benchmark: what a measurement costs against the forward pass a user would pay anyway.

For a model with GGUF weights (``--model``; the embedded default SmolLM2-135M, or
Gemma-3-270M) on random tokens and this machine, per
length T it prints seconds per sequence of

  HF sdpa       Hugging Face's own default forward (sdpa attention): the floor
  HF eager      the same model with eager attention
  bridge eager  the TransformerBridge forward on TransformerLens's own (eager) attention
  bridge sdpa   the bridge on poskernel_tl's fast path (sdpa, the same hooks)
  A only        the evaluation pass of `pk.measure` without Track B: Track A, frequency
                usage and the permutation null (every sequence evaluated)
  A + B         the whole `pk.measure` (half centering, half evaluation sequences)

with each one's ratio to the floor, and the peak RSS of a process that loads the model
and runs `pk.measure` (A + B) on 2n sequences, next to the plan's estimate
(:func:`poskernel_tl.plan.batching.plan_measure`). The measurement's forwards stop once the
last layer's q/k are captured (nothing reads the output); the forwards timed here run
whole. Targets: A + B ≤ 1.05× the floor at T = 256, ≤ 1.20× at 1024 (peak RSS ≤ 4 GiB at
N = 200), ≤ 1.30× at 4096 (≤ 12 GiB); at 8192 A only ≤ 1.20× (≤ 20 GiB).

Time is the process's CPU time (all its threads), with --threads torch threads (default
1): on a machine shared with other work, wall-clock time measures the neighbours as much
as the code, CPU time far less; with one thread CPU seconds are the seconds an idle core
takes. Wall-clock seconds are printed too (the JSON lines).

Marginal cost per sequence: `pk.measure` and the A-only pass are timed on 2n sequences
minus n, so their fixed costs (the final fits, allocating the reducers, and the
permutation null, drawn from the same first min(8, n/2) evaluation sequences in both
runs) cancel; forwards are timed on their own count. Each length runs
in a child process of its own (its peak RSS is that length's). Timings are the least of
--repeats runs (per length; after one warm-up up to T = 1024).

Usage: python scripts/bench_tracks.py [--lengths 256 1024 4096 8192] [--threads 1]
       [--repeats 256:3 1024:3 4096:1 8192:1]
       [--n-seqs 256:16 1024:8 4096:4 8192:4] [--fwd-seqs 256:8 1024:4 4096:2 8192:1]
       [--rss-seqs 1024:200] [--a-only 8192] [--max-memory auto] [--no-eager]

The few-sequences rows (``--n-seqs 4096:4 8192:2``) are the regime where Track B's path
matters: the plan picks it by estimated time (the accumulator against the sequences' q/k
factors), and each row's "whole" column is one `pk.measure` on 2n sequences against 2n
bare forwards.

``--calibrate`` instead times Track B's whole fit of one layer (the accumulator's, every
centering variant, T = 4096, 8 sequences), then one layer of Track B's own work on random q/k of the
model's geometry (the accumulator's update and fit, the factors' fit; at T = 1024,
4096 and 8192, n = 1, 2, 4) and prints the constants of
:data:`poskernel_tl.reducers.gram_cost.COST` fitted to them, with each timing's ratio to its
estimate.

Each child process raises glibc's allocator thresholds at start, as the ``poskernel``
command does (:mod:`poskernel_tl.plan.allocator`), so the Hugging Face forwards timed in
the same process run under the same allocator as the measurement; with
``POSKERNEL_MALLOC=default`` every figure is taken with glibc's defaults instead. Each row's
JSON line says which ("malloc").

Where n and 2n would keep Track B differently (the q/k factors of few sequences against the
[T, T] accumulator, or another number of blocks of layers), the A + B marginal would mix two
methods: the script warns; each row's JSON line names the path 2n took ("track B").
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from functools import partial

import numpy as np
import torch
from scipy.optimize import nnls

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.fit.toeplitz import shift_invariance_r2  # noqa: E402
from poskernel_tl.mask import Mask  # noqa: E402
from poskernel_tl.measurement.measure import forward_pass  # noqa: E402
from poskernel_tl.models.embedded import from_gguf  # noqa: E402
from poskernel_tl.models.geometry import Geometry  # noqa: E402
from poskernel_tl.models.registry import resolve  # noqa: E402
from poskernel_tl.plan import batching  # noqa: E402
from poskernel_tl.plan.allocator import reuse_freed_memory  # noqa: E402
from poskernel_tl.reducers import (  # noqa: E402
    GramReducer,
    LayerBatch,
    MomentsReducer,
    TrackAReducer,
)
from poskernel_tl.statistics import FreqUsageReducer, PermNullReducer  # noqa: E402

COLUMNS = ("HF sdpa", "HF eager", "bridge eager", "bridge sdpa", "A only", "A + B")


WALL: dict[str, float] = {}  # wall-clock seconds of the last timed() call, by label


def timed(fn, repeats: int, warm: bool, label: str = "") -> float:
    """The least CPU seconds of ``fn()`` over ``repeats`` runs (a neighbour only ever slows
    a run down; wall seconds kept in WALL)."""
    if warm:
        fn()
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    WALL[label] = min(wall)
    return min(cpu)


def naive_r2(A: np.ndarray) -> float:
    T = A.shape[0]
    vals, resid = [], []
    for d in range(1, T):
        diag = np.diagonal(A, -d)
        vals.append(diag)
        resid.append(diag - diag.mean())
    v, r = np.concatenate(vals), np.concatenate(resid)
    return 1 - (r ** 2).sum() / ((v - v.mean()) ** 2).sum()


def peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GiB (Linux: KiB)


def tokens(model, n: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, model.bridge.cfg.d_vocab - 100, (n, T), generator=g)


def forward_all(model, ids, batch_size: int) -> None:
    with torch.no_grad():
        for s in range(0, len(ids), batch_size):
            model(ids[s:s + batch_size])


def track_a_only(model, ids, batch_size: int, null_seqs: int) -> None:
    """The evaluation pass of pk.measure without Track B, and its fits."""
    s, T, dev = model.spec, ids.shape[1], model.device
    masks = Geometry.of(s, T).masks
    make = lambda: [TrackAReducer(len(ids), masks, s.n_heads, dev),
                    FreqUsageReducer(s.n_layers, s.n_heads, s.n_kv_heads,
                                     *model.rotary_pairs, device=dev),
                    PermNullReducer(masks, s.n_heads, n_perm=4, max_seqs=null_seqs,
                                    device=dev, include_identity=False)]
    for r in forward_pass(model, ids, make, batch_size, "A only", progress=False):
        r.result()


def measure_run(model, ids, batch_size: int | str, null_seqs: int = 8,
                max_memory: str = "auto") -> None:
    half = len(ids) // 2
    pk.measure(model, ids[half:], ids[:half], batch_size=batch_size, progress=False,
               null_seqs=null_seqs, max_memory=max_memory)


def track_b_path(model, T: int, n_eval: int, max_memory: str) -> str:
    """How pk.measure keeps Track B for n_eval evaluation sequences: the sequences' q/k
    factors or the [T, T] accumulator, and in how many blocks of layers."""
    w = batching.Workload(T, n_eval, n_eval, False, T <= 256, 0, False, 4)
    plan = batching.plan_measure(model, w, "auto", max_memory)
    kind = "factors" if all(plan.factors) else "accumulator" if not any(plan.factors) \
        else "per kind of layer"
    return f"{kind}, {len(plan.layer_blocks)} block(s) of layers"


def whole_fit(spec, T: int, n: int) -> tuple[float, float]:
    """CPU seconds of one layer's GramReducer.result with centering (every variant) on n
    random sequences accumulated, the centering means of 4 more (with their half): the
    reducer's first call (a fresh process's first FFTs included) and the least of three
    more (a run fits every layer, so the steady cost is the per-layer one)."""
    H, kv, d = spec.n_heads, spec.n_kv_heads, spec.d_head
    g = torch.Generator().manual_seed(0)
    qk = lambda m: (torch.randn(m, T, H, d, generator=g) + 1, torch.randn(m, T, kv, d,
                                                                            generator=g))
    mom = MomentsReducer(4, 1, H, kv, T, d, half_seed=1)
    mom.update(LayerBatch(0, *qk(4), torch.arange(4), 1.0, rows=(0, 1, 2, 3)))
    cen = mom.result()
    red = GramReducer([Mask(T)], H, kv, d, 1 / math.sqrt(d), reference=cen, full=False)
    for _ in range(n):
        red.update(LayerBatch(0, *qk(1), torch.arange(1), 1 / math.sqrt(d)))
    first = timed(partial(red.result, cen), 1, False)
    return first, timed(partial(red.result, cen), 3, False)


def calibrate(spec, lengths=(1024, 4096, 8192), counts=(1, 2, 4)) -> dict[str, float]:
    """COST's constants from one layer of Track B's own work per path (X as wide as three
    centerings need), per head: the update and the fit by their one unit each, the
    factors' two terms by non-negative least squares on relative error."""
    H, kv, d = spec.n_heads, spec.n_kv_heads, spec.d_head
    units: dict[str, list] = {"update": [], "fit": [], "factors": []}
    for T in lengths:
        x = torch.randn(kv, T, 3 * d, dtype=torch.float64)
        for n in counts:
            batch = LayerBatch(0, torch.randn(n, T, H, d), torch.randn(n, T, kv, d),
                               torch.arange(n), 1.0)
            acc = GramReducer([Mask(T)], H, kv, d, 1.0, full=False)
            t = timed(partial(acc.update, batch), 1, False)
            units["update"].append((t / H, T * T / 2 * d * n))
            units["fit"].append((timed(partial(acc.pieces, 0, x, None), 2, False) / H,
                                 T * T / 2 * d))
            fac = GramReducer([Mask(T)], H, kv, d, 1.0, full=False, factors=True)
            fac.update(batch)
            t = timed(partial(fac.pieces, 0, x, None), 2, False) / H
            units["factors"].append((t, T * n * d * math.log2(2 * T), T * (n * d) ** 2))
    cost = {k: float(np.median([t / u for t, u in units[k]])) for k in ("update", "fit")}
    rows = np.array(units["factors"])
    coef = nnls(rows[:, 1:] / rows[:, :1], np.ones(len(rows)))[0]  # no negative cost
    cost.update(factor_lags=float(coef[0]), factor_rank=float(coef[1]))
    first, steady = whole_fit(spec, 4096, 8)
    print(f"Track B's whole fit of one layer (accumulator; raw, centered and half-centered "
          f"variants; T = 4096, 8 sequences): {steady:.2f} CPU s (least of 3; its first "
          f"call: {first:.2f})")
    print("measured / estimated, per timing (T, n in order):")
    for k in ("update", "fit"):
        print(k, " ".join(f"{t / (cost[k] * u):.2f}" for t, u in units[k]))
    print("factors", " ".join(f"{r[0] / (r[1:] @ coef):.2f}" for r in rows))
    return cost


def one_length(T: int, n: int, n_fwd: int, args) -> dict:
    """Everything for one length, in this (child) process: pk.measure first, so that the
    peak RSS it leaves is the measurement's own, then the forwards. Seconds per sequence
    (CPU), and the wall-clock ones under "wall"."""
    out, warm = {"T": T, "n": n, "n_fwd": n_fwd}, T <= 1024
    # the batch pk.measure's "auto" takes on this CPU at this length (4 up to T = 2048)
    bs = out["batch"] = batching.device_cap(torch.device("cpu"), T) \
        if args.batch_size == "auto" else int(args.batch_size)
    reps = per_length(args.repeats, T, 1)
    model = pk.load_model(args.model, device="cpu", attention="sdpa", progress=False)
    na = max(1, n // 2)
    ids_a = tokens(model, 2 * na, T, 1)
    # the null (4 draws) on the same first sequences in both runs: a fixed cost
    runs = {k: timed(lambda k=k: track_a_only(model, ids_a[:k], bs, min(8, na)),
                     reps, warm, f"A{k}") for k in (na, 2 * na)}
    out["A only"] = (runs[2 * na] - runs[na]) / na
    if T in args.a_only:  # the target there is Track A's; A + B is not timed
        out["A + B"] = out["measure whole 2n"] = float("nan")
    else:
        ids = tokens(model, 2 * n, T, 2)
        # a marginal compares like with like only where n and 2n keep Track B alike
        # n < 4 leaves one evaluation sequence: only the whole run on 2n is timed
        counts = (n, 2 * n) if n >= 4 else (2 * n,)
        paths = [track_b_path(model, T, k // 2, args.max_memory) for k in counts]
        out["track B"] = paths[-1]
        if paths[0] != paths[-1]:
            print(f"warning: T={T}: Track B kept as {paths[0]} on n={n} but as {paths[1]} "
                  f"on 2n: the A + B marginal mixes them (raise --n-seqs)", file=sys.stderr)
        # the null on the same min(8, n/2) sequences in both runs (a fixed cost); a whole
        # run alone takes pk.measure's default (8, or every evaluation sequence)
        nulls = min(8, n // 2) if n >= 4 else 8
        runs = {k: timed(lambda k=k: measure_run(model, ids[:k], bs, nulls, args.max_memory),
                         reps, warm, f"AB{k}")
                for k in counts}
        out["A + B"] = (runs[2 * n] - runs[n]) / n if n in runs else float("nan")
        out["measure whole 2n"] = runs[2 * n] / (2 * n)
    out["rss"] = peak_rss()
    w = batching.Workload(T, n, n, False, T <= 256, 0, False, 4)
    out["plan"] = batching.plan_measure(model, w, min(bs, n), args.max_memory).peak
    ids = tokens(model, n_fwd, T, 3)
    out["bridge sdpa"] = timed(lambda: forward_all(model.bridge, ids, bs),
                               reps, warm, "bridge sdpa") / n_fwd
    model = None  # free it before the next model loads
    hf, _ = from_gguf(resolve(args.model), torch.float32, False)
    out["HF eager"] = out["bridge eager"] = float("nan")
    for impl in ("sdpa",) if args.no_eager else ("sdpa", "eager"):
        hf.set_attn_implementation(impl)
        out[f"HF {impl}"] = timed(lambda: forward_all(hf, ids, bs), reps, warm,
                                  f"HF {impl}") / n_fwd
    hf = None
    if not args.no_eager:
        eager = pk.load_model(args.model, device="cpu", attention="eager", progress=False)
        out["bridge eager"] = timed(lambda: forward_all(eager.bridge, ids, bs),
                                    reps, warm, "bridge eager") / n_fwd
    out["wall"] = dict(WALL)
    return out


def rss_run(T: int, N: int, args) -> dict:
    """Peak RSS (and CPU time) of loading the model and one pk.measure on N sequences."""
    model = pk.load_model(args.model, device="cpu", attention="sdpa", progress=False)
    seconds = timed(lambda: measure_run(model, tokens(model, N, T, 4), "auto", 8,
                                          args.max_memory), 1, False, "run")
    return {"T": T, "N": N, "seconds": seconds, "wall": WALL["run"], "rss": peak_rss()}


def child(argv: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child {' '.join(argv)} failed with exit {done.returncode}")
    return json.loads(lines[-1])


def per_length(pairs: list[str], T: int, default: int) -> int:
    found = dict(p.split(":") for p in pairs)
    return int(found.get(str(T), default))


def print_table(rows: list[dict], rss: list[dict]) -> None:
    print("\nCPU seconds per sequence (× HF sdpa, the floor); \"measure whole 2n\": one "
          "pk.measure on 2n sequences with its fixed costs, per sequence; peak RSS of load + "
          "pk.measure on 2n sequences (the plan's estimate of the measurement alone, GiB)")
    cols = (*COLUMNS, "measure whole 2n")
    print(f"{'T':>5} {'n':>3} " + " ".join(f"{c[:15]:>15}" for c in cols)
          + f" {'peak RSS':>17}  Track B")
    for r in rows:
        floor = r["HF sdpa"]
        cells = [f"{r[c]:7.3f} ({r[c] / floor:4.2f}×)" if r[c] == r[c] else "–" for c in cols]
        print(f"{r['T']:>5} {r['n']:>3} " + " ".join(f"{c:>15}" for c in cells)
              + f" {r['rss']:6.2f} GiB ({r['plan'] / 2**30:4.1f})  {r.get('track B', '–')}")
    for r in rss:
        print(f"peak RSS of load + pk.measure at T={r['T']}, N={r['N']}: {r['rss']:.2f} GiB "
              f"({r['seconds']:.0f} CPU s, {r['seconds'] / r['N']:.3f} per sequence with the "
              f"fixed costs; {r['wall']:.0f} s wall)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m",
                    help="a registry model with GGUF weights (its HF forward is the floor)")
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 4096, 8192])
    ap.add_argument("--n-seqs", nargs="+", default=["256:16", "1024:8", "4096:4", "8192:4"],
                    help="T:n, sequences of pk.measure (2n for the marginal; even, >= 4; n = 2: "
                         "the whole run on 4 only)")
    ap.add_argument("--fwd-seqs", nargs="+", default=["256:8", "1024:4", "4096:2", "8192:1"],
                    help="T:n, sequences per forward timing")
    ap.add_argument("--rss-seqs", nargs="*", default=["1024:200"],
                    help="T:N, one more child: peak RSS of pk.measure on N sequences")
    ap.add_argument("--batch-size", default="auto",
                    help="sequences per forward everywhere (auto: what pk.measure picks on "
                         "this CPU at each length)")
    ap.add_argument("--repeats", nargs="+", default=["256:3", "1024:3", "4096:1", "8192:1"],
                    help="T:r, timings per length (the least counts)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--max-memory", default="auto",
                    help="pk.measure's budget (auto: a share of the memory free when it "
                         "plans; a fixed size keeps Track B's plan the same on a busy machine)")
    ap.add_argument("--a-only", nargs="*", type=int, default=[], metavar="T",
                    help="lengths at which only Track A is timed (A + B left out)")
    ap.add_argument("--no-eager", action="store_true",
                    help="leave out the two eager forwards (reference columns, minutes per "
                         "sequence at long T)")
    ap.add_argument("--calibrate", action="store_true",
                    help="print Track B's cost constants measured on this machine")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rss", nargs=2, type=int, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    reused = reuse_freed_memory()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    if args.calibrate:
        print(f"COST = {calibrate(resolve(args.model))}")
        return
    if args.one:
        n, n_fwd = per_length(args.n_seqs, args.one, 4), per_length(args.fwd_seqs, args.one, 1)
        print(json.dumps({**one_length(args.one, n, n_fwd, args),
                          "malloc": "reused" if reused else "default"}))
        return
    if args.rss:
        print(json.dumps(rss_run(*args.rss, args)))
        return
    print(f"torch threads: {args.threads}; model: {args.model}; batch size {args.batch_size}; "
          f"repeats {' '.join(args.repeats)}", flush=True)
    rows = []
    for T in args.lengths:
        rows.append(child(["--one", str(T), "--model", args.model, "--n-seqs", *args.n_seqs,
                           "--fwd-seqs",
                           *args.fwd_seqs, "--batch-size", str(args.batch_size),
                           "--repeats", *args.repeats, "--threads", str(args.threads),
                           "--max-memory", args.max_memory,
                           *(["--no-eager"] if args.no_eager else []),
                           "--a-only", *map(str, args.a_only)]))
        print(json.dumps(rows[-1]), flush=True)
    rss = [child(["--rss", *pair.split(":"), "--model", args.model,
                  "--threads", str(args.threads),
                  "--max-memory", args.max_memory])
           for pair in args.rss_seqs]
    print_table(rows, rss)
    A = np.random.default_rng(0).standard_normal((256, 256))
    t_naive = timed(lambda: naive_r2(A), 3, True)
    t_ours = timed(lambda: shift_invariance_r2(torch.from_numpy(A)), 3, True)
    print(f"\none 256×256 Toeplitz fit: naive numpy loop {t_naive * 1e3:.1f} ms, ours "
          f"{t_ours * 1e3:.1f} ms: {t_naive / t_ours:.1f}×")


if __name__ == "__main__":
    main()

"""Benchmark: what a whole measurement costs against the floor a user would otherwise pay.

Prints, for the embedded default model on one set of tokens and this machine:
  P1  seconds per sequence of `pk.measure` (centering pass + evaluation pass, all
      reducers, the permutation null included) divided by seconds per sequence of
      Hugging Face's own default forward (sdpa attention) on the same tokens — the
      floor; also against HF eager attention and the bare TransformerBridge forward
      (which runs attention eagerly so its hooks can fire), for reference
      (targets: ≤ 1.10 at T = 256, ≤ 1.30 at T = 1024)
  P2  speed of our Track A statistics vs a naive numpy loop over diagonals
  P3  peak RSS of the run, and the reducers' state at N = 200 computed from their
      tensor sizes (target: ≤ 4 GiB at T = 1024, N = 200)

Marginal cost per sequence: forwards are timed on n sequences; pk.measure on 2n minus on
n, so its fixed costs (the final fits, the permutation null over its first sequences)
cancel. Every timing is a median over --repeats runs after one warm-up (a shared CPU
drifts by ±15%).

Usage: python scripts/bench_tracks.py [--lengths 256 1024] [--n-seqs 8] [--repeats 2]
"""

import argparse
import os
import resource
import statistics
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.loading import _from_gguf  # noqa: E402
from poskernel_tl.reducers import GramReducer, PermNullReducer, TrackAReducer  # noqa: E402
from poskernel_tl.toeplitz import shift_invariance_r2  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_all(model, ids, batch_size):
    with torch.no_grad():
        for s in range(0, len(ids), batch_size):
            model(ids[s:s + batch_size])


def naive_r2(A: np.ndarray) -> float:
    T = A.shape[0]
    vals, resid = [], []
    for d in range(1, T):
        diag = np.diagonal(A, -d)
        vals.append(diag)
        resid.append(diag - diag.mean())
    v, r = np.concatenate(vals), np.concatenate(resid)
    return 1 - (r ** 2).sum() / ((v - v.mean()) ** 2).sum()


def reducer_bytes(model, n, T) -> int:
    s = model.spec
    reds = [TrackAReducer(n // 2, s.n_layers, s.n_heads, T),
            GramReducer(s.n_layers, s.n_heads, s.n_kv_heads, T, s.d_head, 1.0),
            PermNullReducer(s.n_layers, s.n_heads, T)]
    total = 0
    for r in reds:
        for v in list(vars(r).values()) + list(vars(getattr(r, "sums", r)).values()):
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


def bench_length(model, hf_sdpa, hf_eager, T: int, args) -> None:
    n = args.n_seqs
    ids = torch.randint(100, model.bridge.cfg.d_vocab - 100, (n, T))
    t_sdpa = timed(lambda: forward_all(hf_sdpa, ids, args.batch_size), args.repeats)
    t_eager = timed(lambda: forward_all(hf_eager, ids, args.batch_size), args.repeats)
    t_bridge = timed(lambda: forward_all(model.bridge, ids, args.batch_size), args.repeats)
    # marginal cost: a run on 2n sequences minus a run on n (fixed costs — the final
    # fits, the permutation null capped at its first sequences — cancel)
    ids2 = torch.randint(100, model.bridge.cfg.d_vocab - 100, (2 * n, T))
    run = lambda x: pk.measure(model, x[len(x) // 2:], x[: len(x) // 2],
                               batch_size=args.batch_size, progress=False)
    t_small = timed(lambda: run(ids), args.repeats)
    t_run = timed(lambda: run(ids2), args.repeats) - t_small
    print(f"\nT={T}, {n} sequences ({n // 2} centering + {n // 2} evaluation), "
          "seconds per sequence:")
    print(f"  HF forward, sdpa (the floor) {t_sdpa / n:8.3f}")
    print(f"  HF forward, eager            {t_eager / n:8.3f}  ({t_eager / t_sdpa:.2f}x floor)")
    print(f"  bridge forward, no hooks     {t_bridge / n:8.3f}  ({t_bridge / t_sdpa:.2f}x floor)")
    print(f"  pk.measure, whole run on {n}: {t_small / n:8.3f}  (with its fixed costs)")
    print(f"  pk.measure, marginal         {t_run / n:8.3f}  P1 = {t_run / t_sdpa:.2f}x floor, "
          f"{t_run / t_bridge:.2f}x bridge")
    print(f"  P3 reducer state at N=200: {reducer_bytes(model, 200, T) / 2**30:.2f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024])
    ap.add_argument("--n-seqs", type=int, default=8, help="sequences per timing (half "
                    "centering, half evaluation)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = pk.load_model("smollm2-135m", device="cpu")
    hf_sdpa, _ = _from_gguf(model.spec, torch.float32)
    hf_sdpa.set_attn_implementation("sdpa")
    hf_eager, _ = _from_gguf(model.spec, torch.float32)
    hf_eager.set_attn_implementation("eager")
    print(f"torch threads: {torch.get_num_threads()}; model: smollm2-135m "
          f"({model.weights_note}); batch size {args.batch_size}")
    for T in args.lengths:
        bench_length(model, hf_sdpa, hf_eager, T, args)
    A = np.random.default_rng(0).standard_normal((256, 256))
    t_naive = timed(lambda: naive_r2(A), 3)
    t_ours = timed(lambda: shift_invariance_r2(torch.from_numpy(A)), 3)
    print(f"\nP2 (T=256, one matrix): naive numpy loop {t_naive * 1e3:.1f} ms, ours "
          f"{t_ours * 1e3:.1f} ms: {t_naive / t_ours:.1f}x")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"P3 peak RSS of this process: {peak:.2f} GiB (three models loaded)")


if __name__ == "__main__":
    main()

"""Benchmark: what Track A + B cost on top of the forward pass (not a test).

Prints, for the embedded default model on one set of tokens and this machine:
  P1  time of the evaluation pass (Track A + Track B Gram + frequency usage) and of the
      centering pass, each divided by a bare forward pass without hooks   (target ≤ 1.15)
  P2  speed of our Track A statistics vs a naive numpy loop over diagonals (target ≥ 30×)
  P3  peak memory (RSS) of a T=1024 run of the evaluation pass, and the reducers' state

Usage: python scripts/bench_tracks.py [--lengths 256 1024] [--batch-size 4] [--batches 3]
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
from poskernel_tl.hooks import capture_qk, logit_scale  # noqa: E402
from poskernel_tl.reducers import (  # noqa: E402
    CenteringReducer,
    GramReducer,
    LayerBatch,
    TrackAReducer,
)
from poskernel_tl.toeplitz import (  # noqa: E402
    lag_counts,
    lower_lag_stats,
    lower_mean_from_qk,
    r2_from_sums,
)


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_reducers(model, n, T, kind):
    s = model.spec
    dev = model.device
    if kind == "centering":
        return [CenteringReducer(n, s.n_layers, s.n_heads, s.n_kv_heads, T, s.d_head, dev)]
    return [TrackAReducer(n, s.n_layers, s.n_heads, T, dev),
            GramReducer(s.n_layers, s.n_heads, s.n_kv_heads, T, s.d_head,
                        logit_scale(model.hf_model, s.d_head), dev)]


def hooked_pass(model, batches, kind):
    T = batches[0].shape[1]
    reducers = make_reducers(model, sum(len(b) for b in batches), T, kind)
    scale = logit_scale(model.hf_model, model.spec.d_head)
    state = {"start": 0}
    workspace: dict = {}

    def on_qk(layer, q, k):
        idx = torch.arange(state["start"], state["start"] + q.shape[0])
        batch = LayerBatch(layer, q, k, idx, scale, workspace)
        for r in reducers:
            r.update(batch)

    with torch.no_grad(), capture_qk(model.bridge, on_qk):
        for b in batches:
            model.bridge(b)
            state["start"] += len(b)
    return reducers


def bare_pass(model, batches):
    with torch.no_grad():
        for b in batches:
            model.bridge(b)


def p1(model, T, batch_size, n_batches, repeats):
    g = torch.Generator().manual_seed(T)
    vocab = model.bridge.cfg.d_vocab
    batches = [torch.randint(0, vocab, (batch_size, T), generator=g) for _ in range(n_batches)]
    bare_pass(model, batches[:1])  # warm up
    # interleaved, so that drift in machine speed hits all three alike
    runs: dict[str, list[float]] = {"bare": [], "eval": [], "centering": []}
    for _ in range(repeats):
        runs["bare"].append(timed(lambda: bare_pass(model, batches), 1))
        runs["eval"].append(timed(lambda: hooked_pass(model, batches, "eval"), 1))
        runs["centering"].append(timed(lambda: hooked_pass(model, batches, "centering"), 1))
    bare, ev, cen = (statistics.median(runs[k]) for k in ("bare", "eval", "centering"))
    n = batch_size * n_batches
    print(f"P1 T={T} (median of {repeats} interleaved runs of {n} sequences): "
          f"bare forward {bare / n:.3f} s/seq | evaluation pass {ev / n:.3f} s/seq "
          f"(ratio {ev / bare:.2f}, target ≤ 1.15) | centering pass {cen / n:.3f} s/seq "
          f"(ratio {cen / bare:.2f})")
    return batches


def naive_fit(A: np.ndarray) -> float:
    """R² of g(Δ) by a plain loop over the sub-diagonals (numpy, float64)."""
    T = A.shape[0]
    g = np.array([np.diagonal(A, -d).mean() for d in range(1, T)])
    vals, resid = [], []
    for d in range(1, T):
        diag = np.diagonal(A, -d)
        vals.append(diag)
        resid.append(diag - g[d - 1])
    vals, resid = np.concatenate(vals), np.concatenate(resid)
    return 1 - np.sum(resid ** 2) / np.sum((vals - vals.mean()) ** 2)


def p2(model, batches):
    """Our Track A statistics vs a naive numpy loop, on one layer's real q/k."""
    got = {}
    with torch.no_grad(), capture_qk(model.bridge, lambda layer, q, k: got.setdefault(
            layer, (q.clone(), k.clone())), layers=[0]):
        model.bridge(batches[0][:1])
    q, k = got[0]
    scale = logit_scale(model.hf_model, model.spec.d_head)
    T = q.shape[1]

    workspace: dict = {}
    work = torch.zeros(1, q.shape[2], 2 * T, T)

    def ours():  # what TrackAReducer.update does, then the fit
        A = LayerBatch(0, q, k, torch.arange(1), scale, workspace).scores
        (s1, sq), _ = lower_lag_stats(A, lower_mean_from_qk(q, k, scale), [], work)
        return r2_from_sums(s1, sq, lag_counts(T))[0][0]

    qn = q[0].double().numpy()
    kn = k[0].double().numpy()
    group = q.shape[2] // k.shape[2]

    def naive():
        return np.array([naive_fit(qn[:, h] @ kn[:, h // group].T * scale)
                         for h in range(qn.shape[1])])

    A = LayerBatch(0, q, k, torch.arange(1), scale).scores.clone()
    An = A[0].double().numpy()
    shift = lower_mean_from_qk(q, k, scale)

    def ours_given_scores():
        (s1, sq), _ = lower_lag_stats(A, shift, [], work)
        return r2_from_sums(s1, sq, lag_counts(T))[0][0]

    def naive_given_scores():
        return np.array([naive_fit(An[h]) for h in range(An.shape[0])])

    diff = np.abs(ours().numpy() - naive()).max()
    t_ours, t_naive = timed(ours, 20), timed(naive, 3)
    t_ours_a, t_naive_a = timed(ours_given_scores, 20), timed(naive_given_scores, 3)
    print(f"P2 T={T}, one sequence x {q.shape[2]} heads: from q/k (product included) ours "
          f"{t_ours * 1e3:.2f} ms vs naive numpy loop {t_naive * 1e3:.1f} ms → "
          f"{t_naive / t_ours:.0f}×; statistics given the logits ours {t_ours_a * 1e3:.2f} ms vs "
          f"{t_naive_a * 1e3:.1f} ms → {t_naive_a / t_ours_a:.0f}× (target ≥ 30×); "
          f"max |ΔR²| {diff:.1e}")


def p3(model_name: str, n_seqs: int = 8) -> None:
    """A real T=1024 `poskernel run` in a child process; its peak RSS, and the reducer
    state the same run would hold with the seed's N = 200."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "poskernel_tl.cli", "run", "--model", model_name,
               "--dataset", "stdlib-code", "--length", "1024", "--n-seqs", str(n_seqs),
               "--out", out, "--quiet", "--device", "cpu"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20
    spec = pk.resolve(model_name)
    L, H, T = spec.n_layers, spec.n_heads, 1024
    gram = L * H * T * T * 8
    track_a = 100 * L * H * (2 * (T - 1) + 2) * 8
    print(f"P3 T=1024, N={n_seqs}: peak RSS {peak:.2f} GiB ({wall:.0f} s wall); with N=200 "
          f"the reducers hold {(gram + track_a) / 2 ** 30:.2f} GiB "
          f"(Gram sum {gram / 2 ** 30:.2f} GiB float64, Track A per-sequence sums "
          f"{track_a / 2 ** 30:.2f} GiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = pk.load_model(args.model, device="cpu")
    print(f"{args.model} on {model.device}, torch threads {torch.get_num_threads()}")
    for T in args.lengths:
        batches = p1(model, T, args.batch_size, args.batches, args.repeats)
        if T == args.lengths[0]:
            p2(model, batches)
    if 1024 in args.lengths:
        del model
        p3(args.model)


if __name__ == "__main__":
    main()

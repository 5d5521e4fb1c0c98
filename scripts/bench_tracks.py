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
from poskernel_tl.toeplitz import lag_counts, lag_sums, r2_from_sums  # noqa: E402


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

    def on_qk(layer, q, k):
        idx = torch.arange(state["start"], state["start"] + q.shape[0])
        batch = LayerBatch(layer, q, k, idx, scale)
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
    bare = timed(lambda: bare_pass(model, batches), repeats)
    ev = timed(lambda: hooked_pass(model, batches, "eval"), repeats)
    cen = timed(lambda: hooked_pass(model, batches, "centering"), repeats)
    n = batch_size * n_batches
    print(f"P1 T={T}: bare forward {bare / n:.3f} s/seq | evaluation pass {ev / n:.3f} s/seq "
          f"(ratio {ev / bare:.2f}, target ≤ 1.15) | centering pass {cen / n:.3f} s/seq "
          f"(ratio {cen / bare:.2f})")
    return batches


def p2(model, batches):
    """Our Track A statistics vs a naive numpy loop, on one layer's real q/k."""
    got = {}
    with torch.no_grad(), capture_qk(model.bridge, lambda layer, q, k: got.setdefault(
            layer, (q.clone(), k.clone())), layers=[0]):
        model.bridge(batches[0][:1])
    q, k = got[0]
    scale = logit_scale(model.hf_model, model.spec.d_head)
    T = q.shape[1]

    def ours():
        A = LayerBatch(0, q, k, torch.arange(1), scale).scores
        s1, sq = lag_sums(A)
        return r2_from_sums(s1, sq, lag_counts(T))[0]

    qn = q[0].double().numpy()
    kn = k[0].double().numpy()
    group = q.shape[2] // k.shape[2]

    def naive():
        out = []
        for h in range(qn.shape[1]):
            A = qn[:, h] @ kn[:, h // group].T * scale
            g = np.array([np.diagonal(A, -d).mean() for d in range(1, T)])
            vals, resid = [], []
            for d in range(1, T):
                diag = np.diagonal(A, -d)
                vals.append(diag)
                resid.append(diag - g[d - 1])
            vals, resid = np.concatenate(vals), np.concatenate(resid)
            out.append(1 - np.sum(resid ** 2) / np.sum((vals - vals.mean()) ** 2))
        return np.array(out)

    diff = np.abs(ours().numpy() - naive()).max()
    t_ours = timed(ours, 5)
    t_naive = timed(naive, 3)
    print(f"P2 T={T}: ours {t_ours * 1e3:.1f} ms, naive numpy loop {t_naive * 1e3:.1f} ms "
          f"per layer-sequence → {t_naive / t_ours:.0f}× (target ≥ 30×); max |ΔR²| {diff:.1e}")


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

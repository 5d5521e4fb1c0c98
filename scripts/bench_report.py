"""Benchmark: ``poskernel report`` at the size of the protocol's full grid.

Builds synthetic results with the layer and head counts of the six grid models (gpt2,
gpt2-medium, olmo-1b, llama-3.2-1b, tinyllama-1.1b, tinyllama-nope-1.1b: 2,704 heads) for
3 datasets × 2 lengths (T = 256, 1024), each condition a ``ConditionResult`` of random but
valid arrays saved with ``.save`` as the grid saves it (100 evaluation sequences; at
T = 256 the Gram matrices and the logits of 10 sequences, as ``--save-logits`` keeps
them; random tokens uncentered), runs the spectral analysis of every condition (as
``poskernel spectral`` does), then times ``build_report`` in a child process and prints

  R1  the report's wall time (target ≤ 5 min on 2 cores) and its CPU time,
  R2  the report folder's size (target ≤ 1 GB) and the report process's peak RSS.

The synthetic folder is kept (``--out``, default a temporary folder; it needs ≈ 30 GB at
the default sizes) and reused by a rerun: conditions already saved are not rebuilt.

Usage: python scripts/bench_report.py [--out DIR] [--models …] [--lengths 256 1024]
       [--n-eval 100] [--n-logits 10] [--workers 2]
"""

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from poskernel_tl import constants as C  # noqa: E402
from poskernel_tl.analyses.spectral import run_spectral  # noqa: E402
from poskernel_tl.measurement.result import ConditionResult  # noqa: E402
from poskernel_tl.models.registry import REGISTRY  # noqa: E402

MODELS = ("gpt2", "gpt2-medium", "olmo-1b", "llama-3.2-1b", "tinyllama-1.1b",
          "tinyllama-nope-1.1b")
DATASETS = ("wikipedia", "code", "random")


def kernel(spec, T: int, rng) -> np.ndarray:
    """g(Δ) [layer, head_index, lag]: a few rotary cosines (rotary models) or a decay,
    plus noise, so that the spectral analysis finds peaks of both kinds."""
    L, H = spec.n_layers, spec.n_heads
    lags = np.arange(1, T, dtype=np.float64)
    g = np.exp(-lags / rng.uniform(5, 50, (L, H, 1)))
    th = spec.rotary_frequencies() if spec.pe == "rope" else None
    if th is not None:
        pick = th[rng.integers(0, len(th), (L, H, 3))]  # three θ per head
        g = g + np.cos(pick[..., None] * lags).sum(-2) * rng.uniform(0, 0.5, (L, H, 1))
    return g + 0.1 * rng.standard_normal((L, H, T - 1))


def synthetic(model: str, dataset: str, T: int, n_eval: int, n_logits: int, seed: int
              ) -> ConditionResult:
    spec = REGISTRY[model]
    L, H, Hkv, d = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head
    rng = np.random.default_rng(seed)
    centered = dataset != "random"
    g = kernel(spec, T, rng)
    r2 = np.clip(0.7 - 0.03 * np.arange(L)[:, None] + 0.1 * rng.standard_normal((L, H)), 0, 1)
    per_seq = np.clip(r2 + 0.05 * rng.standard_normal((n_eval, L, H)), 0, 1)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    fields = dict(
        r2_per_seq=per_seq, r2_per_seq_nosink=per_seq, r2_pooled=r2, r2_pooled_nosink=r2,
        g_per_seq=(g[None] + f32(n_eval, L, H, T - 1)).astype(np.float32), g_pooled=g,
        r2_pooled_early=r2, r2_pooled_interior=r2, r2_pooled_interior_keys=r2,
        r2_split=np.repeat(r2[None], 5, 0), centered=centered,
        r2_gram=r2 * 0.9 if centered else np.full((L, H), np.nan),
        g_gram=g * 0.5 if centered else np.full(g.shape, np.nan), r2_gram_raw=r2 * 0.8,
        g_gram_raw=g + 1.0, r2_gram_half=r2 * 0.9 if centered else np.full((L, H), np.nan),
        n_centering=n_eval if centered else 0, n_centering_half=n_eval // 2 if centered else 0,
        r2_perm_null=np.abs(0.01 * rng.standard_normal((4, L, H))), r2_perm_same_seqs=r2,
        logits={})
    if centered:
        fields.update(mean_q=f32(L, H, T, d), mean_k=f32(L, Hkv, T, d),
                      mean_q_half=f32(L, H, T, d), mean_k_half=f32(L, Hkv, T, d))
    if spec.pe == "rope":
        fields.update(q_pair_norm=np.abs(f32(L, H, d // 2)) + 0.1,
                      k_pair_norm=np.abs(f32(L, Hkv, d // 2)) + 0.1,
                      pair_first=np.arange(d // 2), pair_second=np.arange(d // 2) + d // 2)
    if T <= C.GRAM_SAVE_MAX_T:
        t, s = np.tril_indices(T, -1)
        gram = np.full((L, H, T, T), np.nan, np.float32)
        gram[..., t, s] = g[..., t - s - 1] + 0.1 * f32(L, H, len(t))
        fields.update(gram_raw=gram, gram_centered=gram if centered else None)
        logits = {}
        for sid in range(0, 11 * n_logits, 11)[:n_logits]:
            A = np.full((L, H, T, T), np.nan, np.float32)
            A[..., t, s] = g[..., t - s - 1] + f32(L, H, len(t))
            logits[sid] = A
        fields["logits"] = logits
    return ConditionResult(model=model, dataset=dataset, length=T, spec=spec,
                           seq_id=np.arange(n_eval), provenance={"weights": "synthetic"},
                           **fields)


def build(out: Path, plan: list[tuple[str, str, int]], n_eval: int, n_logits: int) -> float:
    t0 = time.perf_counter()
    have = set(ConditionResult.conditions(out)) if (out / C.RESULTS_DIR).is_dir() else set()
    for i, (model, dataset, T) in enumerate(plan):
        if (model, dataset, T) not in have:
            synthetic(model, dataset, T, n_eval, n_logits, seed=i).save(out)
            print(f"  saved {model} {dataset} T={T}", flush=True)
    return time.perf_counter() - t0


def _spectral(args) -> float:
    out, key, gate = args
    t0 = time.perf_counter()
    run_spectral(ConditionResult.load(out, *key), out, gate_met=gate)
    return time.perf_counter() - t0


def spectral(out: Path, plan: list, workers: int) -> float:
    """The spectral analysis of every condition (both g sources), gated over the folder."""
    t0 = time.perf_counter()
    todo = [k for k in plan if not C.result_path(out, *k, "spectral_spectra.npz").exists()]
    if todo:
        early = [pd.read_csv(C.result_path(out, *k, C.TRACK_A_CSV), usecols=[
            "layer", "R2_pooled"]).query("layer < 2")["R2_pooled"] for k in plan
            if REGISTRY[k[0]].pe == "rope"]  # the protocol's gate, as grid_gate computes it
        gate = bool(pd.concat(early).mean() > 0.60) if early else None
        with mp.get_context("fork").Pool(workers) as pool:
            pool.map(_spectral, [(out, k, gate) for k in todo], chunksize=1)
    return time.perf_counter() - t0


def report(out: Path, workers: int) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS GB) of build_report in a child process with the allocator
    setting of the ``poskernel`` command (POSKERNEL_MALLOC=default: glibc's); the peak is the
    report process's own (its VmHWM: Linux carries a forked parent's peak into the child's
    ``ru_maxrss`` across exec, so after building the folder that read ≈ 3.2 GB) or its
    figure workers', as that child reads it (this process's children include the synthetic
    build's workers)."""
    code = ("import re, resource, sys; from poskernel_tl.report.build import build_report; "
            "from poskernel_tl.plan.allocator import reuse_freed_memory; "
            f"reuse_freed_memory(); build_report(sys.argv[1], workers={workers}); "
            "own = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]); "
            "print('peak', max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(out)], check=True,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak = int(done.stdout.split("peak")[-1])  # KiB on Linux
    return wall, cpu, peak * 1024 / 1e9


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024])
    ap.add_argument("--n-eval", type=int, default=100)
    ap.add_argument("--n-logits", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-report-"))
    plan = [(m, d, T) for m in args.models for T in args.lengths for d in DATASETS]
    heads = sum(REGISTRY[m].n_layers * REGISTRY[m].n_heads for m in args.models)
    print(f"{len(plan)} conditions, {heads} heads per (dataset, length), "
          f"{heads * len(plan) // len(args.models)} in all ... (folder {out})", flush=True)
    print(f"  synthetic results saved in {build(out, plan, args.n_eval, args.n_logits):.0f} s")
    print(f"  spectral analysis (both g sources) in {spectral(out, plan, args.workers):.0f} s")
    wall, cpu, rss = report(out, args.workers)
    size = folder_bytes(out / "report")
    print(f"R1  report: {wall:.1f} s wall ({cpu:.0f} s CPU, {args.workers} workers; "
          "target ≤ 300 s)")
    print(f"R2  report folder: {size / 1e9:.3f} GB (target ≤ 1 GB); data files "
          f"{folder_bytes(out / 'report' / 'data') / 1e9:.3f} GB; peak RSS {rss:.2f} GB")


if __name__ == "__main__":
    main()

"""Benchmark: Track A's statistics from q/k (``source="lags"``) vs from the materialised
T×T logits (``source="scores"``), one layer, one sequence per update (not a test).

Per length T and path, in a fresh process each (so peaks do not mix), it prints
  s/seq    best and median wall seconds of one ``TrackAReducer.update`` over --repeats
           calls after one warm-up (the workspace buffers are reused, as in a pass)
  cpu      process CPU seconds of the best call's median (less disturbed by other load)
  peak     peak resident memory of the process minus its resident memory once the
           inputs exist (MiB): what the update itself needs
  est      the largest buffers, computed analytically: the materialised path holds
           scores (4·H·T² B) and its [H, 2T, T] sweep buffer (8·H·T² B); the lag path a
           few float64 copies of q/k, the per-chunk products (8·H·T·C B) and the key
           strip with its sheared copy (≈ 3·8·H·T·50 B)
The materialised path runs only while its estimate fits under --max-materialised-gib.
Inputs are float32 q/k shaped like SmolLM2-135M's attention (9 query heads, 3 kv heads,
d_head 64) with a positional component.

Usage: python scripts/bench_lag_sums.py [--lengths 256 1024 4096 8192] [--repeats 3]
       [--heads 9] [--kv-heads 3] [--d-head 64] [--max-materialised-gib 12] [--threads N]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

MIB = 2 ** 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def estimate(path: str, T: int, H: int, d: int, chunk: int = 64) -> int:
    if path == "scores":
        return 12 * H * T * T
    return 8 * H * T * (4 * d + chunk + 3 * 50)


def one(path: str, T: int, H: int, Hkv: int, d: int, repeats: int) -> dict:
    """Time one path at one length in this process; returns the row as a dict."""
    from poskernel_tl.mask import Mask
    from poskernel_tl.reducers import LayerBatch, TrackAReducer, Workspace

    g = torch.Generator().manual_seed(0)
    pos = torch.randn(1, T, 1, d, generator=g)
    q = torch.randn(1, T, H, d, generator=g) + pos
    k = torch.randn(1, T, Hkv, d, generator=g) + pos
    idx = torch.zeros(1, dtype=torch.long)
    red = TrackAReducer(1, [Mask(T)], H, source=path)
    ws = Workspace()
    base = rss_bytes()
    walls, cpus = [], []
    for _ in range(repeats + 1):
        batch = LayerBatch(0, q, k, idx, d ** -0.5, rows=(0,), workspace=ws)
        w0, c0 = time.perf_counter(), time.process_time()
        red.update(batch)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        del batch
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    walls, cpus = walls[1:], cpus[1:]
    return dict(path=path, T=T, best=min(walls), median=statistics.median(walls),
                cpu=statistics.median(cpus), peak_mib=max(0, peak - base) / MIB,
                est_mib=estimate(path, T, H, d) / MIB)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--max-materialised-gib", type=float, default=12.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--one", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.one:
        row = one(a.one[0], int(a.one[1]), a.heads, a.kv_heads, a.d_head, a.repeats)
        print(json.dumps(row))
        return
    print(f"torch {torch.__version__}, {a.threads or torch.get_num_threads()} thread(s)")
    print(f"{'T':>6} {'path':>7} {'best s/seq':>11} {'median':>9} {'cpu s':>8} "
          f"{'peak MiB':>9} {'est MiB':>9}")
    for T in a.lengths:
        for path in ("lags", "scores"):
            est = estimate(path, T, a.heads, a.d_head)
            if path == "scores" and est > a.max_materialised_gib * 2 ** 30:
                print(f"{T:>6} {path:>7}   skipped: estimate {est / MIB:.0f} MiB")
                continue
            # fewer repeats where one call takes long
            reps = a.repeats if path == "lags" or T <= 1024 else 1
            cmd = [sys.executable, __file__, "--one", path, str(T), "--repeats", str(reps),
                   "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
                   "--d-head", str(a.d_head), "--threads", str(a.threads)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{T:>6} {path:>7}   failed:\n{run.stderr[-2000:]}")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"{T:>6} {path:>7} {r['best']:>11.4f} {r['median']:>9.4f} "
                  f"{r['cpu']:>8.3f} {r['peak_mib']:>9.0f} {r['est_mib']:>9.0f}", flush=True)


if __name__ == "__main__":
    main()

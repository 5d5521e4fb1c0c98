"""Timing and memory on one device for the GPU benchmark (``scripts/bench_gpu.py``): the
fastest of repeated calls with their peak and activation memory, the untouched baseline's
seconds per sequence, and whether its activation grows like T² (a forward that holds
[batch, heads, T, T] scores: no ratio is printed against it)."""

import math
import time

import torch

QUADRATIC = 2 ** 1.5  # activation growth from T/2 to T above this: T² scores are held
GiB = 2**30


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def weights_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size()
               for t in [*module.parameters(), *module.buffers()])


def timed(fn, device: str, weights: int, repeats: int = 1) -> tuple[object, float, float, float]:
    """(``fn()``, seconds, peak GiB, activation GiB), the fastest of ``repeats`` calls: the
    activation is the most memory allocated above what was allocated as ``fn`` began, the
    peak that plus ``weights`` bytes (NaN on CPU)."""
    best = (None, math.inf, math.nan, math.nan)
    for _ in range(repeats):
        before = 0
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        seconds = time.perf_counter() - t0
        activation = (torch.cuda.max_memory_allocated() - before) / GiB \
            if device == "cuda" else math.nan
        if seconds < best[1]:
            best = (out, seconds, weights / GiB + activation, activation)
    return best


def batches(ids: torch.Tensor, batch: int, device: str, fn) -> None:
    for i in range(0, len(ids), batch):
        fn(ids[i:i + batch].to(device))


@torch.no_grad()
def time_baseline(baseline, ids: torch.Tensor, batch: int, device: str) -> dict:
    """Seconds per sequence (best of 3), peak and activation GiB of ``baseline.model`` on
    ``ids`` in batches of ``batch`` after a warm-up batch; ``half``: the activation of one
    batch at T/2."""
    w = weights_bytes(baseline)
    baseline.model(ids[:batch].to(device))  # warm-up
    _, sec, mem, act = timed(lambda: batches(ids, batch, device, baseline.model), device, w, 3)
    half = timed(lambda: baseline.model(ids[:batch, :ids.shape[1] // 2].to(device)),
                 device, w)[3]
    return dict(sec=sec / len(ids), peak=mem, act=act, half=half, batch=batch)


def grows_like_t2(base: dict) -> bool | None:
    """Whether the baseline's activation memory grew from T/2 to T by more than
    :data:`QUADRATIC` (None: not measured)."""
    if not (base["half"] > 0 and math.isfinite(base["act"])):
        return None
    return base["act"] / base["half"] > QUADRATIC

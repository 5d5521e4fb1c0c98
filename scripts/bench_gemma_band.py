"""Benchmark and parity: Gemma-3-270M's local layers on their band (not a test).

Fifteen of Gemma-3-270M's eighteen layers read a 512-token window. On the sdpa path they
run :func:`~poskernel_tl.hooks.banded.banded_sdpa` (blocks of queries against their window
of keys) and Hugging Face describes its masks instead of building them
(:mod:`poskernel_tl.hooks.lazy_masks`). ``--old-path`` restores the previous fast path for
comparison: Hugging Face's float [T, T] masks, read back by ``causal_window``, and a
full-size sdpa under a bool [T, T] band.

  parity   one random sequence of ``--length`` tokens: every layer's hook_z (the
           attention output entering o) on the band against TransformerLens's eager
           attention, Hugging Face's eager attention and the previous fast path
  forward  ``--n-seqs`` random sequences one at a time through all 18 layers, without
           the unembedding: ``--path bridge`` (the bridge on the sdpa path, stopped after
           the last block), ``--path hf`` (Hugging Face's own sdpa forward,
           ``model.model(ids)``) or ``--path all`` (the three, bridge on the band, bridge on
           the previous path and hf, in turn on each sequence in one process: the ratios
           of a shared machine's timings); seconds per sequence and the peak RSS

  run      the whole ``poskernel run --model gemma3-270m --dataset random`` of ``--n-seqs``
           sequences (a child process: its wall seconds, CPU seconds and peak RSS), then
           Hugging Face's own sdpa forward ``model.model(ids)`` of the same sequences (read
           from the run's sequence file, one at a time, loading excluded); the ratio

Usage: python scripts/bench_gemma_band.py parity [--length 1300]
       python scripts/bench_gemma_band.py run [--length 8192] [--n-seqs 4] [--out DIR]
              [--hf-seqs N]
       python scripts/bench_gemma_band.py forward --path bridge|hf|all [--length 8192]
              [--n-seqs 1] [--old-path]
"""

import argparse
import resource
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

VOCAB = 262_000  # random token ids below Gemma 3's vocabulary size


class _Stop(Exception):
    pass


@contextmanager
def old_path(bridge):
    """The previous fast path: built float masks and a full-size sdpa under the band."""
    from poskernel_tl.hooks import fast_attention as fa
    from poskernel_tl.hooks.lazy_masks import uninstall_lazy_masks
    from poskernel_tl.hooks.masks import band

    def full(q, k, v, scale, window=0):
        if not window:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=band(q.shape[2], window,
                                                                      q.device),
                                              scale=scale, enable_gqa=q.shape[1] != k.shape[1])

    real = fa._sdpa
    config = bridge.original_model.config
    uninstall_lazy_masks(config)
    fa._sdpa = full
    try:
        yield
    finally:
        fa._sdpa = real
        config._attn_implementation = "poskernel_lazy_eager"


def bridge_z(bridge, ids) -> dict[int, torch.Tensor]:
    """Every layer's hook_z, the forward stopped after the last block."""
    n = len(bridge.blocks)
    zs = {}

    def keep(x, hook, i):
        zs[i] = x.detach().clone()

    def stop(x, hook):
        raise _Stop

    hooks = [(f"blocks.{i}.attn.hook_z", lambda x, hook, i=i: keep(x, hook, i))
             for i in range(n)] + [(f"blocks.{n - 1}.hook_out", stop)]
    with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
        try:
            bridge(ids)
        except _Stop:
            pass
    return zs


def hf_eager_z(ids) -> dict[int, torch.Tensor]:
    from poskernel_tl.models import embedded
    from poskernel_tl.models.registry import REGISTRY

    hf, _ = embedded.from_gguf(REGISTRY["gemma3-270m"], torch.float32, progress=False)
    zs = {}
    for i, layer in enumerate(hf.model.layers):
        layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: zs.__setitem__(i, args[0].detach().clone()))
    with torch.no_grad():
        hf.model(ids, use_cache=False)
    return zs


def parity(length: int) -> None:
    import poskernel_tl as pk
    from poskernel_tl.hooks.fast_attention import set_attention

    ids = torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))
    model = pk.load_model("gemma3-270m", progress=False)
    types = model.hf_model.config.layer_types
    band = bridge_z(model.bridge, ids)
    with old_path(model.bridge):
        old = bridge_z(model.bridge, ids)
    set_attention(model.bridge, "eager")
    eager = bridge_z(model.bridge, ids)
    hf = hf_eager_z(ids)
    print(f"Gemma-3-270M, T = {length}, one random sequence, float32: max |Δ hook_z| "
          "(relative to the layer's max |z|)")
    print(f"{'layer':>5} {'kind':8} {'TL eager':>18} {'HF eager':>18} {'previous path':>14}")
    for i in range(len(band)):
        z, scale = band[i], band[i].abs().max().item()
        d = [(z - ref[i].reshape(z.shape)).abs().max().item() for ref in (eager, hf, old)]
        print(f"{i:5d} {types[i][:7]:8} {d[0]:9.2e} ({d[0] / scale:.0e}) "
              f"{d[1]:9.2e} ({d[1] / scale:.0e}) {d[2]:14.2e}")


def forward(path: str, length: int, n_seqs: int, old: bool) -> None:
    import poskernel_tl as pk

    ids = torch.randint(3, VOCAB, (n_seqs, length), generator=torch.Generator().manual_seed(0))
    if path == "hf":
        from poskernel_tl.models import embedded
        from poskernel_tl.models.registry import REGISTRY

        hf, _ = embedded.from_gguf(REGISTRY["gemma3-270m"], torch.float32, progress=False)
        hf.set_attn_implementation("sdpa")
        run = lambda x: hf.model(x)  # noqa: E731
    else:
        model = pk.load_model("gemma3-270m", progress=False)
        run = lambda x: bridge_forward(model.bridge, x)  # noqa: E731
        if old:
            ctx = old_path(model.bridge)
            ctx.__enter__()
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    times = []
    with torch.no_grad():
        for i in range(n_seqs):
            t0 = time.perf_counter()
            run(ids[i:i + 1])
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    label = path + (" (previous path)" if old else "")
    print(f"{label}: T = {length}, {n_seqs} sequences, {torch.get_num_threads()} threads: "
          f"{sum(times) / n_seqs:.2f} s/seq (each {', '.join(f'{t:.2f}' for t in times)}); "
          f"peak RSS {peak:.2f} GiB (after loading {loaded:.2f} GiB)")


def compare(length: int, n_seqs: int) -> None:
    import poskernel_tl as pk
    from poskernel_tl.models import embedded
    from poskernel_tl.models.registry import REGISTRY

    ids = torch.randint(3, VOCAB, (n_seqs, length), generator=torch.Generator().manual_seed(0))
    hf, _ = embedded.from_gguf(REGISTRY["gemma3-270m"], torch.float32, progress=False)
    hf.set_attn_implementation("sdpa")
    bridge = pk.load_model("gemma3-270m", progress=False).bridge

    def previous(x):
        with old_path(bridge):
            bridge_forward(bridge, x)

    runs = {"band": lambda x: bridge_forward(bridge, x), "previous": previous,
            "hf": lambda x: hf.model(x)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for i in range(n_seqs):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run(ids[i:i + 1])
                times[name].append(time.perf_counter() - t0)
    hf_mean = sum(times["hf"]) / n_seqs
    print(f"T = {length}, {n_seqs} sequences in turn, {torch.get_num_threads()} threads")
    for name, ts in times.items():
        mean = sum(ts) / n_seqs
        print(f"  {name:9s} {mean:8.2f} s/seq ({', '.join(f'{t:.2f}' for t in ts)})  "
              f"{mean / hf_mean:5.2f}× hf")


def whole_run(length: int, n_seqs: int, out: str | None, hf_seqs: int | None) -> None:
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from poskernel_tl.models import embedded
    from poskernel_tl.models.registry import REGISTRY

    out = out or tempfile.mkdtemp(prefix="bench_gemma_run_")
    cmd = [str(Path(sys.executable).parent / "poskernel"), "run", "--model", "gemma3-270m",
           "--dataset", "random", "--length", str(length), "--n-seqs", str(n_seqs),
           "--out", out, "--quiet", "--overwrite"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"poskernel run: T = {length}, {n_seqs} sequences: {wall:.1f} s wall "
          f"({wall / n_seqs:.1f} s/seq), {cpu:.0f} CPU s, peak RSS "
          f"{after.ru_maxrss / 2**20:.2f} GiB", flush=True)
    ids = torch.load(next(Path(out).glob(f"data/*_{length}_seqs.pt")))["input_ids"][:hf_seqs]
    hf, _ = embedded.from_gguf(REGISTRY["gemma3-270m"], torch.float32, progress=False)
    hf.set_attn_implementation("sdpa")
    times = []
    with torch.no_grad():
        for i in range(len(ids)):
            t0 = time.perf_counter()
            hf.model(ids[i:i + 1])
            times.append(time.perf_counter() - t0)
    per = sum(times) / len(times)
    print(f"Hugging Face sdpa forward, the run's first {len(ids)} sequences: {per:.1f} s/seq "
          f"({', '.join(f'{t:.1f}' for t in times)}); the whole run: "
          f"{wall / n_seqs / per:.2f}× it per sequence")


def bridge_forward(bridge, ids) -> None:
    def stop(x, hook):
        raise _Stop

    with bridge.hooks(fwd_hooks=[(f"blocks.{len(bridge.blocks) - 1}.hook_out", stop)]):
        try:
            bridge(ids)
        except _Stop:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["parity", "forward", "run"])
    ap.add_argument("--path", choices=["bridge", "hf", "all"], default="bridge")
    ap.add_argument("--length", type=int, default=None)
    ap.add_argument("--n-seqs", type=int, default=1)
    ap.add_argument("--old-path", action="store_true")
    ap.add_argument("--out", default=None, help="run: the output folder (default: a new one)")
    ap.add_argument("--hf-seqs", type=int, default=None,
                    help="run: time Hugging Face's forward on the first N sequences only")
    a = ap.parse_args()
    if a.what == "parity":
        parity(a.length or 1300)
    elif a.what == "run":
        whole_run(a.length or 8192, a.n_seqs, a.out, a.hf_seqs)
    elif a.path == "all":
        compare(a.length or 8192, a.n_seqs)
    else:
        forward(a.path, a.length or 8192, a.n_seqs, a.old_path)


if __name__ == "__main__":
    main()

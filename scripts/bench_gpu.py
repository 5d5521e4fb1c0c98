"""GPU benchmark: the whole measurement against Hugging Face's own forward, on one GPU.

Builds two shapes from their configs with random weights (nothing is fetched):
SmolLM2-135M's (30 layers, 9 query / 3 key-value heads, d_head 64) and Llama-3.2-1B's
(16 layers, 32 / 8 heads, d_head 64), in bf16 as the project loads a bf16 checkpoint on
CUDA. Per length it prints

- ``pk.measure`` with its default options (Track A, Track B, the 4-draw null, the
  pattern statistics) in seconds per sequence, and Hugging Face's sdpa forward
  (``model.model(ids)``, same dtype, same tokens, in batches of the size the measurement
  chose, after a warm-up, ``torch.cuda.synchronize``) per sequence, their ratio, and the
  peak GPU memory of each;
- with ``--profile T``: ``torch.profiler``'s count of kernel launches, device-to-device
  copies and host synchronisations of one measurement at length T, and the launches per
  layer and batch of the evaluation pass (PyTorch operators that run a kernel plus
  Triton launches, counted on every reducer's update:
  :class:`poskernel_tl.kernels.launch_count.LaunchCount`);
- float32 on the GPU against float32 on the CPU: the largest |ΔR²| of Track A (pooled)
  and Track B (centered and raw) on one short run of the SmolLM2 shape.

``--paths tiled chunked`` also times the chunked path designed for a CPU on the GPU
(``POSKERNEL_KERNELS=0``): the numbers before the tiled kernels.

Runs on a bare CUDA machine without network where PyTorch (with Triton) and transformers
are preinstalled, from the source tree (``PYTHONPATH=. python scripts/bench_gpu.py``),
once these wheels are installed with ``pip install --no-deps``: transformer-lens,
beartype, typeguard, jaxtyping, wadler-lindig, einops, fancy-einsum, circuitsvis, plotly,
narwhals, datasets, dill, multiprocess, xxhash, importlib-metadata, zipp, lazy-importer,
gguf, better-abc (and transformers itself where the preinstalled one is older than the
project's pin).

Usage: python scripts/bench_gpu.py [--shapes smollm2-135m llama-3.2-1b] [--profile 4096]
       [--paths tiled chunked] [--quick]
"""

import argparse
import os
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.kernels.launch_count import LaunchCount  # noqa: E402
from poskernel_tl.measurement import measure as measure_module  # noqa: E402
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe  # noqa: E402
from poskernel_tl.models.registry import placeholder_spec  # noqa: E402

SHAPES = {  # LlamaConfig fields of each shape
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, max_position_embeddings=16384, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
                         tie_word_embeddings=True),
}
# (T, sequences) per shape: the table
RUNS = {"smollm2-135m": [(1024, 16), (4096, 4), (8192, 2), (16384, 2)],
        "llama-3.2-1b": [(256, 32), (1024, 32)]}


def placeholder_tokenizer():
    """The bridge wants a tokenizer; this benchmark feeds token ids, so a three-token one
    (saved and reloaded so that it has a name) does."""
    import tempfile

    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    folder = tempfile.mkdtemp()
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def build(shape: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """``shape``'s model with seeded random weights (the same on every device), booted."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval().to(device=device, dtype=dtype)
    hf.config.architectures = ["LlamaForCausalLM"]
    spec = describe(hf, placeholder_spec(f"{shape}-shaped", hub_id=None))
    tok = placeholder_tokenizer()
    bridge = boot_bridge(hf, tok, device=torch.device(device), dtype=dtype)
    return LoadedModel(bridge=bridge, tokenizer=tok, spec=spec, hf_model=hf)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def time_measure(model: LoadedModel, ids: torch.Tensor, device: str):
    """(result, seconds per sequence, peak GiB) of one default ``pk.measure``."""
    peak_reset(device)
    sync(device)
    t0 = time.perf_counter()
    res = pk.measure(model, ids, progress=False)
    sync(device)
    return res, (time.perf_counter() - t0) / len(ids), peak(device)


@torch.no_grad()
def time_hf(model: LoadedModel, ids: torch.Tensor, batch: int, device: str):
    """(seconds per sequence, peak GiB) of Hugging Face's sdpa ``model.model`` on ``ids``
    in batches of ``batch``, after a warm-up batch."""
    hf = model.hf_model
    before = hf.config._attn_implementation
    hf.config._attn_implementation = "sdpa"
    try:
        hf.model(ids[:batch].to(device))  # warm-up
        peak_reset(device)
        sync(device)
        t0 = time.perf_counter()
        for i in range(0, len(ids), batch):
            hf.model(ids[i:i + batch].to(device))
        sync(device)
        return (time.perf_counter() - t0) / len(ids), peak(device)
    finally:
        hf.config._attn_implementation = before


def launches_per_layer(model: LoadedModel, ids: torch.Tensor) -> tuple[float, int]:
    """(mean, max) kernels launched per layer and batch by every reducer of the
    evaluation pass together (the centering pass has none of them)."""
    per_call: dict[tuple[int, int], int] = {}
    real = measure_module.forward_pass
    calls = [0]

    def spied(model_, ids_, make_reducers, *args, **kwargs):
        def made():
            reds = make_reducers()
            for red in reds.values() if isinstance(reds, dict) else reds:
                def counted(batch, update=red.update):
                    with LaunchCount() as c:
                        update(batch)
                    key = (calls[0], batch.layer)
                    per_call[key] = per_call.get(key, 0) + c.total
                    if batch.layer == model.spec.n_layers - 1:
                        calls[0] += 1
                red.update = counted
            return reds
        return real(model_, ids_, made, *args, **kwargs)

    measure_module.forward_pass = spied
    try:
        pk.measure(model, ids, progress=False)
    finally:
        measure_module.forward_pass = real
    counts = list(per_call.values())
    return float(np.mean(counts)), int(max(counts))


def profile(model: LoadedModel, ids: torch.Tensor) -> dict[str, int]:
    """Kernel launches, device-to-device copies and host synchronisations of one
    measurement, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pk.measure(model, ids, progress=False)
        torch.cuda.synchronize()
    out = {"kernel launches": 0, "device copies": 0, "host syncs": 0}
    for e in prof.events():
        name = e.name
        if name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                    "cuLaunchKernelEx"):
            out["kernel launches"] += 1
        elif "Memcpy DtoD" in name:
            out["device copies"] += 1
        elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                      "cudaEventSynchronize"):
            out["host syncs"] += 1
    return out


def float32_cpu_gpu(device: str, T: int = 512, n: int = 4) -> dict[str, float]:
    """float32 on ``device`` against float32 on the CPU (the SmolLM2 shape): per float
    array of every part of the result, the largest |Δ| over its finite entries relative
    to the array's largest |value| (at least 1); R² fields absolute."""
    g = torch.Generator().manual_seed(2)
    ev, cen = (torch.randint(3, 49000, (n, T), generator=g) for _ in range(2))
    res = {where: pk.measure(build("smollm2-135m", torch.float32, where), ev, cen,
                             progress=False) for where in ("cpu", device)}
    out = {}
    for name, part in res["cpu"].parts.items():
        for field, value in vars(part).items():
            other = getattr(res[device].parts[name], field)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                ok = np.isfinite(value) & np.isfinite(other)
                if ok.any():
                    scale = 1.0 if "r2" in field else max(1.0, float(np.abs(value[ok]).max()))
                    out[f"{name}.{field}"] = float(np.abs(value[ok] - other[ok]).max()) / scale
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--paths", nargs="+", default=["tiled"], choices=["tiled", "chunked"])
    ap.add_argument("--profile", type=int, default=None, metavar="T",
                    help="profile one SmolLM2-shaped measurement at this length")
    ap.add_argument("--quick", action="store_true", help="one short length per shape")
    ap.add_argument("--runs", nargs="+", default=None, metavar="T:N",
                    help="lengths and sequence counts instead of the issue's table")
    ap.add_argument("--no-cpu-check", action="store_true")
    args = ap.parse_args()
    dev = args.device
    card = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"device: {card}; torch {torch.__version__}", flush=True)
    g = torch.Generator().manual_seed(1)
    for shape in args.shapes:
        model = build(shape, torch.bfloat16, dev)
        runs = RUNS[shape][:1] if args.quick else RUNS[shape]
        if args.runs:
            runs = [tuple(int(x) for x in r.split(":")) for r in args.runs]
        for T, n in runs:
            ids = torch.randint(3, SHAPES[shape]["vocab_size"] - 1, (n, T), generator=g)
            pk.measure(model, ids[:2, :min(T, 256)], progress=False)  # warm-up (compiles)
            for path in args.paths:
                os.environ["POSKERNEL_KERNELS"] = "1" if path == "tiled" else "0"
                res, sec, mem = time_measure(model, ids, dev)
                hf_sec, hf_mem = time_hf(model, ids, int(res.config["batch_size"]), dev)
                mean, most = launches_per_layer(model, ids[:min(n, 4)])
                print(f"{shape:13s} T={T:6d} n={n:3d} {path:7s} measure {sec:.4f} s/seq  "
                      f"HF sdpa {hf_sec:.4f} s/seq  ratio {sec / hf_sec:6.1f}x  "
                      f"peak {mem:.1f} / {hf_mem:.1f} GiB  launches per layer and batch "
                      f"{mean:.0f} (max {most})", flush=True)
        if args.profile and shape == "smollm2-135m" and dev == "cuda":
            ids = torch.randint(3, 49000, (4, args.profile), generator=g)
            for path in args.paths:
                os.environ["POSKERNEL_KERNELS"] = "1" if path == "tiled" else "0"
                print(f"profile {shape} T={args.profile} x4 {path}: {profile(model, ids)}",
                      flush=True)
        os.environ["POSKERNEL_KERNELS"] = "1"
        del model
        peak_reset(dev)
    if not args.no_cpu_check and dev != "cpu":
        diffs = float32_cpu_gpu(dev)
        worst = sorted(diffs.items(), key=lambda kv: -kv[1])[:8]
        print(f"float32 on the GPU against the CPU: {len(diffs)} arrays, the largest "
              f"relative |Δ|: " + ", ".join(f"{k} {v:.1e}" for k, v in worst), flush=True)


if __name__ == "__main__":
    main()

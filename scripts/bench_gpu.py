"""GPU benchmark: the measurement, and the forward it rides on, against an untouched
Hugging Face forward.

Shapes from configs, seeded random weights (nothing fetched): SmolLM2-135M's (30 layers,
9 / 3 heads, d_head 64), Llama-3.2-1B's (16 layers, 32 / 8 heads), or ``--tiny`` (2 layers,
hidden 64, 4 / 2 heads, d_head 16, vocab 300: a CPU smoke test). One set of weights (bf16 on
CUDA, as the project loads a bf16 checkpoint there; float32 on CPU) makes two models: the
baseline, ``AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")`` never booted,
patched or hooked (booting a bridge replaces attention modules in place); and the measured
model, a ``copy.deepcopy`` of it taken first, booted as ``load_model`` boots (eager config,
then ``set_attention(bridge, "sdpa")``: the fast path, masks described not built).

Per shape and length T (n sequences in batches of the size the measurement chose; every
timed region after a warm-up, between ``torch.cuda.synchronize()`` calls; the cheap
forwards the fastest of 3):

- ``baseline``: ``baseline.model(ids)`` under ``torch.no_grad()`` (its default call: no
  unembedding, a KV cache filled);
- ``measure``: ``pk.measure(model, ids)`` with its defaults (Track A, Track B, the null,
  the pattern statistics) and its ratios to the baseline;
- ``attention``: what each layer of the measured bridge ran in its last call during the
  measurement (:func:`~poskernel_tl.hooks.fast_attention.attention_paths`: sdpa, or why
  TransformerLens's eager code ran; "not run");
- ``capture``: the same forward and q/k capture with no statistics (``capture_qk(bridge,
  lambda c: None, stop=True, schemes=spec.layers)``, ``capture.forward`` per batch), with
  its ratios to the baseline (the target: within 1.3× in time and memory);
- ``kernel``: on one layer's q/k ([batch, T, heads, d_head], grouped keys, the model's
  dtype), one pass of Track A's tile kernel over the causal triangle
  (``kernels.lag_tile_sums(q, k, scale, NONE)``) against sdpa's forward
  (``is_causal=True, enable_gqa=True``, random v); on CPU only with ``TRITON_INTERPRET=1``;
- ``launches``: kernels launched and device→host reads per batch of the evaluation pass
  for every layer together, the forward's own subtracted
  (:func:`~poskernel_tl.measurement.launches.batch_cost`).

Peak memory is a model's weights plus the most allocated above what was allocated as the
timed region began (the other model is not counted); a CPU measures none, and no memory
ratio is printed there. No ratio is printed against a baseline whose memory grows like T²:
it also runs one batch at T/2, and when its activation memory (peak above the start) grows
from T/2 to T by more than 2^1.5 — nearer the ×4 of a forward holding [batch, heads, T, T]
scores than the ×2 of a flash or memory-efficient one — the row says so instead.
``--profile T``: ``torch.profiler``'s launches, device copies and host syncs of one
measurement; then float32 on the GPU against the CPU (``--no-cpu-check`` skips it);
``--paths tiled chunked`` also times the chunked CPU design on the GPU.

Runs from the source tree (``PYTHONPATH=. python scripts/bench_gpu.py``) on a bare CUDA
machine with PyTorch, Triton and transformers once these wheels are installed with ``pip
install --no-deps``: transformer-lens, beartype, typeguard, jaxtyping, wadler-lindig, einops,
fancy-einsum, circuitsvis, plotly, narwhals, datasets, dill, multiprocess, xxhash,
importlib-metadata, zipp, lazy-importer, gguf, better-abc (transformers too where older).

Usage: python scripts/bench_gpu.py [--shapes smollm2-135m llama-3.2-1b] [--profile 4096]
       [--paths tiled chunked] [--quick] [--runs T:N ...] [--tiny] [--device cpu]
"""

import argparse
import copy
import math
import os
import shlex
import sys
from importlib.metadata import version

import numpy as np
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gpu_timing import batches, grows_like_t2, time_baseline, timed, weights_bytes  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl import kernels  # noqa: E402
from poskernel_tl.hooks import capture_qk  # noqa: E402
from poskernel_tl.hooks import fast_attention as fa  # noqa: E402
from poskernel_tl.measurement.launches import batch_cost  # noqa: E402
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe  # noqa: E402
from poskernel_tl.models.registry import placeholder_spec  # noqa: E402
from poskernel_tl.models.softmax_terms import NONE  # noqa: E402

SHAPES = {  # LlamaConfig fields of each shape
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, max_position_embeddings=16384, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
                         tie_word_embeddings=True),
    "tiny": dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True),
}
# (T, sequences) per shape: the table
RUNS = {"smollm2-135m": [(1024, 16), (4096, 4), (8192, 2), (16384, 2)],
        "llama-3.2-1b": [(256, 32), (1024, 32)], "tiny": [(128, 4), (256, 4)]}
LAUNCHES = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}


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


def untouched(shape: str) -> torch.nn.Module:
    """``shape``'s Hugging Face model on sdpa, float32 on the CPU, seeded weights (the
    same on every device and every call)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPES[shape]),
                                          attn_implementation="sdpa").eval()
    hf.config.architectures = [type(hf).__name__]
    return hf


def booted(hf: torch.nn.Module, shape: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """``hf`` (consumed) booted as ``load_model`` boots a model: eager config, then the
    bridge switched to the project's default attention (``"sdpa"``)."""
    hf.set_attn_implementation("eager")
    hf = hf.to(device=device, dtype=dtype)
    spec = describe(hf, placeholder_spec(f"{shape}-shaped", hub_id=None))
    tok = placeholder_tokenizer()
    bridge = boot_bridge(hf, tok, device=torch.device(device), dtype=dtype)
    return LoadedModel(bridge=bridge, tokenizer=tok, spec=spec, hf_model=hf,
                       attention=fa.set_attention(bridge, "sdpa"))


def build(shape: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """``shape``'s measured model alone (scripts/check_gpu.py builds its model here)."""
    return booted(untouched(shape), shape, dtype, device)


@torch.no_grad()
def time_capture(model: LoadedModel, ids: torch.Tensor, batch: int, device: str):
    """(seconds per sequence, best of 3; peak GiB) of the measurement's forward and q/k
    capture with no statistics, after a warm-up batch."""
    with capture_qk(model.bridge, lambda c: None, stop=True,
                    schemes=model.spec.layers) as capture:
        capture.forward(ids[:batch].to(device))
        _, sec, mem, _ = timed(lambda: batches(ids, batch, device, capture.forward), device,
                               weights_bytes(model.hf_model), 3)
    return sec / len(ids), mem


def time_measure(model: LoadedModel, ids: torch.Tensor, device: str):
    """(result, seconds per sequence, peak GiB, each layer's attention path) of one
    default ``pk.measure``."""
    fa.clear_attention_paths(model.bridge)
    res, sec, mem, _ = timed(lambda: pk.measure(model, ids, progress=False), device,
                             weights_bytes(model.hf_model))
    return res, sec / len(ids), mem, fa.attention_paths(model.bridge)


def paths_text(paths: list[str | None]) -> str:
    """Runs of layers with the same path: ``layers 0–29 sdpa``; ``layer 3 eager (why)``."""
    runs: list[list] = []
    for layer, path in enumerate(paths):
        if runs and runs[-1][2] == path:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer, path])
    name = {"sdpa": "sdpa", None: "not run"}
    return "; ".join((f"layer {a}" if a == b else f"layers {a}–{b}") + " "
                     + name.get(p, f"TransformerLens eager ({p})") for a, b, p in runs)


def kernel_line(model: LoadedModel, batch: int, T: int, device: str) -> str:
    """One pass of Track A's tile kernel against sdpa's forward on one layer's q/k of this
    model's shape (each the fastest of 3 calls after a warm-up; one on CPU, which needs
    ``TRITON_INTERPRET=1``)."""
    spec, g = model.spec, torch.Generator(device=device).manual_seed(3)
    what = (f"one layer's q/k [{batch}, {T}, {spec.n_heads}, {spec.d_head}] "
            f"{str(model.dtype).removeprefix('torch.')}")
    if device != "cuda" and not kernels.interpreting():
        return f"skipped on CPU (set TRITON_INTERPRET=1 for Triton's interpreter): {what}"
    q = torch.randn(batch, T, spec.n_heads, spec.d_head, generator=g, device=device,
                    dtype=model.dtype)
    k, v = (torch.randn(batch, T, spec.n_kv_heads, spec.d_head, generator=g,
                        device=device, dtype=model.dtype) for _ in range(2))
    scale = spec.d_head ** -0.5
    calls = {"lag_tile_sums": lambda: kernels.lag_tile_sums(q, k, scale, NONE),
             "sdpa forward": lambda: F.scaled_dot_product_attention(
                 q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                 scale=scale, enable_gqa=True)}
    sec = {}
    for name, fn in calls.items():
        fn()  # warm-up (compiles)
        sec[name] = timed(fn, device, 0, 3 if device == "cuda" else 1)[1]
    return (f"{what}: lag_tile_sums {sec['lag_tile_sums']:.5f} s, sdpa forward "
            f"{sec['sdpa forward']:.5f} s ({sec['lag_tile_sums'] / sec['sdpa forward']:.1f}×)")


def gib(x: float) -> str:
    return "n/a (CPU)" if math.isnan(x) else f"{x:.2f} GiB"


def ratios(sec: float, mem: float, base: dict) -> str:
    """Time and memory against the baseline; none where its memory grows like T²."""
    if grows_like_t2(base):
        return "no ratio (the baseline's memory grows like T²)"
    memory = "" if math.isnan(mem) else f", {mem / base['peak']:.2f}× memory"
    return f"ratio {sec / base['sec']:.2f}× time{memory}"


def baseline_lines(base: dict) -> str:
    t2 = grows_like_t2(base)
    growth = "" if t2 is None else \
        f", activation ×{base['act'] / base['half']:.2f} from T/2 to T"
    text = (f"  baseline   HF sdpa, never booted (baseline.model), batch {base['batch']}: "
            f"{base['sec']:.4f} s/seq, peak {gib(base['peak'])}{growth}")
    if t2:
        text += ("\n  baseline   its memory grows like T²: not a flash or memory-efficient "
                 "forward; no ratio to it")
    return text


def row(model: LoadedModel, baseline, shape: str, T: int, n: int, args, g) -> None:
    """Every line of one (shape, T, n) row."""
    dev = args.device
    ids = torch.randint(3, SHAPES[shape]["vocab_size"] - 1, (n, T), generator=g)
    pk.measure(model, ids[:2, :min(T, 256)], progress=False)  # warm-up (compiles)
    print(f"{shape} T={T} n={n}")
    base = None
    for path in args.paths:
        os.environ["POSKERNEL_KERNELS"] = "1" if path == "tiled" else "0"
        res, sec, mem, paths = time_measure(model, ids, dev)
        batch = int(res.config["batch_size"])
        if base is None:
            base = time_baseline(baseline, ids, batch, dev)
            print(baseline_lines(base))
        label = path if dev == "cuda" else "the CPU's path"
        print(f"  measure    {label}: {sec:.4f} s/seq, peak {gib(mem)}; "
              f"{ratios(sec, mem, base)}")
        print(f"  attention  {paths_text(paths)}")
    os.environ["POSKERNEL_KERNELS"] = "1"
    sec, mem = time_capture(model, ids, batch, dev)
    print(f"  capture    forward and q/k capture alone: {sec:.4f} s/seq, peak {gib(mem)}; "
          f"{ratios(sec, mem, base)} (target: within 1.3×)")
    print(f"  kernel     {kernel_line(model, batch, T, dev)}")
    print(f"  {launch_line(model, dev)}")
    if dev != "cuda":
        print("  (no peak memory on CPU: no memory ratio, no check that the baseline's memory "
              "grows like T)")


def launch_line(model: LoadedModel, device: str) -> str:
    """Kernels launched and device→host reads per batch of the evaluation pass for the
    whole model, the forward's own subtracted (:func:`~poskernel_tl.measurement.launches.
    batch_cost` at T = 256, batches of 2: the counts do not depend on T)."""
    if device != "cuda" and not kernels.interpreting():
        return "launches: counted on the kernels' path only (a GPU, or TRITON_INTERPRET=1)"
    cost = batch_cost(model, 256, forced=device != "cuda")
    return (f"launches per batch (every layer together, T = 256, 2 sequences): "
            f"{cost.launches:.0f}, device→host reads {cost.syncs:.0f}; the forward's own: "
            f"{cost.forward_launches:.0f} launches, {cost.forward_syncs:.0f} reads")


def profile(model: LoadedModel, ids: torch.Tensor) -> dict[str, int]:
    """Kernel launches, device-to-device copies and host synchronisations of one
    measurement, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pk.measure(model, ids, progress=False)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return {"kernel launches": sum(n in LAUNCHES for n in names),
            "device copies": sum("Memcpy DtoD" in n for n in names),
            "host syncs": sum(n in SYNCS for n in names)}


def float32_cpu_gpu(device: str, shape: str, T: int = 512, n: int = 4) -> dict[str, float]:
    """float32 on ``device`` against float32 on the CPU (``shape``): per float array of
    every part of the result, the largest |Δ| over its finite entries relative to the
    array's largest |value| (at least 1); R² fields absolute."""
    g = torch.Generator().manual_seed(2)
    ev, cen = (torch.randint(3, SHAPES[shape]["vocab_size"] - 1, (n, T), generator=g)
               for _ in range(2))
    res = {where: pk.measure(build(shape, torch.float32, where), ev, cen, progress=False)
           for where in ("cpu", device)}
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


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m", "llama-3.2-1b"],
                    choices=list(SHAPES))
    ap.add_argument("--tiny", action="store_true",
                    help="only the tiny shape (a CPU smoke test: --device cpu)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--paths", nargs="+", default=["tiled"], choices=["tiled", "chunked"])
    ap.add_argument("--profile", type=int, default=None, metavar="T",
                    help="profile one measurement of the first shape at this length")
    ap.add_argument("--quick", action="store_true", help="one short length per shape")
    ap.add_argument("--runs", nargs="+", default=None, metavar="T:N",
                    help="lengths and sequence counts instead of the issue's table")
    ap.add_argument("--no-cpu-check", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        args.shapes = ["tiny"]
    return args


def main() -> None:
    args = arguments()
    sys.stdout.reconfigure(line_buffering=True)
    dev = args.device
    card = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"device: {card}; torch {torch.__version__}; transformers {version('transformers')}; "
          f"transformer-lens {version('transformer-lens')}")
    print("command: " + " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator().manual_seed(1)
    for shape in args.shapes:
        hf = untouched(shape)
        baseline = copy.deepcopy(hf).to(device=dev, dtype=dtype)  # before any boot
        model = booted(hf, shape, dtype, dev)
        runs = RUNS[shape][:1] if args.quick else RUNS[shape]
        if args.runs:
            runs = [tuple(int(x) for x in r.split(":")) for r in args.runs]
        for T, n in runs:
            row(model, baseline, shape, T, n, args, g)
        if args.profile and shape == args.shapes[0] and dev == "cuda":
            ids = torch.randint(3, SHAPES[shape]["vocab_size"] - 1, (4, args.profile),
                                generator=g)
            for path in args.paths:
                os.environ["POSKERNEL_KERNELS"] = "1" if path == "tiled" else "0"
                print(f"profile {shape} T={args.profile} x4 {path}: {profile(model, ids)}")
            os.environ["POSKERNEL_KERNELS"] = "1"
        del model, baseline
        if dev == "cuda":
            torch.cuda.empty_cache()
    if not args.no_cpu_check and dev != "cpu":
        diffs = float32_cpu_gpu(dev, "tiny" if args.tiny else "smollm2-135m")
        worst = sorted(diffs.items(), key=lambda kv: -kv[1])[:8]
        print(f"float32 on the GPU against the CPU: {len(diffs)} arrays, the largest "
              f"relative |Δ|: " + ", ".join(f"{k} {v:.1e}" for k, v in worst))


if __name__ == "__main__":
    main()

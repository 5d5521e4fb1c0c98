"""Memory: the batch size, and a plan that fits a measurement into a memory budget.

:func:`plan_measure` estimates, before anything runs, the peak memory of each phase of
:func:`poskernel_tl.measurement.measure.measure` besides the loaded model — the centering pass, the
evaluation pass(es) and the final fits — from the tensors each phase holds:

- what grows with the batch (:func:`per_sequence_bytes`): the forward's activations, the
  T×T score tensors where they are formed at all (TransformerLens's eager attention, the
  ``hook``/``qk`` score paths; not the sdpa path with Track A from lag sums, which needs
  O(T·d_head) per head), and Track A's float64 work on q/k — on the kernels' path for
  every layer of a group at once, whose q and k are held until its last layer
  (:func:`group_extra_bytes`; the plan takes the largest group that fits, :func:`group_size`);
- what does not: the centering means, Track A's per-sequence lag sums, the optional
  reducers, and Track B (:mod:`poskernel_tl.reducers.gram_cost`): its accumulator, ≈ T²/2
  float32 per head and layer in blocks of query rows (on a layer with a sliding window, only
  its band, ≈ T·w), or T² where the full matrices are kept, or the evaluation sequences'
  q/k factors, chosen per kind of layer (global, or its window) as the plan estimates
  fastest (:func:`~poskernel_tl.reducers.gram_cost.track_b_seconds`) among those that fit.

A bidirectional model (``model.spec.causal`` false) fits both triangles: Track B's
accumulator holds every key (T² per head), its fit carries the upper triangle's pieces
too, and Track A keeps the upper triangle's per-sequence sums and computes them with a
second set of lag-sum buffers; every estimate below counts that.

The budget is ``--max-memory`` (default: :data:`AUTO_FRACTION` of the memory available
now). Track B takes its faster path where it fits, else the other; when neither fits
for every layer next to the rest, the plan splits the layers into blocks, one evaluation
pass each, the forward stopped after the block's last layer (a pass costs a forward, more
than either path saves); what does not fit even one layer at a time is refused
(:class:`~poskernel_tl.errors.PlanError`, naming the flag). The estimate errs high on
purpose; on a GPU an out-of-memory error still halves the batch and restarts the pass.
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from poskernel_tl.errors import PlanError
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.plan.forward_cost import (  # noqa: F401 (SCORE_COPIES, mask_kinds: re-exported)
    SCORE_COPIES,
    attention_bytes,
    describe,
    mask_kinds,
)
from poskernel_tl.plan.groups import group_bytes, grouping, kind
from poskernel_tl.progress import tqdm
from poskernel_tl.reducers import track_a
from poskernel_tl.reducers.gram_cost import (
    Path,
    as_path,
    gram_block_bytes,
    gram_factors,
    gram_fit_bytes,
    layer_lags,
    track_b_paths,
)
from poskernel_tl.reducers.moments import means_bytes
from poskernel_tl.sizes import check_batch_size, gib, parse_memory
from poskernel_tl.statistics.registry import STATISTICS

# the caps: on CPU larger batches only raise peak memory (the matmuls already use every
# core at batch 4); on a GPU beyond 64 sequences the forward is long saturated
CAP = {"cpu": 4, "cuda": 64}
# on CPU, long sequences also lose to cache misses: SmolLM2's evaluation pass at T = 4096
# costs 37.4 CPU s per sequence in batches of 1 or 2 and 44.9 s in batches of 4
CPU_TOKENS = 8192  # tokens per batch at most on CPU (never below one sequence)
BUDGET = 0.5  # of the free memory, for resolve_batch_size (analyses)
AUTO_FRACTION = 0.8  # --max-memory auto: this share of the memory available now
MARGIN, SLACK = 1.1, 256 << 20  # estimate × MARGIN + SLACK: allocator and temporaries


def free_memory(device: torch.device) -> int:
    """Bytes free for new tensors on ``device``: the CUDA allocator's view of the GPU, or
    the kernel's MemAvailable for CPU memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device) -
                               torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def per_sequence_bytes(model: LoadedModel, length: int, materialised: bool | None = None
                       ) -> int:
    """Estimated peak bytes one more sequence in the batch costs. ``materialised``: T×T
    scores are formed (default: unless the bridge runs the sdpa attention path); the
    forward's attention per kind of layer (a window's band on the sdpa path) and Hugging
    Face's masks: :mod:`poskernel_tl.plan.forward_cost`."""
    cfg, s, T = model.bridge.cfg, model.spec, length
    d_model = int(getattr(cfg, "d_model", 0) or s.n_heads * s.d_head)
    d_mlp = int(getattr(cfg, "d_mlp", 0) or 4 * d_model)
    activations = T * (8 * d_model + 3 * d_mlp) * 4
    return attention_bytes(model, T, materialised) + activations + track_a.work_bytes(model, T)


def fixed_bytes(model: LoadedModel, length: int, n_seqs: int, full: bool = False) -> int:
    """Reducer state that does not grow with the batch: Track A's per-sequence sums of
    ``n_seqs`` sequences and Track B for every layer."""
    s, T = model.spec, length
    path = gram_factors(model, T, n_seqs, full)
    return track_a.state_bytes(model, T, n_seqs) + \
        gram_block_bytes(model, T, full, n_seqs, path, range(s.n_layers))


@dataclass(frozen=True)
class Workload:
    """What a measurement holds besides the model: the inputs of :func:`plan_measure`."""

    length: int
    n_eval: int
    n_centering: int
    materialised: bool = False  # T×T scores formed in the forward or by Track A
    keep_gram: bool = False  # Track B keeps every key, to return the full matrices
    n_logits: int = 0  # evaluation sequences whose full logits are kept
    whiten: bool = False
    null_draws: int = 0


def group_extra_bytes(model: LoadedModel, length: int, group: int) -> int:
    """What one sequence of a batch costs more where ``group`` layers are handed to the
    reducers together (:mod:`poskernel_tl.plan.groups`): their q and k held and joined, and
    the statistics' transient work on every layer of the group at once."""
    if group <= 1:
        return 0
    return group_bytes(model, length, group) + (group - 1) * track_a.work_bytes(model, length)


def phase_bytes(model: LoadedModel, w: Workload, batch: int, block_layers: int,
                factors: Path | bool = False, group: int = 1) -> dict[str, int]:
    """Estimated bytes held in each phase of a measurement with Track B accumulated for
    at most ``block_layers`` consecutive layers at a time (the costliest such block;
    ``factors``: per layer or for all, kept as the sequences' factors) and the statistics
    of ``group`` layers formed together."""
    s, T = model.spec, w.length
    # M: one set of float32 means (Track B's reference where there is no centering set);
    # cen: the centering means and the random half's (float64 sums, 2·cen, in their pass)
    M = means_bytes(model, T)
    cen = 2 * M if w.n_centering else 0
    U = track_a.state_bytes(model, T, w.n_eval)
    per = batch * (per_sequence_bytes(model, T, w.materialised) +
                   group_extra_bytes(model, T, group))
    extra = sum(stat.state_bytes(model, w) for stat in STATISTICS.values())
    kept = 2 * s.n_layers * s.n_heads * T * T * 4 if w.keep_gram else 0
    path = as_path(factors, s.n_layers)
    gram = max(gram_block_bytes(model, T, w.keep_gram, w.n_eval, path, range(l0, l0 + size))
               for size in [min(block_layers, s.n_layers)]
               for l0 in range(s.n_layers - size + 1))
    fit = max(gram_fit_bytes(model, T, w.n_eval, f, m is not None)
              for f, m in set(zip(path, layer_lags(model, T)))) + kept // s.n_layers
    held = cen + U + extra + M  # besides Track B, in pass 2
    return {"centering pass": 2 * cen + per, "evaluation pass": held + gram + per,
            "Track B fit": held + gram + fit + kept,
            "Track A fit": cen + track_a.RESULT_COPIES * U + extra + M + kept}


def estimate_peak(model: LoadedModel, w: Workload, batch: int, block_layers: int,
                  factors: Path | bool = False, group: int = 1) -> int:
    """The largest phase of :func:`phase_bytes`, with the margin for the allocator."""
    phases = phase_bytes(model, w, batch, block_layers, factors, group)
    return int(max(phases.values()) * MARGIN + SLACK)


def layer_blocks(n_layers: int, n_blocks: int) -> tuple[tuple[int, int], ...]:
    """``n_blocks`` consecutive blocks [l0, l1) of nearly equal size covering the layers."""
    cuts = [round(i * n_layers / n_blocks) for i in range(n_blocks + 1)]
    return tuple(zip(cuts[:-1], cuts[1:]))


@dataclass(frozen=True)
class Plan:
    """How a measurement runs: sequences per forward and Track B's blocks of layers (one
    evaluation pass each; the last block rides along with the pass that feeds every
    other reducer, the others run a forward stopped after their last layer)."""

    batch_size: int
    layer_blocks: tuple[tuple[int, int], ...]
    budget: int
    peak: int
    flag: str = "auto"  # --max-memory as given
    factors: Path = ()  # per layer, Track B kept as the evaluation sequences' q̃, k̃
    why: str = ""  # why Track B takes this path (the provenance's "track_b")
    forward: str = ""  # what the forward's attention computes per kind of layer
    group_layers: int = 1  # layers handed to the reducers together, at most

    @property
    def blocked(self) -> bool:
        return len(self.layer_blocks) > 1

    @property
    def extra_forwards(self) -> float:
        """Forwards of the evaluation sequences the blocks add (a pass up to layer l
        of L costs about l/L of one)."""
        n_layers = self.layer_blocks[-1][1]
        return sum(l1 for _, l1 in self.layer_blocks[:-1]) / n_layers

    def note(self) -> str | None:
        """One line saying how Track B is split and what it costs (None: not split)."""
        if not self.blocked:
            return None
        spans = ", ".join(f"{a}–{b - 1}" if b - a > 1 else f"{a}" for a, b in self.layer_blocks)
        stops = ", ".join(str(b - 1) for _, b in self.layer_blocks[:-1])
        more = len(self.layer_blocks) - 1
        return (f"Track B in {len(self.layer_blocks)} blocks of layers ({spans}) to fit "
                f"--max-memory {self.flag} ({gib(self.budget)}; estimated peak "
                f"{gib(self.peak)}): {more} more evaluation pass{'es' if more > 1 else ''} "
                f"stopped after layer{'s' if more > 1 else ''} {stops}, ≈ "
                f"{self.extra_forwards:.2f} forwards of the evaluation sequences more")


def plan_measure(model: LoadedModel, w: Workload, batch_size: int | str = "auto",
                 max_memory: str | int | float = "auto") -> Plan:
    """The plan that fits ``w`` into ``max_memory`` (auto: :data:`AUTO_FRACTION` of the
    memory available now): Track B in as few blocks of layers as fit (each costs part of
    a forward), then the largest batch (``"auto"``) up to the device's cap. Raises
    :class:`PlanError` naming the flag when it fits not even one layer at a time."""
    batch_size = check_batch_size(batch_size)
    limit = parse_memory(max_memory)
    budget = int(AUTO_FRACTION * free_memory(model.device)) if limit is None else limit
    L = model.spec.n_layers
    cap = min(device_cap(model.device, w.length), max(1, w.n_eval, w.n_centering))
    batches = range(cap, 0, -1) if batch_size == "auto" else [batch_size]
    paths = track_b_paths(model, w.length, w.n_eval, w.keep_gram)
    for n_blocks in range(1, L + 1):
        size = math.ceil(L / n_blocks)
        if n_blocks > 1 and math.ceil(L / (n_blocks - 1)) == size:
            continue  # no smaller blocks than with one block fewer
        for path in paths:
            for b in batches:
                peak = estimate_peak(model, w, b, size, path)
                if peak <= budget:
                    why = path_reason(paths, path, n_blocks, budget,
                                      lambda p: path_name(model, w.length, p))
                    group, peak = group_size(model, w, b, size, path, budget, peak)
                    return Plan(b, layer_blocks(L, n_blocks), budget, peak, str(max_memory),
                                path, why, describe(model, w.length, not w.materialised),
                                group)
    raise refusal(model, w, batches[-1] if batch_size == "auto" else batch_size, budget,
                  limit is None)


def group_size(model: LoadedModel, w: Workload, batch: int, block_layers: int,
               path: Path, budget: int, peak: int) -> tuple[int, int]:
    """The most layers handed to the reducers together that fit ``budget`` beside the rest
    (all of a kind's, halved until they fit; 1 where no layers are grouped), and the peak
    estimated with them."""
    geometry = Geometry.of(model.spec, w.length)
    if not grouping(model, geometry):
        return 1, peak
    kinds: dict = {}
    for L in range(model.spec.n_layers):
        kinds.setdefault(kind(model, geometry, L), []).append(L)
    group = max(len(v) for k, v in kinds.items() if k is not None) if \
        any(k is not None for k in kinds) else 1
    while group > 1:
        grouped = estimate_peak(model, w, batch, block_layers, path, group)
        if grouped <= budget:
            return group, grouped
        group = (group + 1) // 2
    return 1, peak


def path_name(model: LoadedModel, length: int, path: Path) -> str:
    """Track B's path in words: one for every layer, or per kind of layer (its window)."""
    name = {True: "the sequences' q/k factors", False: "the [T, T] accumulator"}
    lags = layer_lags(model, length)
    kinds = {m: {f for f, lag in zip(path, lags) if lag == m} for m in lags}
    if len(set(path)) == 1 and None in kinds and len(kinds) == 1:
        return name[path[0]]
    what = lambda f, m: name[f] if m is None or f else f"the accumulator on the band Δ ≤ {m}"
    return "; ".join(f"{'global layers' if m is None else f'layers with a {m + 1}-token window'}"
                     f": {what(next(iter(fs)), m)}" for m, fs in kinds.items())


def path_reason(seconds: dict[Path, float], path: Path, n_blocks: int, budget: int,
                name: Callable[[Path], str]) -> str:
    """One line: Track B's path and why the plan took it (``seconds``: every path it may
    take, fastest first)."""
    est = f"≈ {seconds[path]:.0f} CPU s estimated"
    if len(seconds) == 1:
        return f"{name(path)} ({est}; factors never for kept matrices)"
    faster = next(iter(seconds))
    if path == faster:
        other = list(seconds)[1]
        if seconds[other] == seconds[path]:  # factors forming the blocks: as dear
            return f"{name(path)} ({est}; as fast as {name(other)}, with a smaller state)"
        return f"{name(path)}: {est}, against {seconds[other]:.0f} s for {name(other)}"
    return f"{name(path)} ({est}): {name(faster)} ({seconds[faster]:.0f} s) " \
           f"does not fit {gib(budget)} in {n_blocks} pass{'es' if n_blocks > 1 else ''}"


def refusal(model: LoadedModel, w: Workload, batch: int, budget: int, auto: bool
            ) -> PlanError:
    """The one-line error of a run that fits not even one layer of Track B at a time."""
    paths = track_b_paths(model, w.length, w.n_eval, w.keep_gram)
    need = min(estimate_peak(model, w, batch, 1, p) for p in paths)
    what = (f"T={w.length}, {w.n_eval} evaluation and {w.n_centering} centering sequences, "
            f"batch {batch}; forward: {describe(model, w.length, not w.materialised)}")
    if batch > 1 and min(estimate_peak(model, w, 1, 1, p) for p in paths) <= budget:
        return PlanError(f"--batch-size {batch}: needs ≈ {gib(need)} ({what}) with Track B "
                         f"one layer per pass, over the budget of {gib(budget)}; lower "
                         "--batch-size or raise --max-memory")
    where = (f"{int(AUTO_FRACTION * 100)}% of the memory available now" if auto
             else "as given")
    return PlanError(f"--max-memory: this run needs ≈ {gib(need)} ({what}) even with Track B "
                     f"one layer per pass, over the budget of {gib(budget)} ({where}); raise "
                     "--max-memory or lower --length/--n-seqs")


def auto_batch_size(model: LoadedModel, length: int, n_seqs: int,
                    free: int | None = None) -> int:
    """The batch size ``"auto"`` stands for in the analyses, between 1 and the device's
    cap (and never more than ``n_seqs``): what fits in half the free memory with T×T
    scores formed. ``free``: bytes available (default: measured now)."""
    device = model.device
    free = free_memory(device) if free is None else free
    spare = BUDGET * free - fixed_bytes(model, length, n_seqs)
    fits = int(spare // per_sequence_bytes(model, length, materialised=True))
    return max(1, min(fits, device_cap(device, length), max(1, n_seqs)))


def device_cap(device: torch.device, length: int) -> int:
    """The largest batch ``"auto"`` picks on ``device`` for sequences of ``length``
    (:data:`CAP`; on CPU also at most :data:`CPU_TOKENS` tokens per batch)."""
    cap = CAP.get(device.type, 4)
    return max(1, min(cap, CPU_TOKENS // length)) if device.type == "cpu" else cap


def resolve_batch_size(batch_size: int | str, model: LoadedModel, length: int,
                       n_seqs: int) -> int:
    """An int as given (it must be ≥ 1), or ``"auto"`` through :func:`auto_batch_size`."""
    batch_size = check_batch_size(batch_size)
    if batch_size == "auto":
        return auto_batch_size(model, length, n_seqs)
    return batch_size


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def batched(ids: torch.Tensor, batch_size: int, device: torch.device | str, desc: str,
            progress: bool, run: Callable[[tuple[int, ...], torch.Tensor], None],
            restart: Callable[[], None] | None = None) -> int:
    """The one loop over sequences: ``run(rows, tokens)`` for each batch of ``batch_size``
    rows of ``ids`` (``tokens`` on ``device``), without gradients, with a progress bar.
    On out-of-memory, with ``restart`` (which resets whatever ``run`` accumulated), the
    pass starts again with half the batch size; without it the error is raised. Returns
    the batch size that went through."""
    ids = ids.to(device)  # once, before the first batch: no upload per batch
    while True:
        try:
            with torch.no_grad():
                for start in tqdm(range(0, len(ids), batch_size), desc=desc, unit="batch",
                                  disable=not progress):
                    rows = tuple(range(start, min(len(ids), start + batch_size)))
                    run(rows, ids[start:start + len(rows)])
            return batch_size
        except (RuntimeError, torch.OutOfMemoryError) as err:
            if restart is None or not is_out_of_memory(err) or batch_size == 1:
                raise
            batch_size //= 2
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
            print(f"out of memory: retrying {desc} with --batch-size {batch_size}")
            restart()


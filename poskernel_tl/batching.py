"""``batch_size="auto"``: as many sequences per forward as fit in the free memory.

The estimate counts what grows with the batch: per layer, a few [head, T, T] float32
score tensors (the hooked scores, the softmax, Hugging Face's eager attention weights and
our own q·kᵀ buffer and masks) and the MLP and residual activations; and what does not:
the Track B Gram accumulator ([layer, head, T, T] float32) and Track A's per-sequence
lag sums. Half the free memory is budgeted (allocator fragmentation, the hooks' copies).
The estimate errs high on purpose; a wrong guess costs one retry, since
:func:`poskernel_tl.measure.forward_pass` halves the batch on out-of-memory and restarts.
"""

import os

import torch

from poskernel_tl.errors import UserError
from poskernel_tl.loading import LoadedModel

# [head, T, T] float32 tensors alive at once per sequence during one layer's attention
SCORE_COPIES = 8
# the caps: on CPU larger batches only raise peak memory (the matmuls already use every
# core at batch 4); on a GPU beyond 64 sequences the forward is long saturated
CAP = {"cpu": 4, "cuda": 64}
BUDGET = 0.5


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


def per_sequence_bytes(model: LoadedModel, length: int) -> int:
    """Estimated peak bytes one more sequence in the batch costs."""
    cfg = model.bridge.cfg
    heads, T = model.spec.n_heads, length
    d_model = int(getattr(cfg, "d_model", 0) or model.spec.n_heads * model.spec.d_head)
    d_mlp = int(getattr(cfg, "d_mlp", 0) or 4 * d_model)
    scores = SCORE_COPIES * heads * T * T * 4
    activations = T * (8 * d_model + 3 * d_mlp) * 4
    return scores + activations


def fixed_bytes(model: LoadedModel, length: int, n_seqs: int) -> int:
    """Reducer state that does not grow with the batch."""
    s, T = model.spec, length
    gram = s.n_layers * s.n_heads * T * T * 4
    track_a = 3 * n_seqs * s.n_layers * s.n_heads * T * 8
    return gram + track_a


def auto_batch_size(model: LoadedModel, length: int, n_seqs: int,
                    free: int | None = None) -> int:
    """The batch size ``"auto"`` stands for, between 1 and the device's cap (and never
    more than ``n_seqs``). ``free``: bytes available (default: measured now)."""
    device = model.device
    free = free_memory(device) if free is None else free
    spare = BUDGET * free - fixed_bytes(model, length, n_seqs)
    fits = int(spare // per_sequence_bytes(model, length))
    return max(1, min(fits, CAP.get(device.type, 4), max(1, n_seqs)))


def check_batch_size(batch_size: int | str) -> int | str:
    """``"auto"``, or the batch size as a positive int (a ValueError naming the flag
    otherwise): the check that needs no model."""
    if batch_size == "auto":
        return batch_size
    if isinstance(batch_size, str):
        try:
            batch_size = int(batch_size)
        except ValueError:
            raise UserError(f"--batch-size {batch_size}: a positive integer or auto"
                             ) from None
    if batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: must be >= 1 (or auto)")
    return int(batch_size)


def resolve_batch_size(batch_size: int | str, model: LoadedModel, length: int,
                       n_seqs: int) -> int:
    """An int as given (it must be ≥ 1), or ``"auto"`` through :func:`auto_batch_size`."""
    batch_size = check_batch_size(batch_size)
    if batch_size == "auto":
        return auto_batch_size(model, length, n_seqs)
    return batch_size

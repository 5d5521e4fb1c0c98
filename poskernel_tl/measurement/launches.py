"""What one batch of ``pk.measure``'s evaluation pass asks of the device beyond the model's
own forward: kernels launched and device→host reads, for the whole model
(:mod:`poskernel_tl.kernels.launch_count`).

Counted as a difference: a measurement of ``long`` evaluation batches less one of
``short`` (the centering set the same), divided by ``long − short``, so that what a run
pays once (building the reducers, the fits at the end) cancels; the model's forward through
the capture alone (no reducer) is counted the same way and subtracted. On the kernels' path
(a GPU, or Triton's interpreter under :func:`poskernel_tl.kernels.forced`) this is the
per-batch cost of the statistics that the launch budget bounds
(docs/explanation/performance.md, "On a GPU").
"""

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch

from poskernel_tl import kernels
from poskernel_tl.hooks import capture_qk
from poskernel_tl.kernels.launch_count import pass_counts
from poskernel_tl.measurement.measure import measure
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.plan.batching import batched


@dataclass
class BatchCost:
    """Per batch of the evaluation pass: ``launches`` and ``syncs`` of the statistics (the
    forward's own subtracted), the forward's own ``forward_launches`` and
    ``forward_syncs``, and the statistics' counts by operator."""

    launches: float
    syncs: float
    forward_launches: float
    forward_syncs: float
    by_name: Counter = field(default_factory=Counter)
    syncs_by_name: Counter = field(default_factory=Counter)


def batch_cost(model: LoadedModel, length: int, batch_size: int = 2, short: int = 2,
               long: int = 4, forced: bool = True, seed: int = 0, **options) -> BatchCost:
    """:class:`BatchCost` of ``pk.measure(model, …, batch_size=batch_size, **options)`` on
    random tokens of ``length`` (4 centering sequences), from runs of ``short`` and
    ``long`` evaluation batches; ``forced``: on the kernels' path (needs
    ``TRITON_INTERPRET=1`` on a CPU)."""
    vocab = int(getattr(model.hf_model.config, "vocab_size", 300))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab - 1, (4 + long * batch_size, length), generator=g)
    path = kernels.forced() if forced else contextlib.nullcontext()

    def run(n: int) -> None:
        measure(model, ids[4:4 + n * batch_size], ids[:4], progress=False,
                batch_size=batch_size, **options)

    def bare(n: int) -> None:
        with capture_qk(model.bridge, lambda c: None, stop=True,
                        schemes=model.spec.layers) as capture:
            batched(ids[:n * batch_size], batch_size, model.device, "forward", False,
                    lambda rows, tokens: capture.forward(tokens))

    with path:
        run(short)  # warm the per-process caches (compiled kernels, term tables)
        total, syncs, by_name, sync_names = pass_counts(run, short, long)
        f_total, f_syncs, f_names, f_sync_names = pass_counts(bare, short, long)
    by_name.subtract(f_names)
    sync_names.subtract(f_sync_names)
    return BatchCost(total - f_total, syncs - f_syncs, f_total, f_syncs, +by_name,
                     +sync_names)


__all__ = ["BatchCost", "batch_cost"]

"""Counting what a piece of code asks of the device, on any device: the kernels it launches
and the times it makes the host wait for the device.

:class:`LaunchCount` counts every PyTorch operator that runs a kernel (views, aliases and
uninitialised allocations run none) and every Triton launch of
:func:`poskernel_tl.kernels.launch` (whose own work, under Triton's interpreter, is not
counted as PyTorch operators). :class:`SyncCount` counts every device→host read — what
makes a GPU's host thread wait for the queue to drain: a scalar read (``.item()``, a
Python ``bool``/``int``/``float`` of a tensor), an operator whose output size depends on
the data (``nonzero``, a boolean index, ``masked_select``, ``unique``, ``repeat_interleave``
without its output size), ``.cpu()``, ``.numpy()``, ``.tolist()``, a ``.to()``/``.cuda()``
naming a device, and a tensor made from host data (``torch.tensor(list, device=…)``, an
upload). On a CPU none of these waits, but each would on a GPU: counted on the CPU they
say what a GPU run would pay. :func:`pass_counts` reads both per batch of a pass.
"""

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from poskernel_tl.kernels import dispatch as kernels

# operators that run no kernel: uninitialised allocations, a view made without an alias
# annotation, a scalar read (counted as a read: SyncCount)
NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
             "_unsafe_view", "lift_fresh", "_local_scalar_dense", "set_", "resize_"}
# operators that read the device from the host: a scalar, or an output sized by the data
READS = {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "_unique",
         "_unique2", "unique_consecutive", "unique_dim", "lift_fresh", "lift_fresh_copy",
         "equal", "is_nonzero", "allclose"}
# Tensor methods that read a tensor into the host (not all reach the dispatcher on a CPU)
READ_METHODS = ("cpu", "numpy", "tolist", "cuda")


def launches(func) -> bool:
    """Whether the operator ``func`` runs a kernel: not a view or alias of an input (an
    output aliasing an input without writing it), nor an uninitialised allocation."""
    name = func._schema.name.split("::")[-1]
    if name in NO_KERNEL:
        return False
    returns = func._schema.returns
    if not any("Tensor" in str(r.type) for r in returns):  # a dtype, a size, a scalar
        return False
    aliases = [r.alias_info for r in returns]
    return not (returns and all(a is not None and not a.is_write for a in aliases))


class LaunchCount(TorchDispatchMode):
    """``with LaunchCount() as c: ...``: ``c.total`` kernels launched, ``c.by_name`` per
    operator (Triton kernels as ``triton:NAME``)."""

    def __init__(self):
        super().__init__()
        self.by_name: Counter = Counter()

    def __enter__(self):
        kernels.COUNTERS.append(self.by_name)
        return super().__enter__()

    def __exit__(self, *exc):
        kernels.COUNTERS.remove(self.by_name)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not kernels.IN_LAUNCH[0] and launches(func):
            self.by_name[func._schema.name.split("::")[-1]] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())


def reads_host(func, args: tuple, kwargs: dict) -> bool:
    """Whether the operator call waits for the device: :data:`READS`, an index by a
    boolean tensor, ``repeat_interleave`` whose output size is not given."""
    name = func._schema.name.split("::")[-1]
    if name in READS:
        return True
    if name in ("index", "index_put", "index_put_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


def _names_device(args: tuple, kwargs: dict) -> bool:
    return "device" in kwargs or any(isinstance(a, str | torch.device) for a in args)


class SyncCount(TorchDispatchMode):
    """``with SyncCount() as c: ...``: ``c.total`` device→host reads (the module
    docstring), ``c.by_name`` per operator or method (``.cpu``, ``.to(device)``, …)."""

    def __init__(self):
        super().__init__()
        self.by_name: Counter = Counter()
        self._saved: dict[str, Callable] = {}

    def __enter__(self):
        for name in READ_METHODS + ("to",):
            self._saved[name] = original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def _counted(self, name: str, original: Callable) -> Callable:
        counts = self.by_name

        def method(tensor, *args, **kwargs):
            if name != "to" or _names_device(args, kwargs):
                counts[f".{name}"] += 1
            return original(tensor, *args, **kwargs)
        return method

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not kernels.IN_LAUNCH[0] and reads_host(func, args, kwargs):
            self.by_name[func._schema.name.split("::")[-1]] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.by_name.values())


@contextlib.contextmanager
def counting() -> Iterator[tuple[LaunchCount, SyncCount]]:
    """Both counts over the block: ``with counting() as (launched, synced): ...``."""
    launched, synced = LaunchCount(), SyncCount()
    with launched, synced:
        yield launched, synced


def pass_counts(run: Callable[[int], None], short: int, long: int
                ) -> tuple[float, float, Counter, Counter]:
    """Per batch of a pass, the kernels launched and the device→host reads: ``run(n)``
    runs a pass of ``n`` batches; counted for ``short`` and ``long`` batches, the
    difference divided by ``long − short`` (what the pass pays once — building its
    reducers, the first batch's caches — cancels). Returns (launches, reads) per batch
    and the differences by name."""
    counts = []
    for n in (short, long):
        with counting() as (launched, synced):
            run(n)
        counts.append((launched.by_name.copy(), synced.by_name.copy()))
    (l0, s0), (l1, s1) = counts
    extra = long - short
    launch_diff, sync_diff = l1.copy(), s1.copy()
    launch_diff.subtract(l0)
    sync_diff.subtract(s0)
    return (sum(launch_diff.values()) / extra, sum(sync_diff.values()) / extra,
            +launch_diff, +sync_diff)


__all__ = ["LaunchCount", "SyncCount", "counting", "launches", "pass_counts", "reads_host"]

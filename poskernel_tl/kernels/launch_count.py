"""Counting the kernels a piece of code launches, on any device: every PyTorch operator
that runs a kernel (views, aliases and uninitialised allocations run none) and every
Triton launch of :func:`poskernel_tl.kernels.launch` (whose own work, under Triton's
interpreter, is not counted as PyTorch operators). The launch-discipline test and
``scripts/bench_gpu.py`` read it per layer and batch of each reducer.
"""

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from poskernel_tl.kernels import dispatch as kernels

NO_KERNEL = {"empty", "empty_strided", "empty_like", "lift_fresh", "_local_scalar_dense",
             "set_", "resize_"}


def launches(func) -> bool:
    """Whether the operator ``func`` runs a kernel: not a view or alias of an input (an
    output aliasing an input without writing it), nor an uninitialised allocation."""
    name = func._schema.name.split("::")[-1]
    if name in NO_KERNEL:
        return False
    returns = func._schema.returns
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


__all__ = ["LaunchCount", "launches"]

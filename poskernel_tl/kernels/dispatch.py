"""When the reducers take the tiled kernels (:func:`active`, the one rule), and how a
kernel is launched and counted (:func:`launch`). Needs no Triton: it is imported only when
a kernel is first used."""


import contextlib
import os
from collections.abc import Iterator
from functools import cache

import torch

_FORCED = [False]
LAUNCHES = [0]  # Triton launches so far
COUNTERS: list = []  # open launch counts (:mod:`~poskernel_tl.kernels.launch_count`)
IN_LAUNCH = [False]  # inside a Triton launch (the interpreter's own tensor work)


@cache
def triton_available() -> bool:
    """Whether ``triton`` imports (CUDA builds of torch ship it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``: kernels on CPU
    tensors, for the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def active(x: torch.Tensor) -> bool:
    """Whether statistics of tensors like ``x`` are read from the tiled kernels: on CUDA
    with Triton (``POSKERNEL_KERNELS=0`` says no), or wherever :func:`forced`."""
    if _FORCED[0]:
        return True
    return x.is_cuda and os.environ.get("POSKERNEL_KERNELS", "1") != "0" \
        and triton_available()


def takes(x: torch.Tensor, chunk: int | None = None) -> bool:
    """Whether a sum over the entries a layer's mask keeps runs on the tiled kernels:
    :func:`active` for tensors like ``x``, and no chunk binds (the kernels implement the
    causal triangle, a window and the two sides, not a chunk: such a layer takes the
    CPU's sums on every device). The one place that says so."""
    return chunk is None and active(x)


@contextlib.contextmanager
def forced() -> Iterator[None]:
    """Take the kernels on any device (CPU tensors need ``TRITON_INTERPRET=1`` set before
    Triton is first imported)."""
    if not interpreting():
        raise RuntimeError("kernels on CPU tensors need TRITON_INTERPRET=1 set before "
                           "triton is imported")
    _FORCED[0], before = True, _FORCED[0]
    try:
        yield
    finally:
        _FORCED[0] = before


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    """Launch ``kernel`` on ``grid`` and count it (:data:`LAUNCHES`, and every open
    :class:`~poskernel_tl.kernels.launch_count.LaunchCount`)."""
    LAUNCHES[0] += 1
    for counter in COUNTERS:
        counter[f"triton:{kernel.fn.__name__ if hasattr(kernel, 'fn') else kernel}"] += 1
    IN_LAUNCH[0] = True
    try:
        kernel[grid](*args, **meta)
    finally:
        IN_LAUNCH[0] = False


__all__ = ["COUNTERS", "IN_LAUNCH", "LAUNCHES", "active", "forced", "interpreting", "launch",
           "takes", "triton_available"]

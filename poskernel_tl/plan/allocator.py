"""How the process's C allocator treats the large temporaries of a long-context run.

glibc's malloc maps every block above its mmap threshold (at most 32 MiB by default) as
fresh pages and unmaps it on free, and returns the top of its heap to the system once
128 KiB of it are free. A long-context fit allocates hundreds of such temporaries per
layer (FFT buffers, chunked products, float64 corrections), so each is paid again in
page faults: at T = 8192 on SmolLM2-135M they made a third of Track B's fit time and
87 of the run's ≈ 520 CPU s, all system time. With both thresholds raised, freed blocks
stay in the heap and are reused.

NumPy advises the kernel to back each array of 4 MiB or more with huge pages. Where the
kernel defragments for such advice on the fault itself (``defrag = madvise``, a common
default), a fault can stall while memory is compacted: one float64 FFT of T = 4096 q/k
(scipy's output, 75 MB) took 0.06 s on its median call and up to 0.27 s on one in five.
The setting withdraws that advice too (NumPy's own switch); torch's arrays never take it.

The cost: memory a step frees stays with the process (and in its RSS) until a later
step reuses it, so RSS no longer falls between the peaks of a run. The ``poskernel``
command applies it at start; a program that calls the library can call
:func:`reuse_freed_memory` itself. ``POSKERNEL_MALLOC=default`` leaves the allocator as
it is. :func:`release_freed_memory` hands what the heap holds free back at a point where
a caller knows it is done with it (the report, after each condition).
"""

import ctypes
import mmap
import os

import numpy as np

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # free heap kept up to 2 GiB (mallopt takes an int)
MADV_PAGEOUT = 21  # Linux ≥ 5.4: reclaim these pages now (their contents kept)
PAGE = mmap.PAGESIZE


def reuse_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process and stop NumPy advising
    huge pages (see the module docstring). Whether the thresholds took effect: False
    with another C library (macOS, musl), or where ``POSKERNEL_MALLOC=default`` (which
    leaves NumPy's advice as it is too)."""
    if os.environ.get("POSKERNEL_MALLOC") == "default":
        return False
    _multiarray()._set_madvise_hugepage(False)
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _multiarray():
    """NumPy's C module (``numpy._core`` from NumPy 2, ``numpy.core`` before)."""
    return np._core.multiarray if hasattr(np, "_core") else np.core.multiarray


def release_freed_memory() -> None:
    """Hand the heap pages freed so far back to the system (glibc's ``malloc_trim``; a
    no-op elsewhere), whatever the thresholds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def release_pages(a: np.ndarray) -> None:
    """Ask the kernel to reclaim the whole pages of ``a``'s memory (Linux's MADV_PAGEOUT,
    a hint that keeps the contents: the clean pages of a mapped file leave the process's
    RSS and are read again if touched; memory without a file behind it stays). For a
    mapped array read once, e.g. a saved sequence's logits in the report; a no-op where
    the call is missing."""
    start = a.__array_interface__["data"][0]
    lo, hi = -(-start // PAGE) * PAGE, (start + a.nbytes) // PAGE * PAGE
    if hi <= lo:
        return
    try:
        madvise = ctypes.CDLL("libc.so.6").madvise
    except (OSError, AttributeError):
        return
    madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_PAGEOUT)


__all__ = ["release_freed_memory", "release_pages", "reuse_freed_memory"]

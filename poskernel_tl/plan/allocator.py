"""How the process's C allocator treats the large temporaries of a long-context run.

glibc's malloc maps every block above its mmap threshold (at most 32 MiB by default) as
fresh pages and unmaps it on free, and returns the top of its heap to the system once
128 KiB of it are free. A long-context fit allocates hundreds of such temporaries per
layer (FFT buffers, chunked products, float64 corrections), so each is paid again in
page faults: at T = 8192 on SmolLM2-135M they made a third of Track B's fit time and
87 of the run's ≈ 520 CPU s, all system time. With both thresholds raised, freed blocks
stay in the heap and are reused.

The cost: memory a step frees stays with the process (and in its RSS) until a later
step reuses it, so RSS no longer falls between the peaks of a run. The ``poskernel``
command applies it at start; a program that calls the library can call
:func:`reuse_freed_memory` itself. ``POSKERNEL_MALLOC=default`` leaves the allocator as
it is. :func:`release_freed_memory` hands what the heap holds free back at a point where
a caller knows it is done with it (the report, after each condition).
"""

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # free heap kept up to 2 GiB (mallopt takes an int)


def reuse_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module
    docstring). Whether it took effect: False with another C library (macOS, musl), or
    where ``POSKERNEL_MALLOC=default``."""
    if os.environ.get("POSKERNEL_MALLOC") == "default":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed_memory() -> None:
    """Hand the heap pages freed so far back to the system (glibc's ``malloc_trim``; a
    no-op elsewhere), whatever the thresholds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


__all__ = ["release_freed_memory", "reuse_freed_memory"]

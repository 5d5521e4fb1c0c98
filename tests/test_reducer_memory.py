"""Each reducer's statement of its memory, against what it takes: the live peak of one
update (Track A, and the permutation null's draws, which the plan counts within Track A's
share) and of one layer's fit (Track B, both paths), measured at two lengths.

The peak is the process's high-water RSS over the call, from a reset just before it, in
a child process whose allocator maps every block above 64 KiB afresh and returns it on
free (glibc's mallopt): RSS then follows the live bytes, so the peak is reproducible to
≈ 1% (a growing heap would otherwise hide or add up to a third). The plan's estimates err
high on purpose; they must cover the peak and not exceed it more than 2.5×."""

import json
import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, json, sys, torch
from types import SimpleNamespace
libc = ctypes.CDLL("libc.so.6")
libc.mallopt(-3, 1 << 16), libc.mallopt(-1, 1 << 16)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
torch.set_num_threads(1)
from poskernel_tl.mask import Mask
from poskernel_tl.reducers import GramReducer, MomentsReducer, TrackAReducer, track_a
from poskernel_tl.statistics import PermNullReducer
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.gram_cost import gram_fit_bytes

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

def peak(fn):
    fn()  # once before: FFT plans, caches
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the RSS now
    base = status("VmRSS:")
    fn()
    return status("VmHWM:") - base

T, n, H, kv, d = int(sys.argv[1]), 4, 9, 3, 64  # SmolLM2-135M's heads
model = SimpleNamespace(spec=SimpleNamespace(n_layers=1, n_heads=H, n_kv_heads=kv,
                                             d_head=d, causal=True, layers=None))
g = torch.Generator().manual_seed(0)
qk = lambda m: (torch.randn(m, T, H, d, generator=g), torch.randn(m, T, kv, d, generator=g))
batch = lambda m: LayerBatch(0, *qk(m), torch.arange(m), 0.125, rows=tuple(range(m)))
one = batch(1)
reducer = TrackAReducer(1, [Mask(T)], H)
out = {"track_a": (peak(lambda: reducer.update(one)), track_a.work_bytes(model, T))}
# the null's draws run after Track A's sums, one at a time: Track A's share covers them
null = PermNullReducer([Mask(T)], H, n_perm=4, max_seqs=1, include_identity=False)
out["null"] = (peak(lambda: null.update(one)), track_a.work_bytes(model, T))
moments = MomentsReducer(4, 1, H, kv, T, d, half_seed=1)
moments.update(batch(4))
centering = moments.result()
for factors in (False, True):
    gram = GramReducer([Mask(T)], H, kv, d, 0.125, reference=centering, full=False,
                       factors=factors)
    for _ in range(n):
        gram.update(batch(1))
    out[f"fit, factors={factors}"] = (peak(lambda: gram.result(centering)),
                                      gram_fit_bytes(model, T, n, factors))
print(json.dumps(out))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
                    or not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="glibc's mallopt and Linux's resettable high-water RSS")
@pytest.mark.parametrize("length", [  # slow: the same check at twice the length
    1024, pytest.param(2048, marks=pytest.mark.slow)])
def test_reducers_state_what_they_take(length):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(length)], capture_output=True,
                         text=True, check=True)
    for what, (measured, estimate) in json.loads(out.stdout.strip().splitlines()[-1]).items():
        assert measured <= estimate, (what, length, measured, estimate)
        if what != "null":  # (the null only needs to fit in Track A's share)
            assert estimate <= 2.5 * measured, (what, length, measured, estimate)

"""The allocator setting of long runs: freed large blocks are reused, not faulted in again."""

import json
import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import json, resource, sys, torch
import poskernel_tl.apps.commands  # what the command has imported when it applies the setting
from poskernel_tl.plan.allocator import _multiarray, release_freed_memory, reuse_freed_memory
applied = reuse_freed_memory()
hugepage = _multiarray()._set_madvise_hugepage(False)  # returns the flag it replaces
faults = []
for i in range(5):  # a 256 MiB temporary, written whole, then freed
    if i == 4:  # the heap's free pages handed back: the next block faults in again
        release_freed_memory()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(64 << 20, dtype=torch.float32).fill_(1.0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults, "hugepage": hugepage}))
"""


def _run(malloc: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "POSKERNEL_MALLOC"}
    if malloc is not None:
        env["POSKERNEL_MALLOC"] = malloc
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt")
def test_freed_blocks_are_reused_not_faulted_in_again():
    pages = (256 << 20) // os.sysconf("SC_PAGE_SIZE")
    default, reused = _run("default"), _run(None)
    assert not default["applied"] and reused["applied"]
    # NumPy's huge-page advice (on by default on Linux) withdrawn by the setting only
    assert default["hugepage"] and not reused["hugepage"]
    # glibc's default maps each 256 MiB block afresh: every page faults every time
    assert min(default["faults"]) > 0.9 * pages
    # raised thresholds: the first block faults in, and the heap serves later ones from
    # pages it already holds (not every one: glibc may still move the top of its heap)
    assert reused["faults"][0] > 0.9 * pages
    assert min(reused["faults"][1:4]) < 0.05 * pages
    # release_freed_memory (the report's, after each condition) returns them all the same
    assert reused["faults"][4] > 0.9 * pages

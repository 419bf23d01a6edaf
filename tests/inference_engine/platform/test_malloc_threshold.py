"""A pinned mmap threshold gives a freed multi-MiB block back to the OS; glibc's growing one keeps it resident."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each child allocates, touches and frees a block of BLOCK_MIB MiB three times, then reports its resident set.
BLOCK_MIB = 8
_CHILD = f"""
import sys
import numpy as np
from inference_engine.platform.malloc_threshold import pin_mmap_threshold
pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else False
for _ in range(3):
    block = np.ones({BLOCK_MIB} << 17)  # float64: {BLOCK_MIB} MiB, every page touched
    del block
rss = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")][0]
print(int(pinned), rss)
"""


def _child(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True).stdout
    pinned, rss_kib = out.split()
    return pinned == "1", int(rss_kib)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_a_pinned_threshold_returns_freed_blocks():
    pinned, rss_pinned = _child("pin")
    if not pinned:
        pytest.skip("this C library is not glibc (no M_MMAP_THRESHOLD)")
    _, rss_default = _child("default")
    # glibc's default raises the threshold to the first freed block's size, so the second and third come from the
    # heap and stay there once freed: the default child holds about one more block than the pinned one
    assert rss_default - rss_pinned > BLOCK_MIB * 1024 // 2


def test_pinning_is_idempotent():
    from inference_engine.platform.malloc_threshold import pin_mmap_threshold

    assert pin_mmap_threshold() == pin_mmap_threshold()


# Each child allocates, touches and frees a heap block (below the mmap threshold) five times and reports the minor
# page faults of the last four rounds: a prefill's per-layer activations.
HEAP_BLOCK_MIB = 2
_TRIM_CHILD = f"""
import ctypes, resource, sys
import numpy as np
from inference_engine.platform import malloc_threshold
if sys.argv[1] == "pin":
    malloc_threshold.pin_mmap_threshold()
else:  # the mmap threshold alone, as before the trim threshold was pinned (trimming from 128 KiB)
    ctypes.CDLL(None).mallopt(malloc_threshold._M_MMAP_THRESHOLD, malloc_threshold.MMAP_THRESHOLD)
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.ones({HEAP_BLOCK_MIB} << 17)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_freed_heap_blocks_are_kept_for_the_next_layer():
    from inference_engine.platform.malloc_threshold import TRIM_THRESHOLD, pin_mmap_threshold

    if not pin_mmap_threshold():
        pytest.skip("this C library is not glibc (no M_TRIM_THRESHOLD)")
    assert HEAP_BLOCK_MIB << 20 < TRIM_THRESHOLD

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _TRIM_CHILD, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    pages = (HEAP_BLOCK_MIB << 20) // 4096
    assert faults("mmap-only") >= 4 * pages // 2  # trimmed at every free: the block's pages fault again each round
    assert faults("pin") < pages // 4  # kept: the later rounds reuse the same pages

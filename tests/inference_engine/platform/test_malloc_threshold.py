"""Pinned glibc thresholds keep a prefill layer's freed activations for the next layer: reused, not faulted again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# A 512-token prefill of Qwen2.5-1.5B frees three FFN activations of 512 x 8960 float32 (17.5 MiB) per layer
# (and 12 MiB of attention scores).
ACTIVATION_MIB = 18
ACTIVATIONS = 3
ROUNDS = 5
# Each child allocates, touches and frees a layer's activations ROUNDS times and prints each round's minor page
# faults. Modes: "pin" (pin_mmap_threshold), "import" (the engine's modules imported, nothing pinned: glibc's own
# thresholds), "mmap-4mib" (the mmap threshold pinned at 4 MiB and trimming at 16 MiB, this project's setting
# before: blocks above 4 MiB get their own mapping).
_CHILD = f"""
import ctypes, resource, sys
import numpy as np
import inference_engine, inference_engine.engine, inference_engine.backends.numba_cpu
from inference_engine.platform import malloc_threshold
if sys.argv[1] == "pin":
    malloc_threshold.pin_mmap_threshold()
elif sys.argv[1] == "mmap-4mib":
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(malloc_threshold._M_MMAP_THRESHOLD, 4 << 20), mallopt(malloc_threshold._M_TRIM_THRESHOLD, 16 << 20)
faults = []
for _ in range({ROUNDS}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    layer = [np.ones({ACTIVATION_MIB} << 17) for _ in range({ACTIVATIONS})]  # float64: every page touched
    del layer
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")


def activation_faults(mode: str) -> list[int]:
    """The minor page faults of each round of a layer's activations in a fresh child (see ``_CHILD``)."""
    import os

    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True, cwd=REPO,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return [int(v) for v in out.split()]


def skip_unless_glibc() -> None:
    from inference_engine.platform.malloc_threshold import pin_mmap_threshold

    if not pin_mmap_threshold():
        pytest.skip("this C library is not glibc (no M_MMAP_THRESHOLD)")


@glibc_only
def test_a_layers_activations_are_reused_by_the_next_layer():
    from inference_engine.platform.malloc_threshold import MMAP_THRESHOLD, TRIM_THRESHOLD

    skip_unless_glibc()
    assert ACTIVATION_MIB << 20 <= MMAP_THRESHOLD and ACTIVATIONS * ACTIVATION_MIB << 20 <= TRIM_THRESHOLD
    first, *later = activation_faults("pin")
    assert sum(later) < first // 10  # the pages of the first round serve every later one
    # with a block of its own above 4 MiB, every round took fresh pages from the OS again
    first_4mib, *later_4mib = activation_faults("mmap-4mib")
    assert min(later_4mib) > first_4mib // 2


def test_pinning_is_idempotent():
    from inference_engine.platform.malloc_threshold import pin_mmap_threshold

    assert pin_mmap_threshold() == pin_mmap_threshold()

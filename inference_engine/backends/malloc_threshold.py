"""Give big freed blocks back to the OS: pin glibc's mmap threshold instead of letting it grow.

glibc's ``malloc`` serves blocks above ``M_MMAP_THRESHOLD`` (128 KiB at start) with their own ``mmap``, returned
to the OS when freed. But each time such a block is freed, glibc raises the threshold to its size (up to 32 MiB),
so later blocks of that size come from the heap instead, where a freed block in the middle stays resident. LLVM,
loading Numba's cached kernels on a model's first token, allocates and frees blocks of several MiB, and the
heap kept them: measured on Gemma 3 270M (numba backend, ggml numerics, F16 K/V, 512-token prompt then 128
tokens, 2-core AMD EPYC), peak RSS 493 MiB as glibc grows the threshold, 454 MiB with it pinned at any of 256
KiB, 1 MiB or 4 MiB. SmolLM2 135M's peak did not move (299 MiB either way).

:func:`pin_mmap_threshold` sets it once (``mallopt``, which also switches the growth off), at ``MMAP_THRESHOLD``;
where the C library is not glibc it does nothing. The cost is an ``mmap`` / ``munmap`` (and fresh zero pages)
per block above the threshold: at 4 MiB that is the weights at load and a prefill's biggest activations, not a
decoded token's arrays.
"""

from __future__ import annotations

import ctypes
import sys

# Blocks above this size get their own mapping; 4 MiB gave the same peak as 256 KiB and 1 MiB (above) while
# leaving every array of a decode step (at most a vocabulary of float32 logits, 1 MiB for Gemma 3) in the heap.
MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # glibc malloc.h

_pinned: bool | None = None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold (once per process); True where it is pinned, False where this C library has no
    such setting (macOS, musl, Windows)."""
    global _pinned
    if _pinned is None:
        _pinned = False
        if sys.platform.startswith("linux"):
            try:
                mallopt = ctypes.CDLL(None).mallopt  # the process's own C library (find_library: ~13 ms a call)
            except (OSError, AttributeError):
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _pinned = mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1
    return _pinned

"""Give big freed blocks back to the OS, keep a layer's worth of small ones: pin glibc's malloc thresholds.

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

Pinning the mmap threshold also pins glibc's trim threshold at its start value, 128 KiB: whenever more than that
is free at the top of the heap, ``free`` gives it back to the OS. A prefill allocates and frees a layer's
activations (each below 4 MiB: heap blocks) at the top of the heap once per layer, so every layer took fresh pages
from the OS again: measured on Qwen2.5-1.5B (the 109-token TTFT prompt, 2 threads, Xeon VM), 97,000 minor page
faults in every prefill, the first two prefills of a process 1.8-2.2 s and later ones 1.34 s. ``TRIM_THRESHOLD``
(16 MiB) keeps that much free heap for the next layer: 6,000 faults in the first prefill, none after, 1.25 s then
1.15-1.25 s (8 MiB did not help; 16 and 32 MiB did the same). The price: up to that much freed heap stays resident;
SmolLM2's peak RSS (512-token prompt, 128 tokens) 250.5 -> 254.9 MiB.
"""

from __future__ import annotations

import ctypes
import sys

# Blocks above this size get their own mapping; 4 MiB gave the same peak as 256 KiB and 1 MiB (above) while
# leaving every array of a decode step (at most a vocabulary of float32 logits, 1 MiB for Gemma 3) in the heap.
MMAP_THRESHOLD = 4 << 20
# Free memory kept at the top of the heap before glibc gives it back (see above).
TRIM_THRESHOLD = 16 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h

_pinned: bool | None = None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD, trim: int = TRIM_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold and its trim threshold (once per process); True where they are pinned, False where
    this C library has no such setting (macOS, musl, Windows)."""
    global _pinned
    if _pinned is None:
        _pinned = False
        if sys.platform.startswith("linux"):
            try:
                mallopt = ctypes.CDLL(None).mallopt  # the process's own C library (find_library: ~13 ms a call)
            except (OSError, AttributeError):
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _pinned = mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1 and mallopt(_M_TRIM_THRESHOLD, int(trim)) == 1
    return _pinned

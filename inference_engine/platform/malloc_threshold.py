"""Keep a prefill layer's freed activations for the next layer: pin glibc's malloc thresholds.

glibc's ``malloc`` serves blocks above ``M_MMAP_THRESHOLD`` (128 KiB at start) with their own ``mmap``, returned
to the OS when freed, so the next block of that size takes fresh zero pages from the OS again (a minor page fault
per page touched). Each time such a block is freed, glibc raises the threshold to its size (up to 32 MiB, its
largest), so later blocks come from the heap; but whenever more than ``M_TRIM_THRESHOLD`` (twice the grown
threshold) is free at the top of the heap, ``free`` gives it back to the OS too. A prefill allocates a layer's
activations and frees them at the top of the heap once per layer: on Qwen2.5-1.5B with a 512-token prompt three FFN
activations of 17.5 MiB, 12 MiB of attention scores and smaller arrays, about 75 MiB at the layer's peak.

:func:`pin_mmap_threshold` sets both once (``mallopt``, which also switches the growth off): ``MMAP_THRESHOLD`` at
32 MiB (glibc's most) and ``TRIM_THRESHOLD`` at 128 MiB, above a 512-token layer's activations (llama-bench's
prompt and llama.cpp's micro-batch). Measured on the 2-core AMD EPYC (Zen 4) VM, numba backend, ggml numerics, 2
threads, each prefill after the first of a process:

- Qwen2.5-1.5B alone in its process, 512 tokens: 79,000 minor page faults and 1.65-1.81 s a prefill at the earlier
  pin (4 MiB / 16 MiB, whose mmap'd activations faulted in at every layer); none and 1.58-1.63 s at 32 / 64 MiB;
  32 / 32 MiB trimmed at every layer (111,000 faults, 1.81-1.88 s). At 128 tokens (4.4 MiB activations): 49,000
  faults and 0.45-0.66 s, then none and 0.40 s. Next to llama.cpp in the same process (``compare``'s in-process
  yardstick) 64 MiB was not enough (135,000 faults, 1.8-2.0 s); 128 and 256 MiB: none, 1.51-1.54 s.
- ``compare`` (pp, 7 repetitions, the 4 MiB pin in a worktree run right after): Qwen2.5-1.5B pp512 1.68 -> 1.88 of
  llama.cpp, pp128 1.35 -> 1.83; Gemma 3 270M pp512 1.61 [1.42-1.83] -> 1.72 [1.69-1.75] (within noise).
- Peak RSS (``compare``'s cold start, ``-p 512 -n 128``, the commit before run right before): SmolLM2 210.5 -> 216.1
  MiB, Gemma 3 366.5 -> 373.5, Qwen2.5-1.5B 1255.6 -> 1262.9: 6-7 MiB more, from heap blocks of 4-32 MiB (SmolLM2's
  9 MiB of attention scores at 512 tokens) that the heap's fragmentation keeps, the same with a trim threshold of 32,
  64 or 128 MiB; with a 16-token prompt no change (SmolLM2 199.9 -> 200.0, Gemma 3 356.3 both, the 1.5B 1192.4
  both). The price of the 1.5B's faster prefill; llama.cpp keeps its whole compute buffer allocated.

The 4 MiB pin was set when LLVM, loading Numba's cached kernels on a model's first token, allocated and freed blocks
of several MiB that a grown threshold kept in the heap (Gemma 3's peak 493 MiB, 454 with 4 MiB); since LLVM's
loading was lightened (``numba_startup``'s cached-kernel and bitcode tricks, ``library_pages``) that churn is gone.
Blocks above 32 MiB (a prompt chunk of more than ~930 tokens on the 1.5B's FFN) still get their own mapping: glibc
takes no larger threshold. Where the C library is not glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import sys

# Blocks above this size get their own mapping: glibc's largest, so a 512-token layer's activations are heap blocks.
MMAP_THRESHOLD = 32 << 20
# Free memory kept at the top of the heap before glibc gives it back: above a 512-token layer's activations.
TRIM_THRESHOLD = 128 << 20
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

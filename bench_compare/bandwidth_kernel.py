"""The kernel :mod:`bench_compare.bandwidth` times: its own module so that importing ``bandwidth`` (every compare
does, for the memory wall) does not import Numba when the figure comes from the cache."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def parallel_sum(data: np.ndarray) -> int:
    """A ``prange`` reduction: Numba splits it over its threads and LLVM vectorizes each part (measured on a Zen 4
    VM, one thread: 41.5 GB/s; the same sum in explicit 512 KiB chunks with a bounds ``min`` did not vectorize and
    read 6.7)."""
    total = 0
    for i in numba.prange(data.shape[0]):
        total += data[i]
    return total

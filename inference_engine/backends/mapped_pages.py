"""Give back the memory-mapped file pages of a weight once a backend holds its own copy of it.

A backend that copies (or repacks) a weight out of the GGUF memory map would otherwise keep two copies resident:
the file's pages, mapped and counted in the process's RSS once touched, and its own. After the copy,
``madvise(MADV_DONTNEED)`` on the tensor's pages unmaps them from this process (the kernel keeps them in its page
cache, shared and reclaimable, not in our RSS). It is safe on a file mapping: a later read of the same bytes (a
norm vector sharing an edge page, a second backend) faults them back in from the file, unchanged. It is only ever
applied to ``numpy.memmap`` views (never to anonymous memory, where MADV_DONTNEED would zero the data).
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The ``mmap.mmap`` behind a ``numpy.memmap`` view (gguf-py's tensor data), else None."""
    base = arr
    while base is not None:
        mm = getattr(base, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            return mm
        base = getattr(base, "base", None)
    return None


def drop_file_pages(arr: np.ndarray) -> int:
    """Unmap the whole pages under ``arr`` (a view into a file's memory map) from this process; returns the bytes
    given back (0 when ``arr`` is not memory-mapped, the platform has no ``madvise``, or the range holds no whole
    page)."""
    mm = _mapping(arr)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED") or arr.nbytes == 0:
        return 0
    try:
        start = arr.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    except ValueError:  # a closed mapping
        return 0
    end = start + arr.nbytes
    if not 0 <= start < end <= len(mm):
        return 0
    first = -(-start // PAGE) * PAGE  # whole pages only: the edge pages may hold a neighbour's bytes still in use
    last = end // PAGE * PAGE
    if last <= first:
        return 0
    mm.madvise(mmap.MADV_DONTNEED, first, last - first)
    return last - first

"""Copy a weight out of the GGUF memory map without holding two copies, and give mapped pages back.

A backend that copies (or repacks) a weight out of the GGUF memory map would otherwise keep two copies resident:
the file's pages, mapped and counted in the process's RSS once touched, and its own. After the copy,
``madvise(MADV_DONTNEED)`` on the tensor's pages unmaps them from this process (the kernel keeps them in its page
cache, shared and reclaimable, not in our RSS). It is safe on a file mapping: a later read of the same bytes (a
norm vector sharing an edge page, a second backend) faults them back in from the file, unchanged. It is only ever
applied to ``numpy.memmap`` views (never to anonymous memory, where MADV_DONTNEED would zero the data).

:func:`copy_out_of_map` makes such a copy without mapping the file's pages in at all: it reads the tensor's bytes
from the file (``readinto``, in :data:`READ_CHUNK` pieces) straight into the new array. Copying through the map
instead would hold the mapped pages and the copy together: the 178 MB Gemma 3 embedding took the peak RSS 170 MB
above where it settled once the pages were dropped.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

import numpy as np

from inference_engine.store.identity import file_identity

PAGE = mmap.PAGESIZE
# Bytes read per call when copying out of the file: few calls, and no large buffer besides the destination.
READ_CHUNK = 16 << 20
# A copy of at least this many bytes per thread is read by several threads, up to READ_THREADS (_read_file_into).
PARALLEL_READ_BYTES = 4 << 20
READ_THREADS = max(1, min(4, os.cpu_count() or 1))
# From this size on a weight copy gets a mapping of its own on ordinary pages (weight_buffer): NumPy's threshold
# for asking huge pages.
PLAIN_PAGES_BYTES = 4 << 20
# Positional reads (os.preadv) let threads share one file; without them (Windows) one thread seeks and reads.
HAVE_PREADV = hasattr(os, "preadv")
# The attribute of a numpy.memmap holding its file's identity (remember_file_identity).
IDENTITY_ATTR = "gguf_parity_file_identity"


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The ``mmap.mmap`` behind a ``numpy.memmap`` view (gguf-py's tensor data), else None."""
    base = arr
    while base is not None:
        mm = getattr(base, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            return mm
        base = getattr(base, "base", None)
    return None


def remember_file_identity(mm: np.memmap, st: os.stat_result) -> None:
    """Record on a ``numpy.memmap`` which file it maps (``st``: ``os.stat`` of the path, taken *before* mapping it),
    so that :func:`copy_out_of_map` reads by name only while the name still leads to that file."""
    setattr(mm, IDENTITY_ATTR, file_identity(mm.filename, st))


def _file_position(arr: np.ndarray) -> tuple[str, int, tuple | None] | None:
    """``(file name, byte offset in that file, recorded identity or None)`` of the first byte of ``arr`` when it views
    a ``numpy.memmap`` of a file (gguf-py's reader data), else None."""
    base, root = arr, None
    while base is not None:
        if isinstance(base, np.memmap) and getattr(base, "filename", None):
            root = base  # the outermost memmap: the one the reader made (slices inherit filename and offset)
        base = getattr(base, "base", None)
    mm = _mapping(arr)
    if root is None or mm is None:
        return None
    try:
        into_map = arr.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    except ValueError:  # a closed mapping
        return None
    if not 0 <= into_map <= len(mm) - arr.nbytes:
        return None
    # numpy.memmap maps from the offset rounded down to the allocation granularity (every slice keeps that offset)
    map_start = int(root.offset) - int(root.offset) % mmap.ALLOCATIONGRANULARITY
    return str(root.filename), map_start + into_map, getattr(root, IDENTITY_ATTR, None)


def copy_out_of_map(arr: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous copy of ``arr`` in ordinary process memory, with the same dtype and shape (written into
    ``out`` when given: a C-contiguous array of that dtype and shape, e.g. a slice of a bigger buffer).

    When ``arr`` is a contiguous view into a memory-mapped file, its bytes are read from the file into the copy,
    so none of the mapped pages enter this process (the copy is the only resident one); otherwise
    ``np.array(arr)``. The bytes are the same either way: the file is opened read-only, and where the map recorded
    its file's identity (:func:`remember_file_identity`, gguf_file's reader does) a file replaced on disk since it
    was mapped (a re-download) is copied through the map instead.
    """
    if out is not None and (out.shape != arr.shape or out.dtype != arr.dtype or not out.flags.c_contiguous):
        raise ValueError(f"copy_out_of_map: out {out.dtype}{out.shape} cannot hold {arr.dtype}{arr.shape}")
    where = _file_position(arr) if arr.flags.c_contiguous and arr.nbytes else None
    if where is None:
        return _through_map(arr, out)
    name, position, identity = where
    if out is None:
        out = weight_buffer(arr.shape, arr.dtype)
    dest = memoryview(out.reshape(-1).view(np.uint8))
    try:
        with open(name, "rb", buffering=0) as fh:
            if identity is not None and file_identity(name, os.fstat(fh.fileno())) != identity:
                return _through_map(arr, out)
            done = _read_file_into(fh, position, dest)
    except OSError:
        done = -1
    if done != len(dest):  # the file went away or shrank: copy through the map instead
        return _through_map(arr, out)
    return out


def _read_file_into(fh, position: int, dest: memoryview) -> int:
    """Read ``fh`` from ``position`` into ``dest``; returns the bytes read. A read of at least
    :data:`PARALLEL_READ_BYTES` is split over up to :data:`READ_THREADS` threads (``os.preadv``, which releases the
    GIL): most of a big copy's time is the kernel's first touch of the destination's fresh pages, which threads
    share out. Measured copying the 1.1 GB Qwen2.5-1.5B GGUF from the page cache (2-core Xeon VM, fresh processes,
    alternating): 1 thread 1.5-2.2 s when the memory had just been handed back to the host, 0.30 s when not; 2
    threads 0.83-1.5 s and 0.19 s."""
    n = len(dest)
    parts = min(READ_THREADS, n // PARALLEL_READ_BYTES) if HAVE_PREADV else 1
    if parts <= 1:
        return _read_span(fh, position, dest)
    bounds = [n * i // parts // PAGE * PAGE for i in range(parts)] + [n]
    spans = [(position + bounds[i], dest[bounds[i] : bounds[i + 1]]) for i in range(parts)]
    return sum(_reader_pool().map(lambda span: _read_span(fh, *span), spans))


def _read_span(fh, position: int, dest: memoryview) -> int:
    """``dest`` filled from ``fh`` at ``position`` in :data:`READ_CHUNK` pieces; the bytes read (fewer at the end of
    the file)."""
    done = 0
    while done < len(dest):
        piece = dest[done : done + READ_CHUNK]
        if HAVE_PREADV:
            got = os.preadv(fh.fileno(), [piece], position + done)
        else:
            fh.seek(position + done)
            got = fh.readinto(piece)
        if not got:
            break
        done += got
    return done


_pool = None


def _reader_pool():
    """The threads that split big reads, started on first use and kept (a model's load makes hundreds of reads)."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="gguf-read")
    return _pool


def tensor_out_of_map(t):
    """A :class:`~inference_engine.gguf.file.TensorInfo` whose ``raw`` is a copy read from the file
    (:func:`copy_out_of_map`), for small tensors kept for the model's lifetime (norm weights, biases).

    Read through the map instead, such a tensor keeps mapped far more than its own bytes: a page fault on a file
    mapping maps the pages around it too (the kernel's fault-around, and on Linux 6.x the whole large folio the page
    cache holds, up to 2 MiB): seen on Linux 6.18 / ext4, SmolLM2's 60 norm vectors (2.3 KB each) read through the
    map at its first decoded token brought 62 MiB of the neighbouring weights' pages into RSS."""
    return dataclasses.replace(t, raw=copy_out_of_map(np.asarray(t.raw)))


def weight_buffer(shape, dtype) -> np.ndarray:
    """An uninitialized array for a weight copy. From :data:`PLAIN_PAGES_BYTES` on it is an anonymous mapping of its
    own advised ``MADV_NOHUGEPAGE`` (where the platform has it): NumPy asks transparent huge pages for every array of
    4 MiB and more, and on a VM whose host takes freed memory back, a huge page is the slow case of a first touch.
    Measured loading Qwen2.5-1.5B (2-core Xeon VM, Linux 6.18, fresh processes, alternating): 1.75-2.75 s with huge
    pages, 0.62-0.71 s without; its decode and prefill speed did not move (66.5 vs 66.4 ms a token, in-process)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < PLAIN_PAGES_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(shape, dtype)
    region = mmap.mmap(-1, nbytes)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(region, dtype).reshape(shape)  # the array keeps the mapping; freed with it


def _through_map(arr: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.array(arr, order="C")
    np.copyto(out, arr)
    return out


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

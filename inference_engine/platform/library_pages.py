"""Unmap the read-only pages of a shared library that only its loading touched (Linux).

``libllvmlite.so`` (all of LLVM, 170 MB) is loaded by Numba's import. Loading it runs LLVM's static initializers and
relocations scattered over the file, and on a kernel that keeps the page cache in large folios (Linux 6.18 on ext4)
each fault maps the whole folio around the page: measured on the Xeon VM, 35.9 MiB of the library resident after
``import numba``, 1.9 MiB of it the library's own modified (relocated) data. A process that runs cached kernels uses
only a small part of LLVM afterwards (the JIT's object loader and linker).

:func:`release_read_only_pages` gives those mappings back with ``madvise(MADV_DONTNEED)``, but only the mappings that
are read-only and hold no anonymous (copied-on-write) page: their contents are the file's, so any page used later is
mapped again from the page cache, unchanged (a minor fault). Measured on the Xeon VM, SmolLM2 Q4_1 cold start, the
process's peak RSS after a 512-token prompt and 128 decoded tokens: 254.3 -> 228.8 MiB. Elsewhere (no ``/proc``, no
``madvise``) it does nothing.

Every later use of LLVM maps part of it back: loading a cached kernel (its object loader and linker) brought 11 MiB
back at SmolLM2's first prefill, and they stayed. :func:`release_after_each_compilation` gives them back again each
time Numba leaves its compiler lock (a kernel compiled or loaded from the cache; nothing on a kernel's later calls),
from the spans found the first time (checked against ``/proc/self/maps``, 0.3 ms, instead of ``smaps``, 4 ms).
Measured on the Xeon VM, cold starts as above, alternating with the release at import only: peak RSS SmolLM2 229.8 ->
211.0-211.9 MiB, Gemma 3 270M 383.0-383.3 -> 363.7-363.8 MiB; the start of imports to the first token SmolLM2 521-548
-> 532-566 ms, Gemma 3 614-635 -> 640-658 ms (and two runs of 958 and 1537 ms, not seen in the 3 after them). About
15 releases a cold start: 21 ms of it the releases themselves, the rest mapping pages back for the next kernel's load.
"""

from __future__ import annotations

import ctypes
import functools
import re
import sys
import threading

LLVM_LIBRARY = "libllvmlite.so"
MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_VMA = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def read_only_file_spans(library: str, smaps: str = "/proc/self/smaps") -> list[tuple[int, int]]:
    """``(start, end)`` of this process's mappings of a file whose name ends with ``library`` that are not writable
    and hold no anonymous page (``Anonymous: 0 kB``): pages that can be dropped and mapped again unchanged."""
    spans: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    with open(smaps) as fh:
        for line in fh:
            m = _VMA.match(line)
            if m:
                start, end, perms, path = int(m[1], 16), int(m[2], 16), m[3], m[4]
                keep = path.endswith("/" + library) and "w" not in perms
                current = (start, end) if keep else None
            elif current is not None and line.startswith("Anonymous:"):
                if int(line.split()[1]) == 0:
                    spans.append(current)
                current = None
    return spans


def still_mapped(spans: list[tuple[int, int]], library: str, maps: str = "/proc/self/maps") -> bool:
    """Whether each of ``spans`` is still one whole read-only mapping of ``library`` (``/proc/self/maps``): the
    check before giving remembered spans back, so that a span never reaches memory that is no longer the file's.
    Whether a span still holds no anonymous page is not read again: only a write makes one, after an ``mprotect``
    that makes the mapping writable (seen here while it lasts: its perms, or a split range). The one writer of a
    library's read-only data is the loader, relocating it at load time, before the spans were first read."""
    wanted = set(spans)
    with open(maps) as fh:
        for line in fh:
            m = _VMA.match(line)
            if m and (int(m[1], 16), int(m[2], 16)) in wanted:
                if not m[4].endswith("/" + library) or "w" in m[3]:
                    return False
                wanted.discard((int(m[1], 16), int(m[2], 16)))
    return not wanted


_spans: dict[str, list[tuple[int, int]]] = {}  # library -> the droppable spans found in smaps the first time


@functools.cache
def _madvise():
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def release_read_only_pages(library: str = LLVM_LIBRARY) -> int:
    """Unmap the droppable pages of ``library`` (see the module's docstring); the bytes of the spans given back (0 on
    a platform without ``/proc/self/smaps`` or ``madvise``, or where the library is not loaded)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        spans = _spans.get(library)
        if spans is None or not still_mapped(spans, library):
            spans = _spans[library] = read_only_file_spans(library)
        madvise = _madvise()
    except (OSError, AttributeError):
        return 0
    return sum(end - start for start, end in spans if madvise(start, end - start, MADV_DONTNEED) == 0)


_listening: set[str] = set()


def release_after_each_compilation(library: str = LLVM_LIBRARY) -> bool:
    """Give ``library``'s droppable pages back now and whenever Numba leaves its compiler lock from now on (see the
    module's docstring); True when the listener is installed now, False when it already was or off Linux."""
    if library in _listening or not sys.platform.startswith("linux"):
        return False
    from numba.core import event

    class ReleaseOnUnlock(event.Listener):
        """When the outermost hold of Numba's (re-entrant) compiler lock ends, the pages are given back."""

        def __init__(self):
            self.depth = threading.local()  # holds by this thread

        def on_start(self, ev) -> None:
            self.depth.n = getattr(self.depth, "n", 0) + 1

        def on_end(self, ev) -> None:
            self.depth.n = getattr(self.depth, "n", 1) - 1
            if self.depth.n == 0:
                release_read_only_pages(library)

    event.register("numba:compiler_lock", ReleaseOnUnlock())
    _listening.add(library)
    release_read_only_pages(library)
    return True

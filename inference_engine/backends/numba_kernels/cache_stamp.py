"""Drop Numba's cached machine code of this package when any of its sources changed (sub-packages included).

Numba's cache (``@njit(cache=True)``: ``__pycache__/*.nbi`` index + ``*.nbc`` code) is keyed by the modification
time and size of the one file defining a kernel. Our kernels inline helpers from other files of the package
(:mod:`.simd`, :mod:`.int8`), so after an edit or a ``git pull`` that changes only a helper, Numba would load code
compiled from the old helper: silently wrong arithmetic. :func:`drop_stale_cache` keeps a digest of every source
file of the package next to the cache and removes the package's cache files when the digest changes; the next
call of each kernel compiles it once more. It costs one read of ~150 KB of sources per process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
STAMP_NAME = "kernel-sources.sha256"
CACHE_SUFFIXES = (".nbi", ".nbc")


def sources_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over the paths (relative to the package) and bytes of the package's ``*.py`` files, its sub-packages'
    included, in path order."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        h.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def drop_stale_cache(package_dir: Path = PACKAGE_DIR) -> bool:
    """Remove the Numba files of every ``__pycache__`` in the package when the sources differ from the stamp (kept
    in the package's own ``__pycache__``); True when files were dropped.

    Never fails the import: an unwritable ``__pycache__`` (a read-only install, where Numba caches elsewhere and
    sources do not change in place) leaves everything as it is.
    """
    cache = package_dir / "__pycache__"
    stamp = cache / STAMP_NAME
    digest = sources_digest(package_dir)
    try:
        if stamp.is_file() and stamp.read_text().strip() == digest:
            return False
        stale = [p for p in package_dir.rglob("__pycache__/*") if p.suffix in CACHE_SUFFIXES]
        for path in stale:
            path.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(digest + "\n")
        tmp.replace(stamp)
        return bool(stale)
    except OSError:
        return False

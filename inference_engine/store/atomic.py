"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every report, result JSON and history file the harness writes goes through here, and so does every cache of the
engine (:mod:`inference_engine.store`). The data is written to a temporary file in the *same directory* (so
``os.replace`` is a rename on one file system, atomic on POSIX and Windows), flushed and fsync'ed (a cache, which
only costs a rebuild if lost, skips the fsync: ``durable=False``), then renamed over the target. On any failure (an
exception while writing, Ctrl-C) the temporary file is removed and the target is left as it was.
:func:`atomic_directory` does the same for a whole directory of files (a report).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                durable: bool = True) -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it over ``path`` only if the block succeeds.

    ``mode`` is ``"w"`` (text) or ``"wb"`` (binary). Parent directories are created. ``durable``: fsync before the
    rename (a cache passes False: a lost write costs it a rebuild, and an fsync costs every write).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": ""}
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_open(path, "w") as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> Path:
    with atomic_open(path, "wb", durable=durable) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Serialise first, then write: an object that cannot be encoded never touches the file system."""
    text = json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n"
    return atomic_write_text(path, text)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling directory to fill; renamed to ``path`` only if the block succeeds (``path``: absent or
    an empty directory, which is replaced), removed with everything in it otherwise."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _json_default(value: Any) -> Any:
    """NumPy scalars and arrays, paths: the values results naturally contain."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

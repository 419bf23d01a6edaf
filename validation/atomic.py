"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every report, result JSON and history file the harness writes goes through here. The data is written to a
temporary file in the *same directory* (so ``os.replace`` is a rename on one file system, atomic on POSIX and
Windows), flushed and fsync'ed, then renamed over the target. On any failure (an exception while writing,
Ctrl-C) the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it over ``path`` only if the block succeeds.

    ``mode`` is ``"w"`` (text) or ``"wb"`` (binary). Parent directories are created.
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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Serialise first, then write: an object that cannot be encoded never touches the file system."""
    text = json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n"
    return atomic_write_text(path, text)


def _json_default(value: Any) -> Any:
    """NumPy scalars and arrays, paths: the values results naturally contain."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

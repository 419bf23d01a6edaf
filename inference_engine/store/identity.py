"""A file's identity: what is derived from a file (its sha256, its tokenizer, a probe's verdict, a weight read by
name) is valid while the file's identity is the one recorded with it."""

from __future__ import annotations

import os
from typing import Any


def file_identity(path: str | os.PathLike, st: os.stat_result | None = None) -> dict[str, Any]:
    """``{"path", "device", "inode", "size", "mtime_ns"}`` of the file at ``path`` (its real path): a changed or
    replaced file (a re-download, a copy over it) has another. ``st``: a stat already taken (``os.fstat`` of an open
    file, or one taken before mapping it), else the path is stat'ed now."""
    real = os.path.realpath(path)
    st = os.stat(real) if st is None else st
    return {"path": real, "device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

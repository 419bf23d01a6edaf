"""The sha256 of a model file, computed once per version of the file.

Every result records its model's sha256; hashing a 1.1 GB file takes seconds, and a compare asks for it in several
places. The digest is kept in ``<cache>/digests`` (one small JSON file per model path) together with the file's size
and modification time (its :func:`~inference_engine.store.identity.file_identity`), and reused while they are
unchanged; :mod:`inference_engine.store.named_models` records the digest it verified when it fetched a named model, so
those are never hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from inference_engine.store.atomic import atomic_write_bytes
from inference_engine.store.folders import cache_folder
from inference_engine.store.identity import file_identity
from inference_engine.store.slots import prune, slot_path

MAX_SLOTS = 256  # test suites hash many temporary files; the oldest records go first


def default_dir() -> Path:
    return cache_folder("digests")


def sha256_of_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """sha256 of the file's bytes, computed now."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike, folder: Path | None = None) -> str:
    """sha256 of ``path``: the remembered one while the file is unchanged, else computed (and remembered)."""
    identity = file_identity(path)
    try:
        entry = json.loads(slot_path(folder or default_dir(), identity["path"]).read_bytes())
        if entry.get("identity") == identity and len(entry.get("sha256", "")) == 64:
            return str(entry["sha256"])
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    digest = sha256_of_file(path)
    remember(path, digest, folder)
    return digest


def remember(path: str | os.PathLike, digest: str, folder: Path | None = None) -> None:
    """Record ``digest`` as the sha256 of the file now at ``path`` (a read-only cache is skipped silently)."""
    try:
        identity = file_identity(path)
        folder = folder or default_dir()
        folder.mkdir(parents=True, exist_ok=True)
        record = json.dumps({"identity": identity, "sha256": digest}).encode()
        atomic_write_bytes(slot_path(folder, identity["path"]), record, durable=False)
        prune(folder, MAX_SLOTS)
    except OSError:
        pass

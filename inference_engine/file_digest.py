"""The sha256 of a model file, computed once per version of the file.

Every result records its model's sha256; hashing a 1.1 GB file takes seconds, and a compare asks for it in several
places. The digest is kept in ``<cache>/digests`` (one small JSON file per model path) together with the file's size
and modification time, and reused while both are unchanged; :mod:`inference_engine.model_cache` records the digest it
verified when it fetched a named model, so those are never hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from inference_engine.gguf_file import sha256_of_file
from inference_engine.tokenizer_cache import file_identity, prune, write_atomically

MAX_SLOTS = 256  # test suites hash many temporary files; the oldest records go first


def default_dir() -> Path:
    from inference_engine.model_cache import cache_dir

    return cache_dir().parent / "digests"


def _slot(identity: dict, folder: Path) -> Path:
    return folder / (hashlib.sha256(identity["path"].encode()).hexdigest()[:24] + ".json")


def file_sha256(path: str | os.PathLike, folder: Path | None = None) -> str:
    """sha256 of ``path``: the remembered one while the file is unchanged, else computed (and remembered)."""
    identity = file_identity(path)
    try:
        entry = json.loads(_slot(identity, folder or default_dir()).read_bytes())
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
        write_atomically(_slot(identity, folder), json.dumps({"identity": identity, "sha256": digest}).encode())
        prune(folder, MAX_SLOTS)
    except OSError:
        pass

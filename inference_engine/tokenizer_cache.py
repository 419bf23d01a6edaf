"""A disk cache of built tokenizers: the second start of a model does not rebuild its tokenizer.

Building a :class:`~inference_engine.tokenizer.GGUFTokenizer` from a 150k-262k-token GGUF vocabulary takes about a
second (reading the arrays, llama.cpp's special-token rules, every token's piece, the BPE merge table), against
llama.cpp's milliseconds. Everything that build derives from the file is stored here once, as JSON (no pickles)
plus, for SentencePiece vocabularies, the serialized model, and read back on the next start.

One slot per model file (named by a hash of its real path), valid while the file's size and modification time are
those recorded: a changed or replaced file misses and its slot is rewritten. Small vocabularies are not cached
(their build costs less than reading a cache file). Slots are written atomically (temporary file, then
``os.replace``); at most :data:`MAX_SLOTS` are kept, the least recently written go first. The folder is
``<cache>/tokenizers`` next to the named models' ``<cache>/models`` (see
:mod:`inference_engine.model_cache`); delete it to clear the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# Bump when what is stored, or how a tokenizer is built from it, changes: older slots are then ignored.
FORMAT = 2
# Below this many tokens a build takes a few tens of milliseconds, no more than reading a cache file.
MIN_VOCAB = 20_000
MAX_SLOTS = 64


def default_dir() -> Path:
    from inference_engine.model_cache import cache_dir

    return cache_dir().parent / "tokenizers"


def file_identity(path: str | os.PathLike) -> dict[str, Any]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _slot(identity: dict[str, Any], folder: Path) -> Path:
    return folder / (hashlib.sha256(identity["path"].encode()).hexdigest()[:24] + ".json")


def load(path: str | os.PathLike, folder: Path | None = None) -> dict[str, Any] | None:
    """The stored state for this file, or None (no slot, another format, or the file changed since)."""
    try:
        identity = file_identity(path)
        slot = _slot(identity, folder or default_dir())
        state = json.loads(slot.read_bytes())
        if state.get("format") != FORMAT or state.get("identity") != identity:
            return None
        if state.get("spm_file"):
            state["spm_proto"] = (slot.parent / state["spm_file"]).read_bytes()
        return state
    except (OSError, ValueError, TypeError, KeyError):
        return None


def store(path: str | os.PathLike, state: dict[str, Any], folder: Path | None = None) -> Path | None:
    """Write ``state`` (JSON-able, plus optional ``spm_proto`` bytes) for this file; None if it could not be."""
    try:
        identity = file_identity(path)
        folder = folder or default_dir()
        folder.mkdir(parents=True, exist_ok=True)
        slot = _slot(identity, folder)
        state = {"format": FORMAT, "identity": identity, **state}
        proto = state.pop("spm_proto", None)
        if proto is not None:
            state["spm_file"] = slot.stem + ".spm.model"
            write_atomically(folder / state["spm_file"], proto)
        write_atomically(slot, json.dumps(state, ensure_ascii=False).encode("utf-8"))
        prune(folder, MAX_SLOTS)
        return slot
    except OSError:
        return None  # a read-only or full cache only costs a rebuild next time


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def prune(folder: Path, max_slots: int) -> None:
    """Keep the ``max_slots`` most recently written slots (``*.json`` and their sidecars) in ``folder``."""
    slots = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in slots[max_slots:]:
        for p in (old, old.with_suffix(".spm.model")):
            try:
                p.unlink()
            except OSError:
                pass

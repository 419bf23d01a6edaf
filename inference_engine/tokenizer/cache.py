"""A disk cache of built tokenizers: the second start of a model does not rebuild its tokenizer.

Building a :class:`~inference_engine.tokenizer.GGUFTokenizer` from a 150k-262k-token GGUF vocabulary takes about a
second (reading the arrays, llama.cpp's special-token rules, every token's piece, the BPE merge table), against
llama.cpp's milliseconds. Everything that build derives from the file is stored here once and read back on the next
start: a small JSON slot (flags, special ids, the special tokens' texts) with sidecar files, none of them pickles:
the token texts, attributes and scores, a hash index of the texts and (BPE) the merges as id triples, as one ``.npz``
(not a JSON list: 262,144 strings parsed into 40 MB of Python objects; :mod:`inference_engine.tokenizer.subvocab`
builds each text's small model from these arrays), and the model the
tokenizer runs, which its library reads itself: the SentencePiece ``ModelProto``, or for BPE the ``vocab.json`` /
``merges.txt`` pair that ``tokenizers`` loads in Rust (no Python tuple per merge).

One slot per model file and format (named by a hash of both), valid while the file's size and modification time are
those recorded (:func:`~inference_engine.store.identity.file_identity`): a changed or replaced file misses and its
slot is rewritten. Small vocabularies are not cached (their build costs less than reading a cache file). Every file
is written atomically (:mod:`inference_engine.store.atomic`), the sidecars first under fresh names and the slot last,
so a slot only ever names complete sidecars; at most :data:`MAX_SLOTS` are kept, the least recently written go first
(:mod:`inference_engine.store.slots`). The folder is ``<cache>/tokenizers`` next to the named models'
``<cache>/models`` (:mod:`inference_engine.store.folders`); delete it to clear the cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from inference_engine.store.atomic import atomic_write_bytes
from inference_engine.store.folders import cache_folder
from inference_engine.store.identity import file_identity
from inference_engine.store.slots import prune, remove_sidecars, slot_path

# Bump when what is stored, or how a tokenizer is built from it, changes: older slots are then ignored.
FORMAT = 4
# Below this many tokens a build takes a few tens of milliseconds, no more than reading a cache file.
MIN_VOCAB = 20_000
MAX_SLOTS = 64
# State entries kept beside the slot as files (bytes when stored; ``load`` hands back their paths in
# ``state["sidecars"]``), and the suffix of each file's name.
SIDECARS: dict[str, str] = {
    "vocab_arrays": ".vocab.npz",
    "spm_proto": ".spm.model",
    "bpe_vocab": ".bpe-vocab",
    "bpe_merges": ".bpe-merges",
}


def default_dir() -> Path:
    return cache_folder("tokenizers")


def _slot(identity: dict[str, Any], folder: Path) -> Path:
    # the format in the name: two versions of this code (two checkouts, an upgrade) keep a slot each, not one that
    # each rewrites in turn
    return slot_path(folder, f"{FORMAT}:{identity['path']}")


def load(path: str | os.PathLike, folder: Path | None = None) -> dict[str, Any] | None:
    """The stored state for this file, or None (no slot, another format, the file changed since, or a sidecar is
    missing). ``state["sidecars"]`` maps each sidecar's key to its path."""
    try:
        identity = file_identity(path)
        slot = _slot(identity, folder or default_dir())
        state = json.loads(slot.read_bytes())
        if state.get("format") != FORMAT or state.get("identity") != identity:
            return None
        files = {key: slot.parent / name for key, name in state.get("sidecars", {}).items()}
        if any(key not in SIDECARS or not p.is_file() for key, p in files.items()):
            return None
        state["sidecars"] = files
        return state
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(path: str | os.PathLike, state: dict[str, Any], folder: Path | None = None) -> Path | None:
    """Write ``state`` for this file: JSON-able entries in the slot, the :data:`SIDECARS` entries (bytes) as files
    beside it; None if it could not be written."""
    try:
        identity = file_identity(path)
        folder = folder or default_dir()
        folder.mkdir(parents=True, exist_ok=True)
        slot = _slot(identity, folder)
        state = {"format": FORMAT, "identity": identity, **state}
        tag = os.urandom(4).hex()  # fresh names: a reader of the previous slot keeps reading its own sidecars
        names = {}
        for key, suffix in SIDECARS.items():
            data = state.pop(key, None)
            if data is not None:
                names[key] = f"{slot.stem}.{tag}{suffix}"
                atomic_write_bytes(folder / names[key], data, durable=False)
        state["sidecars"] = names
        atomic_write_bytes(slot, json.dumps(state, ensure_ascii=False).encode("utf-8"), durable=False)
        remove_sidecars(slot, keep=set(names.values()))
        prune(folder, MAX_SLOTS)
        return slot
    except OSError:
        return None  # a read-only or full cache only costs a rebuild next time


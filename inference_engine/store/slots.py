"""A cache folder of slots: one small JSON file per key (named by a hash of it), with sidecar files beside it named
``<slot stem>.*``; at most a given number of slots are kept, the least recently written go first."""

from __future__ import annotations

import hashlib
from pathlib import Path


def slot_path(folder: Path, key: str) -> Path:
    """The slot of ``key`` in ``folder``."""
    return folder / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def prune(folder: Path, max_slots: int) -> None:
    """Keep the ``max_slots`` most recently written slots (``*.json`` and their sidecars) in ``folder``."""
    slots = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in slots[max_slots:]:
        remove_sidecars(old)
        try:
            old.unlink()
        except OSError:
            pass


def remove_sidecars(slot: Path, keep: frozenset[str] | set[str] = frozenset()) -> None:
    """Delete the files beside ``slot`` that belong to it (``<stem>.*`` other than the slot), except ``keep``."""
    for p in slot.parent.glob(f"{slot.stem}.*"):
        if p != slot and p.name not in keep and not p.name.endswith(".tmp"):
            try:
                p.unlink()
            except OSError:
                pass

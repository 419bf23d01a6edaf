"""Where the caches live: the named models in ``$GGUF_PARITY_CACHE`` (else ``~/.cache/gguf-parity/models``, under
``$XDG_CACHE_HOME`` when set), every other cache (digests, tokenizers, probes) in a folder beside it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GGUF_PARITY_CACHE"


def cache_dir() -> Path:
    """``$GGUF_PARITY_CACHE``, else the XDG cache directory (``~/.cache/gguf-parity/models``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gguf-parity" / "models"


def cache_folder(name: str) -> Path:
    """The folder of one cache (``digests``, ``tokenizers``, ...): beside the named models' :func:`cache_dir`."""
    return cache_dir().parent / name

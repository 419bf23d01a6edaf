"""The process-wide tricks of the fast CPU path, applied by one explicit call: :func:`configure`.

Each trick changes state the whole process shares (Numba's internals, glibc's allocator, LLVM's mapped pages), so
none is applied when a module is imported: the Numba backend calls :func:`configure` when it is constructed (the
engine chose it), and the CLI's ``--platform-tricks on|off`` (or ``GGUF_PARITY_PLATFORM_TRICKS=on|off``) decides
whether it applies them. A process that only imports ``inference_engine`` (or runs llama.cpp alone, or the NumPy
backend) keeps the process as Python, Numba and glibc set it. Each trick is one module, with the measurement that
keeps it in its docstring:

- :mod:`.numba_startup`: a cached kernel loads without SciPy's ``linalg``, without Numba's full context refresh,
  with Numba's runtime kept compiled on disk and its bitcode parsed only for linking (cold start).
- :mod:`.malloc_threshold`: glibc's mmap and trim thresholds pinned (LLVM's freed blocks go back to the OS; a
  prefill's per-layer activations stay in the heap).
- :mod:`.library_pages`: LLVM's pages that only its loading and linking touch are unmapped after each compile.

Also here, with no process-wide state of their own: :mod:`.mapped_pages` (a weight read from the file, not through
the map, and mapped pages given back: the GGUF reader and every backend use it) and :mod:`.numba_interrupts`
(Ctrl-C held during a Numba compile, which the Numba kernels install when the backend is built: not a trick, it
keeps a run's exit status right).

:func:`configure` applies the tricks once per process (later calls return the same record) and returns what was
applied; :func:`applied` gives that record to provenance (``validation.provenance``), so a result says whether the
process it was measured in, llama.cpp included when ``compare`` runs it beside our engine, had them.
"""

from __future__ import annotations

import os
from typing import Any

from inference_engine.errors import GGUFParityError

ENV = "GGUF_PARITY_PLATFORM_TRICKS"
SWITCH = {"on": True, "off": False}
# trick -> what it changes, in the order configure applies them (the Numba patches before anything compiles)
TRICKS = {
    "numba_blas_probe_deferred": "numba.np.arraymath imports without scipy.linalg (its BLAS probe runs on first use)",
    "numba_cached_kernels_load_lightly": "numba Cache.load_overload initializes the NRT only, no context refresh",
    "numba_nrt_kept_compiled": "numba nrtdynmod.compile_nrt_functions loads the NRT's machine code kept on disk",
    "numba_bitcode_parsed_for_linking_only": "numba CPUCodeLibrary._unserialize keeps a cached kernel's bitcode",
    "malloc_thresholds_pinned": "glibc M_MMAP_THRESHOLD 32 MiB and M_TRIM_THRESHOLD 128 MiB (mallopt)",
    "llvm_pages_released_after_compiles": "libllvmlite.so's clean read-only pages unmapped after each compile",
}

_record: dict[str, Any] | None = None


def switch_from_env() -> bool:
    """``GGUF_PARITY_PLATFORM_TRICKS``: ``on`` (the default, unset or empty) or ``off``; anything else is refused."""
    value = os.environ.get(ENV, "").strip().lower() or "on"
    if value not in SWITCH:
        raise GGUFParityError(f"{ENV}={os.environ[ENV]!r} is not supported: use one of {', '.join(SWITCH)}")
    return SWITCH[value]


def configure(enabled: bool | None = None, by: str | None = None) -> dict[str, Any]:
    """Apply the process-wide tricks once (``enabled``: None reads :data:`ENV`); returns the record: ``enabled``,
    ``by`` (who decided: the caller's name, or the variable), and per trick of :data:`TRICKS` whether this call put
    it in effect (False when switched off, or where this platform or Numba version has no such thing: each trick
    checks what it replaces first). The first call decides; a later one returns the same record, whatever it asks
    (a patched process cannot be unpatched)."""
    global _record
    if _record is not None:
        return dict(_record)
    if enabled is None:
        enabled, by = switch_from_env(), by or (ENV if os.environ.get(ENV, "").strip() else "default")
    record: dict[str, Any] = {"enabled": bool(enabled), "by": by or "configure()"}
    record.update(dict.fromkeys(TRICKS, False))
    if enabled:
        record.update(_apply())
    _record = record
    return dict(record)


def _apply() -> dict[str, bool]:
    """Every trick, in :data:`TRICKS`' order; each answers whether it is in effect now."""
    from inference_engine.platform import library_pages, malloc_threshold, numba_startup

    done = {
        "numba_blas_probe_deferred": numba_startup.defer_blas_probe(),
        "numba_cached_kernels_load_lightly": numba_startup.load_cached_kernels_lightly(),
        "numba_nrt_kept_compiled": numba_startup.cache_nrt_library(),
        "numba_bitcode_parsed_for_linking_only": numba_startup.defer_linking_bitcode(),
        "malloc_thresholds_pinned": malloc_threshold.pin_mmap_threshold(),
        "llvm_pages_released_after_compiles": library_pages.release_after_each_compilation(),
    }
    return done


def applied() -> dict[str, Any]:
    """The record of :func:`configure` in this process (``{"configured": False}`` before any call): what provenance
    records."""
    return {"configured": False} if _record is None else {"configured": True, **_record}

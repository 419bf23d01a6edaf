"""Backends by name: ``get_backend("numpy" | "numba" | "mlx", numerics, n_threads)``.

Each backend lives in its own module and is imported only when asked for, so a missing optional library (numba,
mlx) only matters to someone who picks that backend, and then as one line saying what to install.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from inference_engine.backends.base import KV_TYPES, NUMERICS, Backend, check_numerics
from inference_engine.errors import GGUFParityError

__all__ = ["BACKENDS", "KV_TYPES", "NUMERICS", "Backend", "backend_names", "get_backend"]


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    needs: str  # the third-party package it imports
    install: str  # what to run when it is missing


BACKENDS: dict[str, BackendEntry] = {
    "numpy": BackendEntry("inference_engine.backends.numpy_ref", "NumpyBackend", "numpy", "pip install numpy"),
    "numba": BackendEntry("inference_engine.backends.numba_cpu", "NumbaBackend", "numba", "pip install numba"),
    "mlx": BackendEntry(
        "inference_engine.backends.mlx_backend", "MLXBackend", "mlx", "pip install 'gguf-parity[mlx]'"
    ),
}


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def get_backend(name: str = "numpy", numerics: str = "f32", n_threads: int | None = None) -> Backend:
    """A ready backend; unknown names / numerics and missing libraries raise :class:`GGUFParityError`."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise GGUFParityError(f"unknown backend '{name}'; supported: {', '.join(BACKENDS)}")
    check_numerics(numerics)
    if n_threads is not None and n_threads < 1:
        raise GGUFParityError(f"--threads must be at least 1, got {n_threads}")
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == entry.module:
            raise GGUFParityError(
                f"backend '{name}' is not part of this installation ({entry.module} missing)"
            ) from None
        if missing.split(".")[0] == entry.needs:
            raise GGUFParityError(f"backend '{name}' needs the {entry.needs} package: {entry.install}") from None
        raise
    except ImportError as exc:  # the package is there but its native library would not load
        raise GGUFParityError(f"backend '{name}' could not load {entry.needs}: {exc}") from None
    cls = getattr(module, entry.cls, None)
    if cls is None:
        raise GGUFParityError(f"backend '{name}': {entry.module} defines no {entry.cls}")
    return cls(numerics=numerics, n_threads=n_threads)

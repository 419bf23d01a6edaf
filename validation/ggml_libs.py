"""The one place that finds llama.cpp's libraries (llama-cpp-python's ``llama_cpp/lib/``).

Used by the ctypes bindings to ggml's tensor API (:mod:`validation.ggml_ctypes`), the ggml kernel oracle
(:mod:`validation.ggml_oracle`) and the build identity recorded with results (``bench_compare.results``). The engine
(``inference_engine``) never locates or loads these libraries: what it needs to know about the llama.cpp being matched
is handed to it by the harness.

llama-cpp-python's wheel ships each library as separate copies (``libggml-base.so``, ``.so.0``, ``.so.0.25.3``), not
links; ``libllama.so`` links to the ``.so.0`` one. Loading a different copy gives a second instance of the library
with its own state, so each caller says which name it wants first.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from inference_engine.errors import GGUFParityError

# The copy libllama.so links to first (what llama.cpp itself runs), then the others.
LINKED_FIRST = (".so.0", ".so", ".dylib", ".dll")
# The unversioned name first (what a standalone dlopen of the library would pick).
PLAIN_FIRST = (".so", ".so.0", ".dylib", ".dll")


def llama_cpp_lib_dir() -> Path:
    """``llama_cpp/lib`` of the installed llama-cpp-python (found without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        raise GGUFParityError("llama-cpp-python is not installed; this needs llama-cpp-python==0.3.36")
    return Path(spec.origin).resolve().parent / "lib"


def library_path(stem: str, suffixes: tuple[str, ...] = LINKED_FIRST) -> Path:
    """The path of ``stem`` (e.g. ``"libggml-base"``) in :func:`llama_cpp_lib_dir`, first suffix found wins."""
    lib_dir = llama_cpp_lib_dir()
    for suffix in suffixes:
        path = lib_dir / f"{stem}{suffix}"
        if path.exists():
            return path
    raise GGUFParityError(f"{stem} not found in {lib_dir}")


def load_library(stem: str, suffixes: tuple[str, ...] = LINKED_FIRST, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL:
    """``ctypes.CDLL`` of :func:`library_path`; a library that will not load is one :class:`GGUFParityError` line."""
    path = library_path(stem, suffixes)
    try:
        return ctypes.CDLL(str(path), mode=mode)
    except OSError as exc:
        raise GGUFParityError(f"cannot load {path}: {exc}") from None

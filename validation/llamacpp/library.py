"""Process-wide llama.cpp state: backend initialisation, log routing and build identity.

llama.cpp keeps one log callback per process (``llama_log_set`` also sets ggml's). By default llama-cpp-python routes
every load message to stderr; a reference engine that prints hundreds of lines per model load drowns the harness's
own output, so engines silence it unless asked to be verbose. The ctypes callback objects live here, at module
level, because llama.cpp keeps the raw function pointer for the life of the process.
"""

from __future__ import annotations

import ctypes
import sys
from collections import deque
from functools import lru_cache

import llama_cpp
from llama_cpp import llama_cpp as ll

# enum ggml_log_level in ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
GGML_LOG_LEVEL_DEBUG = 1
GGML_LOG_LEVEL_ERROR = 4

# The last non-debug lines llama.cpp logged, (level, text), kept even when silenced: an error line says why a model
# failed to load, and info lines say what "auto" settings resolved to.
_recent: deque[tuple[int, str]] = deque(maxlen=256)


def _remember(level: int, text: bytes) -> str:
    line = (text or b"").decode("utf-8", "replace")
    if level != GGML_LOG_LEVEL_DEBUG and line.strip():
        _recent.append((level, " ".join(line.split())))
    return line


# Set when Ctrl-C arrived inside a log callback (where ctypes would swallow the KeyboardInterrupt); the engine calls
# raise_if_interrupted() after each llama.cpp call that logs (model load, context creation).
_interrupted = False


@ll.llama_log_callback
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _interrupted
    try:
        _remember(level, text)
    except KeyboardInterrupt:
        _interrupted = True


@ll.llama_log_callback
def _stderr_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _interrupted
    try:
        sys.stderr.write(_remember(level, text))
        sys.stderr.flush()
    except KeyboardInterrupt:
        _interrupted = True


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt a log callback had to hold back (see ``_interrupted``)."""
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt


def clear_log() -> None:
    _recent.clear()


def recent_log() -> list[str]:
    """Lines logged since :func:`clear_log` (the last 256)."""
    return [text for _, text in _recent]


def last_error() -> str | None:
    """The most telling error line llama.cpp logged since :func:`clear_log` (the one saying "error loading")."""
    errors = [text for level, text in _recent if level == GGML_LOG_LEVEL_ERROR]
    for line in reversed(errors):
        if "error loading model:" in line:
            return line.split("error loading model:", 1)[1].strip()
    return errors[-1] if errors else None


def set_llama_logging(verbose: bool) -> None:
    """Route llama.cpp and ggml log lines to stderr (verbose) or nowhere (the default for our engines)."""
    ll.llama_log_set(_stderr_log if verbose else _silent_log, ctypes.c_void_p(0))


@lru_cache(maxsize=1)
def init_backend() -> None:
    """``llama_backend_init`` once per process (it sets up ggml's time and f16 tables)."""
    ll.llama_backend_init()


@lru_cache(maxsize=1)
def build_info() -> dict[str, str]:
    """Versions that identify the reference build, for self-describing results."""
    from validation.ggml_ctypes import libggml_base

    lib = libggml_base()
    info = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_version": ll.llama_version().decode(),
        "system_info": ll.llama_print_system_info().decode().strip(" |"),
    }
    for name in ("ggml_version", "ggml_commit"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            fn.argtypes = []
            info[name] = (fn() or b"").decode()
    return info


@lru_cache(maxsize=1)
def simd_flavour() -> str:
    """The SIMD flavour llama.cpp's CPU backend was compiled for, from its system info: ``"avx512"`` (``AVX512 =
    1``), ``"neon"`` (``NEON = 1``) or ``"avx2"`` (everything else on x86, whose exp/SiLU share the AVX2 formulas)."""
    flags = {}
    for part in ll.llama_print_system_info().decode(errors="replace").split("|"):
        key, _, value = part.partition("=")
        flags[key.strip().split(":")[-1].strip()] = value.strip()
    if flags.get("AVX512") == "1":
        return "avx512"
    if flags.get("NEON") == "1":
        return "neon"
    return "avx2"

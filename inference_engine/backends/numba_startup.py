"""Numba's start-up, made cheaper: no SciPy linear algebra, no full context refresh to load a cached kernel.

The first time a process compiles a kernel (and, in Numba as shipped, loads one from its cache), Numba installs its
whole library of implementations (``BaseContext.refresh``). One of them, ``numba.np.arraymath``, decides at import
time whether a BLAS is available for ``np.correlate`` / ``np.convolve`` (``_HAVE_BLAS = _check_blas()``), and the
check imports ``scipy.linalg.cython_blas``, i.e. the whole ``scipy.linalg`` package: measured on a 2-core AMD EPYC,
330 ms and 17 MB of resident memory in every cold start, for a probe whose answer our kernels never read.

:func:`defer_blas_probe` installs an import hook: whenever ``numba.np.arraymath`` is imported, it runs with
``scipy.linalg`` held back (for the importing thread only), then the ``False`` that import recorded is replaced with
:class:`DeferredBlasCheck`, which runs Numba's own ``_check_blas`` the first time anything asks (a user's ``@njit``
code calling ``np.correlate``), and answers what it answers. So Numba behaves as before, only the probe moves to
first use; and a process that never loads Numba's registries (below) never imports ``arraymath`` at all. Where
Numba's module does not read as expected (another version) nothing is changed.

:func:`load_cached_kernels_lightly`: Numba's ``Cache.load_overload`` refreshes the whole target context before it
loads a kernel from the on-disk cache (``target_context.refresh()``: Numba's ~40 implementation modules imported and
every typing and lowering registry installed, the NRT compiled), although rebuilding a cached kernel needs only the
NRT its machine code links against: the refresh serves compilation, and Numba's compiler does its own
(``CompilerBase.__init__`` refreshes both contexts). So the replacement initializes the NRT and loads; a process that
only runs cached kernels never pays for the refresh, and one that compiles something pays it then, as before.
Measured on a 2-core AMD EPYC, SmolLM2 from the start of its imports to its first token, fresh processes, 6
alternating runs: 1420 -> 1177 ms on average. Installed only where Numba's method reads exactly as expected
(``LOAD_OVERLOAD_SOURCE``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import textwrap
import threading

ARRAYMATH = "numba.np.arraymath"
PROBE_LINE = "_HAVE_BLAS = _check_blas()"  # what this workaround relies on, checked in Numba's source first
HELD_BACK = "scipy.linalg"
# Numba's Cache.load_overload as of Numba 0.68, which load_cached_kernels_lightly replaces (any other text: no change)
LOAD_OVERLOAD_SOURCE = '''\
def load_overload(self, sig, target_context):
    """
    Load and recreate the cached object for the given signature,
    using the *target_context*.
    """
    # Refresh the context to ensure it is initialized
    target_context.refresh()
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)
    # None returned if the `with` block swallows an exception
'''


class DeferredBlasCheck:
    """Stands for Numba's ``_HAVE_BLAS``: truthy exactly when Numba's ``_check_blas()`` is, computed on first use."""

    def __init__(self, check):
        self._check = check
        self._answer: bool | None = None

    def __bool__(self) -> bool:
        if self._answer is None:
            self._answer = bool(self._check())
        return self._answer

    def __repr__(self) -> str:
        return f"DeferredBlasCheck({'not run yet' if self._answer is None else self._answer})"


class _HoldBack(importlib.abc.MetaPathFinder):
    """Refuses ``HELD_BACK`` and its submodules to imports made by one thread, while installed."""

    def __init__(self, thread: int):
        self.thread = thread

    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == self.thread and (name == HELD_BACK or name.startswith(HELD_BACK + ".")):
            raise ImportError(f"{name} is held back while Numba's registries load (inference_engine.backends."
                              "numba_startup)")


class _ArraymathHook(importlib.abc.MetaPathFinder):
    """Waits for ``ARRAYMATH``'s import (whenever Numba's registries load it) and hands it a loader that runs it
    with the probe deferred; removes itself at that import."""

    def find_spec(self, name, path=None, target=None):
        if name != ARRAYMATH:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ProbeDeferringLoader(spec.loader)
        return spec


class _ProbeDeferringLoader(importlib.abc.Loader):
    """Runs ``ARRAYMATH`` with ``HELD_BACK`` refused to this thread, then swaps its recorded ``False`` for a
    :class:`DeferredBlasCheck`; the module ends with its own loader, as if imported plainly."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        held = _HoldBack(threading.get_ident())
        sys.meta_path.insert(0, held)
        try:
            self.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - whatever went wrong held back, Numba must still import as it always did
            sys.meta_path.remove(held)
            self.loader.exec_module(module)
        else:
            sys.meta_path.remove(held)
            if getattr(module, "_HAVE_BLAS", None) is False and callable(getattr(module, "_check_blas", None)):
                module._HAVE_BLAS = DeferredBlasCheck(module._check_blas)
        finally:
            module.__loader__ = self.loader
            module.__spec__.loader = self.loader


def defer_blas_probe() -> bool:
    """Arrange for Numba's ``arraymath``, whenever it is imported, to skip its SciPy probe (see the module
    docstring); True when arranged now, False when there was nothing to do (already imported or arranged, SciPy's
    linalg already loaded, or a Numba whose source does not have the expected line)."""
    if ARRAYMATH in sys.modules or HELD_BACK in sys.modules:
        return False
    if any(isinstance(f, _ArraymathHook) for f in sys.meta_path) or not _source_has_probe():
        return False
    sys.meta_path.insert(0, _ArraymathHook())
    return True


def _source_has_probe() -> bool:
    try:
        spec = importlib.util.find_spec(ARRAYMATH)
        source = spec.loader.get_source(ARRAYMATH) if spec and spec.loader else None
    except (ImportError, AttributeError, OSError):
        return False
    return bool(source) and PROBE_LINE in source


def load_cached_kernels_lightly() -> bool:
    """Replace Numba's ``Cache.load_overload`` with one that initializes only the NRT before loading a cached
    kernel (see the module docstring); True when installed now, False when already installed or when Numba's method
    does not read as expected (then Numba is left as it is)."""
    from numba.core import caching

    if getattr(caching.Cache.load_overload, "lightly", False):
        return False
    try:
        source = textwrap.dedent(inspect.getsource(caching.Cache.load_overload))
    except (OSError, TypeError):
        return False
    if source != LOAD_OVERLOAD_SOURCE:
        return False
    caching.Cache.load_overload = _load_overload_lightly
    return True


def _load_overload_lightly(self, sig, target_context):
    """Numba's ``Cache.load_overload`` with ``target_context.refresh()`` narrowed to what a cached kernel needs."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)  # the NRT functions the cached machine code calls (allocation, refcounts)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


_load_overload_lightly.lightly = True

"""Keep Numba's start-up from importing SciPy's linear algebra, which no kernel of ours uses.

The first time a process loads a cached kernel, Numba installs its whole library of implementations
(``BaseContext.refresh``). One of them, ``numba.np.arraymath``, decides at import time whether a BLAS is available
for ``np.correlate`` / ``np.convolve`` (``_HAVE_BLAS = _check_blas()``), and the check imports
``scipy.linalg.cython_blas``, i.e. the whole ``scipy.linalg`` package: measured on a 2-core AMD EPYC, 330 ms and
17 MB of resident memory in every cold start, for a probe whose answer our kernels never read.

:func:`defer_blas_probe` imports ``numba.np.arraymath`` with ``scipy.linalg`` held back (for this thread only), then
replaces the ``False`` that import recorded with :class:`DeferredBlasCheck`, which runs Numba's own ``_check_blas``
the first time anything asks (a user's ``@njit`` code calling ``np.correlate``), and answers what it answers. So
Numba behaves as before, only the probe moves to first use. Where Numba's module does not read as expected (another
version) nothing is changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading

ARRAYMATH = "numba.np.arraymath"
PROBE_LINE = "_HAVE_BLAS = _check_blas()"  # what this workaround relies on, checked in Numba's source first
HELD_BACK = "scipy.linalg"


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


def defer_blas_probe() -> bool:
    """Import Numba's ``arraymath`` without its SciPy probe (see the module docstring); True when the probe was
    deferred, False when there was nothing to do (already imported, SciPy's linalg already loaded, or a Numba whose
    source does not have the expected line)."""
    if ARRAYMATH in sys.modules or HELD_BACK in sys.modules:
        return False
    if not _source_has_probe():
        return False
    finder = _HoldBack(threading.get_ident())
    sys.meta_path.insert(0, finder)
    try:
        from numba.np import arraymath
    except Exception:  # noqa: BLE001 - whatever went wrong held back, Numba must still import as it always did
        sys.meta_path.remove(finder)
        import numba.np.arraymath  # noqa: F401

        return False
    sys.meta_path.remove(finder)
    if arraymath._HAVE_BLAS is False and callable(getattr(arraymath, "_check_blas", None)):
        arraymath._HAVE_BLAS = DeferredBlasCheck(arraymath._check_blas)
        return True
    return False


def _source_has_probe() -> bool:
    try:
        spec = importlib.util.find_spec(ARRAYMATH)
        source = spec.loader.get_source(ARRAYMATH) if spec and spec.loader else None
    except (ImportError, AttributeError, OSError):
        return False
    return bool(source) and PROBE_LINE in source

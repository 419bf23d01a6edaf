"""A first run's kernel compile is announced before the wait, not passed in silence (issue 34).

Numba compiles each of our kernels on its first call where its cache holds no machine code for it (a new install,
another CPU or Numba version, a changed kernel source) and keeps the code for every later process
(``cache=True``). Compiling what one model needs takes most of a minute: SmolLM2 with nothing cached, 2 threads on
a 2-core AMD EPYC, 36 s for a 4-token ``generate`` and ~46 s for ``compare``'s tests. A first ``generate`` used to
wait without a word, and a first ``compare`` measured the wait inside its first repetition.

:func:`install_listener` (run when ``numba_kernels`` is imported) listens to Numba's ``numba:compile`` event, which
Numba emits for a real compilation only, never for a kernel loaded from its cache. The first compilation of one of
our kernels in a process calls the announcer the application set (:func:`set_announcer`: the CLI prints
:data:`NOTICE` on stderr; a library user who sets none sees nothing), once. :data:`NOTICE` gives no precise time:
which kernels compile depends on the model and on what is already cached (one new tensor type: seconds), so it
says the bound measured above. :func:`kernels_compiled` counts them (``compare`` checks its warm-up with it).

This module imports nothing heavy (the CLI sets the announcer for every command); Numba only in
:func:`install_listener`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

NOTICE = "compiling kernels for this CPU, once: up to about a minute"
# Our kernels' modules: a compile of anything else (Numba's own helpers, compiled inside ours; a plug-in's @njit)
# is not announced.
KERNEL_MODULE_PREFIX = "inference_engine."

Announcer = Callable[[str], None]

_announcer: Announcer | None = None
_announced = False
_compiled = 0
_installed = False


def set_announcer(announcer: Announcer | None) -> Announcer | None:
    """Who is told when kernels start compiling (called with :data:`NOTICE`); returns the previous announcer."""
    global _announcer
    previous, _announcer = _announcer, announcer
    return previous


@contextmanager
def announcing(announcer: Announcer) -> Iterator[None]:
    """:func:`set_announcer` for the duration of a block (compare prints past its progress bar)."""
    previous = set_announcer(announcer)
    try:
        yield
    finally:
        set_announcer(previous)


def kernels_compiled() -> int:
    """How many of our kernels this process has compiled (not loaded from Numba's cache) so far."""
    return _compiled


def kernel_compile_started(module: str) -> None:
    """A compilation of a function of ``module`` begins: count ours, announce the first one once."""
    global _announced, _compiled
    if not module.startswith(KERNEL_MODULE_PREFIX):
        return
    _compiled += 1
    if not _announced and _announcer is not None:
        _announced = True
        _announcer(NOTICE)


def install_listener() -> None:
    """Listen to Numba's compilations, once per process."""
    global _installed
    if _installed:
        return
    from numba.core import event

    class CompileListener(event.Listener):
        def on_start(self, ev) -> None:
            py_func = getattr(ev.data.get("dispatcher"), "py_func", None)
            kernel_compile_started(getattr(py_func, "__module__", "") or "")

        def on_end(self, ev) -> None:
            pass

    event.register("numba:compile", CompileListener())
    _installed = True

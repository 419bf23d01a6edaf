"""A Ctrl-C that lands inside a finalizer is not lost.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. Inside a finalizer (a generator
closed by the garbage collector, such as an HTTP client's response stream) the exception is printed as "Exception
ignored in: ..." and dropped, and a long run carries on as if nobody had asked it to stop: seen as a
``compare --engine llamacpp-server -r 1000`` that did not stop within a minute of its Ctrl-C.

While :func:`remember_interrupts` is active, SIGINT raises ``KeyboardInterrupt`` at once, exactly as Python's own
handler does, and also records it; :meth:`InterruptMemory.check`, called at safe points (between requests), raises it
again if it was swallowed. Only the main thread installs the handler, and only over Python's default one (a
handler someone else set, such as the Numba compile guard's, is left alone: then nothing is recorded and ``check``
is a no-op).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class InterruptMemory:
    """Whether a SIGINT arrived while :func:`remember_interrupts` was active."""

    def __init__(self) -> None:
        self.received = False

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a SIGINT arrived (whether or not its first raise got through)."""
        if self.received:
            raise KeyboardInterrupt


@contextmanager
def remember_interrupts() -> Iterator[InterruptMemory]:
    memory = InterruptMemory()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield memory
        return

    def handler(signum, frame) -> None:
        memory.received = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield memory
    finally:
        signal.signal(signal.SIGINT, previous)

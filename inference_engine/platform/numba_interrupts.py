"""Ctrl-C during a Numba compile: held until the compile is done, then raised as KeyboardInterrupt.

Numba compiles each kernel on its first call, and parts of a compile run inside llvmlite's ctypes callbacks (the
object-cache notification, for one). A KeyboardInterrupt raised there is printed as "Exception ignored" and
swallowed by ctypes: the run then either carries on (exit 0, a report written for a run the user stopped) or
fails later with ``RuntimeError: no compiled object yet``. So while Numba holds its compiler lock (the whole
compile, cache save included) SIGINT only sets a flag; when the outermost lock is released the previous handler is
restored and the interrupt is raised, from Python code, where it ends the run with exit 130 as anywhere else.

Only the main thread installs signal handlers, and only over Python's default handler (a handler someone else set
is left alone).
"""

from __future__ import annotations

import signal
import threading

from numba.core import event


class HoldInterruptsWhileCompiling(event.Listener):
    def __init__(self) -> None:
        self.depth = 0
        self.pending = False
        self.previous = None

    def on_start(self, ev) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self.depth == 0 and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._hold)
        self.depth += 1

    def on_end(self, ev) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
            if self.pending:
                self.pending = False
                raise KeyboardInterrupt

    def _hold(self, signum, frame) -> None:
        self.pending = True


_listener: HoldInterruptsWhileCompiling | None = None


def install() -> None:
    """Register the listener once per process (idempotent)."""
    global _listener
    if _listener is None:
        _listener = HoldInterruptsWhileCompiling()
        event.register("numba:compiler_lock", _listener)

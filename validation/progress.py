"""How far a validation has come, for the minutes-long parts: ``--corpus-kld`` and ``--decode-steps`` at depth.

The checks call a :data:`ProgressHook` with what they are doing, how many of its units are done and how many there
are; :func:`silent` ignores it (the library's default); :class:`ProgressBar` is the CLI's: one tqdm line on stderr,
restarted whenever the phase changes and gone when the run ends (``leave=False``), so the result printed after it
reads as before.
"""

from __future__ import annotations

import sys
from typing import Callable, TextIO

from tqdm import tqdm

ProgressHook = Callable[[str, int, int], None]  # (phase, units done, units in the phase)


def silent(phase: str, done: int, total: int) -> None:
    """The hook that shows nothing."""


class ProgressBar:
    """A :data:`ProgressHook` drawing one tqdm bar per phase on ``file`` (stderr); use as a context manager."""

    def __init__(self, file: TextIO | None = None, unit: str = "step"):
        self.file = file if file is not None else sys.stderr
        self.unit = unit
        self._bar: tqdm | None = None
        self._phase: str | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase != self._phase or self._bar is None:
            self.close()
            self._phase = phase
            # mininterval=0: every unit is drawn (they are seconds apart: a window, a decode step)
            self._bar = tqdm(total=total, desc=phase, unit=self.unit, file=self.file, leave=False,
                             dynamic_ncols=True, mininterval=0)
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._phase = None, None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

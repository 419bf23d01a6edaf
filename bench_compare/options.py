"""Click parameter types shared by every command: flags are checked when they are parsed, before any work.

A bad value becomes a Click usage error, which ``bench_compare.cli.main`` prints as one line (exit 2):

* :class:`Number` / :class:`Integer`: finite numbers within bounds (``--temperature nan``, ``--top-p 2``,
  ``--seed -1`` and ``--budget inf`` are refused, not handed to NumPy).
* :class:`OutputFile`: a file the run will write at the end (``--json``, ``--history``): its parent directory must
  exist and be writable and the path must not be a directory, so a long run never fails at its last step and no
  directory is created for it.
* :class:`ReportDir`: a report directory (``--report``, ``--out``): not a file, empty if it exists, inside an
  existing writable directory (the report directory itself is the only one created).
* :func:`choose_platform_tricks`: ``bench-compare --platform-tricks on|off``, before any command runs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import click


def _interval(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    """``at least 1``, ``above 0``, ``at most 5``, ``in (0, 1]``: the bounds as the error says them."""
    def num(x) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{num(lo)}, {num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'above' if lo_open else 'at least'} {num(lo)}"
    return f"{'below' if hi_open else 'at most'} {num(hi)}"


class Number(click.ParamType):
    """A finite float in ``[lo, hi]`` (``lo_open`` / ``hi_open``: excluding that end)."""

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                 hi_open: bool = False):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"must be a number, got '{value}'", param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value}", param, ctx)
        below = self.lo is not None and (number < self.lo or (self.lo_open and number == self.lo))
        above = self.hi is not None and (number > self.hi or (self.hi_open and number == self.hi))
        if below or above:
            self.fail(f"must be {_interval(self.lo, self.hi, self.lo_open, self.hi_open)}, got {value}", param, ctx)
        return number


class Integer(click.ParamType):
    """An integer in ``[lo, hi]`` (either end optional)."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                self.fail(f"must be an integer, got '{value}'", param, ctx)
        if (self.lo is not None and number < self.lo) or (self.hi is not None and number > self.hi):
            self.fail(f"must be {_interval(self.lo, self.hi)}, got {value}", param, ctx)
        return number


# Seeds NumPy's generators accept: non-negative, and (our choice) within int64 like llama.cpp's uint32 and more.
SEED = Integer(0, (1 << 63) - 1)
POSITIVE = Integer(1)
NON_NEGATIVE = Integer(0)


def given_on_command_line(name: str) -> bool:
    """Whether the user set the running command's option ``name`` (click's parameter name; on the command line or
    through the environment), not its default."""
    import click

    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def require_at_least(minimum: int, *flags: tuple[str, int | None]) -> None:
    """Each ``(flag, value)`` given (``None``: not given) is at least ``minimum``; else one line naming the flag.
    For flags checked after Click (their defaults come from elsewhere or they are plain ``int`` options)."""
    from inference_engine.errors import GGUFParityError

    for name, value in flags:
        if value is not None and value < minimum:
            raise GGUFParityError(f"{name} must be at least {minimum}, got {value}")


def table_default(row, field: str) -> str:
    """`` [default: ...]`` for a help text: ``field`` of a row of the defaults table
    (:mod:`inference_engine.defaults`). The option itself defaults to None; the command resolves it when it runs."""
    return f"  [default: {row.shown(field)}]"


class OutputFile(click.ParamType):
    """A file to be written at the end of the run; checked now. ``append``: it may exist (a history CSV)."""

    name = "path"

    def convert(self, value, param, ctx):
        path = Path(value)
        if path.is_dir():
            self.fail(f"{path} is a directory; give a file path", param, ctx)
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            self.fail(f"directory {parent} does not exist (it is not created for you)", param, ctx)
        if not os.access(parent, os.W_OK | os.X_OK):
            self.fail(f"directory {parent} is not writable", param, ctx)
        if path.exists() and not os.access(path, os.W_OK):
            self.fail(f"{path} is not writable", param, ctx)
        return path


class ReportDir(click.ParamType):
    """A report directory: created by the run (only it), so its parent must exist. ``empty``: if it exists, it
    must be empty (``validate`` never writes over an earlier report; ``report --out`` rewrites its own files)."""

    name = "directory"

    def __init__(self, empty: bool = True):
        self.empty = empty

    def convert(self, value, param, ctx):
        path = Path(value)
        if path.exists() and not path.is_dir():
            self.fail(f"{path} is a file; give a directory for the report", param, ctx)
        if self.empty and path.is_dir() and any(path.iterdir()):
            self.fail(f"{path} exists and is not empty; choose another directory", param, ctx)
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            self.fail(f"directory {parent} does not exist (only the report directory itself is created)",
                      param, ctx)
        target = path if path.is_dir() else parent
        if not os.access(target, os.W_OK | os.X_OK):
            self.fail(f"directory {target} is not writable", param, ctx)
        return path


def choose_platform_tricks(switch: str | None) -> None:
    """``--platform-tricks on|off`` (None: the variable decides): the choice goes into
    ``GGUF_PARITY_PLATFORM_TRICKS``, so the cold-start children run with it too, and ``off`` is recorded now
    (:func:`inference_engine.platform.configure` with ``enabled=False``: nothing applied, the Numba backend's own
    call later returns that record). ``on`` applies nothing here: the tricks are applied when the Numba backend is
    built, so a run with the NumPy backend or llama.cpp alone keeps the process as it is. A bad value of the
    variable is refused here, before any work."""
    from inference_engine import platform

    if switch is None:
        platform.switch_from_env()
        return
    os.environ[platform.ENV] = switch
    if switch == "off":
        platform.configure(enabled=False, by="--platform-tricks off")


def device_option(what: str = "Where our engine computes"):
    """``--device gpu|cpu`` for a command that runs our engine (None when not given: the backend's default, the GPU
    where MLX has one). A device the backend cannot use here is refused when the backend is built (exit 2)."""
    from inference_engine.backends.base import DEVICES
    from inference_engine.defaults import DEVICE_DEFAULT

    return click.option("--device", default=None, type=click.Choice(DEVICES),
                        help=f"{what}: {' | '.join(DEVICES)}.  [default: {DEVICE_DEFAULT}]")

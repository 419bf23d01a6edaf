"""User-facing errors.

Every mistake a user can make (a missing file, a non-GGUF file, an unknown architecture, a bad flag) raises
:class:`GGUFParityError` with a one-line message naming the problem and what is supported. The CLI prints it as
``error: <message>`` and exits with code 2; it never shows a traceback for these.
"""

from __future__ import annotations

import os
from pathlib import Path


def one_line(what: BaseException | str, limit: int = 200) -> str:
    """An exception's message (or a text: a server's reply, a log line) on one line, at most ``limit`` characters,
    cut ones ending in "..."; an exception without a message is its type's name. How a failure that is reported, not
    raised, is recorded (a variant that could not open, a damaged file) and how foreign text enters an error line."""
    flat = " ".join(str(what).split())
    if not flat and isinstance(what, BaseException):
        flat = type(what).__name__
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class GGUFParityError(Exception):
    """A problem with the user's input, reported as one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class CheckFailed(Exception):
    """A run that went to the end and found a difference (a validation that failed): not a user mistake. Reported
    as one line (``error: ...``) with exit code 1; whatever the run wrote (its report) is kept."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def read_user_text(path: str | os.PathLike, what: str, expected: str = "") -> str:
    """The UTF-8 text of a file the user named (a sweep, a corpus, a name map, a result JSON). Each way it can be
    wrong is one :class:`GGUFParityError` naming the file: missing (``no such <what>``, then ``expected`` in
    parentheses: what the file should be), a directory or another kind of non-regular file, unreadable, not
    UTF-8."""
    p = Path(path)
    said = f" ({expected})" if expected else ""
    if p.is_dir():
        raise GGUFParityError(f"{p}: is a directory, not a {what}{said}")
    if not p.exists():
        raise GGUFParityError(f"{p}: no such {what}{said}")
    if not p.is_file():  # a device, a pipe, a socket
        raise GGUFParityError(f"{p}: is not a regular file, not a {what}{said}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GGUFParityError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); a {what} is text{said}") \
            from None
    except OSError as exc:
        raise GGUFParityError(f"{p}: cannot read the {what} ({exc.strerror or one_line(exc)})") from None

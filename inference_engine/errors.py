"""User-facing errors.

Every mistake a user can make (a missing file, a non-GGUF file, an unknown architecture, a bad flag) raises
:class:`GGUFParityError` with a one-line message naming the problem and what is supported. The CLI prints it as
``error: <message>`` and exits with code 2; it never shows a traceback for these.
"""


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

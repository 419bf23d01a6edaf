"""User-facing errors.

Every mistake a user can make (a missing file, a non-GGUF file, an unknown architecture, a bad flag) raises
:class:`GGUFParityError` with a one-line message naming the problem and what is supported. The CLI prints it as
``error: <message>`` and exits with code 2; it never shows a traceback for these.
"""


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, at most ``limit`` characters (its type's name where it has none): how a
    failure that is reported, not raised, is recorded (a variant that could not open, a damaged file)."""
    return (" ".join(str(exc).split()) or type(exc).__name__)[:limit]


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

"""The root of every error Headwater raises on purpose.

Each package subclasses these (``log.errors``, ``capture.errors`` ...). Retry loops
branch on :class:`TransientError` vs :class:`PermanentError`; the CLI prints
``str(error)`` as one line, so messages say what is wrong and what to do next.
"""

from __future__ import annotations

#: Exit code of a command that failed with a :class:`PermanentError`: retrying will not help
#: until an operator acts, so ``headwater run --follow`` does not restart a stage exiting with it.
EXIT_PERMANENT = 3


def one_line(text: object) -> str:
    """``str(text)`` with every run of whitespace (newlines included) as one space: errors print as one line."""
    return " ".join(str(text).split())


#: How a Python traceback starts.
PYTHON_TRACEBACK = "Traceback (most recent call last)"


def traceback_error_line(text: str) -> str | None:
    """The "Error: message" line of the first Python traceback in ``text``, nested ones followed; None without one.

    A Python error inside a Spark micro-batch ends its traceback with its own "Error: message"
    line. When that error's message is itself a traceback (DuckDB reports an exception raised
    in a Python filesystem it called as ``duckdb.Error: Traceback (most recent call last): ...``),
    the inner traceback's line says the cause: both are kept, outer type first
    (``_duckdb.Error: OSError: ...``). What follows the error line (DuckDB's ``LINE 1: ...``) is not.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if PYTHON_TRACEBACK in line), None)
    found: list[str] = []
    while start is not None:
        at = next((i for i in range(start + 1, len(lines)) if not lines[i][0].isspace()), None)
        if at is None:
            break
        line = lines[at].strip()
        if PYTHON_TRACEBACK not in line:
            found.append(line)
            break
        outer = line.split(PYTHON_TRACEBACK)[0].strip()
        if outer:
            found.append(outer)
        start = at
    return " ".join(found) or None


def restore_error(cls: type[HeadwaterError], args: tuple[object, ...], state: dict[str, object]) -> HeadwaterError:
    """An error of class ``cls`` with ``args`` and attributes ``state``, not built by ``__init__`` (as unpickled)."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class HeadwaterError(Exception):
    """Base class of all deliberate Headwater errors.

    Every subclass pickles whatever its constructor takes: an error raised inside a Spark
    Python worker, or another process, arrives whole (message and attributes), since
    unpickling rebuilds it from its message and attributes instead of calling ``__init__``.
    """

    #: True when retrying the same operation later may succeed.
    transient: bool = False

    def __reduce__(self) -> tuple[object, ...]:
        return (restore_error, (type(self), self.args, dict(self.__dict__)))


class TransientError(HeadwaterError):
    """A failure that may go away by itself (connection lost, broker busy): retry with backoff."""

    transient = True


class PermanentError(HeadwaterError):
    """A failure that needs an operator: bad config, missing privilege, corrupt data."""


class ConfigError(PermanentError):
    """``headwater.yaml`` is missing, malformed or invalid."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field

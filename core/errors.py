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

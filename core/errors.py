"""The root of every error Headwater raises on purpose.

Each package subclasses these (``log.errors``, ``capture.errors`` ...). Retry loops
branch on :class:`TransientError` vs :class:`PermanentError`; the CLI prints
``str(error)`` as one line, so messages say what is wrong and what to do next.
"""

from __future__ import annotations

#: Exit code of a command that failed with a :class:`PermanentError`: retrying will not help
#: until an operator acts, so ``headwater run --follow`` does not restart a stage exiting with it.
EXIT_PERMANENT = 3


class HeadwaterError(Exception):
    """Base class of all deliberate Headwater errors."""

    #: True when retrying the same operation later may succeed.
    transient: bool = False


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

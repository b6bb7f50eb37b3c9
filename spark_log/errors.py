"""Errors of Spark over the log: the ``headwater_log`` data source and the rows it reads."""

from __future__ import annotations

from typing import Any, Final

from core.errors import HeadwaterError, PermanentError, TransientError


class SparkLogError(HeadwaterError):
    """Base class of errors reading the log from Spark."""


class LogSourceOptionError(SparkLogError, PermanentError):
    """An option of the ``headwater_log`` data source is missing or invalid."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(f"headwater_log option {option!r}: {message}")
        self.option = option


class SchemaConflictError(SparkLogError, PermanentError):
    """Topics read together give one column incompatible types."""

    def __init__(self, column: str, first: str, second: str) -> None:
        super().__init__(
            f"column {column!r} is {first} in one topic and {second} in another; read the topics separately"
        )
        self.column = column


class UndecodableValueError(SparkLogError, PermanentError):
    """A JSON value in the log does not fit its column's type: the read fails rather than drop it."""

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        offset: int | None,
        column: str,
        value: Any,
        expected: str,
        reason: str,
    ) -> None:
        where = f"{topic}/{partition}" + (f"@{offset}" if offset is not None else "")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(
            f"{where}: column {column!r} holds {shown}, which is not a {expected} ({reason}); "
            "check the topic's latest entry in _headwater.schemas or read 'before'/'after' as JSON"
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.column = column


class SparkClusterError(SparkLogError, PermanentError):
    """The Spark cluster cannot run Headwater's jobs as configured (no executors, unreachable checkpoints)."""


class SparkMasterUnreachableError(SparkLogError, TransientError):
    """Nothing answers at the configured Spark master: it may be starting or down (retrying may help)."""


#: How a :class:`SchemaChangedError` starts, so its text is recognised when Spark hands it back wrapped.
SCHEMA_CHANGED: Final = "the schema of topic"


class SchemaChangedError(SparkLogError, TransientError):
    """A topic read by a running query got a new schema version: the query stops before reading it, to be started again.

    Raised when a micro-batch is planned, before any record of the new version is read, so
    the restarted query (planned with the new version) reads them all.
    """

    def __init__(self, topic: str, planned: int | None, latest: int) -> None:
        was = "no schema" if planned is None else f"version {planned}"
        super().__init__(
            f"{SCHEMA_CHANGED} {topic!r} changed ({was} -> version {latest}) while the query ran; "
            "it stops before reading records of the new version and is started again with it"
        )
        self.topic = topic


def is_schema_changed(error: BaseException | str | None) -> bool:
    """True when ``error`` (or Spark's wrapped text of it) is a :class:`SchemaChangedError`."""
    if error is None:
        return False
    if isinstance(error, SchemaChangedError):
        return True
    try:
        text = error if isinstance(error, str) else str(error)
    except Exception:  # a py4j error whose JVM is gone
        return False
    return "SchemaChangedError" in text and SCHEMA_CHANGED in text

"""Errors of Spark over the log: the ``headwater_log`` data source and the rows it reads."""

from __future__ import annotations

from typing import Any

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

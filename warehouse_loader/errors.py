"""Errors raised by the warehouse loader (SCD apply, Delta writer, query engine)."""

from __future__ import annotations

from collections.abc import Iterable

from core.errors import HeadwaterError, PermanentError, TransientError


class WarehouseError(HeadwaterError):
    """Base class of warehouse errors."""


class ChangeBatchError(WarehouseError, PermanentError):
    """A micro-batch of changes breaks the change-batch contract (missing column, unknown op)."""

    def __init__(self, message: str, *, table: str | None = None) -> None:
        super().__init__(message)
        self.table = table


class SchemaMismatchError(WarehouseError, PermanentError):
    """A batch column's type cannot be stored in the table's column: nothing was written."""

    def __init__(self, table: str, column: str, table_type: str, batch_type: str) -> None:
        super().__init__(
            f"table {table!r}: column {column!r} is {table_type} in the table but {batch_type} in the batch; "
            f"nothing was written. Rebuild the table with 'headwater reprocess {table}' or cast the column upstream"
        )
        self.table = table
        self.column = column


class TypeChangeRefusedError(SchemaMismatchError):
    """The source changed a column's type in a way the table's format cannot follow in place: nothing was written."""

    def __init__(self, table: str, column: str, table_type: str, source_type: str, fmt: str) -> None:
        WarehouseError.__init__(
            self,
            f"table {table!r}: the source changed column {column!r} from {table_type} to {source_type}, "
            f"which {fmt} cannot change in place; nothing was written. Rebuild the table with "
            f"'headwater reprocess {table}'",
        )
        self.table = table
        self.column = column


class WarehouseWriteError(WarehouseError, TransientError):
    """A Delta commit failed (conflict, I/O); the batch was not recorded and can be retried as a whole."""

    def __init__(self, table: str, batch_id: int, detail: str) -> None:
        super().__init__(f"table {table!r}: batch {batch_id} was not committed ({detail}); it will be retried")
        self.table = table
        self.batch_id = batch_id


class CommitConflictError(WarehouseWriteError):
    """Another writer committed to the table first (Delta's optimistic concurrency): re-plan and retry."""


class UnknownTableError(WarehouseError, PermanentError):
    """A query names a table that the warehouse does not hold."""

    def __init__(self, table: str, known: Iterable[str]) -> None:
        names = ", ".join(sorted(known)) or "(none)"
        super().__init__(f"unknown table {table!r}; known tables: {names}")
        self.table = table


class QueryError(WarehouseError, PermanentError):
    """DuckDB rejected the query (syntax, unknown column, type error)."""


class ChangeFrameError(WarehouseError, PermanentError):
    """A log-source DataFrame cannot be turned into a warehouse change batch."""


class WarehouseStorageError(WarehouseError, PermanentError):
    """The warehouse's object store refused Headwater (missing bucket, rejected credentials): an operator acts."""


class WarehouseUnreachableError(WarehouseError, TransientError):
    """The warehouse's object store did not answer (endpoint down, network): retrying may help."""

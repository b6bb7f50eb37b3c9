"""The change event: Debezium-compatible JSON values and keys.

A value is Debezium's envelope (``before``, ``after``, ``source``, ``op``, ``ts_ms``,
``ts_us``, ``ts_ns``, ``transaction``; a logical message has ``op``, ``ts_ms``, ``source``,
``transaction`` and ``message`` only, as Debezium writes it) whose ``source`` block is the
source kind's (:class:`SourceInfo`) and carries ``commit_lsn`` and ``txn_index``, the event's
:class:`~log.sequence.Sequence`. A
delete is followed by a tombstone (null value) with the same key. Every producer
(capture, feeds) and consumer (Spark source, warehouse, CLI) goes through this module, so
the wire format lives in one place. JSON is encoded with orjson; keys are JSON objects of
the key columns (:mod:`log.table_schemas`) in column order.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from log.sequence import Sequence

#: Version string written to ``source.version``.
EVENT_VERSION = "headwater-0.1"


class Op(enum.StrEnum):
    """Debezium ``op`` codes."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"
    MESSAGE = "m"


class SnapshotMarker(enum.StrEnum):
    """``source.snapshot``: where an event stands relative to a snapshot.

    An initial snapshot marks its rows as Debezium does: the first row of the first table
    ``first``, the last row of the last table ``last``, another table's first and last rows
    ``first_in_data_collection`` / ``last_in_data_collection``, every other row ``true``
    (:meth:`of_row`). Streamed events are ``false``, incremental-snapshot rows ``incremental``.
    """

    FIRST = "first"
    FIRST_IN_DATA_COLLECTION = "first_in_data_collection"
    TRUE = "true"
    LAST_IN_DATA_COLLECTION = "last_in_data_collection"
    LAST = "last"
    FALSE = "false"
    INCREMENTAL = "incremental"

    @classmethod
    def of_row(
        cls, *, first_in_table: bool, last_in_table: bool, first_table: bool, last_table: bool
    ) -> SnapshotMarker:
        """The marker of a snapshot row; where two apply, Debezium's order decides (last, first, per table)."""
        if last_in_table and last_table:
            return cls.LAST
        if first_in_table and first_table:
            return cls.FIRST
        if last_in_table:
            return cls.LAST_IN_DATA_COLLECTION
        if first_in_table:
            return cls.FIRST_IN_DATA_COLLECTION
        return cls.TRUE


#: The ``source`` fields every source kind writes (its own follow or sit among them, in its order):
#: readers take an event's table, time, snapshot marker and place in the log's order from these. A kind
#: without schemas leaves ``schema`` out, and may write a streamed event's ``snapshot`` as null, as
#: Debezium's MySQL connector does (:class:`SourceInfo` reads both as its PostgreSQL counterparts).
SOURCE_FIELDS = (
    "version", "connector", "name", "ts_ms", "ts_us", "ts_ns", "snapshot", "db", "schema", "table", "commit_lsn",
    "txn_index",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The ``source`` block as the event's source kind wrote it, fields in its order; never holds credentials.

    Every kind writes :data:`SOURCE_FIELDS`; ``commit_lsn`` and ``txn_index`` are the event's
    :class:`~log.sequence.Sequence` (the kind's :meth:`~log.position.Position.ordinal` of its commit,
    and its index there). Everything else is the kind's own (PostgreSQL: ``sequence``, ``txId``,
    ``lsn``, ``xmin``, ``origin``, ``origin_lsn``; ``capture.postgres.events.source_block``) and is
    kept as written.
    """

    fields: Mapping[str, Any]

    @property
    def connector(self) -> str:
        """The source kind's connector name (Debezium's: ``postgresql``, ``mysql`` ...)."""
        return str(self.fields.get("connector", ""))

    @property
    def name(self) -> str:
        """The source's name (``sources.<name>``)."""
        return str(self.fields["name"])

    @property
    def db(self) -> str:
        """The database the change happened in."""
        return str(self.fields["db"])

    @property
    def schema(self) -> str:
        """The table's schema (empty for a logical message, and for a source without schemas: MySQL writes none)."""
        schema = self.fields.get("schema")
        return "" if schema is None else str(schema)

    @property
    def table(self) -> str:
        """The table (empty for a logical message)."""
        return str(self.fields["table"])

    @property
    def ts_us(self) -> int:
        """When the change was committed (a snapshot row: read), microseconds since the epoch."""
        return int(self.fields["ts_us"])

    @property
    def snapshot(self) -> SnapshotMarker:
        """Where the event stands relative to a snapshot (null or absent, a MySQL streamed event's: ``false``)."""
        marker = self.fields.get("snapshot")
        return SnapshotMarker.FALSE if marker is None else SnapshotMarker(marker)

    @property
    def commit_lsn(self) -> int:
        """The ordinal of the event's commit in the log's order (PostgreSQL: the commit LSN)."""
        return int(self.fields["commit_lsn"])

    @property
    def txn_index(self) -> int:
        """The event's index in its commit."""
        return int(self.fields["txn_index"])

    @property
    def sequence(self) -> Sequence:
        """The event's position in the source's total order."""
        return Sequence(self.commit_lsn, self.txn_index)

    def to_json(self) -> dict[str, Any]:
        """The ``source`` object, as written."""
        return dict(self.fields)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceInfo:
        """Inverse of :meth:`to_json`."""
        return cls(dict(data))


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change to one row (or a truncate / logical message), as stored in the log."""

    op: Op
    source: SourceInfo
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | None = None
    ts_us: int = 0
    transaction: Mapping[str, Any] | None = None
    message: Mapping[str, Any] | None = field(default=None)

    @property
    def sequence(self) -> Sequence:
        """Shortcut for ``source.sequence``."""
        return self.source.sequence

    def to_json(self) -> dict[str, Any]:
        """The Debezium value object (a logical message's has no images and no ``ts_us``/``ts_ns``)."""
        if self.op is Op.MESSAGE:
            return {
                "op": self.op.value,
                "ts_ms": self.ts_us // 1000,
                "source": self.source.to_json(),
                "transaction": self.transaction,
                "message": self.message,
            }
        return {
            "before": self.before,
            "after": self.after,
            "source": self.source.to_json(),
            "op": self.op.value,
            "ts_ms": self.ts_us // 1000,
            "ts_us": self.ts_us,
            "ts_ns": self.ts_us * 1000,
            "transaction": self.transaction,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChangeEvent:
        """Inverse of :meth:`to_json`."""
        source = SourceInfo.from_json(data["source"])
        return cls(
            op=Op(data["op"]),
            source=source,
            before=data.get("before"),
            after=data.get("after"),
            # A message's envelope has no ts_us: its time is the source's (the commit's).
            ts_us=data.get("ts_us", source.ts_us),
            transaction=data.get("transaction"),
            message=data.get("message"),
        )


def encode_value(event: ChangeEvent) -> bytes:
    """Serialise an event's value (orjson; non-str dict keys are rejected)."""
    return orjson.dumps(event.to_json())


def decode_value(data: bytes) -> ChangeEvent:
    """Parse an event value written by :func:`encode_value`."""
    return ChangeEvent.from_json(orjson.loads(data))


def encode_key(key: Mapping[str, Any] | None) -> bytes | None:
    """Serialise a row key (the key columns in column order, :mod:`log.table_schemas`); ``None`` for keyless tables."""
    return None if key is None else orjson.dumps(dict(key))


def decode_key(data: bytes | None) -> dict[str, Any] | None:
    """Parse a key written by :func:`encode_key`."""
    return None if data is None else orjson.loads(data)

"""The change event: Debezium-compatible JSON values and keys.

A value is Debezium's envelope (``before``, ``after``, ``source``, ``op``, ``ts_ms``,
``ts_us``, ``ts_ns``, ``transaction``; a logical message has ``op``, ``ts_ms``, ``source``,
``transaction`` and ``message`` only, as Debezium writes it) whose ``source`` block also
carries ``commit_lsn`` and ``txn_index``, the event's :class:`~log.sequence.Sequence`. A
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

from log.sequence import Lsn, Sequence

CONNECTOR = "postgresql"
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


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The ``source`` block: where and when the change happened. Never holds credentials."""

    name: str
    db: str
    schema: str
    table: str
    tx_id: int | None
    lsn: int | None
    commit_lsn: int
    txn_index: int
    ts_us: int
    snapshot: SnapshotMarker = SnapshotMarker.FALSE
    #: The end LSN of the transaction before (``sequence[0]``, as Debezium's "last commit LSN").
    last_commit_lsn: int | None = None
    #: The replication origin a replayed transaction came through, and its LSN there.
    origin: str | None = None
    origin_lsn: int | None = None

    @property
    def sequence(self) -> Sequence:
        """The event's position in the source's total order."""
        return Sequence(self.commit_lsn, self.txn_index)

    def to_json(self) -> dict[str, Any]:
        """The Debezium ``source`` object plus ``commit_lsn`` and ``txn_index``."""
        last = self.last_commit_lsn
        return {
            "version": EVENT_VERSION,
            "connector": CONNECTOR,
            "name": self.name,
            "ts_ms": self.ts_us // 1000,
            "ts_us": self.ts_us,
            "ts_ns": self.ts_us * 1000,
            "snapshot": self.snapshot.value,
            "db": self.db,
            "sequence": orjson.dumps([_text(last), _text(self.lsn)]).decode(),
            "schema": self.schema,
            "table": self.table,
            "txId": self.tx_id,
            "lsn": self.lsn,
            "xmin": None,
            "origin": self.origin,
            "origin_lsn": self.origin_lsn,
            "commit_lsn": self.commit_lsn,
            "txn_index": self.txn_index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceInfo:
        """Inverse of :meth:`to_json`."""
        last, _ = orjson.loads(data["sequence"]) if data.get("sequence") else (None, None)
        return cls(
            name=data["name"],
            db=data["db"],
            schema=data["schema"],
            table=data["table"],
            tx_id=data.get("txId"),
            lsn=data.get("lsn"),
            commit_lsn=data["commit_lsn"],
            txn_index=data["txn_index"],
            ts_us=data["ts_us"],
            snapshot=SnapshotMarker(data.get("snapshot", "false")),
            last_commit_lsn=None if last is None else int(last),
            origin=data.get("origin"),
            origin_lsn=data.get("origin_lsn"),
        )


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


def transaction_block(tx_id: int, commit_lsn: Lsn, total_order: int, data_collection_order: int) -> dict[str, Any]:
    """Debezium's ``transaction`` object: id ``txid:lsn``, position overall and per table."""
    return {
        "id": f"{tx_id}:{commit_lsn.value}",
        "total_order": total_order,
        "data_collection_order": data_collection_order,
    }


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

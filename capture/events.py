"""Committed transactions → Debezium-style change events and schema records.

Pure: no connections or files. The agent passes in how to decode a row (the type
map, per relation) and how to find a key's previous row image (for unchanged TOAST).

Invariants:

* Every data change of a transaction gets ``txn_index`` = its position among the
  transaction's events (0-based), so ``(commit_lsn, txn_index)`` is unique per source.
* A delete is followed by a tombstone with the same key (for compaction).
* An unchanged TOASTed value never leaves this module as a placeholder: it is filled
  from the old row image (REPLICA IDENTITY FULL) or the key's previous image.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

from capture.pgoutput import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    ReplicaIdentity,
    Truncate,
    TupleData,
    Update,
)
from capture.transactions import Transaction
from log.envelope import ChangeEvent, Op, SnapshotMarker, SourceInfo, encode_key, encode_value, transaction_block
from log.sequence import Sequence as Seq

#: Decodes one tuple (text-format values) into JSON values, column by column.
RowDecoder: TypeAlias = Callable[[TupleData], list[Any]]
#: Makes the decoder for a relation (built once per Relation message).
RowDecoderFactory: TypeAlias = Callable[[Relation], RowDecoder]
#: The primary-key column names of a relation from the catalog (None: no primary key).
PrimaryKeyLookup: TypeAlias = Callable[[Relation], tuple[str, ...] | None]
#: Finds the latest row image stored for ``(topic, key)``, or None.
PreviousImage: TypeAlias = Callable[[str, bytes], Mapping[str, Any] | None]

#: Prefix of logical messages Headwater writes itself (heartbeats, snapshot watermarks).
INTERNAL_MESSAGE_PREFIX = "headwater."
_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def table_topic(source: str, schema: str, table: str) -> str:
    """``<source>.<schema>.<table>``; characters Kafka forbids become ``_`` (as Debezium does)."""
    return ".".join(_TOPIC_UNSAFE.sub("_", part) for part in (source, schema, table))


def message_topic(source: str) -> str:
    """Topic of logical-message events (Debezium: ``<prefix>.message``)."""
    return f"{source}.message"


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record for the log. ``value=None`` is a tombstone; ``sequence`` orders it."""

    topic: str
    key: bytes | None
    value: bytes | None
    sequence: Seq


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A table's column list, written to ``_headwater.schemas`` keyed by topic when it changes."""

    topic: str
    value: bytes


@dataclass
class _Table:
    relation: Relation
    topic: str
    names: list[str]
    keep: list[int]  # column positions not excluded by config
    key_positions: list[int]
    decode: RowDecoder
    version: int
    has_key: bool


class EventBuilder:
    """Turns transactions into records, keeping the relation cache of one replication stream."""

    def __init__(
        self,
        source: str,
        db: str,
        decoder_for: RowDecoderFactory,
        *,
        excluded_columns: Sequence[str] = (),
        previous_image: PreviousImage | None = None,
        primary_key: PrimaryKeyLookup | None = None,
        image_cache_size: int = 100_000,
        schema_versions: Mapping[str, int] | None = None,
    ) -> None:
        self._source = source
        self._db = db
        self._decoder_for = decoder_for
        self._excluded = set(excluded_columns)
        self._previous_image = previous_image
        self._primary_key = primary_key
        self._tables: dict[int, _Table] = {}
        self._schema_versions = dict(schema_versions or {})
        self._schemas_seen: dict[str, bytes] = {}
        self._last_commit_lsn: int | None = None
        # Latest after-image per (topic, key), for filling unchanged TOAST values without
        # reading the log back; bounded, the log lookup covers what fell out.
        self._images: OrderedDict[tuple[str, bytes], dict[str, Any]] = OrderedDict()
        self._images_max = image_cache_size

    def known_schema(self, topic: str, value: bytes, version: int) -> None:
        """Seed the last published schema of ``topic`` (read back from ``_headwater.schemas``)."""
        self._schemas_seen[topic] = _schema_fingerprint(value)
        self._schema_versions[topic] = version

    def relation(self, relation: Relation) -> SchemaRecord | None:
        """Cache a Relation; return a schema record when the table's shape changed."""
        topic = table_topic(self._source, relation.namespace, relation.name)
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        keep = [i for i, name in enumerate(names) if f"{qualified}.{name}" not in self._excluded]
        key_positions = self._key_positions(relation, keep)
        previous = self._tables.get(relation.oid)
        version = self._schema_versions.get(topic, 0)
        columns = [
            {
                "name": relation.columns[i].name,
                "type_oid": relation.columns[i].type_oid,
                "typmod": relation.columns[i].atttypmod,
                # The record key's columns (the primary key), not pgoutput's replica-identity
                # flags, which mark every column under REPLICA IDENTITY FULL.
                "key": i in key_positions,
            }
            for i in keep
        ]
        body = {
            "topic": topic,
            "schema": relation.namespace,
            "table": relation.name,
            "replica_identity": relation.replica_identity.value,
            "columns": columns,
        }
        fingerprint = orjson.dumps(body)
        changed = self._schemas_seen.get(topic) != fingerprint
        if changed:
            version += 1
            self._schema_versions[topic] = version
            self._schemas_seen[topic] = fingerprint
        self._tables[relation.oid] = _Table(
            relation=relation,
            topic=topic,
            names=names,
            keep=keep,
            key_positions=key_positions,
            decode=self._decoder_for(relation),
            version=version,
            has_key=bool(key_positions),
        )
        del previous
        if not changed:
            return None
        return SchemaRecord(topic, orjson.dumps({**body, "version": version}))

    def _key_positions(self, relation: Relation, keep: list[int]) -> list[int]:
        # pgoutput flags replica-identity columns: with REPLICA IDENTITY FULL that is every
        # column, but the record key is the primary key (as Debezium's), or none at all.
        if relation.replica_identity == ReplicaIdentity.FULL:
            names = self._primary_key(relation) if self._primary_key else None
            if not names:
                return []
            return [i for i, column in enumerate(relation.columns) if column.name in names and i in keep]
        return [i for i, column in enumerate(relation.columns) if column.key and i in keep]

    def build(self, txn: Transaction) -> tuple[list[OutRecord], list[SchemaRecord]]:
        """Events (with tombstones) and schema changes of one committed transaction, in order."""
        out: list[OutRecord] = []
        schemas: list[SchemaRecord] = []
        index = 0
        per_table: dict[str, int] = {}
        for change in txn.changes:
            if isinstance(change, Relation):
                schema = self.relation(change)
                if schema is not None:
                    schemas.append(schema)
                continue
            if isinstance(change, LogicalMessage) and change.prefix.startswith(INTERNAL_MESSAGE_PREFIX):
                continue
            records = self._events(change, txn, index, per_table)
            out.extend(records)
            # Each event takes its own txn_index (a key change or a multi-table truncate
            # makes several); a tombstone shares its delete's.
            index += max(1, len({r.sequence for r in records}))
        self._last_commit_lsn = txn.commit_lsn.value
        return out, schemas

    def snapshot_records(
        self,
        relation_oid: int,
        rows: Sequence[TupleData],
        sequence_start: Seq,
        *,
        marker: SnapshotMarker = SnapshotMarker.TRUE,
        ts_us: int = 0,
    ) -> list[OutRecord]:
        """``op: r`` events for rows read by a snapshot at ``sequence_start.commit_lsn``.

        Snapshot rows carry the snapshot point's LSN, so they sort before every change
        streamed after it; ``txn_index`` numbers them from ``sequence_start.txn_index``.
        """
        table = self._tables[relation_oid]
        lsn, first = sequence_start.commit_lsn, sequence_start.txn_index
        out: list[OutRecord] = []
        for i, row in enumerate(rows):
            after = self._image(table, row)
            source = SourceInfo(
                name=self._source,
                db=self._db,
                schema=table.relation.namespace,
                table=table.relation.name,
                tx_id=None,
                lsn=lsn,
                commit_lsn=lsn,
                txn_index=first + i,
                ts_us=ts_us,
                snapshot=marker,
                last_commit_lsn=None,
            )
            event = ChangeEvent(Op.READ, source, None, after, ts_us)
            out.append(OutRecord(table.topic, self._key(table, after), encode_value(event), Seq(lsn, first + i)))
        return out

    def topic_of(self, relation_oid: int) -> str:
        """The topic of a cached relation."""
        return self._tables[relation_oid].topic

    def _source_info(self, table: _Table | None, txn: Transaction, index: int, lsn: int | None) -> SourceInfo:
        return SourceInfo(
            name=self._source,
            db=self._db,
            schema=table.relation.namespace if table else "",
            table=table.relation.name if table else "",
            tx_id=txn.xid,
            lsn=lsn,
            commit_lsn=txn.commit_lsn.value,
            txn_index=index,
            ts_us=txn.commit_ts_us,
            snapshot=SnapshotMarker.FALSE,
            last_commit_lsn=self._last_commit_lsn,
        )

    def _events(
        self,
        change: Insert | Update | Delete | Truncate | LogicalMessage,
        txn: Transaction,
        index: int,
        per_table: dict[str, int],
    ) -> list[OutRecord]:
        sequence = Seq(txn.commit_lsn.value, index)
        if isinstance(change, LogicalMessage):
            source = self._source_info(None, txn, index, change.lsn.value)
            event = ChangeEvent(
                op=Op.MESSAGE,
                source=source,
                ts_us=txn.commit_ts_us,
                message={"prefix": change.prefix, "content": change.content.hex()},
            )
            key = encode_key({"prefix": change.prefix})
            return [OutRecord(message_topic(self._source), key, encode_value(event), sequence)]
        if isinstance(change, Truncate):
            records = []
            for offset, oid in enumerate(change.relation_oids):
                table = self._tables[oid]
                source = self._source_info(table, txn, index + offset, None)
                event = ChangeEvent(op=Op.TRUNCATE, source=source, ts_us=txn.commit_ts_us)
                records.append(
                    OutRecord(table.topic, None, encode_value(event), Seq(txn.commit_lsn.value, index + offset))
                )
            return records
        table = self._tables[change.relation_oid]
        order = per_table.get(table.topic, 0) + 1
        per_table[table.topic] = order
        txn_block = transaction_block(txn.xid, txn.commit_lsn, index + 1, order)
        if isinstance(change, Insert):
            after = self._image(table, change.new)
            key = self._key(table, after)
            self._remember(table.topic, key, after)
            event = ChangeEvent(
                Op.CREATE, self._source_info(table, txn, index, None), None, after, txn.commit_ts_us, txn_block
            )
            return [OutRecord(table.topic, key, encode_value(event), sequence)]
        if isinstance(change, Update):
            before = self._image(table, change.old) if change.old is not None and not change.old_is_key else None
            after = self._image(table, change.new)
            if change.old is not None and change.old_is_key:
                old_key = self._key_from_key_tuple(table, change.old)
            else:
                old_key = self._key(table, before) if before is not None else None
            new_key = self._key(table, after)
            if any(value is UNCHANGED_TOAST for value in after.values()):
                after = self._fill_toast(table, after, before, old_key or new_key)
            if old_key is not None and old_key != new_key:
                self._remember(table.topic, old_key, None)
            self._remember(table.topic, new_key, after)
            if old_key is not None and new_key is not None and old_key != new_key:
                # A primary-key change is a delete of the old key and a create of the new
                # one (as Debezium emits it), so compaction and SCD1 drop the old key.
                delete_source = self._source_info(table, txn, index, None)
                create_source = self._source_info(table, txn, index + 1, None)
                delete = ChangeEvent(Op.DELETE, delete_source, before, None, txn.commit_ts_us, txn_block)
                create = ChangeEvent(Op.CREATE, create_source, None, after, txn.commit_ts_us, txn_block)
                return [
                    OutRecord(table.topic, old_key, encode_value(delete), sequence),
                    OutRecord(table.topic, old_key, None, sequence),
                    OutRecord(table.topic, new_key, encode_value(create), Seq(txn.commit_lsn.value, index + 1)),
                ]
            event = ChangeEvent(
                Op.UPDATE, self._source_info(table, txn, index, None), before, after, txn.commit_ts_us, txn_block
            )
            return [OutRecord(table.topic, new_key, encode_value(event), sequence)]
        # Delete: with REPLICA IDENTITY FULL the whole old row, else only the key columns.
        before_image = self._key_only_image(table, change.old) if change.old_is_key else self._image(table, change.old)
        key = self._key(table, before_image)
        self._remember(table.topic, key, None)
        event = ChangeEvent(
            Op.DELETE, self._source_info(table, txn, index, None), before_image, None, txn.commit_ts_us, txn_block
        )
        return [
            OutRecord(table.topic, key, encode_value(event), sequence),
            OutRecord(table.topic, key, None, sequence),
        ]

    def _remember(self, topic: str, key: bytes | None, after: dict[str, Any] | None) -> None:
        if key is None or self._images_max <= 0:
            return
        slot = (topic, key)
        if after is None:
            self._images.pop(slot, None)
            return
        self._images[slot] = after
        self._images.move_to_end(slot)
        if len(self._images) > self._images_max:
            self._images.popitem(last=False)

    def _image(self, table: _Table, row: TupleData) -> dict[str, Any]:
        values = table.decode(row)
        return {table.names[i]: values[i] for i in table.keep}

    def _key_only_image(self, table: _Table, row: TupleData) -> dict[str, Any]:
        # In a key tuple, non-key columns are sent as NULL; keep only the key columns.
        values = table.decode(row)
        return {table.names[i]: values[i] for i in table.key_positions}

    def _key_from_key_tuple(self, table: _Table, row: TupleData) -> bytes | None:
        return self._key(table, self._key_only_image(table, row))

    def _key(self, table: _Table, image: Mapping[str, Any] | None) -> bytes | None:
        if image is None or not table.has_key:
            return None
        return encode_key({table.names[i]: image[table.names[i]] for i in table.key_positions})

    def _fill_toast(
        self,
        table: _Table,
        after: dict[str, Any],
        before: Mapping[str, Any] | None,
        key: bytes | None,
    ) -> dict[str, Any]:
        previous: Mapping[str, Any] | None = before
        if previous is None or any(previous.get(n) is UNCHANGED_TOAST for n in after):
            looked_up: Mapping[str, Any] | None = self._images.get((table.topic, key)) if key else None
            if looked_up is None and self._previous_image and key:
                looked_up = self._previous_image(table.topic, key)
            previous = looked_up if looked_up is not None else previous
        filled = dict(after)
        for name, value in after.items():
            if value is UNCHANGED_TOAST:
                if previous is None or name not in previous or previous[name] is UNCHANGED_TOAST:
                    raise UnresolvedToastError(table.topic, name)
                filled[name] = previous[name]
        return filled


class UnresolvedToastError(ValueError):
    """An unchanged TOASTed value could not be recovered (no previous image for the key)."""

    def __init__(self, topic: str, column: str) -> None:
        super().__init__(
            f"{topic}: column {column!r} is an unchanged TOAST value and no previous row image is known; "
            "set REPLICA IDENTITY FULL on the table or re-snapshot it"
        )
        self.topic = topic
        self.column = column


def _schema_fingerprint(value: bytes) -> bytes:
    body = orjson.loads(value)
    body.pop("version", None)
    return orjson.dumps(body)

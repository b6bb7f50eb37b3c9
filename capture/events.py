"""Committed transactions → Debezium-style change events and schema records.

Pure: no connections or files. The agent passes in how to decode a row (the type
map, per relation) and how to find a key's previous row image (for unchanged TOAST).

Invariants:

* Every data change of a transaction gets ``txn_index`` = its position among the
  transaction's events (0-based), so ``(commit_lsn, txn_index)`` is unique per source.
* A delete is followed by a tombstone with the same key (for compaction).
* An unchanged TOASTed value never leaves this module as a placeholder: it is filled
  from the old row image (REPLICA IDENTITY FULL) or the key's previous image.
* A change whose values cannot be converted becomes one record in
  ``<topic>.quarantine`` (raw values, reason in a header) at the ``txn_index`` the
  event would have had, so capture goes on and resumes over it like any other record.

Speed: insert/update/delete/snapshot values are assembled from JSON pieces encoded
once per table and transaction (:class:`_Pieces`), byte for byte what
:func:`log.envelope.encode_value` prints for the same event (``tests/unit/capture/test_events.py``
holds the two together); rare events (truncate, message) go through ``encode_value``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import orjson

from capture.errors import ConfiguredKeyError, KeyColumnExcludedError, TypeMappingError
from capture.pgoutput_messages import (
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
from capture.quarantine import error_headers, quarantine_value, raw_values
from capture.rows import TextRowDecoder
from capture.snapshot import CopyRows, parse_copy_text
from capture.transactions import Transaction
from log.envelope import CONNECTOR, EVENT_VERSION, ChangeEvent, Op, SnapshotMarker, SourceInfo, encode_value
from log.sequence import Sequence as Seq
from log.topics import message_topic, quarantine_topic, table_topic

if TYPE_CHECKING:
    from native._speedups import RowEncoder

#: Decodes one tuple (text-format values) into a JSON row image: every column, in column
#: order; columns whose TOASTed value was not sent hold :data:`UNCHANGED_TOAST`.
RowDecoder: TypeAlias = Callable[[TupleData], dict[str, Any]]
#: Makes the decoder for a relation (built once per Relation message).
RowDecoderFactory: TypeAlias = Callable[[Relation], RowDecoder]
#: The primary-key column names of a relation from the catalog (None: no primary key).
PrimaryKeyLookup: TypeAlias = Callable[[Relation], tuple[str, ...] | None]
#: Finds the latest row image stored for ``(topic, key)``, or None.
#: ``(topic, key, before)``: the key's latest stored after-image among records whose sequence
#: ``(commit_lsn, txn_index)`` is below ``before`` (the change being built).
PreviousImage: TypeAlias = Callable[[str, bytes, tuple[int, int]], Mapping[str, Any] | None]

#: Prefix of logical messages Headwater writes itself (heartbeats, snapshot watermarks).
INTERNAL_MESSAGE_PREFIX = "headwater."


class OutRecord(NamedTuple):
    """One record for the log. ``value=None`` is a tombstone; ``(commit_lsn, txn_index)`` orders it.

    It has every field of :class:`log.base.Record` (``key, value, headers, timestamp_ms``), so
    it can be appended as it is.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    commit_lsn: int
    txn_index: int
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None

    @property
    def sequence(self) -> Seq:
        """The record's position in the source's total order."""
        return Seq(self.commit_lsn, self.txn_index)


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A table's column list, written to ``_headwater.schemas`` keyed by topic when it changes."""

    topic: str
    value: bytes


class BadRecordError(ValueError):
    """A change could not become an event (its record goes to quarantine instead)."""


class UnresolvedToastError(BadRecordError):
    """An unchanged TOASTed value could not be recovered (no previous image for the key)."""

    def __init__(self, topic: str, column: str) -> None:
        super().__init__(
            f"{topic}: column {column!r} is an unchanged TOAST value and no previous row image is known; "
            "set REPLICA IDENTITY FULL on the table or re-snapshot it"
        )
        self.topic = topic
        self.column = column


#: Errors that send one change to quarantine instead of stopping capture.
QUARANTINED_ERRORS = (TypeMappingError, BadRecordError)

_CHANGE_VALUE = b'{"before":%b,"after":%b%b%d%b%d%b%d%b%d,"data_collection_order":%d}}'
_NULL = b"null"


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 (COPY text of a SQL_ASCII database may not be)."""
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _j(value: object) -> bytes:
    return orjson.dumps(value)


@dataclass
class _Table:
    relation: Relation
    topic: str
    names: list[str]
    keep_names: list[str] | None  # None: every column is kept (no exclusions)
    key_names: list[str]
    single_key_prefix: bytes | None  # b'{"id":' when the key is one column
    decode: RowDecoder
    # The extension's encoder of the same conversion (None: Python only). It answers rows
    # without unchanged TOAST that convert cleanly; every other row takes the Python path.
    encoder: RowEncoder | None
    version: int
    name_json: bytes  # JSON pieces of the source block that never change for the table
    schema_json: bytes
    table_json: bytes


class _SnapshotBlock(NamedTuple):
    """What every snapshot value of one snapshot_records call shares."""

    head: bytes
    pre: bytes
    tail: bytes
    lsn: int
    ts_us: int
    marker: SnapshotMarker


class _Pieces:
    """The parts of a transaction's event values that are the same for every event of one table."""

    __slots__ = ("native", "op_blocks", "post", "pre", "table_mid")

    def __init__(self, table: _Table, db_json: bytes, txn: Transaction, last_commit_lsn: int | None) -> None:
        ts_us = txn.commit_ts_us
        last = _NULL if last_commit_lsn is None else b'\\"%d\\"' % last_commit_lsn
        self.pre = (
            b',"source":{"version":%b,"connector":%b,"name":%b,"ts_ms":%d,"ts_us":%d,"snapshot":"false",'
            b'"db":%b,"sequence":"[%b,\\"'
            % (_j(EVENT_VERSION), _j(CONNECTOR), table.name_json, ts_us // 1000, ts_us, db_json, last)
        )
        self.table_mid = b'\\"]","schema":%b,"table":%b,"txId":%d,"lsn":' % (
            table.schema_json,
            table.table_json,
            txn.xid,
        )
        self.post = b',"xmin":null,"commit_lsn":%d,"txn_index":' % txn.commit_lsn.value
        block = b'},"op":"%%s","ts_ms":%d,"ts_us":%d,"transaction":{"id":%b,"total_order":' % (
            ts_us // 1000,
            ts_us,
            _j(f"{txn.xid}:{txn.commit_lsn.value}"),
        )
        self.op_blocks = {op: block % op.value.encode() for op in (Op.CREATE, Op.UPDATE, Op.DELETE)}
        # The same pieces for RowEncoder.event (native/_speedups.c).
        self.native = (
            self.pre,
            self.table_mid,
            self.post,
            self.op_blocks[Op.CREATE],
            self.op_blocks[Op.UPDATE],
            self.op_blocks[Op.DELETE],
        )


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
        configured_keys: Mapping[str, Sequence[str]] | None = None,
        image_cache_size: int = 100_000,
        schema_versions: Mapping[str, int] | None = None,
        use_native: bool = True,
    ) -> None:
        self._source = source
        self._db = db
        self._db_json = _j(db)
        self._decoder_for = decoder_for
        self._excluded = set(excluded_columns)
        self._previous_image = previous_image
        self._primary_key = primary_key
        self._configured_keys = dict(configured_keys or {})
        self._use_native = use_native
        self._tables: dict[int, _Table] = {}
        self._schema_versions = dict(schema_versions or {})
        self._schemas_seen: dict[str, bytes] = {}
        self._last_commit_lsn: int | None = None
        # Latest after-image JSON per (topic, key), for filling unchanged TOAST values without
        # reading the log back (parsed only then: orjson round-trips every value it printed).
        # Two generations bound it to ``image_cache_size`` entries at O(1) per change: when the
        # young one is half full it becomes the old one and the old one goes; the log lookup
        # covers what fell out.
        # Keyed by ``<topic> NUL <key>`` bytes: no tuple per entry for the collector to traverse.
        self._images: dict[bytes, bytes] = {}
        self._old_images: dict[bytes, bytes] = {}
        self._images_half = image_cache_size // 2

    def known_schema(self, topic: str, value: Mapping[str, Any]) -> None:
        """Seed the last published schema of ``topic`` (read back from ``_headwater.schemas``)."""
        self._schemas_seen[topic] = _schema_fingerprint(value)
        self._schema_versions[topic] = int(value["version"])

    def relation(self, relation: Relation) -> SchemaRecord | None:
        """Cache a Relation; return a schema record when the table's shape changed."""
        topic = table_topic(self._source, relation.namespace, relation.name)
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        keep = [i for i, name in enumerate(names) if f"{qualified}.{name}" not in self._excluded]
        key_positions, key_source = self._key_positions(relation, keep)
        version = self._schema_versions.get(topic, 0)
        columns = [
            {
                "name": relation.columns[i].name,
                "type_oid": relation.columns[i].type_oid,
                "typmod": relation.columns[i].atttypmod,
                # The record key, not pgoutput's replica-identity flag (every column under FULL).
                "key": i in key_positions,
            }
            for i in keep
        ]
        body = {
            "topic": topic,
            "schema": relation.namespace,
            "table": relation.name,
            "replica_identity": relation.replica_identity.value,
            "key": [names[i] for i in key_positions],
            "key_source": key_source,
            "columns": columns,
        }
        fingerprint = orjson.dumps(body)
        changed = self._schemas_seen.get(topic) != fingerprint
        if changed:
            version += 1
            self._schema_versions[topic] = version
            self._schemas_seen[topic] = fingerprint
        key_names = [names[i] for i in key_positions]
        decode = self._decoder_for(relation)
        encoder = None
        if self._use_native and isinstance(decode, TextRowDecoder):
            encoder = decode.converter.native_encoder(keep, key_positions)
        self._tables[relation.oid] = _Table(
            relation=relation,
            topic=topic,
            names=names,
            keep_names=None if len(keep) == len(names) else [names[i] for i in keep],
            key_names=key_names,
            single_key_prefix=b"{%b:" % _j(key_names[0]) if len(key_names) == 1 else None,
            decode=decode,
            encoder=encoder,
            version=version,
            name_json=_j(self._source),
            schema_json=_j(relation.namespace),
            table_json=_j(relation.name),
        )
        if not changed:
            return None
        return SchemaRecord(topic, orjson.dumps({**body, "version": version}))

    def _key_positions(self, relation: Relation, keep: list[int]) -> tuple[list[int], str]:
        """The record key's column positions (in column order) and where the key comes from.

        The one rule for a table's key: the configured key (``sources.<name>.keys``), else the
        primary key, else (REPLICA IDENTITY USING INDEX) the identity index. pgoutput flags the
        replica-identity columns, which under FULL is every column: never the key by itself.
        A key must be carried by every change: under DEFAULT and USING INDEX an update sends
        the old key and a delete sends only the identity columns, so a configured key must be
        among them (FULL sends whole rows). The primary key is not used under USING INDEX when
        the index does not cover it: an update that changes only the primary key sends no old
        key there, so keying by it would leave the old row behind.
        """
        qualified = f"{relation.namespace}.{relation.name}"
        names = [column.name for column in relation.columns]
        identity = [i for i, column in enumerate(relation.columns) if column.key]
        configured = self._configured_keys.get(qualified)
        if configured is not None:
            positions = _configured_positions(self._source, qualified, relation, configured, identity)
            source = "configured"
        elif relation.replica_identity == ReplicaIdentity.FULL:
            primary = self._primary_key(relation) if self._primary_key else None
            positions = [i for i, name in enumerate(names) if primary and name in primary]
            source = "primary_key" if positions else "none"
        elif relation.replica_identity in (ReplicaIdentity.DEFAULT, ReplicaIdentity.INDEX):
            positions = identity
            default = relation.replica_identity == ReplicaIdentity.DEFAULT
            source = ("primary_key" if default else "replica_identity_index") if positions else "none"
        else:
            positions, source = [], "none"
        dropped = [names[i] for i in positions if i not in keep]
        if dropped:
            raise KeyColumnExcludedError(self._source, qualified, dropped)
        return positions, source

    def build(self, txn: Transaction) -> tuple[list[OutRecord], list[SchemaRecord]]:
        """Events (with tombstones) and schema changes of one committed transaction, in order."""
        out: list[OutRecord] = []
        schemas: list[SchemaRecord] = []
        index = 0
        per_table: dict[str, int] = {}
        pieces: dict[int, _Pieces] = {}
        changes = txn.changes
        lsns = txn.lsns if len(txn.lsns) == len(changes) else [0] * len(changes)  # 0: position not known
        if not isinstance(lsns, list):
            lsns = list(lsns)
        tables, commit = self._tables, txn.commit_lsn.value
        position, count = 0, len(changes)
        while position < count:
            change, lsn = changes[position], lsns[position]
            position += 1
            kind = change.__class__
            if kind is Insert or kind is Update or kind is Delete:
                # The native path: one call turns the run of creates, updates without old image and
                # deletes of one table starting here into records, exactly as _events would
                # (tests/unit/native/test_native.py); it stops where a change needs the Python
                # path below (TOAST, key change, errors, no key, another table).
                oid = change.relation_oid  # type: ignore[union-attr]
                table = tables.get(oid)
                encoder = table.encoder if table is not None else None
                if encoder is not None:
                    topic = table.topic  # type: ignore[union-attr]
                    table_pieces = pieces.get(oid)
                    if table_pieces is None:
                        table_pieces = pieces[oid] = _Pieces(table, self._db_json, txn, self._last_commit_lsn)  # type: ignore[arg-type]
                    half = self._images_half
                    done, index, order = encoder.events(
                        changes,
                        lsns,
                        position - 1,
                        oid,
                        table_pieces.native,
                        index,
                        per_table.get(topic, 0) + 1,
                        commit,
                        topic,
                        OutRecord,
                        out,
                        self._images if half > 0 else None,
                        self._old_images,
                        half,
                    )
                    if done:
                        per_table[topic] = order - 1
                        if half > 0 and len(self._images) >= half:
                            self._old_images, self._images = self._images, {}
                        position += done - 1
                        continue
            if isinstance(change, Relation):
                schema = self.relation(change)
                if schema is not None:
                    schemas.append(schema)
                pieces.pop(change.oid, None)
                continue
            if isinstance(change, LogicalMessage) and change.prefix.startswith(INTERNAL_MESSAGE_PREFIX):
                continue
            try:
                records = self._events(change, txn, index, lsn, per_table=per_table, pieces_by_table=pieces)
            except QUARANTINED_ERRORS as exc:
                records = [self._quarantined(change, txn, index, lsn, exc)]
            out.extend(records)
            # Each event takes its own txn_index (a key change or a multi-table truncate
            # makes several); a tombstone shares its delete's.
            index += max(1, records[-1].txn_index - index + 1) if records else 1
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
        lsn, index = sequence_start.commit_lsn, sequence_start.txn_index
        head, pre, tail = self._snapshot_pieces(table, lsn, marker, ts_us)
        topic = table.topic
        encoder = table.encoder
        block = _SnapshotBlock(head, pre, tail, lsn, ts_us, marker)
        out: list[OutRecord] = []
        append = out.append
        if isinstance(rows, CopyRows) and encoder is not None and is_utf8(rows.data):
            # COPY text straight to records in native code; a row it hands back (position ``at``)
            # takes the Python path below, alone, and the native loop goes on after it. Not UTF-8
            # (a SQL_ASCII database): the Python path sends the rows that are not to quarantine.
            data = rows.data
            at = 0
            while True:
                at, index = encoder.copy_records(data, at, head, pre, tail, index, lsn, topic, OutRecord, out)
                if at >= len(data):
                    return out
                end = data.find(b"\n", at)
                end = len(data) if end < 0 else end
                rows, at = parse_copy_text(data[at:end]), end + 1
                index = self._snapshot_rows_python(table, rows, out, block, index)
        for row in rows:
            encoded = encoder.encode(row) if encoder is not None else None
            if encoded is not None:
                append(OutRecord(topic, encoded[1], b"%b%b%b%d%b" % (head, encoded[0], pre, index, tail), lsn, index))
                index += 1
                continue
            index = self._snapshot_rows_python(table, (row,), out, block, index)
        return out

    def snapshot_pieces(
        self, relation_oid: int, lsn: int, *, marker: SnapshotMarker = SnapshotMarker.TRUE, ts_us: int = 0
    ) -> tuple[RowEncoder | None, bytes, bytes, bytes]:
        """The native encoder of a table and the pieces of its snapshot values (``RowEncoder.copy_batches``).

        A value is ``head + after + pre + txn_index + tail``, as :meth:`snapshot_records` builds it.
        """
        table = self._tables[relation_oid]
        return (table.encoder, *self._snapshot_pieces(table, lsn, marker, ts_us))

    def _snapshot_pieces(
        self, table: _Table, lsn: int, marker: SnapshotMarker, ts_us: int
    ) -> tuple[bytes, bytes, bytes]:
        head = b'{"before":null,"after":'
        pre = (
            b',"source":{"version":%b,"connector":%b,"name":%b,"ts_ms":%d,"ts_us":%d,"snapshot":%b,'
            b'"db":%b,"sequence":"[null,\\"%d\\"]","schema":%b,"table":%b,"txId":null,"lsn":%d,"xmin":null,'
            b'"commit_lsn":%d,"txn_index":'
            % (
                _j(EVENT_VERSION),
                _j(CONNECTOR),
                table.name_json,
                ts_us // 1000,
                ts_us,
                _j(marker.value),
                self._db_json,
                lsn,
                table.schema_json,
                table.table_json,
                lsn,
                lsn,
            )
        )
        tail = b'},"op":"r","ts_ms":%d,"ts_us":%d,"transaction":null}' % (ts_us // 1000, ts_us)
        return head, pre, tail

    def _snapshot_rows_python(
        self,
        table: _Table,
        rows: Sequence[TupleData],
        out: list[OutRecord],
        block: _SnapshotBlock,
        index: int,
    ) -> int:
        """The pure-Python snapshot_records loop (quarantine included); returns the next index."""
        head, pre, tail, lsn, ts_us, marker = block
        topic, decode, keep, key_of, append = table.topic, table.decode, table.keep_names, self._key, out.append
        for row in rows:
            try:
                after = decode(row)
                if keep is not None:
                    after = {name: after[name] for name in keep}
                value = b"%b%b%b%d%b" % (head, orjson.dumps(after), pre, index, tail)
                append(OutRecord(topic, key_of(table, after), value, lsn, index))
            except QUARANTINED_ERRORS as exc:
                source = SourceInfo(
                    self._source, self._db, table.relation.namespace, table.relation.name, None, lsn, lsn, index,
                    ts_us, marker,
                )  # fmt: skip
                append(self._quarantine_record(table, Op.READ, source.to_json(), before=None, after=row, exc=exc))
            index += 1
        return index

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
        lsn: int,
        *,
        per_table: dict[str, int],
        pieces_by_table: dict[int, _Pieces],
    ) -> list[OutRecord]:
        commit = txn.commit_lsn.value
        if isinstance(change, LogicalMessage):
            source = self._source_info(None, txn, index, change.lsn.value)
            event = ChangeEvent(
                op=Op.MESSAGE,
                source=source,
                ts_us=txn.commit_ts_us,
                message={"prefix": change.prefix, "content": change.content.hex()},
            )
            prefix_key = orjson.dumps({"prefix": change.prefix})
            return [OutRecord(message_topic(self._source), prefix_key, encode_value(event), commit, index)]
        if isinstance(change, Truncate):
            records = []
            for offset, oid in enumerate(change.relation_oids):
                table = self._tables[oid]
                source = self._source_info(table, txn, index + offset, lsn)
                event = ChangeEvent(op=Op.TRUNCATE, source=source, ts_us=txn.commit_ts_us)
                records.append(OutRecord(table.topic, None, encode_value(event), commit, index + offset))
            return records
        table = self._tables[change.relation_oid]
        topic = table.topic
        order = per_table.get(topic, 0) + 1
        per_table[topic] = order
        pieces = pieces_by_table.get(change.relation_oid)
        if pieces is None:
            pieces = pieces_by_table[change.relation_oid] = _Pieces(table, self._db_json, txn, self._last_commit_lsn)
        encoder = table.encoder
        if isinstance(change, Insert):
            encoded = encoder.encode(change.new) if encoder is not None else None
            if encoded is not None:
                after_json, key = encoded
            else:
                after = self._image(table, change.new)
                key = self._key(table, after)
                after_json = _dumps_kept(after)
            self._remember(topic, key, after_json)
            value = self._value(pieces, Op.CREATE, _NULL, after_json, lsn=lsn, index=index, order=order)
            return [OutRecord(topic, key, value, commit, index)]
        if isinstance(change, Update):
            if change.old is None and encoder is not None:
                encoded = encoder.encode(change.new)
                if encoded is not None:  # no old image, no unchanged TOAST: the key did not change
                    after_json, key = encoded
                    self._remember(topic, key, after_json)
                    value = self._value(pieces, Op.UPDATE, _NULL, after_json, lsn=lsn, index=index, order=order)
                    return [OutRecord(topic, key, value, commit, index)]
            before = self._image(table, change.old) if change.old is not None and not change.old_is_key else None
            after = self._image(table, change.new)
            if change.old is not None and change.old_is_key:
                old_key = self._key(table, self._key_only_image(table, change.old))
            else:
                old_key = self._key(table, before) if before is not None else None
            new_key = self._key(table, after)
            if UNCHANGED_TOAST in after.values():
                after = self._fill_toast(table, after, before, old_key or new_key, (commit, index))
            if old_key is not None and old_key != new_key:
                self._remember(topic, old_key, None)
            before_json = _NULL if before is None else orjson.dumps(before)
            after_json = _dumps_kept(after)
            self._remember(topic, new_key, after_json)
            if old_key is not None and new_key is not None and old_key != new_key:
                # A primary-key change is a delete of the old key and a create of the new
                # one (as Debezium emits it), so compaction and SCD1 drop the old key.
                # Under REPLICA IDENTITY DEFAULT only the old key columns are sent; the delete
                # still carries them in ``before`` so every consumer can find the old row.
                old_image = before if before is not None else self._key_only_image(table, change.old or ())
                delete_before = orjson.dumps(old_image)
                delete = self._value(pieces, Op.DELETE, delete_before, _NULL, lsn=lsn, index=index, order=order)
                create = self._value(pieces, Op.CREATE, _NULL, after_json, lsn=lsn, index=index + 1, order=order)
                return [
                    OutRecord(topic, old_key, delete, commit, index),
                    OutRecord(topic, old_key, None, commit, index),
                    OutRecord(topic, new_key, create, commit, index + 1),
                ]
            value = self._value(pieces, Op.UPDATE, before_json, after_json, lsn=lsn, index=index, order=order)
            return [OutRecord(topic, new_key, value, commit, index)]
        # Delete: with REPLICA IDENTITY FULL the whole old row, else only the key columns.
        encoded = encoder.encode(change.old) if encoder is not None else None
        if encoded is not None and encoded[1] is not None:
            # A key-only image is exactly the key object (same columns, same order).
            key = encoded[1]
            before_json = key if change.old_is_key else encoded[0]
        else:
            image = self._key_only_image(table, change.old) if change.old_is_key else self._image(table, change.old)
            key = self._key(table, image)
            before_json = orjson.dumps(image)
        self._remember(topic, key, None)
        value = self._value(pieces, Op.DELETE, before_json, _NULL, lsn=lsn, index=index, order=order)
        return [OutRecord(topic, key, value, commit, index), OutRecord(topic, key, None, commit, index)]

    @staticmethod
    def _value(pieces: _Pieces, op: Op, before: bytes, after: bytes, *, lsn: int, index: int, order: int) -> bytes:
        # Equal to encode_value(ChangeEvent(...)) with source.lsn = lsn and
        # transaction.total_order = index + 1 (tests/unit/capture/test_events.py).
        return _CHANGE_VALUE % (
            before,
            after,
            pieces.pre,
            lsn,
            pieces.table_mid,
            lsn,
            pieces.post,
            index,
            pieces.op_blocks[op],
            index + 1,
            order,
        )

    def _quarantined(
        self,
        change: Insert | Update | Delete | Truncate | LogicalMessage,
        txn: Transaction,
        index: int,
        lsn: int,
        exc: Exception,
    ) -> OutRecord:
        assert isinstance(change, Insert | Update | Delete), "only row changes are converted"
        table = self._tables[change.relation_oid]
        source = self._source_info(table, txn, index, lsn).to_json()
        if isinstance(change, Insert):
            return self._quarantine_record(table, Op.CREATE, source, before=None, after=change.new, exc=exc)
        if isinstance(change, Update):
            return self._quarantine_record(table, Op.UPDATE, source, before=change.old, after=change.new, exc=exc)
        return self._quarantine_record(table, Op.DELETE, source, before=change.old, after=None, exc=exc)

    def _quarantine_record(
        self,
        table: _Table,
        op: Op,
        source: Mapping[str, object],
        *,
        before: TupleData | None,
        after: TupleData | None,
        exc: Exception,
    ) -> OutRecord:
        error = f"{table.topic}: {exc}"
        raw_after = raw_values(table.names, after)
        raw_before = raw_values(table.names, before)
        image = raw_after if raw_after is not None else raw_before
        key = None
        if image is not None and table.key_names and all(name in image for name in table.key_names):
            key = orjson.dumps({name: image[name] for name in table.key_names})
        value = quarantine_value(op=op.value, source=source, before=raw_before, after=raw_after, error=error)
        commit, index = int(str(source["commit_lsn"])), int(str(source["txn_index"]))
        return OutRecord(quarantine_topic(table.topic), key, value, commit, index, error_headers(error))

    def _remember(self, topic: str, key: bytes | None, after: bytes | None) -> None:
        if key is None or self._images_half <= 0:
            return
        slot = b"%b\x00%b" % (topic.encode(), key)
        if after is None:
            self._images.pop(slot, None)
            self._old_images.pop(slot, None)
            return
        images = self._images
        images[slot] = after
        if len(images) >= self._images_half:
            self._old_images, self._images = images, {}

    def _remembered(self, topic: str, key: bytes) -> dict[str, Any] | None:
        slot = b"%b\x00%b" % (topic.encode(), key)
        image = self._images.get(slot)
        if image is None:
            image = self._old_images.get(slot)
        return None if image is None else orjson.loads(image)  # type: ignore[no-any-return]

    def _image(self, table: _Table, row: TupleData) -> dict[str, Any]:
        values = table.decode(row)
        keep = table.keep_names
        return values if keep is None else {name: values[name] for name in keep}

    def _key_only_image(self, table: _Table, row: TupleData) -> dict[str, Any]:
        # In a key tuple, non-key columns are sent as NULL; keep only the key columns.
        values = table.decode(row)
        return {name: values[name] for name in table.key_names}

    def _key(self, table: _Table, image: Mapping[str, Any] | None) -> bytes | None:
        if image is None or not table.key_names:
            return None
        prefix = table.single_key_prefix
        if prefix is not None:
            return b"%b%b}" % (prefix, orjson.dumps(image[table.key_names[0]]))
        return _dumps_kept({name: image[name] for name in table.key_names})

    def _fill_toast(
        self,
        table: _Table,
        after: dict[str, Any],
        before: Mapping[str, Any] | None,
        key: bytes | None,
        sequence: tuple[int, int],
    ) -> dict[str, Any]:
        previous: Mapping[str, Any] | None = before
        if previous is None or any(previous.get(n) is UNCHANGED_TOAST for n in after):
            looked_up: Mapping[str, Any] | None = self._remembered(table.topic, key) if key else None
            if looked_up is None and self._previous_image and key:
                # Only records older than this change: after a crash mid-flush the log may
                # already hold this very change (a key change's delete of the old key).
                looked_up = self._previous_image(table.topic, key, sequence)
            previous = looked_up if looked_up is not None else previous
        filled = dict(after)
        for name, value in after.items():
            if value is UNCHANGED_TOAST:
                if previous is None or name not in previous or previous[name] is UNCHANGED_TOAST:
                    raise UnresolvedToastError(table.topic, name)
                filled[name] = previous[name]
        return filled


def _dumps_kept(value: Any) -> bytes:
    """``orjson.dumps(value)`` as an exact-size copy, for bytes kept beyond the change (keys, cached images).

    orjson 3.13 returns its whole write buffer (4 KiB at least) behind a short result;
    100k cached row images of ~100 bytes held ~210 MB instead of ~25 MB.
    """
    return bytes(memoryview(orjson.dumps(value)))


def _schema_fingerprint(value: Mapping[str, Any]) -> bytes:
    return orjson.dumps({name: part for name, part in value.items() if name != "version"})


def _configured_positions(
    source: str, qualified: str, relation: Relation, configured: Sequence[str], identity: list[int]
) -> list[int]:
    names = [column.name for column in relation.columns]
    unknown = [name for name in configured if name not in names]
    if unknown:
        raise ConfiguredKeyError(source, qualified, f"has no column {unknown[0]!r}")
    positions = sorted(names.index(name) for name in configured)
    if relation.replica_identity != ReplicaIdentity.FULL and not set(positions) <= set(identity):
        missing = next(names[i] for i in positions if i not in identity)
        kind = "DEFAULT" if relation.replica_identity == ReplicaIdentity.DEFAULT else "USING INDEX"
        raise ConfiguredKeyError(
            source,
            qualified,
            f"column {missing!r} is not sent with deletes under REPLICA IDENTITY {kind}; "
            f"run 'ALTER TABLE {qualified} REPLICA IDENTITY FULL' or key the table by its replica identity",
        )
    return positions

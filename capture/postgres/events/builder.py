"""Committed transactions → Debezium-style change events and schema records.

The agent passes in how to decode a row (the type map, per relation) and how to find a
key's previous row image in the log (for unchanged TOAST); the builder itself does no I/O.
Its collaborators: :mod:`capture.postgres.events.relations` (table shapes, keys, schema records),
:mod:`capture.postgres.events.previous_images` (TOAST filling),
:mod:`capture.postgres.events.snapshot_records` (``op: r``).

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

(Over 500 lines by a few: the byte-exact JSON pieces and the piece-by-piece building that
spills large transactions share one per-transaction state.)
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from capture.errors import QUARANTINED_ERRORS
from capture.postgres.catalog_state import CatalogTable
from capture.postgres.decoding.pgoutput_messages import Delete, Insert, LogicalMessage, Relation, Truncate, Update
from capture.postgres.events.previous_images import ImageCache, PreviousImage
from capture.postgres.events.relations import (
    CatalogLookup,
    PrimaryKeyLookup,
    Relations,
    Reread,
    RowDecoderFactory,
    TableShape,
)
from capture.postgres.events.snapshot_records import (
    SnapshotBlock,
    python_snapshot_rows,
    snapshot_block,
    snapshot_records,
)
from capture.postgres.events.source_block import CONNECTOR, postgres_source, transaction_block
from capture.postgres.streaming.markers import is_marker
from capture.postgres.streaming.transactions import Change, Transaction
from capture.records import OutRecord, SchemaRecord, dumps_kept
from capture.tuples import UNCHANGED_TOAST, TupleData
from core.source_config import ColumnsConfig
from log.envelope import EVENT_VERSION, ChangeEvent, Op, SnapshotMarker, SourceInfo, encode_value
from log.sequence import Sequence as Seq
from log.topics import message_topic

if TYPE_CHECKING:
    from native._speedups import RowEncoder

_CHANGE_VALUE = b'{"before":%b,"after":%b%b%d%b%d%b%d%b%d,"data_collection_order":%d}}'
_NULL = b"null"


def _j(value: object) -> bytes:
    return orjson.dumps(value)


def _base64(content: bytes) -> str:
    return base64.b64encode(content).decode()


def _hex(content: bytes) -> str:
    return content.hex()


def _message_key(message: LogicalMessage) -> bytes:
    """A logical message's record key: its prefix (Debezium's ``{"prefix": ...}``)."""
    return orjson.dumps({"prefix": message.prefix})


class _Pieces:
    """The parts of a transaction's event values that are the same for every event of one table."""

    __slots__ = ("native", "op_blocks", "post", "pre", "table_mid")

    def __init__(self, table: TableShape, db_json: bytes, txn: Transaction, last_commit_lsn: int | None) -> None:
        ts_us = txn.commit_ts_us
        last = _NULL if last_commit_lsn is None else b'\\"%d\\"' % last_commit_lsn
        self.pre = (
            b',"source":{"version":%b,"connector":%b,"name":%b,"ts_ms":%d,"ts_us":%d,"ts_ns":%d,"snapshot":"false",'
            b'"db":%b,"sequence":"[%b,\\"'
            % (_j(EVENT_VERSION), _j(CONNECTOR), table.name_json, ts_us // 1000, ts_us, ts_us * 1000, db_json, last)
        )
        self.table_mid = b'\\"]","schema":%b,"table":%b,"txId":%d,"lsn":' % (
            table.schema_json,
            table.table_json,
            txn.xid,
        )
        self.post = b',"xmin":null,"origin":%b,"origin_lsn":%b,"commit_lsn":%d,"txn_index":' % (
            _j(txn.origin),
            _j(txn.origin_lsn),
            txn.commit_lsn.value,
        )
        block = b'},"op":"%%s","ts_ms":%d,"ts_us":%d,"ts_ns":%d,"transaction":{"id":%b,"total_order":' % (
            ts_us // 1000,
            ts_us,
            ts_us * 1000,
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
        columns: ColumnsConfig | None = None,
        previous_image: PreviousImage | None = None,
        primary_key: PrimaryKeyLookup | None = None,
        configured_keys: Mapping[str, Sequence[str]] | None = None,
        image_cache_size: int = 100_000,
        schema_versions: Mapping[str, int] | None = None,
        use_native: bool = True,
        binary_handling_mode: str = "base64",
        catalog: CatalogLookup | None = None,
    ) -> None:
        self._source = source
        # Logical message content is binary: printed as the source's binary_handling_mode says.
        self._content = _hex if binary_handling_mode == "hex" else _base64
        self._db = db
        self._db_json = _j(db)
        self._relations = Relations(
            source,
            decoder_for,
            excluded_columns=excluded_columns,
            columns=columns,
            primary_key=primary_key,
            configured_keys=configured_keys,
            schema_versions=schema_versions,
            use_native=use_native,
            catalog=catalog,
        )
        self._tables = self._relations.tables
        # sequence[0] of the next event: the end LSN of the last transaction (or loose message) seen,
        # as Debezium's "last commit LSN"; None until one was seen in this session.
        self._last_commit_lsn: int | None = None
        self._last_commit_ts_us: int | None = None
        # The latest after-image per key, for filling unchanged TOAST values without reading the log.
        self._images = ImageCache(image_cache_size, previous_image)

    def known_schema(self, topic: str, value: Mapping[str, Any], *, names_seen: Sequence[str] = ()) -> None:
        """Seed the last published schema of ``topic`` (read back from ``_headwater.schemas``)."""
        self._relations.known_schema(topic, value, names_seen=names_seen)

    def relation(
        self, relation: Relation, *, at: Seq | None = None, table: CatalogTable | None = None
    ) -> SchemaRecord | None:
        """Cache a Relation; return a schema record when the table's shape changed (see :meth:`Relations.relation`)."""
        return self._relations.relation(relation, at=at, table=table)

    def take_rereads(self) -> list[Reread]:
        """Tables whose rows schema changes left unknown to the stream (see :class:`Reread`)."""
        return self._relations.take_rereads()

    def take_truncations(self) -> list[str]:
        """Topics the stream truncated since the last call."""
        return self._relations.take_truncations()

    @property
    def relations(self) -> Relations:
        """The relation cache and schema versions of this stream."""
        return self._relations

    @property
    def stream_position(self) -> Seq | None:
        """The first position after the last transaction built (None: none yet in this session)."""
        return None if self._last_commit_lsn is None else Seq(self._last_commit_lsn, 0)

    def topic_of(self, relation_oid: int) -> str:
        """The topic of a cached relation."""
        return self._relations.topic_of(relation_oid)

    def build(self, txn: Transaction) -> tuple[list[OutRecord], list[SchemaRecord]]:
        """Events (with tombstones) and schema changes of one committed transaction, in order."""
        building = self.start(txn)
        out: list[OutRecord] = []
        schemas: list[SchemaRecord] = []
        for changes, lsns in txn.pieces(len(txn.changes) or 1):
            records, found = building.add(changes, lsns)
            out.extend(records)
            schemas.extend(found)
        building.finish()
        return out, schemas

    def start(self, txn: Transaction) -> TransactionBuild:
        """Build ``txn``'s events a piece of its changes at a time (:class:`TransactionBuild`)."""
        return TransactionBuild(self, txn)

    def loose_message(self, message: LogicalMessage, *, now_us: int) -> OutRecord:
        """The event of a non-transactional logical message, at ``(its LSN, 0)`` in the source's order.

        As Debezium writes it: no transaction, ``sequence`` ``[lsn, lsn]``, the time of the last
        commit seen (pgoutput sends none with the message; ``now_us`` before any), and it counts
        as the last commit for the next event's ``sequence``.
        """
        lsn = message.lsn.value
        ts_us = self._last_commit_ts_us if self._last_commit_ts_us is not None else now_us
        source = postgres_source(self._source, self._db, "", "", None, lsn, lsn, 0, ts_us, last_commit_lsn=lsn)
        event = ChangeEvent(Op.MESSAGE, source, ts_us=ts_us, message=self._message_body(message))
        self._last_commit_lsn = lsn
        return OutRecord(message_topic(self._source), _message_key(message), encode_value(event), lsn, 0)

    def _message_body(self, message: LogicalMessage) -> dict[str, str]:
        return {"prefix": message.prefix, "content": self._content(message.content)}

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
        block = snapshot_block(table, self._db_json, sequence_start.commit_lsn, marker, ts_us)
        return snapshot_records(table, rows, block, sequence_start.txn_index, self._snapshot_rows_python)

    def snapshot_pieces(
        self, relation_oid: int, lsn: int, *, marker: SnapshotMarker = SnapshotMarker.TRUE, ts_us: int = 0
    ) -> tuple[RowEncoder | None, bytes, bytes, bytes]:
        """The native encoder of a table and the pieces of its snapshot values (``RowEncoder.copy_batches``).

        A value is ``head + after + pre + txn_index + tail``, as :meth:`snapshot_records` builds it.
        """
        table = self._tables[relation_oid]
        block = snapshot_block(table, self._db_json, lsn, marker, ts_us)
        return table.encoder, block.head, block.pre, block.tail

    def _snapshot_rows_python(
        self, table: TableShape, rows: Sequence[TupleData], out: list[OutRecord], block: SnapshotBlock, index: int
    ) -> int:
        """The pure-Python snapshot_records path for rows the native one hands back; the next index."""
        return python_snapshot_rows(table, rows, out, block, index, source=self._source, db=self._db)

    def _source_info(self, table: TableShape | None, txn: Transaction, index: int, lsn: int | None) -> SourceInfo:
        return postgres_source(
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
            origin=txn.origin,
            origin_lsn=txn.origin_lsn,
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
            topic = message_topic(self._source)
            order = per_table[topic] = per_table.get(topic, 0) + 1
            event = ChangeEvent(
                op=Op.MESSAGE,
                source=self._source_info(None, txn, index, change.lsn.value),
                ts_us=txn.commit_ts_us,
                transaction=transaction_block(txn.xid, txn.commit_lsn, index + 1, order),
                message=self._message_body(change),
            )
            return [OutRecord(topic, _message_key(change), encode_value(event), commit, index)]
        if isinstance(change, Truncate):
            records = []
            for offset, oid in enumerate(change.relation_oids):
                table = self._tables[oid]
                self._relations.truncated(table.topic)
                order = per_table[table.topic] = per_table.get(table.topic, 0) + 1
                event = ChangeEvent(
                    op=Op.TRUNCATE,
                    source=self._source_info(table, txn, index + offset, lsn),
                    ts_us=txn.commit_ts_us,
                    transaction=transaction_block(txn.xid, txn.commit_lsn, index + offset + 1, order),
                )
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
                after = table.image(change.new)
                key = table.key(after)
                after_json = dumps_kept(after)
            self._images.remember(topic, key, after_json)
            value = _value(pieces, Op.CREATE, _NULL, after_json, lsn=lsn, index=index, order=order)
            return [OutRecord(topic, key, value, commit, index)]
        if isinstance(change, Update):
            if change.old is None and encoder is not None:
                encoded = encoder.encode(change.new)
                if encoded is not None:  # no old image, no unchanged TOAST: the key did not change
                    after_json, key = encoded
                    self._images.remember(topic, key, after_json)
                    value = _value(pieces, Op.UPDATE, _NULL, after_json, lsn=lsn, index=index, order=order)
                    return [OutRecord(topic, key, value, commit, index)]
            before = table.image(change.old) if change.old is not None and not change.old_is_key else None
            after = table.image(change.new)
            if change.old is not None and change.old_is_key:
                old_key = table.key(table.image(change.old))
            else:
                old_key = table.key(before) if before is not None else None
            new_key = table.key(after)
            if UNCHANGED_TOAST in after.values():
                unchanged = [name for name, value in after.items() if value is UNCHANGED_TOAST]
                after = self._images.fill(topic, after, before, old_key or new_key, (commit, index))
                if table.rules.masks:  # an image from before a mask was configured holds raw values
                    after = table.rules.conform_filled(table.names, after, unchanged)
            if old_key is not None and old_key != new_key:
                self._images.remember(topic, old_key, None)
            before_json = _NULL if before is None else orjson.dumps(before)
            after_json = dumps_kept(after)
            self._images.remember(topic, new_key, after_json)
            if old_key is not None and new_key is not None and old_key != new_key:
                # A primary-key change is a delete of the old key and a create of the new
                # one (as Debezium emits it), so compaction and SCD1 drop the old key.
                # Under REPLICA IDENTITY DEFAULT only the old key columns are sent (the others
                # as NULL); the delete's ``before`` lists every column, those null, as Debezium's.
                old_image = before if before is not None else table.image(change.old or ())
                delete_before = orjson.dumps(old_image)
                per_table[topic] = order + 1  # the create is the table's next event
                delete = _value(pieces, Op.DELETE, delete_before, _NULL, lsn=lsn, index=index, order=order)
                create = _value(pieces, Op.CREATE, _NULL, after_json, lsn=lsn, index=index + 1, order=order + 1)
                return [
                    OutRecord(topic, old_key, delete, commit, index),
                    OutRecord(topic, old_key, None, commit, index),
                    OutRecord(topic, new_key, create, commit, index + 1),
                ]
            value = _value(pieces, Op.UPDATE, before_json, after_json, lsn=lsn, index=index, order=order)
            return [OutRecord(topic, new_key, value, commit, index)]
        # Delete: with REPLICA IDENTITY FULL the whole old row; else pgoutput sends the key
        # columns and the others as NULL, and ``before`` lists them all (as Debezium's does).
        encoded = encoder.encode(change.old) if encoder is not None else None
        if encoded is not None and encoded[1] is not None:
            key, before_json = encoded[1], encoded[0]
        else:
            image = table.image(change.old)
            key = table.key(image)
            before_json = orjson.dumps(image)
        self._images.remember(topic, key, None)
        value = _value(pieces, Op.DELETE, before_json, _NULL, lsn=lsn, index=index, order=order)
        return [OutRecord(topic, key, value, commit, index), OutRecord(topic, key, None, commit, index)]

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
            return table.quarantine_record(Op.CREATE, source, before=None, after=change.new, exc=exc)
        if isinstance(change, Update):
            return table.quarantine_record(Op.UPDATE, source, before=change.old, after=change.new, exc=exc)
        return table.quarantine_record(Op.DELETE, source, before=change.old, after=None, exc=exc)


class TransactionBuild:
    """The events of one transaction built piece by piece: :meth:`add` its changes in order, then :meth:`finish`.

    ``txn_index`` numbering, each table's ``data_collection_order`` and the JSON pieces carry
    from one piece to the next, so the records are exactly what one :meth:`EventBuilder.build`
    of the whole transaction gives, whatever the pieces.
    """

    def __init__(self, builder: EventBuilder, txn: Transaction) -> None:
        self._builder = builder
        self._txn = txn
        self._index = 0
        self._per_table: dict[str, int] = {}
        self._pieces: dict[int, _Pieces] = {}

    def add(self, changes: Sequence[Change], lsns: Sequence[int]) -> tuple[list[OutRecord], list[SchemaRecord]]:
        """Events (with tombstones) and schema changes of the next ``changes`` (``lsns[i]``: where each was sent)."""
        builder, txn = self._builder, self._txn
        out: list[OutRecord] = []
        schemas: list[SchemaRecord] = []
        index = self._index
        per_table = self._per_table
        pieces = self._pieces
        if not isinstance(changes, list):
            changes = list(changes)
        if not isinstance(lsns, list):
            lsns = list(lsns)
        tables, commit = builder._tables, txn.commit_lsn.value
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
                        table_pieces = pieces[oid] = _Pieces(table, builder._db_json, txn, builder._last_commit_lsn)  # type: ignore[arg-type]
                    images = builder._images
                    half = images.half
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
                        images.images if half > 0 else None,
                        images.old,
                        half,
                    )
                    if done:
                        per_table[topic] = order - 1
                        if half > 0:
                            images.rotate()
                        position += done - 1
                        continue
            if isinstance(change, Relation):
                # The table's changes from here on take this shape: the next one is at (commit, index).
                schema = builder._relations.relation(change, at=Seq(commit, index))
                if schema is not None:
                    schemas.append(schema)
                pieces.pop(change.oid, None)
                continue
            if isinstance(change, LogicalMessage) and is_marker(change.prefix):
                continue
            try:
                records = builder._events(change, txn, index, lsn, per_table=per_table, pieces_by_table=pieces)  # type: ignore[arg-type]
            except QUARANTINED_ERRORS as exc:
                records = [builder._quarantined(change, txn, index, lsn, exc)]  # type: ignore[arg-type]
            out.extend(records)
            # Each event takes its own txn_index (a key change or a multi-table truncate
            # makes several); a tombstone shares its delete's.
            index += max(1, records[-1].txn_index - index + 1) if records else 1
        self._index = index
        return out, schemas

    def finish(self) -> None:
        """The transaction is built: the next one's ``sequence`` starts at its end LSN."""
        txn = self._txn
        self._builder._last_commit_lsn, self._builder._last_commit_ts_us = txn.end_lsn.value, txn.commit_ts_us


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

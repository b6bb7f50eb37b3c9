"""Snapshot rows -> ``op: r`` change records of one table, natively where the extension can.

A snapshot value is ``head + after + pre + txn_index + tail``: every piece but the row
image and its index is the same for all rows one call reads (:class:`SnapshotBlock`), byte
for byte what :func:`log.envelope.encode_value` prints for the same event. The event
builder wires these functions (:meth:`capture.postgres.events.builder.EventBuilder.snapshot_records`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import orjson

from capture.errors import QUARANTINED_ERRORS
from capture.postgres.events.relations import TableShape
from capture.postgres.events.source_block import CONNECTOR, postgres_source
from capture.postgres.snapshot.copy_text import CopyRows, is_utf8, parse_copy_text
from capture.records import OutRecord
from capture.tuples import TupleData
from log.envelope import EVENT_VERSION, Op, SnapshotMarker


class SnapshotBlock(NamedTuple):
    """What every snapshot value of one snapshot_records call shares."""

    head: bytes
    pre: bytes
    tail: bytes
    lsn: int
    ts_us: int
    marker: SnapshotMarker


#: The Python path for rows the native pass hands back: ``(table, rows, out, block, index)``
#: appends their records (quarantined ones included) to ``out`` and returns the next index.
PythonRows = Callable[[TableShape, Sequence[TupleData], list[OutRecord], SnapshotBlock, int], int]


def snapshot_block(table: TableShape, db_json: bytes, lsn: int, marker: SnapshotMarker, ts_us: int) -> SnapshotBlock:
    """The pieces of the snapshot values of ``table`` read at ``lsn``."""
    head = b'{"before":null,"after":'
    pre = (
        b',"source":{"version":%b,"connector":%b,"name":%b,"ts_ms":%d,"ts_us":%d,"ts_ns":%d,"snapshot":%b,'
        b'"db":%b,"sequence":"[null,\\"%d\\"]","schema":%b,"table":%b,"txId":null,"lsn":%d,"xmin":null,'
        b'"origin":null,"origin_lsn":null,"commit_lsn":%d,"txn_index":'
        % (
            orjson.dumps(EVENT_VERSION),
            orjson.dumps(CONNECTOR),
            table.name_json,
            ts_us // 1000,
            ts_us,
            ts_us * 1000,
            orjson.dumps(marker.value),
            db_json,
            lsn,
            table.schema_json,
            table.table_json,
            lsn,
            lsn,
        )
    )
    tail = b'},"op":"r","ts_ms":%d,"ts_us":%d,"ts_ns":%d,"transaction":null}' % (ts_us // 1000, ts_us, ts_us * 1000)
    return SnapshotBlock(head, pre, tail, lsn, ts_us, marker)


def snapshot_records(
    table: TableShape, rows: Sequence[TupleData], block: SnapshotBlock, index: int, python_rows: PythonRows
) -> list[OutRecord]:
    """The records of ``rows`` numbered from ``index``: the table's native encoder where it answers.

    A row the native pass cannot take (unchanged TOAST, errors, not UTF-8) goes through
    ``python_rows`` alone, and the native pass goes on after it.
    """
    head, pre, tail, lsn = block.head, block.pre, block.tail, block.lsn
    topic = table.topic
    encoder = table.encoder
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
            index = python_rows(table, rows, out, block, index)
    for row in rows:
        encoded = encoder.encode(row) if encoder is not None else None
        if encoded is not None:
            append(OutRecord(topic, encoded[1], b"%b%b%b%d%b" % (head, encoded[0], pre, index, tail), lsn, index))
            index += 1
            continue
        index = python_rows(table, (row,), out, block, index)
    return out


def python_snapshot_rows(
    table: TableShape,
    rows: Sequence[TupleData],
    out: list[OutRecord],
    block: SnapshotBlock,
    index: int,
    *,
    source: str,
    db: str,
) -> int:
    """The pure-Python snapshot records loop (quarantine included); returns the next index."""
    head, pre, tail, lsn, ts_us, marker = block
    topic, image, key_of, append = table.topic, table.image, table.key, out.append
    for row in rows:
        try:
            after = image(row)
            value = b"%b%b%b%d%b" % (head, orjson.dumps(after), pre, index, tail)
            append(OutRecord(topic, key_of(after), value, lsn, index))
        except QUARANTINED_ERRORS as exc:
            info = postgres_source(
                source, db, table.relation.namespace, table.relation.name, None, lsn, lsn, index, ts_us, marker
            )
            append(table.quarantine_record(Op.READ, info.to_json(), before=None, after=row, exc=exc))
        index += 1
    return index

"""Headwater's decoding of a binlog range, row by row: what the type matrix compares with Debezium.

Until MySQL capture writes events into the log, the comparison takes the row images straight from
``capture.mysql`` (the same reader and decoders capture will use): ``(op, before, after)`` per row
change of ``database.table``, images as column name -> Debezium JSON value.
"""

from __future__ import annotations

from typing import Any

from capture.mysql.binlog.client import BinlogStream, ServerAddress
from capture.mysql.binlog.events import FormatDescription, Rows, TableMap, parse_event
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.binlog.rows import RowDecoder
from capture.mysql.binlog.table_map import TableShape
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.row_plan import row_plan
from capture.mysql.types.values import TypeModes

RowChange = tuple[str, dict[str, Any] | None, dict[str, Any] | None]


def server_charsets(address: ServerAddress) -> Charsets:
    """The server's collation ids."""
    with address.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
        return Charsets(cur.fetchall())


def _native_decoder(shape: TableShape, modes: TypeModes, charsets: Charsets) -> RowDecoder:
    """A decoder stepping over the columns the extension does not write: it decodes the rest (binlog_rows.c)."""
    other = frozenset(
        i
        for i, column in enumerate(shape.columns)
        if row_plan(TableShape(0, shape.schema, shape.table, (column,)), modes, charsets, frozenset()) is None
    )
    decoder = RowDecoder(shape, modes, charsets, skip=other)
    assert decoder._native is not None
    return decoder


def decode_range(
    address: ServerAddress,
    start: BinlogPosition,
    modes: TypeModes,
    database: str,
    table: str,
    server_id: int = 7001,
    *,
    native_only: bool = False,
) -> list[RowChange]:
    """Every row change of ``database.table`` from ``start`` to the binlog's current end.

    ``native_only``: only the columns the native decoder writes, decoded by it (the others left out of the images).
    """
    charsets = server_charsets(address)
    decoders: dict[int, RowDecoder] = {}
    mariadb = True
    changes: list[RowChange] = []
    for event in BinlogStream(address, server_id=server_id, start=start, blocking=False).events():
        parsed = parse_event(event.data, event.header, mariadb=mariadb)
        if isinstance(parsed, FormatDescription):
            mariadb = "mariadb" in parsed.server_version.lower()
        elif isinstance(parsed, TableMap):
            shape = parsed.shape
            native = native_only and (shape.schema, shape.table) == (database, table)
            decoders[shape.table_id] = (
                _native_decoder(shape, modes, charsets) if native else RowDecoder(shape, modes, charsets)
            )
        elif isinstance(parsed, Rows):
            decoder = decoders[parsed.table_id]
            if (decoder.shape.schema, decoder.shape.table) != (database, table):
                continue
            names = [column.name for column in decoder.shape.columns]
            kept = [i for i in range(len(names)) if i not in decoder.skip]
            for before, after in decoder.decode(parsed):
                changes.append(
                    (
                        parsed.op,
                        None if before is None else {names[i]: before[i] for i in kept},
                        None if after is None else {names[i]: after[i] for i in kept},
                    )
                )
    return changes
